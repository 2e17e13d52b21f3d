"""`sentsim train context`: train the generative context models p(s|c<,c>), p(c<|s,c>), p(c>|c<,s)."""

from __future__ import annotations

import json
import os

from sentsim.config import add_config_arguments, load_config
from sentsim.out_paths import check_out
from sentsim.training.cli import add_executor, add_force_new, add_max_steps, add_num_workers
from sentsim.training.common import counted

COMMAND = ("train", "context")
HELP = "train the seq2seq context models (paper 3.2.2) on a corpus; reports held-out perplexity and context-use gap"


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True, metavar="DIR", help="corpus directory (sentences/part-*.parquet)")
    parser.add_argument("--direction", choices=["fwd", "left", "right", "all"], default=None,
                        help="fwd = p(s|c<,c>), left = p(c<|s,c>), right = p(c>|c<,s), all = the three (default: all)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="model directory; rerunning with the same --out resumes from the last checkpoint")
    parser.add_argument("--tokenizer-from", default="", metavar="DIR",
                        help="reuse the tokenizer of another context-model directory "
                             "(so separate runs can be combined)")
    add_num_workers(parser)
    add_max_steps(parser, "stop after N optimizer steps (default: the config's max_steps; a finished run given more "
                          "goes on from where it stopped)", least=1)
    add_executor(parser, config_key=True, state="runs/NAME/")
    add_force_new(parser)
    add_config_arguments(parser)


def run(args) -> int:
    from sentsim.context.config import ContextTrainConfig
    from sentsim.context.train import train_context

    cfg = load_config(ContextTrainConfig, args.config, args.overrides, direction=args.direction,
                      num_workers=args.num_workers, max_steps=args.max_steps, executor=args.executor)
    # the corpus may be local or s3:// (train_context reads it through the run reader)
    check_out(args.out, {"--corpus": args.corpus, "--tokenizer-from": args.tokenizer_from,
                         "model.pretrained_path": cfg.model.pretrained_path,
                         "model.warm_start_path": cfg.model.warm_start_path}, local="models and their training state",
              writes="context")
    summary = train_context(args.corpus, args.out, cfg, tokenizer_from=args.tokenizer_from,
                            address=args.address or os.environ.get("RAY_ADDRESS"), force_new=args.force_new)
    for name, r in summary["runs"].items():
        print(f"model {name}: {r['parameters']:,} parameters, {counted(r['steps'], 'step')}, "
              f"{r['tokens_seen']:,} tokens seen, {r['train_seconds']:.0f}s")
        for d, ev in (r["final_eval"] or {}).items():
            print(f"  {d:5s} held-out loss {ev['loss']:.3f} nats/token  ppl {ev['perplexity']:.1f}  "
                  f"context-use gap {ev['context_gap']:+.4f} nats/token")
    print(json.dumps({"out": args.out, "wall_seconds": round(summary["wall_seconds"], 1)}))
    return 0
