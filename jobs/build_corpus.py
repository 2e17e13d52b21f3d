"""Ray job: `ray job submit --working-dir . -- python jobs/build_corpus.py INPUT... --out DIR`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sentsim.cli import entry  # noqa: E402

if __name__ == "__main__":
    entry(["corpus", "build", *sys.argv[1:]])
