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


def input_names(paths: Sequence[str]) -> List[str]:
    """What each input's documents and records are named by (a document without an id of its own is
    `<name>:<line>`): its file name, unless another input has that file name too; then the shortest
    trailing part of its absolute path that no other input of that file name ends with (`a/x.txt` and
    `b/x.txt`), so that no two inputs of one build name their documents alike. An input whose path
    ends another's (`/x.txt` beside `/a/x.txt`) is named by its absolute path."""
    split = [[part for part in os.path.abspath(p).split(os.sep) if part] for p in paths]
    by_name: Dict[str, List[int]] = {}
    for i, parts in enumerate(split):
        by_name.setdefault(parts[-1] if parts else "", []).append(i)
    names = [os.path.basename(p) for p in paths]
    for group in by_name.values():
        others = {tuple(split[i]) for i in group}
        if len(others) < 2:  # a file name no other input has (or the same path given again)
            continue
        for i in group:
            mine = split[i]
            names[i] = os.path.abspath(paths[i])
            for k in range(2, len(mine) + 1):
                if sum(tuple(o[-k:]) == tuple(mine[-k:]) for o in others) == 1:
                    names[i] = "/".join(mine[-k:])
                    break
    return names


def describe_inputs(paths: Sequence[str]) -> List[dict]:
    """Name (`input_names`), size and sha256 of each input: part of the fingerprint, so edited inputs
    are noticed, and so are renamed ones whose name their documents' ids hold. A file given twice is
    refused: its documents would be ingested twice."""
    seen: Dict[Tuple[int, int], int] = {}
    for i, p in enumerate(paths):
        if os.path.isdir(p):
            raise InputError(f"{p}: is a folder, not a file; pass the files inside it "
                             f"(e.g. {p.rstrip('/')}/*.jsonl.gz)")
        if not os.path.isfile(p):
            raise InputError(f"{p}: no such file")
        st = os.stat(p)
        first = seen.setdefault((st.st_dev, st.st_ino), i)
        if first != i:
            same = "given twice" if paths[first] == p else f"the same file as {paths[first]}"
            raise InputError(f"{p}: {same} (inputs {first + 1} and {i + 1}); pass each file once, "
                             "or its documents are ingested twice")
    return [{"path": os.path.abspath(p), "name": name, "bytes": os.path.getsize(p), "sha256": input_sha256(p)}
            for p, name in zip(paths, input_names(paths))]


def plan_units(paths: Sequence[str], cfg: CorpusConfig) -> Iterator[dict]:
    """Yield {unit, first_key, records} in input order; cut on docs_per_unit or unit_bytes.
    Units and document keys depend only on the inputs and the config, so a re-run cuts the same."""
    unit, doc_key, first_key = 0, 0, 0
    batch: List[RawRecord] = []
    size = 0
    for path, name in zip(paths, input_names(paths)):
        for rec in iter_records(path, cfg.text_column, cfg.id_column, name):
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
