"""Rank vectors: g makes the inner product Spearman's rho; codes stay close; real encoder targets."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from sentsim.rank import RankCodec, g_normalise, rank_similarity, ranks_from_similarities


def test_g_inner_product_equals_scipy_spearman():
    rng = np.random.default_rng(0)
    sims = rng.normal(size=(6, 500))
    sims[1] = sims[0] + rng.normal(scale=0.3, size=500)  # a correlated pair
    ranks = ranks_from_similarities(sims)
    g = g_normalise(ranks)
    assert np.allclose(np.linalg.norm(g, axis=1), 1.0, atol=1e-5)
    for i, j in [(0, 1), (2, 3), (4, 5), (0, 0)]:
        rho = spearmanr(sims[i], sims[j]).statistic
        assert float(g[i] @ g[j]) == pytest.approx(rho, abs=1e-5)
    assert rank_similarity(ranks[[0]], ranks[[1]])[0] > 0.8


def test_rank_codec_bytes_and_accuracy():
    rng = np.random.default_rng(1)
    sims = rng.normal(size=(4, 100_000))
    sims[1] = sims[0] + rng.normal(scale=0.5, size=100_000)
    ranks = ranks_from_similarities(sims)
    exact = rank_similarity(ranks[[0, 2]], ranks[[1, 3]])
    c16 = RankCodec(100_000, 16)
    assert c16.step == 2 and c16.bytes_per_sentence == 200_000
    approx = rank_similarity(c16.decode(c16.encode(ranks[[0, 2]])), c16.decode(c16.encode(ranks[[1, 3]])))
    assert np.allclose(approx, exact, atol=1e-3)
    c8 = RankCodec(100_000, 8)
    coarse = rank_similarity(c8.decode(c8.encode(ranks[[0, 2]])), c8.decode(c8.encode(ranks[[1, 3]])))
    assert np.allclose(coarse, exact, atol=0.02)
    assert RankCodec(1000, 16).step == 1  # exact when the anchors fit
    with pytest.raises(ValueError):
        RankCodec(10, 12)


@pytest.mark.slow
def test_targets_from_minilm_on_real_corpus(speech_corpus):
    from sentsim.rank.targets import RankTargets, default_base_encoder, sample_anchors

    ids, texts = sample_anchors(str(speech_corpus), 300, seed=0)
    again, _ = sample_anchors(str(speech_corpus), 300, seed=0)
    assert np.array_equal(ids, again) and len(set(ids)) == 300
    rt = RankTargets(default_base_encoder(), ids, texts, bits=16)
    codes = rt.codes([
        "The economy grew and unemployment fell.",
        "Unemployment dropped as the economy expanded.",
        "We must defend our borders with a strong navy.",
    ])
    assert codes.shape == (3, 300) and codes.dtype == np.uint16
    assert sorted(codes[0].tolist()) == list(range(300))  # a permutation: exact at this size
    sim = rank_similarity(codes[[0, 0]], codes[[1, 2]])
    assert sim[0] > sim[1]  # paraphrases share their anchor neighbourhoods
    # the direct computation: Spearman of cosine similarities to the anchors
    s = rt.similarities(["The economy grew and unemployment fell.", "Unemployment dropped as the economy expanded."])
    assert sim[0] == pytest.approx(spearmanr(s[0], s[1]).statistic, abs=1e-4)
