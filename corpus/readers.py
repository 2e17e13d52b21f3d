"""Streaming readers: each input yields raw records, one per document, without parsing them.

Parsing happens in the Ray task that owns the record's unit, so the driver only moves bytes
and its memory stays flat however large the corpus is.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Union

import pyarrow as pa
import pyarrow.parquet as pq

from sentsim.errors import InputError


@dataclass
class RawRecord:
    """One document as read: where it came from, and its undecoded payload."""

    source: str  # the input's name (corpus.units.input_names), in its documents' doc_ids and in messages
    line: int  # 1-based line (JSONL), row (Parquet) or 1 (text file)
    kind: str  # "jsonl" | "text" | "parquet"
    payload: Union[bytes, tuple]  # raw line / file bytes, or (doc_id, text-or-paragraphs) for Parquet

    def size(self) -> int:
        if isinstance(self.payload, bytes):
            return len(self.payload)
        doc_id, body = self.payload
        if isinstance(body, str):
            return len(body)
        if not isinstance(body, list):  # parse_record refuses it, naming the row
            return 0
        return sum(len(p) for p in body if isinstance(p, str))


def detect_kind(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".parquet"):
        return "parquet"
    for ext in (".jsonl", ".jsonl.gz", ".json.gz", ".ndjson", ".ndjson.gz"):
        if name.endswith(ext):
            return "jsonl"
    if name.endswith((".txt", ".txt.gz", ".text")):
        return "text"
    raise InputError(f"{path}: unknown input type (expected .jsonl[.gz], .txt[.gz] or .parquet)")


def _open_maybe_gzip(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def iter_records(path: str, text_column: str = "text", id_column: Optional[str] = None,
                 name: Optional[str] = None) -> Iterator[RawRecord]:
    """The records of one input; `name` is what they are named by (default: the file's name)."""
    if os.path.isdir(path):
        raise InputError(f"{path}: is a folder, not a file; pass the files inside it")
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    kind = detect_kind(path)
    name = name or os.path.basename(path)
    if kind == "jsonl":
        with _open_maybe_gzip(path) as f:
            try:
                for lineno, line in enumerate(f, start=1):
                    if line.strip():
                        yield RawRecord(name, lineno, "jsonl", line)
            except (OSError, EOFError) as exc:
                raise InputError(f"{path}: unreadable or truncated gzip stream ({exc})") from None
    elif kind == "text":
        with _open_maybe_gzip(path) as f:
            try:
                data = f.read()
            except (OSError, EOFError) as exc:
                raise InputError(f"{path}: unreadable or truncated gzip stream ({exc})") from None
        yield RawRecord(name, 1, "text", data)
    else:
        yield from _iter_parquet(path, name, text_column, id_column)


def _is_string_type(kind) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            or pa.types.is_null(kind))


def _is_text_type(kind) -> bool:
    """A string column (any of Arrow's spellings), or a list of strings, as a corpus text column."""
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view, pa.types.is_large_list_view)
    return _is_string_type(kind) or (any(f(kind) for f in lists) and _is_string_type(kind.value_type))


def _iter_parquet(path: str, name: str, text_column: str, id_column: Optional[str]) -> Iterator[RawRecord]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    cols: List[str] = pf.schema_arrow.names
    if text_column not in cols:
        raise InputError(
            f"{path}: no column '{text_column}' (columns: {', '.join(cols)}); set text_column to the text column"
        )
    if id_column and id_column not in cols:
        raise InputError(f"{path}: no column '{id_column}' (columns: {', '.join(cols)}); check id_column")
    kind = pf.schema_arrow.field(text_column).type
    if not _is_text_type(kind):
        raise InputError(f"{path}: column '{text_column}' has type {kind}; it must hold strings (one document "
                         "each) or lists of strings (its paragraphs)")
    wanted = [text_column] + ([id_column] if id_column else [])
    row = 0
    batches = pf.iter_batches(columns=wanted, batch_size=1024)
    while True:
        try:  # a footer that reads but a damaged page behind it
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{path}: unreadable Parquet data after row {row} ({exc})") from None
        if batch is None:
            return
        texts = _values(batch.column(0))
        ids = _values(batch.column(1)) if id_column else [None] * len(texts)
        for doc_id, body in zip(ids, texts):
            row += 1
            if doc_id is NOT_UTF8:
                doc_id, body = None, NOT_UTF8
            yield RawRecord(name, row, "parquet", (None if doc_id is None else str(doc_id), body))


class _NotUtf8:
    """A Parquet cell of a string column whose bytes are not UTF-8 (Arrow does not check them on write)."""

    def __repr__(self) -> str:
        return "NOT_UTF8"


# the value of such a cell: parse_record refuses its record, so `--on-error skip` can skip and count it
NOT_UTF8 = _NotUtf8()


def _values(column: pa.Array) -> list:
    """A column's Python values; a cell whose bytes are not UTF-8 becomes NOT_UTF8, not an exception."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        pass
    out = []
    for cell in column:
        try:
            out.append(cell.as_py())
        except UnicodeDecodeError:
            out.append(NOT_UTF8)
    return out
