"""Eq. 4 of the core paper (003, section 3.3) for one pair of score vectors.

For a pair (s1, s2) with context sets C_s1 and C_s2, let C = C_s1 + C_s2 and
    v_s1 = [S(s1, c) for c in C],  v_s2 = [S(s2, c) for c in C].
The paper's similarity is cos(v_s1, v_s2); the metrics offered (cosine, pearson, the default,
spearman, double-centred) are one file each in sentsim/harvest/metrics/. A unit's pair rows are
built from these in sentsim/harvest/eq4_rows.py.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from sentsim.harvest import metrics

MIN_POINTS = 3  # distinct contexts a pair's Eq. 4 needs (pair_similarity)


def pair_similarity(
    v1: np.ndarray, v2: np.ndarray, metric: str = metrics.DEFAULT, context_effect: Optional[np.ndarray] = None
) -> float:
    """Similarity of two score vectors over the same contexts. NaN entries (unscored) are dropped pairwise,
    with those where the context effect is NaN; fewer than MIN_POINTS distinct (v1, v2) points left gives
    NaN: over two, every correlation is exactly +1 or -1 whatever the sentences, a label that says nothing
    (a context in both C_s1 and C_s2 is one point twice, so it is counted once).

    `context_effect`, per context, is read only by metrics that use it (double-centred)."""
    compare = metrics.get(metric).compare
    v1 = np.asarray(v1, dtype=np.float64)
    v2 = np.asarray(v2, dtype=np.float64)
    if v1.shape != v2.shape:
        raise ValueError("score vectors must cover the same contexts")
    ok = np.isfinite(v1) & np.isfinite(v2)
    if context_effect is not None:
        context_effect = np.asarray(context_effect, dtype=np.float64)
        ok &= np.isfinite(context_effect)
    if ok.sum() < MIN_POINTS or not enough_points(v1[None], v2[None], ok[None])[0]:
        return float("nan")
    return compare(v1[ok], v2[ok], None if context_effect is None else context_effect[ok])


def enough_points(a: np.ndarray, b: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Per row of the aligned 2-D arrays a and b, whether the entries where `ok` holds give at least MIN_POINTS
    distinct (a, b) points (ok must be False wherever a or b is not finite).

    Each pass takes a row's first point left and drops every point equal to it, so MIN_POINTS - 1 passes leave
    a point only where that many distinct ones came before it. This answers what counting the distinct rows of
    np.unique(..., axis=0) did, with the same float equality (-0.0 == 0.0), in a few linear passes instead of a
    sort of structured rows, which cost most of a pair's time."""
    rows = np.arange(a.shape[0])
    left = np.array(ok, dtype=bool)
    for _ in range(MIN_POINTS - 1):
        first = left.argmax(axis=1)  # 0 in a row with nothing left, which then stays empty
        left &= (a != a[rows, first][:, None]) | (b != b[rows, first][:, None])
    return left.any(axis=1)


def std_control(v1: np.ndarray, v2: np.ndarray) -> float:
    """The pair-independent control of the harvest issue: -(std v_s1 + std v_s2)."""
    v1 = np.asarray(v1, dtype=np.float64)
    v2 = np.asarray(v2, dtype=np.float64)
    return -float(np.nanstd(v1) + np.nanstd(v2))
