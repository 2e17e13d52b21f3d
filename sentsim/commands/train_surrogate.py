"""`sentsim train surrogate`: fit a Siamese or cross-encoder surrogate to harvested scores on Ray Train, or
inline in this process (--executor inline)."""

from __future__ import annotations

import os

from sentsim.config import load_config
from sentsim.training.cli import add_executor, add_training_arguments, backbone_or_default, training_overrides
from sentsim.training.common import counted

COMMAND = ("train", "surrogate")
HELP = "train a surrogate (Siamese or cross-encoder) on harvested pair scores, optionally fine-tune on STS-B"


def add_arguments(parser) -> None:
    parser.add_argument("--arch", choices=["siamese", "cross"], default=None, help="surrogate form (default siamese)")
    parser.add_argument("--loss", choices=["cosine_regression", "cosent"], default=None,
                        help="pair loss (default cosine_regression: the paper's L2 between cosine and score); on "
                             "harvested scores in a narrow band, cosent learns their order instead")
    parser.add_argument("--finetune-sts", metavar="PATH",
                        help="then fine-tune on STS-B train (folder with sts-*.csv) with L2; --max-steps, when "
                             "given, bounds this stage too (else finetune.max_steps and finetune.epochs)")
    add_executor(parser)
    add_training_arguments(parser, data_help="harvest output: pairs/part-*.parquet and manifest.json",
                           out_help="output: model/ (and model-sts/), curves/, ray/ (or, inline, checkpoint/) "
                                    "checkpoints")


def run(args) -> int:
    from sentsim.surrogate import SurrogateConfig, train_surrogate

    overrides = list(args.overrides or [])
    if args.max_steps is not None and args.finetune_sts:
        # a --max-steps smoke test stays one: the fine-tune stage would otherwise run its 4 epochs of
        # STS-B train (~1,400 steps); a --set finetune.max_steps=... given after it still wins
        overrides.insert(0, f"finetune.max_steps={args.max_steps}")
    cfg = load_config(SurrogateConfig, args.config, overrides, arch=args.arch, loss=args.loss,
                      **training_overrides(args))
    summary = train_surrogate(cfg, data=args.data, backbone=backbone_or_default(args.backbone), out=args.out,
                              finetune_sts=args.finetune_sts, address=args.address, executor=args.executor,
                              force_new=args.force_new)
    for st in summary["stages"]:
        first, last = st["first"], st["last"]
        sts = st["stage"] == "finetune-sts"  # trained with L2 on STS-B's gold scores
        # under cosent the cosines keep the targets' order, not their values: dev L2 says nothing there
        dev = ("L2", "dev_l2", ".4g") if sts or cfg.loss != "cosent" else ("Spearman", "dev_spearman", ".2f")
        print(f"{st['stage']}: {counted(st['train_pairs'], 'pair')}, {counted(st['total_steps'], 'step')}; "
              f"dev {dev[0]} {first[dev[1]]:{dev[2]}} -> {last[dev[1]]:{dev[2]}}; "
              f"Spearman vs {'gold' if sts else 'teacher'} (test) {first['test_spearman']:.2f} -> "
              f"{last['test_spearman']:.2f}; model: {st['model']}")
    # beside the models, spelt as their lines spell them
    print(f"curves: {os.path.join(os.path.dirname(summary['stages'][-1]['model']), 'curves')}/")
    return 0
