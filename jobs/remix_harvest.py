"""Ray job: `ray job submit --working-dir . -- python jobs/remix_harvest.py HARVEST --out DIR --lambda-fwd 0`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sentsim.cli import entry  # noqa: E402

if __name__ == "__main__":
    entry(["remix", *sys.argv[1:]])
