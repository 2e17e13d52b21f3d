"""Context sets C_s for the harvest (003 §3.3): retrieve chunks, expand slots, screen, select.

`ContextSource.context_sets(texts)` returns, per sentence, an ordered list of `Context`s. In
`screened` mode: TF-IDF bigram retrieval of chunks, one candidate per sentence slot, ranked by
the discriminator's log p(y=1 | s, c) from cached sentence representations (head only), then the
greedy diverse selection. In `random` mode (the paper's ablation): contexts around random corpus
sentences, seeded by the sentence text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

from sentsim.harvest.config import ContextSetConfig
from sentsim.harvest.corpus_index import CorpusIndex
from sentsim.screening.candidates import expand_candidates
from sentsim.screening.select import select_diverse, word_set


@dataclass
class Context:
    chunk_id: int
    slot: int
    centre_id: int
    left: List[str]
    right: List[str]
    retrieval_score: float
    log_p_disc: Optional[float] = None

    @property
    def key(self) -> int:
        """A context is identified by its centre slot; its window follows from the corpus."""
        return self.centre_id


@dataclass
class ContextSet:
    contexts: List[Context] = field(default_factory=list)
    candidates: int = 0
    shortfall_reason: Optional[str] = None


def _text_seed(seed: int, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{text}".encode(), digest_size=8).digest(), "big")


class ContextSource:
    def __init__(self, corpus: CorpusIndex, cfg: ContextSetConfig, window: int, seed: int,
                 retriever=None, discriminator=None):
        self.corpus = corpus
        self.cfg = cfg
        self.window = window
        self.seed = seed
        self.retriever = retriever
        self.disc = discriminator

    # ---- discriminator reps, cached per corpus sentence -------------------------------------
    def _rep_rows(self, positions: np.ndarray) -> np.ndarray:
        """Reps of corpus rows (-1 = missing -> zeros); each row is encoded once per actor."""
        n = len(self.corpus.ids)
        if not hasattr(self, "_rep"):
            self._rep = np.zeros((n + 1, self.disc.rep_dim), np.float32)  # last row stays zero
            self._have = np.zeros(n + 1, bool)
            self._have[n] = True
        pos = np.where(positions < 0, n, positions)
        todo = np.unique(pos[~self._have[pos]])
        if len(todo):
            self._rep[todo] = self.disc.encode([self.corpus.sentences.texts[i] for i in todo])
            self._have[todo] = True
        return self._rep[pos]

    def _disc_scores(self, text: str, cands: List[Context]) -> np.ndarray:
        """log p(y=1 | s, c) for one sentence in many contexts, from cached reps (head only)."""
        w = self.disc.window
        centre = np.array([c.centre_id for c in cands], dtype=np.int64)
        offs = np.arange(1, w + 1)
        left_ids = centre[:, None] - offs[::-1][None, :]
        right_ids = centre[:, None] + offs[None, :]
        doc = centre[:, None] >> 20

        def rows(ids):
            pos = self.corpus.sentences.positions(ids.ravel()).reshape(ids.shape)
            pos[(ids >> 20) != doc] = -1  # never cross a document edge; missing slots stay zero
            return self._rep_rows(pos.ravel()).reshape(ids.shape + (self.disc.rep_dim,))

        q = self.disc.encode([text])[0]
        logits = self.disc.score(rows(left_ids), q, rows(right_ids))
        return -np.logaddexp(0.0, -logits.astype(np.float64))  # log sigmoid

    # ---- context sets --------------------------------------------------------------------
    def _expand(self, chunk_ids: np.ndarray, scores: np.ndarray) -> List[Context]:
        """One candidate per sentence slot with a full window inside its document (edge slots,
        whose window would leave the document, give none: see sentsim.screening.candidates)."""
        c = expand_candidates(chunk_ids, scores, self.corpus.chunks, self.corpus.ids, self.window)
        if not len(c):
            return []
        lpos = self.corpus.sentences.positions(c.left_ids.ravel()).reshape(c.left_ids.shape)
        rpos = self.corpus.sentences.positions(c.right_ids.ravel()).reshape(c.right_ids.shape)
        texts = self.corpus.sentences.texts
        return [
            Context(int(c.chunk_id[i]), int(c.slot[i]), int(c.centre_id[i]), [texts[p] for p in lpos[i]],
                    [texts[p] for p in rpos[i]], float(c.retrieval_score[i]))
            for i in range(len(c))
        ]

    def context_sets(self, texts: Sequence[str]) -> List[ContextSet]:
        if self.cfg.mode == "random":
            return [self._random(t) for t in texts]
        ids, scores = self.retriever.search(list(texts), self.cfg.retrieve_chunks)
        return [self._screened(t, ids[i], scores[i]) for i, t in enumerate(texts)]

    def _screened(self, text: str, chunk_ids: np.ndarray, scores: np.ndarray) -> ContextSet:
        cands = self._expand(chunk_ids, scores)
        if not cands:
            reason = "no retrieved chunk" if text.strip() else "empty sentence"
            return ContextSet([], 0, reason)
        if self.disc is not None:
            primary = self._disc_scores(text, cands)
            for c, v in zip(cands, primary):
                c.log_p_disc = float(v)
        else:
            primary = np.array([c.retrieval_score for c in cands])  # retrieval order, then slot order
        picked = select_diverse(
            primary, np.array([c.chunk_id for c in cands]), [word_set(c.left[-1]) if c.left else frozenset() for c in cands],
            size=self.cfg.size, max_jaccard=self.cfg.jaccard, one_per_chunk=self.cfg.one_per_chunk,
            tiebreak=np.array([c.retrieval_score for c in cands]),
        )
        chosen = [cands[i] for i in picked]
        short = None if len(chosen) >= self.cfg.size else f"only {len(chosen)} diverse contexts among {len(cands)} candidates"
        return ContextSet(chosen, len(cands), short)

    def _random(self, text: str) -> ContextSet:
        rng = np.random.default_rng(_text_seed(self.seed, text))
        ids = self.corpus.ids
        n = min(self.cfg.size, len(ids))
        centres = np.sort(rng.choice(ids, size=n, replace=False))
        out = []
        for c in centres:
            left, right = self.corpus.window(int(c), self.window)
            out.append(Context(-1, 0, int(c), left, right, 0.0))
        return ContextSet(out, n, None if n >= self.cfg.size else f"corpus has only {n} sentences")
