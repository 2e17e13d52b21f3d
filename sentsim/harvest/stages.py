"""The harvest's stages; `job.py` composes them into a list, each with `resources.<name>` of its config.

    ContextStage (CPU)  partners for each anchor, context sets C_s, discriminator terms (head
                        only, from the representation cache each actor loads once)
    ScoreStage   (GPU)  S(s, c) for every needed (sentence, context), Eq. 4 per pair
    RankStage    (CPU/GPU) rank-vector codes per sentence, rank similarity per pair, then the
                 unit's shards and completion marker are written
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa

from corpus.documents import text_id
from sentsim.harvest import metrics
from sentsim.harvest.config import HarvestConfig
from sentsim.harvest.eq4_rows import UnitTerms, context_effect, pair_rows
from sentsim.harvest.pairs import owned_pairs, pair_id, pair_split, sample_partners
from sentsim.pipeline import PLACEMENT_KEY, Stage, where_this_runs

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
    # rank.storage=vectors (issue 16): E1's float16 vector, from which ranks over the run's anchor
    # matrix (side table rank_anchors) are computed where used; rank_codes is then null, and
    # base_vector is null in a codes run. A run opened before this column existed writes codes.
    ("base_vector", pa.list_(pa.float16())),
])
# Harvests written before context_ids existed; a resumed one keeps writing its own schema.
LEGACY_SENTENCE_SCHEMA = pa.schema([f for f in SENTENCE_SCHEMA if f.name not in ("context_ids", "base_vector")])


def sentence_schema_of(manifest: dict) -> pa.Schema:
    """The sentences schema a run was opened with: runs from before context_ids (or base_vector)
    keep theirs, the current schema less the columns their manifest lacks."""
    tables = manifest.get("tables", {})
    if "sentences" not in tables:
        return SENTENCE_SCHEMA
    names = {f[0] for f in tables["sentences"]}
    return pa.schema([f for f in SENTENCE_SCHEMA if f.name in names])


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
# Every scored (sentence, context) term, so `sentsim remix` can re-weigh Eq. 3 without scoring again.
# float32 (issue 16): 2 x 8 + 5 x 4 = 36 bytes per item before compression, where float64 took 56;
# the terms are per-token log-probabilities from a float32 (or bf16) model, so float32 drops only
# digits below the model's own resolution (a remix moves scores by ~1e-7; bench/results/scale.md).
# harvest keep_context_scores=none writes no such table at all.
CONTEXT_SCORE_SCHEMA = pa.schema([
    ("sentence_id", pa.int64()), ("context_id", pa.int64()),
    ("fwd", pa.float32()), ("left", pa.float32()), ("right", pa.float32()), ("disc", pa.float32()), ("S", pa.float32()),
])
# Harvests opened before float32 context scores; a resumed one keeps writing its own schema.
LEGACY_CONTEXT_SCORE_SCHEMA = pa.schema([
    f if f.type != pa.float32() else pa.field(f.name, pa.float64()) for f in CONTEXT_SCORE_SCHEMA])


def context_score_schema_of(manifest: dict) -> Optional[pa.Schema]:
    """The context_scores schema a run was opened with: float64 for runs from before float32, None
    for a run that keeps none (keep_context_scores=none), else the current one."""
    tables = manifest.get("tables", {})
    if "context_scores" not in tables:
        return None if "pairs" in tables else CONTEXT_SCORE_SCHEMA
    types = {f[0]: f[1] for f in tables["context_scores"]}
    return LEGACY_CONTEXT_SCORE_SCHEMA if types.get("S") == "double" else CONTEXT_SCORE_SCHEMA


def pair_schema(grouped: bool) -> pa.Schema:
    """The pairs table: grouped harvests add the group id and the three Eq. 4 variants (grouping.py)."""
    from sentsim.harvest.grouping import GROUP_FIELDS

    return pa.schema(list(PAIR_SCHEMA) + [pa.field(n, t) for n, t in GROUP_FIELDS]) if grouped else PAIR_SCHEMA


class ContextStage(Stage):
    name = "contexts"

    def __init__(self, cfg: HarvestConfig, window: int, rep_cache: Optional[str] = None,
                 anchors: Optional[np.ndarray] = None):
        self.cfg = cfg
        self.window = window
        self.rep_cache = rep_cache  # the discriminator's representation cache run (job.py builds it)
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
        if cfg.discriminator and cfg.contexts.mode == "screened":
            from sentsim.discriminator import Discriminator
            from sentsim.screening.cache import ContextCache

            disc = Discriminator.load(cfg.discriminator, corpus=cfg.corpus)
            if self.rep_cache:  # loaded once per actor (003 §3.3: reps cached in advance)
                cache = ContextCache.from_store(self.rep_cache, disc)
        self.retriever = retriever
        self.source = ContextSource(self.corpus, cfg.contexts, self.window, cfg.seed, retriever, disc, cache)

    def _partners(self, anchors: List[int]) -> List[tuple]:
        p = self.cfg.partners
        texts = self.corpus.texts(anchors)
        neigh: List[List[int]] = [[] for _ in anchors]
        if self.retriever is not None and p.neighbours:
            ids, _ = self.retriever.search(texts, p.neighbour_chunks)
            for i, (a, row) in enumerate(zip(anchors, ids)):
                # the sentence of each retrieved chunk with the most words in common, not from a's own doc
                words = set(texts[i].lower().split())
                for cid in row:
                    ch = self.corpus.chunk(int(cid)) if cid >= 0 else None
                    if ch is None:
                        continue
                    first, n = ch
                    if self.corpus.same_doc(first, a):
                        continue
                    cand = list(range(first, first + n))
                    ov = [len(words & set((t or "").lower().split())) for t in self.corpus.texts(cand)]
                    neigh[i].append(cand[int(np.argmax(ov))])
        out = []
        for a, nb in zip(anchors, neigh):
            parts = sample_partners(a, self.cfg.seed, self.corpus.doc_members(a), self.corpus.ids, nb,
                                    p.neighbours, p.same_doc, p.random)
            for q, kind in owned_pairs(a, parts, self.anchors):
                out.append((a, q, kind, None))
        return out

    def process(self, items: List[dict]) -> List[dict]:
        out = []
        for item in items:
            t0 = time.perf_counter()
            if item.get("pairs") is None:
                pairs = self._partners(item["anchors"])
                sids = sorted({s for a, b, _, _ in pairs for s in (a, b)} | set(item["anchors"]))
                texts = dict(zip(sids, self.corpus.texts(sids)))
            else:  # explicit mode: (s1_text, s2_text, gold)
                pairs, texts = [], {}
                for s1, s2, gold in item["pairs"]:
                    a, b = text_id(s1), text_id(s2)
                    texts[a], texts[b] = s1, s2
                    pairs.append((a, b, "explicit", gold))
                sids = sorted(texts)
            # the discriminator's LSTM runs once per sentence of the unit: its features serve the
            # sentence's own screening and every cross term below
            feats = (self.source.sentence_features([texts[s] for s in sids])
                     if self.source.disc is not None and sids else None)
            csets = dict(zip(sids, self.source.context_sets([texts[s] for s in sids], feats)))
            row_of = {s: i for i, s in enumerate(sids)}
            # discriminator terms for cross pairs: the score of s in the *partner's* contexts
            disc: Dict[tuple, float] = {}
            for s in sids:
                for c in csets[s].contexts:
                    if c.log_p_disc is not None:
                        disc[(s, c.key)] = c.log_p_disc
            if self.source.disc is not None:
                for a, b, _, _ in pairs:
                    for s, other in ((a, b), (b, a)):
                        todo = [c for c in csets[other].contexts if (s, c.key) not in disc]
                        if todo:
                            i = row_of[s]
                            for c, v in zip(todo, self.source.disc_scores(texts[s], todo, feats[i:i + 1])):
                                disc[(s, c.key)] = float(v)
            item.update(pairs=pairs, texts=texts, csets=csets, disc=disc)
            item.setdefault("timing", {})["contexts"] = time.perf_counter() - t0
            out.append(item)
        return out


class ScoreStage(Stage):
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
        plans, batch = [], []
        for item in items:
            combos, grouping, refs, ctx_by_key = self._needed(item)
            texts, disc = item["texts"], item["disc"]
            plans.append((len(batch), combos, grouping, refs, ctx_by_key))
            for s, k in combos:
                c = ctx_by_key[k]
                sent = refs[s[1]] if isinstance(s, tuple) else texts[s]
                batch.append(ContextItem(sent, c.left, c.right, disc.get((s, k))))
        res = self.scorer.score(batch) if batch else None
        share = (time.perf_counter() - t0) / max(len(batch), 1)  # a unit's scoring time: its share of the items
        return [self._rows(item, res, *plan, seconds=share * len(plan[1]))
                for item, plan in zip(items, plans)]

    def _needed(self, item: dict) -> tuple:
        """(every (sentence, context) the unit's pairs need, each once; its groups; reference sentences;
        contexts by key)."""
        csets = item["csets"]
        ctx_by_key = {c.key: c for cs in csets.values() for c in cs.contexts}
        # every (sentence, context) any pair needs, each scored once (own and cross terms alike)
        need = {}
        for a, b, _, _ in item["pairs"]:
            keys = [c.key for c in csets[a].contexts] + [c.key for c in csets[b].contexts]
            for s in (a, b):
                for k in keys:
                    need.setdefault((s, k), None)
        grouping = self._groups(item) if self.cfg.grouping.enabled else None
        if grouping is not None:  # and each group's sentences against the group's whole union
            from sentsim.harvest.grouping import needed

            for key in needed(grouping[0], grouping[1], grouping[2]):
                need.setdefault(key, None)
        refs = self.reference_texts if metrics.get(self.cfg.metric).uses_context_effect else []
        ref_keys = [(("ref", i), k) for i in range(len(refs)) for k in ctx_by_key]
        return list(need) + ref_keys, grouping, refs, ctx_by_key

    def _rows(self, item: dict, res, start: int, combos: list, grouping, refs: list, ctx_by_key: dict,
              seconds: float) -> dict:
        """The unit's pair rows (Eq. 4, eq4_rows.py) and context_scores from its slice
        [start, start + len(combos)) of the call's scores."""
        csets, disc = item["csets"], item["disc"]
        part = slice(start, start + len(combos))
        none = np.zeros(0)  # no unit of the call needed an item (every pair without contexts): no result
        terms = UnitTerms(combos, res.score[part] if res is not None else none, {
            "disc": np.array([disc.get(key, np.nan) for key in combos], dtype=np.float64),
            **{d: res.logprob[d][part] if res is not None else none for d in DIRS}})
        effect = context_effect(terms, [("ref", i) for i in range(len(refs))], ctx_by_key) if refs else None
        pairs = item["pairs"]
        eq4 = pair_rows([(a, b) for a, b, _, _ in pairs], terms, self.cfg.metric,
                        own={s: [c.key for c in cs.contexts] for s, cs in csets.items()},
                        shortfall={s: cs.shortfall_reason for s, cs in csets.items()}, effect=effect,
                        group_of=grouping[1] if grouping is not None else None, variant=self.cfg.grouping.score)
        repeat = item.get("repeats") or [0] * len(pairs)  # a pairs file's repeated rows (0 in a corpus harvest)
        rows = [{"s1_id": a, "s2_id": b, "kind": kind, "gold": gold, "repeat": k, **row}
                for (a, b, kind, gold), k, row in zip(pairs, repeat, eq4)]
        if grouping is not None:
            for row, group_id in zip(rows, grouping[3]):
                row["group_id"] = group_id
        # keep_context_scores=none: no table to write, so no rows travel to the write stage
        cs_rows = [] if self.cfg.keep_context_scores == "none" else [
            (s, k, terms.terms["fwd"][i], terms.terms["left"][i], terms.terms["right"][i], disc.get((s, k)),
             terms.S[i])
            for i, (s, k) in enumerate(combos) if not (isinstance(s, tuple) and s[0] == "ref")]
        item.update(rows=rows, context_scores=cs_rows, n_scored=len(combos), precision=self.scorer.precision)
        del item["disc"]
        item["csets"] = {s: (len(cs.contexts), cs.shortfall_reason, [c.key for c in cs.contexts])
                         for s, cs in csets.items()}
        item["timing"]["scoring"] = seconds
        return item

    def _groups(self, item: dict) -> tuple:
        """(pairs, group of each pair, C_s keys per sentence, run-unique group id of each pair)."""
        from sentsim.harvest.grouping import neighbour_groups

        pairs = [(a, b) for a, b, _, _ in item["pairs"]]
        own = {s: [c.key for c in cs.contexts] for s, cs in item["csets"].items()}
        if item.get("anchors"):  # a corpus harvest: the anchor (s1 of each of its pairs) and its partners
            group_of = [a for a, _ in pairs]
            ids = group_of
        else:  # --pairs: TF-IDF neighbours within the unit; ids carry the unit so they are run-unique
            texts = item["texts"]
            group_of = neighbour_groups([(texts[a], texts[b]) for a, b in pairs], self.cfg.grouping.pairs_per_group)
            ids = [(int(item["unit"]) << 20) | g for g in group_of]
        return pairs, group_of, own, ids


