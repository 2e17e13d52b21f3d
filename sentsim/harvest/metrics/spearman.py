"""`spearman` (not in paper 003): Pearson's r of the ranks of v_s1 and v_s2 (ties share their mean rank).

Inputs: v_s1, v_s2 over C_s1 + C_s2 as in Eq. 4 (003 §3.3). Only the order of the contexts by score
counts, so a few contexts with extreme log-probabilities cannot carry the pair's score.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sentsim.harvest.metrics.cosine import cos
from sentsim.harvest.metrics.registry import Metric

if TYPE_CHECKING:
    import numpy as np


def spearman(a: np.ndarray, b: np.ndarray, effect: Optional[np.ndarray] = None) -> float:
    import numpy as np
    from scipy.stats import rankdata

    ra, rb = rankdata(a).astype(np.float64), rankdata(b).astype(np.float64)
    return cos(ra - ra.mean(), rb - rb.mean())


METRIC = Metric("spearman", spearman)
