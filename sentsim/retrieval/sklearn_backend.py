"""Embedded TF-IDF n-gram retrieval (scikit-learn tokenisation, scipy sparse products).

Index layout (no pickle anywhere), local or s3://, committed as index_store.py describes:
    index.json                         manifest: config, corpus fingerprint, shard list, counts, files
    build-<id>/vocab.json              the n-gram vocabulary as a JSON list (term i is column i)
    build-<id>/idf.npy                 float32 [V] inverse document frequencies (allow_pickle=False)
    build-<id>/shard-NNNNN/matrix.npz  float32 CSR [V, n_chunks_in_shard]: the transposed chunk weight
                                       vectors (scipy.sparse.save_npz)
    build-<id>/shard-NNNNN/chunk_ids.npy  int64 [n_chunks_in_shard], ascending
Indexes from before build folders keep vocab.json, idf.npy and shard-NNNNN/ at the top; index.json
says where each file is ("vocab", "idf", each shard's "path"), so both layouts read the same way.

A score is always Q[n, V] @ M[V, c]; `similarity` (IndexConfig) decides the weights:
  * "tfidf" (default): tf (1 + log tf when sublinear) x smooth idf ln((1+N)/(1+df)) + 1,
    L2-normalised, for chunks and queries alike, so a score is the cosine of the two vectors.
  * "classic": Lucene's ClassicSimilarity as Lucene 9/10 computes it, so the lucene backend
    returns the same scores (to float32 rounding): sum over query terms t of
    qtf(t) * sqrt(tf(t, d)) * idf(t) / sqrt(len(d)), idf(t) = ln((1+D)/(1+df)) + 1. D counts the
    chunks that have at least one term, len(d) is the chunk's token count as Lucene's norm stores
    it (SmallFloat.intToByte4: exact below 24, then 4 significant bits), idf appears once (Lucene 7
    dropped the query norm and the second idf) and query terms are not normalised.
  * "bm25": Lucene's BM25Similarity: sum of qtf(t) * idf(t) * tf / (tf + k1 (1 - b + b len(d)/avgdl)),
    idf(t) = ln(1 + (D - df + 0.5)/(df + 0.5)), avgdl = total tokens / D (exact lengths).
Chunk lengths always count every token, also those that min_df/max_df/max_features drop from the
vocabulary (as Lucene, which indexes them all).

Why "tfidf" and "classic" still rank a little differently: tfidf dampens tf with 1 + log tf
where classic uses sqrt(tf), tfidf weights the query by idf as well (idf^2 per matched term,
classic idf^1), and tfidf divides by the L2 norm of the whole weighted chunk vector where classic
divides by sqrt(token count), quantised; both use the same smooth idf.

Search: per shard, Q @ M is a sparse product, then an exact top-k per row with argpartition
(ties broken by chunk id); shard results are merged the same way, so any number of shards
returns what one shard returns.

Build: `workers=1` runs in this process (one CountVectorizer over every chunk). `workers=N`
(N >= 2) runs Ray tasks: N counting tasks, one per slice of the chunks, each tokenising its slice
with an unpruned vocabulary; the driver merges their vocabularies and document frequencies and
prunes them exactly as CountVectorizer does (min_df, max_df, then max_features by total count,
the same argsort); then one task per index shard re-maps its slices' counts to the global
columns, weights them and writes the shard. The result is the same vocab.json and idf.npy as the
single-process build, and the same matrices up to float rounding.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.preprocessing import normalize

from corpus.view import ChunkTable, SentenceTable, chunk_texts
from sentsim.errors import UsageError
from sentsim.identity import corpus_fingerprint, fingerprint
from sentsim.retrieval.base import (
    Hits,
    IndexConfig,
    Retriever,
    check_fingerprint,
    check_queries,
    merge_topk,
    read_index_manifest,
    topk_sparse_rows,
)
from sentsim.retrieval.index_store import IndexWriter, load_npy, load_npz, npy_bytes, npz_bytes, read_bytes
from storage import fs as sfs

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


def lucene_length(lengths: np.ndarray) -> np.ndarray:
    """A document's token count as Lucene's norms store it (SmallFloat.intToByte4, then back):
    exact below 24, above that 24 + (n - 24) truncated to its 4 most significant bits."""
    n = np.asarray(lengths, dtype=np.int64)
    v = np.maximum(n - 24, 0)
    shift = np.maximum(np.frexp(v.astype(np.float64))[1] - 4, 0).astype(np.int64)
    return np.where(n < 24, n, 24 + ((v >> shift) << shift))


class DocStats:
    """Collection statistics Lucene scores with: D = chunks with at least one term, and the
    average token count over them."""

    def __init__(self, lengths: np.ndarray):
        lengths = np.asarray(lengths, dtype=np.int64)
        self.n_docs = int(len(lengths))
        self.doc_count = int((lengths > 0).sum())
        self.avgdl = float(lengths.sum() / self.doc_count) if self.doc_count else 0.0


def _idf(df: np.ndarray, stats: DocStats, cfg: IndexConfig) -> np.ndarray:
    df = df.astype(np.float64)
    if cfg.scoring == "tfidf":
        idf = np.log((1.0 + stats.n_docs) / (1.0 + df)) + 1.0
    elif cfg.scoring == "classic":
        idf = np.log((1.0 + stats.doc_count) / (1.0 + df)) + 1.0
    else:
        idf = np.log(1.0 + (stats.doc_count - df + 0.5) / (df + 0.5))
    return idf.astype(np.float32)


def _doc_weights(counts, lengths: np.ndarray, idf: np.ndarray, cfg: IndexConfig, avgdl: float) -> sp.csr_matrix:
    """Chunk rows [n, V] of raw counts -> the weights stored in the index."""
    if cfg.scoring == "tfidf":
        return _weight(counts, idf, cfg.sublinear_tf)
    X = sp.csr_matrix(counts, dtype=np.float64, copy=True)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    L = lucene_length(lengths).astype(np.float64)[rows]
    tf, w = X.data, idf.astype(np.float64)[X.indices]
    if cfg.scoring == "classic":
        X.data = np.sqrt(tf) * w / np.sqrt(L)
    else:
        k1, b = cfg.bm25_k1, cfg.bm25_b
        X.data = w * tf / (tf + k1 * (1.0 - b + b * L / avgdl))
    return X.astype(np.float32).tocsr()


def _write_shard(out: str, build: str, s: int, X: sp.csr_matrix, chunk_ids: np.ndarray) -> dict:
    """Write shard s into the build folder `build` of the index at `out` (in a Ray task or here); its
    entry for index.json, with the sizes of the files written under "_files"."""
    fs, root = sfs.resolve(out)
    d = f"{build}/shard-{s:05d}"
    MT = X.T.tocsr()
    MT.sort_indices()
    files = {}
    for name, blob in (("matrix.npz", npz_bytes(MT)), ("chunk_ids.npy", npy_bytes(chunk_ids))):
        sfs.write_bytes_atomic(fs, sfs.join(root, d, name), blob)
        files[f"{d}/{name}"] = len(blob)
    return {"path": d, "n_chunks": int(len(chunk_ids)), "first_chunk_id": int(chunk_ids[0]),
            "last_chunk_id": int(chunk_ids[-1]), "nnz": int(MT.nnz), "_files": files}


def _shard_bounds(n_chunks: int, n_shards: int) -> np.ndarray:
    return np.linspace(0, n_chunks, min(n_shards, n_chunks) + 1).astype(np.int64)


def build_sklearn_index(corpus: str | Path, out: str | Path, cfg: IndexConfig, workers: int = 1,
                        num_cpus: float = 1.0) -> dict:
    """Build the index in this process (`workers=1`) or with `workers` Ray tasks (see the module
    docstring); Ray must be initialised by the caller for workers >= 2."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise UsageError(f"workers must be a positive integer (got {workers!r})")
    t0 = time.perf_counter()
    corpus_fp = corpus_fingerprint(corpus)
    chunks = ChunkTable.load(corpus)
    if len(chunks) == 0:
        raise UsageError(f"{corpus}: the corpus has no chunks to index")
    sentences = SentenceTable.load(corpus)
    texts = chunk_texts(chunks, sentences)
    del sentences
    bounds = _shard_bounds(len(chunks), cfg.n_shards)
    with IndexWriter(out) as writer:
        if workers == 1:
            vocab, idf, stats, shards = _build_inline(corpus, writer, cfg, texts, chunks, bounds)
        else:
            vocab, idf, stats, shards = _build_ray(corpus, writer, cfg, texts, chunks, bounds, int(workers),
                                                   num_cpus)
        for shard in shards:
            writer.files.update(shard.pop("_files"))
        manifest = _manifest(cfg, corpus, corpus_fp, chunks, vocab, stats, shards, workers, writer, t0)
        manifest = writer.commit(manifest)
    manifest["size_bytes"] = sum(manifest["files"].values())
    return manifest


