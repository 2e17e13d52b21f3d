"""`sentsim train surrogate`: fit a Siamese or cross-encoder surrogate to harvested scores on Ray Train."""

from __future__ import annotations

from sentsim.config import add_config_arguments, load_config

COMMAND = ("train", "surrogate")
HELP = "train a surrogate (Siamese or cross-encoder) on harvested pair scores, optionally fine-tune on STS-B"


def add_arguments(parser) -> None:
    parser.add_argument("--data", metavar="HARVEST_DIR", help="harvest output: pairs/part-*.parquet and manifest.json")
    parser.add_argument("--backbone", required=True, metavar="PATH",
                        help="transformers encoder (or sentence-transformers) folder; with --init scratch only its tokenizer is used")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output: model/ (and model-sts/), curves/, ray/ checkpoints; rerun with the same DIR to resume")
    parser.add_argument("--arch", choices=["siamese", "cross"], default=None, help="surrogate form (default siamese)")
    parser.add_argument("--init", choices=["pretrained", "scratch"], default=None,
                        help="start from the backbone's weights, or a small BERT with random weights")
    parser.add_argument("--loss", choices=["cosine_regression", "cosent"], default=None)
    parser.add_argument("--finetune-sts", metavar="PATH", help="then fine-tune on STS-B train (folder with sts-*.csv) with L2")
    parser.add_argument("--num-workers", type=int, default=None, help="DDP workers")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--restart", action="store_true", help="discard the checkpoints under --out and start over")
    add_config_arguments(parser)


def run(args) -> int:
    from sentsim.surrogate import SurrogateConfig, train_surrogate

    cfg = load_config(SurrogateConfig, args.config, args.overrides, arch=args.arch, init=args.init, loss=args.loss,
                      num_workers=args.num_workers, epochs=args.epochs, max_steps=args.max_steps)
    summary = train_surrogate(cfg, data=args.data, backbone=args.backbone, out=args.out,
                              finetune_sts=args.finetune_sts, address=args.address, restart=args.restart)
    for st in summary["stages"]:
        first, last = st["first"], st["last"]
        print(f"{st['stage']}: {st['train_pairs']} pairs, {st['total_steps']} steps; "
              f"dev L2 {first['dev_l2']:.4g} -> {last['dev_l2']:.4g}; "
              f"Spearman vs teacher (test) {first['test_spearman']:.2f} -> {last['test_spearman']:.2f}; model: {st['model']}")
    print(f"curves: {args.out}/curves/")
    return 0
