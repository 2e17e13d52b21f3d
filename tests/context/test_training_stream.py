"""The bucketed training stream of the context models (sentsim/context/stream.py, issue 38): the same
examples as the legacy stream, far less padding, the same batches for any number of builder processes,
an exact resume, and worker errors that reach the trainer as they were raised."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from sentsim.context.batching import collate, collate_np, padding_fraction, plan_batches, token_batches
from sentsim.context.config import ContextTrainConfig
from sentsim.context.stream import (
    BatchStream,
    StopFlag,
    as_tensors,
    batch_tasks,
    build_batch,
    example_lengths,
    micro_batches_of,
    micro_batches_per_step,
)
from sentsim.context.tokenizer import train_bpe
from sentsim.context.train import _examples_of_window, train_batches, train_windows
from sentsim.context.windows import build_example, iter_documents
from sentsim.errors import UsageError

TINY_MODEL = dict(vocab_size=500, d_model=64, encoder_layers=1, decoder_layers=1, attention_heads=2, ffn_dim=128,
                  dropout=0.0, context_sentences=1, max_source_tokens=96, max_target_tokens=48)
DIRS = ["fwd", "left", "right"]


@pytest.fixture(scope="module")
def corpus_dir(speech_corpus):
    return str(speech_corpus)


@pytest.fixture(scope="module")
def tok_dir(corpus_dir, tmp_path_factory):
    tok = train_bpe((s for d in itertools.islice(iter_documents(corpus_dir, 20, "train"), 50) for s in d), 500)
    d = tmp_path_factory.mktemp("tok")
    tok.save(d)
    return str(d)


def _cfg(**kw) -> ContextTrainConfig:
    return ContextTrainConfig.model_validate({"model": TINY_MODEL, "batch_tokens": 1500, "heldout_percent": 20,
                                              "bucket_batches": 16, **kw})


def _tok(tok_dir):
    from sentsim.context.tokenizer import ContextTokenizer

    return ContextTokenizer.load(tok_dir)


def _epoch0(stream_tasks):
    return [t for t in itertools.takewhile(lambda t: t.epoch == 0, stream_tasks)]


def test_collate_np_is_the_padded_batch_row_by_row(corpus_dir, tok_dir):
    """The vectorised collation gives, row by row, <bos> + target[:-1], the target with -100 after it,
    and the source with its slots and mask: what the per-row loop of earlier versions built."""
    tok = _tok(tok_dir)
    doc = next(iter_documents(corpus_dir, 20, "train"))
    exs = [e for i in range(min(12, len(doc))) for e in _examples_of_window(doc, i, tok, _cfg(), DIRS)]
    b = collate_np(exs, tok.pad_id, tok.bos_id)
    for r, e in enumerate(exs):
        s, t = len(e.src), len(e.tgt)
        assert b["src"][r, :s].tolist() == e.src and (b["src"][r, s:] == tok.pad_id).all()
        assert b["src_slots"][r, :s].tolist() == e.src_slots and b["src_mask"][r].sum() == s
        assert b["labels"][r, :t].tolist() == e.tgt and (b["labels"][r, t:] == -100).all()
        assert b["dec_in"][r, 0] == tok.bos_id and b["dec_in"][r, 1:t].tolist() == e.tgt[:-1]
        assert (b["dec_in"][r, t:] == tok.pad_id).all()
        assert b["dec_slots"][r, 0] == 0 and b["dec_slots"][r, 1:t].tolist() == e.tgt_slots[:-1]
    assert all(v.dtype == torch.int64 for v in collate(exs, tok.pad_id, tok.bos_id).values())


def test_planned_lengths_are_the_built_examples_lengths(corpus_dir, tok_dir):
    """The reader plans batches from token counts alone; every example built later must have the planned
    source and target length, truncation included (a short max_source_tokens forces it)."""
    tok = _tok(tok_dir)
    cfg = _cfg(model={**TINY_MODEL, "max_source_tokens": 24, "max_target_tokens": 12})
    tasks = list(itertools.islice(batch_tasks(corpus_dir, tok, cfg, DIRS, 0, 1, seed=0), 40))
    assert sum(len(t.window) for t in tasks) > 500
    for t in tasks:
        build_batch(t, tok.ids, cfg, DIRS)  # raises when a length differs
    lengths = np.array([[3, 0, 30]])
    s, t = example_lengths(lengths, "fwd", 24, 12)
    assert s.tolist() == [-1] and t.tolist() == [-1]  # an empty centre: no fwd example


def test_one_pass_holds_the_legacy_streams_examples_with_less_padding(corpus_dir, tok_dir):
    """Epoch 0 of the bucketed stream holds exactly the examples of the legacy stream's first pass (the
    same windows, each once), in batches far less padded."""
    tok = _tok(tok_dir)
    cfg = _cfg()
    tasks = _epoch0(batch_tasks(corpus_dir, tok, cfg, DIRS, 0, 1, seed=3))
    steps = [build_batch(t, tok.ids, cfg, DIRS) for t in tasks]
    new = [b for step in steps for b in micro_batches_of(step)]
    assert len(new) > len(steps)  # several micro-batches a step
    k = micro_batches_per_step(cfg)
    assert all(sum(b["src"].size + b["labels"].size for b in micro_batches_of(step)) <= cfg.batch_tokens
               for step in steps)

    def rows(b):
        return Counter((tuple(s[m > 0]), tuple(lab[lab >= 0])) for s, m, lab in zip(b["src"], b["src_mask"],
                                                                                    b["labels"]))

    legacy = Counter()
    for doc, i in train_windows(corpus_dir, cfg, 0, 1, seed=3, epoch=0):
        for e in _examples_of_window(doc, i, tok, cfg, DIRS):
            legacy[(tuple(e.src), tuple(e.tgt))] += 1
    got = Counter()
    for b in new:
        got.update(rows(b))
    assert got == legacy
    assert all(b["src"].size + b["labels"].size <= cfg.batch_tokens // k or len(b["src"]) == 1 for b in new)
    new_pad = sum(padding_fraction(b) * (b["src"].size + b["labels"].size) for b in new) / \
        sum(b["src"].size + b["labels"].size for b in new)
    old = list(itertools.islice(train_batches(corpus_dir, tok, cfg.model_copy(update={"batching": "buffer"}), DIRS,
                                              0, 1, seed=3), len(new)))
    old_pad = sum(padding_fraction(b) * (b["src"].numel() + b["labels"].numel()) for b in old) / \
        sum(b["src"].numel() + b["labels"].numel() for b in old)
    assert new_pad < 0.10 and new_pad < old_pad, (new_pad, old_pad)


def test_plan_batches_fits_the_budget_and_keeps_every_example():
    rng = np.random.default_rng(0)
    s, t = rng.integers(5, 120, 5000), rng.integers(2, 60, 5000)
    plan = plan_batches(s, t, 4096)
    assert sorted(np.concatenate(plan).tolist()) == list(range(5000))
    assert all(len(b) * (s[b].max() + t[b].max()) <= 4096 for b in plan)
    real = (s + t).sum()
    padded = sum(len(b) * (s[b].max() + t[b].max()) for b in plan)
    greedy = token_batches([type("E", (), {"src": [0] * a, "tgt": [0] * b})() for a, b in zip(s, t)], 4096)
    padded_greedy = sum(len(b) * (max(len(e.src) for e in b) + max(len(e.tgt) for e in b)) for b in greedy)
    assert 1 - real / padded < 1 - real / padded_greedy
    assert plan_batches(np.array([500]), np.array([100]), 64)[0].tolist() == [0]  # too long alone: a batch of one


@pytest.mark.slow
def test_batches_do_not_depend_on_builder_processes_and_a_resume_skips_exactly(corpus_dir, tok_dir):
    """The same batches, in the same order, from the trainer alone and from 2 builder processes; a stream
    started at position k is the uninterrupted stream from k on (the loop's resume contract)."""
    cfg = _cfg()

    def take(n, **kw):
        stream = BatchStream(corpus_dir, tok_dir, cfg, DIRS, 0, 1, seed=5, **kw)
        try:
            return list(itertools.islice(iter(stream), n))
        finally:
            stream.close()

    def same(a, b):
        return len(micro_batches_of(a)) == len(micro_batches_of(b)) and all(
            x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k]
                                         for k in x)
            for x, y in zip(micro_batches_of(a), micro_batches_of(b)))

    inline = take(30)
    parallel = take(30, workers=2)
    resumed = take(10, workers=2, skip=20)
    assert all(same(a, b) for a, b in zip(inline, parallel, strict=True))
    assert all(same(a, b) for a, b in zip(inline[20:], resumed, strict=True))
    for step in inline:
        parts = micro_batches_of(step)
        assert step["n_tgt"] == sum(int((b["labels"] >= 0).sum()) for b in parts)
        assert step["n_src"] == sum(int(b["src_mask"].sum()) for b in parts)


