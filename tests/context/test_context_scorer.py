"""ContextScorer: exactness of batched teacher-forced scoring, Eq. 3 and the Table 8 switches."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sentsim.context.batching import collate_np, padded_index, plan_batches
from sentsim.context.config import DIRECTIONS, ContextModelConfig, ScorerConfig
from sentsim.context.example_arrays import build_examples
from sentsim.context.model import build_model, load_bundle, save_bundle, warm_start_tokenizer
from sentsim.context.scorer import ContextItem, ContextScorer
from sentsim.context.tokenizer import train_bpe
from sentsim.context.windows import build_example, iter_documents, windows_of
from sentsim.errors import UsageError
from sentsim.hardware import cpu_bf16_native

TINY = dict(vocab_size=600, d_model=48, encoder_layers=1, decoder_layers=1, attention_heads=2, ffn_dim=96,
            dropout=0.0, context_sentences=2, max_source_tokens=96, max_target_tokens=40)


# Exactness (batched = one at a time = a hand-summed log-softmax) is an fp32 property: on a CPU with native
# bf16, `autocast: auto` scores in bf16, where a batch's padding changes the rounding. These tests pin fp32;
# test_cpu_bf16_matches_fp32 and tests/cli/test_hardware.py cover the bf16 path.
FP32 = dict(device="cpu", autocast="off")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus_dir(speech_corpus):
    return str(speech_corpus)


@pytest.fixture(scope="module")
def docs(corpus_dir):
    return list(iter_documents(corpus_dir, 10.0, "all"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, docs):
    tok = train_bpe((s for d in docs for s in d), TINY["vocab_size"])
    cfg = ContextModelConfig(**TINY)
    model = build_model(cfg, tok, seed=1)
    out = tmp_path_factory.mktemp("bundle")
    save_bundle(out, cfg, tok, {"shared": model}, {"fwd": "shared", "left": "shared", "right": "shared"})
    return str(out)


@pytest.fixture(scope="module")
def items(docs):
    out = []
    for d in docs[:6]:
        for lc, s, rc in list(windows_of(d, 2))[:8]:
            out.append(ContextItem(s, lc, rc))
    # defined behaviour: empty sentence, document edges, an over-long sentence
    out.append(ContextItem("", ["A left sentence."], ["A right sentence."]))
    out.append(ContextItem("Nothing on either side.", [], []))
    out.append(ContextItem(" ".join(["word"] * 300), ["Left."], ["Right."]))
    return out


def test_batched_equals_one_at_a_time(bundle, items):
    scorer = ContextScorer(bundle, ScorerConfig(**FP32, batch_tokens=2048))
    batched = scorer.score(items)
    assert batched.stats["padding_fraction"] < 0.5
    for i in range(0, len(items), 5):
        single = scorer.score([items[i]])
        for d in ("fwd", "left", "right"):
            a, b = batched.logprob[d][i], single.logprob[d][0]
            if math.isnan(b):
                assert math.isnan(a)
            else:
                assert a == pytest.approx(b, abs=1e-4), (i, d)
        assert batched.n_tokens["fwd"][i] == single.n_tokens["fwd"][0]
    # a tiny budget (one item per batch) gives the same numbers as a large one
    small = ContextScorer(bundle, ScorerConfig(**FP32, batch_tokens=16)).score(items)
    np.testing.assert_allclose(small.score, batched.score, atol=1e-4)


def _as_list(ctx) -> list:
    """How the scorer took a context before its examples were built in numpy (main at e3dd5d2)."""
    if ctx is None:
        return []
    if isinstance(ctx, str):
        return [ctx] if ctx.strip() else []
    return [c for c in ctx if c and c.strip()]


def _random_items(docs, n: int, seed: int) -> list:
    """Items as a harvest and a caller may give them: edges of documents, several or no context sentences,
    a context as one string, blank and None entries, empty and over-long sentences, repeated contexts, tuples."""
    rng = random.Random(seed)
    pool = [x for d in docs for x in d if x.strip()]
    odd = ["", "   ", None, " ".join(["word"] * 150), "Short."]

    def ctx():
        r = rng.random()
        if r < 0.1:
            return None
        if r < 0.15:
            return rng.choice(["", "  ", rng.choice(pool)])  # one string
        return [rng.choice(pool) if rng.random() < 0.85 else rng.choice(odd) for _ in range(rng.randrange(0, 5))]

    shared = [(ctx(), ctx()) for _ in range(8)]  # contexts that many sentences are scored against
    items = []
    for _ in range(n):
        sent = rng.choice(pool) if rng.random() < 0.85 else rng.choice(odd + [" ".join(["long"] * 80)])
        left, right = rng.choice(shared) if rng.random() < 0.4 else (ctx(), ctx())
        items.append(ContextItem(sent, left, right) if rng.random() < 0.8 else (sent, left, right))
    return items


@pytest.mark.parametrize("k,max_source,max_target", [(1, 96, 40), (2, 96, 40), (3, 24, 8), (2, 12, 4)])
def test_vectorised_examples_equal_build_example(bundle, docs, k, max_source, max_target):
    """Every (item, direction) example the scorer builds in numpy is `build_example`'s, token for token, slots
    and truncation counts included; an item gets an example in a direction exactly when build_example gives
    one; items with the same source share one encoder row; the padded batches are `collate_np`'s."""
    _, tok, _ = load_bundle(bundle)
    cfg = ContextModelConfig(**{**TINY, "context_sentences": k, "max_source_tokens": max_source,
                                "max_target_tokens": max_target})
    scorer = ContextScorer((cfg, tok, {}), ScorerConfig(**FP32))
    items = _random_items(docs, 400, seed=k * 1000 + max_source)
    table, centre, left, right, _ = scorer._layout(items)
    ex = build_examples(table, tok.ids, k, DIRECTIONS, centre, left, right, max_source, max_target)

    def ids(texts):
        return tok.encode(texts)

    want = {}
    for i, it in enumerate(items):
        it = it if isinstance(it, ContextItem) else ContextItem(*it)
        lt, rt = ids(_as_list(it.left)), ids(_as_list(it.right))
        for d in DIRECTIONS:
            e = build_example(tok.ids, k, d, lt, ids([it.sentence or ""])[0], rt, max_source, max_target)
            if e is not None:
                want[(i, d)] = e
    got = {(int(ex.item[q]), DIRECTIONS[ex.direction[q]]): ex.example(q) for q in range(len(ex))}
    assert set(got) == set(want)
    for key, e in want.items():
        assert got[key] == e, key
    if max_source < 30:
        assert ex.fallbacks > 0 and any(e.src_truncated for e in want.values())
        assert any(e.tgt_truncated for e in want.values())
    distinct = {(tuple(e.src), tuple(e.src_slots)) for e in want.values()}
    if not any(e.src_truncated for e in want.values()):
        assert len(ex.src) == len(distinct)
    else:  # the key is the texts: two long texts cut to the same tokens are encoded twice (harmless)
        assert len(distinct) <= len(ex.src) < len(ex)
    for q in range(len(ex)):  # jobs that share an encoder row have the same source
        assert ex.src.row(int(ex.job_src[q])) == (want[(int(ex.item[q]), DIRECTIONS[ex.direction[q]])].src,
                                                  want[(int(ex.item[q]), DIRECTIONS[ex.direction[q]])].src_slots)
    # the padded batches, cut as the scorer cuts them on the device, are collate_np's
    src_flat = torch.from_numpy(np.concatenate([ex.src.tokens, [tok.pad_id]]).astype(np.int64))
    src_slots = torch.from_numpy(np.concatenate([ex.src.slots, [0]]).astype(np.int64))
    tgt_flat = torch.from_numpy(np.concatenate([ex.tgt.tokens, [tok.pad_id, tok.bos_id]]).astype(np.int64))
    tgt_slots = torch.from_numpy(np.concatenate([ex.tgt.slots, [0, 0]]).astype(np.int64))
    n_tgt = len(ex.tgt.tokens)
    rng = np.random.default_rng(0)
    for _ in range(5):
        rows = np.sort(rng.choice(len(ex), size=min(37, len(ex)), replace=False))
        ref = collate_np([ex.example(q) for q in rows], tok.pad_id, tok.bos_id)
        srows = ex.job_src[rows]
        S, T = ref["src"].shape[1], ref["labels"].shape[1]
        at, real = padded_index(torch.from_numpy(ex.src.offsets[srows]), torch.from_numpy(ex.src.lengths[srows]),
                                torch.arange(S), len(ex.src.tokens))
        np.testing.assert_array_equal(src_flat[at].numpy(), ref["src"])
        np.testing.assert_array_equal(src_slots[at].numpy(), ref["src_slots"])
        np.testing.assert_array_equal(real.long().numpy(), ref["src_mask"])
        at, real = padded_index(torch.from_numpy(ex.tgt.offsets[rows]), torch.from_numpy(ex.tgt.lengths[rows]),
                                torch.arange(T), n_tgt, shift=1)
        at[:, 0] = n_tgt + 1
        np.testing.assert_array_equal(tgt_flat[at].numpy(), ref["dec_in"])
        np.testing.assert_array_equal(tgt_slots[at].numpy(), ref["dec_slots"])
        np.testing.assert_array_equal(real.numpy(), ref["labels"] >= 0)


