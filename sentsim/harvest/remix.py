"""`sentsim remix`: new Eq. 3 weights (or another Eq. 4 metric) over a finished harvest, no re-scoring.

A harvest stores every (sentence, context) term it scored (`context_scores`: fwd, left, right,
disc) and each sentence's own context set C_s (`sentences.context_ids`). Eq. 3,
S(s, c) = λ1·disc + λ2·fwd + λ3·left + λ4·right (003 §3.3), and Eq. 4, the similarity of
[S(s1, c)] and [S(s2, c)] over c in C_s1 + C_s2, can therefore be recomputed under other λ in
seconds, where scoring took hours. The paper does not give λ; choosing them on a labelled dev
set (a `harvest --pairs` run of STS-B dev) is what this is for, and a remixed harvest is a harvest
like any other: surrogates and students train on it, `eval sts --scores` reads it.

The output is its own resumable run, one unit per source unit, with the source's sentences,
context_scores (S recomputed) and side tables, and pairs with score and sim_* recomputed.
Harvests written before `context_ids` existed are remixed over the contexts both sentences were
scored in within their unit, which can include a few contexts of other pairs; the summary counts
those pairs as approximate.

The terms are stored as float32 (float64 in older harvests, whose remix keeps float64):
a remix is exact to the stored values, and a remix with the source's own weights reproduces the
harvest's scores to float32 rounding of the terms (4.9e-8 on the bench harvest). A harvest run with
keep_context_scores=none stored no terms and is refused.

A compacted harvest (`sentsim store compact`) remixes to the same rows as before compacting: each
unit is read through RunReader.unit_table, a slice of the compacted file that holds it, and each
compacted file is checked against its sha256 and read about once per remix process, since units
go in order.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Iterator, List, Literal, Optional

import numpy as np
import pyarrow as pa
from pydantic import Field

from sentsim.config import Section
from sentsim.context.scorer import TERMS, eq3_sum  # the Eq. 3 terms (disc, fwd, left, right) and their sum
from sentsim.errors import UsageError
from sentsim.executor import RunContext, ShardedJob, execute
from sentsim.harvest import metrics
from sentsim.harvest.eq4_rows import MissingTerm, UnitTerms, has_no_contexts, pair_rows
from sentsim.out_paths import check_out
from sentsim.pipeline import Resources, Shared, Stage, StageResources, StageSpec
from sentsim.run_formats import scoring_config
from sentsim.screening.config import discriminator_in_use

STAGE = "harvest-remix"


class RemixConfig(Section):
    source: str = Field(description="a finished harvest run directory")
    out: str = Field(description="where the remixed run is written")
    # Unset = the source's weight. 003 §3.3 gives no values; the harvest default is 1 for each.
    lambda_disc: Optional[float] = Field(None, ge=0, description="λ1, the discriminator term")
    lambda_fwd: Optional[float] = Field(None, ge=0, description="λ2, log p(s | c<, c>) per token")
    lambda_left: Optional[float] = Field(None, ge=0, description="λ3, log p(c< | s, c>) per token")
    lambda_right: Optional[float] = Field(None, ge=0, description="λ4, log p(c> | c<, s) per token")
    metric: Optional[Annotated[str, metrics.OneOf(metrics.names)]] = Field(
        None, description="Eq. 4 similarity; unset = the source's (double-centred: pool harvests only)")
    # Grouped harvests (grouping.enabled) keep three Eq. 4 variants; this picks the one in `score`.
    # Unset = the source's grouping.score (sentsim/harvest/grouping.py).
    variant: Optional[Literal["paper", "union", "centred"]] = Field(
        None, description="grouped harvests: which Eq. 4 variant fills score (default: the source's)")
    resources: StageResources = StageResources()  # the remix actors' resources (--executor ray)


def resolve(cfg: RemixConfig, manifest: dict, pooled: bool = False) -> tuple[dict, str]:
    """The remix's weights and metric: each unset λ is the source's (0 for a term its ablation left out). A pool
    harvest (`pooled`) keeps every sentence's vector, so its context effect is recomputed and any metric goes."""
    lam = weights(cfg, manifest)
    src = manifest.get("config", {})
    metric = cfg.metric or src.get("metric", metrics.DEFAULT)
    others = ", ".join(m for m in metrics.remixable() if m != metrics.DEFAULT)
    if metric not in metrics.names():
        raise UsageError(f"{cfg.source}: its Eq. 4 metric {metric!r} is not one this sentsim has "
                         f"({', '.join(metrics.names())}); pass --metric {metrics.DEFAULT} (or {others})")
    if metrics.get(metric).uses_context_effect and not pooled:
        raise UsageError(f"{cfg.source}: metric {metric} needs the reference sentences' scores, which a per-pair "
                         f"harvest does not store (a contexts.mode=pool one does); pass --metric {metrics.DEFAULT} "
                         f"(or {others})")
    if not any(lam.values()):
        raise UsageError("every λ is 0: Eq. 3 would be empty")
    return lam, metric


