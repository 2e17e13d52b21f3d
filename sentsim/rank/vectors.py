"""Rank vectors, the normalisation g, and their compact integer encoding.

RankEncoder (004 paper, section 3.2, Eq. 2): for an anchor corpus C = [x_1..x_n] and a base
encoder E1, the rank vector of x holds r_i, the rank of anchor x_i by cos(E1(x), E1(x_i)).
g(r) = (r - mean(r)) / (sqrt(n) * std(r)), so <g(r_u), g(r_v)> is Spearman's rho of the two
similarity lists (appendix A.1).

Storage: a rank vector is a permutation of 0..n-1, so its mean and std are the same for every
sentence and need not be stored. We store the ranks as unsigned integers, optionally quantised
into 2^bits buckets (rank // q): 16 bits keep rho within about 1e-4 of exact for n = 100,000
(bytes per sentence = n * bits / 8). `RankCodec` owns that choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def ranks_from_similarities(sims: np.ndarray) -> np.ndarray:
    """[m, n] similarities -> [m, n] ranks 0..n-1, where rank 0 is the *least* similar anchor.

    Ascending order makes rank correlate positively with similarity, matching scipy's rankdata.
    Ties (exact float equality) are broken by anchor index; with real embeddings they are rare.
    """
    sims = np.atleast_2d(sims)
    order = np.argsort(sims, axis=1, kind="stable")
    ranks = np.empty_like(order)
    rows = np.arange(sims.shape[0])[:, None]
    ranks[rows, order] = np.arange(sims.shape[1])[None, :]
    return ranks


def g_normalise(ranks: np.ndarray) -> np.ndarray:
    """g of Eq. 2: centre each row and scale it so that the row has unit L2 norm."""
    r = np.atleast_2d(ranks).astype(np.float64)
    n = r.shape[1]
    centred = r - r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, keepdims=True)  # population std, as in the paper's sigma
    std[std == 0] = 1.0
    return (centred / (np.sqrt(n) * std)).astype(np.float32)


def rank_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise <g(r_a), g(r_b)>: Spearman's rho between the two sentences' anchor similarities."""
    return np.einsum("ij,ij->i", g_normalise(a).astype(np.float64), g_normalise(b).astype(np.float64))


@dataclass(frozen=True)
class RankCodec:
    """Integer encoding of rank vectors over `n_anchors` anchors with `bits` bits per rank."""

    n_anchors: int
    bits: int = 16

    def __post_init__(self):
        if self.bits not in (8, 16, 32):
            raise ValueError("bits must be 8, 16 or 32")
        if self.n_anchors < 2:
            raise ValueError("need at least 2 anchors")

    @property
    def dtype(self):
        return {8: np.uint8, 16: np.uint16, 32: np.uint32}[self.bits]

    @property
    def step(self) -> int:
        """Ranks per bucket: 1 (exact) when the anchors fit in `bits`."""
        levels = 1 << self.bits
        return max(1, -(-self.n_anchors // levels))

    @property
    def bytes_per_sentence(self) -> int:
        return self.n_anchors * self.bits // 8

    def encode(self, ranks: np.ndarray) -> np.ndarray:
        return (np.atleast_2d(ranks) // self.step).astype(self.dtype)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Back to (bucket-centred) ranks; g() is invariant to the affine map, so no rescale is needed."""
        return np.atleast_2d(codes).astype(np.float64)
