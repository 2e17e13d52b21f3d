"""Eq. 4 metrics and pair sampling: exact values, stability, no duplicates."""

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from sentsim.harvest.pairs import owned_pairs, pair_id, pair_split, sample_partners
from sentsim.harvest.similarity import pair_similarity, std_control


def test_metrics_against_direct_formulas():
    rng = np.random.default_rng(0)
    v1 = -5 + rng.normal(size=40)
    v2 = v1 + rng.normal(scale=0.5, size=40)
    assert pair_similarity(v1, v2, "cosine") == pytest.approx(v1 @ v2 / np.linalg.norm(v1) / np.linalg.norm(v2))
    assert pair_similarity(v1, v2, "pearson") == pytest.approx(pearsonr(v1, v2).statistic)
    assert pair_similarity(v1, v2, "spearman") == pytest.approx(spearmanr(v1, v2).statistic)
    # raw log-prob vectors: plain cosine is ~1 for any pair, the centred metric is not
    v3 = -5 + rng.normal(size=40)
    assert pair_similarity(v1, v3, "cosine") > 0.95
    assert abs(pair_similarity(v1, v3, "pearson")) < 0.5


def test_double_centred_removes_the_shared_context_effect():
    rng = np.random.default_rng(1)
    effect = rng.normal(scale=3, size=50)  # some contexts are easy for every sentence
    a = effect + rng.normal(size=50)
    b = effect + rng.normal(size=50)  # unrelated sentences apart from the context effect
    assert pair_similarity(a, b, "pearson") > 0.8
    assert abs(pair_similarity(a, b, "double-centred", context_effect=effect)) < 0.4
    assert pair_similarity(a, b, "double-centred") == pytest.approx(pair_similarity(a, b, "pearson"))


def test_nan_and_degenerate_vectors():
    assert np.isnan(pair_similarity([1.0, np.nan], [2.0, 3.0]))
    assert np.isnan(pair_similarity([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], "pearson"))
    assert pair_similarity([1, 2, np.nan, 4], [2, 4, 5, 8], "pearson") == pytest.approx(1.0)
    with pytest.raises(ValueError):
        pair_similarity([1, 2], [1, 2], "euclid")
    assert std_control([1, 1], [1, 3]) == pytest.approx(-1.0)


def test_a_pair_over_fewer_than_three_distinct_contexts_is_null_with_its_reason():
    """Over two points every correlation is exactly +1 or -1 whatever the sentences: such a pair gets no
    score (and says why), in every metric, in per-pair and pool harvests alike; a context in both C_s1 and
    C_s2 is one point, however often it is listed."""
    from sentsim.harvest import metrics
    from sentsim.harvest.eq4_rows import FEW_CONTEXTS, UnitTerms, pair_rows, vector_rows

    for metric in metrics.names():
        assert np.isnan(pair_similarity([1.0, 2.0], [3.0, 1.0], metric))
        assert np.isnan(pair_similarity([1.0, 2.0, 1.0, 2.0], [3.0, 1.0, 3.0, 1.0], metric))  # 2 contexts twice
    assert np.isfinite(pair_similarity([1.0, 2.0, 4.0], [3.0, 1.0, 2.0], "pearson"))
    keys = [(s, c) for s in ("a", "b") for c in (10, 11, 12)]
    S = np.array([1.0, 2.0, 4.0, 3.0, 1.0, 2.0])
    terms = UnitTerms(keys, S, {t: S.copy() for t in ("disc", "fwd", "left", "right")})
    two, three = pair_rows([("a", "b")], terms, "pearson", {"a": [10], "b": [11, 10]}), \
        pair_rows([("a", "b")], terms, "pearson", {"a": [10, 12], "b": [11]})
    assert two[0]["score"] is None and two[0]["null_reason"] == FEW_CONTEXTS and two[0]["sim_fwd"] is None
    assert three[0]["score"] is not None and three[0]["null_reason"] is None
    pool = np.array([[1.0, 2.0, np.nan, np.nan], [3.0, 1.0, 5.0, np.nan]])  # two contexts scored for both
    row = vector_rows([(0, 1)], pool, {"fwd": pool}, "pearson")[0]
    assert row["score"] is None and row["null_reason"] == FEW_CONTEXTS


def test_pair_ids_and_splits_are_stable_and_symmetric():
    assert pair_id(3, 9) == pair_id(9, 3) and pair_id(3, 9) != pair_id(3, 10)
    assert pair_split(3, 9) == pair_split(9, 3)
    splits = [pair_split(i, i + 7) for i in range(20000)]
    frac = {s: splits.count(s) / len(splits) for s in ("train", "dev", "test")}
    assert 0.975 < frac["train"] < 0.985 and 0.007 < frac["dev"] < 0.013 and 0.007 < frac["test"] < 0.013


def test_pair_ids_splits_and_partners_are_pinned():
    """Values pinned across processes and releases: a change of hash, seed handling or sampling order
    would silently move pairs between splits of a resumed harvest, so it must fail here."""
    assert pair_id(3, 9) == 205522977786342775
    assert pair_id(1 << 20 | 5, 2 << 20 | 7) == 1903620711508069425
    assert [i for i in range(400) if pair_split(i, i + 7) != "train"][:6] == [10, 16, 49, 73, 82, 232]
    assert pair_split(10, 17) == "test" and pair_split(232, 239) == "dev"
    corpus = np.arange(1000, dtype=np.int64)
    doc = np.arange(100, 130, dtype=np.int64)
    assert sample_partners(105, 7, doc, corpus, [500, 501, 105, 502], 2, 3, 4) == [
        (500, "neighbour"), (501, "neighbour"), (115, "same-doc"), (117, "same-doc"), (124, "same-doc"),
        (617, "random"), (868, "random"), (720, "random"), (541, "random")]


def test_partner_sampling_is_seeded_and_mixed():
    corpus = np.arange(1000, dtype=np.int64)
    doc = np.arange(100, 130, dtype=np.int64)
    a = sample_partners(105, 7, doc, corpus, [500, 501, 105, 502], 2, 3, 4)
    assert a == sample_partners(105, 7, doc, corpus, [500, 501, 105, 502], 2, 3, 4)
    kinds = [k for _, k in a]
    assert kinds.count("neighbour") == 2 and kinds.count("same-doc") == 3 and kinds.count("random") == 4
    assert 105 not in [p for p, _ in a] and len({p for p, _ in a}) == len(a)
    assert all(100 <= p < 130 for p, k in a if k == "same-doc")
    assert a != sample_partners(105, 8, doc, corpus, [500, 501], 2, 3, 4)
    # a pair between two anchors belongs to the smaller anchor only
    assert owned_pairs(50, [(10, "random"), (60, "random"), (70, "random")], {10, 50, 60}) == [
        (60, "random"), (70, "random")]
