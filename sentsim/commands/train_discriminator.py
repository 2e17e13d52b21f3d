"""`sentsim train discriminator --corpus DIR --out DIR`: the BiLSTM coherence discriminator on Ray Train, or
inline in this process (--executor inline)."""

from __future__ import annotations

import json

from sentsim.config import add_config_arguments, load_config
from sentsim.training.cli import add_executor, add_force_new, add_max_steps, add_num_workers

COMMAND = ("train", "discriminator")
HELP = "train the BiLSTM coherence discriminator (Ray Train or inline; held-out accuracy and AUC)"


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True, metavar="DIR", help="corpus directory (sentences/, manifest.json)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="model directory to write; rerunning with the same --out resumes an unfinished run, "
                             "or goes on from a finished one with a larger --max-steps; other settings need "
                             "--force-new")
    add_num_workers(parser)
    add_max_steps(parser, "train N optimizer steps per worker, for as many epochs as they take (0: run "
                          "train.epochs out; default: the config's train.max_steps)", least=0)
    add_executor(parser, state="_train/")
    add_force_new(parser)
    add_config_arguments(parser)


def run(args) -> int:
    from sentsim.discriminator.train import DiscriminatorJob, train_discriminator

    overrides = list(args.overrides)
    if args.num_workers is not None:
        overrides.append(f"train.num_workers={args.num_workers}")
    if args.max_steps is not None:  # 0 runs the epochs out, as in the other trainers (here: no max_steps)
        overrides.append(f"train.max_steps={args.max_steps or 'null'}")
    job = load_config(DiscriminatorJob, args.config, overrides)
    metrics = train_discriminator(args.corpus, args.out, job, address=args.address, force_new=args.force_new,
                                  executor=args.executor)
    keep = ("step", "heldout_accuracy", "heldout_auc", "heldout_auc_same_doc", "heldout_auc_random",
            "heldout_windows", "heldout_split", "world_size", "fit_seconds")
    print(json.dumps({k: metrics[k] for k in keep if k in metrics}))
    return 0
