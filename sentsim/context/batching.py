"""How seq2seq examples become padded batches: the batch plan and the collation.

Two planners, both under a token budget (a batch of B examples costs B * (longest source + longest
target) padded tokens):
  * `token_batches` (batching=buffer, the legacy stream): sort by source + target length
    and cut greedily. Sorting on the sum keeps the sum tight but not each part: on the Wikipedia
    corpus a third to half of a GPU-sized batch was padding;
  * `plan_batches` (batching=bucketed): split the examples recursively on whichever of source or
    target length spreads more, until each part fits the budget, so a batch holds examples alike
    in both lengths. With ~200 batches to plan, 6-7% of the tokens are padding at 131,072 tokens
    a batch and ~1% at 4,096 (BENCHMARKS.md, "GPU").

The scorer (`ContextScorer`, many batches per call from a few thousand examples) plans with a padding
target as well (`max_padding`): groups are cut where the two parts pad least, down to a minimum size.

Packed rows (`pack_tokens`): `pack_rows` places examples of any length several to a row, and
`collate_packed_np` lays each row's examples back to back, `src_mask` then holding segment ids
(sentsim/context/model.py reads them).

`collate_np` pads with numpy in a few vectorised steps (numpy int32, cheap to send between
processes); `collate` is the same batch as int64 torch tensors. The scorer keeps its examples as
`RaggedRows` (flat token and slot arrays), sends them to the device once per call, and cuts each
batch there (`padded_index`). The layout is the training
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


def plan_batches(src_len: np.ndarray, tgt_len: np.ndarray, budget: int, fill: float = 0.95,
                 max_padding: Optional[float] = None, min_tokens: int = 0,
                 weights: tuple[float, float] = (1.0, 1.0)) -> list[np.ndarray]:
    """Indices of each batch, in plan order (sorted by length; shuffle them yourself).

    A group that fits the budget padded to its longest source and target is a batch; otherwise it is
    split on the length (source or target) whose range is wider, at the share that leaves the first
    part about floor(m/2) of the m batches the group needs at `fill` of the budget, so that batches
    come out nearly full. An example longer than the budget alone is a batch of one.

    max_padding (scoring): groups are cut where the two parts pad least (sorted on source or on target
    length, whichever pads less), each part keeping `min_tokens` real tokens, and a group that fits but
    is more than `max_padding` padding is cut too. Padding is counted with `weights` (source, target)
    per position: what a padded position costs.
    Training does not ask for it: its budget is filled by many groups (stream.py), a scoring call's by
    a few, and a few groups cut only to fit the budget span wide ranges of length (49% padding at
    65,536 tokens on one harvest unit, bench/results/scoring_host.md)."""
    src_len = np.asarray(src_len, dtype=np.int64)
    tgt_len = np.asarray(tgt_len, dtype=np.int64)
    ws, wt = weights
    out: list[np.ndarray] = []
    stack = [np.arange(len(src_len))]
    while stack:
        idx = stack.pop()
        if not len(idx):
            continue
        s, t = src_len[idx], tgt_len[idx]
        fits = len(idx) * (int(s.max()) + int(t.max())) <= budget
        if len(idx) == 1 or (fits and max_padding is None):
            out.append(idx)
            continue
        parts = None
        if max_padding is not None:
            padded_now = len(idx) * (ws * int(s.max()) + wt * int(t.max()))
            if not fits or (padded_now and 1.0 - (ws * int(s.sum()) + wt * int(t.sum())) / padded_now > max_padding):
                # an over-budget group prefers the cut `fill` would make (nearly full batches), one that
                # fits a cut in the middle
                m = max(2, int(np.ceil((int(s.sum()) + int(t.sum())) / (budget * fill))))
                prefer = 0.5 if fits else (m // 2) / m
                parts = _least_padded_cut(idx, s, t, min_tokens, padded_now if fits else np.inf, weights, prefer)
            if parts is None and fits:
                out.append(idx)
                continue
        if parts is None:
            key = s if (s.max() - s.min()) >= (t.max() - t.min()) else t
            order = idx[np.argsort(key, kind="stable")]
            m = max(2, int(np.ceil((int(s.sum()) + int(t.sum())) / (budget * fill))))
            h = min(max(int(round(len(order) * (m // 2) / m)), 1), len(order) - 1)
            parts = order[h:], order[:h]
        stack.extend(parts)  # the shorter part popped first: the plan runs from short to long
    return out


def _least_padded_cut(idx: np.ndarray, s: np.ndarray, t: np.ndarray, min_tokens: int, padded_now: float,
                      weights: tuple[float, float], prefer: float) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(longer part, shorter part) of the two-way cut of a group, sorted on source or on target length,
    with the fewest (weighted) padded positions and at least `min_tokens` real tokens each side; among
    cuts that pad alike (lengths repeat), the one nearest `prefer` (a share of the group's rows). None if
    no cut pads less than the group does whole."""
    n = len(idx)
    ws, wt = weights
    best = None
    h = np.arange(1, n)  # first part = rows [0, h)
    for key, w in ((s, ws), (t, wt)):
        if not w or key.min() == key.max():  # sorting on it would change nothing
            continue
        o = np.argsort(key, kind="stable")
        so, to = s[o], t[o]
        pre = ws * np.maximum.accumulate(so) + wt * np.maximum.accumulate(to)  # widths of the first h+1 rows
        suf = (ws * np.maximum.accumulate(so[::-1]) + wt * np.maximum.accumulate(to[::-1]))[::-1]
        cost = h * pre[:-1] + (n - h) * suf[1:]
        real = np.cumsum(so + to)
        cost = np.where((real[:-1] >= min_tokens) & (real[-1] - real[:-1] >= min_tokens), cost, np.inf)
        low = cost.min()
        if not np.isfinite(low) or (best is not None and low >= best[0]):
            continue
        ties = np.flatnonzero(cost <= low)
        j = int(ties[np.argmin(np.abs(h[ties] - prefer * n))])
        best = (float(low), idx[o], int(h[j]))
    if best is None or best[0] >= padded_now:
        return None
    _, order, cut = best
    return order[cut:], order[:cut]