def weights(cfg: RemixConfig, manifest: dict) -> dict:
    """The remix's λ: each one `cfg` leaves unset is the source's (0 for a term its ablation left out)."""
    from pydantic import ValidationError

    from sentsim.config import format_validation_error
    from sentsim.context.config import ScorerConfig

    src = manifest.get("config", {})
    try:  # a harvest from before λ had to be finite (a NaN λ scored no pair) is refused here
        scoring = ScorerConfig(**scoring_config(manifest))
    except ValidationError as exc:
        raise UsageError(f"{cfg.source}: its manifest's scoring config is not valid "
                         f"({format_validation_error(exc).removeprefix('invalid config: ')}); harvest again "
                         "with this sentsim") from None
    on, src_lam = scoring.enabled(), scoring.weights()
    # without a discriminator in use the source's λ_disc weighed nothing, and the remix says so (λ disc 0)
    on["disc"] = on["disc"] and discriminator_in_use(src.get("discriminator"), (src.get("contexts") or {}).get("mode"))
    lam = {}
    for t in TERMS:
        given = getattr(cfg, f"lambda_{t}")
        lam[t] = float(given) if given is not None else (src_lam[t] if on[t] else 0.0)
    return lam


def pool_vectors_of(source: str, manifest: dict) -> Optional[tuple[str, str]]:
    """A pool harvest's vectors run and its fingerprint (the harvest's own, or, for a remix of one, the run that
    remix read); None for a per-pair harvest. Refused unless it is whole and still the run the labels came from."""
    config = manifest.get("config") or {}
    if (config.get("contexts") or {}).get("mode") != "pool":
        return None
    remixed = config.get("remix") or {}
    # the last run's settings: where an older sentsim resumed a remix from its source's new place, only this record
    # names it (its config.remix kept the first place)
    latest = manifest.get("remix") or {}
    expected = (latest.get("pool_vectors_fingerprint") or remixed.get("pool_vectors_fingerprint")
                or (manifest.get("pool") or {}).get("vectors_fingerprint"))
    problems = []
    for uri in _vector_places(source, manifest, set()):
        if any(uri == p[0] for p in problems):
            continue
        m, problem = _vectors_run(uri)
        if problem is None and expected and m.get("fingerprint") != expected:
            problem = "other"
        if problem is None:
            return uri, m["fingerprint"]
        problems.append((uri, problem))
    # the first place that holds something says most; vectors missing everywhere are named where the remix
    # recorded them last
    uri, problem = next((p for p in problems if p[1] != "missing"), problems[0])
    if problem == "other":
        raise UsageError(f"{uri}: these sentence vectors are not the ones {source}'s labels were computed from "
                         "(the harvest was run again with other settings); remix the harvest that made them")
    why = {"missing": "no finished run there"}.get(problem, problem)
    if remixed:
        raise UsageError(f"{source}: the pool harvest's sentence vectors it was remixed from are missing or "
                         f"incomplete at {uri} ({why}); if that harvest ({uri.rsplit('/', 1)[0]}) was moved, remix "
                         "it from its new place, or rerun the remix made from it with its new path (the remixes "
                         "of that remix follow)")
    raise UsageError(f"{uri}: this pool harvest's sentence vectors are missing or incomplete ({why}); "
                     "run the harvest's command again, which rebuilds them, then remix")


