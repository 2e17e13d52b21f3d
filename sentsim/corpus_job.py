"""`sentsim corpus build`: documents -> sentences/ and chunks/ shards, through the one executor.

The driver streams the inputs once, cutting them into units of whole documents
(`corpus.units.plan_units`); an actor pool of `IngestStage`s splits each unit and writes its two
shards and its completion marker. Units already complete (checked by checksum) are skipped, so a
killed build re-run finishes only what is missing, with the same ids, because units and ids
depend only on the inputs and config. At most `max_in_flight` units are held by the driver and
sent to Ray at once.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from pydantic import Field

from corpus.config import CorpusConfig
from corpus.documents import CHUNK_SCHEMA, SENTENCE_SCHEMA
from corpus.units import describe_inputs, ingest_unit, plan_units
from sentsim.config import load_config
from sentsim.errors import InputError, UsageError
from sentsim.executor import ShardedJob, execute
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
    check_out(out, {"INPUT": list(inputs)})
    if config is not None and not isinstance(config, CorpusJobConfig):
        config = CorpusJobConfig.model_validate(config.model_dump())
    cfg = config or load_config(CorpusJobConfig, config_path, overrides)
    input_meta = describe_inputs(inputs)
    first_error: list = []  # (unit, message) of the lowest failed unit

    def on_result(r: dict) -> bool:
        if r["error"] and (not first_error or r["unit"] < first_error[0][0]):
            first_error[:] = [(r["unit"], r["error"])]
        return bool(first_error)

    def window() -> int:
        if cfg.max_in_flight or executor != "ray":
            return cfg.max_in_flight or 1
        from sentsim.runtime import cluster_cpus, init_ray

        init_ray(address)
        return max(16, 4 * cluster_cpus())

    def summary(ctx) -> dict:
        if first_error:
            raise InputError(first_error[0][1] + " (use --on-error skip to skip such documents and count them)")
        s = summarise(ctx.store, ctx.planned)
        if s["counts"]["documents"] == 0:  # never a complete corpus of nothing
            raise InputError(f"no document could be ingested from {', '.join(inputs)} "
                             f"({s['skipped_documents']['count']} skipped as bad); the run is not marked complete")
        return s

    job = ShardedJob(
        # The fingerprint ignores where inputs live, only what they contain and in which order.
        stage=STAGE, out=out,
        fingerprint_parts=(STAGE, cfg.semantic(), [(i["name"], i["bytes"], i["sha256"]) for i in input_meta]),
        config=cfg.model_dump(), inputs=input_meta, tables={"sentences": SENTENCE_SCHEMA, "chunks": CHUNK_SCHEMA},
        units=plan_units(inputs, cfg),
        stages=lambda ctx: [StageSpec(IngestStage, Resources.of(cfg.resources),
                                      args=dict(out=out, fp=ctx.fp, cfg=cfg))],
        summary=summary, on_result=on_result, count="sentences", deep=True,
        detail=lambda r: f"{r['chunks']:,} chunks" if not r["error"] else "bad document",
        window=None)
    if executor not in ("ray", "inline"):
        raise UsageError(f"unknown executor {executor!r} (ray or inline)")
    job.window = window()
    return execute(job, executor=executor, address=address, force_new=force_new, quiet=quiet,
                   max_units=max_units)


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
