"""Expand retrieved chunks into candidate contexts: one per sentence slot.

Slot j of a chunk (first_sentence_id f, n sentences) is the context of its j-th sentence
(centre id f + j): the w sentences before it and the w after it in the same document
(ids f+j-w .. f+j-1 and f+j+1 .. f+j+w). Context sentences may lie outside the chunk: a chunk
is a retrieval unit, the document decides what a context is. So a chunk smaller than the window
still yields contexts when its document is long enough.

Defined behaviour at the edges: a slot whose window leaves the document (the first and last w
sentences of every document), or needs a sentence the corpus does not have, gives no candidate.
A document with fewer than 2w+1 sentences gives none at all. `Candidates.dropped` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from corpus.documents import doc_key_of
from corpus.view import ChunkTable


@dataclass
class Candidates:
    chunk_id: np.ndarray         # int64 [m]
    slot: np.ndarray             # int32 [m], position of the centre in its chunk
    centre_id: np.ndarray        # int64 [m], sentence id of the slot (the sentence a query replaces)
    left_ids: np.ndarray         # int64 [m, w], document order
    right_ids: np.ndarray        # int64 [m, w]
    retrieval_score: np.ndarray  # float32 [m]
    dropped: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.chunk_id)

    @property
    def prev_id(self) -> np.ndarray:
        """The (i-1)-th sentence of each context (used by the Jaccard rule)."""
        return self.left_ids[:, -1]


def window_ids(centre: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids of the w sentences before and after each centre, in document order: [m, w] each."""
    offs = np.arange(1, window + 1, dtype=np.int64)
    centre = np.asarray(centre, dtype=np.int64)
    return centre[:, None] - offs[::-1][None, :], centre[:, None] + offs[None, :]


def full_windows(centre: np.ndarray, sentence_ids: np.ndarray, window: int) -> np.ndarray:
    """Which centres have a full window: the centre and the w sentences either side all in the corpus
    (`sentence_ids`, sorted) and in the centre's document. Every context a model reads is one of these."""
    centre = np.asarray(centre, dtype=np.int64)
    if not len(sentence_ids):
        return np.zeros(len(centre), dtype=bool)

    def present(ids: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(sentence_ids, ids)
        return (pos < len(sentence_ids)) & (sentence_ids[np.minimum(pos, len(sentence_ids) - 1)] == ids)

    left, right = window_ids(centre, window)
    doc = doc_key_of(centre)
    ok = present(centre)
    for ids in (left, right):
        ok &= ((doc_key_of(ids) == doc[:, None]) & present(ids) & (ids >= 0)).all(axis=1)
    return ok


def expand_candidates(chunk_ids: np.ndarray, retrieval_scores: np.ndarray, chunks: ChunkTable,
                      sentence_ids: np.ndarray, window: int) -> Candidates:
    """chunk_ids / retrieval_scores: one query's retrieval row (-1 padding is ignored).
    sentence_ids: sorted ids of every corpus sentence available (e.g. the rep cache)."""
    chunk_ids = np.asarray(chunk_ids, dtype=np.int64)
    retrieval_scores = np.asarray(retrieval_scores, dtype=np.float32)
    keep = chunk_ids >= 0
    chunk_ids, retrieval_scores = chunk_ids[keep], retrieval_scores[keep]
    rows = chunks.rows(chunk_ids)
    unknown = int((rows < 0).sum())
    chunk_ids, retrieval_scores, rows = chunk_ids[rows >= 0], retrieval_scores[rows >= 0], rows[rows >= 0]
    n = chunks.n[rows]
    total = int(n.sum())
    rep = np.repeat(np.arange(len(rows)), n)
    starts = np.cumsum(n) - n
    slot = (np.arange(total) - np.repeat(starts, n)).astype(np.int32)
    centre = chunks.first[rows][rep] + slot
    left, right = window_ids(centre, window)
    ok = full_windows(centre, sentence_ids, window)
    return Candidates(
        chunk_id=chunk_ids[rep][ok], slot=slot[ok], centre_id=centre[ok],
        left_ids=left[ok], right_ids=right[ok], retrieval_score=retrieval_scores[rep][ok],
        dropped={"edge_slots": int((~ok).sum()), "unknown_chunks": unknown},
    )
