"""The pool harvest's first pass: every sentence of the plan scored once against the shared pool P.

A sharded job of its own (`PoolVectorsRun`) under <harvest out>/pool_vectors, resumable by units of
sentences like every job; the harvest runs it (or finds it complete) before it labels a pair. Its table
`sentence_vectors` holds, per sentence, S over P (Eq. 3) and each direction's term over P; its side table
`pool` the contexts themselves. Its fingerprint holds what the vectors depend on (corpus, pool, scoring,
context models, the sentences) and not what labelling reads (metric, splits, rank targets), so a harvest
that only labels differently (the same --out, --force-new) reuses the vectors.

    PoolScoreStage   (GPU)  unit of sentences -> SentenceVectors (harvest/work.py)
    VectorWriteStage (CPU)  SentenceVectors -> the unit's shard and completion marker
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import pyarrow as pa

from sentsim.errors import UsageError
from sentsim.executor import PrerequisiteStopped, RunContext, ShardedJob, execute
from sentsim.harvest.pool import POOL_TABLE, Pool
from sentsim.harvest.work import SentenceVectors, envelope, work_of
from sentsim.identity import fingerprint
from sentsim.pipeline import Resources, Stage, StageSpec, UnitPlan, where_this_runs
from sentsim.screening.config import screened_as_stored

STAGE = "harvest-pool-vectors"
SUBDIR = "pool_vectors"
VECTORS_TABLE = "sentence_vectors"
DIRS = ("fwd", "left", "right")
# float32 as the per-pair harvest's context_scores: the terms come from a float32 (or bf16) model
VECTOR_SCHEMA = pa.schema([("sentence_id", pa.int64()), ("text", pa.string()), ("S", pa.list_(pa.float32())),
                           *[(d, pa.list_(pa.float32())) for d in DIRS]])


def vectors_uri(out: str) -> str:
    return f"{out.rstrip('/')}/{SUBDIR}"


class PackedTexts:
    """Texts as two numpy arrays, their UTF-8 bytes end to end and where each ends, so that a plan holding
    them (SentenceUnits) is shipped to each read task as numpy buffers, which Ray maps zero-copy, not as a
    list of str that every read task unpickles whole. `surrogatepass` keeps any str exactly as it was."""

    def __init__(self, texts: List[str]):
        encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
        self.ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        self.data = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> str:
        i = range(len(self.ends))[i]  # negative indices, and an IndexError past the end
        lo = int(self.ends[i - 1]) if i else 0
        return self.data[lo:int(self.ends[i])].tobytes().decode("utf-8", "surrogatepass")

    def __iter__(self):
        return (self[i] for i in range(len(self.ends)))

    def slice(self, start: int, stop: int) -> List[str]:
        return [self[i] for i in range(start, min(stop, len(self.ends)))]


class SentenceUnits:
    """Unit u of the vectors run: its slice of the plan's sentences (sorted ids) and their texts. The texts of
    a pairs file's sentences are in no corpus, so they travel with the plan, packed (PackedTexts)."""

    def __init__(self, ids: np.ndarray, texts: List[str], per_unit: int):
        self.ids, self.texts, self.per_unit = ids, PackedTexts(texts), per_unit

    def __call__(self, u: int) -> dict:
        lo, hi = u * self.per_unit, (u + 1) * self.per_unit
        return {"unit": u, "ids": self.ids[lo:hi].tolist(), "texts": self.texts.slice(lo, hi)}


