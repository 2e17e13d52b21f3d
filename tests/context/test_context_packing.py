"""Packed training rows (`pack_tokens`): several examples back to back in a row, each seeing only itself
(segment ids, as T5 packs examples), give the loss, the per-token log-probabilities and the gradients of
the same examples padded one to a row; the stream packs every example of a pass once; a packed stream
trains; and the settings that cannot pack are refused in one line."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from sentsim.context.batching import collate, collate_packed_np, pack_rows
from sentsim.context.config import ContextModelConfig, ContextTrainConfig
from sentsim.context.model import build_model, segment_positions
from sentsim.context.windows import Example

TINY = dict(vocab_size=300, d_model=32, encoder_layers=2, decoder_layers=2, attention_heads=2, ffn_dim=64,
            dropout=0.0, context_sentences=1, max_source_tokens=48, max_target_tokens=24)
STREAM_MODEL = dict(vocab_size=500, d_model=64, encoder_layers=1, decoder_layers=1, attention_heads=2, ffn_dim=128,
                    dropout=0.0, context_sentences=1, max_source_tokens=96, max_target_tokens=48)
DIRS = ["fwd", "left", "right"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _examples(n: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s, t = rng.randint(4, 48), rng.randint(2, 24)
        out.append(Example([rng.randrange(3, 300) for _ in range(s)], [rng.randrange(4) for _ in range(s)],
                           [rng.randrange(3, 300) for _ in range(t)], [rng.randrange(4) for _ in range(t)]))
    return out


def _tiny_model(attention: str = "sdpa"):
    tok = SimpleNamespace(vocab_size=300, pad_id=0, bos_id=1, eos_id=2)
    model = build_model(ContextModelConfig(**TINY), tok, seed=0).float()
    model.use_attention(attention)
    return model.train()  # dropout 0: training mode computes what eval mode does


def _loss_and_logprobs(model, batch: dict):
    from sentsim.context.train import to_device, token_loss

    b = to_device(batch, "cpu")
    loss = token_loss(model, b, reduction="sum")
    logits, targets = model.target_logits(b["src"], b["src_slots"], b["src_mask"], b["dec_in"], b["dec_slots"],
                                          b["labels"])
    return loss, torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0], targets


# flex: FlexAttention with block masks from the segment ids (compiled by transformers: half a minute on a CPU)
@pytest.mark.parametrize("attention", ["sdpa", "eager", "flex"])
def test_packed_rows_give_the_loss_logprobs_and_gradients_of_the_same_examples_unpacked(attention):
    exs = _examples(9)
    sizes = [3, 1, 2, 3]  # rows of several examples of different lengths, and one alone
    torch.manual_seed(0)
    model = _tiny_model(attention)
    with torch.no_grad():  # a trained-looking sentence-position table and logits bias, not the zero/init ones
        model.sentence_positions.weight.normal_(0, 0.5)
    plain = collate(exs, 0, 1)
    packed = {k: torch.from_numpy(v.astype(np.int64)) for k, v in collate_packed_np(exs, sizes, 0, 1).items()}
    assert packed["src"].shape[0] == 4 and packed["src_mask"].shape[1] == packed["src"].shape[1] + \
        packed["labels"].shape[1]
    # the packed row is wider than the position table: padding gets position 0, every token its own position
    assert packed["src"].shape[1] > TINY["max_source_tokens"] + 2

    # FlexAttention has no backward on a CPU (torch raises NotImplementedError): flex checks the forward pass,
    # its gradients are the GPU's to check (bench/gpu.py trains with it). Its padded rows are the reference in
    # sdpa: transformers' own FlexAttention over padded rows (not sentsim's segment masks, which this checks)
    # gives decoder states of NaN now and then on a CPU without AVX-512 (torch 2.13: 3 of 30 passes over the same
    # batch on an AMD EPYC), where the packed rows' block masks gave the sdpa figures in each of 40 passes.
    backward = attention != "flex"
    results = []
    for batch, kernel in ((plain, "sdpa" if attention == "flex" else attention), (packed, attention)):
        model.use_attention(kernel)
        model.zero_grad()
        with torch.set_grad_enabled(backward):
            loss, logp, targets = _loss_and_logprobs(model, batch)
        if backward:
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), logp.detach(), targets, grads))
    (l0, p0, t0, g0), (l1, p1, t1, g1) = results
    assert torch.equal(t0, t1)  # the same target tokens, in the same order
    assert abs(float(l0) - float(l1)) <= 1e-5 * max(1.0, abs(float(l0)))
    torch.testing.assert_close(p1, p0, atol=1e-5, rtol=0)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_packed_example_does_not_see_its_neighbours():
    """Changing one example of a row changes no other example's log-probabilities (and does change its own)."""
    exs = _examples(3, seed=1)
    model = _tiny_model().eval()
    other = list(exs)
    other[0] = Example([7] * len(exs[0].src), exs[0].src_slots, [9] * len(exs[0].tgt), exs[0].tgt_slots)
    with torch.no_grad():
        logps = []
        for row in (exs, other):
            batch = {k: torch.from_numpy(v.astype(np.int64)) for k, v in collate_packed_np(row, [3], 0, 1).items()}
            logps.append(_loss_and_logprobs(model, batch)[1])
    n0 = len(exs[0].tgt)
    torch.testing.assert_close(logps[0][n0:], logps[1][n0:], atol=1e-6, rtol=0)
    assert not torch.allclose(logps[0][:n0], logps[1][:n0])


def test_segment_positions_restart_in_each_example_and_are_zero_at_padding():
    seg = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    assert segment_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 0], [0, 1, 2, 3, 4, 5, 6, 7]]


