"""PaSeR's generative loss: token cross-entropy of the decoder reconstructing the masked phrases.

| inputs                                   | labels                                 | source                           |
|------------------------------------------|----------------------------------------|----------------------------------|
| decoder logits [B, T, V] (teacher forced | token ids of the masked phrase(s) t_1  | PaSeR 002 §3.2.3 Eq. 3           |
| on t_<i, conditioned on the decoding     | .. t_k [B, T], padding = ignore_index  | L_gen = -sum_i log P(t_i | t_<i, |
| signal of §3.2.2)                        | (-100)                                 | Signal_Dec)                      |

The sum over a phrase's tokens (Eq. 3) is averaged over the batch's real tokens here, so the value
does not grow with phrase length; MLM (Eq. 4, L_total = L_MLM + L_generative) is computed by the
encoder's masked-LM head and added by the objective.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

IGNORE = -100


class PhraseReconstructionLoss(nn.Module):
    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.shape[:2] != labels.shape:
            raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
