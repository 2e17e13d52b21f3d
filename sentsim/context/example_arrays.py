"""`windows.build_example` for every (item, direction) of a scoring call at once, in numpy.

The scorer's host side was one `build_example` per (item, direction) plus a hash of each source's token
tuple: ~200 us an item on an H200's host, a fifth of what the GPU could score. Here each
distinct text of the call is tokenised once and laid out in one flat array (`TextTable`), each item is
a row of text ids (its left sentences, its sentence, its right sentences), and each example is a row of
*segments*: the text ids of its parts, in the layout of `windows.py`

    column:   0       1..k          k+1    k+2          k+3    k+4..2k+3      2k+4
    source:   <tag>   c_<i          <sep>  s_i          <sep>  c_>i           </s>
    slot:     0       1..k          0      k+1          0      k+2..2k+1      0

with the predicted part replaced by <blank> (a one-token text) and absent sentences by a text of no
tokens. A token's slot is its column's, so the source's tokens and slots are one gather of segments
(`RaggedRows`). The source is a function of its segments' text ids, so those ids are the key that
shares an encoder pass between items (no token tuples hashed). The rare example that must be cut
(`max_source_tokens`, `max_target_tokens`) is built by `build_example` itself; every other one equals
it token for token (tests/context/test_context_scorer.py compares them over random items).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sentsim.context.batching import RaggedRows
from sentsim.context.windows import Example, build_example

SPECIALS = ("tag_fwd", "tag_left", "tag_right", "sep", "blank", "eos")


class TextTable:
    """The tokens of a call's distinct texts (text id = position in `texts`) in one flat int32 array,
    then one text per special token, then the empty text (`null`): an absent sentence."""

    def __init__(self, token_arrays: Sequence[np.ndarray], ids: dict):
        arrays = list(token_arrays) + [np.array([ids[r]], np.int32) for r in SPECIALS] + [np.zeros(0, np.int32)]
        self.lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        self.offsets = np.cumsum(self.lengths) - self.lengths
        self.tokens = np.concatenate(arrays).astype(np.int32, copy=False)
        n = len(token_arrays)
        self.special = {r: n + j for j, r in enumerate(SPECIALS)}
        self.null = n + len(SPECIALS)

    def ids_of(self, text: int) -> list[int]:
        a = int(self.offsets[text])
        return self.tokens[a:a + int(self.lengths[text])].tolist()


def context_columns(item: np.ndarray, text: np.ndarray, n_items: int, k: int, side: str, null: int) -> np.ndarray:
    """[n_items, k] text ids of each item's left (nearest in the last column) or right (nearest in the
    first) context sentences; `item`/`text` list each item's usable sentences in order, items ascending.
    As `build_example`: the last k on the left, the first k on the right, the rest dropped."""
    out = np.full((n_items, k), null, dtype=np.int64)
    if not len(item):
        return out
    count = np.bincount(item, minlength=n_items)
    first = np.cumsum(count) - count
    pos = np.arange(len(item)) - first[item]  # place in the item's list
    if side == "left":
        back = count[item] - 1 - pos  # 0 = the nearest sentence
        keep = back < k
        out[item[keep], k - 1 - back[keep]] = text[keep]
    else:
        keep = pos < k
        out[item[keep], pos[keep]] = text[keep]
    return out


@dataclass
class ExampleArrays:
    """The examples of one model's jobs: job q is item `item[q]` in direction `direction[q]` (an index
    into the directions given), its source row `job_src[q]` of the distinct sources `src`, its target
    (labels, ending with </s> unless cut) row q of `tgt`."""

    item: np.ndarray
    direction: np.ndarray
    src: RaggedRows
    job_src: np.ndarray
    tgt: RaggedRows
    src_truncated: np.ndarray  # per job: tokens cut from its source
    tgt_truncated: np.ndarray
    fallbacks: int  # jobs built by build_example (cut examples)

    def __len__(self) -> int:
        return len(self.item)

    def example(self, q: int) -> Example:
        """Job q as `build_example` returns it (for tests and debugging)."""
        s, ss = self.src.row(int(self.job_src[q]))
        t, ts = self.tgt.row(q)
        return Example(s, ss, t, ts, int(self.src_truncated[q]), int(self.tgt_truncated[q]))


def build_examples(table: TextTable, ids: dict, k: int, directions: Sequence[str], centre: np.ndarray,
                   left: np.ndarray, right: np.ndarray, max_source: int, max_target: int) -> ExampleArrays:
    """Every item's example in each of `directions` (items whose target is empty have none).

    centre [n]: the text id of each item's sentence; left, right [n, k]: `context_columns`."""
    C = 2 * k + 5
    cols, tgt, tsl, item, direction, col_slot = _segment_rows(table, k, directions, centre, left, right)

    # one encoder source per distinct row of segment text ids (the sep and </s> columns are the same in all)
    key_cols = [c for c in range(C) if c not in (k + 1, k + 3, C - 1)]
    keys = np.ascontiguousarray(cols[:, key_cols].astype(np.int32))
    void = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
    _, first, job_src = np.unique(void, return_index=True, return_inverse=True)
    job_src = job_src.reshape(-1)
    src = RaggedRows.gather(table.tokens, table.offsets, table.lengths, cols[first], col_slot)
    tgt_rows = RaggedRows.gather(table.tokens, table.offsets, table.lengths, tgt, tsl)

    # examples to cut: build_example's own rules (water-filled source, target cut short of its </s>)
    body = src.lengths[job_src] - 4  # source tokens besides the tag, the two <sep> and </s>
    cut = (body > max_source - 4) | (tgt_rows.lengths > max_target)
    src_trunc = np.zeros(len(item), dtype=np.int64)
    tgt_trunc = np.zeros(len(item), dtype=np.int64)
    fallback = np.flatnonzero(cut)
    if len(fallback):
        new_src, new_tgt = {}, {}
        for q in fallback.tolist():
            ex = _build_one(table, ids, k, directions[direction[q]], int(item[q]), centre, left, right,
                            max_source, max_target)
            src_trunc[q], tgt_trunc[q] = ex.src_truncated, ex.tgt_truncated
            new_src[int(job_src[q])] = (ex.src, ex.src_slots)
            new_tgt[q] = (ex.tgt, ex.tgt_slots)
        src = src.replaced(new_src)
        tgt_rows = tgt_rows.replaced(new_tgt)
    return ExampleArrays(item, direction, src, job_src, tgt_rows, src_trunc, tgt_trunc, len(fallback))


