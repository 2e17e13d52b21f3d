"""Training windows for the discriminator (paper 003 §3.2.1).

A window is a centre sentence with w real neighbours on each side in the same document
(neighbours are sentence ids ±1..±w). Every window gives one positive (the real centre) and
one negative (the centre replaced: with probability `same_doc_frac` by another sentence of the
same document, else by a random corpus sentence). Sentences at document edges, and documents
with fewer than 2w+1 sentences, give no window.
"""

from __future__ import annotations

import numpy as np

from corpus.documents import doc_key_of
from sentsim.errors import UsageError


def window_centres(ids: np.ndarray, window: int) -> np.ndarray:
    """Positions p (into the sorted id array) whose ids p-w..p+w are consecutive in one document."""
    n = len(ids)
    if n < 2 * window + 1:
        return np.empty(0, dtype=np.int64)
    p = np.arange(window, n - window)
    ok = np.ones(len(p), dtype=bool)
    for j in range(1, window + 1):
        ok &= (ids[p + j] == ids[p] + j) & (ids[p - j] == ids[p] - j)
    return p[ok]


def doc_ranges(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position: document start and end positions (sorted ids), and the doc key."""
    docs = doc_key_of(ids)
    starts = np.searchsorted(docs, docs, side="left")
    ends = np.searchsorted(docs, docs, side="right")
    return starts, ends, docs


def split_heldout(ids: np.ndarray, centres: np.ndarray, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Hold out whole documents when there are at least 2 with windows, else the tail of the windows."""
    if len(centres) < 2:
        raise UsageError(
            f"the corpus has {len(centres)} window(s) of consecutive sentences; the discriminator needs at least 2"
        )
    docs = doc_key_of(ids[centres])
    uniq = np.unique(docs)
    rng = np.random.default_rng(seed)
    if len(uniq) >= 2:
        n_held = min(max(1, int(round(frac * len(uniq)))), len(uniq) - 1)
        held_docs = rng.choice(uniq, size=n_held, replace=False)
        mask = np.isin(docs, held_docs)
        return centres[~mask], centres[mask], "documents"
    n_held = min(max(1, int(round(frac * len(centres)))), len(centres) - 1)
    return centres[:-n_held], centres[-n_held:], "window tail (one document)"


def sample_negatives(centres: np.ndarray, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     same_doc_frac: float, rng: np.random.Generator) -> np.ndarray:
    """A replacement position for each centre, never the centre itself."""
    n = len(ids)
    m = len(centres)
    same = rng.random(m) < same_doc_frac
    out = np.empty(m, dtype=np.int64)
    lo, hi = starts[centres], ends[centres]
    # same document: uniform over the other sentences of the document (always >= 2w sentences)
    span = np.maximum(hi - lo - 1, 1)
    r = lo + rng.integers(0, span, size=m) if m else np.empty(0, np.int64)
    r = np.where(r >= centres, r + 1, r)
    r = np.minimum(r, hi - 1)
    # random corpus sentence
    q = rng.integers(0, max(n - 1, 1), size=m)
    q = np.where(q >= centres, q + 1, q) if n > 1 else q
    out[:] = np.where(same, r, q)
    return out


def batch_windows(centres: np.ndarray, negatives: np.ndarray, window: int):
    """Sentence positions to encode and the index layout for a batch of windows.

    Returns (positions [n_unique], left [2B, w], centre [2B], right [2B, w], labels [2B]) where
    the first B rows are positives and the last B the negatives of the same windows.
    """
    B = len(centres)
    offs = np.arange(1, window + 1)
    left = centres[:, None] - offs[::-1][None, :]
    right = centres[:, None] + offs[None, :]
    all_pos = np.concatenate([left.ravel(), centres, right.ravel(), negatives])
    uniq, inv = np.unique(all_pos, return_inverse=True)
    k = B * window
    li = inv[:k].reshape(B, window)
    ci = inv[k:k + B]
    ri = inv[k + B:k + B + k].reshape(B, window)
    ni = inv[k + B + k:]
    L = np.concatenate([li, li])
    R = np.concatenate([ri, ri])
    C = np.concatenate([ci, ni])
    y = np.concatenate([np.ones(B, np.float32), np.zeros(B, np.float32)])
    return uniq, L, C, R, y
