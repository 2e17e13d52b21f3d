"""The pool harvest's rank targets: every sentence of the plan encoded once by the base encoder E1 (004 §3.2).

A sharded job of its own (`PoolRanksRun`) under <harvest out>/pool_ranks, resumable by units of sentences
like the vectors run (pool_vectors.py), which the harvest builds (or finds complete) after its vectors and
before it labels a pair. Its table `sentence_ranks` holds, per sentence, the targets exactly as the harvest's
sentences table stores them: `rank_codes` (rank.storage=codes) or the float16 `base_vector` (vectors). In a
pool harvest a sentence is in many units (its clusters' pairs), and E1 on every unit's sentences cost a pass
per pair rather than per sentence; the labelling's PoolRankStage reads each unit's targets from here.

Its fingerprint holds what the targets depend on (E1's content hash, the resolved storage, and for codes the
anchors and rank.bits; the sentences) and not what only labelling reads (the metric, the pool, the scoring,
nor for vectors the anchor matrix, from which ranks are computed where used), so a harvest that labels
differently (the same --out, --force-new) reuses what still holds, and the vectors run is never rebuilt
for a change in rank targets.

    RankEncodeStage (CPU/GPU)  unit of sentences -> EncodedRanks (harvest/work.py)
    RankWriteStage  (CPU)      EncodedRanks -> the unit's shard and completion marker
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa

from sentsim.executor import RunContext, ShardedJob
from sentsim.harvest.config import HarvestConfig
from sentsim.harvest.pool_vectors import (
    column_matrix,
    release_arrow_memory,
    rows_of,
    sentence_plan,
    sorted_ids,
    vectors_uri,
)
from sentsim.harvest.stages import SENTENCE_SCHEMA, RankStage, encoded_ranks, rank_encoder
from sentsim.harvest.work import EncodedRanks, SentenceRanks, envelope, work_of
from sentsim.identity import fingerprint
from sentsim.pipeline import Resources, Shared, Stage, StageSpec, UnitPlan, where_this_runs

STAGE = "harvest-pool-ranks"
SUBDIR = "pool_ranks"
RANKS_TABLE = "sentence_ranks"
# the column of the harvest's sentences table each storage fills, with its type there
COLUMN = {"codes": "rank_codes", "vectors": "base_vector"}


def ranks_uri(out: str) -> str:
    return f"{out.rstrip('/')}/{SUBDIR}"


def ranks_schema(storage: str) -> pa.Schema:
    return pa.schema([SENTENCE_SCHEMA.field("sentence_id"), SENTENCE_SCHEMA.field(COLUMN[storage])])


def rank_identity(cfg: HarvestConfig, storage: str, base_encoder: str, anchor_ids: np.ndarray,
                  anchor_texts: List[str]) -> dict:
    """What a sentence's stored targets depend on besides its text: E1 (`base_encoder`, its content hash, as
    the harvest fingerprints it) and the storage; rank codes also on the anchors and rank.bits. A float16 E1
    vector depends on neither: the anchor matrix is read where ranks are computed from it."""
    out = {"storage": storage, "base_encoder": base_encoder}
    if storage == "codes":
        out.update(bits=cfg.rank.bits, anchors=fingerprint(np.asarray(anchor_ids).tolist(), list(anchor_texts)))
    return out


class PoolRanksRun(ShardedJob):
    """The rank targets of `texts` (sentence id -> text) under `identity` (rank_identity), encoded with the
    anchors given (used for codes only)."""

    stage = STAGE
    count = "sentences"
    deep = True

    def __init__(self, cfg: HarvestConfig, texts: Dict[int, str], identity: dict, anchor_ids: np.ndarray,
                 anchor_texts: List[str]):
        self.cfg, self.out, self.identity = cfg, ranks_uri(cfg.out), identity
        self.storage = identity["storage"]
        self.anchor_ids, self.anchor_texts = anchor_ids, anchor_texts
        self.ids, self.texts, self.unit_plan = sentence_plan(texts, cfg.sentences_per_unit)

    @property
    def units(self) -> UnitPlan:
        return self.unit_plan

    def fingerprint_parts(self) -> tuple:
        return (STAGE, self.identity, self.cfg.sentences_per_unit, fingerprint(self.ids.tolist(), self.texts))

    def config(self) -> dict:
        return {"sentences_per_unit": self.cfg.sentences_per_unit, "identity": self.identity}

    def inputs(self) -> List[dict]:
        return [{"corpus": self.cfg.corpus, "sentences": len(self.ids), "anchors": len(self.anchor_ids)}]

    def tables(self) -> dict:
        return {RANKS_TABLE: ranks_schema(self.storage)}

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        r = self.cfg.resources
        return [StageSpec(RankEncodeStage, Resources.of(r.rank), args=dict(
                    cfg=self.cfg, storage=self.storage, anchor_ids=self.anchor_ids, anchor_texts=self.anchor_texts)),
                StageSpec(RankWriteStage, Resources.of(r.rank), args=dict(out=self.out, fp=ctx.fp,
                                                                          storage=self.storage))]

    def summary(self, ctx: RunContext) -> dict:
        markers = [m for m in ctx.store.markers().values() if m.get("fingerprint") == ctx.fp]
        return {"counts": {"sentences": sum(m.get("extra", {}).get("sentences", 0) for m in markers)}}


class RankEncodeStage(Stage):
    """A unit of sentences -> EncodedRanks: all the call's units' sentences through E1 at once (RankStage's
    encoder: rank_encoder, encoded_ranks)."""

    name = "rank"

    def __init__(self, cfg: HarvestConfig, storage: str, anchor_ids: np.ndarray, anchor_texts: List[str]):
        self.cfg, self.storage, self.anchor_ids, self.anchor_texts = cfg, storage, anchor_ids, anchor_texts

    def setup(self) -> None:
        self.targets = rank_encoder(self.cfg, self.storage, self.anchor_ids, self.anchor_texts)

    def process(self, items: List[dict]) -> List[dict]:
        t0 = time.perf_counter()
        ranks = encoded_ranks(self.targets, self.storage, [t for unit in items for t in unit["texts"]])
        share = (time.perf_counter() - t0) / max(sum(len(unit["ids"]) for unit in items), 1)
        out, start = [], 0
        for unit in items:
            rows = slice(start, start + len(unit["ids"]))
            start = rows.stop
            part = SentenceRanks(ranks.storage, codes=None if ranks.codes is None else ranks.codes[rows],
                                 vectors=None if ranks.vectors is None else ranks.vectors[rows],
                                 bytes_per_sentence=ranks.bytes_per_sentence)
            out.append(envelope(EncodedRanks(unit=unit["unit"], ids=list(unit["ids"]), ranks=part,
                                             timing={"rank": share * len(unit["ids"])})))
        return out


class RankWriteStage(Stage):
    """EncodedRanks -> the unit's sentence_ranks shard and completion marker."""

    name = "write"

    def __init__(self, out: str, fp: str, storage: str):
        self.out, self.fp, self.storage = out, fp, storage

    def setup(self) -> None:
        self.where = where_this_runs()

    def process(self, items: List[dict]) -> List[dict]:
        from storage import ShardStore

        out = []
        for item in items:
            w: EncodedRanks = work_of(item)
            t0 = time.perf_counter()
            # as WriteStage fills the harvest's sentences table, so that the two hold the same values
            targets = ([c.astype(np.uint32).tolist() for c in w.ranks.codes] if self.storage == "codes"
                       else list(w.ranks.vectors))
            table = pa.Table.from_pydict({"sentence_id": w.ids, COLUMN[self.storage]: targets},
                                         schema=ranks_schema(self.storage))
            timing = dict(w.timing, write=time.perf_counter() - t0)
            ShardStore(self.out).write_unit(w.unit, {RANKS_TABLE: table}, self.fp, {
                "sentences": len(w.ids), "timing": timing, "placement": {self.name: self.where}})
            out.append({"unit": w.unit, "sentences": len(w.ids), "timing": timing})
        return out