def test_scoring_plan_pads_little_and_keeps_every_example():
    """The scorer's batch plan: every example once, within the budget, and at most ~10% padding where the
    lengths allow it with batches of at least budget/16 real tokens; the training plan is unchanged."""
    rng = np.random.default_rng(1)
    s = np.concatenate([rng.integers(15, 60, 1500), rng.integers(60, 190, 100)])
    t = np.concatenate([rng.integers(3, 40, 1500), rng.integers(40, 96, 100)])
    budget = 16384
    for weights in ((1.0, 1.0), (1.0, 7.0), (1.0, 0.0)):
        tt = t if weights[1] else np.zeros_like(t)
        plan = plan_batches(s, tt, budget, max_padding=0.1, min_tokens=budget // 16, weights=weights)
        assert sorted(np.concatenate(plan).tolist()) == list(range(len(s)))
        assert all(len(b) * (s[b].max() + tt[b].max()) <= budget for b in plan)
        ws, wt = weights
        padded = sum(len(b) * (ws * s[b].max() + wt * tt[b].max()) for b in plan)
        assert 1 - (ws * s.sum() + wt * tt.sum()) / padded <= 0.10, weights
        plain = plan_batches(s, tt, budget)
        plain_padded = sum(len(b) * (ws * s[b].max() + wt * tt[b].max()) for b in plain)
        assert padded < plain_padded
        assert sum(int(s[b].sum() + tt[b].sum()) < budget // 16 for b in plan) <= 1  # a short tail at most


def test_shared_encoder_output(bundle, items):
    scorer = ContextScorer(bundle, ScorerConfig(**FP32, ablation="no_both"))
    sents = [it.sentence for it in items[:10]]
    ctxs = [(it.left, it.right) for it in items[10:14]]
    res = scorer.score_matrix(sents, ctxs)
    # fwd only: one encoder pass per distinct context, one decoder pass per (sentence, context)
    assert res.stats["encoder_rows"] == len({(tuple(left), tuple(right)) for left, right in ctxs})
    assert res.stats["decoder_rows"] == len(sents) * len(ctxs)
    one = scorer.score([ContextItem(sents[3], *ctxs[2])])
    assert res.score.reshape(len(sents), len(ctxs))[3, 2] == pytest.approx(one.score[0], abs=1e-4)


def test_logprob_equals_manual_token_sum(bundle, items):
    cfg, tok, models = load_bundle(bundle)
    model = models["fwd"].eval()
    it = items[3]
    scorer = ContextScorer(bundle, ScorerConfig(**FP32))
    res = scorer.score([it])
    for d in ("fwd", "left", "right"):
        ex = build_example(tok.ids, cfg.context_sentences, d, tok.encode(it.left), tok.encode([it.sentence])[0],
                           tok.encode(it.right), cfg.max_source_tokens, cfg.max_target_tokens)
        src = torch.tensor([ex.src])
        with torch.no_grad():
            logits = model(src, torch.tensor([ex.src_slots]), torch.ones_like(src),
                           torch.tensor([[tok.bos_id] + ex.tgt[:-1]]), torch.tensor([[0] + ex.tgt_slots[:-1]]))
        lsm = F.log_softmax(logits[0].double(), dim=-1)
        manual = sum(float(lsm[t, y]) for t, y in enumerate(ex.tgt))
        assert res.logprob_sum[d][0] == pytest.approx(manual, abs=1e-3)
        assert res.n_tokens[d][0] == len(ex.tgt)
        assert res.logprob[d][0] == pytest.approx(manual / len(ex.tgt), abs=1e-4)


def test_edge_cases_defined(bundle, items):
    scorer = ContextScorer(bundle, ScorerConfig(**FP32))
    res = scorer.score(items[-3:] + [ContextItem("A sentence.", "", "", log_p_disc=-0.5)])
    empty_s, no_ctx, long_s, with_disc = range(4)
    assert math.isnan(res.logprob["fwd"][empty_s]) and "fwd" in res.dropped[empty_s]
    assert np.isfinite(res.logprob["left"][empty_s]) and np.isfinite(res.score[empty_s])
    assert set(res.dropped[no_ctx]) == {"disc", "left", "right"} and np.isfinite(res.score[no_ctx])
    assert res.truncated["fwd"][long_s] > 0 and res.stats["truncated_items_fwd"] >= 1
    assert np.isfinite(res.score[long_s])
    assert "disc" not in res.dropped[with_disc]
    # no term left: NaN, never a division by zero
    only_fwd = ContextScorer(bundle, ScorerConfig(**FP32, ablation="no_both", lambda_disc=0.0))
    r = only_fwd.score([ContextItem("", ["x"], ["y"])])
    assert math.isnan(r.score[0])


def test_table8_switches(bundle, items):
    its = [ContextItem(i.sentence, i.left, i.right, log_p_disc=-0.25 - 0.01 * n) for n, i in enumerate(items[:12])
           if i.left and i.right and i.sentence]
    base = ContextScorer(bundle, ScorerConfig(**FP32, lambda_disc=0.5, lambda_fwd=1.0,
                                              lambda_left=0.7, lambda_right=0.3))
    full = base.score(its)
    lp = full.logprob
    disc = np.array([i.log_p_disc for i in its])
    np.testing.assert_allclose(full.score, 0.5 * disc + lp["fwd"] + 0.7 * lp["left"] + 0.3 * lp["right"], atol=1e-9)
    expect = {
        "no_discriminative": lp["fwd"] + 0.7 * lp["left"] + 0.3 * lp["right"],
        "no_left": 0.5 * disc + lp["fwd"] + 0.3 * lp["right"],
        "no_right": 0.5 * disc + lp["fwd"] + 0.7 * lp["left"],
        "no_both": 0.5 * disc + lp["fwd"],
    }
    for ab, want in expect.items():
        cfg = base.config.model_copy(update={"ablation": ab})
        got = ContextScorer(bundle, cfg).score(its)
        np.testing.assert_allclose(got.score, want, atol=1e-4, err_msg=ab)
        assert not any(got.dropped), ab  # ablated terms are switched off, not "dropped"
    # without a discriminator value the λ1 term is dropped and recorded
    nodisc = base.score([ContextItem(i.sentence, i.left, i.right) for i in its])
    assert all(d == ("disc",) for d in nodisc.dropped)
    np.testing.assert_allclose(nodisc.score, full.score - 0.5 * disc, atol=1e-4)


def test_refuses_mismatched_checkpoints(bundle, tmp_path, docs):
    import shutil

    # a tokenizer.json swapped under a model
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    other = train_bpe((s for d in docs[:3] for s in d), 400)
    other.tokenizer.save(str(bad / "tokenizer.json"))
    with pytest.raises(UsageError, match="tokenizer"):
        ContextScorer(str(bad))
    # two bundles with different tokenizers cannot be combined
    cfg = ContextModelConfig(**{**TINY, "vocab_size": 400})
    second = tmp_path / "second"
    save_bundle(second, cfg, other, {"left": build_model(cfg, other)}, {"left": "left"})
    with pytest.raises(UsageError):
        ContextScorer([bundle, str(second)])
    # a config that does not match what the caller expects
    with pytest.raises(UsageError, match="context_sentences"):
        load_bundle(bundle, expect=ContextModelConfig(**{**TINY, "context_sentences": 1}))


def test_separate_models_and_missing_direction(bundle, tmp_path, items):
    cfg, tok, models = load_bundle(bundle)
    fwd_only = tmp_path / "fwd"
    save_bundle(fwd_only, cfg, tok, {"fwd": models["fwd"]}, {"fwd": "fwd"})
    left = tmp_path / "left"
    save_bundle(left, cfg, tok, {"left": build_model(cfg, tok, seed=3)}, {"left": "left"})
    sc = ContextScorer([str(fwd_only), str(left)], ScorerConfig(**FP32))
    assert sc.directions == ("fwd", "left")
    res = sc.score(items[:4])
    assert all("right" in d for d in res.dropped)
    ref = ContextScorer(bundle, ScorerConfig(**FP32)).score(items[:4])
    np.testing.assert_allclose(res.logprob["fwd"], ref.logprob["fwd"], atol=1e-5)


def test_warm_start_scoring(tmp_path, items):
    cfg = ContextModelConfig(arch="warm_start", context_sentences=2, max_source_tokens=96, max_target_tokens=40,
                             dropout=0.0)
    tok = warm_start_tokenizer(cfg)
    model = build_model(cfg, tok)
    save_bundle(tmp_path, cfg, tok, {"shared": model}, {"fwd": "shared", "left": "shared", "right": "shared"})
    sc = ContextScorer(str(tmp_path), ScorerConfig(**FP32, batch_tokens=1024))
    its = items[:3]
    res = sc.score(its)
    assert np.isfinite(res.score).all()
    one = sc.score([its[1]])
    assert res.logprob["fwd"][1] == pytest.approx(one.logprob["fwd"][0], abs=1e-4)


@pytest.mark.skipif(not cpu_bf16_native(), reason="this CPU has no native bf16 (auto scores in fp32 here)")
def test_cpu_bf16_matches_fp32(bundle, items):
    """Where the CPU has bf16, `auto` scores in it; each item's score stays within bf16's precision of
    fp32's, and the items keep their order (issue 15's bar for bf16 as the default: Spearman >= 0.99)."""
    from scipy.stats import spearmanr

    auto = ContextScorer(bundle, ScorerConfig(device="cpu"))
    assert auto.autocast_dtype == torch.bfloat16
    bf16 = auto.score(items)
    fp32 = ContextScorer(bundle, ScorerConfig(**FP32)).score(items)
    ok = np.isfinite(fp32.score)
    assert (np.isfinite(bf16.score) == ok).all()
    np.testing.assert_allclose(bf16.score[ok], fp32.score[ok], atol=0.1, rtol=0.02)
    assert not np.array_equal(bf16.score[ok], fp32.score[ok])  # it did run in bf16
    assert spearmanr(bf16.score[ok], fp32.score[ok]).statistic >= 0.99


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_matches_cpu(bundle, items):
    cpu = ContextScorer(bundle, ScorerConfig(**FP32)).score(items)
    gpu = ContextScorer(bundle, ScorerConfig(device="cuda", autocast="bf16")).score(items)
    ok = np.isfinite(cpu.score)
    assert np.isfinite(gpu.score[ok]).all()
    # bf16 has ~3 significant digits; the per-token mean log-prob stays close
    np.testing.assert_allclose(gpu.score[ok], cpu.score[ok], atol=0.1, rtol=0.02)
    fp32 = ContextScorer(bundle, ScorerConfig(device="cuda", autocast="off")).score(items)
    np.testing.assert_allclose(fp32.score[ok], cpu.score[ok], atol=1e-3)


@pytest.mark.slow
def test_compiled_scoring_gives_the_same_scores_and_compiles_once_for_every_batch_shape(bundle, items):
    """scoring.compile (for GPUs) compiles the encoder and the decoder's log-probabilities once each, with
    dynamic shapes: batches of new rows and lengths reuse the graphs, and the scores are the eager ones."""
    from torch._dynamo.utils import counters

    eager = ContextScorer(bundle, ScorerConfig(**FP32, batch_tokens=1024))
    comp = ContextScorer(bundle, ScorerConfig(**FP32, batch_tokens=1024, compile=True))
    torch._dynamo.reset()
    counters.clear()
    batches = 0
    for its in (items, items[:9], items[5:]):
        a, b = eager.score(its), comp.score(its)
        for d in DIRECTIONS:
            np.testing.assert_allclose(b.logprob_sum[d], a.logprob_sum[d], rtol=1e-5, atol=1e-4)
        batches += b.stats["encoder_batches"] + b.stats["decoder_batches"]
    graphs = counters["stats"]["unique_graphs"]
    assert 2 <= graphs <= 4 < batches, (graphs, batches)  # a batch of one row may be specialised once
