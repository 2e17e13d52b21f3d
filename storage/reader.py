"""RunReader: the one way to read a run written through the shard store, local or s3://.

A table's shards are exactly the files named by completion markers of this run (same fingerprint,
unit below planned_units): a killed writer's dot-temp file, a shard whose marker was never written
and a marker left by another run are never read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sentsim.errors import InputError
from storage import fs as sfs
from storage.compact import COMPACT_DIR, COMPACT_MANIFEST, _record_ok, read_compaction
from storage.store import MANIFEST, ShardStore, StoreError


class RunReader:
    """Read-only view of one run. `what` prefixes error messages (e.g. "--data", "--corpus")."""

    def __init__(self, uri: str, *, what: str = "", manifest_required: bool = True):
        self.uri = str(uri).rstrip("/")
        self.what = what
        self.store = ShardStore(self.uri)
        self.fs, self.root = self.store.fs, self.store.root
        self._where = f"{what} {self.uri}".strip()
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.NotFound:
            raise StoreError(f"{self._where}: no such directory")
        self.manifest: dict = self.store.read_manifest() or {}
        if manifest_required and not self.manifest:
            raise StoreError(f"{self._where}: not a sentsim run directory (no {MANIFEST})")
        self._units: Optional[Dict[int, dict]] = None
        self._compaction: Optional[dict] = None
        self._unit_index: Dict[str, Dict[int, Tuple[dict, int, int]]] = {}  # table -> unit -> (file, offset, rows)
        self._held: Dict[str, Tuple[str, pa.Table]] = {}  # table -> the compacted file read last (path, its rows)
        self._checked: set = set()  # compacted files whose checksum this reader has checked

    def __str__(self) -> str:
        return self.uri

    # ---- units -------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> Optional[str]:
        return self.manifest.get("fingerprint")

    @property
    def planned_units(self) -> Optional[int]:
        p = self.manifest.get("planned_units")
        return int(p) if p is not None else None

    def units(self) -> Dict[int, dict]:
        """Markers of this run's completed units, by unit number (read once, then cached)."""
        if self._units is None:
            fp, planned = self.fingerprint, self.planned_units
            self._units = {u: rec for u, rec in sorted(self.store.markers().items())
                           if rec.get("fingerprint") == fp and (planned is None or u < planned)}
        return self._units

    def progress(self) -> tuple:
        """(completed units, planned units or None)."""
        return len(self.units()), self.planned_units

    def is_complete(self) -> bool:
        return self.store.is_complete()

    def incomplete_note(self) -> Optional[str]:
        return self.store.incomplete_note()

    # ---- tables ------------------------------------------------------------------------------
    def tables(self) -> List[str]:
        names = set(self.manifest.get("tables") or {})
        for rec in self.units().values():
            names.update(rec.get("files", {}))
        return sorted(names)

    def compaction(self) -> dict:
        """The committed `sentsim store compact` of this run ({} if none): table -> its file records."""
        if self._compaction is None:
            self._compaction = (read_compaction(self.store, self.fingerprint) or {}) if self.manifest else {}
        return self._compaction

    def _rel_paths(self, table: str) -> List[str]:
        """The table's files relative to the run: the compacted ones once a compaction is committed
        (the same rows, in the same unit order), else each completed unit's shard."""
        compacted = self.compaction().get("tables", {})
        if table in compacted:
            return [rec["path"] for rec in compacted[table]]
        return [rec["files"][table]["path"] for rec in self.units().values() if table in rec.get("files", {})]

    def files(self, table: str, required: bool = True) -> List[str]:
        """Paths (inside `self.fs`) of the table's completed shards, in unit order."""
        out = [self.store.path(p) for p in self._rel_paths(table)]
        if not out and required:
            raise StoreError(f"{self._where}: no completed {table}/ shards (no unit marker names one)")
        return out

    def file_uris(self, table: str) -> List[str]:
        """The same files as URIs a user can paste (s3://bucket/run/pairs/part-00000.parquet)."""
        return [f"{self.uri}/{p}" for p in self._rel_paths(table)]

    def rows(self, table: str) -> int:
        """Row count from the markers alone (no Parquet read)."""
        return sum(int(rec["files"][table]["rows"]) for rec in self.units().values() if table in rec.get("files", {}))

    def schema(self, table: str) -> pa.Schema:
        files = self.files(table)
        return self.guarded(files[0], lambda: pq.read_schema(files[0], filesystem=self.fs))

    def dataset(self, table: str) -> pads.Dataset:
        """A pyarrow dataset over exactly the completed shards."""
        files = self.files(table)
        return self.guarded(files[0], lambda: pads.dataset(files, filesystem=self.fs, format="parquet"))

    def read_table(self, table: str, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The whole table (or some columns) as one pyarrow Table; a missing column names the shard."""
        parts = [self.read_file(f, columns) for f in self.files(table)]
        return pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]

    def read_file(self, path: str, columns: Optional[Sequence[str]] = None) -> pa.Table:
        def read():
            with self.fs.open_input_file(path) as fh:
                pf = pq.ParquetFile(fh)
                if columns is not None:
                    missing = [c for c in columns if c not in pf.schema_arrow.names]
                    if missing:
                        raise InputError(f"{self.display(path)}: missing column(s) {', '.join(missing)}")
                return pf.read(columns=list(columns) if columns is not None else None)
        return self.guarded(path, read)

    # ---- one unit at a time --------------------------------------------------------------------
    def unit_table(self, unit: int, table: str) -> pa.Table:
        """One unit's rows of `table`, as written, whether or not the run was compacted.

        Unit-by-unit readers (`sentsim remix`) go through here: `sentsim store compact` removes the
        per-unit shards, and the unit's rows are then a slice of the compacted file that holds it.
        The file read last is kept per table, so walking the units in order reads each compacted file
        once; its size and sha256 are checked against its record when it is read."""
        found = self._compacted_unit(table, unit)
        if found is None:
            rec = self._marker(unit)
            f = rec.get("files", {}).get(table)
            if f is None:
                raise StoreError(f"{self._where}: unit {unit} has no {table} shard")
            return self.read_file(self.store.path(f["path"]))
        file_rec, offset, rows = found
        return self._compacted_file(table, file_rec).slice(offset, rows)

    def check_unit(self, unit: int) -> Optional[str]:
        """None if every table of the unit reads back as written; otherwise what is wrong, naming the
        file. Per-unit shards are checked against the unit's marker (size and sha256); a compacted
        table against its compacted file's record, each file hashed once per reader however many
        units it holds."""
        own = {}
        for table, f in self._marker(unit).get("files", {}).items():
            found = self._compacted_unit(table, unit)
            if table in self.compaction().get("tables", {}) and found is None:
                return f"unit {unit}: not in {COMPACT_DIR}/{table} though its marker names a {table} shard"
            if found is None:
                own[table] = f
                continue
            file_rec = found[0]
            if file_rec["path"] not in self._checked:
                if not _record_ok(self.store, file_rec):
                    return (f"{file_rec['path']}: missing, truncated or edited (its size or sha256 differs "
                            f"from {COMPACT_DIR}/{COMPACT_MANIFEST})")
                self._checked.add(file_rec["path"])
        return self.store.check_unit({"files": own}, deep=True) if own else None

    def _marker(self, unit: int) -> dict:
        """The unit's marker: from the cached listing if there is one, else just its own file (a
        Ray actor remixing a few units need not list a million markers)."""
        if self._units is not None:
            rec = self._units.get(unit)
        else:
            rec = self.store.read_marker(unit)
            planned = self.planned_units
            if rec is not None and (rec.get("fingerprint") != self.fingerprint
                                    or (planned is not None and unit >= planned)):
                rec = None
        if rec is None:
            raise StoreError(f"{self._where}: unit {unit} has no completion marker of this run")
        return rec

    def _compacted_unit(self, table: str, unit: int) -> Optional[Tuple[dict, int, int]]:
        """(compacted file record, the unit's first row in it, its rows), or None when the table is not
        compacted or the unit has no rows there."""
        recs = self.compaction().get("tables", {}).get(table)
        if recs is None:
            return None
        if table not in self._unit_index:
            index = {}
            for rec in recs:
                offset = 0
                for u, n in rec["units"]:  # in unit order, each unit's rows as written
                    index[int(u)] = (rec, offset, int(n))
                    offset += int(n)
            self._unit_index[table] = index
        return self._unit_index[table].get(unit)

    def _compacted_file(self, table: str, rec: dict) -> pa.Table:
        """The compacted file's rows, checked against its record: read once while consecutive units use it."""
        held = self._held.get(table)
        if held is not None and held[0] == rec["path"]:
            return held[1]
        self._held.pop(table, None)  # let the previous file go before the next is read
        path = self.store.path(rec["path"])
        if not sfs.exists(self.fs, path):
            raise StoreError(f"{self.display(path)}: missing (named by {COMPACT_DIR}/{COMPACT_MANIFEST}); "
                             "run `sentsim store verify`")
        blob = self.guarded(path, lambda: sfs.read_bytes(self.fs, path))
        # hashed from the bytes read, not from a second read of the file
        where = f"{COMPACT_DIR}/{COMPACT_MANIFEST}"
        problem = (f"size {len(blob)} bytes, {where} says {rec['bytes']} (truncated or edited)"
                   if len(blob) != rec["bytes"] else
                   f"checksum differs from {where} (edited or corrupt)"
                   if hashlib.sha256(blob).hexdigest() != rec["sha256"] else None)
        if problem:
            raise StoreError(f"{self.display(path)}: {problem}; run `sentsim store verify`")
        self._checked.add(rec["path"])
        data = self.guarded(path, lambda: pq.read_table(pa.BufferReader(blob)))
        self._held[table] = (rec["path"], data)
        return data

    def iter_batches(self, table: str, columns: Optional[Sequence[str]] = None, batch_size: int = 8192):
        """Record batches shard by shard, in unit order (streaming: one shard open at a time)."""
        for path in self.files(table):
            with self.fs.open_input_file(path) as fh:
                pf = self.guarded(path, lambda: pq.ParquetFile(fh))
                yield from pf.iter_batches(columns=list(columns) if columns is not None else None,
                                           batch_size=batch_size)

    def ray_dataset(self, table: str, columns: Optional[Sequence[str]] = None, **kw):
        """A ray.data dataset over exactly the completed shards (Ray Train streams from it)."""
        import ray.data

        ds = ray.data.read_parquet(self.files(table), filesystem=self.fs, **kw)
        return ds.select_columns(list(columns)) if columns else ds

    # ---- side tables and run files ------------------------------------------------------------
    def side_table(self, name: str) -> Optional[pa.Table]:
        return self.store.read_side_table(name, fingerprint=self.fingerprint)

    def read_json(self, name: str) -> Optional[dict]:
        p = self.store.path(name)
        if not sfs.exists(self.fs, p):
            return None
        try:
            return json.loads(sfs.read_bytes(self.fs, p))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InputError(f"{self.uri}/{name}: not valid JSON") from None

    # ---- helpers -------------------------------------------------------------------------------
    def display(self, path: str) -> str:
        rel = path[len(self.root):].lstrip("/") if path.startswith(self.root) else path
        return f"{self.uri}/{rel}"

    def guarded(self, path: str, fn):
        """Run a read; a missing or corrupt shard becomes one line naming it, not a traceback."""
        try:
            return fn()
        except (InputError, StoreError):
            raise
        except FileNotFoundError:
            raise StoreError(f"{self.display(path)}: missing "
                             "(its unit marker names it; run `sentsim store verify`)") from None
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{self.display(path)}: not a readable Parquet file "
                             f"({type(exc).__name__}: {exc})") from None


def open_run(uri: str, *, what: str = "", manifest_required: bool = True) -> RunReader:
    return RunReader(uri, what=what, manifest_required=manifest_required)
