"""Ray job: `ray job submit --working-dir . -- python jobs/train_discriminator.py ...`
(the flags of `sentsim train discriminator`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sentsim.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", "discriminator", *sys.argv[1:]]))
