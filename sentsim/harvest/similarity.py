"""Eq. 4 of the core paper (003, section 3.3) and the metrics it can use.

For a pair (s1, s2) with context sets C_s1 and C_s2, let C = C_s1 + C_s2 and
    v_s1 = [S(s1, c) for c in C],  v_s2 = [S(s2, c) for c in C].
The paper's similarity is cos(v_s1, v_s2). Raw S values are log-probabilities, all large and
negative, so the plain cosine of two such vectors is ~1.0 for every pair and mostly measures how
little each sentence reacts to any context. The default is therefore `pearson`, the cosine of the
centred vectors; `spearman` and `double-centred` are offered, `cosine` is kept for the paper.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

METRICS = ("cosine", "pearson", "spearman", "double-centred")


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0 or not np.isfinite(na * nb):
        return float("nan")
    return float(np.dot(a, b) / (na * nb))


def _rank(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x).astype(np.float64)


def pair_similarity(
    v1: np.ndarray, v2: np.ndarray, metric: str = "pearson", context_effect: Optional[np.ndarray] = None
) -> float:
    """Similarity of two score vectors over the same contexts. NaN entries (unscored) are dropped pairwise.

    `double-centred` removes each sentence's mean and, per context, `context_effect` (the mean
    score of a shared reference set of sentences in that context, itself centred), then takes
    the cosine. Without a context effect it equals `pearson`.
    """
    v1 = np.asarray(v1, dtype=np.float64)
    v2 = np.asarray(v2, dtype=np.float64)
    if v1.shape != v2.shape:
        raise ValueError("score vectors must cover the same contexts")
    ok = np.isfinite(v1) & np.isfinite(v2)
    if context_effect is not None:
        context_effect = np.asarray(context_effect, dtype=np.float64)
        ok &= np.isfinite(context_effect)
    if ok.sum() < 2:
        return float("nan")
    a, b = v1[ok], v2[ok]
    if metric == "cosine":
        return _cos(a, b)
    if metric == "pearson":
        return _cos(a - a.mean(), b - b.mean())
    if metric == "spearman":
        ra, rb = _rank(a), _rank(b)
        return _cos(ra - ra.mean(), rb - rb.mean())
    if metric == "double-centred":
        if context_effect is None:
            return _cos(a - a.mean(), b - b.mean())
        e = context_effect[ok]
        e = e - e.mean()
        a = a - a.mean() - e
        b = b - b.mean() - e
        return _cos(a, b)
    raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


def std_control(v1: np.ndarray, v2: np.ndarray) -> float:
    """The pair-independent control of the harvest issue: -(std v_s1 + std v_s2)."""
    v1 = np.asarray(v1, dtype=np.float64)
    v2 = np.asarray(v2, dtype=np.float64)
    return -float(np.nanstd(v1) + np.nanstd(v2))