def test_pack_rows_places_every_example_once_within_the_rooms():
    rng = np.random.default_rng(0)
    s, t = rng.integers(5, 60, 500), rng.integers(2, 30, 500)
    rows = pack_rows(s, t, 120, 60)
    placed = np.concatenate(rows)
    assert sorted(placed.tolist()) == list(range(500))
    assert all(s[r].sum() <= 120 and t[r].sum() <= 60 for r in rows)
    fill = (s.sum() + t.sum()) / (len(rows) * 180)
    assert fill > 0.85, fill  # open rows take the short examples that fit their gaps


# ------------------------------------------------------------------------------------------------- config


def _train_cfg(**kw) -> ContextTrainConfig:
    return ContextTrainConfig.model_validate({"model": STREAM_MODEL, "batch_tokens": 1500, "heldout_percent": 20,
                                              "bucket_batches": 16, **kw})


@pytest.mark.parametrize("setting, says", [
    ({"pack_tokens": -1}, "pack_tokens must be 0 (no packing) or a positive row length"),
    ({"pack_tokens": 100}, "must hold the longest example"),
    ({"pack_tokens": 2000}, "is more than a batch holds"),
    ({"pack_tokens": 400, "batching": "buffer"}, "pack_tokens needs batching=bucketed"),
    ({"pack_tokens": 400, "model": {**STREAM_MODEL, "arch": "warm_start", "vocab_size": 30522}},
     "pack_tokens needs model.arch=bart"),
    ({"attention": "flex", "model": {**STREAM_MODEL, "arch": "warm_start", "vocab_size": 30522}},
     "attention=flex needs model.arch=bart"),
])
def test_settings_that_cannot_pack_are_refused_in_one_line(setting, says):
    with pytest.raises(ValidationError) as err:
        _train_cfg(**setting)
    msgs = [e["msg"] for e in err.value.errors()]
    assert len(msgs) == 1 and says in msgs[0] and "\n" not in msgs[0]


def test_packing_is_off_by_default():
    assert ContextTrainConfig().pack_tokens == 0 and ContextTrainConfig().attention == "sdpa"


def test_flex_attention_on_a_cpu_is_refused_before_any_work(speech_corpus, tmp_path):
    from sentsim.context.train import train_context
    from sentsim.errors import UsageError

    cfg = _train_cfg(pack_tokens=500, attention="flex", executor="inline", use_gpu="no")
    with pytest.raises(UsageError, match="attention=flex trains on a GPU only"):
        train_context(str(speech_corpus), str(tmp_path / "out"), cfg)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------- stream


@pytest.fixture(scope="module")
def tok_dir(speech_corpus, tmp_path_factory):
    from sentsim.context.tokenizer import train_bpe
    from sentsim.context.windows import iter_documents

    docs = itertools.islice(iter_documents(str(speech_corpus), 20, "train"), 50)
    tok = train_bpe((s for d in docs for s in d), 500)
    d = tmp_path_factory.mktemp("tok")
    tok.save(d)
    return str(d)


def test_a_packed_pass_holds_the_padded_streams_examples_in_full_rows(speech_corpus, tok_dir):
    from sentsim.context.stream import batch_tasks, build_batch, micro_batches_of
    from sentsim.context.tokenizer import ContextTokenizer

    tok = ContextTokenizer.load(tok_dir)
    corpus = str(speech_corpus)

    def epoch0(cfg):
        return list(itertools.takewhile(lambda t: t.epoch == 0, batch_tasks(corpus, tok, cfg, DIRS, 0, 1, 3)))

    plain, packed = epoch0(_train_cfg(micro_batches=2)), epoch0(_train_cfg(micro_batches=2, pack_tokens=500))

    def examples(tasks):  # each example by its lengths and direction
        return sorted(zip(*(np.concatenate(x).tolist() for x in zip(*((t.src_len, t.tgt_len, t.direction)
                                                                         for t in tasks)))))

    assert examples(plain) == examples(packed)  # the same examples, each once
    real = padded = rows = 0
    for task in packed[:20]:
        for b in micro_batches_of(build_batch(task, tok.ids, _train_cfg(pack_tokens=500), DIRS)):
            S = b["src"].shape[1]
            assert b["src_mask"].shape[1] == S + b["labels"].shape[1] and S + b["labels"].shape[1] <= 500
            real += int((b["src_mask"][:, :S] > 0).sum() + (b["labels"] >= 0).sum())
            padded += b["src"].size + b["labels"].size
            rows += len(b["src"])
    assert sum(len(t.window) for t in packed[:20]) > 2 * rows  # several examples a row
    assert real / padded > 0.8, real / padded


def test_a_packed_stream_trains(speech_corpus, tok_dir):
    """A few Adam steps of the trainee on packed steps: the loss of a fixed packed step falls."""
    from sentsim.context.stream import as_tensors, batch_tasks, build_batch
    from sentsim.context.tokenizer import ContextTokenizer
    from sentsim.context.train import ContextTrainee

    tok = ContextTokenizer.load(tok_dir)
    cfg = _train_cfg(pack_tokens=500, micro_batches=2, lr=3e-3)
    tasks = list(itertools.islice(batch_tasks(str(speech_corpus), tok, cfg, DIRS, 0, 1, 3), 12))
    steps = [as_tensors(build_batch(t, tok.ids, cfg, DIRS)) for t in tasks]
    model = build_model(cfg.model, tok, seed=0)
    trainee = ContextTrainee(model, cfg, tok, str(speech_corpus), DIRS, None)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    cpu = torch.device("cpu")
    with torch.no_grad():
        before = float(trainee.forward(steps[0], cpu)[0])
    for _ in range(2):
        for step in steps:
            loss, _ = trainee.forward(step, cpu)
            assert torch.isfinite(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        after = float(trainee.forward(steps[0], cpu)[0])
    assert after < before - 0.5, (before, after)