@pytest.mark.slow
def test_a_worker_error_reaches_the_trainer_in_one_line(corpus_dir, tok_dir):
    """No training windows (a doc_id prefix that names nothing) is the same one-line UsageError from
    the reader process as from the trainer alone, and the processes are gone after it."""
    cfg = _cfg(doc_id_prefixes=["no-such-source"])
    for workers in (0, 2):
        stream = BatchStream(corpus_dir, tok_dir, cfg, DIRS, 0, 1, seed=0, workers=workers)
        with pytest.raises(UsageError, match="no training windows among the documents with doc_id prefixes"):
            next(iter(stream))
        stream.close()
        assert not stream._procs


def _spin_on(flag) -> None:
    while not flag.is_set():
        pass


def _returns_within(seconds: float, fn) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def test_the_stop_flag_outlives_a_process_killed_while_it_reads_it():
    """A process killed in the middle of looking at the stop flag leaves nothing held: the flag is still set
    and read at once. (A multiprocessing Event, which the stream used, takes a lock shared by every process
    on each look: a process spinning on it holds that lock most of the time, and killed there, it left
    close() and the collector thread blocked on it for ever.)"""
    ctx = multiprocessing.get_context("fork")  # the spinner needs no import in the child
    for _ in range(10):
        flag = StopFlag(ctx)
        spinners = [ctx.Process(target=_spin_on, args=(flag,), daemon=True) for _ in range(2)]
        for p in spinners:
            p.start()
        time.sleep(0.05)
        for p in spinners:
            os.kill(p.pid, signal.SIGKILL)
            p.join()
        assert _returns_within(5, flag.set) and _returns_within(5, flag.is_set) and flag.is_set()


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


