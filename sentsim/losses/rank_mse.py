"""RankEncoder's rank loss with sentence-pair filtering, and the hinge that combines it with l_cl.

| inputs                                | labels                                  | source                           |
|---------------------------------------|-----------------------------------------|----------------------------------|
| sentence vectors E2(x_i) [m, d] of    | u_i = g(rank vector of x_i) [m, n]      | RankEncoder 004 §3.4 Eq. 4,      |
| the encoder in training (one view)    | from the harvest's stored rank codes;   | §3.5 Eq. 6 (filter tau_l <=      |
|                                       | u_i.u_j is Spearman of the two          | u_i.u_j <= tau_u, 0.5 / 0.8,     |
|                                       | sentences' anchor similarities under E1 | §4.3), and §3.4 Eq. 5 (hinge,    |
|                                       |                                         | lambda 0.05)                     |

l_r = sum over in-batch pairs i != j with tau_l <= u_i.u_j <= tau_u of (u_i.u_j - cos(E2 x_i, E2 x_j))^2,
      divided by the number of such pairs (Eq. 6). Pairs are unordered (i < j): both orders carry the
      same term, so this equals Eq. 6's ordered sum. i = j is excluded (u_i.u_i = 1 > tau_u anyway).
l_total = max(lambda_train * l_r, l_cl)   (Eq. 5)

A batch where the filter keeps no pair has no l_r: `forward` returns (None, 0) and `hinge` then gives
l_cl alone; the caller counts such batches.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sentsim.losses.infonce import cosine_matrix


def pair_filter(target: torch.Tensor, lower: float, upper: float) -> torch.Tensor:
    """Bool [m, m]: the unordered in-batch pairs (i < j) whose target lies in [lower, upper]."""
    m = target.shape[0]
    upper_tri = torch.triu(torch.ones(m, m, dtype=torch.bool, device=target.device), diagonal=1)
    return upper_tri & (target >= lower) & (target <= upper)


class RankMSELoss(nn.Module):
    def __init__(self, lower: float = 0.5, upper: float = 0.8):  # 004 §4.3: tau_l 0.5, tau_u 0.8
        super().__init__()
        if lower > upper:
            raise ValueError(f"tau_l {lower} > tau_u {upper}")
        self.lower, self.upper = lower, upper

    def forward(self, embeddings: torch.Tensor, u: torch.Tensor) -> tuple[Optional[torch.Tensor], int]:
        """(l_r or None, number of pairs kept). `u` are g-normalised rank vectors (rows of unit norm)."""
        target = u.float() @ u.float().T
        keep = pair_filter(target, self.lower, self.upper)
        n = int(keep.sum())
        if n == 0:
            return None, 0
        cos = cosine_matrix(embeddings, embeddings)
        return ((target - cos)[keep] ** 2).mean(), n


def hinge(l_r: Optional[torch.Tensor], l_cl: torch.Tensor, lambda_train: float = 0.05) -> torch.Tensor:
    """Eq. 5: max(lambda_train * l_r, l_cl); l_cl alone when the filter left no pair."""
    if l_r is None:
        return l_cl
    return torch.maximum(lambda_train * l_r, l_cl)