def _manifest(cfg: IndexConfig, corpus, corpus_fp: str, chunks: ChunkTable, vocab: list, stats, shards: list,
              workers: int, writer: IndexWriter, t0: float) -> dict:
    manifest = {
        "format": FORMAT,
        "backend": "sklearn",
        "config": cfg.model_dump(),
        "corpus": str(corpus),
        "corpus_fingerprint": corpus_fp,
        "fingerprint": fingerprint(cfg.semantic(), corpus_fp),
        "n_chunks": int(len(chunks)),
        "vocab_size": len(vocab),
        "vocab": f"{writer.build}/vocab.json",
        "idf": f"{writer.build}/idf.npy",
        "similarity": cfg.scoring,
        "shards": shards,
        "build_workers": int(workers),
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    if cfg.scoring != "tfidf":  # the collection statistics baked into the weights
        manifest.update(doc_count=stats.doc_count, avgdl=stats.avgdl)
    return manifest


def _write_vocab(writer: IndexWriter, vocab: list, idf: np.ndarray) -> None:
    writer.put("vocab.json", json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    writer.put("idf.npy", npy_bytes(idf))


def _build_inline(corpus, writer: IndexWriter, cfg: IndexConfig, texts: list[str], chunks: ChunkTable,
                  bounds: np.ndarray):
    vec = _vectorizer(cfg)
    try:
        counts = vec.fit_transform(texts)
    except ValueError as exc:  # "empty vocabulary" and min_df/max_df conflicts
        raise UsageError(f"{corpus}: cannot build a {cfg.ngrams} vocabulary: {exc}") from None
    counts = sp.csr_matrix(counts)
    pruned = cfg.min_df != 1 or cfg.max_df != 1.0 or cfg.max_features is not None
    if cfg.scoring == "tfidf":
        lengths = np.zeros(len(texts), np.int64)  # unused by tfidf
    elif not pruned:
        lengths = np.asarray(counts.sum(axis=1)).ravel().astype(np.int64)
    else:  # pruned counts miss the dropped terms; count every token again
        analyze = vec.build_analyzer()
        lengths = np.array([len(analyze(t)) for t in texts], dtype=np.int64)
    del texts
    stats = DocStats(lengths)
    df = np.bincount(counts.indices, minlength=counts.shape[1])
    idf = _idf(df, stats, cfg)
    X = _doc_weights(counts, lengths, idf, cfg, stats.avgdl)
    del counts
    vocab = vec.get_feature_names_out().tolist()
    _write_vocab(writer, vocab, idf)
    shards = []
    for s in range(len(bounds) - 1):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        shards.append(_write_shard(writer.uri, writer.build, s, X[lo:hi], chunks.chunk_ids[lo:hi]))
    return vocab, idf, stats, shards


# ---- the parallel build: count slices, merge vocabularies on the driver, write shards ----------

def _count_slice(texts: list[str], cfg: IndexConfig):
    """Unpruned counts of one slice of chunks: (terms sorted, df, total counts, lengths), counts CSR."""
    vec = CountVectorizer(ngram_range=_ngram_range(cfg), lowercase=cfg.lowercase,
                          token_pattern=cfg.token_pattern, dtype=np.float32)
    try:
        counts = sp.csr_matrix(vec.fit_transform(texts))
    except ValueError:  # no term in the whole slice
        counts = sp.csr_matrix((len(texts), 0), dtype=np.float32)
        terms = np.empty(0, dtype=object)
    else:
        terms = vec.get_feature_names_out().astype(object)
    df = np.bincount(counts.indices, minlength=counts.shape[1]).astype(np.int64)
    tf = np.bincount(counts.indices, weights=counts.data, minlength=counts.shape[1]).astype(np.int64)
    lengths = np.asarray(counts.sum(axis=1)).ravel().astype(np.int64)
    return (terms, df, tf, lengths), counts


def _merge_vocab(corpus, parts: list[tuple], n_docs: int, cfg: IndexConfig):
    """The global vocabulary and df, pruned as CountVectorizer.fit prunes, and for every slice
    the global column of each of its terms (-1: pruned)."""
    all_terms = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, object)
    if len(all_terms) == 0:
        raise UsageError(f"{corpus}: cannot build a {cfg.ngrams} vocabulary: "
                         "empty vocabulary; perhaps the documents only contain stop words")
    terms, inverse = np.unique(all_terms, return_inverse=True)  # object array: Python's str order
    inverse = inverse.ravel()
    df = np.bincount(inverse, weights=np.concatenate([p[1] for p in parts]), minlength=len(terms)).astype(np.int64)
    tf = np.bincount(inverse, weights=np.concatenate([p[2] for p in parts]), minlength=len(terms)).astype(np.int64)
    max_doc_count = cfg.max_df * n_docs
    if max_doc_count < cfg.min_df:
        raise UsageError(f"{corpus}: cannot build a {cfg.ngrams} vocabulary: "
                         "max_df corresponds to < documents than min_df")
    mask = (df <= max_doc_count) & (df >= cfg.min_df)
    if cfg.max_features is not None and mask.sum() > cfg.max_features:
        tfs = tf.astype(np.float32)  # CountVectorizer sums its float32 count matrix
        mask_inds = (-tfs[mask]).argsort()[:cfg.max_features]
        new_mask = np.zeros(len(df), dtype=bool)
        new_mask[np.where(mask)[0][mask_inds]] = True
        mask = new_mask
    if not mask.any():
        raise UsageError(f"{corpus}: cannot build a {cfg.ngrams} vocabulary: "
                         "After pruning, no terms remain. Try a lower min_df or a higher max_df.")
    new_col = np.where(mask, np.cumsum(mask) - 1, -1)
    colmaps, off = [], 0
    for p in parts:
        colmaps.append(new_col[inverse[off:off + len(p[0])]].astype(np.int64))
        off += len(p[0])
    return terms[mask].tolist(), df[mask], colmaps


def _remap(counts: sp.csr_matrix, colmap: np.ndarray, n_cols: int) -> sp.csr_matrix:
    """A slice's counts in its own columns -> the global (pruned) columns."""
    cols = colmap[counts.indices]
    keep = cols >= 0
    rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
    X = sp.csr_matrix((counts.data[keep], (rows[keep], cols[keep])), shape=(counts.shape[0], n_cols),
                      dtype=np.float32)
    X.sort_indices()
    return X


def _shard_task(out: str, build: str, s: int, pieces: list, idf: np.ndarray, cfg_dict: dict, avgdl: float,
                chunk_ids: np.ndarray) -> dict:
    """Write shard s from its slices, in row order: pieces are (counts ref, colmap, lengths)."""
    import ray

    cfg = IndexConfig.model_validate(cfg_dict)
    mats, lens = [], []
    for ref, colmap, lengths in pieces:
        mats.append(_remap(ray.get(ref), colmap, len(idf)))
        lens.append(lengths)
    X = _doc_weights(sp.vstack(mats, format="csr"), np.concatenate(lens), idf, cfg, avgdl)
    return _write_shard(out, build, s, X, chunk_ids)


def _count_task(texts: list[str], cfg_dict: dict):
    return _count_slice(texts, IndexConfig.model_validate(cfg_dict))


def _build_ray(corpus, writer: IndexWriter, cfg: IndexConfig, texts: list[str], chunks: ChunkTable, bounds: np.ndarray,
               workers: int, num_cpus: float):
    import ray

    if not ray.is_initialized():
        raise UsageError("a parallel index build (workers >= 2) needs Ray; call sentsim.runtime.init_ray first")
    n = len(texts)
    # slices: the workers' equal splits, cut further at shard boundaries so no slice spans two shards
    cuts = np.unique(np.concatenate([np.linspace(0, n, min(workers, n) + 1).astype(np.int64), bounds]))
    cfg_dict = cfg.model_dump()
    count = ray.remote(num_cpus=num_cpus, num_returns=2, max_retries=2)(_count_task)
    refs = [count.remote(texts[int(lo):int(hi)], cfg_dict) for lo, hi in zip(cuts[:-1], cuts[1:])]
    del texts
    parts = ray.get([r[0] for r in refs])
    lengths = np.concatenate([p[3] for p in parts])
    stats = DocStats(lengths)
    vocab, df, colmaps = _merge_vocab(corpus, parts, n, cfg)
    idf = _idf(df, stats, cfg)
    _write_vocab(writer, vocab, idf)
    idf_ref = ray.put(idf)
    write = ray.remote(num_cpus=num_cpus, max_retries=2)(_shard_task)
    tasks = []
    for s in range(len(bounds) - 1):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        pieces = [(refs[i][1], colmaps[i], parts[i][3])
                  for i in range(len(cuts) - 1) if cuts[i] >= lo and cuts[i + 1] <= hi]
        tasks.append(write.remote(writer.uri if "://" in writer.uri else str(Path(writer.uri).resolve()),
                                  writer.build, s, pieces, idf_ref, cfg_dict, stats.avgdl,
                                  chunks.chunk_ids[lo:hi]))
    shards = ray.get(tasks)
    return vocab, idf, stats, shards


class QueryEncoder:
    """Turns query strings into L2-normalised TF-IDF rows in the index's vocabulary."""

    def __init__(self, index_dir: str | Path, manifest: dict):
        self.cfg = IndexConfig.model_validate(manifest["config"])
        vocab = json.loads(read_bytes(index_dir, manifest.get("vocab", "vocab.json")).decode("utf-8"))
        self.idf = load_npy(index_dir, manifest.get("idf", "idf.npy"))
        if len(vocab) != len(self.idf):
            raise UsageError(f"{index_dir}: vocab.json and idf.npy disagree; the index is damaged")
        self.vec = _vectorizer(self.cfg, vocabulary={t: i for i, t in enumerate(vocab)})

    def encode(self, queries: list[str]) -> sp.csr_matrix:
        if not queries:
            return sp.csr_matrix((0, len(self.idf)), dtype=np.float32)
        counts = self.vec.transform(queries)
        if self.cfg.scoring == "tfidf":
            return _weight(counts, self.idf, self.cfg.sublinear_tf)
        return sp.csr_matrix(counts, dtype=np.float32)  # Lucene: each query term boosted by its count


class ShardSearcher:
    """One loaded shard (or several): exact per-shard top-k for encoded queries."""

    def __init__(self, index_dir: str | Path, shard_names: Sequence[str]):
        self.mats = []
        for name in shard_names:
            MT = load_npz(index_dir, f"{name}/matrix.npz").tocsr()
            ids = load_npy(index_dir, f"{name}/chunk_ids.npy")
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
        self.index_dir = index_dir
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

        self.index_dir = str(index_dir) if "://" in str(index_dir) else str(Path(index_dir).resolve())
        self.manifest = manifest or read_index_manifest(index_dir)
        self.corpus_fingerprint = self.manifest["corpus_fingerprint"]
        self.encoder = QueryEncoder(index_dir, self.manifest)
        names = [s["path"] for s in self.manifest["shards"]]
        num_actors = min(num_actors or len(names), len(names))
        groups = [names[i::num_actors] for i in range(num_actors)]
        actor_cls = ray.remote(num_cpus=num_cpus)(_ShardActor)
        self.actors = [actor_cls.remote(self.index_dir, g) for g in groups]

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
