"""Ray job: `ray job submit --working-dir . -- python jobs/build_index.py ...` (the flags of `sentsim index build`).

Add `--num-workers N` to spread the sklearn build over N Ray tasks on the cluster the job runs on."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sentsim.cli import entry  # noqa: E402

if __name__ == "__main__":
    entry(["index", "build", *sys.argv[1:]])
