"""Does the bucketed stream train as well as the legacy one? (issue 38: "training that reaches the same held-out
loss per target token as today on the same data")

    python bench/stream_quality.py [--corpus DIR] [--target-tokens 300000] [--seeds 0,1]

Trains the same small BART (`sentsim train context`, inline, on this CPU) on the same corpus once per
batching (`buffer`, the legacy stream, and `bucketed`) and seed, each until the same number of target
tokens, and reports the held-out loss per direction (the same fixed held-out windows for all runs) and
the padded tokens each stream cost. The seeds give the spread a difference must exceed to mean anything.
Results: bench/results/stream_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODEL = dict(arch="bart", vocab_size=4000, d_model=128, encoder_layers=2, decoder_layers=2, attention_heads=4,
             ffn_dim=512, dropout=0.1, context_sentences=1, max_source_tokens=128, max_target_tokens=64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="", help="a corpus run (default: the bundled sample, built here)")
    ap.add_argument("--target-tokens", type=int, default=300_000)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "stream_quality"))
    a = ap.parse_args(argv)
    from common import machine

    from sentsim.context.config import ContextTrainConfig
    from sentsim.context.tokenizer import train_bpe
    from sentsim.context.train import train_context
    from sentsim.context.windows import iter_documents

    work = Path(tempfile.mkdtemp(prefix="stream-quality-"))
    corpus = a.corpus
    if not corpus:
        from sentsim.corpus_job import build_corpus

        corpus = str(work / "corpus")
        build_corpus([str(ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], corpus,
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    tok = train_bpe((s for d in iter_documents(corpus, 5.0, "train", order_seed=0) for s in d), MODEL["vocab_size"])
    tok_dir = work / "bpe"
    tok.save(tok_dir)
    runs = []
    for seed in (int(x) for x in a.seeds.split(",")):
        for batching in ("buffer", "bucketed"):
            cfg = ContextTrainConfig.model_validate({
                "model": MODEL, "lr": 1e-3, "warmup_steps": 50, "schedule": "inverse_sqrt", "seed": seed,
                "batch_tokens": a.batch_tokens, "batching": batching, "max_steps": 10_000_000,
                "max_target_tokens": a.target_tokens, "heldout_percent": 5.0, "heldout_windows": 512,
                "eval_every": 10_000_000, "checkpoint_every": 10_000_000, "bf16": "off", "executor": "inline",
                "use_gpu": "no"})
            s = train_context(corpus, str(work / f"{batching}-{seed}"), cfg, tokenizer_from=str(tok_dir))
            r = next(iter(s["runs"].values()))
            hist = json.loads((work / f"{batching}-{seed}" / "runs" / "shared" / "history.json").read_text())
            last = hist[-1]
            runs.append({"batching": batching, "seed": seed, "steps": r["steps"],
                         "target_tokens": r["target_tokens_seen"],
                         "padding": 1 - last["tokens_seen"] / last["padded_tokens_seen"],
                         "cpu_s": r["train_cpu_seconds"],
                         "loss": {d: e["loss"] for d, e in r["final_eval"].items()},
                         "gap": {d: e["context_gap"] for d, e in r["final_eval"].items()}})
            print(json.dumps(runs[-1]), flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(), "model": MODEL, "runs": runs}, indent=1))
    lines = [f"Machine: {machine()}", "",
             f"`python bench/stream_quality.py --target-tokens {a.target_tokens} --seeds {a.seeds}`: BART "
             f"d_model {MODEL['d_model']}, {MODEL['encoder_layers']}+{MODEL['decoder_layers']} layers, BPE "
             f"{MODEL['vocab_size']}, batch_tokens {a.batch_tokens}, fp32, on the same corpus and held-out windows", "",
             "| batching | seed | steps | target tokens | padding | CPU-s | held-out loss fwd / left / right | "
             "context gap fwd / left / right |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in runs:
        lines.append(f"| {r['batching']} | {r['seed']} | {r['steps']} | {r['target_tokens']:,} | {r['padding']:.1%} "
                     f"| {r['cpu_s']:.0f} | " + " / ".join(f"{r['loss'][d]:.3f}" for d in ("fwd", "left", "right"))
                     + " | " + " / ".join(f"{r['gap'][d]:+.3f}" for d in ("fwd", "left", "right")) + " |")
    mean = {b: statistics.mean(statistics.mean(r["loss"].values()) for r in runs if r["batching"] == b)
            for b in ("buffer", "bucketed")}
    lines += ["", f"Mean held-out loss over directions and seeds: buffer {mean['buffer']:.3f}, "
              f"bucketed {mean['bucketed']:.3f} (bucketed - buffer = {mean['bucketed'] - mean['buffer']:+.3f} nats)."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
