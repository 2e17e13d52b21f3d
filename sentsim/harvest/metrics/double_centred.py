"""`double-centred` (not in paper 003): the cosine after removing each sentence's mean and each context's effect.

Inputs: v_s1, v_s2 over C_s1 + C_s2 as in Eq. 4 (003 §3.3), and the context effect e: per context,
the mean S of a shared reference set of sentences there (a harvest's `reference_sentences`, drawn
from the corpus; a grouped harvest's `centred` variant uses the group itself, grouping.py). e is
centred too, then v - mean(v) - e is compared. Most of S(s, c) is how predictable the context is,
which every sentence shares; this removes it. Without a context effect it equals `pearson`. A
per-pair harvest keeps no reference scores, so `sentsim remix` cannot recompute it there; a pool harvest
(contexts.mode=pool) keeps every sentence's vector over the pool, whose mean per context is the effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sentsim.harvest.metrics.cosine import cos
from sentsim.harvest.metrics.registry import Metric

if TYPE_CHECKING:
    import numpy as np


def double_centred(a: np.ndarray, b: np.ndarray, effect: Optional[np.ndarray] = None) -> float:
    if effect is None:
        return cos(a - a.mean(), b - b.mean())
    e = effect - effect.mean()
    return cos(a - a.mean() - e, b - b.mean() - e)


METRIC = Metric("double-centred", double_centred, uses_context_effect=True)