def _vector_places(source: str, manifest: dict, seen: set) -> Iterator[str]:
    """Where `source`'s vectors may be, most likely first: a harvest's own folder; for a remix, where its records
    put them, as recorded (the remix moved alone; the only place a remix from before the relative records
    names), then relative to the remix (a harvest moved together with its remixes), then wherever its own
    source finds them, followed by the paths the remix recorded for it (a remix's source re-pointed at the
    harvest's new place, by rerunning that remix from there). A source on the way whose manifest is edited (its
    checksum broken) is refused in one line naming that manifest: its records cannot be followed, and the vectors
    they lead to would otherwise be reported missing."""
    from sentsim.harvest.pool_vectors import vectors_uri
    from storage import ShardStore, StoreError
    from storage.store import edited_manifest, manifest_seal_broken

    remixed = (manifest.get("config") or {}).get("remix")
    if not remixed:
        yield vectors_uri(source) if "://" in source else str(Path(vectors_uri(source)).resolve())
        return
    records = (manifest.get("remix") or {}, remixed)
    if not any(r.get("pool_vectors") for r in records):  # none is written so: its own folder is all there is
        yield from _vector_places(source, {}, seen)
    for rel, absolute in ((r.get("pool_vectors_relative"), r.get("pool_vectors")) for r in records):
        yield from _paths(source, rel, absolute)
    for rec in records:
        for src in _paths(source, rec.get("source_relative"), rec.get("source")):
            if src in seen:
                continue
            seen.add(src)
            try:
                m = ShardStore(src).read_manifest(trusted=False)
            except StoreError:
                continue
            broken = manifest_seal_broken(m) if m else None
            if broken:
                raise UsageError(edited_manifest(src, broken))
            if m and m.get("fingerprint") == rec.get("source_fingerprint"):
                yield from _vector_places(src, m, seen)


def _paths(remix: str, rel: Optional[str], given: Optional[str]) -> List[str]:
    """A remix's record of a path: as recorded (a path the user gave relative to their working directory then is
    read relative to the current one), then relative to the remix folder (when both are local). The recorded
    place first: where it still holds vectors of the recorded fingerprint they are the very ones the labels came
    from, where a copy beside a moved remix may have been scored in another precision."""
    out = [given if "://" in given else str(Path(given).resolve())] if given else []
    if rel and "://" not in remix:
        out.append(str((Path(remix) / rel).resolve()))
    return out


def _vectors_run(uri: str) -> tuple[Optional[dict], Optional[str]]:
    """A vectors run's manifest, and None when it is whole; else "missing" (no finished run there), or why not."""
    from storage import ShardStore, StoreError

    store = ShardStore(uri)
    try:
        m = store.read_manifest()
    except StoreError as exc:
        return None, f"its manifest cannot be read: {exc}"
    note = store.incomplete_note()
    if not m or not m.get("complete") or note:
        return m, note or "missing"
    return m, None


def relative_records(out: str, **paths: str) -> dict:
    """`paths` recorded relative to the remix folder `out` as well (`<name>_relative`), when both are local: a
    remix moved or copied together with its source finds it there."""
    if "://" in out:
        return {}
    here = Path(out).resolve()
    return {f"{k}_relative": os.path.relpath(Path(v).resolve(), here) for k, v in paths.items() if "://" not in v}


def check_pool_terms(cfg: RemixConfig, vectors: str) -> None:
    """check_terms for a pool harvest: a weighted term must have been scored in its vectors run."""
    from sentsim.harvest.pool_vectors import DIRS, VECTORS_TABLE
    from storage import RunReader

    reader = RunReader(vectors)
    first = reader.unit_table(min(reader.units()), VECTORS_TABLE)
    for t in TERMS:
        given = getattr(cfg, f"lambda_{t}")
        if not given:
            continue
        values = (first.column(t).combine_chunks().flatten().to_numpy(zero_copy_only=False) if t in DIRS
                  else np.array([np.nan]))
        if not np.isfinite(values.astype(np.float64)).any():
            raise _unscored(cfg, t, given, "a pool harvest has no discriminator")


def check_terms(cfg: RemixConfig, first_unit: dict) -> None:
    """A term given a weight must have been scored: a direction skipped by the source (its λ was 0,
    or ablated) or a discriminator it did not have is NaN throughout, and weighing it would do nothing."""
    cs = first_unit["context_scores"]
    for t in TERMS:
        given = getattr(cfg, f"lambda_{t}")
        values = cs.column(t).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls read as NaN
        if given and cs.num_rows and not np.isfinite(values).any():
            raise _unscored(cfg, t, given, "the harvest had no discriminator")


def _unscored(cfg: RemixConfig, term: str, given: float, no_disc: str) -> UsageError:
    """The refusal of a weight for a term the source never scored, with the reason that term can be missing."""
    why = no_disc if term == "disc" else "its λ was 0, or the ablation left it out"
    return UsageError(f"{cfg.source}: the {term} term was not scored there ({why}); lambda_{term}={given:g} cannot "
                      "weigh it in")


def resolve_variant(cfg: RemixConfig, manifest: dict) -> Optional[str]:
    """The Eq. 4 variant of a grouped source (None for an ungrouped one, where asking for one is refused)."""
    grouping = manifest.get("config", {}).get("grouping") or {}
    if not grouping.get("enabled"):
        if cfg.variant is not None:
            raise UsageError(f"{cfg.source}: --variant needs a grouped harvest (grouping.enabled), which this is not")
        return None
    return cfg.variant or grouping.get("score", "paper")


