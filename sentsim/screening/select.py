"""Greedy diverse selection of a sentence's context set C_s (paper 003 §3.3).

Candidates are taken best-first; a candidate is skipped when its chunk already contributed a
context (at most one per chunk) or when the Jaccard similarity between the word set of its
(i-1)-th sentence (the sentence just before the slot) and that of any context already chosen is
at or above the threshold (the paper: "lower than 0.5"). It stops at `size` contexts (500).

Jaccard of two empty word sets (e.g. punctuation-only sentences) is 1.0, so at most one such
context is chosen; an empty set against a non-empty one is 0.0.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from sentsim.errors import UsageError

_WORD = re.compile(r"\w+", re.UNICODE)


def word_set(text: str) -> frozenset[str]:
    """Lower-cased word types of a sentence: the unit of the Jaccard rule."""
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: Iterable, b: Iterable) -> float:
    a, b = set(a), set(b)
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def select_diverse(scores: np.ndarray, chunk_ids: np.ndarray, prev_tokens: Sequence[Iterable],
                   size: int = 500, max_jaccard: float = 0.5, one_per_chunk: bool = True,
                   tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices of the chosen candidates, in the order chosen (best first).

    scores [m]: higher is better (NaN candidates are never chosen); chunk_ids [m];
    prev_tokens[m]: the word set of each candidate's (i-1)-th sentence; tiebreak [m]: optional
    secondary key, higher first (e.g. the retrieval score); remaining ties go to the lower index.
    Pure function: no I/O, deterministic.
    """
    scores = np.asarray(scores, dtype=np.float64)
    chunk_ids = np.asarray(chunk_ids)
    m = len(scores)
    if len(chunk_ids) != m or len(prev_tokens) != m:
        raise UsageError(f"scores ({m}), chunk_ids ({len(chunk_ids)}) and prev_tokens ({len(prev_tokens)}) "
                         "differ in length")
    if size < 0:
        raise UsageError(f"size must be >= 0 (got {size})")
    if not 0.0 < max_jaccard <= 1.0:
        raise UsageError(f"max_jaccard must be in (0, 1] (got {max_jaccard})")
    if m == 0 or size == 0:
        return np.empty(0, dtype=np.int64)
    tb = np.zeros(m) if tiebreak is None else np.asarray(tiebreak, dtype=np.float64)
    valid = ~np.isnan(scores)
    order = np.lexsort((np.arange(m), -tb, -np.where(valid, scores, -np.inf)))
    order = order[valid[order]]

    chosen: list[int] = []
    used_chunks: set = set()
    col: dict = {}
    # rows: chosen contexts; columns: word types seen in chosen contexts
    M = np.zeros((size, 256), dtype=np.uint8)
    sizes = np.zeros(size, dtype=np.int64)
    n_empty = 0
    for idx in order:
        if len(chosen) >= size:
            break
        c = chunk_ids[idx]
        if one_per_chunk and c in used_chunks:
            continue
        toks = set(prev_tokens[idx])
        k = len(chosen)
        if not toks:
            if n_empty and max_jaccard <= 1.0:
                continue
        elif k:
            cols = [col[t] for t in toks if t in col]
            inter = M[:k, cols].sum(axis=1, dtype=np.int64) if cols else np.zeros(k, np.int64)
            union = len(toks) + sizes[:k] - inter
            if np.any(inter >= max_jaccard * union):
                continue
        for t in toks:
            j = col.get(t)
            if j is None:
                j = col[t] = len(col)
                if j >= M.shape[1]:
                    M = np.concatenate([M, np.zeros_like(M)], axis=1)
            M[k, j] = 1
        sizes[k] = len(toks)
        n_empty += not toks
        chosen.append(int(idx))
        used_chunks.add(c)
    return np.asarray(chosen, dtype=np.int64)
