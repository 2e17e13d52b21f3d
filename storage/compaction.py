"""The committed compaction of a run, as a resume, a reader and `sentsim store verify` see it: its
record (`_compact/manifest.json`), which compacted slice holds which unit's rows, and whether each
compacted file still checks out. Making one is `sentsim store compact` (compact.py, whose docstring
gives the layout and commit order).

`store` below is a `storage.store.ShardStore`; this module does not import it, because the store
reads the compaction when it resumes a run (ShardStore.completed_units) and when it finalizes one.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

import pyarrow.fs as pafs

from storage import fs as sfs
from storage.records import StoreError, record_check, timestamp

COMPACT_DIR = "_compact"
COMPACT_MANIFEST = "manifest.json"
FILE_PREFIX = "compact-"  # compacted files in a table's folder: compact-GGG-NNNNN.parquet


def compact_path(store, *parts: str) -> str:
    return store.path(COMPACT_DIR, *parts)


def read_compaction(store, fingerprint: Optional[str]) -> Optional[dict]:
    """The committed compaction of this run (same fingerprint), or None: the run reads per-unit files."""
    found, rec = sfs.read_json(store.fs, compact_path(store, COMPACT_MANIFEST))
    if not found:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("tables"), dict) or \
            (rec.get("check") is not None and rec["check"] != record_check(rec)):
        raise StoreError(f"{store.uri}/{COMPACT_DIR}/{COMPACT_MANIFEST} is not valid (edited or corrupt), so the "
                         "compacted files it indexes cannot be read; restore it from a copy, or start the run over "
                         "with --force-new")
    return rec if rec.get("fingerprint") == fingerprint else None


def load_compaction(store, fingerprint: Optional[str]) -> Optional["Compaction"]:
    rec = read_compaction(store, fingerprint)
    return Compaction(store, rec) if rec is not None else None


class Compaction:
    """A committed compaction, read against the run's current unit markers."""

    def __init__(self, store, record: dict):
        self.store, self.record = store, record
        self.generation = int(record.get("generation", 0))
        self.tables: Dict[str, List[dict]] = record.get("tables", {})
        self._index: Dict[str, Dict[int, tuple]] = {}
        self._where: Dict[str, str] = {}
        self._listed: Dict[str, set] = {}

    def entries(self, table: str) -> Dict[int, tuple]:
        """unit -> (file record, its first row in the file, its rows, the sha256 of the shard it was
        copied from; None in compactions written before sentsim recorded it)."""
        if table not in self._index:
            index = {}
            for rec in self.tables.get(table, []):
                offset = 0
                for entry in rec["units"]:  # in unit order, each unit's rows as written
                    u, n = int(entry[0]), int(entry[1])
                    index[u] = (rec, offset, n, entry[2] if len(entry) > 2 else None)
                    offset += n
            self._index[table] = index
        return self._index[table]

    def covers(self, table: str, unit: int, marker_file: Optional[dict]) -> Optional[Tuple[dict, int, int]]:
        """(file record, offset, rows) when the compacted slice holds the very rows the unit's marker
        names (`marker_file`: the marker's entry for `table`), else None. The match is by the shard's
        content (its sha256), never by its row count alone: a unit redone with as many rows but other
        bytes is not the compacted one. A compaction from before sentsim recorded that sha256 cannot
        tell; there the unit's own shard, present again, is what its marker names (a redo wrote it; or
        the compaction stopped before removing it, and then it holds the same rows)."""
        e = self.entries(table).get(unit)
        if e is None or marker_file is None:
            return None
        rec, offset, n, sha = e
        if n != int(marker_file.get("rows", -1)):
            return None
        if sha is None:
            folder, _, name = str(marker_file.get("path", "")).rpartition("/")
            if name in self._names(folder):
                return None
        elif sha != marker_file.get("sha256"):
            return None
        return rec, offset, n

    def stale(self, table: str, markers: Dict[int, dict]) -> Dict[str, List[int]]:
        """Compacted files of `table` that also hold rows no current marker vouches for (a unit redone
        or its marker lost since): file path -> those units. Such a file cannot be read whole."""
        out: Dict[str, List[int]] = {}
        for u, (rec, _, _, _) in sorted(self.entries(table).items()):
            m = markers.get(u)
            if self.covers(table, u, (m or {}).get("files", {}).get(table)) is None:
                out.setdefault(rec["path"], []).append(u)
        return out

    def location(self, rec: dict) -> str:
        """The file's path relative to the run: in the table's folder, or still at its staged name
        when the compaction was killed before moving it there. One listing of the folder per table
        (not a request per file: an object store answers a listing of 1,000 names at once)."""
        rel = rec["path"]
        if rel not in self._where:
            folder, _, name = rel.rpartition("/")
            staged = rec.get("staged")
            if staged and name not in self._names(folder) and sfs.exists(self.store.fs, self.store.path(staged)):
                rel = staged
            self._where[rec["path"]] = rel
        return self._where[rec["path"]]

    def _names(self, folder: str) -> set:
        """The names in one of the run's folders, listed once."""
        if folder not in self._listed:
            d = self.store.path(folder)
            self._listed[folder] = ({i.base_name for i in self.store.fs.get_file_info(pafs.FileSelector(d))}
                                    if sfs.exists(self.store.fs, d) else set())
        return self._listed[folder]

    def file_problem(self, rec: dict, deep: bool = True) -> Optional[str]:
        """None if the compacted file checks out against its record (size; sha256 when `deep`)."""
        rel = self.location(rec)
        info = self.store.fs.get_file_info(self.store.path(rel))
        if info.type == pafs.FileType.NotFound:
            return f"{rel}: missing (named by {COMPACT_DIR}/{COMPACT_MANIFEST})"
        if info.size != rec["bytes"]:
            return (f"{rel}: size {info.size} bytes, {COMPACT_DIR}/{COMPACT_MANIFEST} says {rec['bytes']} "
                    "(truncated or edited)")
        if deep and sfs.sha256_file(self.store.fs, self.store.path(rel))[0] != rec["sha256"]:
            return f"{rel}: checksum differs from {COMPACT_DIR}/{COMPACT_MANIFEST} (edited or corrupt)"
        return None

    def withdraw(self, paths: List[str]) -> None:
        """Drop broken compacted files from the committed compaction (a resumed job then redoes their
        units): the new manifest first, then the files."""
        drop = set(paths)
        record = dict(self.record, tables={t: [r for r in recs if r["path"] not in drop]
                                           for t, recs in self.tables.items()}, written=timestamp())
        write_manifest(self.store, record)
        for recs in self.tables.values():
            for r in recs:
                if r["path"] in drop:
                    for rel in {r["path"], r.get("staged") or r["path"]}:
                        if sfs.exists(self.store.fs, self.store.path(rel)):
                            sfs.delete_durable(self.store.fs, self.store.path(rel))
        self.__init__(self.store, record)


def write_manifest(store, record: dict) -> None:
    record = {k: v for k, v in record.items() if k != "check"}
    record["check"] = record_check(record)
    store.commit_bytes(compact_path(store, COMPACT_MANIFEST), json.dumps(record, sort_keys=True).encode())
