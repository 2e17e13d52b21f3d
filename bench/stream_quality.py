"""Does the bucketed stream train as well as the legacy one? (issue 38: "training that reaches the same held-out
loss per target token as today on the same data")

    python bench/stream_quality.py [--corpus DIR] [--target-tokens 300000] [--seeds 0,1]
                                   [--batchings buffer,bucketed] [--plan 2d|total|coarse:G] [--micro-batches K]
                                   [--config configs/gpu_context.yaml --tokenizer DIR --device cuda]

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
    ap.add_argument("--batch-tokens", type=int, default=None,
                    help="padded tokens a batch (default: 4096 for the built-in model, the config's with --config)")
    ap.add_argument("--config", default="", help="a context training config (e.g. configs/gpu_context.yaml) instead "
                    "of the built-in small BART; its model, lr, schedule and held-out settings are kept")
    ap.add_argument("--tokenizer", default="", help="a tokenizer folder to use instead of a BPE trained here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: train on the GPU, in the config's precision (bf16 auto); cpu: fp32")
    ap.add_argument("--batchings", default="buffer,bucketed", help="the streams to train with, comma-separated")
    ap.add_argument("--plan", default="2d",
                    help="an experiment on the bucketed stream's (micro-)batches: 'total', 'source' or 'target' "
                         "sorts them on source + target length (as the legacy stream does), on source or on target "
                         "length alone and cuts them in that order; 'random' cuts them in a random order; "
                         "'coarse:G' plans groups of G batches alike in length and fills each batch at random from "
                         "its group (each measured with --micro-batches 1)")
    ap.add_argument("--micro-batches", type=int, default=None,
                    help="the bucketed stream's micro-batches a step (default: the config's, 8; 1 = steps alike in "
                         "length, the stream as first landed)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "stream_quality"))
    a = ap.parse_args(argv)
    from common import machine, sample_corpus_and_bpe

    from sentsim.context.config import ContextTrainConfig
    from sentsim.context.train import train_context

    if a.plan != "2d":
        import functools

        import sentsim.context.stream as stream

        if a.plan in ("total", "source", "target", "random"):
            stream.plan_batches = functools.partial(plan_in_order, a.plan)
        elif a.plan.startswith("coarse:"):
            stream.plan_batches = functools.partial(plan_coarse, int(a.plan.split(":")[1]))
        else:
            ap.error(f"--plan: 2d, total, source, target, random or coarse:G, not {a.plan!r}")
    work = Path(tempfile.mkdtemp(prefix="stream-quality-"))
    if a.config:
        import yaml

        base = yaml.safe_load(Path(a.config).read_text())
    else:
        base = {"model": MODEL, "lr": 1e-3, "warmup_steps": 50, "schedule": "inverse_sqrt", "heldout_percent": 5.0,
                "heldout_windows": 512, "batch_tokens": 4096}
    if a.batch_tokens is not None:
        base["batch_tokens"] = a.batch_tokens
    if a.micro_batches is not None:
        base["micro_batches"] = a.micro_batches
    corpus, tok_dir = sample_corpus_and_bpe(work, base["model"]["vocab_size"], a.corpus, a.tokenizer)
    runs = []
    for seed in (int(x) for x in a.seeds.split(",")):
        for batching in a.batchings.split(","):
            cfg = ContextTrainConfig.model_validate({
                **base, "seed": seed, "batching": batching, "max_steps": 10_000_000, "max_seconds": 0.0,
                "max_target_tokens": a.target_tokens, "eval_every": 10_000_000, "checkpoint_every": 10_000_000,
                "executor": "inline", "use_gpu": "yes" if a.device == "cuda" else "no",
                "bf16": base.get("bf16", "auto") if a.device == "cuda" else "off"})
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
    m = base["model"]
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(), "device": a.device, "config": base,
                                                    "runs": runs}, indent=1))
    lines = [f"Machine: {machine()}", "",
             f"`python bench/stream_quality.py --target-tokens {a.target_tokens} --seeds {a.seeds} "
             f"--batchings {a.batchings} --plan {a.plan}{' --corpus ' + a.corpus if a.corpus else ''}"
             f"{' --config ' + a.config if a.config else ''}{' --device cuda' if a.device == 'cuda' else ''}"
             f"{' --batch-tokens %d' % a.batch_tokens if a.batch_tokens is not None else ''}"
             f"{' --micro-batches %d' % a.micro_batches if a.micro_batches is not None else ''}`: BART "
             f"d_model {m['d_model']}, {m['encoder_layers']}+{m['decoder_layers']} layers, vocabulary "
             f"{m['vocab_size']}, batch_tokens {base['batch_tokens'] or 'by device'} (bucketed: "
             f"{base.get('micro_batches', ContextTrainConfig.model_fields['micro_batches'].default)} micro-batches a "
             "step), "
             f"{'fp32' if a.device == 'cpu' else 'bf16 ' + str(base.get('bf16', 'auto'))} on {a.device}, "
             "on the same corpus and held-out windows", "",
             "| batching | seed | steps | target tokens | padding | CPU-s | held-out loss fwd / left / right | "
             "context gap fwd / left / right |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in runs:
        lines.append(f"| {r['batching']} | {r['seed']} | {r['steps']} | {r['target_tokens']:,} | {r['padding']:.1%} "
                     f"| {r['cpu_s']:.0f} | " + " / ".join(f"{r['loss'][d]:.3f}" for d in ("fwd", "left", "right"))
                     + " | " + " / ".join(f"{r['gap'][d]:+.3f}" for d in ("fwd", "left", "right")) + " |")
    mean = {b: statistics.mean(statistics.mean(r["loss"].values()) for r in runs if r["batching"] == b)
            for b in a.batchings.split(",")}
    lines += ["", "Mean held-out loss over directions and seeds: " + ", ".join(f"{b} {v:.3f}" for b, v in mean.items())
              + (f" (bucketed - buffer = {mean['bucketed'] - mean['buffer']:+.3f} nats)."
                 if {"buffer", "bucketed"} <= set(mean) else ".")]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def plan_in_order(key: str, src_len, tgt_len, budget: int, **_):
    """Batches of at most `budget` padded tokens cut from the examples in one order: sorted by source +
    target length, ties by target (`total`: the legacy stream's sort, `batching.token_batches`, over a whole
    chunk), by source or by target length (ties by the other), or shuffled (`random`)."""
    import numpy as np

    order = {"total": lambda: np.lexsort((tgt_len, src_len + tgt_len)),
             "source": lambda: np.lexsort((tgt_len, src_len)), "target": lambda: np.lexsort((src_len, tgt_len)),
             "random": lambda: np.random.default_rng(len(src_len)).permutation(len(src_len))}[key]()
    return cut_in_order(order, src_len, tgt_len, budget)


def plan_coarse(groups_of: int, src_len, tgt_len, budget: int, **_):
    """Groups of about `groups_of` batches alike in length (the 2-D plan at `groups_of` x the budget),
    each cut into batches filled at random from its group: more mixed lengths in a batch, more padding."""
    import numpy as np

    from sentsim.context.batching import plan_batches

    rng = np.random.default_rng(len(src_len))
    return [batch for group in plan_batches(src_len, tgt_len, budget * groups_of)
            for batch in cut_in_order(rng.permutation(group), src_len, tgt_len, budget)]


def cut_in_order(order, src_len, tgt_len, budget: int) -> list:
    """`order` cut into consecutive batches of at most `budget` tokens padded to their longest source and target."""
    import numpy as np

    out, cur, ms, mt = [], [], 0, 0
    for i in order:
        ns, nt = max(ms, int(src_len[i])), max(mt, int(tgt_len[i]))
        if cur and (len(cur) + 1) * (ns + nt) > budget:
            out.append(np.array(cur))
            cur, ns, nt = [], int(src_len[i]), int(tgt_len[i])
        cur.append(i)
        ms, mt = ns, nt
    if cur:
        out.append(np.array(cur))
    return out


if __name__ == "__main__":
    sys.exit(main())
