"""Ingestion in work units: the inputs' identity (their sha256: storage.fs.input_sha256), their cut
into units of whole documents, and one unit's sentence and chunk tables. Running units (Ray, resume,
the shard store) is the job's part, in `sentsim.corpus_job`; this module imports from sentsim only
the config kernel.
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from corpus.config import CorpusConfig
from corpus.documents import BadDocument, UnitResult, ingest_document
from corpus.readers import RawRecord, iter_records
from sentsim.errors import InputError
from storage.fs import input_sha256


def describe_inputs(paths: Sequence[str]) -> List[dict]:
    """Name, size and sha256 of each input: part of the fingerprint, so edited inputs are noticed."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            raise InputError(f"{p}: is a folder, not a file; pass the files inside it "
                             f"(e.g. {p.rstrip('/')}/*.jsonl.gz)")
        if not os.path.isfile(p):
            raise InputError(f"{p}: no such file")
        out.append({"path": os.path.abspath(p), "name": os.path.basename(p), "bytes": os.path.getsize(p),
                    "sha256": input_sha256(p)})
    return out


def plan_units(paths: Sequence[str], cfg: CorpusConfig) -> Iterator[dict]:
    """Yield {unit, first_key, records} in input order; cut on docs_per_unit or unit_bytes.
    Units and document keys depend only on the inputs and the config, so a re-run cuts the same."""
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
                yield {"unit": unit, "first_key": first_key, "records": batch}
                unit, batch, size = unit + 1, [], 0
    if batch:
        yield {"unit": unit, "first_key": first_key, "records": batch}


def ingest_unit(first_key: int, records: List[RawRecord], cfg: CorpusConfig
                ) -> Tuple[Optional[str], Dict[str, pa.Table], dict]:
    """(error, tables, counts) of one unit. error is the first bad record when on_error=fail."""
    res = UnitResult()
    for offset, rec in enumerate(records):
        try:
            ingest_document(res, rec, first_key + offset, cfg)
        except BadDocument as exc:
            where = f"{rec.source}:{rec.line}"
            if cfg.on_error == "fail":
                return f"{where}: {exc}", {}, {}
            res.skipped.append({"file": rec.source, "line": rec.line, "reason": str(exc)})
    sentences, chunks = res.tables()
    extra = {
        "documents": res.documents,
        "truncated_sentences": res.truncated_sentences,
        "empty_paragraphs": res.empty_paragraphs,
        "skipped": res.skipped,
    }
    return None, {"sentences": sentences, "chunks": chunks}, extra
