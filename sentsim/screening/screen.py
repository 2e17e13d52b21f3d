"""Screening: for a query sentence, retrieve chunks, expand them into candidate contexts, score
every candidate with the discriminator head only (cached reps), and select a diverse C_s.

Every query gets a `ContextSet`; when fewer than `size` contexts survive, `shortfall` says how
many are missing and `note` why (empty query, no retrieved chunk, too few candidates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from pydantic import Field

from sentsim.config import Section
from sentsim.errors import UsageError
from sentsim.screening.candidates import Candidates, expand_candidates
from sentsim.screening.select import select_diverse, word_set


class ScreenConfig(Section):
    # Paper 003 §3.3: |C_s| = 500.
    size: int = Field(500, ge=1)
    # Paper 003 §3.3: Jaccard of the (i-1)-th sentences "lower than 0.5".
    max_jaccard: float = Field(0.5, gt=0.0, le=1.0)
    # Paper 003 §3.3: "20K" chunks retrieved per sentence.
    chunks: int = Field(20_000, ge=1)
    # Paper 003 §3.3: "each text chunk is allowed to contribute at most one context".
    one_per_chunk: bool = True
    # Drop candidates whose own centre sentence is the query (a corpus sentence in its own context).
    exclude_query_centre: bool = True
    score_batch: int = Field(32_768, ge=1)


@dataclass
class ContextSet:
    query: str
    chunk_id: np.ndarray
    slot: np.ndarray
    centre_id: np.ndarray
    retrieval_score: np.ndarray
    discriminator_score: np.ndarray
    n_retrieved: int
    n_candidates: int
    shortfall: int
    note: str = ""
    dropped: dict = field(default_factory=dict)


def score_candidates(disc, cache, sentence_features: np.ndarray, cands: Candidates, batch: int = 32_768) -> np.ndarray:
    """Discriminator logits of one sentence (features from `disc.project_sentences`) in every
    candidate context, from cached reps only (no LSTM run). See `score_windows`."""
    return score_windows(disc, cache, sentence_features, cands.centre_id, cands.left_ids, cands.right_ids, batch)


def score_windows(disc, cache, sentence_features: np.ndarray, centre_ids: np.ndarray, left_ids: np.ndarray,
                  right_ids: np.ndarray, batch: int = 32_768) -> np.ndarray:
    """Logits of one sentence in the windows around `centre_ids` ([m, w] side ids each).

    Uses the head's decomposition: logit = [g, l, r] . [1, a*v, b*v] + p(v) + a_l cl + a_r cr,
    i.e. one matrix-vector product over the cached context rows plus two gathered cosines.
    Equal to `disc.score_projected(cache.context_features(...), sentence_features)`.
    """
    head = disc.model.head
    d = head.d
    f = np.asarray(sentence_features, np.float32).reshape(-1)
    p, v, hn = float(f[0]), f[1:1 + d], f[1 + d:]
    q = np.concatenate([[1.0], v * head.bil_left.detach().numpy(), v * head.bil_right.detach().numpy()]).astype(np.float32)
    a_l, a_r = (float(x) for x in head.cos_weight.detach().numpy())
    out = np.empty(len(centre_ids), dtype=np.float32)
    for lo in range(0, len(centre_ids), batch):
        hi = lo + batch
        rows = cache.centre_rows(centre_ids[lo:hi])
        base = np.asarray(cache.core[rows]) @ q
        cl, cr = cache.side_cosines(hn, left_ids[lo:hi], right_ids[lo:hi], rows)
        out[lo:hi] = base + p + a_l * cl + a_r * cr
    return out


class Screener:
    def __init__(self, retriever, disc, cache, chunks, sentences, cfg: ScreenConfig | None = None):
        self.cfg = cfg or ScreenConfig()
        fps = {"index": retriever.corpus_fingerprint, "discriminator": disc.corpus_fingerprint,
               "cache": cache.meta.get("corpus_fingerprint")}
        if len(set(fps.values())) != 1:
            raise UsageError(f"index, discriminator and cache were built for different corpora: {fps}")
        self.retriever, self.disc, self.cache = retriever, disc, cache
        self.chunks, self.sentences = chunks, sentences

    def screen(self, queries: Sequence[str]) -> list[ContextSet]:
        cfg = self.cfg
        queries = list(queries)
        ids, scores = self.retriever.search(queries, cfg.chunks)
        sent_feats = self.disc.project_sentences(self.disc.encode(queries)) if queries else None
        out = []
        for qi, q in enumerate(queries):
            n_ret = int((ids[qi] >= 0).sum())
            cands = expand_candidates(ids[qi], scores[qi], self.chunks, self.cache.sentence_ids, self.cache.window)
            dropped = dict(cands.dropped)
            if cfg.exclude_query_centre and len(cands):
                centre_texts = [self.sentences.texts[p] for p in self.sentences.positions(cands.centre_id)]
                keep = np.array([t.strip() != q.strip() for t in centre_texts], dtype=bool)
                dropped["query_centre"] = int((~keep).sum())
                cands = _subset(cands, keep)
            disc_scores = score_candidates(self.disc, self.cache, sent_feats[qi:qi + 1], cands, cfg.score_batch)
            prev_pos = self.sentences.positions(cands.prev_id)
            prev_tokens = [word_set(self.sentences.texts[p]) for p in prev_pos]
            sel = select_diverse(disc_scores, cands.chunk_id, prev_tokens, size=cfg.size,
                                 max_jaccard=cfg.max_jaccard, one_per_chunk=cfg.one_per_chunk,
                                 tiebreak=cands.retrieval_score)
            shortfall = cfg.size - len(sel)
            if not word_set(q):
                note = "empty query (no words)"
            elif n_ret == 0:
                note = "no retrieved chunk"
            elif len(cands) == 0:
                note = "retrieved chunks give no full window"
            elif shortfall:
                note = "fewer diverse candidates than size"
            else:
                note = ""
            out.append(ContextSet(
                query=q, chunk_id=cands.chunk_id[sel], slot=cands.slot[sel], centre_id=cands.centre_id[sel],
                retrieval_score=cands.retrieval_score[sel], discriminator_score=disc_scores[sel],
                n_retrieved=n_ret, n_candidates=len(cands), shortfall=shortfall, note=note, dropped=dropped,
            ))
        return out


def _subset(c: Candidates, mask: np.ndarray) -> Candidates:
    return Candidates(c.chunk_id[mask], c.slot[mask], c.centre_id[mask], c.left_ids[mask], c.right_ids[mask],
                      c.retrieval_score[mask], dict(c.dropped))
