"""`sentsim corpus build`: documents -> sentences/ and chunks/ shards, one Ray task per work unit.

The driver streams the inputs once, cutting them into units of whole documents. Each unit is
shipped to a Ray task that splits, writes its two shards and its completion marker. Units that
are already complete (checked by checksum) are skipped, so a killed build re-run finishes only
what is missing, with the same ids, because units and ids depend only on the inputs and config.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from corpus.config import CorpusConfig
from corpus.documents import CHUNK_SCHEMA, SENTENCE_SCHEMA, BadDocument, UnitResult, ingest_document
from corpus.readers import RawRecord, iter_records
from sentsim.config import fingerprint, load_config
from sentsim.errors import InputError, UsageError
from storage.store import ShardStore

STAGE = "corpus"
MAX_SKIPPED_LISTED = 1000


def describe_inputs(paths: Sequence[str]) -> List[dict]:
    """Name, size and sha256 of each input: part of the fingerprint, so edited inputs are noticed."""
    out = []
    for p in paths:
        if not os.path.isfile(p):
            raise InputError(f"{p}: no such file")
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        out.append({"path": os.path.abspath(p), "name": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": h.hexdigest()})
    return out


def plan_units(paths: Sequence[str], cfg: CorpusConfig) -> Iterator[Tuple[int, int, List[RawRecord]]]:
    """Yield (unit, first doc_key, records) in input order; cut on docs_per_unit or unit_bytes."""
    unit, doc_key, first_key = 0, 0, 0
    batch: List[RawRecord] = []
    size = 0
    for path in paths:
        for rec in iter_records(path, cfg.text_column, cfg.id_column):
            if not batch:
                first_key = doc_key
            batch.append(rec)
            size += rec.size()
            doc_key += 1
            if len(batch) >= cfg.docs_per_unit or size >= cfg.unit_bytes:
                yield unit, first_key, batch
                unit, batch, size = unit + 1, [], 0
    if batch:
        yield unit, first_key, batch


def process_unit(store_uri: str, fp: str, unit: int, first_key: int, records: List[RawRecord], cfg_json: dict) -> dict:
    """Ingest one unit and write it. Returns counts, or the first bad record when on_error=fail."""
    cfg = CorpusConfig.model_validate(cfg_json)
    res = UnitResult()
    for offset, rec in enumerate(records):
        try:
            ingest_document(res, rec, first_key + offset, cfg)
        except BadDocument as exc:
            where = f"{rec.source}:{rec.line}"
            if cfg.on_error == "fail":
                return {"unit": unit, "error": f"{where}: {exc}"}
            res.skipped.append({"file": rec.source, "line": rec.line, "reason": str(exc)})
    sentences, chunks = res.tables()
    extra = {
        "documents": res.documents,
        "truncated_sentences": res.truncated_sentences,
        "empty_paragraphs": res.empty_paragraphs,
        "skipped": res.skipped,
    }
    ShardStore(store_uri).write_unit(unit, {"sentences": sentences, "chunks": chunks}, fp, extra)
    return {"unit": unit, "error": None, "sentences": sentences.num_rows, "chunks": chunks.num_rows}


class _Progress:
    def __init__(self, stream=sys.stderr):
        self.t0 = time.time()
        self.sentences = 0
        self.units = 0
        self.stream = stream

    def update(self, result: dict, skipped_units: int) -> None:
        self.units += 1
        self.sentences += result.get("sentences", 0)
        rate = self.sentences / max(time.time() - self.t0, 1e-9)
        print(
            f"[corpus] unit {result['unit']:05d} done | {self.units} written, {skipped_units} already complete "
            f"| {self.sentences:,} sentences | {rate:,.0f} sent/s",
            file=self.stream,
            flush=True,
        )


def _run_units(
    units: Iterator[Tuple[int, int, List[RawRecord]]],
    done: Dict[int, object],
    submit: Callable,
    collect: Callable,
    max_in_flight: int,
    progress: _Progress,
) -> Tuple[int, Optional[str]]:
    """Feed pending units to `submit`, at most `max_in_flight` at a time. Returns (planned, first error)."""
    planned = 0
    first_error: Optional[Tuple[int, str]] = None
    in_flight: list = []
    for unit, first_key, records in units:
        planned = unit + 1
        if unit in done:
            continue
        if first_error is not None:
            continue  # keep planning so the count is right, but stop starting work
        in_flight.append(submit(unit, first_key, records))
        while len(in_flight) >= max_in_flight:
            in_flight, results = collect(in_flight, block_for_one=True)
            for r in results:
                first_error = _note(r, first_error, progress, len(done))
    while in_flight:
        in_flight, results = collect(in_flight, block_for_one=True)
        for r in results:
            first_error = _note(r, first_error, progress, len(done))
    return planned, (first_error[1] if first_error else None)


def _note(r: dict, first_error, progress: _Progress, n_done: int):
    if r["error"]:
        if first_error is None or r["unit"] < first_error[0]:
            return (r["unit"], r["error"])
        return first_error
    progress.update(r, n_done)
    return first_error


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
) -> dict:
    """Build (or resume) a corpus run at `out`. Returns the final manifest.

    executor="ray" runs one Ray task per unit; "inline" runs them in this process (tests, debugging).
    """
    if not inputs:
        raise UsageError("no input files given")
    cfg = config or load_config(CorpusConfig, config_path, overrides)
    input_meta = describe_inputs(inputs)
    # The fingerprint ignores where inputs live, only what they contain and in which order.
    fp = fingerprint(STAGE, cfg.semantic(), [(i["name"], i["bytes"], i["sha256"]) for i in input_meta])
    store = ShardStore(out)
    store.open_run(
        STAGE, fp, cfg.model_dump(), input_meta, {"sentences": SENTENCE_SCHEMA, "chunks": CHUNK_SCHEMA}, force_new=force_new
    )
    done = store.completed_units(fp, deep=True)
    for unit, reason in sorted(getattr(store, "redo_reasons", {}).items()):
        print(f"[corpus] unit {unit:05d} will be redone: {reason}", file=sys.stderr)
    progress = _Progress(stream=open(os.devnull, "w") if quiet else sys.stderr)
    cfg_json = cfg.model_dump()

    if executor == "inline":
        def submit(unit, first_key, records):
            return process_unit(out, fp, unit, first_key, records, cfg_json)

        def collect(in_flight, block_for_one):
            return [], list(in_flight)

        max_in_flight = 1
    elif executor == "ray":
        import ray

        from sentsim.runtime import cluster_cpus, init_ray

        init_ray(address)
        remote = ray.remote(num_cpus=1, max_retries=3)(process_unit)

        def submit(unit, first_key, records):
            return remote.remote(out, fp, unit, first_key, records, cfg_json)

        def collect(in_flight, block_for_one):
            ready, rest = ray.wait(in_flight, num_returns=1)
            return rest, ray.get(ready)

        max_in_flight = cfg.max_in_flight or 2 * cluster_cpus()
    else:
        raise UsageError(f"unknown executor {executor!r} (ray or inline)")

    planned, error = _run_units(plan_units(inputs, cfg), done, submit, collect, max_in_flight, progress)
    if error:
        raise InputError(error + " (use --on-error skip to skip such documents and count them)")
    return summarise(store, planned)


def summarise(store: ShardStore, planned: int) -> dict:
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
    return store.finalize(planned, {"counts": totals, "skipped_documents": {"count": n_skipped, "listed": skipped}})
