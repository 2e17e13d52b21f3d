"""`pearson` (the harvest's default; not in paper 003): the cosine of the centred vectors, Pearson's r.

Inputs: v_s1, v_s2 over C_s1 + C_s2 as in Eq. 4 (003 §3.3). Removing each sentence's mean score
removes how predictable it is in any context, which dominates the paper's plain cosine (README,
"Why the harvest's default metric is not the paper's plain cosine").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sentsim.harvest.metrics.cosine import cos
from sentsim.harvest.metrics.registry import Metric

if TYPE_CHECKING:
    import numpy as np


def pearson(a: np.ndarray, b: np.ndarray, effect: Optional[np.ndarray] = None) -> float:
    return cos(a - a.mean(), b - b.mean())


METRIC = Metric("pearson", pearson)
