"""The surrogate's training objective: squared error between a predicted similarity and the teacher's.

| inputs                          | labels                               | source                              |
|---------------------------------|--------------------------------------|-------------------------------------|
| predicted similarity per pair:  | teacher similarity per pair (float), | Sun et al., "Sentence Similarity    |
| cosine(u, v) of two sentence    | e.g. the harvested Origin score, or  | Based on Contexts", section 3.4:    |
| vectors (Siamese), or a raw     | STS gold / 5 when fine-tuning        | "minimize the L2 distance between   |
| score (cross-encoder)           | (section 4.1, supervised setting)    | predicted and golden similarities"  |

Named for what it is: sentence-transformers' `MSELoss` means embedding distillation (student vector
vs teacher vector), which this is not. The reported value is the mean over the batch, which is the
"average L2 distance" the paper quotes for the dev set (7.4e-4 from scratch, 6.1e-4 from RoBERTa).

Targets in a narrow band are a trap for it: harvested Origin scores sit near 1 (mean 0.99, sd 0.006-0.012 in
this project's harvests), and a from-scratch surrogate met them by pulling every cosine onto their mean (its
STS-B test cosines ended within a few 1e-6 of each other) while learning next to none of the teacher's order
on the harvest's own held-out pairs; CoSENT, which reads only the order, did learn it
(docs/experiments/2026-11-28-surrogate-loss.md). `narrow_targets_warning` says so before such a run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# A spread of targets under this is near-constant on a cosine's scale of 2: L2 can be met by collapse
NARROW_SD = 0.05


def narrow_targets_warning(mean: float, sd: float, what: str, instead: str) -> str | None:
    """One line when the targets' standard deviation is under NARROW_SD, else None. `what` names the targets;
    `instead` says what to do."""
    if not sd < NARROW_SD:
        return None
    return (f"warning: {what} sit in a narrow band (mean {mean:.4f}, sd {sd:.4f}): the L2 objective can be met "
            f"by pulling every cosine onto their mean instead of learning their order; {instead}")


class CosineRegressionLoss(nn.Module):
    """mean((cos(u, v) - y)^2). Call with two embedding batches, or `on_scores` with predictions."""

    def forward(self, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.on_scores(F.cosine_similarity(u, v, dim=-1), labels)

    @staticmethod
    def on_scores(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # float32 for the reduction: under bf16 autocast the squared error of ~1e-3 residuals underflows
        return F.mse_loss(pred.float().reshape(-1), labels.float().reshape(-1))
