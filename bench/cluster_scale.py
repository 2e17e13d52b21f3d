"""Flat against two-level anchor clustering (`partners.cluster_levels`, sentsim/harvest/clusters.py) on real text.

    .venv/bin/python bench/cluster_scale.py [--sizes 5000,20000,90000] [--ks 32,256] [--repeats 3]
                                            [--single-above 20000] [--flat-max-nk 400000000]
                                            [--corpora enwiki[,gutenberg]] [--name cluster_scale] [--out DIR]

Sentences of the corpora (../shared/data/corpus/: enwiki_2014slice_docs.jsonl.gz, then
gutenberg_docs.jsonl.gz with --corpora enwiki,gutenberg; split as `corpus build` splits paragraphs, 4 words or more
as anchors.min_tokens keeps), read in document order until 3x the largest n or the corpora end (1,680,620 sentences
in both), then shuffled with seed 0; each n takes the first n of that order. For each n and cluster size K, in each
repeat, flat (levels=1) and two-level (levels=2) clustering of the same texts, one after the other, seed 0: wall
seconds of each, the ratio flat / two-level from that repeat, and the growth of the process's peak RSS during each
clustering over its RSS when it started; the median over the repeats (one repeat above --single-above sentences;
flat skipped where n * ceil(n/K) exceeds --flat-max-nk). Quality: the mean TF-IDF cosine over every pair within a
cluster (the pairs a harvest labels; TF-IDF of unigrams and bigrams, sublinear tf, fitted on the n texts without a
vocabulary cap), and the same for clusters drawn at random as the floor.
Results: bench/results/<name>.{json,md}, written after each row.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent))
from common import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CORPORA = {"enwiki": "enwiki_2014slice_docs.jsonl.gz", "gutenberg": "gutenberg_docs.jsonl.gz"}
CORPUS_DIR = ROOT.parent / "shared" / "data" / "corpus"


def sentences(limit: int, corpora: list[str]) -> list[str]:
    """Sentences of the corpora in turn, each in document order, until `limit` or all are read; shuffled."""
    from corpus.splitter import split_sentences

    out: list[str] = []
    for name in corpora:
        with gzip.open(CORPUS_DIR / CORPORA[name], "rt", encoding="utf-8") as f:
            for line in f:
                for para in json.loads(line)["paragraphs"]:
                    out.extend(s for s in split_sentences(para) if len(s.split()) >= 4)
                if len(out) >= limit:
                    break
        if len(out) >= limit:
            break
    order = np.random.default_rng(0).permutation(len(out))
    return [out[i] for i in order]


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def quality_tfidf(texts: list[str]):
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"(?u)\b\w+\b").fit_transform(texts)


def mean_pair_cosine(X, labels: np.ndarray) -> float:
    """Mean cosine over every within-cluster pair: per cluster, (|sum of unit rows|^2 - size) / 2 pairs' worth."""
    from scipy import sparse

    k = int(labels.max()) + 1
    member = sparse.csr_matrix((np.ones(len(labels)), (labels, np.arange(len(labels)))), shape=(k, len(labels)))
    sums = member @ X
    sq = np.asarray(sums.multiply(sums).sum(axis=1)).ravel()
    counts = np.bincount(labels, minlength=k)
    return float((sq - counts).sum() / 2 / (counts * (counts - 1) / 2).sum())


