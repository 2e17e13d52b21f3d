"""Ray job entry point for `sentsim eval sts` (same flags)."""
import sys

from sentsim.cli import main

sys.exit(main(["eval", "sts", *sys.argv[1:]]))