class StoredRanks:
    """A complete ranks run in memory: row i is sentence `ids[i]` (ascending), `targets` its rank codes (uint32,
    as the sentences table holds them) or float16 E1 vectors, by `storage` (read through RunReader, so every
    shard is checked against its marker). Numpy arrays only, so that a run's rank actors share one copy
    (pipeline.Shared, as the label actors share the vectors)."""

    def __init__(self, uri: str):
        from storage import RunReader

        reader = RunReader(uri, what="pool rank targets")
        self.storage = "codes" if COLUMN["codes"] in reader.schema(RANKS_TABLE).names else "vectors"
        self.ids, order = sorted_ids(reader, RANKS_TABLE)
        self.targets = column_matrix(reader, RANKS_TABLE, COLUMN[self.storage], order)
        release_arrow_memory()

    def of(self, ids: List[int]) -> np.ndarray:
        return self.targets[rows_of(self.ids, ids)]


class PoolRankStage(RankStage):
    """RankStage for the pool harvest: Scored -> Ranked with each sentence's targets read from the ranks run
    (complete: the harvest built it first) rather than encoded, and each pair's rank similarity computed from
    them as RankStage computes it.

    The targets can differ in their last bits from what RankStage would encode for the same sentence: E1 runs
    on a batch, and a batch's padding (its longest sentence) changes the float sums. Encoded once per sentence,
    every unit holding a sentence gets the same targets for it."""

    def __init__(self, *args, ranks: Shared, **kwargs):
        super().__init__(*args, **kwargs)
        self.ranks = ranks  # shared_ranks: the ranks run, loaded once for all of a run's rank actors

    def setup(self) -> None:
        from sentsim.rank.vectors import RankCodec, vector_bytes

        self.targets = None
        self.stored = self.ranks.get()
        # the harvest's resolved rank.storage (its fingerprint holds it, prepare_pool): E1 is not loaded to resolve
        # `auto` again, nor at all, in the labelling pass
        self.storage = self.stored.storage
        width = self.stored.targets.shape[1]
        if self.storage == "vectors":
            self.anchors = run_anchor_matrix(self.cfg.out, self.fp)
            self.bytes_per_sentence = vector_bytes(width)
        else:
            self.anchors = None
            self.bytes_per_sentence = RankCodec(len(self.anchor_ids), self.cfg.rank.bits).bytes_per_sentence

    def _ranks(self, texts: Dict[int, str]) -> SentenceRanks:
        targets = self.stored.of(sorted(texts))
        if self.storage == "vectors":
            return SentenceRanks("vectors", vectors=targets, bytes_per_sentence=self.bytes_per_sentence)
        return SentenceRanks(self.storage, codes=targets, bytes_per_sentence=self.bytes_per_sentence)


