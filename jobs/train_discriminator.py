import sys

from sentsim.cli import main

sys.exit(main(["train", "discriminator", *sys.argv[1:]]))
