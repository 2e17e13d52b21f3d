import sys
from sentsim.cli import main
sys.exit(main(["train", "context", *sys.argv[1:]]))
