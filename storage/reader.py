"""RunReader: the one way to read a run written through the shard store, local or s3://, that is
always right: exactly the committed rows, each once, before and after `sentsim store compact`.

A table's rows are exactly those of the units with a valid completion marker of this run (same
fingerprint, unit below planned_units, the marker's own checksum intact): a killed writer's temporary
file, a shard whose marker was never written (or was lost), and a marker left by another run are
never read. Nor is a file at a marker's path that the marker does not vouch for: every file a read
uses has the size its record says (one listing of its folder) and, as it is opened, its rows (its
Parquet footer); a file replaced, truncated or edited since is refused in one line naming it. (The
sha256 is left to `sentsim store verify` and the resume: hashing every read would cost a full read of
files a column projection only partly reads.) On a compacted run a unit's rows come from the
compacted file that holds the very shard its marker names (same sha256), else from its own shard; a
compacted file that also holds rows no marker vouches for any more is refused, naming the fix,
rather than read whole.

    from storage import open_run
    run = open_run("DIR")                      # or "s3://bucket/run"
    run.read_table("pairs")                    # pyarrow.Table
    run.read_table("pairs").to_pandas()        # pandas
    run.dataset("pairs")                       # pyarrow.dataset (lazy, filters, projections)
    run.ray_dataset("pairs")                   # ray.data.Dataset
    run.hf_dataset("pairs")                    # datasets.Dataset
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sentsim.errors import InputError
from storage import fs as sfs
from storage.compaction import COMPACT_DIR, COMPACT_MANIFEST, Compaction, load_compaction
from storage.records import StoreError
from storage.store import LOST_MANIFEST, MANIFEST, ShardStore, check_format, run_format

MARKER = "its unit marker"
COMPACTED = f"{COMPACT_DIR}/{COMPACT_MANIFEST}"


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
        if manifest_required and not self.manifest and self.store.lost_manifest():
            raise StoreError(f"{self._where}: {LOST_MANIFEST}")
        if manifest_required and not self.manifest:
            raise StoreError(f"{self._where}: not a sentsim run directory (no {MANIFEST})")
        check_format(self.manifest, self._where, "read it with that sentsim")
        self._units: Optional[Dict[int, dict]] = None
        self._compaction: Optional[dict] = None
        self._view: Optional[Compaction] = None
        self._held: Dict[str, Tuple[str, pa.Table]] = {}  # table -> the compacted file read last (path, its rows)
        self._checked: set = set()  # compacted files whose checksum this reader has checked
        self._expect: Dict[str, Tuple[int, int, str]] = {}  # path -> (bytes, rows, whose record), files handed out
        self._vouched: Dict[str, List[str]] = {}  # table -> its files, their sizes checked
        self._rows_ok: set = set()  # files whose footer's row count this reader has checked
        self._schemas: Dict[str, pa.Schema] = {}  # path -> its Parquet schema (unit_schema)

    def __str__(self) -> str:
        return self.uri

    # ---- units -------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> Optional[str]:
        return self.manifest.get("fingerprint")

    @property
    def format_version(self) -> int:
        """The run format (storage.store.FORMAT_VERSION) the run was written in; 1 for runs from before."""
        return run_format(self.manifest)

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
            self._view = load_compaction(self.store, self.fingerprint) if self.manifest else None
            self._compaction = self._view.record if self._view is not None else {}
        return self._compaction

    def _compacted(self) -> Optional[Compaction]:
        self.compaction()
        return self._view

    def _expected(self, table: str) -> List[Tuple[str, int, int, str]]:
        """(path relative to the run, bytes, rows, whose record says so) of the table's files, in unit
        order: each completed unit's shard, or, on a compacted run, the compacted file that holds the very
        shard its marker names (same sha256). A compacted file that also holds rows no marker vouches
        for any more (a unit redone, or its marker lost, since the compaction) cannot be read whole:
        refused, naming the fix."""
        comp = self._compacted()
        units = self.units()
        if comp is None:
            return [(f["path"], int(f["bytes"]), int(f["rows"]), MARKER) for f in
                    (rec["files"][table] for rec in units.values() if table in rec.get("files", {}))]
        stale = comp.stale(table, units)
        if stale:
            path, held = next(iter(stale.items()))
            shown = ", ".join(f"{u:05d}" for u in held[:5]) + (" ..." if len(held) > 5 else "")
            raise StoreError(f"{self._where}: {path} holds rows of unit(s) {shown} that no completion marker vouches "
                             f"for any more (redone or lost since `sentsim store compact`); run `sentsim store verify "
                             f"{self.uri}`, resume the job if it names missing units, then `sentsim store compact "
                             f"{self.uri}` again")
        out: List[Tuple[str, int, int, str]] = []
        seen = set()  # a compacted file is listed once, where its first unit falls
        for u, rec in units.items():
            f = rec.get("files", {}).get(table)
            if f is None:
                continue
            found = comp.covers(table, u, f)
            rel, size, rows, whose = ((comp.location(found[0]), found[0]["bytes"], found[0]["rows"], COMPACTED)
                                      if found is not None else (f["path"], f["bytes"], f["rows"], MARKER))
            if rel not in seen:
                seen.add(rel)
                out.append((rel, int(size), int(rows), whose))
        return out

    def files(self, table: str, required: bool = True) -> List[str]:
        """Paths (inside `self.fs`) of exactly the table's committed rows' files, in unit order, each
        there with the size its record says (checked once per reader: one listing of each folder)."""
        if table not in self._vouched:
            expected = self._expected(table)
            for rel, size, rows, whose in expected:
                self._expect[self.store.path(rel)] = (size, rows, whose)
            self._check_sizes([rel for rel, _, _, _ in expected])
            self._vouched[table] = [self.store.path(rel) for rel, _, _, _ in expected]
        out = list(self._vouched[table])
        if not out and required:
            self._refuse_unknown_table(table)
            raise StoreError(f"{self._where}: no completed {table}/ shards (no unit marker names one)")
        return out

    def _refuse_unknown_table(self, table: str) -> None:
        """One line naming the tables the run has, when `table` is none of them."""
        tables = self.tables()
        if table not in tables:
            raise StoreError(f"{self._where}: no table {table!r} in this run (its tables: "
                             f"{', '.join(tables) or 'none, no unit is complete yet'})")

    def check_columns(self, table: str, columns: Optional[Sequence[str]] = None,
                      numeric: Sequence[str] = ()) -> Optional[List[str]]:
        """`columns` as a list (None: every column), each checked against the table's schema (its first
        file's), and each of `numeric` a column of integers or floats: a name the table lacks, a bare
        string for a list, or text where numbers are expected is one line naming the run, the table, the
        column and what the table has, before any row is read."""
        if columns is None and not numeric:
            return None
        asked = [] if columns is None else columns
        for given in (asked, numeric):
            if isinstance(given, (str, bytes)):
                raise InputError(f"{self.uri}: columns of {table} are a list of names, got the string {given!r} "
                                 f"(one column: [{given!r}])")
        asked, numeric = list(asked), list(numeric)
        odd = [c for c in [*asked, *numeric] if not isinstance(c, str)]
        if odd:
            raise InputError(f"{self.uri}: columns of {table} are named by strings, got {odd[0]!r} "
                             f"({type(odd[0]).__name__})")
        schema = self.schema(table)
        missing = [c for c in dict.fromkeys([*asked, *numeric]) if c not in schema.names]
        if missing:
            raise InputError(f"{self.uri}: table {table} has no column(s) {', '.join(missing)} "
                             f"(its columns: {', '.join(schema.names)})")
        for c in numeric:
            if not _is_numeric(schema.field(c).type):
                raise InputError(f"{self.uri}: column {c} of table {table} holds {schema.field(c).type}, "
                                 f"not numbers ({_numeric_names(schema) or 'the table has no numeric column'})")
        return None if columns is None else asked

    def _check_sizes(self, rels: List[str]) -> None:
        """Each file is there, a regular file, with its record's size: one listing per folder (an object
        store answers 1,000 names a request), not a request per file."""
        by_folder: Dict[str, List[str]] = {}
        for rel in rels:
            by_folder.setdefault(rel.rpartition("/")[0], []).append(rel)
        for folder, names in by_folder.items():
            d = self.store.path(folder)
            try:
                listed = {i.base_name: i for i in
                          self.fs.get_file_info(pafs.FileSelector(d, allow_not_found=True))}
            except (OSError, pa.ArrowException) as exc:
                raise StoreError(f"{self.display(d)}: cannot be listed ({type(exc).__name__}: {exc})") from None
            for rel in names:
                info = listed.get(rel.rpartition("/")[2])
                self._refuse_if_not_vouched(self.store.path(rel), info.type if info else None,
                                            info.size if info else None)

    def _refuse_if_not_vouched(self, path: str, kind, size: Optional[int], rows: Optional[int] = None) -> None:
        """One line naming the file when what is at `path` is not what its record vouches for."""
        want_size, want_rows, whose = self._expect[path]
        if kind is None or kind == pafs.FileType.NotFound:
            problem = "missing"
        elif kind != pafs.FileType.File:
            problem = "not a regular file"
        elif size != want_size:
            problem = f"{size:,} bytes, but {whose} says {want_size:,} (replaced, truncated or edited since)"
        elif rows is not None and rows != want_rows:
            problem = f"{rows:,} rows, but {whose} says {want_rows:,} (replaced or edited since)"
        else:
            return
        raise StoreError(f"{self.display(path)}: {problem}; its rows are not read. Run `sentsim store verify "
                         f"{self.uri}`, then resume the job that wrote the run (the same command) to redo its units")

    def _open_checked(self, fh, path: str) -> pq.ParquetFile:
        """The Parquet file at `path` (open as `fh`), refused unless its size and row count are its record's."""
        if path in self._expect:  # the size first: a file replaced by one that is not Parquet is named as such
            self._refuse_if_not_vouched(path, pafs.FileType.File, fh.size())
        pf = pq.ParquetFile(fh)
        if path in self._expect:
            self._refuse_if_not_vouched(path, pafs.FileType.File, fh.size(), pf.metadata.num_rows)
            self._rows_ok.add(path)
        return pf

    def _check_rows(self, paths: Sequence[str]) -> None:
        """The footer's row count of each file not yet read by this reader (for readers that read the files
        themselves: pyarrow datasets, ray.data)."""
        for path in paths:
            if path not in self._rows_ok and path in self._expect:
                def footer():
                    with self.fs.open_input_file(path) as fh:
                        self._open_checked(fh, path)
                self.guarded(path, footer)

    def file_uris(self, table: str) -> List[str]:
        """The same files as URIs a user can paste (s3://bucket/run/pairs/part-00000.parquet), their sizes
        and row counts checked (whoever reads them next does not check)."""
        self._refuse_unknown_table(table)
        files = self.files(table, required=False)
        self._check_rows(files)
        return [self.display(p) for p in files]

    def rows(self, table: str) -> int:
        """Row count from the markers alone (no Parquet read)."""
        self._refuse_unknown_table(table)
        return sum(int(rec["files"][table]["rows"]) for rec in self.units().values() if table in rec.get("files", {}))

    def schema(self, table: str) -> pa.Schema:
        files = self.files(table)
        return self.guarded(files[0], lambda: pq.read_schema(files[0], filesystem=self.fs))

    def dataset(self, table: str) -> pads.Dataset:
        """A pyarrow dataset over exactly the completed shards, their sizes and row counts checked."""
        files = self.files(table)
        self._check_rows(files)
        return self.guarded(files[0], lambda: pads.dataset(files, filesystem=self.fs, format="parquet"))

    def read_table(self, table: str, columns: Optional[Sequence[str]] = None,
                   numeric: Sequence[str] = ()) -> pa.Table:
        """The whole table (or some columns) as one pyarrow Table. `numeric`: columns that must hold
        numbers (checked on every file). A column the table lacks, or of another type, is one line
        (`columns`); a shard that differs from the others names the shard."""
        columns = self.check_columns(table, columns, numeric)
        parts = [self.read_file(f, columns, numeric) for f in self.files(table)]
        if len(parts) == 1:
            return parts[0]
        first = parts[0].schema
        other = next((i for i, t in enumerate(parts) if not t.schema.equals(first)), None)
        if other is not None:
            raise InputError(f"{self.display(self.files(table)[other])}: its {table} columns are not those of the "
                             f"table's first file ({_schema_names(parts[other].schema)} against "
                             f"{_schema_names(first)})")
        return pa.concat_tables(parts).combine_chunks()

    def read_file(self, path: str, columns: Optional[Sequence[str]] = None,
                  numeric: Sequence[str] = ()) -> pa.Table:
        def read():
            with self.fs.open_input_file(path) as fh:
                pf = self._open_checked(fh, path)
                check_file_columns(self.display(path), pf.schema_arrow, columns, numeric)
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
                self._refuse_unknown_table(table)
                raise StoreError(f"{self._where}: unit {unit} has no {table} shard")
            path = self.store.path(f["path"])
            self._expect[path] = (int(f["bytes"]), int(f["rows"]), MARKER)
            return self.read_file(path)
        file_rec, offset, rows = found
        return self._compacted_file(table, file_rec).slice(offset, rows)

    def unit_schema(self, unit: int, table: str) -> pa.Schema:
        """The schema of the file that holds the unit's rows of `table` (its own shard, or the compacted file
        holding them): the Parquet footer alone, read once a file, so that a unit-by-unit reader can check
        every unit's columns before it writes anything."""
        found = self._compacted_unit(table, unit)
        if found is None:
            f = self._marker(unit).get("files", {}).get(table)
            if f is None:
                self._refuse_unknown_table(table)
                raise StoreError(f"{self._where}: unit {unit} has no {table} shard")
            path = self.store.path(f["path"])
        else:
            path = self.store.path(self._compacted().location(found[0]))
        if path not in self._schemas:
            self._schemas[path] = self.guarded(path, lambda: pq.read_schema(path, filesystem=self.fs))
        return self._schemas[path]

    def check_unit(self, unit: int) -> Optional[str]:
        """None if every table of the unit reads back as written; otherwise what is wrong, naming the
        file. Per-unit shards are checked against the unit's marker (size and sha256); a compacted
        table against its compacted file's record, each file hashed once per reader however many
        units it holds."""
        comp = self._compacted()
        own = {}
        for table, f in self._marker(unit).get("files", {}).items():
            found = comp.covers(table, unit, f) if comp is not None else None
            if found is None:
                own[table] = f
                continue
            file_rec = found[0]
            if file_rec["path"] not in self._checked:
                problem = comp.file_problem(file_rec)
                if problem:
                    return problem
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
        """(compacted file record, the unit's first row in it, its rows) when a compacted file holds the
        shard the unit's marker names, else None (the table is not compacted, or the unit was redone)."""
        comp = self._compacted()
        if comp is None:
            return None
        return comp.covers(table, unit, self._marker(unit).get("files", {}).get(table))

    def _compacted_file(self, table: str, rec: dict) -> pa.Table:
        """The compacted file's rows, checked against its record: read once while consecutive units use it."""
        held = self._held.get(table)
        if held is not None and held[0] == rec["path"]:
            return held[1]
        self._held.pop(table, None)  # let the previous file go before the next is read
        path = self.store.path(self._compacted().location(rec))
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
        columns = self.check_columns(table, columns)
        for path in self.files(table):
            with self.fs.open_input_file(path) as fh:
                pf = self.guarded(path, lambda: self._open_checked(fh, path))
                check_file_columns(self.display(path), pf.schema_arrow, columns)
                yield from pf.iter_batches(columns=columns, batch_size=batch_size)

    def ray_dataset(self, table: str, columns: Optional[Sequence[str]] = None, *,
                    shard_order_seed: Optional[int] = None, **kw):
        """A ray.data dataset over exactly the completed shards (Ray Train streams from it): one read task
        a file, reading the paths this reader checked. `kw` goes to `ray.data.read_datasource`.

        The shards come in unit order, so a trainer streaming them with only a local shuffle buffer sees
        the run's first units first (and a run capped at fewer steps than an epoch, only those).
        `shard_order_seed` reads the files in a seeded random order instead: free, and still streaming.

        Not `ray.data.read_parquet`: that lists its paths again in a thread pool whose completion thread
        can print an InterruptedError traceback when the listing ends while the machine is busy (a race
        inside ray.data's work-stealing lister, harmless but loud), and the files are known already.

        Where no Ray runs in this process yet, it starts as every sentsim command does (sentsim.runtime.init_ray:
        RAY_ADDRESS's cluster, checked in seconds, else a local Ray on 127.0.0.1 with token auth), not by Ray's
        implicit init, which attaches to whatever cluster this machine last started and retries one that died
        for minutes."""
        import ray
        import ray.data

        if not ray.is_initialized():
            from sentsim.runtime import init_ray

            init_ray()
        files = self.files(table)
        self._check_rows(files)
        if shard_order_seed is not None:
            files = random.Random(shard_order_seed).sample(files, len(files))
        shards = [(path, self._expect.get(path, (None, None, None))) for path in files]
        cols = self.check_columns(table, columns) or None
        with self.fs.open_input_file(files[0]) as fh:
            schema = pq.ParquetFile(fh).schema_arrow
        schema = pa.schema([schema.field(c) for c in cols]) if cols else schema
        source = _shard_source(self.fs, [(path, size, rows) for path, (size, rows, _) in shards], cols, schema)
        return ray.data.read_datasource(source, **kw)

    def hf_dataset(self, table: str, columns: Optional[Sequence[str]] = None):
        """A Hugging Face `datasets.Dataset` of exactly the committed rows, in memory (through
        `read_table`, so local, s3:// and compacted runs read alike). For a table larger than memory:
        `datasets.load_dataset("parquet", data_files=run.file_uris(table))`, the same files."""
        import datasets

        return datasets.Dataset(self.read_table(table, columns))

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


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _numeric_names(schema: pa.Schema) -> str:
    names = [f.name for f in schema if _is_numeric(f.type)]
    return f"its numeric columns: {', '.join(names)}" if names else ""


