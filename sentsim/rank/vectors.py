"""Rank vectors, the normalisation g, and their compact integer encoding.

RankEncoder (004 paper, section 3.2, Eq. 2): for an anchor corpus C = [x_1..x_n] and a base
encoder E1, the rank vector of x holds r_i, the rank of anchor x_i by cos(E1(x), E1(x_i)).
g(r) = (r - mean(r)) / (sqrt(n) * std(r)), so <g(r_u), g(r_v)> is Spearman's rho of the two
similarity lists (appendix A.1).

Storage, `rank.storage=codes`: a rank vector is a permutation of 0..n-1, so its mean and std are
the same for every sentence and need not be stored. We store the ranks as unsigned integers,
optionally quantised into 2^bits buckets (rank // q): 16 bits keep rho within about 1e-4 of exact
for n = 100,000 (bytes per sentence = n * bits / 8). `RankCodec` owns that choice.

`rank.storage=vectors`: E1's float16 vector per sentence (2 * dim bytes) plus the anchor matrix
once per run; `AnchorMatrix` turns them into ranks (torch) where they are used. `resolve_storage`
says which of the two a run uses (`auto`: the smaller per sentence).
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
    """g of 004 Eq. 3: centre each row and scale it so that the row has unit L2 norm."""
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


# ----------------------------------------------------------------------------- vectors storage
#
# At the paper's 100,000 anchors the codes cost 200 KB per sentence. `rank.storage=vectors` stores
# E1's float16 embedding per sentence instead (2 * dim bytes: 768 for all-MiniLM-L6-v2) and the
# anchor matrix once per run; the ranks are computed here, with torch, where they are used (the
# harvest's rank_sim, the RankEncoder student's targets). This is the one home of that computation.

STORAGES = ("auto", "vectors", "codes")


def vector_bytes(dim: int) -> int:
    """Bytes per sentence of a float16 base vector."""
    return 2 * int(dim)


def resolve_storage(storage: str, n_anchors: int, bits: int, dim: int) -> str:
    """'codes' or 'vectors'. `auto` stores whichever is smaller per sentence: codes cost
    n_anchors * bits / 8 bytes and need no compute where they are used (exact ranks while the
    anchors fit in `bits`); a float16 vector costs 2 * dim bytes whatever the anchor count.
    With all-MiniLM-L6-v2 (dim 384) and 16 bits: codes up to 384 anchors, vectors above."""
    if storage not in STORAGES:
        raise ValueError(f"rank.storage must be one of {', '.join(STORAGES)}, not {storage!r}")
    if storage != "auto":
        return storage
    return "codes" if n_anchors * bits // 8 <= vector_bytes(dim) else "vectors"


def stable_argsort_rows(sims):
    """torch.argsort(sims, dim=1, stable=True) for a float32 [m, n] tensor (n < 2^31), ties by index.

    On GPU that is torch's own (radix) sort. On CPU torch's sort is slow (about 2M floats/s per
    thread), so each value becomes one int64 key, its order-preserving 32-bit pattern above its
    index, and numpy's vectorised sort orders the keys: about 3x faster, same order."""
    import torch

    if sims.device.type != "cpu":
        return torch.argsort(sims, dim=1, stable=True)
    i = sims.contiguous().view(torch.int32)
    k = (i ^ ((i >> 31) & 0x7FFFFFFF)).to(torch.int64) + (1 << 31)  # float order as 0..2^32-1
    k = (k << 31) | torch.arange(sims.shape[1], dtype=torch.int64)
    keys = np.sort(k.numpy(), axis=1)
    return torch.from_numpy(keys & ((1 << 31) - 1))


class AnchorMatrix:
    """The run's anchor vectors (E1, any float dtype), L2-normalised once, in float32 on `device`.

    `ranks(v)`: [m, n] int64 ranks of the anchors by cosine to each row of v, 0 = least similar,
    ties broken by anchor index (a stable sort), exactly as `ranks_from_similarities`.
    `targets(v)`: g(ranks) as float32 rows of unit norm; a rank vector is a permutation of 0..n-1,
    so g has a closed form (mean (n-1)/2, population std sqrt((n^2-1)/12)).
    Rows are done `chunk` at a time, so memory stays at chunk x n whatever m is.
    """

    def __init__(self, vectors, device=None, chunk: int = 256):
        import torch

        a = torch.tensor(np.asarray(vectors), dtype=torch.float32, device=device or "cpu")
        if a.ndim != 2 or a.shape[0] < 2:
            raise ValueError(f"anchor matrix must be [n >= 2, dim], not {tuple(a.shape)}")
        self.matrix = a / a.norm(dim=1, keepdim=True).clamp_min(1e-12)
        self.n, self.dim = int(a.shape[0]), int(a.shape[1])
        self.device = self.matrix.device
        self.chunk = max(1, int(chunk))

    def _rows(self, vectors):
        import torch

        if isinstance(vectors, torch.Tensor):
            v = vectors.to(device=self.device, dtype=torch.float32)
        else:
            v = torch.tensor(np.asarray(vectors), dtype=torch.float32, device=self.device)
        if v.ndim == 1:
            v = v[None, :]
        if v.shape[1] != self.dim:
            raise ValueError(f"vectors have {v.shape[1]} dimensions but the anchor matrix has {self.dim}")
        return v

    def ranks(self, vectors):
        import torch

        v = self._rows(vectors)
        out = torch.empty((v.shape[0], self.n), dtype=torch.int64, device=self.device)
        pos = torch.arange(self.n, device=self.device)
        for i in range(0, v.shape[0], self.chunk):
            sims = v[i:i + self.chunk] @ self.matrix.T  # the row's own norm does not change its ranks
            order = stable_argsort_rows(sims)
            out[i:i + self.chunk].scatter_(1, order, pos.expand_as(order))
        return out

    def targets(self, vectors):
        """u = g(ranks), float32 [m, n] on the matrix's device (Eq. 2)."""
        import torch

        n = self.n
        scale = 1.0 / (np.sqrt(n) * np.sqrt((n * n - 1) / 12.0))
        return (self.ranks(vectors).to(dtype=torch.float32) - (n - 1) / 2.0) * scale

    def rank_similarity(self, a, b) -> np.ndarray:
        """Row-wise Spearman's rho of a_i and b_i over the anchors (= <g(r_a), g(r_b)>), exact:
        1 - 6 sum d^2 / (n (n^2 - 1)) on the integer ranks."""
        return spearman_of_ranks(self.ranks(a), self.ranks(b))


def spearman_of_ranks(ra, rb) -> np.ndarray:
    """Row-wise Spearman's rho of two [m, n] integer rank tensors (permutations of 0..n-1)."""
    import torch

    n = float(ra.shape[1])
    d2 = ((ra - rb) ** 2).sum(dim=1).to(dtype=torch.float64).cpu().numpy()
    return 1.0 - 6.0 * d2 / (n * (n * n - 1.0))
