"""Throughput of ContextScorer against the dense matmul FLOP/s of the same machine, measured in the same run.

Workload = the harvest's access pattern: N sentences, each scored against M contexts (c<, c>) in every
direction of Eq. 3 (fwd shares one encoder pass per context across all N sentences).

Reported per token budget: scored (sentence, context) items/s, target tokens/s, the model FLOPs actually
executed (counted with torch.utils.flop_counter on one pass, padding included), achieved model FLOP/s,
model FLOP utilisation = achieved / measured dense matmul FLOP/s, and the padding fraction.

    python bench/context_scoring.py [--model DIR] [--device cpu|cuda] [--out bench/results/context_scoring.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import append_results  # noqa: E402

from sentsim.context.config import ContextModelConfig, ScorerConfig  # noqa: E402
from sentsim.context.devcorpus import write_dev_corpus  # noqa: E402
from sentsim.context.model import build_model  # noqa: E402
from sentsim.context.scorer import ContextScorer  # noqa: E402
from sentsim.context.tokenizer import train_bpe  # noqa: E402
from sentsim.context.windows import iter_documents, windows_of  # noqa: E402
from sentsim.hardware import bf16_native, describe  # noqa: E402

# The "realistic small model": 7.65M-parameter BART, d_model 256, 3+3 layers, byte-level BPE 8,000.
SMALL = dict(vocab_size=8000, d_model=256, encoder_layers=3, decoder_layers=3, attention_heads=4, ffn_dim=1024,
             dropout=0.0, context_sentences=1, max_source_tokens=256, max_target_tokens=128)


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int, seconds: float = 2.0) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(5):
            a @ b
        reps += 5
        sync()
    dt = time.perf_counter() - t0
    return 2.0 * n ** 3 * reps / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a trained context-model directory (default: random SMALL model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sentences", type=int, default=24)
    ap.add_argument("--contexts", type=int, default=24)
    ap.add_argument("--budgets", default="", help="comma-separated token budgets (default: per device)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/context_scoring.md"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          (args.device if args.device != "auto" else "cpu"))
    gpu = device.type == "cuda"
    budgets = [int(x) for x in args.budgets.split(",") if x] or ([16384, 65536, 262144] if gpu else [4096, 16384])

    tmp = Path(tempfile.mkdtemp(prefix="ctxbench-"))
    corpus = write_dev_corpus(tmp / "corpus", max_docs=124)
    docs = list(iter_documents(str(corpus), 2.0, "all"))
    if args.model:
        model_src = args.model
        from sentsim.context.bundle_meta import read_bundle_meta

        model_desc = f"trained bundle {args.model}"
        k = read_bundle_meta(args.model)["model_config"]["context_sentences"]
    else:
        tok = train_bpe((s for d in docs for s in d), SMALL["vocab_size"])
        cfg = ContextModelConfig(**SMALL)
        model = build_model(cfg, tok)
        model_src = (cfg, tok, {"fwd": model, "left": model, "right": model})
        model_desc = (f"BART from config, d_model {cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
                      f"ffn {cfg.ffn_dim}, BPE vocab {tok.vocab_size}, one shared model with direction tags, "
                      f"{model.n_parameters() / 1e6:.2f}M parameters "
                      "(random weights: throughput does not depend on them)")
        k = cfg.context_sentences
    windows = [w for d in docs for w in windows_of(d, k) if w[0] and w[2] and w[1]]
    step = max(1, len(windows) // (args.sentences + args.contexts))
    picked = windows[::step]
    sentences = [w[1] for w in picked[:args.sentences]]
    contexts = [(w[0], w[2]) for w in picked[args.sentences:args.sentences + args.contexts]]
    n_items = len(sentences) * len(contexts)

    # MFU is measured against the fastest matmul format this hardware has: bf16 where it is native
    # (GPUs, CPUs with avx512_bf16/AMX), else fp32. Both peaks are measured and reported.
    mm_n = 8192 if gpu else 1024
    peaks = {"fp32": matmul_flops(device, torch.float32, mm_n, seconds=1.0),
             "bf16": matmul_flops(device, torch.bfloat16, mm_n if bf16_native(device.type) else 256, seconds=1.0)}
    fastest = max(peaks, key=peaks.get)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[fastest]
    peak_before = matmul_flops(device, dtype, mm_n)
    rows = []
    for budget in budgets:
        scfg = ScorerConfig(device=str(device), batch_tokens=budget, autocast="bf16" if fastest == "bf16" else "off")
        scorer = ContextScorer(model_src, scfg)
        scorer.score_matrix(sentences[:2], contexts[:2])  # warm-up
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            res = scorer.score_matrix(sentences, contexts)
        flops = fc.get_total_flops()
        best = None
        for _ in range(args.repeats):
            if gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = scorer.score_matrix(sentences, contexts)
            if gpu:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        st = res.stats
        peak = matmul_flops(device, dtype, mm_n, seconds=1.0)  # re-measured beside each point: shared machines drift
        peak = (peak + peak_before) / 2
        rows.append({
            "budget": budget, "items": n_items, "seconds": best, "items_per_s": n_items / best,
            "target_tokens_per_s": st["target_tokens"] / best, "target_tokens": st["target_tokens"],
            "encoder_rows": st["encoder_rows"], "decoder_rows": st["decoder_rows"],
            "model_gflop": flops / 1e9, "model_flops_per_s": flops / best, "mfu": flops / best / peak,
            "matmul_flops_per_s": peak,
            "padding_fraction": st["padding_fraction"],
            "decoder_padding": 1 - st["decoder_real_tokens"] / max(st["decoder_padded_tokens"], 1),
            "encoder_padding": 1 - st["encoder_real_tokens"] / max(st["encoder_padded_tokens"], 1),
        })
        print(json.dumps(rows[-1]), flush=True)

    dev_name = torch.cuda.get_device_name(0) if gpu else f"{platform.processor() or platform.machine()} CPU"
    lines = [
        f"## {dev_name} ({'bf16 autocast' if fastest == 'bf16' else 'fp32'}, torch threads {torch.get_num_threads()})",
        "",
        f"- Model: {model_desc}.",
        f"- Workload: {len(sentences)} sentences x {len(contexts)} contexts (k=1 sentence each side) = {n_items} "
        f"items, all three directions of Eq. 3 per item; corpus windows from us_speeches.",
        f"- Dense matmul peaks, same run: fp32 {peaks['fp32'] / 1e9:.1f}, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s "
        f"({describe()}); scoring runs in and MFU is against the faster, {fastest} {mm_n}^3: "
        f"{peak_before / 1e9:.1f} GFLOP/s at the start; "
        f"each row's MFU uses the mean of that and a re-measurement right after the row's timing.",
        "- Model FLOPs are counted by `torch.utils.flop_counter` over one full scoring pass (padding included).",
        "",
        "| token budget | items/s | target tokens/s | model GFLOP/pass | model GFLOP/s | matmul GFLOP/s "
        "| MFU vs matmul | padding (all / enc / dec) | encoder rows / decoder rows |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['budget']} | {r['items_per_s']:.0f} | {r['target_tokens_per_s']:.0f} | {r['model_gflop']:.2f} | "
            f"{r['model_flops_per_s'] / 1e9:.1f} | {r['matmul_flops_per_s'] / 1e9:.1f} | {100 * r['mfu']:.1f}% | "
            f"{r['padding_fraction']:.3f} / {r['encoder_padding']:.3f} / {r['decoder_padding']:.3f} | "
            f"{r['encoder_rows']:.0f} / {r['decoder_rows']:.0f} |")
    lines.append("")
    append_results(args.out, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
