"""Reference training run of the context models: held-out perplexity and context-use gap per direction.

    python bench/context_training.py --corpus DIR --minutes 8 [--set key=value ...] [--out results.md]

Trains one shared model (direction tag) on all three directions for a wall-clock budget with
`train_context` (inline executor; GPU + bf16 when present), then appends model size, tokens seen, wall
time and, per direction, the held-out perplexity and context-use gap (with its history) to the results
file. `--build-corpus` writes a corpus from ../shared/data/corpus first (ingestion layout).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import append_results  # noqa: E402

from sentsim.config import load_config  # noqa: E402
from sentsim.context.config import ContextTrainConfig  # noqa: E402
from sentsim.context.train import train_context  # noqa: E402

DEFAULTS = [
    "model.vocab_size=8000", "model.d_model=256", "model.encoder_layers=3", "model.decoder_layers=3",
    "model.attention_heads=4", "model.ffn_dim=1024", "model.dropout=0.1", "model.context_sentences=1",
    "model.max_source_tokens=192", "model.max_target_tokens=96",
    "executor=inline", "max_steps=1000000", "heldout_percent=2", "heldout_windows=1024",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--work", default="/tmp/ctx-reference")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "bench/results/context_training.md"))
    args = ap.parse_args(argv)
    cfg = load_config(ContextTrainConfig, None, DEFAULTS + [f"max_seconds={args.minutes * 60}"] + args.overrides)
    t0 = time.perf_counter()
    summary = train_context(args.corpus, args.work, cfg, force_new=True)  # a reference run starts fresh
    wall = time.perf_counter() - t0
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() and cfg.use_gpu != "no" else \
        f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    lines = []
    for name, r in summary["runs"].items():
        m = cfg.model
        arch = (f"BART d_model {m.d_model}, {m.encoder_layers}+{m.decoder_layers} layers, ffn {m.ffn_dim}, "
                f"vocab {m.vocab_size}" if m.arch == "bart"
                else "EncoderDecoderModel warm-started from all-MiniLM-L6-v2")
        lines += [
            f"### {args.label or name}: {dev}",
            "",
            f"- Model: {arch}, layout {m.layout}, window k={m.context_sentences}, "
            f"{r['parameters'] / 1e6:.2f}M parameters.",
            f"- Optimiser: Adam lr {cfg.lr} betas ({cfg.beta1}, {cfg.beta2}), warm-up {cfg.warmup_steps}, "
            f"{cfg.schedule}; {cfg.batch_tokens} tokens per batch.",
            f"- Steps {r['steps']}, tokens seen {r['tokens_seen']:,} (target tokens {r['target_tokens_seen']:,}), "
            f"training time {r['train_seconds']:.0f} s, wall time {wall:.0f} s incl. tokenizer and evaluation.",
            f"- Corpus: {args.corpus}; held-out: {cfg.heldout_percent}% of documents, "
            f"{cfg.heldout_windows} windows per direction.",
            "",
            "| direction | held-out loss (nats/token) | perplexity | loss, contexts shuffled "
            "| context-use gap (nats/token) | initial loss |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for d, ev in r["final_eval"].items():
            init = r["initial_eval"][d]["loss"]
            lines.append(f"| {d} | {ev['loss']:.3f} | {ev['perplexity']:.1f} | {ev['shuffled_loss']:.3f} | "
                         f"{ev['context_gap']:+.4f} | {init:.3f} |")
        hist = json.loads((Path(args.work) / "runs" / name / "history.json").read_text())
        hist = [h for h in hist if h.get("eval")]
        if len(hist) > 2:
            lines += ["", "Context-use gap over training (nats/token):", "",
                      "| step | target tokens seen | " + " | ".join(hist[0]["eval"]) + " |",
                      "|---:|---:|" + "---:|" * len(hist[0]["eval"])]
            for h in hist:
                lines.append(f"| {h['step']} | {h.get('target_tokens_seen', 0):,} | "
                             + " | ".join(f"{e['context_gap']:+.4f}" for e in h["eval"].values()) + " |")
        lines.append("")
        print(json.dumps({"run": name, "steps": r["steps"], "tokens_seen": r["tokens_seen"],
                          "train_seconds": round(r["train_seconds"], 2),
                          "tokens_per_second": round(r["tokens_seen"] / max(r["train_seconds"], 1e-9), 1)}))
    append_results(args.out, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
