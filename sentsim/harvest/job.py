"""`sentsim harvest` / jobs/harvest_pairs.py: plan units, run the stages on Ray, resume, report.

With a discriminator (screened contexts), the corpus representation cache (003 §3.3) comes first:
`contexts.rep_cache` when given (checked against this corpus and discriminator), else one built
through the shard store under <out>/rep_cache, resumable like the harvest itself. Its identity
is part of the harvest's fingerprint, and each context actor loads it once.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from types import SimpleNamespace
from typing import List, Optional

import numpy as np

from sentsim.errors import UsageError
from sentsim.executor import RunContext, ShardedJob, execute
from sentsim.harvest.anchors import ANCHORS_TABLE
from sentsim.harvest.config import INPUT_PATHS, UNFINGERPRINTED, HarvestConfig
from sentsim.harvest.eq4_rows import has_no_contexts
from sentsim.harvest.pairs import repeats
from sentsim.harvest.stages import (
    CONTEXT_SCORE_SCHEMA,
    SENTENCE_SCHEMA,
    ContextStage,
    RankStage,
    ScoreStage,
    WriteStage,
    context_score_schema_of,
    pair_schema,
    rank_storage_of,
    sentence_schema_of,
)
from sentsim.identity import fingerprint
from sentsim.out_paths import check_out
from sentsim.pairs_file import read_pairs_file
from sentsim.pipeline import Resources, Shared, StageSpec, UnitPlan
from sentsim.run_formats import (
    SCORING_REVISION,
    revision_changes,
    scoring_revision,
    spelt_as_stored,
)
from sentsim.screening.cache_job import check_rep_cache, ensure_rep_cache, given_rep_cache, rep_cache_uri
from sentsim.screening.config import discriminator_in_use, screened_as_stored
from storage import ShardStore
from storage.fs import input_sha256
from storage.lease import released_on_sigterm
from storage.store import UNREAD_NESTED, run_format

STAGE = "harvest"


def harvest(
    cfg: HarvestConfig, executor: str = "ray", force_new: bool = False, address: Optional[str] = None,
    quiet: bool = False, max_units: Optional[int] = None,
) -> dict:
    """Harvest scored pairs from `cfg.corpus` into `cfg.out`, resuming a run that is there. The
    pipeline a unit goes through is `HarvestRun.stages`."""
    from sentsim.harvest.report import write_report

    run = HarvestRun(cfg, executor, force_new, quiet, hold_run=True)
    m = execute(run, executor=executor, address=address, force_new=force_new, quiet=quiet,
                max_units=max_units)
    this = m["this_run"]
    write_report(cfg.out, m, SimpleNamespace(done=this["units"], rows=this["pairs"]), this["wall_seconds"])
    return dict(ShardStore(cfg.out).read_manifest(), this_run=m["this_run"])


class HarvestRun(ShardedJob):
    """One harvest, resolved before anything is written: its inputs checked, its units planned, its
    fingerprint and scoring format fixed. `stages` is its pipeline; `execute` runs it."""

    stage = STAGE
    count = "pairs"
    gauges = "sentsim_harvest"
    deep = True
    unfingerprinted = UNFINGERPRINTED + ("inputs.0.corpus", "inputs.0.pairs_file")

    def __init__(self, cfg: HarvestConfig, executor: str, force_new: bool, quiet: bool, hold_run: bool = False):
        """`hold_run`: a pool harvest takes its run's lease before it draws the pool and clusters the anchors
        (`hold_run_now`), for `execute` to keep; without it (a plan read and not run) nothing is written."""
        from corpus.view import CorpusIndex

        check_out(cfg.out, harvest_inputs(cfg), writes="run")
        if cfg.index:  # whole and built for this corpus: said now, not when the first unit searches it
            from sentsim.retrieval.base import check_index

            check_index(cfg.index, corpus=cfg.corpus)
        check_scorable_terms(cfg, check_context_models(cfg))
        check_scoring_device(cfg, executor)
        self.cfg, self.out = cfg, cfg.out
        self.corpus = CorpusIndex(cfg.corpus)
        self.pooled = cfg.contexts.mode == "pool"
        # what this mode never reads is not fingerprinted (a refused resume does not name it either)
        self.unfingerprinted = self.unfingerprinted + cfg.unread_keys()
        self.unit_plan, self.plan_info = plan(cfg, self.corpus)
        self.hashes = model_hashes(cfg)
        store = None
        if self.pooled:
            store = ShardStore(cfg.out)
            # what only screening reads is not fingerprinted here: a refused resume does not name it
            self.unfingerprinted = self.unfingerprinted + tuple(
                f"contexts.{k}" for k in cfg.contexts.SCREENED_ONLY) + ("keep_context_scores",)
            self.refuse_another_run_now(store, force_new)
            if hold_run:  # one writer per run: a second one is refused here, before the minutes of setup below
                self.hold_run_now(store)
        try:
            # a SIGTERM during the setup frees the lease as an error or a Ctrl-C does (below)
            with released_on_sigterm(self.let_go_of_run) if self.held_store is not None else nullcontext():
                self.set_up(store, executor, force_new, quiet)
        except BaseException:
            self.let_go_of_run()  # refused or interrupted before execute: neither a lease nor a new run folder left
            raise

    def set_up(self, store: Optional[ShardStore], executor: str, force_new: bool, quiet: bool) -> None:
        """The rest of `__init__`: a pool harvest's pool drawn and its pairs planned (the anchors clustered: minutes
        at 1M anchors) from its run's `store`, the rep cache checked, the scoring format fixed."""
        cfg = self.cfg
        if self.pooled:  # the pool, then the pairs: the run's own when it resumes (pool.py)
            from sentsim.harvest.pool import PAIRS_TABLE, POOL_IDS_TABLE, PoolPairUnits, draw_pool, plan_pool_pairs

            resume_fp = self.fp if force_new else self.fingerprint_to_resume(store)
            kept_ids = None if force_new else store.read_side_table(POOL_IDS_TABLE, fingerprint=resume_fp)
            self.pool = draw_pool(self.corpus, cfg.contexts.pool_size, self.context_window(), cfg.seed,
                                  cfg.contexts.pool_draw,
                                  None if kept_ids is None else kept_ids.column("sentence_id").to_numpy(), quiet)
            kept = None if force_new else store.read_side_table(PAIRS_TABLE, fingerprint=resume_fp)
            file_pairs = self.unit_plan.make.pairs if cfg.pairs_file else None
            anchors = None if cfg.pairs_file else self.unit_plan.make.anchors
            self.pool_plan = plan_pool_pairs(cfg, self.corpus, anchors, file_pairs, kept, quiet)
            per = cfg.pairs_per_unit
            self.unit_plan = UnitPlan(-(-len(self.pool_plan.pairs) // per), PoolPairUnits(self.pool_plan.pairs, per))
        self.rep_cache = rep_cache_uri(cfg.contexts.rep_cache, cfg.out) if uses_rep_cache(cfg) else None
        if self.rep_cache and cfg.contexts.rep_cache:  # a given cache is checked before the run folder is made
            check_rep_cache(self.rep_cache, self.hashes["rep_cache"])
        stored = None if force_new else ShardStore(cfg.out).read_manifest()  # a new run reads no old manifest
        if stored and self.holds_this_run(stored):
            refuse_an_earlier_revision(cfg, stored)
        if stored and not (stored.get("fingerprint") == self.fp
                           or run_format(stored) > 1 and self.holds_this_run(stored)):
            # another run's (resuming it is refused), or a format 1 one: no scoring format kept; a run of format 2
            # or later resumed under the fingerprint it holds keeps its own, as a pool run's vectors do
            # (pool_vectors.ensure_pool_vectors)
            stored = None
        self.precision, note = scoring_precision(cfg, stored, force_new, executor)
        if note and not quiet:
            print(f"[{STAGE}] {note}", file=sys.stderr, flush=True)
        p = cfg.partners
        if p.neighbours and not cfg.index and not cfg.pairs_file and not p.cluster_size and not quiet:
            # TF-IDF neighbours come from the index: without one the anchors get their other partners only
            print(f"[{STAGE}] note: partners.neighbours={p.neighbours} draws TF-IDF neighbours from --index, and "
                  "none is given: the anchors are paired with same-document and random partners only",
                  file=sys.stderr, flush=True)

    @property
    def units(self) -> UnitPlan:
        return self.unit_plan

    def fingerprint_parts(self) -> tuple:
        return (STAGE, self.cfg.semantic(), self.corpus.fingerprint, without_paths(self.plan_info), self.hashes)

    def fingerprint_in_format(self, version: int, stored: dict) -> Optional[str]:
        """Format 1: the input paths were fingerprinted as spelt (as the stored run spelt them), not by what
        they hold; every content identity is fingerprinted too, so a match is this same run. Format 2: a pool
        run was fingerprinted with the keys only screening reads. Formats 1 to 3 for a per-pair run, 1 to 4 for a
        pool run: it was fingerprinted with the keys its mode does not read (`HarvestConfig.unread_keys`), as the
        stored run holds them."""
        cfg = self.config_unread_as_stored(stored)
        if version == 2 and self.pooled:
            return None if cfg is None else fingerprint(
                STAGE, self.pool_semantic_in_format_2(stored, cfg), self.corpus.fingerprint,
                without_paths(self.plan_info), self.hashes)
        if version in (2, 3) or (version == 4 and self.pooled):
            return None if cfg is None else fingerprint(STAGE, cfg.semantic(keep_unread=True), self.corpus.fingerprint,
                                                        without_paths(self.plan_info), self.hashes)
        if version != 1:
            return None
        cfg = cfg or self.cfg
        sem = spelt_as_stored(cfg.semantic(with_paths=True), stored, INPUT_PATHS + ("rank.encoder",))
        info = self.plan_info
        if "pairs_file" in info:
            info = dict(info, pairs_file=(stored.get("config") or {}).get("pairs_file"))
        return fingerprint(STAGE, sem, self.corpus.fingerprint, info, self.hashes)

    def config_unread_as_stored(self, stored: dict) -> Optional[HarvestConfig]:
        """This run's config with the keys its mode does not read set as `stored` (its manifest) holds them, as
        runs of formats before 4 (per-pair) or 5 (pool) fingerprinted them (sentsim/run_formats.py); None where
        it reads every key (or the stored ones are no longer valid, so no run of today's settings held them)."""
        from pydantic import ValidationError

        keys = self.cfg.unread_keys()
        if not keys:
            return None
        try:
            return HarvestConfig.model_validate(spelt_as_stored(self.cfg.model_dump(), stored, keys))
        except ValidationError:
            return None

    def pool_semantic_in_format_2(self, stored: dict, cfg: HarvestConfig) -> dict:
        """The semantic config a format 2 pool run was fingerprinted with: `cfg` (`config_unread_as_stored`) with
        the keys its mode does not read, the keys only screening reads, and keep_context_scores, as `stored` (its
        manifest) holds them (sentsim/run_formats.py)."""
        old = stored.get("config") or {}
        sem = cfg.semantic(keep_unread=True)
        sem["contexts"] = screened_as_stored(sem["contexts"], old.get("contexts") or {})
        if old.get("keep_context_scores", "all") != "all":
            sem["keep_context_scores"] = old["keep_context_scores"]
        return sem

    def config(self) -> dict:
        return self.cfg.model_dump()

    def inputs(self) -> List[dict]:
        # the models' identities (model_hashes, fingerprinted), so that a refused resume names the one changed
        return [{"corpus": self.cfg.corpus, "fingerprint": self.corpus.fingerprint, **self.plan_info,
                 "models": self.hashes}]

    def tables(self) -> dict:
        cfg = self.cfg
        keep = cfg.keep_context_scores == "all" and not self.pooled  # a pool run keeps its vectors instead
        return {"pairs": pair_schema(cfg.grouping.enabled), "sentences": SENTENCE_SCHEMA,
                **({"context_scores": CONTEXT_SCORE_SCHEMA} if keep else {})}

    def open_extra(self) -> dict:
        return {"scoring_precision": self.precision, "scoring_revision": SCORING_REVISION}

    def detail(self, result: dict) -> str:
        return f"nulls {result['null_scores']}"

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        """A unit's way through the harvest (each stage in harvest/stages.py), built once there is work:

        1. ContextStage: each sentence of the unit's pairs and its context set C_s, retrieved by the
           index and screened by the discriminator (003 §3.3);
        2. ScoreStage: S(s, c) for every (sentence, context), Eq. 3, then each pair's Eq. 4 row
           (harvest/eq4_rows.py);
        3. RankStage: each sentence's rank-vector targets (004 §3.2), each pair's rank similarity; left out
           with rank.enabled=false, when it would hand the rows on unchanged with no targets (WriteStage then
           takes ScoreStage's Scored and writes the rank columns null, as it did after an idle RankStage); a pool
           harvest's PoolRankStage reads the targets its ranks run encoded once per sentence (pool_ranks.py);
        4. WriteStage: the unit's shards and completion marker (last: a stage put before it, such as a
           filter of pairs, changes what is written; README "Adding a harvest stage").

        What each stage hands the next is declared in harvest/work.py.
        """
        cfg, r = self.cfg, self.cfg.resources
        # no rank targets: no stage of actors that would only pass the rows on (nor a `rank` entry in the
        # placement the summary prints); the writer still takes resources.rank, and the run's fingerprint,
        # which holds no stage list, is the same either way
        rank_stage, ranks = RankStage, {}
        if self.pooled:  # each sentence's targets read from the ranks run, encoded once before (prepare_pool)
            from sentsim.harvest.pool_ranks import PoolRankStage, shared_ranks

            rank_stage, ranks = PoolRankStage, {"ranks": shared_ranks(cfg.out)}
        rank = [StageSpec(rank_stage, Resources.of(r.rank), args=dict(
            # the anchors are stored with the run by `prepare` (with_anchors), once the run goes ahead
            cfg=cfg, fp=ctx.fp, anchor_ids=None, anchor_texts=None,
            sentence_schema=sentence_schema_of(ctx.manifest), **ranks))] if cfg.rank.enabled else []
        # --force-new: a corpus with too few sentences to draw the new run's anchors from is refused here, before
        # the old run is discarded
        self.new_run_anchors(ctx)
        rank_and_write = [
            *rank,
            # the writer shares the rank stage's resources; a run keeps the schemas it was opened with
            StageSpec(WriteStage, Resources.of(r.rank), args=dict(
                cfg=cfg, fp=ctx.fp, sentence_schema=sentence_schema_of(ctx.manifest),
                context_schema=None if self.pooled else context_score_schema_of(ctx.manifest))),
        ]
        if self.pooled:  # the sentences' vectors are scored first, by their own run (prepare, pool_vectors.py)
            from sentsim.harvest.pool_label import PoolLabelStage, shared_vectors

            return [StageSpec(PoolLabelStage, Resources.of(r.label), args=dict(
                out=cfg.out, fp=ctx.fp, metric=cfg.metric, precision=self.precision,
                vectors=shared_vectors(cfg.out))), *rank_and_write]
        # the stages score in the run's resolved format; the fingerprint keeps the setting as given (auto)
        scoring_cfg = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update={"autocast": self.precision})})
        refs = self.reference_texts()  # scored in every context (ScoreStage), with their disc terms (ContextStage)
        return [
            StageSpec(ContextStage, Resources.of(r.contexts), args=dict(
                cfg=cfg, window=self.context_window(), rep_cache=self.rep_cache,
                # the sorted anchor ids go to each context actor once (pair ownership), not with every unit
                anchors=self.units.make.anchors if isinstance(self.units.make, AnchorUnits) else None,
                reference_texts=refs)),
            StageSpec(ScoreStage, Resources.of(r.scoring), args=dict(cfg=scoring_cfg, reference_texts=refs)),
            *rank_and_write,
        ]

    def context_window(self) -> int:
        """Sentences on each side of a context (the context models were trained with this window)."""
        from sentsim.context.bundle_meta import read_bundle_meta

        meta = read_bundle_meta(self.cfg.context_models[0])
        return int(meta.get("model_config", {}).get("context_sentences", 1))

    def reference_texts(self) -> List[str]:
        """The sampled corpus sentences the double-centred metric reads each context's effect from."""
        cfg, corpus = self.cfg, self.corpus
        rng = np.random.default_rng(cfg.seed + 2)
        return list(corpus.texts(rng.choice(corpus.ids, size=min(cfg.reference_sentences, len(corpus.ids)),
                                            replace=False)))

    # new_run_anchors' sample, drawn once for the whole command
    _new_run_anchors: Optional[tuple] = None

    def new_run_anchors(self, ctx: RunContext) -> Optional[tuple]:
        """Under --force-new with rank targets on, the anchors (ids, texts) the new run stores: sampled from the
        corpus (no file of the run, which is the old one until the run goes ahead) by whichever caller asks
        first, and the same sample for every later one. `stages` asks, so that a corpus with too few sentences
        is refused before the old run is discarded; `runs_first` checks the pool's ranks run for them; `prepare`
        stores them with the run (run_anchors). None otherwise: a resumed run reads its own (run_anchors)."""
        cfg = self.cfg
        if not (ctx.force_new and cfg.rank.enabled):
            return None
        if self._new_run_anchors is None:
            from sentsim.rank.targets import sample_anchors

            self._new_run_anchors = sample_anchors(cfg.corpus, cfg.rank.n_anchors, seed=cfg.seed + 1)
        return self._new_run_anchors

    def prepare(self, ctx: RunContext) -> None:
        if self.cfg.rank.enabled:
            ctx.specs = with_anchors(ctx.specs, *run_anchors(self.cfg, ctx.store, ctx.fp, self.new_run_anchors(ctx)))
        if self.pooled:
            self.prepare_pool(ctx)
        if self.rep_cache:  # every corpus sentence encoded once, before the pipeline
            cfg = self.cfg
            ensure_rep_cache(cfg.contexts.rep_cache, cfg.out, cfg.corpus, cfg.discriminator,
                             self.hashes["rep_cache"], cfg.resources.contexts, executor=ctx.executor,
                             force_new=ctx.force_new, address=ctx.address, quiet=ctx.quiet, max_units=ctx.max_units)

    def runs_first(self, ctx: RunContext) -> List[ShardedJob]:
        """The pool's vectors and, with rank targets on, its ranks run (for the new run's anchors, new_run_anchors),
        and the harvest's own rep cache."""
        from sentsim.screening.cache_job import own_rep_cache_run

        cfg = self.cfg
        first: List[ShardedJob] = [self.vectors_job()] if self.pooled else []
        anchors = self.new_run_anchors(ctx)
        if self.pooled and anchors is not None:
            first.append(self.ranks_job(ctx, *anchors))
        own = own_rep_cache_run(cfg.contexts.rep_cache, cfg.out, cfg.corpus, cfg.discriminator,
                                self.hashes["rep_cache"], cfg.resources.contexts) if self.rep_cache else None
        return first + ([own] if own is not None else [])

    def ranks_job(self, ctx: RunContext, anchor_ids: np.ndarray, anchor_texts: list):
        """The pool's ranks run (pool_ranks.py) for these anchors, built once for them: under --force-new
        `runs_first` gives it to execute's check and `prepare` builds the same one, so that its sentences (~1M at
        scale) are planned and fingerprinted once."""
        from sentsim.harvest.pool_ranks import PoolRanksRun, rank_identity

        cfg = self.cfg
        storage = rank_storage_of(cfg, sentence_schema_of(ctx.manifest))
        identity = rank_identity(cfg, storage, self.hashes["base_encoder"], anchor_ids, anchor_texts)
        job = getattr(self, "_ranks_job", None)
        if job is None or not (job.identity == identity and np.array_equal(job.anchor_ids, anchor_ids)
                               and list(job.anchor_texts) == list(anchor_texts)):
            job = self._ranks_job = PoolRanksRun(cfg, self.pool_plan.texts, identity, anchor_ids, anchor_texts)
        return job

    def vectors_job(self):
        """The pool's vectors run (pool_vectors.py), built once."""
        from sentsim.harvest.pool_vectors import PoolVectorsRun

        if getattr(self, "_vectors_job", None) is None:
            self._vectors_job = PoolVectorsRun(self.cfg, self.pool_plan.texts, self.pool, self.vector_identity(),
                                               self.precision)
        return self._vectors_job

    def recheck(self, ctx: RunContext) -> None:
        """A finished pool harvest's vectors (and its side tables of the plan) are mended on a rerun: remix
        reads them after the labels are done, so a damaged or deleted run there would otherwise stay so. Its rank
        targets too, which `store verify` checks with the run and a relabel reads; but a run labelled before its
        targets had a run of their own is not given one now (pool_ranks.labelled_with_ranks_run)."""
        if self.pooled:
            from sentsim.harvest.pool_ranks import labelled_with_ranks_run

            self.prepare_pool(ctx, ranks=self.has_ranks_run() or labelled_with_ranks_run(ctx.manifest))

    def has_ranks_run(self) -> bool:
        from sentsim.harvest.pool_ranks import ranks_uri

        return holds_a_run(ranks_uri(self.out))

    def unread_nested_runs(self) -> List[str]:
        """The pool runs in the harvest's folder that this run does not read: a ranks run kept from a relabel with
        rank targets on (for one that turns them on again), a pool harvest's runs under a per-pair relabel."""
        from sentsim.harvest import pool_ranks, pool_vectors

        read = {pool_vectors.SUBDIR, *([pool_ranks.SUBDIR] if self.cfg.rank.enabled else [])} if self.pooled else set()
        return [m.SUBDIR for m in (pool_vectors, pool_ranks)
                if m.SUBDIR not in read and holds_a_run(f"{self.out.rstrip('/')}/{m.SUBDIR}")]

    def vector_identity(self) -> dict:
        """What the pool's sentence vectors depend on besides the pool and the sentences (not the metric, the
        splits or the rank targets, which only labelling reads)."""
        return {"corpus": self.corpus.fingerprint, "contexts": self.cfg.contexts.semantic(), "seed": self.cfg.seed,
                "scoring": self.cfg.semantic()["scoring"], "context_models": self.hashes["context_models"]}

    def prepare_pool(self, ctx: RunContext, ranks: bool = True) -> None:
        """The pool run's vectors (built or resumed, pool_vectors.py), its pair plan kept, its rank targets when on
        (pool_ranks.py), and the context effect over every scored sentence when the metric reads one."""
        import pyarrow as pa

        from sentsim.harvest import metrics
        from sentsim.harvest.pool import EFFECT_TABLE, PAIRS_TABLE, POOL_IDS_TABLE
        from sentsim.harvest.pool_vectors import StoredVectors, ensure_pool_vectors

        # the plan and the pool first: a run killed while its vectors are scored resumes with the pairs (and
        # so the sentences) and the pool it began with, whatever k-means or the retriever would give on
        # another machine
        if not ctx.store.has_side_table(PAIRS_TABLE, fingerprint=ctx.fp):  # checked, not parsed: ~1M rows at scale
            ctx.store.write_side_table(PAIRS_TABLE, self.pool_plan.table(), ctx.fp)
        if not ctx.store.has_side_table(POOL_IDS_TABLE, fingerprint=ctx.fp):
            ctx.store.write_side_table(POOL_IDS_TABLE, pa.table({"sentence_id": pa.array(self.pool.ids, pa.int64())}),
                                       ctx.fp)
        job = self.vectors_job()
        self.vectors_fp = ensure_pool_vectors(job, ctx.executor, ctx.address, ctx.force_new, ctx.quiet,
                                              ctx.max_units)["fingerprint"]
        if self.cfg.rank.enabled and ranks:  # each sentence's rank targets, encoded once (pool_ranks.py)
            self.prepare_pool_ranks(ctx)
        if metrics.get(self.cfg.metric).uses_context_effect and \
                ctx.store.read_side_table(EFFECT_TABLE, fingerprint=ctx.fp) is None:
            stored = StoredVectors(job.out)
            effect = stored.context_effect()
            ctx.store.write_side_table(EFFECT_TABLE, pa.table({
                "context_id": pa.array(self.pool.ids, pa.int64()), "effect": pa.array(effect, pa.float64())}), ctx.fp)
            # the label stage's shared copy is this one, not a second read of the whole run: on Ray it is put in
            # the object store and dropped, in-process the stage reads it (the run is complete and unchanged since).
            # Read after the ranks pass, so that the driver does not hold it all through that pass.
            for shared in label_vectors(ctx.specs):
                shared.hold(stored)
            del stored

    def prepare_pool_ranks(self, ctx: RunContext) -> None:
        """The pool run's rank targets, built or resumed (pool_ranks.py) for the anchors this run holds."""
        from sentsim.harvest.pool_ranks import ensure_pool_ranks

        job = self.ranks_job(ctx, *run_anchors(self.cfg, ctx.store, ctx.fp, self.new_run_anchors(ctx)))
        ensure_pool_ranks(job, ctx.executor, ctx.address, ctx.force_new, ctx.quiet, ctx.max_units)

    def summary(self, ctx: RunContext) -> dict:
        refusal = all_null_refusal(ctx.store, ctx.fp, len(self.units))
        if refusal:
            raise UsageError(refusal)
        out = {"plan": self.plan_info, UNREAD_NESTED: self.unread_nested_runs()}
        if self.pooled:
            from sentsim.harvest.pool_ranks import pool_runs_record

            out["pool"] = {"size": len(self.pool), "pairs": len(self.pool_plan.pairs),
                           "sentences": len(self.pool_plan.texts),
                           **pool_runs_record(self.out, self.cfg.rank.enabled, ctx.manifest.get("pool") or {})}
        return out


