"""Ray job: `ray job submit --working-dir . -- python jobs/eval_sts.py ...` (the flags of `sentsim eval sts`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sentsim.cli import entry  # noqa: E402

if __name__ == "__main__":
    entry(["eval", "sts", *sys.argv[1:]])
