"""The retrieval interface shared by every backend, and the top-k helpers they use."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence

import numpy as np
from pydantic import Field, model_validator

from sentsim.config import Section
from sentsim.errors import UsageError
from sentsim.retrieval.index_store import INDEX_MANIFEST, read_index_manifest  # noqa: F401  (re-exported)

PAD_ID = -1
PAD_SCORE = 0.0


class IndexConfig(Section):
    """`sentsim index build` settings."""

    backend: Literal["sklearn", "lucene"] = "sklearn"
    # Paper 003 §3.3: "TF-IDF weighted bag-of-word bi-gram vectors", read here as bigrams alone; the retriever it
    # cites (Chen et al. 2017) hashes unigrams and bigrams, which `unigram+bigram` is. Bigrams alone find nothing
    # for a short sentence that shares only single words with the corpus (a shortfall, counted).
    ngrams: Literal["bigram", "unigram+bigram"] = "bigram"
    # Shards are searched independently (one per Ray actor) and their top-k merged. The sklearn backend's, as are
    # min_df, max_df, max_features and sublinear_tf: a lucene build refuses them (it indexes every term, in one index).
    n_shards: int = Field(1, ge=1, le=4096)
    # 1 keeps bigrams seen once: a query taken from the corpus then still finds its own chunk.
    min_df: int = Field(1, ge=1)
    # No paper fixes it (003 §3.3 names TF-IDF bigram vectors, no pruning): 1.0 keeps every bigram however
    # common, as scikit-learn's default does; IDF already weighs a common bigram down.
    max_df: float = Field(1.0, gt=0.0, le=1.0)
    max_features: Optional[int] = Field(None, ge=1)
    sublinear_tf: bool = True
    lowercase: bool = True
    # Word tokens of one or more word characters (keeps "I", "a", digits).
    token_pattern: str = r"(?u)\b\w+\b"
    # How a chunk is scored for a query. None is the backend's default: "tfidf" for sklearn (cosine of
    # L2-normalised tf-idf vectors, the paper's "TF-IDF weighted" vectors), "bm25" for lucene.
    # "classic" is Lucene's ClassicSimilarity and "bm25" Lucene's BM25Similarity; both backends
    # compute those two the same way, so they return the same hits. Stored in the index manifest;
    # the sklearn backend bakes it into the index, the lucene backend applies it at search time
    # (LuceneRetriever(similarity=...) can override it without a rebuild).
    similarity: Optional[Literal["tfidf", "classic", "bm25"]] = None
    bm25_k1: float = Field(0.9, gt=0.0)  # Anserini's defaults
    bm25_b: float = Field(0.4, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _check_similarity(self):
        if self.backend == "lucene" and self.similarity == "tfidf":
            raise ValueError("similarity: the lucene backend scores by bm25 or classic, not tfidf")
        return self

    @property
    def scoring(self) -> str:
        """The similarity in effect: the configured one, else the backend's default."""
        return self.similarity or ("tfidf" if self.backend == "sklearn" else "bm25")

    def semantic(self) -> dict:
        """The config as hashed into an index fingerprint. Keys added after v1 are left out while
        they hold their defaults, so an index rebuilt with default settings keeps its fingerprint."""
        d = self.model_dump()
        for k, default in (("similarity", None), ("bm25_k1", 0.9), ("bm25_b", 0.4)):
            if d.get(k) == default:
                d.pop(k)
        return d


class Retriever(abc.ABC):
    """`search(queries, k) -> (chunk_ids int64 [n, k], scores float32 [n, k])`.

    Rows are ordered by descending score, ties by ascending chunk id. Only chunks that share at
    least one n-gram with the query are hits; where a query has fewer than k hits (an empty or
    punctuation-only query has none) the row is padded with chunk id -1 and score 0.0.
    """

    corpus_fingerprint: str
    manifest: dict

    @abc.abstractmethod
    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        ...

    def close(self) -> None:  # pragma: no cover - backends with resources override
        pass


def check_queries(queries, k) -> list[str]:
    if isinstance(queries, str):
        raise UsageError("queries must be a list of strings, not one string")
    queries = list(queries)
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise UsageError(f"query {i} is {type(q).__name__}, not a string")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UsageError(f"k must be a positive integer (got {k!r})")
    return queries


