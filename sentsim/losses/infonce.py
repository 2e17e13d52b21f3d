"""InfoNCE with in-batch negatives (and optional hard negatives): the contrastive term of the students.

| inputs                               | labels                               | source                               |
|--------------------------------------|--------------------------------------|--------------------------------------|
| anchors a [N, d]; positives p [N, d] | none: row i of p is a_i's positive,  | SimCSE (Gao et al. 2021) as used by  |
| (same order); optional hard          | every other row of p (and every row  | RankEncoder 004 §3.1 Eq. 1 (dropout  |
| negatives n [N, d]                   | of n) is a negative                  | positives, tau 0.05); RSE 000 §3.3   |
|                                      |                                      | Eq. 2 when hard negatives are given  |

loss_i = -log( exp(cos(a_i, p_i)/tau) / (sum_m exp(cos(a_i, p_m)/tau) + sum_m exp(cos(a_i, n_m)/tau)) )
loss   = mean_i loss_i  (004 Eq. 1 writes the sum. Alone, the mean only rescales the learning rate; inside
         RankEncoder's Eq. 5, max(lambda_train * l_r, l_cl), a sum would move the balance by the batch
         size. The mean is kept: SimCSE's code averages, and 004 appendix A.2's curves, SimCSE's loss
         falling below 0.001 and lambda_train * l_r meeting l_cl at lambda_train 0.05, are a mean's scale)

`hard_mask` (bool [N]) marks which rows of n are real: a triple without a hard negative leaves its
row out of every denominator.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[N, M] cosine similarities, in float32 (bf16 logits / 0.05 lose too much precision)."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


class InfoNCELoss(nn.Module):
    def __init__(self, temperature: float = 0.05):  # 004 §4.3 follows SimCSE: tau = 0.05; RSE Table 4 too
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.temperature = temperature

    def logits(self, anchors, positives, hard_negatives: Optional[torch.Tensor] = None,
               hard_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[N, N (+N)] logits: column i is a_i's positive; hard-negative columns follow."""
        logits = cosine_matrix(anchors, positives) / self.temperature
        if hard_negatives is not None:
            hard = cosine_matrix(anchors, hard_negatives) / self.temperature
            if hard_mask is not None:
                hard = hard.masked_fill(~hard_mask.bool()[None, :], float("-inf"))
            logits = torch.cat([logits, hard], dim=1)
        return logits

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, hard_negatives: Optional[torch.Tensor] = None,
                hard_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if anchors.shape != positives.shape:
            raise ValueError(f"anchors {tuple(anchors.shape)} and positives {tuple(positives.shape)} must match")
        logits = self.logits(anchors, positives, hard_negatives, hard_mask)
        target = torch.arange(anchors.shape[0], device=anchors.device)
        return F.cross_entropy(logits, target)