def timed(texts, size, levels):
    from sentsim.harvest.clusters import balanced_clusters

    # peak RSS of this process during the clustering alone: Linux resets VmHWM to the current RSS on "5"
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kib("VmRSS")
    t0 = time.perf_counter()
    labels = balanced_clusters(texts, size, seed=0, progress=None, levels=levels)
    seconds = time.perf_counter() - t0
    return seconds, labels, (_status_kib("VmHWM") - base) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5000,20000,90000")
    ap.add_argument("--ks", default="32,256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--single-above", type=int, default=20_000)
    ap.add_argument("--flat-max-nk", type=float, default=4e8)
    ap.add_argument("--corpora", default="enwiki", help="comma-separated, read in turn: enwiki, gutenberg")
    ap.add_argument("--name", default="cluster_scale", help="results file name, without .json/.md")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    sizes, ks = [int(x) for x in a.sizes.split(",")], [int(x) for x in a.ks.split(",")]
    corpora = a.corpora.split(",")
    pool = sentences(3 * max(sizes), corpora)
    if len(pool) < max(sizes):
        raise SystemExit(f"only {len(pool):,} sentences in {a.corpora}")
    print(f"{len(pool):,} sentences read", flush=True)
    rows = []
    for n in sizes:
        texts = pool[:n]
        Xq = None
        for size in ks:
            k = -(-n // size)
            flat_on = n * k <= a.flat_max_nk
            reps = 1 if n > a.single_above else a.repeats
            flat_s, two_s, ratios, flat_l, two_l, flat_gib, two_gib = [], [], [], None, None, [], []
            for _ in range(reps):
                s2, two_l, g2 = timed(texts, size, 2)
                two_s.append(s2)
                two_gib.append(g2)
                print(f"n={n:,} K={size} two-level {s2:.1f} s, peak +{g2:.2f} GiB", flush=True)
                if flat_on:
                    s1, flat_l, g1 = timed(texts, size, 1)
                    flat_s.append(s1)
                    flat_gib.append(g1)
                    ratios.append(s1 / s2)
                    print(f"n={n:,} K={size} flat {s1:.1f} s, peak +{g1:.2f} GiB", flush=True)
            if Xq is None:
                Xq = quality_tfidf(texts)
            rnd = np.random.default_rng(0).permutation(n) // size
            row = {"n": n, "K": size, "clusters": k, "repeats": reps,
                   "flat_s": statistics.median(flat_s) if flat_s else None,
                   "two_level_s": statistics.median(two_s),
                   "flat_over_two_level": statistics.median(ratios) if ratios else None,
                   "flat_peak_gib": max(flat_gib) if flat_gib else None, "two_level_peak_gib": max(two_gib),
                   "flat_cos": mean_pair_cosine(Xq, flat_l) if flat_on else None,
                   "two_level_cos": mean_pair_cosine(Xq, two_l),
                   "random_cos": mean_pair_cosine(Xq, rnd),
                   "same_pairs_share": None}
            if flat_on:  # share of the two-level run's pairs that the flat run labels too
                same = np.bincount(flat_l * k + two_l, minlength=k * k)
                row["same_pairs_share"] = float((same * (same - 1) / 2).sum() /
                                                (np.bincount(two_l) * (np.bincount(two_l) - 1) / 2).sum())
            rows.append(row)
            print(json.dumps(row), flush=True)
            write(a, rows, corpora)


def write(a, rows: list[dict], corpora: list[str]) -> None:
    """The results so far (written after each row, so that a long run stopped part way keeps what it measured)."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = ", ".join(CORPORA[c] for c in corpora)
    result = {"machine": machine(), "corpus": names, "args": vars(a), "rows": rows}
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = ["# Flat against two-level anchor clustering (bench/cluster_scale.py)", "",
             f"Machine: {result['machine']}.", f"Corpus: {names}, sentences shuffled with seed 0; seed 0.", "",
             "| n | K | clusters | runs | flat s | two-level s | flat / two-level | flat peak GiB | two-level peak GiB "
             "| cos flat | cos two-level | cos random | flat's pairs kept |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['K']} | {r['clusters']:,} | {r['repeats']} | {f(r['flat_s'], '.1f')} "
                     f"| {r['two_level_s']:.1f} | {f(r['flat_over_two_level'], '.1f')} "
                     f"| {f(r.get('flat_peak_gib'), '.2f')} | {f(r.get('two_level_peak_gib'), '.2f')} "
                     f"| {f(r['flat_cos'], '.4f')} "
                     f"| {r['two_level_cos']:.4f} | {r['random_cos']:.4f} | {f(r['same_pairs_share'], '.2f')} |")
    lines += ["", "Times: median of the runs (ratio: median of each run's own ratio). cos: mean TF-IDF cosine over "
              "every within-cluster pair. flat's pairs kept: the share of the two-level run's pairs that the flat "
              "run labels too. peak GiB: growth of this process's peak RSS during the clustering alone, over its RSS "
              "when it started. -: flat not run (n x clusters above --flat-max-nk). Other jobs shared the 2 cores "
              "(see the load average): single runs can be off by 2x."]
    (out / f"{a.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