def sentence_plan(texts: Dict[int, str], per_unit: int) -> tuple[np.ndarray, List[str], UnitPlan]:
    """A run over the plan's sentences (sentence id -> text): their ids sorted, their texts in that order, and
    units of `per_unit` of them (SentenceUnits)."""
    ids = np.array(sorted(texts), dtype=np.int64)
    ordered = [texts[int(s)] for s in ids]
    return ids, ordered, UnitPlan(-(-len(ids) // per_unit), SentenceUnits(ids, ordered, per_unit))


class PoolVectorsRun(ShardedJob):
    """The vectors of `texts` (sentence id -> text) over `pool`, scored with the harvest's settings.
    `identity`: what, besides the pool and the sentences, the scores depend on (HarvestRun.vector_identity)."""

    stage = STAGE
    count = "sentences"
    deep = True

    def __init__(self, cfg, texts: Dict[int, str], pool: Pool, identity: dict, precision: str):
        self.cfg, self.out = cfg, vectors_uri(cfg.out)
        self.pool, self.identity, self.precision = pool, identity, precision
        self.ids, self.texts, self.unit_plan = sentence_plan(texts, cfg.sentences_per_unit)

    @property
    def units(self) -> UnitPlan:
        return self.unit_plan

    def fingerprint_parts(self, identity: Optional[dict] = None) -> tuple:
        return (STAGE, identity or self.identity, fingerprint(self.pool.ids.tolist()), self.cfg.sentences_per_unit,
                fingerprint(self.ids.tolist(), self.texts))

    def fingerprint_in_format(self, version: int, stored: dict) -> Optional[str]:
        """Format 2 fingerprinted the contexts keys only screening reads: as the stored run holds them
        (sentsim/run_formats.py)."""
        if version != 2:
            return None
        held = ((stored.get("config") or {}).get("identity") or {}).get("contexts") or {}
        identity = dict(self.identity, contexts=screened_as_stored(self.identity["contexts"], held))
        return fingerprint(*self.fingerprint_parts(identity))

    def config(self) -> dict:
        return {"sentences_per_unit": self.cfg.sentences_per_unit, "pool_size": len(self.pool),
                "identity": self.identity}

    def inputs(self) -> List[dict]:
        return [{"corpus": self.cfg.corpus, "sentences": len(self.ids), "pool_size": len(self.pool)}]

    def tables(self) -> dict:
        return {VECTORS_TABLE: VECTOR_SCHEMA}

    def open_extra(self) -> dict:
        return {"scoring_precision": self.precision}

    def prepare(self, ctx: RunContext) -> None:
        if ctx.store.read_side_table(POOL_TABLE, fingerprint=ctx.fp) is None:
            ctx.store.write_side_table(POOL_TABLE, self.pool.table(), ctx.fp)

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        cfg, r = self.cfg, self.cfg.resources
        scoring = cfg.scoring.model_copy(update={"autocast": self.precision})
        return [StageSpec(PoolScoreStage, Resources.of(r.scoring), args=dict(
                    context_models=cfg.context_models, scoring=scoring, pool=self.pool,
                    exclude_own=cfg.contexts.exclude_query_centre, exclude_window=cfg.contexts.exclude_query_window)),
                StageSpec(VectorWriteStage, Resources.of(r.rank), args=dict(out=self.out, fp=ctx.fp))]

    def summary(self, ctx: RunContext) -> dict:
        markers = [m for m in ctx.store.markers().values() if m.get("fingerprint") == ctx.fp]
        return {"counts": {k: sum(m.get("extra", {}).get(k, 0) for m in markers)
                           for k in ("sentences", "scored_items")}}


def windows_holding(pool: Pool, centre: bool, beside: bool) -> Dict[str, List[int]]:
    """A sentence's text -> the pool contexts it is not scored in: those centred on it (`centre`,
    exclude_query_centre) and those whose window holds it beside the centre (`beside`, exclude_query_window)."""
    out: Dict[str, List[int]] = {}
    for j, text in enumerate(pool.centres):
        held = ([text] if centre else []) + ([*pool.left[j], *pool.right[j]] if beside else [])
        for t in dict.fromkeys(x.strip() for x in held):
            out.setdefault(t, []).append(j)
    return out


class PoolScoreStage(Stage):
    """A unit of sentences -> SentenceVectors: each sentence in every pool context, all the call's units in one
    `ContextScorer.score` (as the per-pair ScoreStage)."""

    name = "scoring"

    def __init__(self, context_models: List[str], scoring, pool: Pool, exclude_own: bool = True,
                 exclude_window: bool = False):
        self.context_models, self.scoring, self.pool, self.exclude_own = context_models, scoring, pool, exclude_own
        self.exclude_window = exclude_window  # ContextSetConfig.exclude_query_window

    def setup(self) -> None:
        import torch

        from sentsim.context.scorer import ContextScorer

        sc = self.scoring
        if sc.device == "auto" and not torch.cuda.is_available():
            sc = sc.model_copy(update={"device": "cpu"})
        self.scorer = ContextScorer(self.context_models, sc)
        self.own_windows = windows_holding(self.pool, self.exclude_own, self.exclude_window)

    def process(self, items: List[dict]) -> List[dict]:
        from sentsim.context.scorer import ContextItem

        t0 = time.perf_counter()
        P, pool = len(self.pool), self.pool
        batch = [ContextItem(text, pool.left[j], pool.right[j]) for unit in items for text in unit["texts"]
                 for j in range(P)]
        res = self.scorer.score(batch) if batch else None
        share = (time.perf_counter() - t0) / max(len(batch), 1)
        out, start = [], 0
        for unit in items:
            n = len(unit["texts"])
            part = slice(start, start + n * P)
            start += n * P

            def grid(values) -> np.ndarray:
                return np.asarray(values[part], dtype=np.float32).reshape(n, P)

            S = grid(res.score) if n else np.zeros((0, P), np.float32)
            terms = {d: grid(res.logprob[d]) if n else np.zeros((0, P), np.float32) for d in DIRS}
            if self.own_windows:  # no sentence is scored in a window holding it (ContextSetConfig), as C_s leaves out
                for i, text in enumerate(unit["texts"]):
                    for j in self.own_windows.get(text.strip(), ()):
                        for a in (S, *terms.values()):
                            a[i, j] = np.nan
            out.append(envelope(SentenceVectors(
                unit=unit["unit"], ids=list(unit["ids"]), texts=list(unit["texts"]), S=S, terms=terms,
                n_scored=n * P, precision=self.scorer.precision, timing={"scoring": share * n * P})))
        return out


class VectorWriteStage(Stage):
    """SentenceVectors -> the unit's sentence_vectors shard and completion marker."""

    name = "write"

    def __init__(self, out: str, fp: str):
        self.out, self.fp = out, fp

    def setup(self) -> None:
        self.where = where_this_runs()

    def process(self, items: List[dict]) -> List[dict]:
        from storage import ShardStore

        out = []
        for item in items:
            w: SentenceVectors = work_of(item)
            t0 = time.perf_counter()

            def rows(a: np.ndarray) -> pa.Array:
                return pa.array(list(a), pa.list_(pa.float32()))

            table = pa.table({"sentence_id": pa.array(w.ids, pa.int64()), "text": w.texts, "S": rows(w.S),
                              **{d: rows(w.terms[d]) for d in DIRS}}, schema=VECTOR_SCHEMA)
            timing = dict(w.timing, write=time.perf_counter() - t0)
            ShardStore(self.out).write_unit(w.unit, {VECTORS_TABLE: table}, self.fp, {
                "sentences": len(w.ids), "scored_items": w.n_scored, "timing": timing,
                "scoring_precision": w.precision, "placement": {self.name: self.where}})
            out.append({"unit": w.unit, "sentences": len(w.ids), "scored_items": w.n_scored, "timing": timing})
        return out


def ensure_pool_vectors(job: PoolVectorsRun, executor: str, address: Optional[str], force_new: bool,
                        quiet: bool, max_units: Optional[int] = None) -> dict:
    """Build (resume, or confirm) the harvest's vectors run (`ensure_pool_run`). Vectors of the same identity
    keep the format they began in."""

    def keep_precision(old: dict) -> None:  # never bf16 and fp32 units in one run (job.scoring_precision)
        if old.get("scoring_precision"):
            job.precision = old["scoring_precision"]

    return ensure_pool_run(job, "sentence vectors", executor, address, force_new, quiet, max_units, keep_precision,
                           unlike=lambda: scores_unlike_labels(job.cfg.out, job.cfg.metric))


def run_was_whole(uri: str) -> bool:
    """Whether a finished run is at `uri`, or one whose manifest cannot be read (ensure_pool_run's to judge). A run
    that is not was never built, was deleted, or was rebuilt only part-way by a rerun that stopped (--max-units):
    whatever ensure_pool_run finishes there now is new, and is compared with the labels it did not make."""
    from storage import ShardStore, StoreError

    store = ShardStore(uri)
    try:
        m = store.read_manifest()
    except StoreError:
        return True
    return bool(m.get("complete")) if m is not None else store.lost_manifest()


def rebuilt_note(uri: str, unlike: Optional[tuple[int, int]], what: str, quiet: bool) -> None:
    """The line for a pool run built again under a harvest that had labelled units from the one deleted: whether
    the rebuilt one gives what those labels hold (`unlike`: sentences or pairs that differ, of how many; None:
    nothing labelled, so nothing rebuilt under labels)."""
    if unlike is None or quiet and not unlike[0]:
        return
    differ, n = unlike
    if not differ:
        line = f"{uri} was not there and is rebuilt: the same {what} as the {n:,} labelled {_noun(what)} were " \
               "computed from"
    else:
        line = f"note: {uri} was not there and is rebuilt, but not exactly: {differ:,} of the {n:,} labelled " \
               f"{_noun(what)} differ from what these {what} give (scored or encoded on other hardware, or in " \
               "other batches); the labelled rows are kept as they were, and a remix or relabel reads the rebuilt ones"
    print(f"[harvest] {line}", file=sys.stderr, flush=True)


def _noun(what: str) -> str:
    return "pairs' scores" if what == "sentence vectors" else "sentences"


# pairs whose scores scores_unlike_labels computes at once
_CHECK_PAIRS = 65_536


def scores_unlike_labels(out: str, metric: str) -> Optional[tuple[int, int]]:
    """Of the pairs the harvest at `out` labelled so far, how many get another score from its vectors run (the
    label stage's Eq. 4, pool_label.py, with the harvest's own context effect) than they hold, and how many there
    are; None when no unit is labelled yet (nothing to compare)."""
    from sentsim.harvest import metrics
    from sentsim.harvest.eq4_rows import vector_rows
    from sentsim.harvest.pool import EFFECT_TABLE
    from storage import RunReader

    harvest = RunReader(out)
    if not harvest.units():
        return None
    effect = None
    if metrics.get(metric).uses_context_effect:
        side = harvest.store.read_side_table(EFFECT_TABLE, fingerprint=harvest.fingerprint)
        effect = None if side is None else side.column("effect").to_numpy()
    stored = StoredVectors(vectors_uri(out))
    differ = n = 0
    # a batch of labelled pairs at a time (vector_rows gives a dict a pair): beside the vectors run, the driver
    # holds no whole-run column of the pairs
    for batch in harvest.iter_batches("pairs", ["s1_id", "s2_id", "score"], batch_size=_CHECK_PAIRS):
        pairs = np.stack([stored.rows(batch.column("s1_id").to_numpy()), stored.rows(batch.column("s2_id").to_numpy())],
                         axis=1)
        got = np.array([np.nan if r["score"] is None else r["score"]
                        for r in vector_rows(pairs, stored.S, {}, metric, effect)], dtype=np.float64)
        held = batch.column("score").cast(pa.float64()).to_numpy(zero_copy_only=False)
        differ += int((~((got == held) | (np.isnan(got) & np.isnan(held)))).sum())
        n += len(held)
    return differ, n


def ensure_pool_run(job: ShardedJob, what: str, executor: str, address: Optional[str], force_new: bool, quiet: bool,
                    max_units: Optional[int] = None, resume_as: Optional[Callable[[dict], None]] = None,
                    unlike: Optional[Callable[[], Optional[tuple[int, int]]]] = None) -> dict:
    """Build (resume, or confirm) a run the pool harvest reads before it labels a pair (its vectors, its rank
    targets: `what`), at most `max_units` of its units; returns its manifest, or raises PrerequisiteStopped
    when --max-units left it unfinished. --force-new on the harvest rebuilds the run only when it is not this
    one: of other inputs, or a folder whose manifest is missing or unreadable; a run of the same identity is
    still right, and rebuilding it would only cost time. `resume_as(manifest)` sets on the job what a run
    of the same identity keeps from when it began. `unlike()`: how many labelled items the run finished here
    gives otherwise than the labels hold, said in one line (`rebuilt_note`) when it was not whole before."""
    from storage import ShardStore, StoreError

    whole = run_was_whole(job.out)
    try:
        old = ShardStore(job.out).read_manifest()
    except StoreError:
        old = None
    same = old is not None and job.holds_this_run(old)
    if same and resume_as is not None:
        resume_as(old)
    m = execute(job, executor=executor, address=address, force_new=force_new and not same, quiet=quiet,
                max_units=max_units)
    if not m.get("complete") and max_units is not None:
        raise PrerequisiteStopped(f"the pool's {what} ({job.out}) stopped at --max-units {max_units}, "
                                  f"{m['completed_units']}/{m['planned_units']} units done; no pair is labelled "
                                  "until they are all done")
    if not m.get("complete"):
        raise UsageError(f"{job.out}: the {what} did not complete; run the harvest again to resume them")
    if unlike is not None and not whole:
        rebuilt_note(job.out, unlike(), what, quiet)
    return m


class StoredVectors:
    """A complete vectors run in memory: row i is sentence `ids[i]` (ascending), `S` and `terms[d]` float32
    [n, |P|], `texts` packed (read through RunReader, so every shard is checked against its marker).

    Plain numpy arrays only, no Python dict or list per sentence: a pool harvest's label actors share one copy
    of it through Ray's object store (`pipeline.Shared`), which maps numpy arrays into each actor zero-copy and
    would unpickle a dict or a list of str into every actor's own memory."""

    def __init__(self, uri: str):
        from storage import RunReader

        reader = RunReader(uri, what="pool vectors")
        self.ids, order = sorted_ids(reader, VECTORS_TABLE)
        texts = reader.read_table(VECTORS_TABLE, ["text"]).column(0).to_pylist()
        self.texts = PackedTexts(texts if order is None else [texts[i] for i in order])
        del texts
        self.S = column_matrix(reader, VECTORS_TABLE, "S", order).astype(np.float32, copy=False)
        self.terms = {d: column_matrix(reader, VECTORS_TABLE, d, order).astype(np.float32, copy=False) for d in DIRS}
        release_arrow_memory()

    def rows(self, sentence_ids) -> np.ndarray:
        """The rows of these sentence ids; a KeyError names the first id the run does not hold."""
        return rows_of(self.ids, sentence_ids)

    def missing(self, sentence_ids) -> List[int]:
        """Those of these sentence ids the run holds no vector for, sorted."""
        want = np.unique(np.asarray(list(sentence_ids), dtype=np.int64))
        return want[~np.isin(want, self.ids)].tolist()

    def context_effect(self) -> np.ndarray:
        """Each pool context's mean S over every scored sentence: what double-centred removes."""
        return pool_context_effect(self.S)


def sorted_ids(reader, table: str) -> tuple:
    """The stored run's sentence ids, ascending, and the order that sorts its rows (None when they are already:
    units are sorted slices, read in unit order)."""
    ids = reader.read_table(table, ["sentence_id"]).column(0).to_numpy()
    if len(ids) < 2 or bool((ids[1:] >= ids[:-1]).all()):
        return ids, None
    order = np.argsort(ids, kind="stable")
    return ids[order], order


def column_matrix(reader, table: str, name: str, order: Optional[np.ndarray]) -> np.ndarray:
    """A list column of equal-length rows as one numpy matrix [rows, width], in `order` (None: as stored). Read
    on its own and copied once out of Arrow's memory, so that loading a whole run holds at most one column
    twice, not the whole table beside its matrices."""
    col = reader.read_table(table, [name]).column(0)
    n = len(col)
    flat = np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in col.chunks]) if col.num_chunks \
        else np.zeros(0, col.type.value_type.to_pandas_dtype())
    del col
    out = flat.reshape(n, -1) if n else flat.reshape(0, 0)
    return out if order is None else out[order]


def release_arrow_memory() -> None:
    """Hand the pages Arrow's allocator kept after a whole run was read back to the system: freed, they would
    stay in the reading process (the driver, all through its pipeline) as much as the run's size again."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def rows_of(ids: np.ndarray, sentence_ids) -> np.ndarray:
    """Where each of `sentence_ids` is in the ascending `ids` (a stored run's rows), by binary search: no dict
    of every sentence, which an actor sharing the run (pipeline.Shared) would hold a copy of. A KeyError names
    the first id not there."""
    want = np.asarray(sentence_ids, dtype=np.int64).reshape(-1)
    at = np.searchsorted(ids, want).clip(max=max(len(ids) - 1, 0))
    held = (ids[at] == want) if len(ids) else np.zeros(len(want), bool)
    if not held.all():
        raise KeyError(int(want[~held][0]))
    return at


def pool_context_effect(S: np.ndarray) -> np.ndarray:
    """Per pool context (column of S, sentences x |P|), the mean over the sentences scored there (NaN-safe): the
    harvest computes it from the stored S, a remix from S under its own λ."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a context no sentence was scored in: NaN
        return np.nanmean(S.astype(np.float64), axis=0)
