"""`sentsim store verify`: re-read every shard of a run against its manifest and markers.

OK means: the manifest matches its own checksum (one of a run format from before manifests carried a checksum,
storage.store.SEALED_FORMAT, is not checked, and a note says so), every planned unit has a valid marker, every
file a marker (or the committed compaction) names reads back with its size, sha256, rows and schema, and the
table folders hold nothing else, so plain Parquet readers of DIR/<table> see exactly the run's rows too.

A run whose job has not finished (no _COMPLETE: stopped by --max-units, killed, or still going) is not
damaged for lacking units: when what it holds checks out, it is OK and incomplete, with how far it got.
A finished run that lacks a unit has lost it, and that is a problem.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage import fs as sfs
from storage.compaction import FILE_PREFIX, load_compaction
from storage.records import StoreError
from storage.store import (
    COMPLETE,
    LOST_MANIFEST,
    MANIFEST,
    NESTED_CACHES,
    NESTED_RUNS,
    SEALED_FORMAT,
    UNITS_DIR,
    UNREAD_NESTED,
    ShardStore,
    check_format,
    manifest_seal_broken,
    run_format,
    schema_signature,
)

AGAIN = "run `sentsim store compact` again"


def _check_parquet(store: ShardStore, rel: str, rows: int, expected, table: str, problems: List[str]) -> None:
    try:
        with store.fs.open_input_file(store.path(rel)) as fh:
            data = pq.read_table(fh)
    except Exception as exc:  # a corrupt Parquet footer or page
        problems.append(f"{rel}: unreadable Parquet ({type(exc).__name__})")
        return
    if data.num_rows != rows:
        problems.append(f"{rel}: {data.num_rows} rows, its record says {rows}")
    if expected is not None and schema_signature(data.schema) != expected:
        problems.append(f"{rel}: schema differs from the manifest's '{table}' schema")


def verify_store(uri: str) -> List[str]:
    """Every problem found, one line each, naming the shard, and a last line when the run is not finished.
    Empty means the run checks out and is complete."""
    problems, unfinished = verify_run(uri)
    return problems + ([f"run {unfinished}"] if unfinished else [])


def verify_run(uri: str, notes: Optional[List[str]] = None) -> Tuple[List[str], Optional[str]]:
    """(every problem found, one line each, naming the shard; how far the run got when its job has not
    finished, else None). No problems and None: the run checks out and is complete. `notes`, when given,
    gets a line for what is worth saying and is no damage (a finished run's own cache left unfinished, a manifest
    with no checksum to check)."""
    store = ShardStore(uri)
    notes = notes if notes is not None else []
    manifest = store.read_manifest(trusted=False)  # an edited one is named below, with the rest of the damage
    if manifest is None:
        return _without_manifest(store)
    check_format(manifest, uri, "verify it with that sentsim")
    problems: List[str] = []
    broken = manifest_seal_broken(manifest)
    if broken:
        # the rest is still checked against it: its other lines may show what was edited (a fingerprint, a count)
        problems.append(f"{MANIFEST}: {broken}; every reader and a resume refuse the run until the manifest.json it "
                        "wrote is put back, or its command starts it over with --force-new")
    elif run_format(manifest) < SEALED_FORMAT:
        notes.append(f"{uri.rstrip('/')}/{MANIFEST}: run format {run_format(manifest)}, from before manifests carried "
                     "a checksum of their own, so a hand edit of it is not detected: not checked")
    fp = manifest.get("fingerprint")
    tables = manifest.get("tables", {})
    markers, invalid = store.marker_scan()
    for unit, why in sorted(invalid.items()):
        problems.append(f"{UNITS_DIR}/{unit:05d}.json: completion marker {why}; the unit is redone on resume")
    _check_foreign_marker_names(store, problems)
    comp = load_compaction(store, fp)
    claimed: Set[str] = set()
    _check_marked_files(store, markers, comp, fp, tables, claimed, problems)
    if comp is not None:
        _check_compacted_files(store, markers, comp, fp, tables, claimed, problems)
    _check_unclaimed_files(store, tables, claimed, problems)
    _check_side_tables(store, fp, problems)
    _check_nested_runs(uri, store, manifest.get(UNREAD_NESTED) or (), problems, notes)
    if store.is_complete():
        _check_planned_units(manifest, markers, problems)
        return problems, None
    if sfs.exists(store.fs, store.path(COMPLETE)):
        problems.append(f"{COMPLETE}: not a regular file; the same command's resume writes it")
    return problems, _unfinished(manifest, markers)


def unread_nested_runs(uri: str) -> List[str]:
    """The nested runs in the run's folder that its manifest says it does not read (an edited manifest too, which
    verify_run names as damage and checks the rest against all the same)."""
    try:
        manifest = ShardStore(uri).read_manifest(trusted=False) or {}
    except StoreError:
        return []
    return [name for name in manifest.get(UNREAD_NESTED) or () if name in NESTED_RUNS]


def _check_nested_runs(uri: str, store: ShardStore, unread: Sequence[str], problems: List[str],
                       notes: List[str]) -> None:
    """Each nested run there is verified as a run of its own, its problems named under its folder; one the run
    does not read (`unread`) may be unfinished, and so may a finished run's own cache (NESTED_CACHES), which
    gets a note instead."""
    for name in NESTED_RUNS:
        sub = ShardStore(f"{uri.rstrip('/')}/{name}")
        try:
            if sub.read_manifest(trusted=False) is None and not sub.lost_manifest():
                continue  # none there (or not a run: the outer run's checks name stray files)
            inner, unfinished = verify_run(sub.uri, notes)
        except StoreError as exc:
            problems.append(f"{name}/: {exc}")
            continue
        problems.extend(f"{name}/{p}" for p in inner)
        if not (unfinished and store.is_complete()) or name in unread:
            continue
        if name in NESTED_CACHES:
            notes.append(f"{uri.rstrip('/')}/{name}: {unfinished.split(';')[0]}; a cache the finished run does not "
                         "read again (its screening did; a run that screens again resumes it first)")
        else:
            problems.append(f"{name}/: run {unfinished}; the finished run it belongs to needs it whole")


def _without_manifest(store: ShardStore) -> Tuple[List[str], Optional[str]]:
    """A folder with no manifest: a run that lost it is damage (a problem: its rows can be neither read nor
    resumed); anything else is not a run to verify (a StoreError)."""
    if store.lost_manifest():
        return [LOST_MANIFEST], None
    if store.fs.get_file_info(store.root).type == pafs.FileType.NotFound:  # as store compact and every reader say
        raise StoreError(f"{store.uri}: no such directory")
    raise StoreError(f"{store.uri}: no manifest.json here; is this a sentsim run directory?")


def _unfinished(manifest: dict, markers: dict) -> str:
    planned = manifest.get("planned_units")
    if planned is None:
        return f"incomplete: {len(markers)} units done; the same command resumes it"
    done = sum(u in markers for u in range(planned))
    if done == planned:
        # killed before it was marked, or refused at the end (a harvest whose every score is null, a corpus whose
        # every document was skipped): the same command marks it, or says again why it does not
        return (f"incomplete: all {planned} units done, not marked complete; the same command marks it complete, "
                "or says why it cannot")
    return f"incomplete: {done} of {planned} units done; the same command resumes it"


def _check_marked_files(store: ShardStore, markers: dict, comp, fp, tables: dict, claimed: Set[str],
                        problems: List[str]) -> None:
    """Each file a marker of this run names: whole (size, sha256) and a readable Parquet of its rows."""
    for unit, rec in sorted(markers.items()):
        if rec.get("fingerprint") != fp:
            problems.append(f"unit {unit:05d}: marker from another run (fingerprint {rec.get('fingerprint')})")
            continue
        for table, f in rec["files"].items():
            if comp is not None and comp.covers(table, unit, f) is not None:
                if sfs.exists(store.fs, store.path(f["path"])):
                    problems.append(f"{f['path']}: left over from compaction (its rows are in a compacted file); "
                                    f"{AGAIN}")
                    claimed.add(f["path"])
                continue
            claimed.add(f["path"])
            problem = store.check_file(f, deep=True)
            if problem:
                problems.append(problem.replace("marker says", "expected") +
                                (" (truncated or edited)" if "size" in problem else ""))
                continue
            _check_parquet(store, f["path"], int(f["rows"]), tables.get(table), table, problems)


def _check_compacted_files(store: ShardStore, markers: dict, comp, fp, tables: dict, claimed: Set[str],
                           problems: List[str]) -> None:
    """Each compacted file: still vouched for by the markers it holds rows of, moved into place, whole."""
    current = {u: m for u, m in markers.items() if m.get("fingerprint") == fp}
    for table, recs in sorted(comp.tables.items()):
        for path, held in sorted(comp.stale(table, current).items()):
            shown = ", ".join(f"{u:05d}" for u in held[:5]) + (" ..." if len(held) > 5 else "")
            problems.append(f"{path}: holds rows of unit(s) {shown} that no marker vouches for any more "
                            f"(redone or lost since compaction); resume the job if units are missing, then {AGAIN}")
        for r in recs:
            where = comp.location(r)
            claimed.add(where)
            problem = comp.file_problem(r)
            if problem:
                problems.append(problem)
                continue
            if where != r["path"]:
                problems.append(f"{where}: not yet moved to {r['path']} (compaction stopped part-way); {AGAIN}")
            _check_parquet(store, where, int(r["rows"]), tables.get(table), table, problems)


def _check_unclaimed_files(store: ShardStore, tables: dict, claimed: Set[str], problems: List[str]) -> None:
    """Files in a table's folder that no marker or compaction names: half-written units, files dropped in
    by hand, or an earlier compaction's files. Plain readers of the folder would read them."""
    for table in tables:
        d = store.path(table)
        if not sfs.exists(store.fs, d):
            continue
        for info in store.fs.get_file_info(pafs.FileSelector(d)):
            rel = f"{table}/{info.base_name}"
            if rel in claimed or info.base_name.startswith("."):
                continue
            if info.base_name.startswith(FILE_PREFIX):
                problems.append(f"{rel}: a compacted file no compaction names (left over); {AGAIN}")
            elif info.base_name.endswith(".parquet"):
                problems.append(f"{rel}: no completion marker (partial unit or foreign file)")