@pytest.mark.slow
def test_a_killed_stream_process_ends_the_iteration_and_close_returns(corpus_dir, tok_dir):
    """A builder or the reader killed (the OOM killer, a signal) at whatever point, a batch half written
    into its pipe included: the trainer gets an error naming it within a bound instead of waiting for ever,
    and close() returns within its bound with no process left."""
    cfg = _cfg()
    for victim in (1, 0):  # builder 0 (the reader is _procs[0]), then the reader
        stream = BatchStream(corpus_dir, tok_dir, cfg, DIRS, 0, 1, seed=5, workers=2)
        it = iter(stream)
        next(it)
        procs = list(stream._procs)
        _kill(procs[victim])
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="training-stream process\\(es\\) died: .*sentsim-stream-"):
            for _ in range(1000):  # the batches already made come first
                next(it)
        assert time.monotonic() - t0 < 60
        t0 = time.monotonic()
        stream.close()
        assert time.monotonic() - t0 < 30 and not any(p.is_alive() for p in procs)


@pytest.mark.slow
def test_close_returns_within_a_bound_whatever_the_processes_are_doing(corpus_dir, tok_dir):
    """Closed while its queues are full (the trainer stopped taking batches), with a builder frozen in the
    middle of whatever it was doing and a builder killed: close() returns within its bound, twice, and ends
    every process."""
    stream = BatchStream(corpus_dir, tok_dir, _cfg(), DIRS, 0, 1, seed=5, workers=2, prefetch=2)
    it = iter(stream)
    next(it)
    procs = list(stream._procs)
    time.sleep(2)  # the builders fill their queues and wait for room
    os.kill(procs[1].pid, signal.SIGSTOP)
    _kill(procs[2])
    t0 = time.monotonic()
    stream.close()
    stream.close()
    assert time.monotonic() - t0 < 30 and not any(p.is_alive() for p in procs)
    it.close()  # the generator's own close() after the stream's: nothing waits either


def test_legacy_examples_match_build_example(corpus_dir, tok_dir):
    """The builder rebuilds each window from its sentences' token ids: the same example as tokenising the
    window (the legacy path), so one tokenisation per sentence changes nothing."""
    tok = _tok(tok_dir)
    cfg = _cfg()
    doc = next(iter_documents(corpus_dir, 20, "train"))
    enc = tok.encode(doc)
    for i in range(min(20, len(doc))):
        legacy = list(_examples_of_window(doc, i, tok, cfg, DIRS))
        rebuilt = [build_example(tok.ids, 1, d, enc[max(0, i - 1):i], enc[i], enc[i + 1:i + 2], 96, 48) for d in DIRS]
        assert [(e.src, e.tgt) for e in legacy] == [(e.src, e.tgt) for e in rebuilt if e is not None]


