"""Embedded TF-IDF n-gram retrieval (scikit-learn tokenisation, scipy sparse products).

Index layout (no pickle anywhere):
    index.json                 manifest: config, corpus fingerprint, shard list, counts
    vocab.json                 the n-gram vocabulary as a JSON list (term i is column i)
    idf.npy                    float32 [V] inverse document frequencies (allow_pickle=False)
    shard-NNNNN/matrix.npz     float32 CSR [V, n_chunks_in_shard]: the transposed, L2-normalised
                               TF-IDF chunk vectors (scipy.sparse.save_npz)
    shard-NNNNN/chunk_ids.npy  int64 [n_chunks_in_shard], ascending

Weights: tf (1 + log tf when sublinear) x smooth idf ln((1+N)/(1+df)) + 1, L2-normalised
rows, for chunks and queries alike, so a score is the cosine between the two vectors.
Search: per shard, Q[n, V] @ M[V, c] is a sparse product, then an exact top-k per row with
argpartition (ties broken by chunk id); shard results are merged the same way, so any number
of shards returns what one shard returns.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.preprocessing import normalize

from sentsim.config import fingerprint
from sentsim.errors import UsageError
from sentsim.retrieval.base import (
    INDEX_MANIFEST, Hits, IndexConfig, Retriever, check_fingerprint, check_queries, merge_topk,
    read_index_manifest, topk_sparse_rows,
)
from sentsim.retrieval.corpus_view import ChunkTable, SentenceTable, chunk_texts, corpus_fingerprint

FORMAT = "sentsim-tfidf-v1"
# Entries of the [queries x chunks] product held at once; bounds memory for frequent bigrams.
PRODUCT_BUDGET = 16_000_000


def _ngram_range(cfg: IndexConfig) -> tuple[int, int]:
    return (2, 2) if cfg.ngrams == "bigram" else (1, 2)


def _vectorizer(cfg: IndexConfig, vocabulary=None) -> CountVectorizer:
    return CountVectorizer(
        ngram_range=_ngram_range(cfg), lowercase=cfg.lowercase, token_pattern=cfg.token_pattern,
        min_df=1 if vocabulary is not None else cfg.min_df,
        max_df=1.0 if vocabulary is not None else cfg.max_df,
        max_features=None if vocabulary is not None else cfg.max_features,
        vocabulary=vocabulary, dtype=np.float32,
    )


def _weight(X: sp.csr_matrix, idf: np.ndarray, sublinear: bool) -> sp.csr_matrix:
    X = X.tocsr().astype(np.float32)
    if sublinear:
        np.log(X.data, out=X.data)
        X.data += 1.0
    X = X @ sp.diags(idf.astype(np.float32))
    return normalize(X, norm="l2", copy=False).astype(np.float32).tocsr()


def build_sklearn_index(corpus: str | Path, out: str | Path, cfg: IndexConfig) -> dict:
    t0 = time.perf_counter()
    corpus_fp = corpus_fingerprint(corpus)
    chunks = ChunkTable.load(corpus)
    if len(chunks) == 0:
        raise UsageError(f"{corpus}: the corpus has no chunks to index")
    sentences = SentenceTable.load(corpus)
    texts = chunk_texts(chunks, sentences)
    del sentences
    vec = _vectorizer(cfg)
    try:
        counts = vec.fit_transform(texts)
    except ValueError as exc:  # "empty vocabulary" and min_df/max_df conflicts
        raise UsageError(f"{corpus}: cannot build a {cfg.ngrams} vocabulary: {exc}") from None
    del texts
    n_docs = counts.shape[0]
    df = np.bincount(counts.tocsr().indices, minlength=counts.shape[1])
    idf = (np.log((1.0 + n_docs) / (1.0 + df)) + 1.0).astype(np.float32)
    X = _weight(counts, idf, cfg.sublinear_tf)
    del counts
    vocab = vec.get_feature_names_out().tolist()

    out = Path(out)
    if out.exists():
        if (out / INDEX_MANIFEST).is_file():
            for p in out.glob("shard-*"):
                shutil.rmtree(p)
        elif any(out.iterdir()):
            raise UsageError(f"{out}: exists, is not empty and is not an index directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    np.save(out / "idf.npy", idf, allow_pickle=False)

    n_shards = min(cfg.n_shards, len(chunks))
    bounds = np.linspace(0, len(chunks), n_shards + 1).astype(np.int64)
    shards = []
    for s in range(n_shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        d = out / f"shard-{s:05d}"
        d.mkdir()
        MT = X[lo:hi].T.tocsr()
        MT.sort_indices()
        sp.save_npz(d / "matrix.npz", MT, compressed=False)
        np.save(d / "chunk_ids.npy", chunks.chunk_ids[lo:hi], allow_pickle=False)
        shards.append({"path": d.name, "n_chunks": hi - lo, "first_chunk_id": int(chunks.chunk_ids[lo]),
                       "last_chunk_id": int(chunks.chunk_ids[hi - 1]), "nnz": int(MT.nnz)})
    manifest = {
        "format": FORMAT,
        "backend": "sklearn",
        "config": cfg.model_dump(),
        "corpus": str(corpus),
        "corpus_fingerprint": corpus_fp,
        "fingerprint": fingerprint(cfg.model_dump(), corpus_fp),
        "n_chunks": int(len(chunks)),
        "vocab_size": len(vocab),
        "shards": shards,
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    (out / INDEX_MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    manifest["size_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return manifest


class QueryEncoder:
    """Turns query strings into L2-normalised TF-IDF rows in the index's vocabulary."""

    def __init__(self, index_dir: str | Path, manifest: dict):
        index_dir = Path(index_dir)
        self.cfg = IndexConfig.model_validate(manifest["config"])
        vocab = json.loads((index_dir / "vocab.json").read_text(encoding="utf-8"))
        self.idf = np.load(index_dir / "idf.npy", allow_pickle=False)
        if len(vocab) != len(self.idf):
            raise UsageError(f"{index_dir}: vocab.json and idf.npy disagree; the index is damaged")
        self.vec = _vectorizer(self.cfg, vocabulary={t: i for i, t in enumerate(vocab)})

    def encode(self, queries: list[str]) -> sp.csr_matrix:
        if not queries:
            return sp.csr_matrix((0, len(self.idf)), dtype=np.float32)
        return _weight(self.vec.transform(queries), self.idf, self.cfg.sublinear_tf)


