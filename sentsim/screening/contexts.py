"""Context sets C_s (003 §3.3): retrieve chunks, expand slots, screen, select. The one screening
implementation: the harvest's ContextStage and `sentsim contexts` (contexts_job.py) both ship it.

`ContextSource.context_sets(texts)` returns, per sentence, an ordered list of `Context`s. In
`screened` mode: TF-IDF bigram retrieval of chunks, one candidate per sentence slot, ranked by
the discriminator's log p(y=1 | s, c), then the greedy diverse selection. The discriminator runs
its LSTM on the query only: every context is scored from the corpus representation cache
(`cache.ContextCache`, built once per corpus and discriminator by cache_job.py) by
the head alone (`score.score_windows`), as 003 §3.3 prescribes. In `random` mode
(the paper's ablation): contexts around random corpus sentences with a full window, seeded by the
sentence text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import List, Optional, Sequence

import numpy as np

from corpus.view import CorpusIndex
from sentsim.errors import UsageError
from sentsim.screening.candidates import expand_candidates, full_windows, window_ids
from sentsim.screening.config import ContextSetConfig
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
    """`window`: context sentences on each side (the context models'). With a discriminator,
    `cache` is its representation cache of this corpus (jobs load the store's once per actor);
    when omitted it is built in memory, which suits small corpora and tests."""

    def __init__(self, corpus: CorpusIndex, cfg: ContextSetConfig, window: int, seed: int,
                 retriever=None, discriminator=None, cache=None):
        self.corpus = corpus
        self.cfg = cfg
        self.window = window
        self.seed = seed
        self.retriever = retriever
        self.disc = discriminator
        self.cache = None
        # A candidate needs a full window for the context models and for the discriminator
        # (the cache holds only windows inside a document); see sentsim.screening.candidates.
        self.expand_window = window
        if discriminator is not None:
            from sentsim.screening.cache import ContextCache, check_meta

            if cache is None:
                cache = ContextCache.build(discriminator, corpus.sentences)
            check_meta(cache.meta, discriminator, "representation cache")
            made_for = {"representation cache": cache.meta.get("corpus_fingerprint"),
                        "discriminator": getattr(discriminator, "corpus_fingerprint", None),
                        "index": getattr(retriever, "corpus_fingerprint", None)}
            other = sorted(k for k, v in made_for.items() if v not in (None, corpus.fingerprint))
            if other:
                raise UsageError(f"the {', '.join(other)} was made for another corpus than {corpus.path}; "
                                 "rebuild it for this corpus")
            self.cache = cache
            self.expand_window = max(window, discriminator.window)

    # ---- discriminator terms from the cache (head only) --------------------------------------
    def _log_p(self, features: np.ndarray, centre_ids: np.ndarray) -> np.ndarray:
        """log p(y=1 | s, c) of one sentence (features from disc.project_sentences) in the
        discriminator windows around `centre_ids`."""
        from sentsim.screening.score import score_windows

        centre_ids = np.asarray(centre_ids, dtype=np.int64)
        left, right = window_ids(centre_ids, self.disc.window)
        logits = score_windows(self.disc, self.cache, features, centre_ids, left, right)
        return -np.logaddexp(0.0, -logits.astype(np.float64))  # log sigmoid

    def sentence_features(self, texts: Sequence[str]) -> np.ndarray:
        """The discriminator's per-sentence features (the only LSTM run): compute them once per
        sentence and pass them to `context_sets` and `disc_scores`."""
        from sentsim.screening.threads import one_torch_thread

        with one_torch_thread():  # the same bits in every executor (screening/threads.py)
            return self.disc.project_sentences(self.disc.encode(list(texts)))

    def disc_scores(self, text: str, contexts: Sequence[Context], features: Optional[np.ndarray] = None) -> np.ndarray:
        """log p(y=1 | text, c) for each context (e.g. a partner's C_s, for the cross terms);
        `features`: the text's row of `sentence_features`, when already computed."""
        f = self.sentence_features([text]) if features is None else features
        return self._log_p(f, np.array([c.centre_id for c in contexts], dtype=np.int64))

    # ---- context sets --------------------------------------------------------------------
    def _expand(self, chunk_ids: np.ndarray, scores: np.ndarray) -> "_Candidates":
        """One candidate per sentence slot with a full window inside its document (edge slots,
        whose window would leave the document, give none: see sentsim.screening.candidates)."""
        return _Candidates(self, expand_candidates(chunk_ids, scores, self.corpus.chunks, self.corpus.ids,
                                                   self.expand_window))

    def context_sets(self, texts: Sequence[str], features: Optional[np.ndarray] = None) -> List[ContextSet]:
        if self.cfg.mode == "random":
            return [self._random(t) for t in texts]
        ids, scores = self.retriever.search(list(texts), self.cfg.retrieve_chunks)
        feats = features
        if feats is None and self.disc is not None and len(texts):
            feats = self.sentence_features(texts)
        return [self._screened(t, ids[i], scores[i], None if feats is None else feats[i:i + 1])
                for i, t in enumerate(texts)]

    def _screened(self, text: str, chunk_ids: np.ndarray, scores: np.ndarray, features=None) -> ContextSet:
        if not word_set(text):
            return ContextSet([], 0, "empty sentence (no words)")
        cands = self._expand(chunk_ids, scores)
        if self.cfg.exclude_query_centre and len(cands):
            query = text.strip()
            own = self.corpus.texts(cands.arrays.centre_id)
            cands = cands.subset(np.array([t is None or t.strip() != query for t in own], dtype=bool))
        if self.cfg.exclude_query_window and len(cands):
            cands = cands.subset(~self._holding(cands.column("centre_id"), text.strip()))
        if not len(cands):
            reason = "no retrieved chunk" if int((np.asarray(chunk_ids) >= 0).sum()) == 0 else \
                "retrieved chunks give no full window"
            return ContextSet([], 0, reason)
        centres, retrieval = cands.column("centre_id"), cands.column("retrieval_score")
        primary = retrieval  # retrieval order, then slot order
        if self.disc is not None:
            primary = self._log_p(features, centres)
        # with contexts.rerank_shortlist, the shortlist that Eq. 3 picks C_s from (harvest/rerank.py)
        picked = select_diverse(
            primary, cands.column("chunk_id"), cands.previous_word_sets(),
            size=max(self.cfg.size, self.cfg.rerank_shortlist), max_jaccard=self.cfg.jaccard,
            one_per_chunk=self.cfg.one_per_chunk,
            tiebreak=retrieval,
        )
        chosen = [cands[i] for i in picked]
        if self.disc is not None:
            for i, c in zip(picked, chosen):
                c.log_p_disc = float(primary[i])
        short = (None if len(chosen) >= self.cfg.size
                 else f"only {len(chosen)} diverse contexts among {len(cands)} candidates")
        return ContextSet(chosen, len(cands), short)

    def _holding(self, centres: np.ndarray, query: str) -> np.ndarray:
        """Which candidates' windows (every sentence within `expand_window` of the centre, the widest window
        any model reads) hold the query's text. A candidate's window lies inside its document and sentence
        ids run on within one, so it holds sentence q exactly when |centre - q| <= w."""
        w = self.expand_window
        hold = np.zeros(len(centres), dtype=bool)
        for q in self._near_by_text(centres, w).get(query, ()):
            hold |= np.abs(centres - q) <= w
        return hold

    def _near_by_text(self, centres: np.ndarray, reach: int) -> dict:
        """The corpus sentences within `reach` of any centre, by their stripped text."""
        near = np.unique((np.asarray(centres, dtype=np.int64)[:, None] + np.arange(-reach, reach + 1)[None, :]).ravel())
        near = near[near >= 0]
        out: dict = {}
        for i, t in zip(near.tolist(), self.corpus.texts(near)):
            if t is not None:
                out.setdefault(t.strip(), []).append(i)
        return out

    def held_items(self, texts: dict, centres: Sequence[int]) -> frozenset:
        """(sentence, context key) for each sentence of `texts` (id -> text) and each of the `centres` whose
        window holds its text by the rules that keep such windows out of its own C_s: centred on it
        (exclude_query_centre) or beside the centre (exclude_query_window). What Eq. 4 leaves out of a pair's
        comparison in the partner's contexts (ContextSetConfig.exclude_in_partner_contexts)."""
        if not self.cfg.partner_exclusion or not len(centres):
            return frozenset()
        reach = self.expand_window if self.cfg.exclude_query_window else 0
        centres = np.unique(np.asarray(centres, dtype=np.int64))
        near = self._near_by_text(centres, reach)
        out = set()
        for s, text in texts.items():
            for q in near.get((text or "").strip(), ()):
                out.update((s, int(c)) for c in centres[np.abs(centres - q) <= reach])
        return frozenset(out)

    @cached_property
    def _random_centres(self) -> np.ndarray:
        """The sentences a random context may be centred on: those with a full window (a window cut short by
        its document's edge drops an Eq. 3 term and so raises S there for every sentence), or every sentence
        for runs made before `contexts.random_full_windows`."""
        ids = self.corpus.ids
        return ids[full_windows(ids, ids, self.window)] if self.cfg.random_full_windows else ids

    def _random(self, text: str) -> ContextSet:
        rng = np.random.default_rng(_text_seed(self.seed, text))
        ids = self._random_centres
        n = min(self.cfg.size, len(ids))
        centres = np.sort(rng.choice(ids, size=n, replace=False))
        out = []
        for c in centres:
            left, right = self.corpus.window(int(c), self.window)
            out.append(Context(-1, 0, int(c), left, right, 0.0))
        held = "with a full window " if self.cfg.random_full_windows else ""
        return ContextSet(out, n, None if n >= self.cfg.size else f"corpus has only {n} sentences {held}".strip())


class _Candidates(Sequence):
    """One query's expanded candidates (sentsim.screening.candidates), as Contexts built on access.

    A query's retrieved chunks give tens of thousands of candidate slots (up to ~150K on the
    reference corpus), and the greedy selection visits them best-first and stops at |C_s|: building
    every Context, and every word set of the Jaccard rule, up front cost more than the selection
    itself. Only the candidates the selection looks at are built; the chosen ones are the same."""

    def __init__(self, source: ContextSource, arrays, rows: Optional[np.ndarray] = None):
        self.source, self.arrays = source, arrays
        self.rows = np.arange(len(arrays.centre_id)) if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, keep: np.ndarray) -> "_Candidates":
        return _Candidates(self.source, self.arrays, self.rows[keep])

    def column(self, name: str) -> np.ndarray:
        return getattr(self.arrays, name)[self.rows]

    def __getitem__(self, i: int) -> Context:
        a, r, k = self.arrays, self.rows[i], self.source.window  # the context models' innermost k sentences
        texts = self.source.corpus.texts  # every window sentence exists: expand_candidates checked it
        return Context(int(a.chunk_id[r]), int(a.slot[r]), int(a.centre_id[r]), texts(a.left_ids[r, -k:]),
                       texts(a.right_ids[r, :k]), float(a.retrieval_score[r]))

    def previous_word_sets(self) -> Sequence:
        """The word set of each candidate's (i-1)-th sentence (the Jaccard rule's), computed on access."""
        return _PreviousWordSets(self)


class _PreviousWordSets(Sequence):
    def __init__(self, cands: _Candidates):
        self.cands = cands

    def __len__(self) -> int:
        return len(self.cands)

    def __getitem__(self, i: int) -> frozenset:
        c = self.cands
        return word_set(c.source.corpus.texts(c.arrays.left_ids[c.rows[i], -1:])[0])
