"""Retrieval of text chunks for query sentences (paper 003 §3.3, first screening step).

    build_index(corpus, out, cfg, workers=1) -> index manifest (dict); workers >= 2: Ray tasks
    open_retriever(index_dir, corpus=...)    -> Retriever, refusing an index built for another corpus
    retriever.search(queries, k)             -> (chunk_ids int64 [n, k], scores float32 [n, k]), -1 padded
"""

from __future__ import annotations

from pathlib import Path

from sentsim.errors import UsageError
from sentsim.retrieval.base import IndexConfig, Retriever, check_index


def build_index(corpus: str | Path, out: str | Path, cfg: IndexConfig | None = None, workers: int = 1,
                num_cpus: float = 1.0) -> dict:
    """`workers=1` builds in this process. sklearn: `workers=N` counts and writes with N Ray tasks of
    `num_cpus` each (Ray must be initialised) and gives the same index; lucene: N indexing threads."""
    from sentsim.out_paths import check_out

    check_out(out, {"--corpus": corpus})
    cfg = cfg or IndexConfig()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a positive integer (got {workers!r})")
    if cfg.backend == "sklearn":
        from sentsim.retrieval.sklearn_backend import build_sklearn_index

        return build_sklearn_index(corpus, out, cfg, workers=workers, num_cpus=num_cpus)
    from sentsim.retrieval.lucene_backend import build_lucene_index

    return build_lucene_index(corpus, out, cfg, threads=workers)


def open_retriever(index_dir: str | Path, corpus: str | Path | None = None, expected_fingerprint: str | None = None,
                   ray_actors: int | None = None, num_cpus: float = 0.5, similarity: str | None = None) -> Retriever:
    """Load an index once. Pass `corpus` (or its fingerprint) to refuse an index built for another
    corpus; `ray_actors` spreads the shards over that many Ray actors. The index scores by the
    `similarity` it was built with; a lucene index can be searched with another one ("bm25" or
    "classic") by passing `similarity`, an sklearn index only with the one baked into it."""
    manifest = check_index(index_dir, corpus=corpus, expected=expected_fingerprint)
    backend = manifest.get("backend")
    if backend == "sklearn":
        from sentsim.retrieval.sklearn_backend import open_sklearn

        built = IndexConfig.model_validate(manifest.get("config", {})).scoring
        if similarity is not None and similarity != built:
            raise UsageError(f"{index_dir}: this sklearn index scores by {built}, not {similarity}; "
                             f"rebuild it with --set similarity={similarity}")
        return open_sklearn(index_dir, manifest, ray_actors=ray_actors, num_cpus=num_cpus)
    if backend == "lucene":
        from sentsim.retrieval.lucene_backend import LuceneRetriever

        return LuceneRetriever(index_dir, manifest, similarity=similarity)
    raise UsageError(f"{index_dir}: unknown retrieval backend {backend!r}")


__all__ = ["IndexConfig", "Retriever", "build_index", "open_retriever"]
