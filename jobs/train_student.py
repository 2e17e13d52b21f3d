"""Ray job entry point for `sentsim train student` (same flags)."""
import sys

from sentsim.cli import main

sys.exit(main(["train", "student", *sys.argv[1:]]))
