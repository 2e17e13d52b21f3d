"""How seq2seq examples become padded batches: the batch plan and the collation.

Two planners, both under a token budget (a batch of B examples costs B * (longest source + longest
target) padded tokens):
  * `token_batches` (batching=buffer, the stream before 2026-11-26): sort by source + target length
    and cut greedily. Sorting on the sum keeps the sum tight but not each part: on the Wikipedia
    corpus a third to half of a GPU-sized batch was padding;
  * `plan_batches` (batching=bucketed): split the examples recursively on whichever of source or
    target length spreads more, until each part fits the budget, so a batch holds examples alike
    in both lengths. With ~200 batches to plan, 6-7% of the tokens are padding at 131,072 tokens
    a batch and ~1% at 4,096 (BENCHMARKS.md, "GPU").

`collate_np` pads with numpy in a few vectorised steps (numpy int32, cheap to send between
processes); `collate` is the same batch as int64 torch tensors. The layout is the training
loss's and the scorer's: decoder input = <bos> + target[:-1], labels = target, -100 where padded.
"""

from __future__ import annotations

import itertools
import random
from typing import Optional, Sequence

import numpy as np

from sentsim.context.windows import Example

BATCH_KEYS = ("src", "src_slots", "src_mask", "dec_in", "dec_slots", "labels")


def token_batches(exs: list[Example], budget: int, rng: Optional[random.Random] = None) -> list[list[Example]]:
    """Sort by length, cut into batches of at most `budget` padded (source + target) tokens."""
    exs = sorted(exs, key=lambda e: (len(e.tgt) + len(e.src), len(e.tgt)))
    out, cur, ms, mt = [], [], 0, 0
    for e in exs:
        ns, nt = max(ms, len(e.src)), max(mt, len(e.tgt))
        if cur and (len(cur) + 1) * (ns + nt) > budget:
            out.append(cur)
            cur, ns, nt = [], len(e.src), len(e.tgt)
        cur.append(e)
        ms, mt = ns, nt
    if cur:
        out.append(cur)
    if rng is not None:
        rng.shuffle(out)
    return out


