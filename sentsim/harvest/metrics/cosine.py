"""`cosine`: Eq. 4 as paper 003 gives it (§3.3), cos(v_s1, v_s2).

Inputs: v_s1 = [S(s1, c) for c in C], v_s2 = [S(s2, c) for c in C], C = C_s1 + C_s2, S from Eq. 3.
Raw S values are log-probabilities, all large and negative, so the plain cosine of two of them is
~1.0 for every pair (README, "Why the harvest's default metric is not the paper's plain cosine"):
it is kept to reproduce the paper; the default is `pearson`. `cos` is the other metrics' last step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sentsim.harvest.metrics.registry import Metric

if TYPE_CHECKING:
    import numpy as np


def cos(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b); NaN when either vector is zero (or the product of their norms is not finite)."""
    import numpy as np

    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0 or not np.isfinite(na * nb):
        return float("nan")
    return float(np.dot(a, b) / (na * nb))


def cosine(a: np.ndarray, b: np.ndarray, effect: Optional[np.ndarray] = None) -> float:
    return cos(a, b)


METRIC = Metric("cosine", cosine)