def _check_foreign_marker_names(store: ShardStore, problems: List[str]) -> None:
    """Files in _units/ not named as a marker is (NNNNN.json): a copy or a renamed marker, which every reader
    passes over; said, so that a unit whose marker was renamed is not simply redone without a word."""
    d = store.path(UNITS_DIR)
    if not sfs.exists(store.fs, d):
        return
    for info in store.fs.get_file_info(pafs.FileSelector(d)):
        name = info.base_name
        if not name.startswith(".") and not (name.endswith(".json") and name[:-5].isdigit()):
            problems.append(f"{UNITS_DIR}/{name}: not a completion marker's name (NNNNN.json), so no reader "
                            "reads it; move it out of the run")


def _check_side_tables(store: ShardStore, fp, problems: List[str]) -> None:
    for name, rec in sorted(store.side_records().items()):
        problem = store.check_side_table(rec)
        if problem is None and rec.get("fingerprint") != fp:
            problem = f"{rec['path']}: written by another run (fingerprint {rec.get('fingerprint')})"
        if problem:
            problems.append(problem)


def _check_planned_units(manifest: dict, markers: dict, problems: List[str]) -> None:
    planned = manifest.get("planned_units")
    if planned is None:
        return
    missing = [u for u in range(planned) if u not in markers]
    if missing:
        shown = ", ".join(f"{u:05d}" for u in missing[:10]) + (" ..." if len(missing) > 10 else "")
        problems.append(f"{len(missing)} of {planned} units not complete: {shown}; resume the job (the same "
                        "command) to redo them")
