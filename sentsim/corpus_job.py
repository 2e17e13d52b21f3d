"""`sentsim corpus build`: documents -> sentences/ and chunks/ shards, through the one executor.

The driver streams the inputs once, cutting them into units of whole documents
(`corpus.units.plan_units`); an actor pool of `IngestStage`s splits each unit and writes its two
shards and its completion marker. Units already complete (checked by checksum) are skipped, so a
killed build re-run finishes only what is missing, with the same ids, because units and ids
depend only on the inputs and config. At most `max_in_flight` units are held by the driver and
sent to Ray at once.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence

from pydantic import Field

from corpus.config import CorpusConfig
from corpus.documents import CHUNK_SCHEMA, SENTENCE_SCHEMA
from corpus.units import describe_inputs, ingest_unit, plan_units
from sentsim.config import load_config
from sentsim.errors import InputError, UsageError
from sentsim.executor import EXECUTORS, RunContext, ShardedJob, execute
from sentsim.out_paths import check_out
from sentsim.pipeline import Resources, Stage, StageResources, StageSpec

STAGE = "corpus"
MAX_SKIPPED_LISTED = 1000


class CorpusJobConfig(CorpusConfig):
    """The ingestion config plus where it runs; `resources` is no part of the fingerprint."""

    # 1 CPU per ingest actor, as many actors as the cluster fits: splitting is CPU-bound Python.
    resources: StageResources = Field(StageResources(num_cpus=1.0, max_actors=None),
                                      description="the ingest actors' resources")

    def semantic(self) -> dict:
        d = super().semantic()
        d.pop("resources")
        return d


class IngestStage(Stage):
    name = "ingest"

    def __init__(self, out: str, fp: str, cfg: CorpusConfig):
        self.out, self.fp, self.cfg = out, fp, cfg

    def process(self, items: List[dict]) -> List[dict]:
        from storage.store import ShardStore

        out = []
        for item in items:
            error, tables, extra = ingest_unit(item["first_key"], item["records"], self.cfg)
            if error:
                out.append({"unit": item["unit"], "error": error, "sentences": 0, "chunks": 0})
                continue
            ShardStore(self.out).write_unit(item["unit"], tables, self.fp, extra)
            out.append({"unit": item["unit"], "error": None, "sentences": tables["sentences"].num_rows,
                        "chunks": tables["chunks"].num_rows})
        return out


def build_corpus(
    inputs: Sequence[str],
    out: str,
    config: Optional[CorpusConfig] = None,
    overrides: Sequence[str] = (),
    config_path: Optional[str] = None,
    executor: str = "ray",
    force_new: bool = False,
    address: Optional[str] = None,
    quiet: bool = False,
    max_units: Optional[int] = None,
) -> dict:
    """Build (or resume) a corpus run at `out`. Returns the final manifest.

    executor="ray" runs an actor pool of ingest actors; "inline" runs the units in this process.
    """
    if not inputs:
        raise UsageError("no input files given")
    check_out(out, {"INPUT": list(inputs)}, writes="run")
    if config is not None and not isinstance(config, CorpusJobConfig):
        config = CorpusJobConfig.model_validate(config.model_dump())
    job = CorpusRun(inputs, out, config or load_config(CorpusJobConfig, config_path, overrides), executor, address)
    return execute(job, executor=executor, address=address, force_new=force_new, quiet=quiet,
                   max_units=max_units)


class CorpusRun(ShardedJob):
    """One corpus build (its inputs checked against `out` by `build_corpus`): its inputs described (name,
    size, sha256), their documents streamed into units while the build runs. A unit that fails to ingest
    (on_error=fail) stops the build, and the lowest such unit's error is the run's."""

    stage = STAGE
    count = "sentences"
    deep = True

    def __init__(self, inputs: Sequence[str], out: str, cfg: CorpusJobConfig, executor: str = "ray",
                 address: Optional[str] = None):
        self.paths, self.out, self.cfg = list(inputs), out, cfg
        self.input_meta = describe_inputs(self.paths)
        self.first_error: Optional[tuple] = None  # (unit, message) of the lowest failed unit
        self.window = self._window(executor, address)

    def _window(self, executor: str, address: Optional[str]) -> int:
        """Units the driver holds and sends to Ray at once: `max_in_flight`, else 4 per cluster CPU (16 or more)."""
        if executor not in EXECUTORS:
            raise UsageError(f"unknown executor {executor!r} (ray or inline)")
        if self.cfg.max_in_flight or executor != "ray":
            return self.cfg.max_in_flight or 1
        from sentsim.runtime import cluster_cpus, init_ray

        init_ray(address)
        return max(16, 4 * cluster_cpus())

    @property
    def units(self) -> Iterator[dict]:
        return plan_units(self.paths, self.cfg)

    def fingerprint_parts(self) -> tuple:
        # where the inputs live is not fingerprinted, only what they hold, in which order, and their names
        # (corpus.units.input_names), which the ids of their documents hold: the folders that tell apart two
        # inputs of one file name are part of those names, so a run whose ids named its inputs otherwise (by
        # file name alone) is another run, never resumed into one whose ids mix the two namings
        return (STAGE, self.cfg.semantic(), [(i["name"], i["bytes"], i["sha256"]) for i in self.input_meta])

    def config(self) -> dict:
        return self.cfg.model_dump()

    def inputs(self) -> List[dict]:
        return self.input_meta

    def tables(self) -> dict:
        return {"sentences": SENTENCE_SCHEMA, "chunks": CHUNK_SCHEMA}

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        return [StageSpec(IngestStage, Resources.of(self.cfg.resources), args=dict(out=self.out, fp=ctx.fp,
                                                                                   cfg=self.cfg))]

    def on_result(self, result: dict) -> bool:
        if result["error"] and (self.first_error is None or result["unit"] < self.first_error[0]):
            self.first_error = (result["unit"], result["error"])
        return self.first_error is not None

    def detail(self, result: dict) -> str:
        return f"{result['chunks']:,} chunks" if not result["error"] else "bad document"

    def summary(self, ctx: RunContext) -> dict:
        if self.first_error:
            raise InputError(self.first_error[1] + " (use --on-error skip to skip such documents and count them)")
        s = summarise(ctx.store, ctx.planned)
        if s["counts"]["documents"] == 0:  # never a complete corpus of nothing
            raise InputError(f"no document could be ingested from {', '.join(self.paths)} "
                             f"({s['skipped_documents']['count']} skipped as bad); the run is not marked complete")
        return s


def summarise(store, planned: int) -> dict:
    markers = store.markers()
    totals = {"documents": 0, "sentences": 0, "chunks": 0, "truncated_sentences": 0, "empty_paragraphs": 0}
    skipped: List[dict] = []
    n_skipped = 0
    for unit in range(planned):
        rec = markers.get(unit)
        if rec is None:
            continue
        ex = rec.get("extra", {})
        totals["documents"] += ex.get("documents", 0)
        totals["truncated_sentences"] += ex.get("truncated_sentences", 0)
        totals["empty_paragraphs"] += ex.get("empty_paragraphs", 0)
        totals["sentences"] += rec["files"]["sentences"]["rows"]
        totals["chunks"] += rec["files"]["chunks"]["rows"]
        n_skipped += len(ex.get("skipped", []))
        skipped.extend(ex.get("skipped", [])[: max(0, MAX_SKIPPED_LISTED - len(skipped))])
    return {"counts": totals, "skipped_documents": {"count": n_skipped, "listed": skipped}}
