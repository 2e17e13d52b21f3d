"""In-memory view of a corpus for the harvest actors: texts by id, documents, chunks.

Held once per actor. A corpus of 1M sentences takes a few hundred MB here; beyond that, shard
the corpus and run one harvest per shard.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from corpus.documents import doc_key_of, same_doc, sentence_id_of
from sentsim.retrieval.corpus_view import ChunkTable, SentenceTable, open_corpus, read_table


class CorpusIndex:
    def __init__(self, corpus: str):
        self.path = corpus
        reader = open_corpus(corpus)  # local or s3://; only units with a completion marker
        self.fingerprint = reader.fingerprint
        # one read of the sentence shards serves both the texts and the token counts
        t = read_table(reader, "sentences", ["sentence_id", "text", "n_tokens"])
        ids = t.column("sentence_id").to_numpy().astype(np.int64)
        self.sentences = SentenceTable(ids, t.column("text").to_pylist())
        self.n_tokens = t.column("n_tokens").to_numpy()[np.argsort(ids, kind="stable")]
        self.chunks = ChunkTable.load(reader)

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
        doc = doc_key_of(sid)
        lo = np.searchsorted(self.ids, sentence_id_of(doc, 0))
        hi = np.searchsorted(self.ids, sentence_id_of(doc + 1, 0))
        return self.ids[lo:hi]

    @staticmethod
    def same_doc(a: int, b: int) -> bool:
        return bool(same_doc(a, b))

    def chunk(self, chunk_id: int) -> Optional[Tuple[int, int]]:
        r = int(self.chunks.rows(np.array([chunk_id]))[0])
        return None if r < 0 else (int(self.chunks.first[r]), int(self.chunks.n[r]))

    def window(self, centre: int, w: int) -> Tuple[List[str], List[str]]:
        """The w sentences before and after `centre` within its document (fewer at the edges)."""
        left_ids = [i for i in range(centre - w, centre) if i >= 0 and same_doc(i, centre)]
        right_ids = [i for i in range(centre + 1, centre + w + 1) if same_doc(i, centre)]
        left = [t for t in self.texts(left_ids) if t is not None] if left_ids else []
        right = [t for t in self.texts(right_ids) if t is not None] if right_ids else []
        return left, right