class RankAndWriteStage(Stage):
    name = "rank"

    def __init__(self, cfg: HarvestConfig, fp: str, anchor_ids: Optional[np.ndarray], anchor_texts: Optional[List[str]],
                 sentence_schema: pa.Schema = SENTENCE_SCHEMA,
                 context_schema: Optional[pa.Schema] = CONTEXT_SCORE_SCHEMA):
        self.cfg = cfg
        self.fp = fp
        self.context_schema = context_schema  # None: this run keeps no context_scores table
        self.sentence_schema = sentence_schema
        self.anchor_ids = anchor_ids
        self.anchor_texts = anchor_texts

    def setup(self) -> None:
        self.targets = self.storage = None
        self.where = where_this_runs()
        if self.cfg.rank.enabled:
            from sentsim.rank.targets import BaseVectors, RankTargets, default_base_encoder

            encoder = self.cfg.rank.encoder or default_base_encoder()
            self.storage = rank_storage_of(self.cfg, self.sentence_schema)
            if self.storage == "vectors":  # the anchor matrix: encoded once per run (job.run_anchors), read here
                from sentsim.harvest.anchors import stored_anchor_vectors
                from storage import ShardStore

                self.targets = BaseVectors(encoder, stored_anchor_vectors(ShardStore(self.cfg.out), self.fp))
            else:
                self.targets = RankTargets(encoder, self.anchor_ids, self.anchor_texts, bits=self.cfg.rank.bits)

    def process(self, items: List[dict]) -> List[dict]:
        from sentsim.rank import rank_similarity, spearman_of_ranks
        from storage import ShardStore

        out = []
        for item in items:
            t0 = time.perf_counter()
            texts = item["texts"]
            sids = sorted(texts)
            vecs = codes = None  # float16 E1 vectors (rank.storage=vectors) or rank codes
            if self.storage == "vectors":
                vecs = self.targets.vectors([texts[s] for s in sids])
            elif self.targets:
                codes = self.targets.codes([texts[s] for s in sids])
            pos = {s: i for i, s in enumerate(sids)}
            rows = item["rows"]
            if vecs is not None and rows:  # ranks from the stored float16 vectors, as students compute them
                ranks = self.targets.anchors.ranks(vecs)
                rsim = spearman_of_ranks(ranks[[pos[r["s1_id"]] for r in rows]], ranks[[pos[r["s2_id"]] for r in rows]])
            elif codes is not None and rows:
                a = codes[[pos[r["s1_id"]] for r in rows]]
                b = codes[[pos[r["s2_id"]] for r in rows]]
                rsim = rank_similarity(a, b)
            else:
                rsim = [None] * len(rows)
            schema = pair_schema(self.cfg.grouping.enabled)
            cols = {k: [] for k in schema.names}
            for r, rs in zip(rows, rsim):
                r = dict(r, s1=texts[r["s1_id"]], s2=texts[r["s2_id"]], rank_sim=None if rs is None else float(rs),
                         pair_id=pair_id(r["s1_id"], r["s2_id"], r["repeat"]),
                         split=pair_split(r["s1_id"], r["s2_id"], self.cfg.splits))
                for k in schema.names:
                    cols[k].append(r.get(k))
            pairs_t = pa.Table.from_pydict(cols, schema=schema).sort_by("pair_id")
            sent_cols = {
                "sentence_id": sids, "text": [texts[s] for s in sids],
                "n_contexts": [item["csets"][s][0] for s in sids],
                "shortfall": [item["csets"][s][1] for s in sids],
                "rank_codes": [None if codes is None else codes[pos[s]].astype(np.uint32).tolist() for s in sids],
                "context_ids": [item["csets"][s][2] for s in sids],
                "base_vector": [None if vecs is None else vecs[pos[s]] for s in sids],
            }
            sent_t = pa.Table.from_pydict({k: sent_cols[k] for k in self.sentence_schema.names},
                                          schema=self.sentence_schema)
            tables = {"pairs": pairs_t, "sentences": sent_t}
            if self.context_schema is not None:
                cs = sorted(item["context_scores"], key=lambda x: (x[0], x[1]))
                tables["context_scores"] = pa.Table.from_pydict(
                    {k: [x[i] for x in cs] for i, k in enumerate(self.context_schema.names)},
                    schema=self.context_schema)
            item["timing"]["rank"] = time.perf_counter() - t0
            nulls = [r["null_reason"] for r in rows if r.get("score") is None]
            ShardStore(self.cfg.out).write_unit(
                item["unit"], tables, self.fp,
                {"pairs": len(rows), "null_scores": len(nulls), "null_reasons": nulls[:50],
                 "scored_items": item["n_scored"], "timing": item["timing"],
                 "bytes_per_sentence": (self.targets.bytes_per_sentence if vecs is not None else
                                        self.targets.codec.bytes_per_sentence if self.targets else 0),
                 "rank_storage": self.storage,
                 # the format its scores were computed in ("off" = fp32): the report counts units by it
                 "scoring_precision": item.get("precision"),
                 # which node ran each stage of this unit (the report sums it over the run, resumes included)
                 "placement": {stage: {k: w.get(k) for k in ("node", "host", "pid", "cuda_visible_devices")}
                               for stage, w in {**item.get(PLACEMENT_KEY, {}), self.name: self.where}.items()}},
            )
            out.append({"unit": item["unit"], "pairs": len(rows), "null_scores": len(nulls),
                        "scored_items": item["n_scored"], "timing": item["timing"]})
        return out
