"""The corpus reader: read-only access to a corpus run (the layout `sentsim corpus build` writes, local
or s3://), shared by retrieval, the discriminator, screening, context training and the harvest.

Layout: `sentences/part-*.parquet` (sentence_id, doc_id, para_idx, sent_idx, text, n_tokens),
`chunks/part-*.parquet` (chunk_id, doc_id, first_sentence_id, n_sentences), `manifest.json`
with a "fingerprint" (the corpus's identity: sentsim.identity.corpus_fingerprint). Shards are read
through storage.RunReader: only units with a completion marker. Sentence ids follow
corpus.documents (SENT_BITS): within a document the neighbours of a sentence are id-1 and id+1.

`SentenceTable` and `ChunkTable` are lookups by id; `CorpusIndex` holds both (and the token counts)
in memory once per actor of the jobs that screen contexts or harvest.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from corpus.documents import doc_key_of, same_doc, sentence_id_of
from sentsim.errors import UsageError


def open_corpus(corpus: str | Path):
    """A RunReader over a corpus run, its `fingerprint` a non-empty string; anything else is a one-line
    UsageError naming it."""
    from storage import RunReader, StoreError

    try:
        reader = RunReader(str(corpus), manifest_required=False)
    except StoreError as exc:
        raise UsageError(
            str(exc).replace(": no such directory", ": not a corpus directory (no such directory)")) from None
    if not reader.manifest:
        raise UsageError(f"{corpus}: not a corpus directory (no manifest.json)")
    stage = reader.manifest.get("stage")
    if isinstance(stage, str) and stage != "corpus":
        raise UsageError(f"{corpus}: not a corpus directory but a '{stage}' run; give the --out of "
                         "`sentsim corpus build`")
    if not isinstance(reader.fingerprint, str) or not reader.fingerprint:
        raise UsageError(f"{corpus}/manifest.json: has no \"fingerprint\" string")
    unfinished = reader.incomplete_note()
    if unfinished:  # its fingerprint is the whole corpus's: what is built from part of it would pass for built from all
        raise UsageError(f"{unfinished}: finish the corpus first (the same `sentsim corpus build` command resumes "
                         "it); an index, cache or model built from part of it would carry the whole corpus's "
                         "fingerprint")
    return reader


def read_table(corpus, sub: str, columns: list[str]) -> pa.Table:
    """`corpus`: a path, URI or an open RunReader (saves re-reading the markers)."""
    reader = corpus if hasattr(corpus, "files") else open_corpus(corpus)
    if not reader.files(sub, required=False):
        raise UsageError(f"{reader.uri}/{sub}: no completed part-*.parquet shards (is this a corpus built by "
                         "`sentsim corpus build`?)")
    return reader.read_table(sub, columns)


def rows_in_sorted(sorted_ids: np.ndarray, ids) -> np.ndarray:
    """Row of each id in the sorted id array, -1 where it is not there (an empty array included)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(sorted_ids):
        return np.full(ids.shape, -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == ids, pos, -1)


class SentenceTable:
    """All sentence ids (sorted) with their texts; lookup by id through searchsorted."""

    def __init__(self, ids: np.ndarray, texts: list[str]):
        order = np.argsort(ids, kind="stable")
        self.ids = np.ascontiguousarray(ids[order], dtype=np.int64)
        self.texts = [texts[i] for i in order] if not np.all(order == np.arange(len(order))) else list(texts)

    @classmethod
    def load(cls, corpus: str | Path) -> "SentenceTable":
        t = read_table(corpus, "sentences", ["sentence_id", "text"])
        return cls(t.column("sentence_id").to_numpy().astype(np.int64), t.column("text").to_pylist())

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where the id is not in the corpus."""
        return rows_in_sorted(self.ids, ids)

    def text(self, sentence_id: int) -> str | None:
        p = int(self.positions(np.array([sentence_id]))[0])
        return None if p < 0 else self.texts[p]


class ChunkTable:
    """chunk_id -> (first_sentence_id, n_sentences), sorted by chunk_id."""

    def __init__(self, chunk_ids: np.ndarray, first: np.ndarray, n: np.ndarray):
        order = np.argsort(chunk_ids, kind="stable")
        self.chunk_ids = np.ascontiguousarray(chunk_ids[order], dtype=np.int64)
        self.first = np.ascontiguousarray(first[order], dtype=np.int64)
        self.n = np.ascontiguousarray(n[order], dtype=np.int64)

    @classmethod
    def load(cls, corpus: str | Path) -> "ChunkTable":
        t = read_table(corpus, "chunks", ["chunk_id", "first_sentence_id", "n_sentences"])
        return cls(t.column("chunk_id").to_numpy().astype(np.int64),
                   t.column("first_sentence_id").to_numpy().astype(np.int64),
                   t.column("n_sentences").to_numpy().astype(np.int64))

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def rows(self, chunk_ids: np.ndarray) -> np.ndarray:
        return rows_in_sorted(self.chunk_ids, chunk_ids)


def chunk_texts(chunks: ChunkTable, sentences: SentenceTable, rows: np.ndarray | None = None) -> list[str]:
    """Text of each chunk (its sentences joined by spaces); missing sentences are skipped."""
    rows = np.arange(len(chunks)) if rows is None else rows
    out = []
    for r in rows:
        first, n = int(chunks.first[r]), int(chunks.n[r])
        lo = int(np.searchsorted(sentences.ids, first))
        hi = int(np.searchsorted(sentences.ids, first + n))
        out.append(" ".join(sentences.texts[lo:hi]))
    return out


class CorpusIndex:
    """In-memory view of a corpus for the actors of a harvest or `sentsim contexts`: texts by id,
    documents, chunks. Held once per actor: a corpus of 1M sentences takes a few hundred MB here;
    beyond that, shard the corpus and run one harvest per shard."""

    def __init__(self, corpus: str):
        self.path = corpus
        reader = open_corpus(corpus)  # local or s3://; only units with a completion marker
        self.fingerprint: str = reader.fingerprint  # the corpus's identity (sentsim.identity.corpus_fingerprint)
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