class RaggedRows:
    """Rows of different lengths (token ids and their slots) in flat int32 arrays: row i is
    tokens[offsets[i]:offsets[i] + lengths[i]]. The scorer's examples (`example_arrays`) live here, and
    its padded batches are cut from here with a few array operations, no loop over rows."""

    def __init__(self, tokens: np.ndarray, slots: np.ndarray, offsets: np.ndarray, lengths: np.ndarray):
        self.tokens, self.slots = tokens, slots
        self.offsets, self.lengths = offsets, lengths

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def gather(cls, tokens: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, segments: np.ndarray,
               segment_slots: np.ndarray) -> "RaggedRows":
        """Row i = the concatenation of the pieces `segments[i, :]` (indices into `offsets`/`lengths`, a
        piece of `tokens` each), each piece's tokens with slot `segment_slots[i, j]` (or `[j]`)."""
        seg_len = lengths[segments]  # [rows, pieces]
        row_len = seg_len.sum(1)
        flat_len = seg_len.reshape(-1)
        total = int(flat_len.sum())
        out_start = np.cumsum(flat_len) - flat_len  # where each piece lands in the output
        at = np.repeat(offsets[segments].reshape(-1) - out_start, flat_len) + np.arange(total)
        slots = np.broadcast_to(segment_slots, segments.shape).reshape(-1)
        return cls(tokens[at], np.repeat(slots, flat_len).astype(np.int32), np.cumsum(row_len) - row_len, row_len)

    def replaced(self, rows: dict) -> "RaggedRows":
        """A copy with rows {i: (tokens, slots)} replaced (their new contents appended at the end)."""
        offsets, lengths = self.offsets.copy(), self.lengths.copy()
        at = len(self.tokens)
        for i, (toks, _) in rows.items():
            offsets[i], lengths[i] = at, len(toks)
            at += len(toks)
        tok = [self.tokens] + [np.asarray(t, dtype=np.int32) for t, _ in rows.values()]
        sl = [self.slots] + [np.asarray(s, dtype=np.int32) for _, s in rows.values()]
        return RaggedRows(np.concatenate(tok), np.concatenate(sl), offsets, lengths)

    def row(self, i: int) -> tuple[list[int], list[int]]:
        a, n = int(self.offsets[i]), int(self.lengths[i])
        return self.tokens[a:a + n].tolist(), self.slots[a:a + n].tolist()


