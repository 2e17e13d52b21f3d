"""RankEncoder rank-vector targets (../shared/papers/004_*, section 3.2)."""

from sentsim.rank.vectors import (
    RankCodec,
    g_normalise,
    rank_similarity,
    ranks_from_similarities,
)

__all__ = ["RankCodec", "g_normalise", "rank_similarity", "ranks_from_similarities"]
