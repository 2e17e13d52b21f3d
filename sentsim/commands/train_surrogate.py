"""`sentsim train surrogate`: fit a Siamese or cross-encoder surrogate to harvested scores on Ray Train."""

from __future__ import annotations

from sentsim.config import load_config
from sentsim.training.cli import add_training_arguments, backbone_or_default, training_overrides

COMMAND = ("train", "surrogate")
HELP = "train a surrogate (Siamese or cross-encoder) on harvested pair scores, optionally fine-tune on STS-B"


def add_arguments(parser) -> None:
    parser.add_argument("--arch", choices=["siamese", "cross"], default=None, help="surrogate form (default siamese)")
    parser.add_argument("--loss", choices=["cosine_regression", "cosent"], default=None,
                        help="pair loss (default cosine_regression: the paper's L2 between cosine and score); on "
                             "harvested scores in a narrow band, cosent learns their order instead")
    parser.add_argument("--finetune-sts", metavar="PATH",
                        help="then fine-tune on STS-B train (folder with sts-*.csv) with L2")
    add_training_arguments(parser, data_help="harvest output: pairs/part-*.parquet and manifest.json",
                           out_help="output: model/ (and model-sts/), curves/, ray/ checkpoints")


def run(args) -> int:
    from sentsim.surrogate import SurrogateConfig, train_surrogate

    cfg = load_config(SurrogateConfig, args.config, args.overrides, arch=args.arch, loss=args.loss,
                      **training_overrides(args))
    summary = train_surrogate(cfg, data=args.data, backbone=backbone_or_default(args.backbone), out=args.out,
                              finetune_sts=args.finetune_sts, address=args.address, force_new=args.force_new)
    for st in summary["stages"]:
        first, last = st["first"], st["last"]
        print(f"{st['stage']}: {st['train_pairs']} pairs, {st['total_steps']} steps; "
              f"dev L2 {first['dev_l2']:.4g} -> {last['dev_l2']:.4g}; "
              f"Spearman vs teacher (test) {first['test_spearman']:.2f} -> {last['test_spearman']:.2f}; "
              f"model: {st['model']}")
    print(f"curves: {args.out}/curves/")
    return 0
