"""The harvest's stages; `job.py` composes them into a list, each with `resources.<name>` of its config.
What each hands to the next is declared in `work.py`.

    ContextStage (CPU)  partners for each anchor, context sets C_s, discriminator terms (head
                        only, from the representation cache each actor loads once)
    ScoreStage   (GPU)  with contexts.rerank_shortlist, C_s re-ranked by Eq. 3 (rerank.py); then S(s, c) for
                        every needed (sentence, context), Eq. 4 per pair
    RankStage    (CPU/GPU) rank-vector codes (or vectors) per sentence, rank similarity per pair
    WriteStage   (CPU)  the unit's shards (pairs, sentences, context_scores) and its completion marker
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from corpus.documents import text_id
from sentsim.harvest import metrics
from sentsim.harvest.config import HarvestConfig
from sentsim.harvest.eq4_rows import UnitTerms, context_effect, pair_rows
from sentsim.harvest.pairs import AnchorPartners, pair_id, pair_split
from sentsim.harvest.work import (
    ContextScore,
    Pair,
    PairRow,
    Ranked,
    Scored,
    SentenceContexts,
    SentenceRanks,
    WithContexts,
    envelope,
    work_of,
)
from sentsim.pipeline import PLACEMENT_KEY, Stage, where_this_runs
from sentsim.screening.config import discriminator_in_use
from storage.store import run_format

DIRS = ("fwd", "left", "right")

PAIR_SCHEMA = pa.schema([
    ("pair_id", pa.int64()), ("s1_id", pa.int64()), ("s2_id", pa.int64()),
    ("s1", pa.string()), ("s2", pa.string()), ("kind", pa.string()),
    ("score", pa.float64()), ("null_reason", pa.string()),
    ("sim_fwd", pa.float64()), ("sim_left", pa.float64()), ("sim_right", pa.float64()), ("sim_disc", pa.float64()),
    ("n_ctx_s1", pa.int32()), ("n_ctx_s2", pa.int32()),
    ("rank_sim", pa.float64()), ("split", pa.string()), ("gold", pa.float64()),
])
SENTENCE_SCHEMA = pa.schema([
    ("sentence_id", pa.int64()), ("text", pa.string()), ("n_contexts", pa.int32()),
    ("shortfall", pa.string()), ("rank_codes", pa.list_(pa.uint32())),
    # C_s itself (context ids, in order): a pair's Eq. 4 vectors run over C_s1 + C_s2, which
    # `sentsim remix` needs to recompute scores exactly from context_scores.
    ("context_ids", pa.list_(pa.int64())),
    # rank.storage=vectors: E1's float16 vector, from which ranks over the run's anchor matrix (side
    # table rank_anchors) are computed where used; rank_codes is then null, and base_vector is null in
    # a codes run.
    ("base_vector", pa.list_(pa.float16())),
])
# Every (sentence, context) term Eq. 4 reads, so `sentsim remix` can re-weigh Eq. 3 without scoring again (the
# contexts an Eq. 3 re-rank dropped from C_s are not kept: harvest/rerank.py).
# float32: 2 x 8 + 5 x 4 = 36 bytes per item before compression, where float64 took 56; the terms are
# per-token log-probabilities from a float32 (or bf16) model, so float32 drops only digits below the
# model's own resolution (a remix moves scores by ~1e-7; bench/results/scale.md).
# harvest keep_context_scores=none writes no such table at all.
CONTEXT_SCORE_SCHEMA = pa.schema([
    ("sentence_id", pa.int64()), ("context_id", pa.int64()),
    ("fwd", pa.float32()), ("left", pa.float32()), ("right", pa.float32()), ("disc", pa.float32()), ("S", pa.float32()),
])
# Run format 1 (storage.store.FORMAT_VERSION): a harvest of that format may lack sentences' context_ids or
# base_vector, and may keep float64 context scores; a resumed one keeps writing its own schema. Format 2
# harvests are opened with the schemas above. A remix copies its source's schemas into its own run, so a
# remix of a format 1 harvest holds them too. The typed-hand-offs note in docs/notes/ says when these
# can go.
LEGACY_SENTENCE_SCHEMA = pa.schema([f for f in SENTENCE_SCHEMA if f.name not in ("context_ids", "base_vector")])
LEGACY_CONTEXT_SCORE_SCHEMA = pa.schema([
    f if f.type != pa.float32() else pa.field(f.name, pa.float64()) for f in CONTEXT_SCORE_SCHEMA])


def may_hold_format_1_schemas(manifest: dict) -> bool:
    """A format 1 run, or a remix (stage "harvest-remix", of any format: its schemas are its source's)."""
    return run_format(manifest) == 1 or manifest.get("stage") == "harvest-remix"


def sentence_schema_of(manifest: dict) -> pa.Schema:
    """The sentences schema a run was opened with: the current one, except where a run may hold a format 1
    schema, which is the current schema less the columns its manifest lacks."""
    tables = manifest.get("tables", {})
    if not may_hold_format_1_schemas(manifest) or "sentences" not in tables:
        return SENTENCE_SCHEMA
    names = {f[0] for f in tables["sentences"]}
    return pa.schema([f for f in SENTENCE_SCHEMA if f.name in names])


def context_score_schema_of(manifest: dict) -> Optional[pa.Schema]:
    """The context_scores schema a run was opened with: None for a run that keeps none
    (keep_context_scores=none), float64 where a run may hold a format 1 schema and does, else the current one."""
    tables = manifest.get("tables", {})
    if "context_scores" not in tables:
        return None if "pairs" in tables else CONTEXT_SCORE_SCHEMA
    types = {f[0]: f[1] for f in tables["context_scores"]}
    if may_hold_format_1_schemas(manifest) and types.get("S") == "double":
        return LEGACY_CONTEXT_SCORE_SCHEMA
    return CONTEXT_SCORE_SCHEMA


def rank_storage_of(cfg: HarvestConfig, sentence_schema: pa.Schema) -> str:
    """'codes' or 'vectors' for this run's rank targets: rank.storage resolved against E1's dimension
    (loaded only for `auto`), except that a run whose sentences schema has no base_vector keeps its codes."""
    from sentsim.rank import resolve_storage

    if "base_vector" not in sentence_schema.names:
        return "codes"
    dim = 0
    if cfg.rank.storage == "auto":
        from sentsim.rank.targets import default_base_encoder, encoder_dim

        dim = encoder_dim(cfg.rank.encoder or default_base_encoder())
    return resolve_storage(cfg.rank.storage, cfg.rank.n_anchors, cfg.rank.bits, dim)


def pair_schema(grouped: bool) -> pa.Schema:
    """The pairs table: grouped harvests add the group id and the three Eq. 4 variants (grouping.py)."""
    from sentsim.harvest.grouping import GROUP_FIELDS

    return pa.schema(list(PAIR_SCHEMA) + [pa.field(n, t) for n, t in GROUP_FIELDS]) if grouped else PAIR_SCHEMA


class ContextStage(Stage):
    """A unit dict (job.plan) -> WithContexts."""

    name = "contexts"

    def __init__(self, cfg: HarvestConfig, window: int, rep_cache: Optional[str] = None,
                 anchors: Optional[np.ndarray] = None, reference_texts: Optional[List[str]] = None):
        self.cfg = cfg
        self.window = window
        self.rep_cache = rep_cache  # the discriminator's representation cache run (job.py builds it)
        # ScoreStage scores these in every context when the metric reads the context effect: they need the
        # disc term there as every other item does
        self.reference_texts = (list(reference_texts or []) if metrics.get(cfg.metric).uses_context_effect
                                else [])
        # every anchor of the run, sorted: given once per actor, so a unit carries only its own anchors
        self.anchors = (np.sort(np.asarray(anchors, dtype=np.int64)) if anchors is not None
                        else np.zeros(0, dtype=np.int64))

    def setup(self) -> None:
        from corpus.view import CorpusIndex
        from sentsim.screening.contexts import ContextSource

        cfg = self.cfg
        self.corpus = CorpusIndex(cfg.corpus)
        retriever = disc = cache = None
        if cfg.index:
            from sentsim.retrieval import open_retriever

            retriever = open_retriever(cfg.index, corpus=cfg.corpus)
        if discriminator_in_use(cfg.discriminator, cfg.contexts.mode):
            from sentsim.discriminator import Discriminator
            from sentsim.screening.cache import ContextCache

            disc = Discriminator.load(cfg.discriminator, corpus=cfg.corpus)
            if self.rep_cache:  # loaded once per actor (003 §3.3: reps cached in advance)
                cache = ContextCache.from_store(self.rep_cache, disc)
        self.retriever = retriever
        self.partners = AnchorPartners(self.corpus, retriever, cfg.partners, cfg.seed, self.anchors)
        self.source = ContextSource(self.corpus, cfg.contexts, self.window, cfg.seed, retriever, disc, cache)
        self.reference_features = (self.source.sentence_features(self.reference_texts)
                                   if disc is not None and self.reference_texts else None)

    def _pairs_and_texts(self, unit: dict) -> tuple[List[Pair], Dict[int, str]]:
        """The unit's pairs and the text of each sentence they (and its anchors) hold."""
        if unit.get("pairs") is None:
            pairs = self.partners.pairs(unit["anchors"])
            sids = sorted({s for p in pairs for s in (p.s1_id, p.s2_id)} | set(unit["anchors"]))
            return pairs, dict(zip(sids, self.corpus.texts(sids)))
        pairs, texts = [], {}  # a pairs file's rows: (s1 text, s2 text, gold)
        repeat = unit.get("repeats") or [0] * len(unit["pairs"])
        for (s1, s2, gold), k in zip(unit["pairs"], repeat):
            a, b = text_id(s1), text_id(s2)
            texts[a], texts[b] = s1, s2
            pairs.append(Pair(a, b, "explicit", gold, k))
        return pairs, dict(sorted(texts.items()))

    def _disc_terms(self, unit: dict, pairs: List[Pair], texts: Dict[int, str], csets: dict,
                    feats) -> Dict[tuple, float]:
        """The discriminator term of each sentence in its own contexts and, for cross terms, in its
        partner's contexts; with grouping, in the contexts of every sentence of its group too (grouping.py
        scores each group's sentences over the group's whole union)."""
        disc: Dict[tuple, float] = {}
        for s, cs in csets.items():
            for c in cs.contexts:
                if c.log_p_disc is not None:
                    disc[(s, c.key)] = c.log_p_disc
        if self.source.disc is None:
            return disc
        row_of = {s: i for i, s in enumerate(csets)}

        def add(s: int, other: int) -> None:
            todo = [c for c in csets[other].contexts if (s, c.key) not in disc]
            if todo:
                i = row_of[s]
                for c, v in zip(todo, self.source.disc_scores(texts[s], todo, feats[i:i + 1])):
                    disc[(s, c.key)] = float(v)

        for p in pairs:
            add(p.s1_id, p.s2_id)
            add(p.s2_id, p.s1_id)
        if self.reference_features is not None:  # ScoreStage's ("ref", i) items: every context of the unit
            contexts = list({c.key: c for cs in csets.values() for c in cs.contexts}.values())
            for i, text in enumerate(self.reference_texts):
                if contexts:
                    values = self.source.disc_scores(text, contexts, self.reference_features[i:i + 1])
                    disc.update({(("ref", i), c.key): float(v) for c, v in zip(contexts, values)})
        if self.cfg.grouping.enabled:
            from sentsim.harvest.grouping import members

            group_of, _ = pair_groups(unit["unit"], bool(unit.get("anchors")), pairs, texts,
                                      self.cfg.grouping.pairs_per_group)
            for ss in members([(p.s1_id, p.s2_id) for p in pairs], group_of).values():
                for s in ss:
                    for other in ss:
                        add(s, other)
        return disc

    def process(self, items: List[dict]) -> List[dict]:
        out = []
        for unit in items:
            t0 = time.perf_counter()
            pairs, texts = self._pairs_and_texts(unit)
            sids = list(texts)  # sorted
            # the discriminator's LSTM runs once per sentence of the unit: its features serve the
            # sentence's own screening and every cross term
            feats = (self.source.sentence_features([texts[s] for s in sids])
                     if self.source.disc is not None and sids else None)
            csets = dict(zip(sids, self.source.context_sets([texts[s] for s in sids], feats)))
            # own C_s leaves out the windows that hold s; its partners' and group's contexts may not
            held = self.source.held_items(texts, [c.key for cs in csets.values() for c in cs.contexts])
            work = WithContexts(unit=unit["unit"], anchored=bool(unit.get("anchors")), pairs=pairs, texts=texts,
                                csets=csets, disc=self._disc_terms(unit, pairs, texts, csets, feats), held=held)
            work.timing["contexts"] = time.perf_counter() - t0
            out.append(envelope(work))
        return out


@dataclass(frozen=True)
class UnitGroups:
    """A grouped unit's groups (grouping.py): its pairs as (s1, s2), each pair's group, each sentence's
    C_s keys, and each pair's run-unique group id."""

    pairs: List[Tuple[int, int]]
    group_of: List[int]
    own: Dict[int, List[int]]
    ids: List[int]


@dataclass(frozen=True)
class ScorePlan:
    """What one unit asks of a scoring call: the (sentence, context) of each item its Eq. 4 rows read, its
    groups (None when ungrouped), the reference sentences of the context effect, and its contexts by key.
    `known`: the items the Eq. 3 re-rank scored already (rerank.py), each with its row of that pass's result;
    `held`: the items Eq. 4 leaves out (WithContexts.held), never scored; the others are the call's items
    [start, start + n_new), in `keys` order."""

    start: int
    keys: List[tuple]
    groups: Optional[UnitGroups]
    refs: List[str]
    ctx_by_key: Dict[int, Any]
    known: Dict[tuple, int] = field(default_factory=dict)
    held: FrozenSet[tuple] = frozenset()

    @cached_property  # read for the batch, the item counts and the values: one pass over the keys, not three
    def new_keys(self) -> List[tuple]:
        skip = self.known.keys() | self.held
        return [k for k in self.keys if k not in skip] if skip else self.keys


class ScoreStage(Stage):
    """WithContexts -> Scored."""

    name = "scoring"

    def __init__(self, cfg: HarvestConfig, reference_texts: List[str]):
        self.cfg = cfg
        self.reference_texts = reference_texts

    def setup(self) -> None:
        import torch

        from sentsim.context.scorer import ContextScorer

        sc = self.cfg.scoring
        if sc.device == "auto" and not torch.cuda.is_available():
            sc = sc.model_copy(update={"device": "cpu"})
        self.scorer = ContextScorer(self.cfg.context_models, sc)

    def process(self, items: List[dict]) -> List[dict]:
        """Every unit of the call is scored in one `ContextScorer.score`: on a GPU, one unit's items
        (a few thousand at |C_s| = 16) are too few batches to keep it busy (`resources.scoring.units_per_call`)."""
        from sentsim.context.scorer import ContextItem

        t0 = time.perf_counter()
        units: List[WithContexts] = [work_of(x) for x in items]
        pre = None
        if self.cfg.contexts.rerank_shortlist:  # C_s by Eq. 3 first: the Eq. 4 items depend on it
            from sentsim.harvest.rerank import rerank

            pre = rerank(units, self.scorer, self.cfg.contexts.size)
            units = pre.units
        plans, batch = [], []
        for i, w in enumerate(units):
            plan = self._needed(w, start=len(batch), known=pre.rows[i] if pre else {})
            plans.append(plan)
            for s, k in plan.new_keys:
                c = plan.ctx_by_key[k]
                sent = plan.refs[s[1]] if isinstance(s, tuple) else w.texts[s]
                batch.append(ContextItem(sent, c.left, c.right, w.disc.get((s, k))))
        res = self.scorer.score(batch) if batch else None
        scored = [len(p.new_keys) + (pre.items[i] if pre else 0) for i, p in enumerate(plans)]
        share = (time.perf_counter() - t0) / max(sum(scored), 1)  # a unit's scoring time: its share of the items
        return [envelope(self._scored(w, self._values(plan, res, pre), plan, n, seconds=share * n,
                                      n_reranked=pre.items[i] if pre else 0))
                for i, (w, plan, n) in enumerate(zip(units, plans, scored))]

    @staticmethod
    def _values(plan: ScorePlan, res, pre) -> tuple:
        """(S, {direction: log-prob}) of each of the plan's keys, from the call's result and, for the items the
        re-rank scored, from its result."""
        n, new = len(plan.keys), len(plan.new_keys)
        part = slice(plan.start, plan.start + new)
        if n == 0:  # a unit whose every pair has no contexts: nothing to read (and no result when no unit had)
            return np.zeros(0), {d: np.zeros(0) for d in DIRS}
        if new == n:  # every item scored by this call
            return res.score[part], {d: res.logprob[d][part] for d in DIRS}
        # a held item stays NaN: Eq. 4 leaves it out, as an item not scored
        S, lp = np.full(n, np.nan), {d: np.full(n, np.nan) for d in DIRS}
        if plan.known:
            hit = np.array([k in plan.known for k in plan.keys], dtype=bool)
            rows = np.array([plan.known[k] for k in plan.keys if k in plan.known], dtype=np.int64)
            S[hit] = pre.result.score[rows]
            for d in DIRS:
                lp[d][hit] = pre.result.logprob[d][rows]
        if new:
            fresh = np.array([k not in plan.known and k not in plan.held for k in plan.keys], dtype=bool)
            S[fresh] = res.score[part]
            for d in DIRS:
                lp[d][fresh] = res.logprob[d][part]
        return S, lp

    def _needed(self, w: WithContexts, start: int, known: Optional[Dict[tuple, int]] = None) -> ScorePlan:
        """Every (sentence, context) the unit's pairs need, each once (own and cross terms alike), and
        with grouping each group's sentences against the group's whole union; then the reference
        sentences in every context, when the metric reads the context effect."""
        ctx_by_key = {c.key: c for cs in w.csets.values() for c in cs.contexts}
        need = {}
        for p in w.pairs:
            keys = [c.key for c in w.csets[p.s1_id].contexts] + [c.key for c in w.csets[p.s2_id].contexts]
            for s in (p.s1_id, p.s2_id):
                for k in keys:
                    need.setdefault((s, k), None)
        groups = self._groups(w) if self.cfg.grouping.enabled else None
        if groups is not None:
            from sentsim.harvest.grouping import needed

            for key in needed(groups.pairs, groups.group_of, groups.own):
                need.setdefault(key, None)
        refs = self.reference_texts if metrics.get(self.cfg.metric).uses_context_effect else []
        ref_keys = [(("ref", i), k) for i in range(len(refs)) for k in ctx_by_key]
        keys = list(need) + ref_keys
        return ScorePlan(start, keys, groups, refs, ctx_by_key, {k: r for k, r in (known or {}).items() if k in need},
                         w.held)

    def _scored(self, w: WithContexts, values: tuple, plan: ScorePlan, n_scored: int, seconds: float,
                n_reranked: int = 0) -> Scored:
        """The unit's pair rows (Eq. 4, eq4_rows.py) and context_scores from its items' S and log-probs."""
        keys, groups = plan.keys, plan.groups
        S, logprob = values
        disc = np.array([w.disc.get(key, np.nan) for key in keys], dtype=np.float64)
        if w.held:  # items in a window holding their sentence: left out of Eq. 4 (dropped pairwise as unscored)
            gone = np.array([key in w.held for key in keys], dtype=bool)
            S, disc = np.where(gone, np.nan, S), np.where(gone, np.nan, disc)
            logprob = {d: np.where(gone, np.nan, v) for d, v in logprob.items()}
        terms = UnitTerms(keys, S, {"disc": disc, **logprob})
        refs = [("ref", i) for i in range(len(plan.refs))]
        effect = context_effect(terms, refs, plan.ctx_by_key) if refs else None
        eq4 = pair_rows([(p.s1_id, p.s2_id) for p in w.pairs], terms, self.cfg.metric,
                        own={s: [c.key for c in cs.contexts] for s, cs in w.csets.items()},
                        shortfall={s: cs.shortfall_reason for s, cs in w.csets.items()}, effect=effect,
                        group_of=groups.group_of if groups is not None else None, variant=self.cfg.grouping.score)
        group_ids = groups.ids if groups is not None else [None] * len(w.pairs)
        rows = [PairRow(p, row, g) for p, row, g in zip(w.pairs, eq4, group_ids)]
        # keep_context_scores=none: no table to write, so no rows travel to the write stage
        # an item left out (w.held) is kept as nulls, as an unscored disc term is: "not scored", and equal
        # to itself when a resumed run's tables are compared with a straight one's
        kept = [] if self.cfg.keep_context_scores == "none" else [
            ContextScore(s, k, None, None, None, None, None) if (s, k) in w.held else
            ContextScore(s, k, terms.terms["fwd"][i], terms.terms["left"][i], terms.terms["right"][i],
                         w.disc.get((s, k)), terms.S[i])
            for i, (s, k) in enumerate(keys) if not (isinstance(s, tuple) and s[0] == "ref")]
        sentences = {s: SentenceContexts([c.key for c in cs.contexts], cs.shortfall_reason)
                     for s, cs in w.csets.items()}
        return Scored(unit=w.unit, texts=w.texts, sentences=sentences, rows=rows, context_scores=kept,
                      n_scored=n_scored, n_reranked=n_reranked, precision=self.scorer.precision,
                      timing=dict(w.timing, scoring=seconds))

    def _groups(self, w: WithContexts) -> UnitGroups:
        own = {s: [c.key for c in cs.contexts] for s, cs in w.csets.items()}
        group_of, ids = pair_groups(w.unit, w.anchored, w.pairs, w.texts, self.cfg.grouping.pairs_per_group)
        return UnitGroups([(p.s1_id, p.s2_id) for p in w.pairs], group_of, own, ids)


def pair_groups(unit: int, anchored: bool, pairs: List[Pair], texts: Dict[int, str],
                pairs_per_group: int) -> Tuple[List[int], List[int]]:
    """A grouped unit's groups (grouping.py): each pair's group, and its run-unique id. A corpus harvest's group
    is an anchor (s1 of each of its pairs) and its partners; a --pairs run's, TF-IDF neighbours within the unit,
    ids carrying the unit."""
    from sentsim.harvest.grouping import neighbour_groups

    if anchored:
        group_of = [p.s1_id for p in pairs]
        return group_of, group_of
    group_of = neighbour_groups([(texts[p.s1_id], texts[p.s2_id]) for p in pairs], pairs_per_group)
    return group_of, [(int(unit) << 20) | g for g in group_of]


def rank_encoder(cfg: HarvestConfig, storage: str, anchor_ids: Optional[np.ndarray],
                 anchor_texts: Optional[List[str]], anchor_vectors: Optional[np.ndarray] = None):
    """E1 as `storage` needs it: `BaseVectors` (with the run's anchor matrix, when given, to rank from) for
    vectors, `RankTargets` over the anchors for codes."""
    from sentsim.rank.targets import BaseVectors, RankTargets, default_base_encoder

    encoder = cfg.rank.encoder or default_base_encoder()
    if storage == "vectors":
        return BaseVectors(encoder, anchor_vectors)
    return RankTargets(encoder, anchor_ids, anchor_texts, bits=cfg.rank.bits)


def encoded_ranks(targets, storage: str, texts: List[str]) -> SentenceRanks:
    """The rank targets of `texts` (in order) from `rank_encoder`'s E1: float16 vectors, or rank codes."""
    if storage == "vectors":
        return SentenceRanks("vectors", vectors=targets.vectors(texts), bytes_per_sentence=targets.bytes_per_sentence)
    return SentenceRanks(storage, codes=targets.codes(texts), bytes_per_sentence=targets.codec.bytes_per_sentence)


class RankStage(Stage):
    """Scored -> Ranked: each sentence's rank targets (004 §3.2) and each pair's rank similarity."""

    name = "rank"

    def __init__(self, cfg: HarvestConfig, fp: str, anchor_ids: Optional[np.ndarray], anchor_texts: Optional[List[str]],
                 sentence_schema: pa.Schema = SENTENCE_SCHEMA):
        self.cfg = cfg
        self.fp = fp
        self.sentence_schema = sentence_schema
        self.anchor_ids = anchor_ids
        self.anchor_texts = anchor_texts

    def setup(self) -> None:
        self.targets = self.storage = self.anchors = None
        if self.cfg.rank.enabled:
            self.storage = rank_storage_of(self.cfg, self.sentence_schema)
            anchor_vectors = None
            if self.storage == "vectors":  # the anchor matrix: encoded once per run (job.run_anchors), read here
                from sentsim.harvest.anchors import stored_anchor_vectors
                from storage import ShardStore

                anchor_vectors = stored_anchor_vectors(ShardStore(self.cfg.out), self.fp)
            self.targets = rank_encoder(self.cfg, self.storage, self.anchor_ids, self.anchor_texts, anchor_vectors)
            self.anchors = getattr(self.targets, "anchors", None)

    def _ranks(self, texts: Dict[int, str]) -> SentenceRanks:
        """The rank targets of the unit's sentences, in `sorted(texts)` order."""
        if self.targets is None:
            return SentenceRanks()
        return encoded_ranks(self.targets, self.storage, [texts[s] for s in sorted(texts)])

    def process(self, items: List[dict]) -> List[dict]:
        from sentsim.rank import rank_similarity, spearman_of_ranks

        out = []
        for item in items:
            w: Scored = work_of(item)
            t0 = time.perf_counter()
            ranks = self._ranks(w.texts)
            pos = {s: i for i, s in enumerate(sorted(w.texts))}
            first = [pos[r.pair.s1_id] for r in w.rows]
            second = [pos[r.pair.s2_id] for r in w.rows]
            if ranks.vectors is not None and w.rows:  # ranks from the stored float16 vectors, as students compute them
                sent_ranks = self.anchors.ranks(ranks.vectors)
                rsim = spearman_of_ranks(sent_ranks[first], sent_ranks[second])
            elif ranks.codes is not None and w.rows:
                rsim = rank_similarity(ranks.codes[first], ranks.codes[second])
            else:
                rsim = [None] * len(w.rows)
            rows = [replace(r, rank_sim=None if x is None else float(x)) for r, x in zip(w.rows, rsim)]
            ranked = Ranked.of(w, rows, ranks)
            ranked.timing["rank"] = time.perf_counter() - t0
            out.append(envelope(ranked))
        return out


class WriteStage(Stage):
    """Ranked -> the unit's shards and completion marker; returns the unit's counts to the executor. With rank
    targets off (rank.enabled=false) the harvest has no RankStage, and a Scored comes here: its rows have no
    rank similarity and its sentences no rank targets, as a Ranked of an idle RankStage had."""

    name = "write"

    def __init__(self, cfg: HarvestConfig, fp: str, sentence_schema: pa.Schema = SENTENCE_SCHEMA,
                 context_schema: Optional[pa.Schema] = CONTEXT_SCORE_SCHEMA):
        self.cfg = cfg
        self.fp = fp
        self.sentence_schema = sentence_schema
        self.context_schema = context_schema  # None: this run keeps no context_scores table

    def setup(self) -> None:
        self.where = where_this_runs()

    def tables(self, w: Ranked) -> Dict[str, pa.Table]:
        """The unit's shards: pairs (by pair_id), sentences (by id) and, when the run keeps them, context_scores."""
        texts, sids = w.texts, sorted(w.texts)
        schema = pair_schema(self.cfg.grouping.enabled)
        cols: Dict[str, list] = {k: [] for k in schema.names}
        for r in w.rows:
            p = r.pair
            row = dict(r.eq4, s1_id=p.s1_id, s2_id=p.s2_id, s1=texts[p.s1_id], s2=texts[p.s2_id], kind=p.kind,
                       gold=p.gold, group_id=r.group_id, rank_sim=r.rank_sim,
                       pair_id=pair_id(p.s1_id, p.s2_id, p.repeat), split=pair_split(p.s1_id, p.s2_id, self.cfg.splits))
            for k in schema.names:
                cols[k].append(row.get(k))
        codes, vecs = w.ranks.codes, w.ranks.vectors
        sent_cols = {
            "sentence_id": sids, "text": [texts[s] for s in sids],
            "n_contexts": [w.sentences[s].n_contexts for s in sids],
            "shortfall": [w.sentences[s].shortfall for s in sids],
            "rank_codes": [None if codes is None else codes[i].astype(np.uint32).tolist() for i in range(len(sids))],
            "context_ids": [w.sentences[s].context_ids for s in sids],
            "base_vector": [None if vecs is None else vecs[i] for i in range(len(sids))],
        }
        tables = {"pairs": pa.Table.from_pydict(cols, schema=schema).sort_by("pair_id"),
                  "sentences": pa.Table.from_pydict({k: sent_cols[k] for k in self.sentence_schema.names},
                                                    schema=self.sentence_schema)}
        if self.context_schema is not None:
            cs = sorted(w.context_scores, key=lambda x: (x.sentence_id, x.context_id))
            tables["context_scores"] = pa.Table.from_pydict(
                {k: [getattr(x, k) for x in cs] for k in self.context_schema.names}, schema=self.context_schema)
        return tables

    def process(self, items: List[dict]) -> List[dict]:
        from storage import ShardStore

        out = []
        for item in items:
            w = work_of(item)
            if not isinstance(w, Ranked):  # rank targets off: ScoreStage's (or PoolLabelStage's) Scored
                w = Ranked.of(w, w.rows, SentenceRanks())
            t0 = time.perf_counter()
            tables = self.tables(w)
            timing = dict(w.timing, write=time.perf_counter() - t0)
            nulls = [r.eq4.get("null_reason") for r in w.rows if r.score is None]
            ShardStore(self.cfg.out).write_unit(
                w.unit, tables, self.fp,
                {"pairs": len(w.rows), "null_scores": len(nulls), "null_reasons": nulls[:50],
                 "scored_items": w.n_scored, "timing": timing,
                 **({"rerank_items": w.n_reranked} if self.cfg.contexts.rerank_shortlist else {}),
                 "bytes_per_sentence": w.ranks.bytes_per_sentence, "rank_storage": w.ranks.storage,
                 # the format its scores were computed in ("off" = fp32): the report counts units by it
                 "scoring_precision": w.precision,
                 # which node ran each stage of this unit (the report sums it over the run, resumes included)
                 "placement": {stage: {k: v.get(k) for k in ("node", "host", "pid", "cuda_visible_devices")}
                               for stage, v in {**item.get(PLACEMENT_KEY, {}), self.name: self.where}.items()}},
            )
            out.append({"unit": w.unit, "pairs": len(w.rows), "null_scores": len(nulls),
                        "scored_items": w.n_scored, "timing": timing})
        return out