def remix_unit(tables: dict, lam: dict, metric: str, variant: Optional[str] = None) -> tuple[dict, dict]:
    """Recompute S and every pair's Eq. 4 row for one unit (eq4_rows.py; in a grouped harvest the three
    variants of each pair's group too, `variant` filling `score`); returns (tables, counts)."""
    cs, sent, pairs = tables["context_scores"], tables["sentences"], tables["pairs"]
    values = {t: cs.column(t).to_numpy(zero_copy_only=False).astype(np.float64) for t in TERMS}
    S = eq3_sum(values, dict.fromkeys(TERMS, True), lam)
    # S in the stored precision (float32, or float64 in older harvests); null where every term is (an item the
    # harvest left out, as it stored it)
    cs = cs.set_column(cs.schema.get_field_index("S"), "S",
                       pa.array(S, cs.schema.field("S").type, mask=~np.isfinite(S)))
    terms = UnitTerms(zip(cs.column("sentence_id").to_pylist(), cs.column("context_id").to_pylist()), S, values)
    # C_s of each sentence; None before context_ids, when pairs run over their shared contexts (approximate)
    own = (dict(zip(sent.column("sentence_id").to_pylist(), sent.column("context_ids").to_pylist()))
           if "context_ids" in sent.column_names else None)

    cols = pairs.to_pydict()
    scored = [i for i in range(len(cols["pair_id"]))
              if cols["score"][i] is not None or not has_no_contexts(cols["null_reason"][i])]
    # With C_s known every pair is rebuilt, as the harvest built it: a pair without contexts still
    # belongs to its group, whose sentences the centred variant averages over. Before context_ids,
    # such a pair keeps its row (its shared contexts are other pairs').
    todo = list(range(len(cols["pair_id"]))) if own is not None else scored
    shortfall = dict(zip(sent.column("sentence_id").to_pylist(), sent.column("shortfall").to_pylist()))
    grouped = variant is not None and own is not None
    try:
        rows = pair_rows([(cols["s1_id"][i], cols["s2_id"][i]) for i in todo], terms, metric, own, shortfall,
                         group_of=[cols["group_id"][i] for i in todo] if grouped else None,
                         variant=variant if grouped else "paper")
    except MissingTerm as exc:
        raise UsageError(f"pair {cols['pair_id'][todo[exc.pair]]}: a context of its C_s1 + C_s2 has no stored score; "
                         "the source harvest's shards do not match each other") from None
    for i, row in zip(todo, rows):
        for k, v in row.items():
            cols[k][i] = v
    counts = {"pairs": len(cols["pair_id"]), "null_scores": sum(x is None for x in cols["score"]),
              "approximate": len(scored) if own is None else 0, "rescored": len(scored)}
    out_pairs = pa.Table.from_pydict(cols, schema=pairs.schema)
    return {"pairs": out_pairs, "sentences": sent, "context_scores": cs}, counts


def remix_pool_unit(tables: dict, vectors, S: np.ndarray, metric: str, effect: Optional[np.ndarray]
                    ) -> tuple[dict, dict]:
    """A pool harvest's unit (pool.py): every pair's Eq. 4 row again, from the stored sentence vectors
    (`vectors`, pool_vectors.StoredVectors) and S over the pool recomputed under the remix's λ."""
    from sentsim.harvest.eq4_rows import vector_rows

    pairs = tables["pairs"]
    cols = pairs.to_pydict()
    missing = vectors.missing(set(cols["s1_id"]) | set(cols["s2_id"]))
    if missing:
        raise UsageError(f"sentence {missing[0]} of a pair has no stored vector ({len(missing)} such sentences); the "
                         "vectors run does not match the harvest: run `sentsim store verify` on it, then resume")
    idx = np.stack([vectors.rows(cols["s1_id"]), vectors.rows(cols["s2_id"])], axis=1)
    for i, row in enumerate(vector_rows(idx, S, vectors.terms, metric, effect)):
        for k, v in row.items():
            cols[k][i] = v
    counts = {"pairs": len(cols["pair_id"]), "null_scores": sum(x is None for x in cols["score"]),
              "approximate": 0, "rescored": len(cols["pair_id"])}
    return {"pairs": pa.Table.from_pydict(cols, schema=pairs.schema), "sentences": tables["sentences"]}, counts


