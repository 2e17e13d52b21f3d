"""vector_rows and pair_similarity give exactly what they gave before the whole-matrix count and the per-pair
np.unique were taken out of them: the old code is copied here as the reference, and every value is compared
bit for bit (same floats, same None where NaN, same null reasons, same row order) on random matrices with
NaNs, ties, constant rows, signed zeros and too few shared contexts."""

import math
import zlib

import numpy as np
import pytest

from sentsim.harvest import eq4_rows, metrics
from sentsim.harvest.eq4_rows import DEGENERATE, FEW_CONTEXTS, vector_rows
from sentsim.harvest.similarity import MIN_POINTS, pair_similarity


def old_pair_similarity(v1, v2, metric=metrics.DEFAULT, context_effect=None):
    compare = metrics.get(metric).compare
    v1 = np.asarray(v1, dtype=np.float64)
    v2 = np.asarray(v2, dtype=np.float64)
    if v1.shape != v2.shape:
        raise ValueError("score vectors must cover the same contexts")
    ok = np.isfinite(v1) & np.isfinite(v2)
    if context_effect is not None:
        context_effect = np.asarray(context_effect, dtype=np.float64)
        ok &= np.isfinite(context_effect)
    if ok.sum() < MIN_POINTS or len(np.unique(np.stack([v1[ok], v2[ok]], axis=1), axis=0)) < MIN_POINTS:
        return float("nan")
    return compare(v1[ok], v2[ok], None if context_effect is None else context_effect[ok])


def _value(x):
    return x if np.isfinite(x) else None


def old_vector_rows(pairs, S, terms, metric, effect=None):
    rows = []
    scored = np.isfinite(S).sum(axis=1)
    for i, j in pairs:
        row = {"n_ctx_s1": int(scored[i]), "n_ctx_s2": int(scored[j])}
        score = old_pair_similarity(S[i], S[j], metric, effect)
        row["score"] = _value(score)
        both = int((np.isfinite(S[i]) & np.isfinite(S[j])).sum())
        row["null_reason"] = None if np.isfinite(score) else FEW_CONTEXTS if both < MIN_POINTS else DEGENERATE
        for t, values in terms.items():
            row[f"sim_{t}"] = _value(old_pair_similarity(values[i], values[j], metric))
        rows.append(row)
    return rows


def _same(x, y) -> bool:
    """Equal values of equal types; floats bit for bit (a NaN only equals a NaN)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, (float, np.floating)):
        return np.float64(x).tobytes() == np.float64(y).tobytes() or (math.isnan(x) and math.isnan(y))
    return x == y


def _matrix(rng, n, p, dtype):
    """Log-probability-like rows with what Eq. 4 must handle: NaN runs, rows with under three scored contexts,
    constant rows, a few repeated values (ties, points met twice) and signed zeros."""
    S = (-5 + rng.normal(size=(n, p))).astype(dtype)
    S[rng.random((n, p)) < 0.15] = np.nan
    S[rng.random(n) < 0.1] = np.nan  # unscored sentences
    sparse = rng.random(n) < 0.1
    S[sparse, 3:] = np.nan  # at most three contexts
    S[rng.random(n) < 0.05] = -4.0  # constant
    coarse = rng.random(n) < 0.1
    S[coarse] = np.round(S[coarse])  # few distinct values
    S[rng.random((n, p)) < 0.01] = 0.0
    S[rng.random((n, p)) < 0.01] = -0.0
    S[rng.random((n, p)) < 0.002] = np.inf
    return S


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", metrics.names())
def test_vector_rows_are_bit_identical_to_the_old_code(metric, dtype, monkeypatch):
    # seeded by crc32, not hash(): str hashes are salted per process, so hash() drew other matrices each run
    rng = np.random.default_rng(zlib.crc32(f"{metric}-{np.dtype(dtype).name}".encode()))
    n, p = 300, 40
    S = _matrix(rng, n, p, dtype)
    # a degenerate pair whatever was drawn: a row of two values met with itself, scored in every context, gives
    # two distinct points, fewer than MIN_POINTS, though it shares more than MIN_POINTS contexts
    S[n - 2] = np.where(np.arange(p) % 2 == 0, -4.0, -5.0).astype(dtype)
    terms = {t: _matrix(rng, n, p, dtype) for t in ("disc", "fwd", "left", "right")}
    effect = None
    if metrics.get(metric).uses_context_effect:
        effect = np.nanmean(S.astype(np.float64), axis=0)
        effect[rng.random(p) < 0.1] = np.nan
    pairs = [tuple(x) for x in rng.integers(0, n, size=(1000, 2)).tolist()]
    pairs += [(i, i) for i in range(10)] + [(0, n - 1)] * 3  # a sentence with itself, repeats
    pairs += [(n - 2, n - 2)]
    # several blocks, one of them partial, so the blocked loop is covered too
    monkeypatch.setattr(eq4_rows, "_BLOCK_FLOATS", p * 700)
    new, old = vector_rows(pairs, S, terms, metric, effect), old_vector_rows(pairs, S, terms, metric, effect)
    assert len(new) == len(old)
    kinds = set()
    for a, b in zip(new, old):
        assert list(a) == list(b)  # the same columns in the same order
        assert all(_same(a[k], b[k]) for k in a), (a, b)
        kinds.add(b["null_reason"])
    assert kinds == {None, FEW_CONTEXTS, DEGENERATE}  # every branch was met


def test_no_pairs_give_no_rows():
    assert vector_rows([], np.zeros((3, 4)), {}, "pearson") == []


def test_pair_similarity_is_bit_identical_to_the_old_code():
    rng = np.random.default_rng(7)
    for metric in metrics.names():
        for _ in range(400):
            k = int(rng.integers(0, 12))
            v1, v2 = rng.normal(size=k), rng.normal(size=k)
            # few distinct values, repeated points, signed zeros and NaNs
            for v in (v1, v2):
                pick = rng.random(k) < 0.5
                v[pick] = rng.choice([0.0, -0.0, 1.0, np.nan], size=int(pick.sum()))
            eff = rng.normal(size=k) if rng.random() < 0.5 else None
            if eff is not None:
                eff[rng.random(k) < 0.2] = np.nan
            assert _same(pair_similarity(v1, v2, metric, eff), old_pair_similarity(v1, v2, metric, eff))


def test_distinct_points_count_signed_zeros_as_one():
    assert np.isnan(pair_similarity([0.0, -0.0, 1.0], [1.0, 1.0, 2.0]))  # two distinct points
    assert np.isfinite(pair_similarity([0.0, -0.0, 1.0], [1.0, 2.0, 2.0]))