def padded_index(offsets, lengths, positions, fill_index: int, shift: int = 0):
    """Torch [B, W] indices into a flat array: row r's position j -> offsets[r] + j - shift where
    j < lengths[r], else `fill_index` (an element holding the padding value); and the [B, W] mask of
    real positions. `positions` is arange(W) on the rows' device. A batch cut this way from examples
    uploaded once costs the host a few kernel launches instead of a [B, W] array to build and send."""
    import torch

    real = positions < lengths[:, None]
    return torch.where(real, offsets[:, None] + (positions - shift), fill_index), real


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


def collate_packed_np(exs: Sequence[Example], row_sizes: Sequence[int], pad_id: int, bos_id: int) -> dict:
    """`collate_np` of packed rows: row r holds the next `row_sizes[r]` examples back to back, in the source
    and in the decoder input and labels (each example's own <bos> + target[:-1] and target), then padding.
    `src_mask` is [B, S + T]: the segment id of each source position (1, 2, ... for the row's examples,
    0 = padding), then of each decoder position."""
    rows, at = [], 0
    for n in row_sizes:
        rows.append(exs[at:at + n])
        at += n
    if at != len(exs) or not all(row_sizes):
        raise ValueError(f"row sizes {list(row_sizes)} do not cut {len(exs)} examples into rows")

    def joined(part) -> list[list[int]]:
        return [list(itertools.chain.from_iterable(part(j, e) for j, e in enumerate(row, 1))) for row in rows]

    src = joined(lambda j, e: e.src)
    labels = joined(lambda j, e: e.tgt)
    sl = np.fromiter(map(len, src), np.int64, len(rows))
    tl = np.fromiter(map(len, labels), np.int64, len(rows))
    S, T = int(sl.max()), int(tl.max())
    src_seg = padded(joined(lambda j, e: [j] * len(e.src)), sl, S, 0)
    dec_seg = padded(joined(lambda j, e: [j] * len(e.tgt)), tl, T, 0)
    return {"src": padded(src, sl, S, pad_id), "src_slots": padded(joined(lambda j, e: e.src_slots), sl, S, 0),
            "src_mask": np.concatenate([src_seg, dec_seg], axis=1),
            "dec_in": padded(joined(lambda j, e: [bos_id, *e.tgt[:-1]]), tl, T, pad_id),
            "dec_slots": padded(joined(lambda j, e: [0, *e.tgt_slots[:-1]]), tl, T, 0),
            "labels": padded(labels, tl, T, -100)}


def pack_rows(src_len: np.ndarray, tgt_len: np.ndarray, src_room: int, tgt_room: int,
              open_rows: int = 8) -> list[np.ndarray]:
    """Indices of the examples of each packed row, rows in the order they close. Examples are placed in the
    order given, each into the first of the last `open_rows` rows that has room for its source and its
    target (at most `src_room` source and `tgt_room` target tokens a row), else into a new row, the oldest
    open row then closing: a row mixes the lengths of its stretch of the order (shuffle it first), and
    short examples fill the gaps long ones leave. An example longer than a row is a row of its own."""
    done: list[list[int]] = []
    rows: list[list[int]] = []
    room: list[list[int]] = []
    for i, (s, t) in enumerate(zip(np.asarray(src_len).tolist(), np.asarray(tgt_len).tolist())):
        for r, (rs, rt) in enumerate(room):
            if s <= rs and t <= rt:
                rows[r].append(i)
                room[r] = [rs - s, rt - t]
                break
        else:
            if len(rows) == open_rows:
                done.append(rows.pop(0))
                room.pop(0)
            rows.append([i])
            room.append([src_room - s, tgt_room - t])
    return [np.array(r, dtype=np.int64) for r in done + rows]


def collate(exs: Sequence[Example], pad_id: int, bos_id: int) -> dict:
    """`collate_np` as int64 torch tensors (the training loss's and evaluation's batch)."""
    import torch

    return {k: torch.from_numpy(v.astype(np.int64)) for k, v in collate_np(exs, pad_id, bos_id).items()}


def padding_fraction(batch: dict) -> float:
    """Share of a batch's source + target positions that are padding (padded or packed)."""
    S = np.asarray(batch["src"]).shape[-1]
    real = int((np.asarray(batch["src_mask"])[..., :S] > 0).sum()) + int((np.asarray(batch["labels"]) >= 0).sum())
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