def holds_a_run(uri: str) -> bool:
    """Whether a run is at `uri`: a manifest there, readable or not (a damaged run is mended, not ignored)."""
    from storage import StoreError

    try:
        return ShardStore(uri).read_manifest() is not None
    except StoreError:
        return True


def with_anchors(specs: List[StageSpec], anchor_ids: np.ndarray, anchor_texts: list) -> List[StageSpec]:
    """`specs` with the run's rank anchors given to its rank stage (HarvestRun.stages leaves them to prepare)."""
    from dataclasses import replace

    return [replace(s, args=dict(s.args, anchor_ids=anchor_ids, anchor_texts=anchor_texts))
            if issubclass(s.stage, RankStage) else s for s in specs]


def label_vectors(specs) -> List[Shared]:
    """The vectors (pipeline.Shared) the pool label stage among `specs` reads (none before the stages are built,
    as on a rerun with nothing to label)."""
    from sentsim.harvest.pool_label import PoolLabelStage

    return [s.args["vectors"] for s in specs or () if issubclass(s.stage, PoolLabelStage)]


class AnchorUnits:
    """Unit u of a corpus harvest: its own slice of the sorted anchor ids, nothing else. The seed
    that picks its partners is the config's (pairs.anchor_rng(seed, anchor)), and whether a partner
    is another anchor is looked up in the one sorted anchor array ContextStage holds per actor."""

    def __init__(self, anchors: np.ndarray, per_unit: int):
        self.anchors, self.per_unit = anchors, per_unit

    def __call__(self, u: int) -> dict:
        return {"unit": u, "anchors": self.anchors[u * self.per_unit:(u + 1) * self.per_unit].tolist(), "pairs": None}


