import sys

from sentsim.cli import main

sys.exit(main(["index", "build", *sys.argv[1:]]))
