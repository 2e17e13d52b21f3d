"""RankEncoder rank-vector targets (../shared/papers/004_*, section 3.2)."""

from sentsim.rank.vectors import (
    STORAGES,
    AnchorMatrix,
    RankCodec,
    g_normalise,
    rank_similarity,
    ranks_from_similarities,
    resolve_storage,
    spearman_of_ranks,
    vector_bytes,
)

__all__ = ["STORAGES", "AnchorMatrix", "RankCodec", "g_normalise", "rank_similarity", "ranks_from_similarities",
           "resolve_storage", "spearman_of_ranks", "vector_bytes"]