def _segment_rows(table: TextTable, k: int, directions: Sequence[str], centre: np.ndarray, left: np.ndarray,
                  right: np.ndarray) -> tuple:
    """(source segments [jobs, 2k+5], target segments [jobs, k+2], their slots, item, direction, the slot of
    each source column) of every item's example in each direction, direction by direction."""
    n = len(centre)
    null, sp = table.null, table.special
    C = 2 * k + 5
    left_cols, centre_col, right_cols = slice(1, k + 1), k + 2, slice(k + 4, 2 * k + 4)
    col_slot = np.zeros(C, dtype=np.int64)
    col_slot[left_cols] = np.arange(1, k + 1)
    col_slot[centre_col] = k + 1
    col_slot[right_cols] = np.arange(k + 2, 2 * k + 2)
    base = np.empty((n, C), dtype=np.int64)
    base[:, 0] = null  # the tag, set per direction
    base[:, left_cols] = left
    base[:, k + 1] = base[:, k + 3] = sp["sep"]
    base[:, centre_col] = centre
    base[:, right_cols] = right
    base[:, C - 1] = sp["eos"]

    srcs, tgts, tslots, items, dirs = [], [], [], [], []
    for d_index, d in enumerate(directions):
        cols = base.copy()
        cols[:, 0] = sp[f"tag_{d}"]
        tgt = np.full((n, k + 1), null, dtype=np.int64)
        tsl = np.zeros((n, k + 1), dtype=np.int64)
        if d == "fwd":
            tgt[:, 0] = centre
            tsl[:, 0] = k + 1
            cols[:, centre_col] = sp["blank"]
        elif d == "left":
            tgt[:, :k] = left
            tsl[:, :k] = col_slot[left_cols]
            cols[:, left_cols] = null
            cols[:, k] = sp["blank"]  # slot k: the nearest left sentence's
        elif d == "right":
            tgt[:, :k] = right
            tsl[:, :k] = col_slot[right_cols]
            cols[:, right_cols] = null
            cols[:, k + 4] = sp["blank"]  # slot k + 2: the nearest right sentence's
        else:
            raise ValueError(f"unknown direction {d!r}")
        has = table.lengths[tgt].sum(1) > 0  # an empty target: the direction is missing for that item
        # the target ends with </s> right after its last sentence (absent ones are empty texts anyway)
        tgt_eos = np.concatenate([tgt, np.full((n, 1), sp["eos"])], axis=1)
        tsl_eos = np.concatenate([tsl, np.zeros((n, 1), dtype=np.int64)], axis=1)
        srcs.append(cols[has])
        tgts.append(tgt_eos[has])
        tslots.append(tsl_eos[has])
        items.append(np.flatnonzero(has))
        dirs.append(np.full(int(has.sum()), d_index, dtype=np.int64))
    cols = np.concatenate(srcs) if srcs else np.zeros((0, C), np.int64)
    tgt = np.concatenate(tgts) if tgts else np.zeros((0, k + 2), np.int64)
    tsl = np.concatenate(tslots) if tslots else np.zeros((0, k + 2), np.int64)
    item = np.concatenate(items) if items else np.zeros(0, np.int64)
    direction = np.concatenate(dirs) if dirs else np.zeros(0, np.int64)
    return cols, tgt, tsl, item, direction, col_slot


def _build_one(table, ids, k, d, i, centre, left, right, max_source, max_target) -> Example:
    lt = [table.ids_of(t) for t in left[i].tolist() if t != table.null]
    rt = [table.ids_of(t) for t in right[i].tolist() if t != table.null]
    ex = build_example(ids, k, d, lt, table.ids_of(int(centre[i])), rt, max_source, max_target)
    if ex is None:
        raise RuntimeError(f"item {i}, direction {d}: no example, but its target has tokens")
    return ex