def pool_remix_inputs(vectors_uri: str, lam: dict, metric: str) -> tuple:
    """A pool remix's stored vectors, and S and the context effect under its λ: computed once a run, shared by
    its actors (pipeline.Shared)."""
    from sentsim.harvest.pool_vectors import StoredVectors

    stored = StoredVectors(vectors_uri)
    # the stored S is the source's λ combined, which a remix recomputes and never reads: dropped here, it is
    # neither held beside the new S nor put in the object store with the terms (a quarter of the run)
    stored.S = None
    return (stored, *pool_scores(stored, lam, metric))


# the entries of each block pool_scores sums at once: its float64 temporaries are 8 MiB each, where the whole
# run's are 195 MiB each at 100K sentences x |P| = 256
_BLOCK_ENTRIES = 2**20


def pool_scores(vectors, lam: dict, metric: str, block_rows: Optional[int] = None
                ) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """S over the pool for every stored sentence under `lam` (Eq. 3, as the scorer combines its terms), and the
    context effect over all of them when `metric` reads one, `block_rows` rows of the run at a time: the driver
    holds the new S and one block's temporaries beside the stored terms, not float64 copies of the whole run.

    Each entry of S is the scorer's Eq. 3 sum (`eq3_sum`) in float64 from the stored float32 terms, and the
    effect is pool_context_effect's nanmean of S: the same values to the bit as computing them over the whole
    run at once (tests/harvest/test_pool_harvest.py)."""
    n, width = next(iter(vectors.terms.values())).shape
    step = block_rows or max(1, _BLOCK_ENTRIES // max(1, width))
    S = np.empty((n, width))
    means = _ColumnMeans(width) if metrics.get(metric).uses_context_effect else None
    for lo in range(0, n, step):
        block = S[lo:lo + step]
        # a term with no stored values (disc: a pool harvest scores none) is off, as NaN throughout would be
        block[...] = eq3_sum({t: m[lo:lo + step] for t, m in vectors.terms.items()},
                             {t: t in vectors.terms for t in TERMS}, lam)
        if means is not None:
            means.add(block)
    return S, None if means is None else means.result()


class _ColumnMeans:
    """pool_context_effect over S fed a block of rows at a time: each column's nanmean, summed in the order numpy
    sums the whole matrix's axis 0 (row after row), so that the mean is the same to the bit."""

    def __init__(self, width: int):
        self.total: Optional[np.ndarray] = None
        self.count = np.zeros(width, dtype=np.intp)

    def add(self, block: np.ndarray) -> None:
        nan = np.isnan(block)
        rows = np.where(nan, 0.0, block)
        self.count += (~nan).sum(axis=0)
        # the running total as the first row of this block's sum: one reduction, in row order, as over the whole
        self.total = rows.sum(axis=0) if self.total is None else np.concatenate([self.total[None], rows]).sum(axis=0)

    def result(self) -> np.ndarray:
        if self.total is None:  # no sentence: as nanmean of an empty column
            return np.full(len(self.count), np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):  # a context no sentence was scored in: NaN
            return self.total / self.count


# The columns remix reads or recomputes as numbers, by table: the first of each pair always, the second where the
# table has it. Each is checked before it is read (RunReader's numeric check), so a text column (a run edited, or
# written by another tool) is one line naming it, not a cast error part-way through the remix.
NUMERIC = {"pairs": (("s1_id", "s2_id", "score"),
                     ("gold", "n_ctx_s1", "n_ctx_s2", *(f"sim_{t}" for t in TERMS),
                      *(f"score_{v}" for v in ("paper", "union", "centred")))),
           "sentences": (("sentence_id",), ()),
           "context_scores": (("sentence_id", "context_id", *TERMS, "S"), ())}


def numeric_columns(table: str, schema: pa.Schema) -> List[str]:
    """The columns of `table` (of this `schema`) that remix takes as numbers."""
    always, if_there = NUMERIC[table]
    return [*always, *(c for c in if_there if c in schema.names)]


def check_numbers(reader, units: dict, pooled: bool = False) -> None:
    """Each table remix reads holds numbers where it takes numbers: the table's first file, as RunReader.read_table
    checks before reading, then every unit's own file (its Parquet footer alone), so that a unit that differs is
    refused before any unit is remixed, not after the units before it are written."""
    for table in _tables_read(pooled):
        reader.check_columns(table, None, numeric=numeric_columns(table, reader.schema(table)))
    for u in sorted(units):
        for table in _tables_read(pooled):
            _has_shard(reader, units[u], table)
            _check_unit_numbers(reader.uri, u, table, reader.unit_schema(u, table))


def _tables_read(pooled: bool) -> tuple:
    return ("pairs", "sentences") + (() if pooled else ("context_scores",))


def _read_unit(reader, record, pooled: bool = False) -> dict:
    """The unit's tables (pairs, sentences and, but in a pool harvest, context_scores), from its own shards or
    its slice of the compacted files (`reader`: a RunReader), each with numbers where remix takes numbers."""
    out = {}
    for table in _tables_read(pooled):
        _has_shard(reader, record, table)
        out[table] = reader.unit_table(record.unit, table)
        _check_unit_numbers(reader.uri, record.unit, table, out[table].schema)
    return out


def _has_shard(reader, record, table: str) -> None:
    if record.files.get(table) is None:
        raise UsageError(f"{reader.uri}: unit {record.unit} has no {table} shard; not a harvest with context scores")


def _check_unit_numbers(uri: str, unit: int, table: str, schema: pa.Schema) -> None:
    """One unit's own check of what check_numbers checked on the table's first file, as RunReader checks each file
    it reads: a unit whose table lacks a column or holds text there is named (by check_numbers before anything is
    written, and by `_read_unit` as it reads the unit)."""
    missing = [c for c in numeric_columns(table, schema) if c not in schema.names]
    if missing:
        raise UsageError(f"{uri}: unit {unit}'s {table} has no column(s) {', '.join(missing)} "
                         f"(its columns: {', '.join(schema.names)})")
    text = next((f for f in map(schema.field, numeric_columns(table, schema))
                 if not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))), None)
    if text is not None:
        raise UsageError(f"{uri}: unit {unit}'s {table} column {text.name} holds {text.type}, not numbers")