class PairUnits:
    """Unit u of an explicit (--pairs) harvest: its slice of the pairs file's rows, and for each row how many
    earlier rows of the file hold the same pair (its pair_id tells the repeats apart)."""

    def __init__(self, pairs: list, per_unit: int):
        self.pairs, self.per_unit = pairs, per_unit
        self.repeats = repeats([(s1, s2) for s1, s2, _ in pairs])

    def __call__(self, u: int) -> dict:
        rows = slice(u * self.per_unit, (u + 1) * self.per_unit)
        return {"unit": u, "pairs": self.pairs[rows], "repeats": self.repeats[rows]}


def plan_anchors(cfg: HarvestConfig, corpus) -> Optional[np.ndarray]:
    """The harvest's anchor ids, sorted int64 (None in explicit mode). Pure function of the config."""
    if cfg.pairs_file:
        return None
    ok = corpus.ids[corpus.n_tokens >= cfg.anchors.min_tokens]
    if len(ok) == 0:
        raise UsageError(f"{cfg.corpus}: no sentence has {cfg.anchors.min_tokens} or more words to use as an anchor")
    rng = np.random.default_rng(cfg.seed)
    n = min(cfg.anchors.n, len(ok))
    return np.sort(rng.choice(ok, size=n, replace=False)).astype(np.int64)


