"""Ingestion throughput (sentences/s) and peak memory at 1x and 4x the input, on Gutenberg.

    .venv/bin/python bench/ingest.py --docs 40 --runs 3

The input is the first --docs books of ../shared/data/corpus/gutenberg_docs.jsonl.gz; 4x is the
same slice given as four input files (four times the documents, distinct ids). Each run is a
fresh `sentsim corpus build` on a local Ray (2 CPUs here), timed end to end, Ray start included;
peak memory is the summed RSS of the command's whole process tree (driver, raylet, workers).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median, run_measured  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GUTENBERG = ROOT.parent / "shared" / "data" / "corpus" / "gutenberg_docs.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--executor", default="ray")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ingest.md"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sentsim-bench-ingest-"))
    piece = work / "slice.jsonl.gz"
    with gzip.open(GUTENBERG, "rt", encoding="utf-8") as src, gzip.open(piece, "wt", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if i >= args.docs:
                break
            dst.write(line)
    sentsim = str(Path(sys.executable).parent / "sentsim")
    env = dict(os.environ)  # token auth stays on: each build's local Ray finds (or makes) the token
    rows = []
    for scale in [int(s) for s in args.scales.split(",")]:
        inputs = []
        for k in range(scale):
            p = work / f"slice{k}.jsonl.gz"
            shutil.copy(piece, p)
            inputs.append(str(p))
        walls, peaks, sents = [], [], 0
        for r in range(args.runs):
            out = work / f"run-{scale}-{r}"
            wall, peak, _ = run_measured(
                [sentsim, "corpus", "build", *inputs, "--out", str(out), "--executor", args.executor], env)
            sents = json.loads((out / "manifest.json").read_text())["counts"]["sentences"]
            walls.append(wall)
            peaks.append(peak)
            shutil.rmtree(out)
            print(f"scale {scale}x run {r}: {sents:,} sentences in {wall:.1f}s, peak {peak / 2**20:.0f} MiB",
                  flush=True)
        rows.append((scale, sents, median(walls), sents / median(walls), median(peaks) / 2**20, max(peaks) / 2**20))
    base = rows[0]
    lines = [
        "| input | sentences | median wall (s) | sentences/s | peak RSS median (MiB) | peak RSS max (MiB) "
        "| peak vs 1x |",
        "|---|---|---|---|---|---|---|",
    ]
    for scale, sents, wall, rate, peak, pmax in rows:
        lines.append(f"| {scale}x | {sents:,} | {wall:.1f} | {rate:,.0f} | {peak:.0f} | {pmax:.0f} "
                     f"| {peak / base[4]:.2f} |")
    report = "\n".join(
        [f"Machine: {machine()}", f"Command: `{' '.join(sys.argv)}` ({args.runs} runs each, executor {args.executor}, "
         f"first {args.docs} Gutenberg books per input file)", "", *lines, ""]
    )
    print(report)
    Path(args.out).write_text(report)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
