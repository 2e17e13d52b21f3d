"""Harvest throughput: pairs/hour at |C_s| = 32, Ray vs in-process, 1 vs 2 scoring actors,
peak memory at two corpus sizes, and rank-target throughput.

    .venv/bin/python bench/harvest.py --runs 3 [--context-models DIR ...] [--index DIR] [--corpus DIR]

Without model arguments it builds the sample corpus, its index, and a small context model
(d_model 256, 3+3 layers, BPE 8000: the reference architecture, untrained; scoring cost does not
depend on the weights). Every configuration runs in this one process tree so that ratios compare
like with like. A local Ray is started once, before the timed runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# the checkout too: else tests/storage/, a test folder, is imported as the storage package
sys.path.append(str(Path(__file__).resolve().parent.parent))
from common import PeakRSS, machine, median  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"


def build_inputs(work: Path, scale: int):
    from harvest_support import build_index_for

    from sentsim.corpus_job import build_corpus

    inputs = []
    for k in range(scale):
        p = work / f"sample{k}.jsonl.gz"
        shutil.copy(SAMPLE, p)
        inputs.append(str(p))
    corpus = work / f"corpus{scale}"
    build_corpus(inputs, str(corpus), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    return corpus, build_index_for(corpus, work / f"index{scale}")


def reference_bundle(corpus: Path, out: Path, small: bool = False) -> Path:
    import pyarrow.dataset as ds

    from sentsim.context.config import DIRECTIONS, ContextModelConfig
    from sentsim.context.model import build_model, save_bundle
    from sentsim.context.tokenizer import train_bpe

    texts = ds.dataset(str(corpus / "sentences")).to_table(columns=["text"]).column("text").to_pylist()
    if small:  # d_model 64, 1+1 layers: for the ratios, which do not depend on model size
        tok = train_bpe(texts, 2000)
        cfg = ContextModelConfig(vocab_size=2000, d_model=64, encoder_layers=1, decoder_layers=1, ffn_dim=128)
    else:
        tok = train_bpe(texts, 8000)
        cfg = ContextModelConfig()
    save_bundle(out, cfg, tok, {"shared": build_model(cfg, tok)}, {d: "shared" for d in DIRECTIONS})
    return out


def run_once(cfg, executor: str) -> dict:
    from sentsim.harvest.job import harvest

    shutil.rmtree(cfg.out, ignore_errors=True)
    t0 = time.perf_counter()
    with PeakRSS(os.getpid()) as mem:
        harvest(cfg, executor=executor, quiet=True)
    wall = time.perf_counter() - t0
    rep = json.loads(Path(cfg.out, "report.json").read_text())
    return {"wall": wall, "pairs": rep["pairs"], "items": rep["scored_items"], "peak": mem.peak,
            "scoring_s": rep["stage_seconds"].get("scoring", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--anchors", type=int, default=12)
    ap.add_argument("--context-models", nargs="*")
    ap.add_argument("--small", action="store_true", help="a d_model-64 model instead of the reference size")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch threads for scoring, split over the actors")
    ap.add_argument("--actors", default="1,2", help="Ray configurations to time: scoring actors, comma-separated")
    ap.add_argument("--no-inline", action="store_true",
                    help="skip the in-process baseline (ratios are then against the first Ray configuration)")
    ap.add_argument("--throughput-only", action="store_true",
                    help="skip the 4x-corpus memory runs and the rank-target timing (for slow reference models)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "harvest.md"))
    args = ap.parse_args()
    import ray
    from harvest_support import harvest_config

    from sentsim.runtime import init_ray

    work = Path(tempfile.mkdtemp(prefix="sentsim-bench-harvest-"))
    corpus1, index1 = build_inputs(work, 1)
    bundle = args.context_models or [str(reference_bundle(corpus1, work / "ctx", args.small))]

    def cfg_for(corpus, index, out, actors=1, rank=False):
        return harvest_config(
            corpus, index, bundle[0], out, context_models=bundle,
            anchors={"n": args.anchors, "per_unit": 1}, contexts={"size": 32, "retrieve_chunks": 500},
            rank={"enabled": rank, "n_anchors": 2000},
            # the same threads in-process and on Ray: a Ray actor with num_cpus < 1 otherwise gets
            # OMP_NUM_THREADS=1 while the in-process loop uses every core
            scoring={"batch_tokens": 8192, "torch_threads": max(1, args.threads // actors)},
            resources={"scoring": {"num_cpus": 0.5, "min_actors": actors, "max_actors": actors}},
        )

    init_ray(num_cpus=os.cpu_count())  # token auth, loopback only, like every sentsim job
    results = {}
    plan = ([] if args.no_inline else [("inline, 1 process", "inline", 1)]) + [
        (f"ray, {a} scoring actor{'s' if a > 1 else ''}", "ray", a) for a in map(int, args.actors.split(","))]
    for label, executor, actors in plan:
        runs = []
        for r in range(args.runs):
            runs.append(run_once(cfg_for(corpus1, index1, work / "run", actors), executor))
            print(label, r, runs[-1], flush=True)
        results[label] = runs
    if not args.throughput_only:
        # memory at two corpus sizes (4x the sample)
        corpus4, index4 = build_inputs(work, 4)
        mem4 = [run_once(cfg_for(corpus4, index4, work / "run4"), "ray") for _ in range(args.runs)]
    ray.shutdown()
    rank_rates = []
    if not args.throughput_only:
        # rank-target throughput
        from sentsim.rank.targets import RankTargets, default_base_encoder, sample_anchors

        ids, texts = sample_anchors(str(corpus4), 10_000, seed=0)
        rt = RankTargets(default_base_encoder(), ids, texts, bits=16)
        qs = texts[:2000]
        for _ in range(args.runs):
            t0 = time.perf_counter()
            rt.codes(qs)
            rank_rates.append(len(qs) / (time.perf_counter() - t0))

    def row(label, runs):
        pairs = runs[0]["pairs"]
        w = median([x["wall"] for x in runs])
        items = runs[0]["items"]
        return label, pairs, w, pairs / w * 3600, items / w, median([x["peak"] for x in runs]) / 2**20

    rows = [row(k, v) for k, v in results.items()]
    base = rows[0][3]
    lines = [f"Machine: {machine()}",
             f"Command: `{' '.join(sys.argv)}` ({args.runs} runs each; |C_s| = 32; {args.anchors} anchors, "
             f"5 partners each; context model {bundle}; {args.threads} torch threads for scoring, split over the "
             "scoring actors); wall time of the harvest call, Ray already started.", "",
             "| configuration | pairs | median wall (s) | pairs/hour | scored items/s | peak RSS (MiB) "
             f"| vs {rows[0][0]} |",
             "|---|---|---|---|---|---|---|"]
    for label, pairs, w, ph, ips, peak in rows:
        lines.append(f"| {label} | {pairs} | {w:.1f} | {ph:,.0f} | {ips:,.1f} | {peak:.0f} | {ph / base:.2f} |")
    by = {r[0]: r for r in rows}
    r1, r2 = by.get("ray, 1 scoring actor"), by.get("ray, 2 scoring actors")
    if r1 and r2:
        lines += ["", f"Speed-up from 1 to 2 scoring actors: {r2[3] / r1[3]:.2f}x"]
    if not args.throughput_only:
        n1 = json.loads((corpus1 / "manifest.json").read_text())["counts"]["sentences"]
        n4 = json.loads((corpus4 / "manifest.json").read_text())["counts"]["sentences"]
        lines += ["", "| corpus | sentences | peak RSS of the driver process tree (MiB) |", "|---|---|---|",
                  f"| sample x1 | {n1:,} | {(r1 or rows[-1])[5]:.0f} |",
                  f"| sample x4 | {n4:,} | {median([x['peak'] for x in mem4]) / 2**20:.0f} |", "",
                  f"Rank targets (all-MiniLM-L6-v2, 10,000 anchors, 16-bit codes = {rt.codec.bytes_per_sentence:,} "
                  f"bytes/sentence): {median(rank_rates):,.0f} sentences/s (median of {args.runs})"]
    lines.append("")
    report = "\n".join(lines)
    print(report)
    Path(args.out).write_text(report)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