def _gold_spearman(root: str) -> tuple[float, int] | str:
    """Spearman x 100 of score vs gold over a run's pairs, when it has gold labels (a --pairs harvest), and the
    pairs it is over; else why there is none."""
    from scipy.stats import spearmanr

    from storage import RunReader

    # marked units only; a text column is one line (RunReader), not a failed rank of strings
    t = RunReader(root).read_table("pairs", ["score", "gold"], numeric=["score", "gold"]).to_pandas()
    if t.gold.isna().all():
        return "the pairs file gave no gold scores"
    t = t.dropna()
    if len(t) < 2:
        return f"{len(t)} pair(s) have both a score and a gold value"
    if t.score.nunique() < 2 or t.gold.nunique() < 2:  # a constant column ranks nothing: no value
        return f"{'the scores' if t.score.nunique() < 2 else 'the gold values'} are the same for every pair"
    return float(spearmanr(t.score, t.gold).statistic * 100), len(t)


def _checked_units(reader) -> dict:
    """The source's units, each checked against its checksums (a compacted file once, for all its
    units); read-only (a bad unit is an error here, where the harvest itself would quietly redo it)."""
    from storage.store import UnitRecord

    # resuming the harvest redoes a bad unit, compacted or not (a broken compacted file is withdrawn first)
    fix = "run `sentsim store verify` and resume the harvest"
    units = {}
    for u, rec in reader.units().items():  # this run's markers, within its planned units
        problem = reader.check_unit(u)
        if problem:
            raise UsageError(f"{reader.uri}: {problem}; {fix}")
        units[u] = UnitRecord(unit=u, files=rec["files"], extra=rec.get("extra", {}))
    return units


class RemixStage(Stage):
    """Reads one source unit, recomputes it (`remix_unit`) and writes it to the remix run."""

    name = "remix"

    def __init__(self, source: str, out: str, fp: str, lam: dict, metric: str, variant: Optional[str] = None,
                 vectors: Optional[Shared] = None):
        self.source, self.out, self.fp, self.lam, self.metric = source, out, fp, lam, metric
        self.variant, self.vectors = variant, vectors  # vectors: a pool harvest's (pool_remix_inputs)
        self.reader = None

    def setup(self) -> None:
        from storage import RunReader

        # one reader per actor: it keeps the compacted file the next units are sliced from
        self.reader = RunReader(self.source)
        if self.vectors:
            self.stored, self.S, self.effect = self.vectors.get()

    def process(self, items: List[dict]) -> List[dict]:
        from storage import ShardStore

        if self.reader is None:
            self.setup()
        dst = ShardStore(self.out)
        out = []
        for item in items:
            if self.vectors:
                tables, counts = remix_pool_unit(_read_unit(self.reader, item["record"], pooled=True), self.stored,
                                                 self.S, self.metric, self.effect)
            else:
                tables, counts = remix_unit(_read_unit(self.reader, item["record"]), self.lam, self.metric,
                                            self.variant)
            dst.write_unit(item["unit"], tables, self.fp, counts)
            out.append({"unit": item["unit"], **counts})
        return out


