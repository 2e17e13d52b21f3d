"""RSE's relational contrastive loss: translation h_i + h_r towards h_j, with in-relation hard negatives.

| inputs                                   | labels                                | source                            |
|------------------------------------------|---------------------------------------|-----------------------------------|
| head vectors h_i [N, d], relation ids    | none: tail j of triple i is its       | RSE 000 §3.1 Eq. 1 (positive pair |
| [N] into a table of relation embeddings  | positive, other tails in the batch    | (h_i + h_r, h_j), in-batch        |
| h_r [R, d], tail vectors h_j [N, d],     | and every hard negative are negatives | negatives), §3.3 Eq. 2 (extra     |
| optional hard negatives [N, d] + mask    |                                       | in-relation hard negative), tau   |
|                                          |                                       | 0.05 (Table 4, appendix D)        |

loss_i = -log( e^{sim(h_i + h_r, h_j)/tau} / sum_m (e^{sim(h_i + h_r, h_m)/tau} + e^{sim(h_i + h_r, h_m^-)/tau}) )

The relational similarity used at inference is `relational_similarity` (§3.3 "How can we use?"):
f(s_i, s_j, r) = sim(h_i + h_r, h_j), or a weighted sum over relations.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from sentsim.losses.infonce import InfoNCELoss


def translate(heads: torch.Tensor, relation_table: torch.Tensor, relation_ids: torch.Tensor) -> torch.Tensor:
    """h_i + h_r for each row (float32)."""
    return heads.float() + relation_table.float()[relation_ids]


def relational_similarity(heads: torch.Tensor, tails: torch.Tensor, relation_vectors: torch.Tensor) -> torch.Tensor:
    """Row-wise sim(h_i + h_r, h_j); `relation_vectors` is [d] (one relation) or [N, d]."""
    return F.cosine_similarity(heads.float() + relation_vectors.float(), tails.float(), dim=-1)


class RelationalContrastiveLoss(nn.Module):
    def __init__(self, temperature: float = 0.05):
        super().__init__()
        self.nce = InfoNCELoss(temperature)

    def forward(self, heads: torch.Tensor, relation_table: torch.Tensor, relation_ids: torch.Tensor,
                tails: torch.Tensor, hard_negatives: Optional[torch.Tensor] = None,
                hard_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.nce(translate(heads, relation_table, relation_ids), tails, hard_negatives, hard_mask)