def labelled_with_ranks_run(manifest: dict) -> bool:
    """Whether the harvest whose manifest this is was labelled from a ranks run (its summary names one): a
    rerun builds that run again when its folder was deleted, as it builds the vectors. A harvest labelled before
    rank targets had a run of their own names none, and is not given one."""
    return bool((manifest.get("pool") or {}).get("ranks_fingerprint"))


def ensure_pool_ranks(job: PoolRanksRun, executor: str, address: Optional[str], force_new: bool, quiet: bool,
                      max_units: Optional[int] = None) -> dict:
    """Build (resume, or confirm) the harvest's ranks run (pool_vectors.ensure_pool_run). One rebuilt after its
    folder was deleted, under a harvest that already labelled units from the first one, is compared with the
    targets those units' `sentences` rows hold, and a line says whether they are the same."""
    from sentsim.harvest.pool_vectors import ensure_pool_run

    return ensure_pool_run(job, "rank targets", executor, address, force_new, quiet, max_units,
                           unlike=lambda: ranks_unlike_labels(job.cfg.out, job.storage))


def pool_runs_record(out: str, ranks_on: bool, recorded: dict) -> dict:
    """The harvest at `out`'s record of its pool runs, for its manifest: the items its vectors run scored, which
    vectors the labels were read from (a remix checks it is still them) and which rank targets (None with rank
    targets off: no ranks run). A run deleted, or rebuilt only part-way when a rerun stopped (--max-units), keeps
    what the manifest `recorded` of it: the labels were read from that one, and a rerun rebuilds it from the
    record (pool_ranks.labelled_with_ranks_run)."""
    from storage import ShardStore

    vectors = ShardStore(vectors_uri(out)).read_manifest() or {}
    ranks = (ShardStore(ranks_uri(out)).read_manifest() or {}) if ranks_on else {}
    whole = vectors.get("complete") or not recorded.get("scored_items")
    return {"scored_items": (vectors.get("counts") or {}).get("scored_items") if whole else recorded["scored_items"],
            "vectors_fingerprint": vectors.get("fingerprint") or recorded.get("vectors_fingerprint"),
            "ranks_fingerprint": (ranks.get("fingerprint") or recorded.get("ranks_fingerprint")) if ranks_on else None}


def ranks_unlike_labels(out: str, storage: str) -> Optional[tuple[int, int]]:
    """Of the sentences the harvest at `out` labelled so far, how many have targets in its ranks run other than
    those of their `sentences` rows, and how many there are; None when no unit is labelled yet (nothing to
    compare). A sentence of several units is compared in each. The rows are read a batch at a time: beside the
    ranks run, the driver holds no second copy of every target."""
    from storage import RunReader

    harvest = RunReader(out)
    if not harvest.units() or COLUMN[storage] not in harvest.schema("sentences").names:
        return None
    stored = StoredRanks(ranks_uri(out))
    seen, differ = [], []
    for batch in harvest.iter_batches("sentences", ["sentence_id", COLUMN[storage]]):
        ids = batch.column("sentence_id").to_numpy()
        col = batch.column(COLUMN[storage])
        seen.append(ids)
        if col.null_count or stored.storage != storage:  # rank targets off in those units, or the other storage
            differ.append(ids)
            continue
        held = col.flatten().to_numpy(zero_copy_only=False).reshape(len(ids), -1).astype(stored.targets.dtype)
        want = stored.of(ids.tolist())
        differ.append(ids[~(held == want).all(axis=1)] if held.shape == want.shape else ids)
    n = len(np.unique(np.concatenate(seen))) if seen else 0
    return len(np.unique(np.concatenate(differ))) if differ else 0, n


def shared_ranks(out: str) -> Shared:
    """The harvest at `out`'s ranks run, whole, loaded once for all of a run's rank actors."""
    import functools

    return Shared(functools.partial(StoredRanks, ranks_uri(out)))


def run_anchor_matrix(out: str, fp: Optional[str]):
    """The harvest's anchor matrix (side table rank_anchors) on the device RankStage's E1 would rank on."""
    import torch

    from sentsim.harvest.anchors import stored_anchor_vectors
    from sentsim.rank.vectors import AnchorMatrix
    from storage import ShardStore

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return AnchorMatrix(stored_anchor_vectors(ShardStore(out), fp), device=device)