def remix(cfg: RemixConfig, force_new: bool = False, quiet: bool = False, executor: str = "inline",
          address: Optional[str] = None, max_units: Optional[int] = None) -> dict:
    """Seconds of arithmetic per unit: in-process by default, where starting Ray would cost more."""
    return execute(RemixRun(cfg), executor=executor, address=address, force_new=force_new, quiet=quiet,
                   max_units=max_units)


class RemixRun(ShardedJob):
    """One remix, resolved before anything is written: its source checked (a finished harvest with context
    scores, every unit whole), its λ, metric and variant fixed; a unit per source unit, each read, recomputed
    and written by a `RemixStage`."""

    stage = STAGE
    count = "pairs"
    deep = True
    # where the source and its vectors were found: outside the fingerprint (a remix rerun from its source's new
    # place is the same run), so a refused resume does not list them as causes
    unfingerprinted = ("out", "resources", "inputs.0.harvest",
                       *(f"remix.{k}" for k in ("source", "source_relative", "pool_vectors", "pool_vectors_relative")))

    def __init__(self, cfg: RemixConfig):
        from sentsim.harvest.stages import context_score_schema_of, sentence_schema_of
        from storage import RunReader, ShardStore

        check_out(cfg.out, {"HARVEST": cfg.source}, writes="run")
        if "://" not in cfg.source and not Path(cfg.source).is_dir():
            raise UsageError(f"{cfg.source}: no such harvest directory")
        src = ShardStore(cfg.source)
        manifest = src.read_manifest()
        if not manifest and src.lost_manifest():
            from storage.store import LOST_MANIFEST

            raise UsageError(f"{cfg.source}: {LOST_MANIFEST}")
        if not manifest or manifest.get("stage") not in ("harvest", STAGE):
            from storage.store import part_of_run_refusal

            refusal = part_of_run_refusal(cfg.source, cfg.source) if manifest else None
            if refusal is not None:
                raise UsageError(refusal)
            if manifest:  # another job's run: say which, as the trainers and eval sts --scores do
                raise UsageError(f"{cfg.source}: not a harvest run but a {manifest.get('stage')!r} run; give the "
                                 "--out of `sentsim harvest` (or `sentsim remix`)")
            raise UsageError(f"{cfg.source}: not a harvest run (no manifest.json of stage 'harvest')")
        if not manifest.get("complete"):
            raise UsageError(f"{src.incomplete_note() or cfg.source + ' is not complete'}; resume the harvest "
                             "first, so that the remix covers every unit")
        pooled = pool_vectors_of(cfg.source, manifest)
        self.vectors, self.vectors_fp = pooled if pooled is not None else (None, None)
        if self.vectors is None and context_score_schema_of(manifest) is None:
            raise UsageError(f"{cfg.source}: this harvest kept no context scores (keep_context_scores=none), so "
                             "there is nothing to remix; harvest again with keep_context_scores=all")
        lam, metric = resolve(cfg, manifest, pooled=self.vectors is not None)
        # C_s re-ranked by Eq. 3 (harvest/rerank.py) was chosen under the harvest's λ, and a remix cannot choose
        # it again: the partner's terms in the contexts it would now pick were never scored. A remix records those
        # λ (`c_s_weights`), as its own config's scoring holds its own, so that a remix of it compares with them.
        config = manifest.get("config") or {}
        shortlist = (config.get("contexts") or {}).get("rerank_shortlist") or 0
        chosen_under = ((config.get("remix") or {}).get("c_s_weights")
                        or (weights(RemixConfig(source=cfg.source, out=cfg.out), manifest) if shortlist else None))
        self.kept_eq3_shortlist = shortlist if shortlist and lam != chosen_under else 0
        reader = RunReader(cfg.source)
        units = _checked_units(reader)
        planned = manifest.get("planned_units") or len(units)
        if len(units) != planned:
            raise UsageError(f"{cfg.source}: {planned - len(units)} of {planned} unit(s) have no completion marker")
        if units:
            check_numbers(reader, units, pooled=self.vectors is not None)
        if self.vectors is not None:
            check_pool_terms(cfg, self.vectors)
        elif units:
            check_terms(cfg, _read_unit(reader, units[min(units)]))
        del reader  # each stage opens its own; the compacted files read here need not stay in memory

        self.cfg, self.out, self.source = cfg, cfg.out, manifest
        self.lam, self.metric, self.source_units = lam, metric, units
        self.variant = resolve_variant(cfg, manifest)
        self.schemas = {"sentences": sentence_schema_of(manifest),
                        "context_scores": context_score_schema_of(manifest)}  # the source's precision
        self.settings = {"source": cfg.source, "source_fingerprint": manifest["fingerprint"], "weights": lam,
                         "metric": metric, **({"variant": self.variant} if self.variant is not None else {}),
                         **({"c_s_weights": chosen_under} if shortlist else {}),
                         **({"pool_vectors": self.vectors, "pool_vectors_fingerprint": self.vectors_fp,
                             # a remix of this remix finds them, and its source, after both are moved together
                             **relative_records(cfg.out, source=cfg.source, pool_vectors=self.vectors)}
                            if self.vectors is not None else {})}
        if self.vectors is not None:  # a pool harvest keeps its vectors, not context scores
            self.schemas.pop("context_scores")

    @property
    def units(self) -> List[dict]:
        return [{"unit": u, "record": self.source_units[u]} for u in sorted(self.source_units)]

    def fingerprint_parts(self) -> tuple:
        return ((STAGE, self.source["fingerprint"], self.lam, self.metric) + ((self.variant,) if self.variant else ())
                + ((self.vectors_fp,) if self.vectors_fp else ()))

    def config(self) -> dict:
        """The source's config (training and eval read it), the remix's settings on top."""
        config = dict(self.source.get("config", {}), remix=self.settings, metric=self.metric)
        config["scoring"] = dict(config.get("scoring", {}), **{f"lambda_{t}": self.lam[t] for t in TERMS})
        return config

    def open_extra(self) -> dict:
        """A remix is opened in its source's run format: it holds its source's config and table schemas."""
        from storage.store import FORMAT_VERSION, run_format

        return {"format_version": min(run_format(self.source), FORMAT_VERSION)}

    def inputs(self) -> List[dict]:
        return [{"harvest": self.cfg.source, "fingerprint": self.source["fingerprint"]}]

    def tables(self) -> dict:
        from sentsim.harvest.stages import pair_schema

        return {"pairs": pair_schema(self.variant is not None), **self.schemas}

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        cfg = self.cfg
        return [StageSpec(RemixStage, Resources.of(cfg.resources), args=dict(
            source=cfg.source, out=cfg.out, fp=ctx.fp, lam=self.lam, metric=self.metric, variant=self.variant,
            vectors=Shared(functools.partial(pool_remix_inputs, self.vectors, self.lam, self.metric))
            if self.vectors else None))]

    def summary(self, ctx: RunContext) -> dict:
        from sentsim.harvest.job import all_null_refusal
        from storage import ShardStore

        cfg, units = self.cfg, self.source_units
        refusal = all_null_refusal(ctx.store, ctx.fp, len(units), check="the --lambda-* weights")
        if refusal:
            raise UsageError(refusal)
        totals = dict.fromkeys(("pairs", "null_scores", "approximate", "rescored"), 0)
        for u, m in ctx.store.markers().items():
            if u in units and m.get("fingerprint") == ctx.fp:
                for k in totals:
                    totals[k] += int(m.get("extra", {}).get(k, 0))
        written = ctx.store.side_records()
        src = ShardStore(cfg.source)
        from sentsim.harvest.pool import EFFECT_TABLE

        for name in src.side_records():  # rank_anchors: students read the anchors from the run
            if name == EFFECT_TABLE:  # the source's λ and metric's: a pool remix recomputes its own
                continue
            if name not in written:
                ctx.store.write_side_table(name, src.read_side_table(name), ctx.fp)
        out = dict(self.settings, **totals)
        if self.kept_eq3_shortlist:
            out["c_s_chosen_under_source_weights"] = self.kept_eq3_shortlist
        pairs_run = bool((self.source.get("config") or {}).get("pairs_file"))
        for label, root in (("source", cfg.source), ("remix", cfg.out)):
            if not pairs_run:  # a corpus harvest has no gold column
                continue
            g = _gold_spearman(root) if "://" not in root else "not read back from object storage"
            if isinstance(g, tuple):
                out[f"{label}_spearman_vs_gold"], out[f"{label}_gold_pairs"] = round(g[0], 2), g[1]
                out["gold_pairs"] = g[1]  # the remix's where it has a value (bench/lambda_mix.py reads it)
            else:
                out[f"{label}_no_gold_spearman"] = g
        # A remix rerun from its source's new place resumes (the places are outside its fingerprint), and a resumed
        # run keeps the manifest it was opened with: its config.remix and inputs are rewritten to the places read
        # this time, as the top-level record is, so that whatever reads the manifest (a remix of this remix among
        # them) finds the source where it is now.
        config = dict(ctx.manifest.get("config") or self.config(), remix=self.settings)
        return {"remix": out, "config": config, "inputs": self.inputs()}