@pytest.mark.parametrize("arch", ["bart", "warm_start"])
def test_flop_counts_match_torchs_counter(arch):
    """sentsim.context.flops counts a batch's matrix FLOPs from its shapes (for MFU): within 5% of what
    torch.utils.flop_counter counts on the model itself, forward and training step alike; and the scored
    logits are the full forward's at the target positions."""
    from torch.utils.flop_counter import FlopCounterMode

    from sentsim.context.config import ContextModelConfig
    from sentsim.context.flops import decoder_flops, encoder_flops, model_shape, training_flops
    from sentsim.context.model import build_model, warm_start_tokenizer

    torch.manual_seed(0)
    if arch == "bart":
        cfg = ContextModelConfig(vocab_size=2000, d_model=64, encoder_layers=2, decoder_layers=2, attention_heads=2,
                                 ffn_dim=256, dropout=0.0)
        from tokenizers import Tokenizer, models

        from sentsim.context.tokenizer import BPE_SPECIALS, ContextTokenizer
        raw = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*BPE_SPECIALS.values(), *map(str, range(1990))])},
                                         unk_token="<unk>"))
        tok = ContextTokenizer(raw, BPE_SPECIALS)
    else:
        cfg = ContextModelConfig(arch="warm_start", dropout=0.0)
        tok = warm_start_tokenizer(cfg)
    model = build_model(cfg, tok).eval()
    B, S, T = 4, 30, 12
    src = torch.randint(20, 1000, (B, S))
    dec = torch.randint(20, 1000, (B, T))
    labels = dec.clone()
    labels[:, 9:] = -100
    args = (src, torch.zeros_like(src), torch.ones_like(src), dec, torch.zeros_like(dec), labels)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # attention as matrix products, which the counter sees on a CPU
        with FlopCounterMode(display=False) as fwd:
            logits, targets = model.target_logits(*args)
        with FlopCounterMode(display=False) as step:
            model.train()
            lg, tg = model.target_logits(*args)
            torch.nn.functional.cross_entropy(lg.float(), tg).backward()
    shape, P = model_shape(model), int((labels >= 0).sum())
    assert encoder_flops(shape, B, S) + decoder_flops(shape, B, S, T, P) == pytest.approx(fwd.get_total_flops(),
                                                                                          rel=0.05)
    assert training_flops(shape, B, S, T, P) == pytest.approx(step.get_total_flops(), rel=0.05)
    with torch.no_grad():
        full = model.eval()(*args[:5])
    assert torch.allclose(full[labels >= 0], logits, atol=1e-5) and torch.equal(targets, labels[labels >= 0])


def test_a_step_spans_the_lengths_of_its_chunk_and_trains_as_one_batch(corpus_dir, tok_dir):
    """Each bucketed step is `micro_batches` micro-batches, each alike in length, together spread over
    the lengths of the chunk (a step alike in length trained behind the legacy stream,
    bench/stream_quality.py); the step's loss is the loss of the same examples in one batch."""
    from sentsim.context.model import build_model
    from sentsim.context.train import ContextTrainee, to_device, token_loss

    tok = _tok(tok_dir)
    cfg = _cfg(micro_batches=4)
    steps = [build_batch(t, tok.ids, cfg, DIRS) for t in _epoch0(batch_tasks(corpus_dir, tok, cfg, DIRS, 0, 1, 3))]
    sizes = [len(micro_batches_of(s)) for s in steps]
    assert max(sizes) == 4 and np.mean(sizes) > 3  # a chunk's shortfall is spread: 4 or 3 micro-batches a step
    full = [s for s in steps if len(micro_batches_of(s)) == 4]
    mean_tgt = [[float((b["labels"] >= 0).sum(1).mean()) for b in micro_batches_of(s)] for s in full]
    every = sorted(x for m in mean_tgt for x in m)
    # a step's micro-batches spread over most of the chunk's range of target lengths, not one bucket
    assert np.median([max(m) - min(m) for m in mean_tgt]) > 0.5 * (every[-1] - every[0])
    one = full[0]
    exs = []  # the step's examples rebuilt from its padded micro-batches
    for b in micro_batches_of(one):
        for src, mask, slots, lab, dslots in zip(b["src"], b["src_mask"], b["src_slots"], b["labels"],
                                                 b["dec_slots"]):
            t = lab[lab >= 0].tolist()
            tgt_slots = dslots[1:len(t)].tolist() + [0]  # the last is never an input
            exs.append(type("E", (), {"src": src[mask > 0].tolist(), "src_slots": slots[mask > 0].tolist(),
                                      "tgt": t, "tgt_slots": tgt_slots})())
    merged = collate_np(exs, tok.pad_id, tok.bos_id)
    assert merged["labels"].size + merged["src"].size > sum(b["labels"].size + b["src"].size
                                                            for b in micro_batches_of(one))  # the padding saved
    model = build_model(ContextTrainConfig.model_validate({"model": TINY_MODEL}).model, tok, seed=0)
    trainee = ContextTrainee(model, cfg, tok, corpus_dir, DIRS, None)
    with torch.no_grad():
        step_loss, _ = trainee.forward(as_tensors(one), torch.device("cpu"))
        whole = token_loss(model, to_device(merged, "cpu"))
    assert abs(float(step_loss) - float(whole)) < 1e-4
