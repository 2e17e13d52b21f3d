"""The bucketed training stream of the context models (`batching: bucketed`).

Per training worker (rank r of `world`), three steps:

    reader    the corpus slices in the seeded order of `train_windows`, each slice's sentences
              tokenised once, its (document, sentence) windows in the same seeded permutation; the
              windows cut into chunks of about `bucket_batches` steps, each chunk's examples
              measured from token counts alone (no example is built), planned into micro-batches
              of near-equal source and target length (`batching.plan_batches`) and dealt into
              steps of `micro_batches` that together span the chunk's lengths (`steps_of`), the
              steps of a chunk in a seeded order; with `pack_tokens`, the chunk's examples in a seeded
              order packed several to a row instead (`packed_steps`), a step's rows mixing all lengths
    builders  each step's examples built (`windows.build_example`) and padded (`collate_np`), one
              padded batch per micro-batch
    trainer   step n from builder n % W (numpy arrays; the trainer copies them to its device)

Why micro-batches: a step whose examples are all alike in length (as a step of one length bucket is)
trained 0.07-0.15 nats behind the legacy stream at the same target tokens, in early CPU runs; the same
examples dealt 8 micro-batches to a step, each micro-batch still alike in length (little padding),
trained within the noise of the legacy stream at about its number of steps (bench/stream_quality.py).

The batch sequence depends on the corpus, tokenizer, config, seed, rank and world only, never on
the number of builder processes (`data_workers`; 0 runs all three steps in the training process).
A resumed run passes over the batches already trained on in the reader, without building them.
The legacy stream (`batching: buffer`) is `train.train_batches`.
"""

from __future__ import annotations

import itertools
import os
import queue
import random
import threading
import traceback
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from sentsim.context.batching import collate_np, collate_packed_np, pack_rows, plan_batches
from sentsim.context.config import ContextTrainConfig
from sentsim.context.windows import _water_fill, build_example, iter_slices, mix_seed, no_training_windows
from sentsim.errors import UsageError

TRAIN_SLICES = 8  # as train.TRAIN_SLICES: the same slices in the same order as the legacy stream
SOURCE_OVERHEAD = 4  # tag, two separators, </s> (windows.build_example)
PART_OF = {"left": 0, "fwd": 1, "right": 2}  # which part of (left, centre, right) a direction predicts


@dataclass
class BatchTask:
    """What a builder needs for one batch: the token ids of the windows it uses, and its examples."""

    seq: int  # position in the stream (0 = the first batch of epoch 0)
    epoch: int  # the pass over this worker's training windows it belongs to
    tokens: np.ndarray  # int32, every present window sentence's ids, window by window, slot by slot
    lengths: np.ndarray  # int32 [windows, 2k+1]: token count of the sentences at offsets -k..k (0 = none)
    window: np.ndarray  # int32 [examples]: row of `lengths`
    direction: np.ndarray  # int8 [examples]: index into the run's directions
    src_len: np.ndarray  # planned lengths, checked when the examples are built
    tgt_len: np.ndarray
    micro: np.ndarray  # int32: examples in each micro-batch, in order (the examples are micro-batch by micro-batch)
    rows: Optional[np.ndarray] = None  # int32, packed (pack_tokens): examples in each row, in order; None = padded


# ------------------------------------------------------------------------------------------------- lengths


def example_lengths(parts: np.ndarray, direction: str, max_source: int, max_target: int):
    """Source and target lengths of one direction's examples from the windows' part lengths
    [n, 3] = (left, centre, right tokens), as `build_example` makes them; -1 where there is no example
    (an empty target). The part a direction predicts is its target, and a <blank> in the source."""
    col = PART_OF[direction]
    target = parts[:, col].copy()
    src = parts.copy()
    src[:, col] = 1
    budget = max_source - SOURCE_OVERHEAD
    total = src.sum(1)
    s = total + SOURCE_OVERHEAD
    for i in np.flatnonzero(total > budget):  # rare: the water-filled truncation of build_example
        cap = _water_fill(src[i].tolist(), budget)
        s[i] = SOURCE_OVERHEAD + int(np.minimum(src[i], cap).sum())
    t = np.minimum(target + 1, max_target)
    return np.where(target > 0, s, -1), np.where(target > 0, t, -1)


