"""In-memory view of a corpus for the harvest actors: texts by id, documents, chunks.

Held once per actor. A corpus of 1M sentences takes a few hundred MB here; beyond that, shard
the corpus and run one harvest per shard.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from corpus.documents import SENT_BITS
from sentsim.retrieval.corpus_view import SentenceTable, corpus_fingerprint, read_table


class CorpusIndex:
    def __init__(self, corpus: str):
        self.path = corpus
        self.fingerprint = corpus_fingerprint(corpus)
        self.sentences = SentenceTable.load(corpus)
        t = read_table(corpus, "sentences", ["sentence_id", "n_tokens"])
        ids = t.column("sentence_id").to_numpy().astype(np.int64)
        order = np.argsort(ids, kind="stable")
        self.n_tokens = t.column("n_tokens").to_numpy()[order]
        c = read_table(corpus, "chunks", ["chunk_id", "first_sentence_id", "n_sentences"])
        corder = np.argsort(c.column("chunk_id").to_numpy(), kind="stable")
        self.chunk_ids = c.column("chunk_id").to_numpy().astype(np.int64)[corder]
        self.chunk_first = c.column("first_sentence_id").to_numpy().astype(np.int64)[corder]
        self.chunk_len = c.column("n_sentences").to_numpy().astype(np.int64)[corder]

    @property
    def ids(self) -> np.ndarray:
        return self.sentences.ids

    def text(self, sid: int) -> Optional[str]:
        pos = self.sentences.positions(np.array([sid]))[0]
        return None if pos < 0 else self.sentences.texts[pos]

    def texts(self, ids: Sequence[int]) -> List[Optional[str]]:
        pos = self.sentences.positions(np.asarray(ids, dtype=np.int64))
        return [None if p < 0 else self.sentences.texts[p] for p in pos]

    def doc_members(self, sid: int) -> np.ndarray:
        """All sentence ids of the document holding `sid` (ids share the high bits)."""
        doc = sid >> SENT_BITS
        lo = np.searchsorted(self.ids, doc << SENT_BITS)
        hi = np.searchsorted(self.ids, (doc + 1) << SENT_BITS)
        return self.ids[lo:hi]

    def chunk(self, chunk_id: int) -> Optional[Tuple[int, int]]:
        i = np.searchsorted(self.chunk_ids, chunk_id)
        if i >= len(self.chunk_ids) or self.chunk_ids[i] != chunk_id:
            return None
        return int(self.chunk_first[i]), int(self.chunk_len[i])

    def window(self, centre: int, w: int) -> Tuple[List[str], List[str]]:
        """The w sentences before and after `centre` within its document (fewer at the edges)."""
        doc = centre >> SENT_BITS
        left_ids = [i for i in range(centre - w, centre) if i >= 0 and (i >> SENT_BITS) == doc]
        right_ids = [i for i in range(centre + 1, centre + w + 1) if (i >> SENT_BITS) == doc]
        left = [t for t in self.texts(left_ids) if t is not None] if left_ids else []
        right = [t for t in self.texts(right_ids) if t is not None] if right_ids else []
        return left, right