def plan_batches(src_len: np.ndarray, tgt_len: np.ndarray, budget: int, fill: float = 0.95) -> list[np.ndarray]:
    """Indices of each batch, in plan order (sorted by length; shuffle them yourself).

    A group that fits the budget padded to its longest source and target is a batch; otherwise it is
    split on the length (source or target) whose range is wider, at the share that leaves the first
    part about floor(m/2) of the m batches the group needs at `fill` of the budget, so that batches
    come out nearly full. An example longer than the budget alone is a batch of one."""
    src_len = np.asarray(src_len, dtype=np.int64)
    tgt_len = np.asarray(tgt_len, dtype=np.int64)
    out: list[np.ndarray] = []
    stack = [np.arange(len(src_len))]
    while stack:
        idx = stack.pop()
        if not len(idx):
            continue
        s, t = src_len[idx], tgt_len[idx]
        if len(idx) == 1 or len(idx) * (int(s.max()) + int(t.max())) <= budget:
            out.append(idx)
            continue
        key = s if (s.max() - s.min()) >= (t.max() - t.min()) else t
        order = idx[np.argsort(key, kind="stable")]
        m = max(2, int(np.ceil((int(s.sum()) + int(t.sum())) / (budget * fill))))
        h = min(max(int(round(len(order) * (m // 2) / m)), 1), len(order) - 1)
        stack.append(order[h:])  # popped second: the plan runs from short to long
        stack.append(order[:h])
    return out


def example_lengths(exs: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
    return (np.fromiter((len(e.src) for e in exs), np.int64, len(exs)),
            np.fromiter((len(e.tgt) for e in exs), np.int64, len(exs)))


def padded(rows: Sequence[Sequence[int]], lengths: np.ndarray, width: int, fill: int) -> np.ndarray:
    """int32 [len(rows), width]: each row's ids, then `fill`."""
    out = np.full((len(rows), width), fill, dtype=np.int32)
    # a boolean mask assigns in row-major order: each row's tokens, left to right
    out[np.arange(width) < lengths[:, None]] = np.fromiter(itertools.chain.from_iterable(rows), np.int32,
                                                            int(lengths.sum()))
    return out


def collate_np(exs: Sequence[Example], pad_id: int, bos_id: int) -> dict:
    """The padded batch as numpy int32 arrays (BATCH_KEYS)."""
    sl, tl = example_lengths(exs)
    S, T = int(sl.max()), int(tl.max())
    src_mask = (np.arange(S) < sl[:, None]).astype(np.int32)
    labels = padded([e.tgt for e in exs], tl, T, -100)
    tgt_slots = padded([e.tgt_slots for e in exs], tl, T, 0)
    real = np.arange(T) < tl[:, None]
    dec_in = np.full((len(exs), T), pad_id, dtype=np.int32)
    dec_in[:, 0] = bos_id
    dec_in[:, 1:] = np.where(real[:, 1:], labels[:, :-1], pad_id)
    dec_slots = np.zeros((len(exs), T), dtype=np.int32)
    dec_slots[:, 1:] = np.where(real[:, 1:], tgt_slots[:, :-1], 0)
    return {"src": padded([e.src for e in exs], sl, S, pad_id),
            "src_slots": padded([e.src_slots for e in exs], sl, S, 0), "src_mask": src_mask,
            "dec_in": dec_in, "dec_slots": dec_slots, "labels": labels}


def collate(exs: Sequence[Example], pad_id: int, bos_id: int) -> dict:
    """`collate_np` as int64 torch tensors (the training loss's and evaluation's batch)."""
    import torch

    return {k: torch.from_numpy(v.astype(np.int64)) for k, v in collate_np(exs, pad_id, bos_id).items()}


def padding_fraction(batch: dict) -> float:
    """Share of a batch's source + target positions that are padding."""
    real = int((np.asarray(batch["src_mask"]) > 0).sum()) + int((np.asarray(batch["labels"]) >= 0).sum())
    total = np.asarray(batch["src"]).size + np.asarray(batch["labels"]).size
    return 1.0 - real / total if total else 0.0


class HostToDevice:
    """Integer arrays onto a device as int64 tensors of the same shapes, in one host-to-device copy.

    On a GPU the copy goes through a ring of pinned buffers allocated once (grown rarely): pinning each
    batch anew (`tensor.pin_memory()`) allocates page-locked memory, which waits for the device to
    drain, and cost 420 ms a step on an H200 (BENCHMARKS.md, "GPU"); from pageable memory CUDA would
    also wait for every queued kernel first. A buffer is refilled only once the copy that last used
    it has finished, so the host runs ahead of the device by up to `slots` batches."""

    def __init__(self, device, slots: int = 4):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.buffers: list = [None] * slots
        self.copied: list = [None] * slots  # the CUDA event after each buffer's last copy
        self.turn = 0

    def __call__(self, arrays: dict) -> dict:
        torch = self.torch
        flat = [np.ascontiguousarray(a, dtype=np.int32).reshape(-1) for a in arrays.values()]
        n = sum(f.size for f in flat)
        if self.device.type != "cuda":
            buf = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, np.int32)).long()
        else:
            k = self.turn % len(self.buffers)
            self.turn += 1
            if self.copied[k] is not None:
                self.copied[k].synchronize()  # issued batches ago: done, or nearly
            if self.buffers[k] is None or self.buffers[k].numel() < n:
                self.buffers[k] = torch.empty(int(n * 1.5) + 1024, dtype=torch.int32, pin_memory=True)
            host = self.buffers[k][:n]
            if flat:
                np.concatenate(flat, out=host.numpy())
            buf = host.to(self.device, non_blocking=True)
            self.copied[k] = torch.cuda.Event()
            self.copied[k].record()
            buf = buf.long()
        out, at = {}, 0
        for (key, a), f in zip(arrays.items(), flat):
            out[key] = buf[at:at + f.size].view(*np.shape(a))
            at += f.size
        return out
