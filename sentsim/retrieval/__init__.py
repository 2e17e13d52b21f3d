"""Retrieval of text chunks for query sentences (paper 003 §3.3, first screening step).

    build_index(corpus, out, cfg, workers=1) -> index manifest (dict); workers >= 2: Ray tasks
    already_built(corpus, out, cfg)          -> the manifest of that index when it is built there, whole
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
    `num_cpus` each (Ray must be initialised) and gives the same index; lucene: N indexing threads.
    An index already built at `out` for this corpus with this config, whole, is kept as it is: its
    manifest comes back with `already_built` set and nothing is written (workers change no index)."""
    from sentsim.out_paths import check_out

    check_out(out, {"--corpus": corpus}, writes="index")
    cfg = cfg or IndexConfig()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a positive integer (got {workers!r})")
    done = already_built(corpus, out, cfg)
    if done is not None:
        return done
    if cfg.backend == "sklearn":
        from sentsim.retrieval.sklearn_backend import build_sklearn_index

        return build_sklearn_index(corpus, out, cfg, workers=workers, num_cpus=num_cpus)
    from sentsim.retrieval.lucene_backend import build_lucene_index

    return build_lucene_index(corpus, out, cfg, threads=workers)


def already_built(corpus: str | Path, out: str | Path, cfg: IndexConfig) -> dict | None:
    """The index at `out` when it is already this build's, whole (its manifest, with `already_built`);
    None when it is to be built. The index and its identity are left as they are."""
    from sentsim.identity import corpus_fingerprint, fingerprint
    from sentsim.out_paths import check_out
    from sentsim.retrieval.index_store import finished_index

    check_out(out, {"--corpus": corpus}, writes="index")
    if cfg.backend == "sklearn":
        from sentsim.retrieval.sklearn_backend import FORMAT
    else:
        from sentsim.retrieval.lucene_backend import FORMAT
    want = fingerprint(cfg.semantic(), corpus_fingerprint(corpus))

    def matches(manifest: dict) -> bool:
        try:
            config = IndexConfig.model_validate(manifest.get("config", {})).model_dump()
        except ValueError:  # a config this sentsim does not read: built anew
            return False
        return (manifest.get("format"), manifest.get("backend"), manifest.get("fingerprint"), config) == \
            (FORMAT, cfg.backend, want, cfg.model_dump())

    manifest = finished_index(out, matches)
    if manifest is None:
        return None
    return dict(manifest, size_bytes=sum(manifest["files"].values()), already_built=True)


def other_index(corpus: str | Path, out: str | Path) -> str | None:
    """What a whole index at `out` that `already_built` did not take as this build's was built for ("another
    corpus" or "another config", with its fingerprint); None when `out` holds no whole index (a damaged one
    is rebuilt by the same command: it is no other build's)."""
    from sentsim.identity import corpus_fingerprint
    from sentsim.retrieval.index_store import finished_index

    manifest = finished_index(out, lambda m: True)
    if manifest is None:
        return None
    here = corpus_fingerprint(corpus)
    if manifest.get("corpus_fingerprint") != here:  # named by corpus fingerprints, as check_fingerprint names them
        return f"another corpus ({manifest.get('corpus_fingerprint')!r}, not this corpus's {here!r})"
    return f"another config (index fingerprint {manifest.get('fingerprint')})"


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


__all__ = ["IndexConfig", "Retriever", "already_built", "build_index", "open_retriever"]