# -------------------------------------------------------------------------------------------------- reader


def micro_batches_per_step(cfg: ContextTrainConfig) -> int:
    """`micro_batches`, at most as many as leave each micro-batch room for the longest example (a packed row)."""
    longest = cfg.pack_tokens or cfg.model.max_source_tokens + cfg.model.max_target_tokens
    return max(1, min(cfg.micro_batches, cfg.batch_tokens // longest))


def steps_of(plan: list, src_len: np.ndarray, tgt_len: np.ndarray, k: int) -> list[list[np.ndarray]]:
    """A chunk's micro-batches dealt into steps of at most `k`: ranked by mean target length, then mean
    source length (alike targets in a step cost most, bench/stream_quality.py), step j of m takes the
    micro-batches ranked j, j + m, j + 2m, ...: every step spans the chunk's lengths, none exceeds
    k micro-batches (so none exceeds the step's token budget)."""
    if k == 1:  # the plan's own order: a run trained before micro_batches resumes on the same steps
        return [[b] for b in plan]
    rank = np.lexsort((np.array([src_len[b].mean() for b in plan]), np.array([tgt_len[b].mean() for b in plan])))
    m = -(-len(plan) // k)
    return [[plan[rank[i]] for i in range(j, len(plan), m)] for j in range(m)]


def packed_steps(src_len: np.ndarray, tgt_len: np.ndarray, cfg: ContextTrainConfig,
                 rng: np.random.Generator) -> list[list[list[np.ndarray]]]:
    """A chunk's examples packed into rows of `pack_tokens` (`batching.pack_rows`, in a seeded order, so that
    a row and a step mix the chunk's lengths), the rows cut into micro-batches of batch_tokens / micro-batches
    tokens and those into steps: steps -> micro-batches -> rows -> example indices. Each row's source and
    target rooms split `pack_tokens` as the chunk's tokens split, each room holding the longest example."""
    size = cfg.pack_tokens
    order = rng.permutation(len(src_len))
    share = float(src_len.sum()) / max(float(src_len.sum() + tgt_len.sum()), 1.0)
    src_room = int(np.clip(round(size * share), src_len.max(), size - tgt_len.max()))
    rows = [order[r] for r in pack_rows(src_len[order], tgt_len[order], src_room, size - src_room)]
    k = micro_batches_per_step(cfg)
    per_micro = max(1, cfg.batch_tokens // k // size)
    micro = [rows[i:i + per_micro] for i in range(0, len(rows), per_micro)]
    return [micro[i:i + k] for i in range(0, len(micro), k)]


def batch_tasks(corpus: str, tok, cfg: ContextTrainConfig, directions: Sequence[str], rank: int, world: int,
                seed: int, skip: int = 0) -> Iterator[BatchTask]:
    """The endless, seeded sequence of step tasks from position `skip` on (see the module doc)."""
    k = cfg.model.context_sentences
    mc = cfg.model
    if not cfg.batch_tokens:
        raise ValueError("batch_tokens is 0 (by device): resolve it first (ContextTrainConfig.resolved_batch_tokens)")
    target_tokens = cfg.bucket_batches * cfg.batch_tokens
    k_micro = micro_batches_per_step(cfg)
    seq = 0
    for epoch in itertools.count():
        order = mix_seed(seed, epoch)
        produced = 0
        for part, docs in iter_slices(corpus, cfg.heldout_percent, "train", rank, world, order, TRAIN_SLICES,
                                      cfg.doc_id_prefixes):
            units = [(d, i) for d, doc in enumerate(docs) for i in range(len(doc))]
            if not units:
                continue
            random.Random(mix_seed(order, part)).shuffle(units)  # the legacy stream's permutation
            enc = tok.encode([s for doc in docs for s in doc])  # each sentence once
            sent_len = np.fromiter((len(e) for e in enc), np.int64, len(enc))
            flat = np.fromiter(itertools.chain.from_iterable(enc), np.int32, int(sent_len.sum()))
            tok_start = np.concatenate([[0], np.cumsum(sent_len)])
            doc_len = np.fromiter((len(doc) for doc in docs), np.int64, len(docs))
            doc_start = np.concatenate([[0], np.cumsum(doc_len)])
            d_of = np.fromiter((d for d, _ in units), np.int64, len(units))
            i_of = np.fromiter((i for _, i in units), np.int64, len(units))
            pos = i_of[:, None] + np.arange(-k, k + 1)
            present = (pos >= 0) & (pos < doc_len[d_of][:, None])
            sent = np.where(present, doc_start[d_of][:, None] + pos, -1)  # slice-wide sentence index per slot
            lens = np.where(present, sent_len[np.maximum(sent, 0)], 0)
            parts = np.stack([lens[:, :k].sum(1), lens[:, k], lens[:, k + 1:].sum(1)], axis=1)
            keep = lens[:, k] >= cfg.min_sentence_tokens
            # every (window, direction) example, window by window as the legacy stream builds them
            s_all, t_all = zip(*(example_lengths(parts, d, mc.max_source_tokens, mc.max_target_tokens)
                                 for d in directions))
            s_all, t_all = np.stack(s_all, 1), np.stack(t_all, 1)  # [windows, directions]
            exists = (s_all > 0) & keep[:, None]
            produced += int(exists.sum())
            cost = np.where(exists, s_all + t_all, 0).sum(1)  # padded-free tokens of each window
            n_chunks = max(1, int(round(cost.sum() / target_tokens)))
            bounds = np.searchsorted(np.cumsum(cost), np.arange(1, n_chunks) * cost.sum() / n_chunks)
            for c, (lo, hi) in enumerate(zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(units)]]))):
                w, dcol = np.nonzero(exists[lo:hi])
                if not len(w):
                    continue
                s, t = s_all[lo:hi][w, dcol], t_all[lo:hi][w, dcol]
                order_rng = np.random.default_rng([seed, rank, epoch, part, c])
                if cfg.pack_tokens:
                    steps = packed_steps(s, t, cfg, order_rng)
                else:
                    steps = steps_of(plan_batches(s, t, cfg.batch_tokens // k_micro), s, t, k_micro)
                for b in order_rng.permutation(len(steps)):
                    if seq >= skip:
                        yield _task(seq, epoch, steps[b], w + lo, dcol, s, t, sent, lens, flat, tok_start,
                                    packed=bool(cfg.pack_tokens))
                    seq += 1
        if produced == 0:
            raise no_training_windows(corpus, cfg, rank, world)


def _task(seq, epoch, micro, window, dcol, s, t, sent, lens, flat, tok_start, packed=False) -> BatchTask:
    packed_rows = None
    if packed:  # micro-batches of rows: each micro-batch its rows' examples, row by row
        packed_rows = np.array([len(r) for m in micro for r in m], np.int32)
        micro = [np.concatenate(m) for m in micro]
    rows = np.concatenate(micro)
    wins, local = np.unique(window[rows], return_inverse=True)
    g = sent[wins].ravel()
    g = g[g >= 0]
    tokens = (np.concatenate([flat[tok_start[x]:tok_start[x + 1]] for x in g]) if len(g)
              else np.zeros(0, np.int32))
    return BatchTask(seq, epoch, tokens, lens[wins].astype(np.int32), local.astype(np.int32),
                     dcol[rows].astype(np.int8), s[rows], t[rows], np.array([len(b) for b in micro], np.int32),
                     packed_rows)


# ------------------------------------------------------------------------------------------------- builder


def build_batch(task: BatchTask, ids: dict, cfg: ContextTrainConfig, directions: Sequence[str]) -> dict:
    """The padded (or packed) batch of a task (numpy int32, `batching.BATCH_KEYS`) plus its token counts `n_src`
    and `n_tgt`; a task of several micro-batches gives {"micro": [one such batch each], "n_src", "n_tgt"}."""
    k = cfg.model.context_sentences
    mc = cfg.model
    flat = task.tokens.tolist()
    sents, at = [], 0
    for row in task.lengths.tolist():
        cur = []
        for n in row:
            cur.append(flat[at:at + n])
            at += n
        sents.append(cur)
    exs = []
    for w, d in zip(task.window.tolist(), task.direction.tolist()):
        x = sents[w]
        exs.append(build_example(ids, k, directions[d], x[:k], x[k], x[k + 1:], mc.max_source_tokens,
                                 mc.max_target_tokens))
    if any(e is None for e in exs) or [len(e.src) for e in exs] != task.src_len.tolist() or \
            [len(e.tgt) for e in exs] != task.tgt_len.tolist():
        raise RuntimeError(f"batch {task.seq}: built examples do not have their planned lengths")
    out, at = [], 0
    row_sizes = iter(task.rows.tolist() if task.rows is not None else ())
    for n in task.micro.tolist():
        if task.rows is None:
            batch = collate_np(exs[at:at + n], ids["pad"], ids["bos"])
        else:
            sizes = [next(row_sizes)]
            while sum(sizes) < n:
                sizes.append(next(row_sizes))
            batch = collate_packed_np(exs[at:at + n], sizes, ids["pad"], ids["bos"])
        batch["n_src"] = int(task.src_len[at:at + n].sum())
        batch["n_tgt"] = int(task.tgt_len[at:at + n].sum())
        out.append(batch)
        at += n
    if len(out) == 1:
        return out[0]
    return {"micro": out, "n_src": int(task.src_len.sum()), "n_tgt": int(task.tgt_len.sum())}


def as_tensors(batch: dict) -> dict:
    """`build_batch`'s dict with torch tensors for its numpy arrays (sharing their memory)."""
    import torch

    out = {}
    for key, v in batch.items():
        if isinstance(v, np.ndarray):
            out[key] = torch.from_numpy(v)
        elif key == "micro":
            out[key] = [as_tensors(b) for b in v]
        else:
            out[key] = v
    return out


def micro_batches_of(batch: dict) -> list[dict]:
    """The padded batches of a step: its micro-batches, or the batch itself (one micro-batch, the legacy stream)."""
    return batch["micro"] if "micro" in batch else [batch]


# ------------------------------------------------------------------------------------------------- stream


class StopFlag:
    """The stop signal the stream shares with its processes: one byte of shared memory and no lock.
    A multiprocessing Event takes a lock shared by every process on each set() and is_set(); a process
    that died holding it (killed, or terminated by close) left the trainer's close() and the collector
    blocked on it forever. A process can die at any instruction holding nothing here."""

    def __init__(self, ctx):
        self._flag = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


def _reader_main(args: dict, task_queues: list, stop: StopFlag) -> None:
    """Reader process: tasks round-robin into the builders' queues (task n -> builder n % W)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # a slice's sentences in one call, on every core it may use
    w = len(task_queues)
    try:
        tok = _tokenizer(args)
        for task in batch_tasks(args["corpus"], tok, _cfg(args), args["directions"], args["rank"], args["world"],
                                args["seed"], args["skip"]):
            if not _put(task_queues[task.seq % w], ("task", task), stop):
                break
    except BaseException as exc:  # noqa: BLE001 - every builder must hear of it, or the trainer waits forever
        for q in task_queues:
            _put(q, ("error", _portable(exc)), stop)
    _leave(task_queues, stop)


def _builder_main(args: dict, tasks, results, stop: StopFlag) -> None:
    cfg, ids = _cfg(args), args["ids"]
    while not stop.is_set():
        try:
            kind, payload = tasks.get(timeout=0.5)
        except queue.Empty:
            continue
        if kind == "error":
            _put(results, ("error", payload), stop)
            break
        try:
            item = ("batch", build_batch(payload, ids, cfg, args["directions"]))
        except BaseException as exc:  # noqa: BLE001
            _put(results, ("error", _portable(exc)), stop)
            break
        if not _put(results, item, stop):
            break
    _leave([results], stop)


def _put(q, item, stop) -> bool:
    """Put `item` on `q`, waiting for room while not stopped; False when stopped first."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.5)
            return True
        except queue.Full:
            continue
    return False


def _leave(written: list, stop: StopFlag) -> None:
    """On a stop, drop what this process put that its pipes have not taken: nobody reads it any more,
    and waiting to flush it into a full pipe would keep the process alive until close() terminates it.
    Otherwise (an error passed on) the process exits only once its message is in the pipe."""
    if stop.is_set():
        for q in written:
            q.cancel_join_thread()


def _portable(exc: BaseException) -> BaseException:
    """The exception as the trainer should see it: a UsageError keeps its one line, anything else
    carries the worker's traceback."""
    if isinstance(exc, UsageError):
        return exc
    return RuntimeError(f"training-stream worker failed:\n{''.join(traceback.format_exception(exc))}")


def _cfg(args: dict) -> ContextTrainConfig:
    return ContextTrainConfig.model_validate(args["cfg"])


def _tokenizer(args: dict):
    from sentsim.context.tokenizer import ContextTokenizer

    return ContextTokenizer.load(args["tokenizer_dir"])


class BatchStream:
    """Iterator over the training steps: `build_batch`'s dicts, with int32 torch tensors for the arrays.

    `workers` 0: every step in this process. Otherwise one reader and `workers` builder processes
    (spawned: safe beside CUDA), and a thread here that takes their batches in order and keeps
    `prefetch` ready. close() (or the end of the process) stops them; it returns within a bound
    whatever state they are in, and a process that dies is an error of the iteration, not a wait."""

    GRACE_S = 5.0  # how long close() lets the processes leave by themselves before it terminates them
    POLL_S = 1.0  # how often a waiting trainer looks for dead processes

    def __init__(self, corpus: str, tokenizer_dir: str, cfg: ContextTrainConfig, directions: Sequence[str],
                 rank: int, world: int, seed: int, skip: int = 0, workers: int = 0, prefetch: int = 8):
        self.args = {"corpus": corpus, "tokenizer_dir": str(tokenizer_dir), "cfg": cfg.model_dump(),
                     "directions": list(directions), "rank": rank, "world": world, "seed": seed, "skip": skip}
        self.workers, self.prefetch = workers, prefetch
        self._procs: list = []
        self._queues: list = []
        self._stop: StopFlag | None = None  # shared with the processes
        self._collect_stop = threading.Event()  # this process's own: the collector thread's
        self._collector: threading.Thread | None = None
        self.wait_seconds = 0.0  # time the trainer waited for a batch (host-bound when large)

    def __iter__(self):
        return self._inline() if self.workers == 0 else self._parallel()

    def _inline(self) -> Iterator[dict]:
        tok = _tokenizer(self.args)
        cfg, dirs = _cfg(self.args), self.args["directions"]
        a = self.args
        for task in batch_tasks(a["corpus"], tok, cfg, dirs, a["rank"], a["world"], a["seed"], a["skip"]):
            yield as_tensors(build_batch(task, tok.ids, cfg, dirs))

    def _start(self) -> list:
        """Start the reader and builders; returns the builders' result queues."""
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        stop = self._stop = StopFlag(ctx)
        w = self.workers
        args = dict(self.args, ids=_tokenizer(self.args).ids)
        # each queue has one writer process and one reader: a process killed inside a put or get holds its
        # queue's locks, which no other process takes
        tasks = [ctx.Queue(maxsize=32) for _ in range(w)]
        results = [ctx.Queue(maxsize=4) for _ in range(w)]
        # held until the processes are gone: a queue's semaphores are unlinked when this process drops it, and
        # a spawned child that has not yet unpickled its queues would find them gone
        self._queues = tasks + results
        self._procs = [ctx.Process(target=_reader_main, args=(args, tasks, stop), daemon=True,
                                   name="sentsim-stream-reader")]
        self._procs += [ctx.Process(target=_builder_main, args=(args, tasks[i], results[i], stop), daemon=True,
                                    name=f"sentsim-stream-builder-{i}") for i in range(w)]
        for p in self._procs:
            p.start()
        return results

    def _collect(self, results: list, ready: queue.Queue) -> None:
        """Collector thread: batch n from builder n % W, the stream's order whatever the builders' speed."""
        n, w, stop = 0, len(results), self._collect_stop
        try:
            while not stop.is_set():
                try:
                    kind, payload = results[n % w].get(timeout=0.5)
                except queue.Empty:
                    continue
                if kind == "batch":
                    payload = as_tensors(payload)
                if not _put(ready, (kind, payload), stop) or kind == "error":
                    return
                n += 1
        except BaseException as exc:  # noqa: BLE001 - the trainer must hear of it, or it waits forever
            _put(ready, ("error", RuntimeError(f"training-stream collector failed: {exc!r}")), stop)

    def _died(self) -> list[str]:
        """Processes that ended other than by passing an error on (exit 0): killed, or crashed."""
        return [f"{p.name} (exit {p.exitcode})" for p in self._procs if p.exitcode not in (None, 0)]

    def _parallel(self) -> Iterator[dict]:
        import time

        results = self._start()
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        self._collect_stop = threading.Event()
        self._collector = threading.Thread(target=self._collect, args=(results, ready), daemon=True,
                                           name="sentsim-stream-collect")
        self._collector.start()
        try:
            while True:
                t0 = time.perf_counter()
                while True:
                    try:
                        kind, payload = ready.get(timeout=self.POLL_S)
                        break
                    except queue.Empty:
                        # a process killed inside a put may leave half a batch in a pipe, which the
                        # collector would wait on for ever: its death is the stream's end
                        dead = self._died()
                        if dead:
                            raise RuntimeError(f"training-stream process(es) died: {dead}") from None
                self.wait_seconds += time.perf_counter() - t0
                if kind == "error":
                    raise payload
                yield payload
        finally:
            self.close()

    def close(self) -> None:
        """Stop the collector, then the processes (each leaves at its next look at the stop flag), then
        terminate, and at last kill, any still running after GRACE_S (the reader inside a slice). Nothing
        here waits without a bound; closing twice is closing once."""
        self._collect_stop.set()
        if self._collector is not None:
            self._collector.join(timeout=self.GRACE_S)  # before any builder may leave half a batch in a pipe
            self._collector = None
        if self._stop is not None:
            self._stop.set()
        _end_processes(self._procs, self.GRACE_S)
        self._procs, self._queues = [], []


def _end_processes(procs: list, grace: float) -> None:
    import time

    procs = [p for p in procs if p.pid is not None]  # started
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for end in ("terminate", "kill"):
        for p in procs:
            if p.is_alive():
                getattr(p, end)()
        for p in procs:
            p.join(timeout=grace)


def resolve_workers(setting: int, device_type: str, world: int = 1) -> int:
    """data_workers: -1 (auto) = none on a CPU, where the training process needs every core; on a GPU,
    the CPUs this worker's share of the node leaves after the trainer itself and the reader, up to 8."""
    if setting >= 0:
        return setting
    if device_type != "cuda":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cpus // max(world, 1) - 2))


def stream_for(corpus: str, tokenizer_dir: str, cfg: ContextTrainConfig, directions: Sequence[str], rank: int,
               world: int, seed: int, skip: int, device_type: str) -> BatchStream:
    return BatchStream(corpus, tokenizer_dir, cfg, directions, rank, world, seed, skip,
                       workers=resolve_workers(cfg.data_workers, device_type, world))


__all__ = ["BatchStream", "BatchTask", "StopFlag", "as_tensors", "batch_tasks", "build_batch", "example_lengths",
           "micro_batches_of", "micro_batches_per_step", "packed_steps", "resolve_workers", "steps_of", "stream_for"]
