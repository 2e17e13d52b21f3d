"""PaSeR's generative loss: token cross-entropy of the decoder reconstructing the masked phrases.

| inputs                                   | labels                                 | source                           |
|------------------------------------------|----------------------------------------|----------------------------------|
| decoder logits [B, T, V] (teacher forced | token ids of the masked phrase(s) t_1  | PaSeR 002 §3.2.3 Eq. 3           |
| on t_<i, conditioned on the decoding     | .. t_k [B, T], padding = ignore_index  | L_gen = -sum_i log P(t_i | t_<i, |
| signal of §3.2.2)                        | (-100)                                 | Signal_Dec)                      |

`reduction="sum"` is Eq. 3 as written: each example's negative log-likelihood summed over its target's
tokens, then averaged over the batch's examples, so a long phrase weighs more against L_MLM (Eq. 4) than
a short one. `reduction="mean"` averages over the batch's real tokens instead, so the value does not grow
with phrase length (what runs made before the choice were trained with). MLM (Eq. 4,
L_total = L_MLM + L_generative) is computed by the encoder's masked-LM head and added by the objective.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

IGNORE = -100
REDUCTIONS = ("sum", "mean")


class PhraseReconstructionLoss(nn.Module):
    def __init__(self, reduction: str = "sum"):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction {reduction!r}: one of {', '.join(REDUCTIONS)}")
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.shape[:2] != labels.shape:
            raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
        flat = logits.float().reshape(-1, logits.shape[-1])
        if self.reduction == "mean":
            return F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE)
        per_token = F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE, reduction="none")
        per_example = per_token.view(labels.shape).sum(1)  # ignored positions contribute 0
        has_target = (labels != IGNORE).any(1)
        return per_example[has_target].mean()
