"""Retrieval of text chunks for query sentences (paper 003 §3.3, first screening step).

    build_index(corpus, out, cfg)            -> index manifest (dict)
    open_retriever(index_dir, corpus=...)    -> Retriever, refusing an index built for another corpus
    retriever.search(queries, k)             -> (chunk_ids int64 [n, k], scores float32 [n, k]), -1 padded
"""

from __future__ import annotations

from pathlib import Path

from sentsim.errors import UsageError
from sentsim.retrieval.base import IndexConfig, Retriever, check_fingerprint, read_index_manifest


def build_index(corpus: str | Path, out: str | Path, cfg: IndexConfig | None = None) -> dict:
    cfg = cfg or IndexConfig()
    if cfg.backend == "sklearn":
        from sentsim.retrieval.sklearn_backend import build_sklearn_index

        return build_sklearn_index(corpus, out, cfg)
    from sentsim.retrieval.lucene_backend import build_lucene_index

    return build_lucene_index(corpus, out, cfg)


def open_retriever(index_dir: str | Path, corpus: str | Path | None = None, expected_fingerprint: str | None = None,
                   ray_actors: int | None = None, num_cpus: float = 0.5) -> Retriever:
    """Load an index once. Pass `corpus` (or its fingerprint) to refuse an index built for another
    corpus; `ray_actors` spreads the shards over that many Ray actors."""
    manifest = read_index_manifest(index_dir)
    check_fingerprint(manifest, f"index {index_dir}", corpus=corpus, expected=expected_fingerprint)
    backend = manifest.get("backend")
    if backend == "sklearn":
        from sentsim.retrieval.sklearn_backend import open_sklearn

        return open_sklearn(index_dir, manifest, ray_actors=ray_actors, num_cpus=num_cpus)
    if backend == "lucene":
        from sentsim.retrieval.lucene_backend import LuceneRetriever

        return LuceneRetriever(index_dir, manifest)
    raise UsageError(f"{index_dir}: unknown retrieval backend {backend!r}")


__all__ = ["IndexConfig", "Retriever", "build_index", "open_retriever"]
