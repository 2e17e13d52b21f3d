"""The command-line flags `sentsim train surrogate` and `sentsim train student` share."""

from __future__ import annotations

from sentsim.config import add_config_arguments


def add_training_arguments(parser, *, data_help: str, out_help: str) -> None:
    """--data, --backbone, --out, --init, --num-workers, --epochs, --max-steps, --restart, and the
    flags of every job (--config, --set, --address). Call it after the command's own flags."""
    parser.add_argument("--data", metavar="HARVEST_DIR", help=data_help)
    parser.add_argument("--backbone", required=True, metavar="PATH",
                        help="transformers or sentence-transformers folder; with --init scratch only its tokenizer is used")
    parser.add_argument("--out", required=True, metavar="DIR", help=out_help + "; rerun with the same DIR to resume")
    parser.add_argument("--init", choices=["pretrained", "scratch"], default=None,
                        help="start from the backbone's weights, or a small BERT with random weights")
    parser.add_argument("--num-workers", type=int, default=None, help="DDP workers")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--restart", action="store_true", help="discard the checkpoints under --out and start over")
    add_config_arguments(parser)


def training_overrides(args) -> dict:
    """The flags above that set config keys, for load_config (None: not given, the config decides)."""
    return {"init": args.init, "num_workers": args.num_workers, "epochs": args.epochs, "max_steps": args.max_steps}