def plan(cfg: HarvestConfig, corpus) -> tuple[UnitPlan, dict]:
    """Units of work: shards of anchors (or of explicit pairs). Pure function of the config.

    O(units): a UnitPlan computes unit u's dict from u, so nothing here grows as units x anchors.
    """
    if cfg.pairs_file:
        pairs = read_pairs_file(cfg.pairs_file)
        n_units = -(-len(pairs) // cfg.pairs_per_unit)
        return UnitPlan(n_units, PairUnits(pairs, cfg.pairs_per_unit)), {
            "pairs_file": cfg.pairs_file, "pairs_file_sha256": input_sha256(cfg.pairs_file)[:16], "pairs": len(pairs)}
    anchors = plan_anchors(cfg, corpus)
    n_units = -(-len(anchors) // cfg.anchors.per_unit)
    return UnitPlan(n_units, AnchorUnits(anchors, cfg.anchors.per_unit)), {"anchors": len(anchors)}


def check_scoring_device(cfg: HarvestConfig, executor: str) -> None:
    """scoring.device=cuda said to be unusable before any work (the rep cache can take hours first): in
    this process when it scores (inline); on Ray, when the scoring actors ask for no GPU, since Ray then
    hides every GPU from them (CUDA_VISIBLE_DEVICES=""). A cluster without the GPUs they ask for is refused
    by the executor's resource check, also before any work."""
    device = cfg.scoring.device
    if not device.startswith("cuda"):
        return
    if executor == "inline":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"scoring.device={device}, but this machine has no CUDA device; set scoring.device=auto "
                             "or cpu")
    elif cfg.resources.scoring.num_gpus <= 0 and not os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"):
        raise UsageError(f"scoring.device={device}, but resources.scoring.num_gpus=0, and Ray hides every GPU from an "
                         "actor that asks for none; set resources.scoring.num_gpus (1, or 0.5 to share one) or "
                         "scoring.device=auto")


def uses_rep_cache(cfg: HarvestConfig) -> bool:
    """Screening with a discriminator scores contexts from its representation cache (003 §3.3)."""
    return discriminator_in_use(cfg.discriminator, cfg.contexts.mode)


def check_context_models(cfg: HarvestConfig) -> set:
    """Refuse, before the run folder is written, context-model folders the scorers would refuse at their setup:
    a direction given by two of them, or models of different tokenizers (their scores cannot be combined). Past
    that point the refusal would leave a run whose fingerprint names those folders, refusing the mended command.
    Returns the directions they provide."""
    from sentsim.context.bundle_meta import read_bundle_meta

    by_dir, tokenizer, seen = {}, None, {}
    for p in cfg.context_models:
        where = os.path.realpath(p)
        if where in seen:
            raise UsageError(f"--context-models: {p} is given twice (as {seen[where]} too); give each folder once")
        seen[where] = p
        meta = read_bundle_meta(p)
        for d in meta.get("directions", {}):
            if d in by_dir:
                raise UsageError(f"{p}: direction {d!r} is provided by more than one model directory (by {by_dir[d]} "
                                 "too); give each direction once")
            by_dir[d] = p
        sha = meta.get("tokenizer_sha256")
        if tokenizer is not None and sha != tokenizer[1]:
            raise UsageError(f"{p}: its tokenizer ({str(sha)[:12]}) differs from {tokenizer[0]}'s "
                             f"({str(tokenizer[1])[:12]}); scores from different vocabularies cannot be combined")
        tokenizer = tokenizer or (p, sha)
    return set(by_dir)


def check_scorable_terms(cfg: HarvestConfig, directions: set) -> None:
    """Refuse, before anything starts, a harvest none of whose weighted Eq. 3 terms can be scored: a
    direction no context-model folder provides (or the discriminator term without a discriminator) is
    NaN for every item, so every S and every pair's score would be null. `directions`: those the context-model
    folders provide (check_context_models)."""
    from sentsim.context.config import TERMS

    have = set(directions)
    if uses_rep_cache(cfg):
        have.add("disc")
    weights, on = cfg.scoring.weights(), cfg.scoring.enabled()
    weighted = [t for t in TERMS if on[t] and weights[t] > 0]
    if not set(weighted) & have:
        raise UsageError(f"scoring: the weighted Eq. 3 term(s) {', '.join(weighted)} cannot be scored here (the "
                         f"context models provide {', '.join(sorted(have - {'disc'})) or 'no direction'}"
                         f"{'' if 'disc' in have else ', and there is no discriminator'}), so every pair's score "
                         "would be null; weigh a term that is scored")


def all_null_refusal(store, fp: str, planned: int, check: str = "scoring.lambda_* and the context models"
                     ) -> Optional[str]:
    """A finished run in which no pair got a score is not a result: the line that refuses to mark it
    complete (None when some pair is scored, or units are still to do)."""
    markers = [m for u, m in store.markers().items() if u < planned and m.get("fingerprint") == fp]
    pairs = sum(int(m.get("extra", {}).get("pairs", 0)) for m in markers)
    nulls = sum(int(m.get("extra", {}).get("null_scores", 0)) for m in markers)
    if len(markers) < planned or pairs == 0 or nulls < pairs:
        return None
    reasons = sorted({r for m in markers for r in m.get("extra", {}).get("null_reasons", []) if r})
    if reasons and all(has_no_contexts(r) for r in reasons):  # no weight or model scores a sentence without contexts
        check = ("where the contexts come from: --index (built over this --corpus, sharing words with the "
                 "sentences) and the contexts.* settings")
    return (f"{store.uri}: every one of the {pairs} pairs has a null score ({'; '.join(reasons[:2]) or 'no reason'}), "
            f"so the run is not marked complete; check {check}")


def refuse_an_earlier_revision(cfg: HarvestConfig, stored: dict) -> None:
    """An unfinished harvest begun under an earlier scoring revision (sentsim/run_formats.py) that this sentsim
    scores differently is refused: resumed, its done units and the rest would hold scores of two kinds."""
    from sentsim.harvest import metrics

    if stored.get("complete"):
        return
    revision = scoring_revision(stored)
    changes = revision_changes(revision, disc=discriminator_in_use(cfg.discriminator, cfg.contexts.mode),
                               grouped=cfg.grouping.enabled,
                               context_effect=metrics.get(cfg.metric).uses_context_effect)
    if changes:
        raise UsageError(f"{cfg.out}: this unfinished harvest was begun by an earlier sentsim (scoring revision "
                         f"{revision}), which left out {'; '.join(changes)}; its remaining units would be scored "
                         "otherwise than its done ones: pass --force-new to score it again, or finish it with the "
                         "sentsim that began it")


def model_hashes(cfg: HarvestConfig) -> dict:
    from sentsim.identity import checkpoint_hash
    from sentsim.rank.targets import default_base_encoder

    out = {"context_models": [checkpoint_hash(p) for p in cfg.context_models]}
    if cfg.index:
        from sentsim.retrieval.base import read_index_manifest

        out["index"] = read_index_manifest(cfg.index).get("fingerprint") or checkpoint_hash(cfg.index)
    if cfg.discriminator:
        out["discriminator"] = checkpoint_hash(cfg.discriminator)
    if uses_rep_cache(cfg):
        from sentsim.identity import cache_identity, corpus_fingerprint

        out["rep_cache"] = cache_identity(corpus_fingerprint(cfg.corpus), cfg.discriminator)
    if cfg.rank.enabled:
        from sentsim.encoder_folder import encoder_folder

        encoder = cfg.rank.encoder or default_base_encoder()
        encoder_folder(encoder, "rank.encoder")  # its tokenizer there, before any actor ranks a sentence with it
        out["base_encoder"] = checkpoint_hash(encoder)
    return out


def harvest_inputs(cfg: HarvestConfig) -> dict:
    """Every path a harvest reads, by the flag (or config key) that names it: none may overlap --out."""
    return {"--corpus": cfg.corpus, "--index": cfg.index, "--discriminator": cfg.discriminator,
            "--context-models": cfg.context_models, "--pairs": cfg.pairs_file, "rank.encoder": cfg.rank.encoder,
            "contexts.rep_cache": given_rep_cache(cfg.contexts.rep_cache, cfg.out)}


def without_paths(plan_info: dict) -> dict:
    """The plan as fingerprinted: the pairs file by its sha256 and length, not by the path it was given as."""
    return {k: v for k, v in plan_info.items() if k != "pairs_file"}


def scoring_device_type(cfg: HarvestConfig, executor: str) -> str:
    """The device type ("cuda" or "cpu") the scoring actors will run on, as the driver can tell it:
    `scoring.device` when set; under `auto`, a GPU when the scoring stage asks Ray for one (inline: when
    this process sees one), as ScoreStage.setup resolves it."""
    import torch

    if cfg.scoring.device != "auto":
        return torch.device(cfg.scoring.device).type
    if executor == "inline":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if cfg.resources.scoring.num_gpus > 0 else "cpu"


def scoring_precision(cfg: HarvestConfig, stored: Optional[dict], force_new: bool, executor: str
                      ) -> tuple[str, Optional[str]]:
    """The format ("bf16", "fp16" or "off" = fp32) every unit of this run scores in, and a line to print;
    `stored` is this run's manifest when it resumes (None for a new run).

    `scoring.autocast: auto` resolves once, when a run starts, and the manifest keeps the result
    (`scoring_precision`): a run resumed on a machine with other bf16 support goes on in the format it
    began in, so its pair scores never mix bf16 and fp32 units (they differ by ~5e-4; BENCHMARKS.md).
    A driver without CUDA cannot tell what GPU actors have: there `auto` stays unresolved (each actor
    picks bf16 where its GPU has it), and the unit markers and report.json say what each unit used."""
    import torch

    from sentsim.hardware import resolve_autocast

    if cfg.scoring.autocast != "auto":
        return cfg.scoring.autocast, None
    device = scoring_device_type(cfg, executor)
    here = "auto" if device == "cuda" and not torch.cuda.is_available() else resolve_autocast("auto", device)
    stored = None if force_new else stored
    kept = stored.get("scoring_precision") if stored else None
    if kept is None or kept == here:
        if stored and "scoring_precision" not in stored:
            return here, (f"{cfg.out}: this run's manifest does not record the format its done units were scored "
                          f"in (an earlier sentsim); the remaining units score in {precision_name(here)}")
        return here, None
    return kept, (f"scoring in {precision_name(kept)}, the format this run began in (scoring.autocast: auto on "
                  f"this {device.upper()} would pick {precision_name(here)}); pass --force-new to restart the run")


def precision_name(autocast: str) -> str:
    return {"off": "fp32", "auto": "the format each GPU actor picks"}.get(autocast, autocast)


def run_anchors(cfg: HarvestConfig, store: ShardStore, fp: str,
                sampled: Optional[tuple] = None) -> tuple[np.ndarray, list]:
    """The rank-vector anchor set (004 §3.2), sampled once and stored with the run as the side
    table `rank_anchors`, so students read the exact anchors back instead of re-sampling the corpus
    (which may have moved or changed). A resumed run reuses the stored set.

    With rank.storage=vectors the table also holds each anchor's E1 vector (`vector`, float16): the
    anchor matrix, encoded here once per run, from which rank actors and students compute ranks. `sampled`: the
    same sample drawn before (HarvestRun.new_run_anchors, under --force-new), used rather than drawn again."""
    import pyarrow as pa

    from sentsim.harvest.stages import rank_storage_of, sentence_schema_of
    from sentsim.rank.targets import default_base_encoder, embed_texts, sample_anchors

    vectors = rank_storage_of(cfg, sentence_schema_of(store.read_manifest() or {})) == "vectors"
    stored = store.read_side_table(ANCHORS_TABLE, fingerprint=fp)
    if stored is not None and (not vectors or "vector" in stored.column_names):
        return stored.column("sentence_id").to_numpy(), stored.column("text").to_pylist()
    if stored is not None:  # the same anchors, still without their vectors: no unit can have used them yet
        ids, texts = stored.column("sentence_id").to_numpy(), stored.column("text").to_pylist()
    else:
        ids, texts = sampled if sampled is not None else sample_anchors(cfg.corpus, cfg.rank.n_anchors,
                                                                         seed=cfg.seed + 1)
    cols = {"anchor": pa.array(np.arange(len(ids)), pa.int32()), "sentence_id": pa.array(ids, pa.int64()),
            "text": pa.array(texts, pa.string())}
    if vectors:
        v = embed_texts(cfg.rank.encoder or default_base_encoder(), texts).astype(np.float16)
        cols["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), v.shape[1]).cast(
            pa.list_(pa.float16()))
    store.write_side_table(ANCHORS_TABLE, pa.table(cols), fp)
    return ids, texts