@dataclass
class Hits:
    """Ragged top-k: row r is ids[indptr[r]:indptr[r+1]] (and scores), sorted by descending
    score, ties by ascending chunk id. Compact (no padding), so shards ship only real hits."""

    indptr: np.ndarray
    ids: np.ndarray
    scores: np.ndarray

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.indptr[r], self.indptr[r + 1]
        return self.ids[lo:hi], self.scores[lo:hi]

    def to_padded(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.n_rows
        ids = np.full((n, k), PAD_ID, dtype=np.int64)
        scores = np.full((n, k), PAD_SCORE, dtype=np.float32)
        counts = np.diff(self.indptr)
        for r in np.flatnonzero(counts):
            i, s = self.row(r)
            ids[r, :len(i)] = i
            scores[r, :len(s)] = s
        return ids, scores


def _row_topk(ids: np.ndarray, d: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of one row whose ids are ascending: ties at the k-th score go to the lower
    chunk id, so any split into shards merges back to the same answer."""
    if len(d) > k:
        part = np.argpartition(-d, k - 1)[:k]
        t = d[part].min()
        above = np.flatnonzero(d > t)
        ties = np.flatnonzero(d == t)[: k - len(above)]  # ids ascending: the lowest ids first
        sel = np.sort(np.concatenate([above, ties]))
        ids, d = ids[sel], d[sel]
    order = np.argsort(-d, kind="stable")  # stable: equal scores stay in ascending id order
    return ids[order], d[order]


def _collect(rows: list[tuple[np.ndarray, np.ndarray]]) -> Hits:
    counts = np.array([len(i) for i, _ in rows], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if len(rows) and counts.sum():
        ids = np.concatenate([i for i, _ in rows]).astype(np.int64)
        sc = np.concatenate([s for _, s in rows]).astype(np.float32)
    else:
        ids, sc = np.empty(0, np.int64), np.empty(0, np.float32)
    return Hits(indptr, ids, sc)


def topk_sparse_rows(S, k: int, col_ids: np.ndarray) -> Hits:
    """Top-k of each row of a CSR score matrix whose columns map to ascending `col_ids`;
    only positive scores are hits."""
    S = S.tocsr()
    S.sort_indices()
    indptr, indices, data = S.indptr, S.indices, S.data
    rows = []
    for r in range(S.shape[0]):
        lo, hi = indptr[r], indptr[r + 1]
        d, c = data[lo:hi], indices[lo:hi]
        keep = d > 0
        if not keep.all():
            d, c = d[keep], c[keep]
        rows.append(_row_topk(col_ids[c], d, k))
    return _collect(rows)


def merge_topk(parts: list[Hits], k: int) -> Hits:
    """Merge per-shard Hits (shards hold disjoint chunk-id ranges) into one top-k."""
    if len(parts) == 1:
        return parts[0]
    firsts = [p.ids.min() if len(p.ids) else np.iinfo(np.int64).max for p in parts]
    parts = [parts[i] for i in np.argsort(firsts, kind="stable")]
    rows = []
    for r in range(parts[0].n_rows):
        segs = [p.row(r) for p in parts]
        ids = np.concatenate([s[0] for s in segs])
        sc = np.concatenate([s[1] for s in segs])
        if len(ids) > 1 and np.any(np.diff(ids) < 0):  # keep ids ascending for the tie rule
            o = np.argsort(ids, kind="stable")
            ids, sc = ids[o], sc[o]
        rows.append(_row_topk(ids, sc, k))
    return _collect(rows)


def check_index(index_dir: str | Path, corpus: str | Path | None = None, expected: str | None = None) -> dict:
    """The index's manifest, once its files are all there and (given `corpus` or its fingerprint) it was
    built for that corpus: what a job that searches it checks before its first unit."""
    from sentsim.retrieval.index_store import check_index_files

    manifest = check_index_files(index_dir)
    check_fingerprint(manifest, f"index {index_dir}", corpus=corpus, expected=expected)
    return manifest


def check_fingerprint(manifest: dict, where: str, corpus: str | Path | None = None,
                      expected: str | None = None) -> None:
    """Refuse an index (or model) built for another corpus."""
    if corpus is not None:
        from sentsim.identity import corpus_fingerprint

        expected = corpus_fingerprint(corpus)
    if expected is not None and manifest.get("corpus_fingerprint") != expected:
        raise UsageError(
            f"{where} was built for corpus {manifest.get('corpus_fingerprint')!r}, "
            f"not this corpus ({expected!r}); rebuild it for this corpus"
        )