class ShardSearcher:
    """One loaded shard (or several): exact per-shard top-k for encoded queries."""

    def __init__(self, index_dir: str | Path, shard_names: Sequence[str]):
        index_dir = Path(index_dir)
        self.mats = []
        for name in shard_names:
            d = index_dir / name
            MT = sp.load_npz(d / "matrix.npz").tocsr()
            ids = np.load(d / "chunk_ids.npy", allow_pickle=False)
            self.mats.append((MT, ids))

    def topk(self, Q: sp.csr_matrix, k: int) -> Hits:
        parts = []
        for MT, ids in self.mats:
            n_cols = max(MT.shape[1], 1)
            step = max(1, PRODUCT_BUDGET // n_cols)
            batches = [topk_sparse_rows(Q[lo:lo + step] @ MT, k, ids) for lo in range(0, Q.shape[0], step)]
            parts.append(_concat_rows(batches))
        return merge_topk(parts, k)


def _concat_rows(batches: list[Hits]) -> Hits:
    if len(batches) == 1:
        return batches[0]
    offs = np.cumsum([0] + [len(b.ids) for b in batches[:-1]])
    indptr = np.concatenate([[0]] + [b.indptr[1:] + o for b, o in zip(batches, offs)])
    return Hits(indptr, np.concatenate([b.ids for b in batches]), np.concatenate([b.scores for b in batches]))


class SklearnRetriever(Retriever):
    """All shards of an index loaded in this process (tests, CLI, one actor holding everything)."""

    def __init__(self, index_dir: str | Path, manifest: dict | None = None):
        self.index_dir = Path(index_dir)
        self.manifest = manifest or read_index_manifest(index_dir)
        self.corpus_fingerprint = self.manifest["corpus_fingerprint"]
        self.encoder = QueryEncoder(index_dir, self.manifest)
        self.searcher = ShardSearcher(index_dir, [s["path"] for s in self.manifest["shards"]])

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = check_queries(queries, k)
        if not queries:
            return np.empty((0, k), np.int64), np.empty((0, k), np.float32)
        return self.searcher.topk(self.encoder.encode(queries), int(k)).to_padded(int(k))


class RayShardedRetriever(Retriever):
    """Shards spread over Ray actors, each loading its shards once; the driver encodes the
    queries once, every actor returns its exact top-k, and the driver merges them."""

    def __init__(self, index_dir: str | Path, num_actors: int | None = None, num_cpus: float = 0.5,
                 manifest: dict | None = None):
        import ray

        self.index_dir = Path(index_dir).resolve()
        self.manifest = manifest or read_index_manifest(index_dir)
        self.corpus_fingerprint = self.manifest["corpus_fingerprint"]
        self.encoder = QueryEncoder(index_dir, self.manifest)
        names = [s["path"] for s in self.manifest["shards"]]
        num_actors = min(num_actors or len(names), len(names))
        groups = [names[i::num_actors] for i in range(num_actors)]
        actor_cls = ray.remote(num_cpus=num_cpus)(_ShardActor)
        self.actors = [actor_cls.remote(str(self.index_dir), g) for g in groups]

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        import ray

        queries = check_queries(queries, k)
        if not queries:
            return np.empty((0, k), np.int64), np.empty((0, k), np.float32)
        Q = self.encoder.encode(queries)
        ref = ray.put(Q)
        parts = ray.get([a.topk.remote(ref, int(k)) for a in self.actors])
        return merge_topk(parts, int(k)).to_padded(int(k))

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


class _ShardActor:
    def __init__(self, index_dir: str, shard_names: list[str]):
        self.searcher = ShardSearcher(index_dir, shard_names)

    def topk(self, Q, k: int):
        return self.searcher.topk(Q, k)


def open_sklearn(index_dir, manifest, ray_actors: int | None = None, num_cpus: float = 0.5) -> Retriever:
    if manifest.get("format") != FORMAT:
        raise UsageError(f"{index_dir}: unknown index format {manifest.get('format')!r}")
    if ray_actors:
        return RayShardedRetriever(index_dir, ray_actors, num_cpus, manifest)
    return SklearnRetriever(index_dir, manifest)


__all__ = ["build_sklearn_index", "SklearnRetriever", "RayShardedRetriever", "open_sklearn", "check_fingerprint"]