def _schema_names(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def check_file_columns(shown: str, schema: pa.Schema, columns: Optional[Sequence[str]],
                    numeric: Sequence[str] = ()) -> None:
    """One file's own check of what RunReader.check_columns checked on the table's first file: a shard that
    lacks a column or holds it as another type is named, with what it has. Any reader of a Parquet file
    (`shown`: how to name it) checks its columns with this, so a text score reads alike everywhere."""
    missing = [c for c in dict.fromkeys([*(columns or ()), *numeric]) if c not in schema.names]
    if missing:
        raise InputError(f"{shown}: missing column(s) {', '.join(missing)} (its columns: {', '.join(schema.names)})")
    for c in numeric:
        if not _is_numeric(schema.field(c).type):
            raise InputError(f"{shown}: column {c} holds {schema.field(c).type}, not numbers")


def open_run(uri: str, *, what: str = "", manifest_required: bool = True) -> RunReader:
    return RunReader(uri, what=what, manifest_required=manifest_required)


def _read_shard(fs, path: str, columns: Optional[List[str]]):
    """Blocks of one shard, a row group at a time (a compacted file may be large)."""
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        for i in range(pf.num_row_groups):
            yield pf.read_row_group(i, columns=columns)


def _shard_source(fs, shards: List[Tuple[str, Optional[int], Optional[int]]], columns: Optional[List[str]],
                  schema: pa.Schema):
    import functools

    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ShardSource(Datasource):
        """Exactly the given files, one read task each, with the rows and bytes their records state."""

        def estimate_inmemory_data_size(self):
            sizes = [size for _, size, _ in shards]
            return sum(sizes) if sizes and None not in sizes else None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            return [ReadTask(functools.partial(_read_shard, fs, path, columns),
                             BlockMetadata(num_rows=rows, size_bytes=size, input_files=(path,), exec_stats=None),
                             schema=schema, per_task_row_limit=per_task_row_limit)
                    for path, size, rows in shards]

    return ShardSource()
