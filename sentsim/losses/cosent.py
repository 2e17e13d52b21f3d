"""CoSENT: a ranking loss over every pair of pairs in the batch.

| inputs                          | labels                               | source                              |
|---------------------------------|--------------------------------------|-------------------------------------|
| predicted similarity per pair:  | similarity per pair (float); only    | Su Jianlin, "CoSENT" (2022), as     |
| cosine(u, v) (Siamese) or a     | their order within the batch matters | also used by sentence-transformers' |
| raw score (cross-encoder)       |                                      | CoSENTLoss and AnglE (Li & Li 2023) |

loss = log(1 + sum over (i, j) with y_i > y_j of exp(scale * (s_j - s_i)))

It asks only that pairs be ordered as the labels are, which is what Spearman measures, so it is an
option when the teacher's scale is not trusted; it does not fit the teacher's values (dev L2 is then
not meaningful).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CoSENTLoss(nn.Module):
    def __init__(self, scale: float = 20.0):  # 20 as in the CoSENT write-up
        super().__init__()
        self.scale = scale

    def forward(self, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.on_scores(F.cosine_similarity(u, v, dim=-1), labels)

    def on_scores(self, pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pred = pred.float().reshape(-1) * self.scale
        labels = labels.float().reshape(-1)
        diff = pred[None, :] - pred[:, None]           # diff[i, j] = s_j - s_i
        wanted = labels[:, None] > labels[None, :]       # y_i > y_j: s_i should exceed s_j
        diff = diff.masked_fill(~wanted, float("-inf"))  # exp(-inf) = 0 drops the other pairs
        zero = torch.zeros(1, dtype=diff.dtype, device=diff.device)  # the "1 +" term, as exp(0)
        return torch.logsumexp(torch.cat([zero, diff.reshape(-1)]), dim=0)
