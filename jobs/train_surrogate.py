"""Ray job entry point for `sentsim train surrogate` (same flags)."""
import sys

from sentsim.cli import main

sys.exit(main(["train", "surrogate", *sys.argv[1:]]))
