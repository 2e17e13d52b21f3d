"""`sentsim store compact`: rewrite a finished run's per-unit shards into files of a target size.

A harvest writes one Parquet file per unit and table (16 anchors, ~80 pairs a file): at 100M pairs
that is over a million small files per table. Units keep their atomic commit while a run is written;
once it is complete, compaction concatenates consecutive units' shards, in unit order, into files of
about `target_bytes` each.

The unit markers stay the one record of which rows a run holds. A compaction only relocates those
rows, and records, for each unit and table, the rows and the sha256 of the shard it copied. A
compacted slice stands for a unit only while the unit's marker still names that same shard (same
sha256 and rows): a unit redone later (its marker lost, its shard edited) is read from its own new
shard, and a compacted file that holds a unit's superseded rows is refused by the table readers
until `sentsim store compact` runs again and rewrites it. So neither a resume nor a second
compaction can drop or double a row.

Refused (exit 2, one line, nothing written): a run that is not complete, a planned unit without a
valid marker (missing, empty, edited), a shard whose size or sha256 is not its marker's (checked on
the very bytes that are copied, so an edited shard is never laundered into a compacted file).

Layout and commit order (each step a durable commit, a kill anywhere is safe; `storage.fs`):

    _compact/plan.json                          1. the groups of units per output file, and the shards
                                                   (sha256) they are built from
    _compact/<table>/compact-GGG-NNNNN.parquet  2. each output file, staged outside the table's folder,
    _compact/<table>/compact-GGG-NNNNN.json        then its record (rows, bytes, sha256, its units with
                                                   their rows and source sha256)
    _compact/manifest.json                      3. the commit point: from here readers use the compacted
                                                   files (still at their staged name until step 4)
    <table>/compact-GGG-NNNNN.parquet           4. each file moved into the table's folder; then the
                                                   per-unit shards it holds, the files of an earlier
                                                   compaction it replaced, the staging files and the plan
                                                   are removed
    _foreign/<table>/<name>                     5. anything else in a table's folder (a file dropped in by
                                                   hand, a partial unit: no marker names it) is moved here,
                                                   named on stderr, never deleted

Until step 3 readers see the per-unit files (unchanged); from step 3 on, the compacted ones, which
hold exactly the same rows in the same order (units ascending, each unit's rows as written). A
compaction killed in 1-2 resumes where it stopped (a record whose sources and file check out is
kept); one killed in 4 or 5 is finished by the next call. GGG is the compaction's generation: a second
compaction keeps every file of the first that still stands for its units and writes the rest anew.
A compaction to another target than the committed one (`--target-mb`; without it, the target of a
compaction begun and killed, else the committed one) is a new generation through the same steps: the
units are regrouped to the new size from the committed files' checked slices, a file that comes out
holding the very same units is kept, and the earlier files are removed only after the new commit (step 4).
After step 5 DIR/<table>/ holds exactly the run's rows, so plain Parquet readers of that folder are
right too (README, "Outputs").
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from typing import Dict, List, Optional, Tuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage import fs as sfs
from storage.compaction import (
    COMPACT_DIR,
    COMPACT_MANIFEST,
    FILE_PREFIX,
    Compaction,
    compact_path,
    load_compaction,
    read_compaction,
    write_manifest,
)
from storage.lease import RunLease
from storage.reader import RunReader
from storage.records import StoreError, timestamp
from storage.store import ShardStore

PLAN = "plan.json"
DEFAULT_TARGET_BYTES = 128 << 20
FOREIGN_DIR = "_foreign"  # files found in a table folder that the run does not name, moved out by compaction


def file_name(generation: int, i: int) -> str:
    return f"{FILE_PREFIX}{generation:03d}-{i:05d}.parquet"


def fix_hint(uri: str) -> str:
    return (f"run `sentsim store verify {uri}` to list the problems, resume the job that wrote the run (the same "
            "command) to redo those units, then compact again")


# ---- planning -------------------------------------------------------------------------------------
def plan_groups(units: Dict[int, dict], table: str, target_bytes: int,
                kept: Optional[Dict[int, dict]] = None) -> List[dict]:
    """Consecutive units, in unit order, grouped until their shards reach `target_bytes` (the
    source's compressed bytes: the rewritten file is about that size, often a little smaller).
    `kept`: first unit -> a file of the committed compaction kept as it is; groups never cross one.
    Each group: {"units": [[unit, rows, source sha256], ...], "keep": the kept file's path or None}."""
    kept = kept or {}
    inside = {int(e[0]) for rec in kept.values() for e in rec["units"]}
    groups: List[dict] = []
    size, open_group = 0, False
    for u in sorted(units):
        if u in kept:
            groups.append({"units": kept[u]["units"], "keep": kept[u]["path"]})
            open_group = False
            continue
        if u in inside:
            continue
        f = units[u]["files"].get(table)
        if f is None:
            continue
        if not open_group or size >= target_bytes:
            groups.append({"units": [], "keep": None})
            size, open_group = 0, True
        groups[-1]["units"].append([u, int(f["rows"]), f["sha256"]])
        size += int(f["bytes"])
    return groups


def _plan_matches(plan: dict, fp: str, units: Dict[int, dict], tables: List[str]) -> bool:
    """Whether a plan begun earlier still describes the run: same units, and each from the same shard."""
    if plan.get("fingerprint") != fp or sorted(plan.get("tables", {})) != tables:
        return False
    for t in tables:
        want = {u: (int(r["files"][t]["rows"]), r["files"][t]["sha256"]) for u, r in units.items() if t in r["files"]}
        got = {int(e[0]): (int(e[1]), e[2]) for g in plan["tables"][t] for e in g["units"]}
        if got != want:
            return False
    return True


# ---- reading the sources, checked ------------------------------------------------------------------
class _Sources:
    """Each unit's rows of a table, from its own shard or its slice of a committed compacted file, each
    checked (size and sha256) on the very bytes that are used: nothing unchecked is ever copied."""

    def __init__(self, store: ShardStore, comp: Optional[Compaction]):
        self.store, self.comp = store, comp
        self._held: Optional[Tuple[str, pa.Table]] = None

    def unit_rows(self, table: str, unit: int, f: dict) -> pa.Table:
        found = self.comp.covers(table, unit, f) if self.comp else None
        if found is not None:
            rec, offset, n = found
            return self.compacted(rec).slice(offset, n)
        data = self._checked_bytes(f["path"], f["bytes"], f["sha256"], "its unit marker")
        t = pq.read_table(pa.BufferReader(data))
        if t.num_rows != int(f["rows"]):
            raise StoreError(f"{self.store.uri}/{f['path']}: {t.num_rows} rows, its marker says {f['rows']}; "
                             f"{fix_hint(self.store.uri)}")
        return t

    def compacted(self, rec: dict) -> pa.Table:
        if self._held is None or self._held[0] != rec["path"]:
            self._held = None
            data = self._checked_bytes(self.comp.location(rec), rec["bytes"], rec["sha256"],
                                       f"{COMPACT_DIR}/{COMPACT_MANIFEST}")
            self._held = (rec["path"], pq.read_table(pa.BufferReader(data)))
        return self._held[1]

    def _checked_bytes(self, rel: str, size: int, sha: str, where: str) -> bytes:
        p = self.store.path(rel)
        if not sfs.exists(self.store.fs, p):
            raise StoreError(f"{self.store.uri}/{rel}: missing; {fix_hint(self.store.uri)}")
        data = sfs.read_bytes(self.store.fs, p)
        if len(data) != int(size) or hashlib.sha256(data).hexdigest() != sha:
            raise StoreError(f"{self.store.uri}/{rel}: size or sha256 differs from {where} (edited or corrupt); "
                             f"{fix_hint(self.store.uri)}")
        return data


def _write_group(store: ShardStore, sources: _Sources, table: str, generation: int, i: int, group: dict,
                 units: Dict[int, dict]) -> dict:
    parts = [sources.unit_rows(table, int(u), units[int(u)]["files"][table]) for u, _, _ in group["units"]]
    data = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
    buf = io.BytesIO()
    pq.write_table(data, buf, compression="zstd")
    blob = buf.getvalue()
    staged = f"{COMPACT_DIR}/{table}/{file_name(generation, i)}"
    store.commit_bytes(store.path(staged), blob)
    rec = {"path": f"{table}/{file_name(generation, i)}", "staged": staged, "rows": data.num_rows,
           "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(), "units": group["units"]}
    store.commit_bytes(store.path(staged[:-len(".parquet")] + ".json"), json.dumps(rec, sort_keys=True).encode())
    return rec


def _reusable(store: ShardStore, staged_json: str, group: dict) -> Optional[dict]:
    """The record of a group written by a killed compaction, if it and its staged file check out."""
    rec = sfs.read_json(store.fs, store.path(staged_json))[1]
    if not isinstance(rec, dict) or rec.get("units") != group["units"]:
        return None
    info = store.fs.get_file_info(store.path(rec.get("staged", "")))
    if info.type == pafs.FileType.NotFound or info.size != rec.get("bytes"):
        return None
    return rec if sfs.sha256_file(store.fs, store.path(rec["staged"]))[0] == rec.get("sha256") else None


# ---- step 4: finishing a committed compaction ----------------------------------------------------
def _finish(store: ShardStore, comp: Compaction, markers: Dict[int, dict], staging: bool = True) -> int:
    """Move the committed files into their tables' folders, then remove what they replace: the
    per-unit shards whose rows they hold (same sha256 as the marker), the files of an earlier
    compaction, and (`staging`) the staging files and plan, which a compaction begun after this one
    keeps until its own commit. Idempotent: a kill anywhere is finished by the next call.
    Returns the number of per-unit shards removed."""
    fs = store.fs
    referenced = set()
    for recs in comp.tables.values():
        for rec in recs:
            referenced.add(rec["path"])
            staged = rec.get("staged")
            if staged and sfs.exists(fs, store.path(staged)):
                if sfs.exists(fs, store.path(rec["path"])):  # an object store's move stopped after the copy
                    sfs.delete_durable(fs, store.path(staged))
                else:
                    sfs.move_durable(fs, store.path(staged), store.path(rec["path"]))
    comp._where.clear()
    comp._listed.clear()
    removed = 0
    for u, m in sorted(markers.items()):
        for t, f in m.get("files", {}).items():
            if comp.covers(t, u, f) is not None and sfs.exists(fs, store.path(f["path"])) and \
                    f["path"] not in referenced:
                sfs.delete_durable(fs, store.path(f["path"]))
                removed += 1
    for t in comp.tables:  # files of an earlier compaction that this one replaced
        d = store.path(t)
        if sfs.exists(fs, d):
            for info in fs.get_file_info(pafs.FileSelector(d)):
                if info.base_name.startswith(FILE_PREFIX) and f"{t}/{info.base_name}" not in referenced:
                    sfs.delete_durable(fs, info.path)
    d = store.path(COMPACT_DIR)
    if staging and sfs.exists(fs, d):  # staging: what was moved is gone; records and files of an abandoned plan
        for info in fs.get_file_info(pafs.FileSelector(d, recursive=True)):
            rel = info.path[len(store.root):].lstrip("/")
            if info.type == pafs.FileType.File and info.base_name != COMPACT_MANIFEST and rel not in referenced:
                sfs.delete_durable(fs, info.path)
        for info in fs.get_file_info(pafs.FileSelector(d)):  # the emptied staging folders
            if info.type == pafs.FileType.Directory and not fs.get_file_info(pafs.FileSelector(info.path)):
                fs.delete_dir(info.path)
    return removed


def _move_foreign(store: ShardStore, comp: Compaction, markers: Dict[int, dict], stream) -> List[str]:
    """Move out of the table folders whatever no marker or compacted file of the run names (a file
    dropped in by hand, a partial unit, a folder): plain readers of DIR/<table> would read it too.
    It goes to FOREIGN_DIR/<table>/, named on `stream`, never deleted: it may be someone's data.
    Names starting with "." or "_" stay (every Parquet dataset reader skips them). Returns the moved paths."""
    claimed = {r["path"] for recs in comp.tables.values() for r in recs}
    claimed.update(f["path"] for u, m in markers.items() for t, f in m.get("files", {}).items()
                   if comp.covers(t, u, f) is None)
    moved: List[str] = []
    for table in comp.tables:
        d = store.path(table)
        for info in store.fs.get_file_info(pafs.FileSelector(d, allow_not_found=True)):
            rel = f"{table}/{info.base_name}"
            if rel in claimed or info.base_name.startswith((".", "_")):
                continue
            dest = sfs.join(FOREIGN_DIR, table, info.base_name)
            while sfs.exists(store.fs, store.path(dest)):  # an earlier one of the same name is kept too
                dest = sfs.join(FOREIGN_DIR, table, f"{timestamp()[:19].replace(':', '')}-{dest.rpartition('/')[2]}")
            if sfs.is_local(store.fs) or info.type == pafs.FileType.File:
                sfs.move_durable(store.fs, info.path, store.path(dest))
            else:  # a "folder" on an object store is its keys: moved one by one
                for sub in store.fs.get_file_info(pafs.FileSelector(info.path, recursive=True)):
                    if sub.type == pafs.FileType.File:
                        sfs.move_durable(store.fs, sub.path, store.path(dest) + sub.path[len(info.path):])
                store.fs.delete_dir(info.path)
            moved.append(dest)
    if moved:
        shown = ", ".join(moved[:3]) + (" ..." if len(moved) > 3 else "")
        print(f"note: {store.uri}: moved {len(moved)} file(s) no marker names out of the table folders, into "
              f"{FOREIGN_DIR}/ ({shown}), so DIR/<table> holds exactly the run's rows; delete them once not needed",
              file=stream, flush=True)
    return moved


# ---- the command ------------------------------------------------------------------------------------
def _problems(store: ShardStore, fp: str, planned: int,
              comp: Optional[Compaction]) -> Tuple[Dict[int, dict], List[str]]:
    """The run's valid markers, and every reason not to compact it: a planned unit without a valid marker,
    a shard or compacted file whose size or sha256 is not its record's. Everything is checked before
    anything is written (and each file again on the bytes that are copied), so a refusal leaves the run
    exactly as it was."""
    markers, problems = {}, []
    for u in range(planned):
        rec, why = store.marker_status(u)
        if why is None and rec.get("fingerprint") != fp:
            why = "is from another run"
        if why is not None:
            problems.append(f"unit {u:05d}'s completion marker {why}")
            continue
        markers[u] = rec
    checked = set()
    for u, rec in sorted(markers.items()):
        for t, f in rec["files"].items():
            found = comp.covers(t, u, f) if comp else None
            if found is not None:
                if found[0]["path"] not in checked:
                    checked.add(found[0]["path"])
                    why = comp.file_problem(found[0], deep=True)
                    if why:
                        problems.append(why)
                continue
            why = store.check_file(f, deep=True)
            if why:
                problems.append(why.replace("marker says", "its marker says").replace(
                    "checksum mismatch", "size or sha256 differs from its unit marker"))
    return markers, problems


def compact_run(uri: str, target_bytes: Optional[int] = None, stop_after: Optional[int] = None,
                stream=None) -> dict:
    """Compact the complete run at `uri` (resumable, incremental). `target_bytes`: None resumes a begun
    compaction at its target, else keeps the committed compaction's (DEFAULT_TARGET_BYTES for a first
    one); another target than the committed one rewrites the compacted files to it, as a new generation.
    `stop_after`: write at most that many output files, then stop before the commit (tests; a kill does
    the same). Returns a summary dict."""
    stream = stream or sys.stderr
    if target_bytes is not None and not target_bytes >= 1:
        raise StoreError(f"target size must be positive, got {target_bytes} bytes")
    reader = RunReader(uri)
    store = reader.store
    fp, planned = reader.fingerprint, reader.planned_units
    if not (reader.is_complete() and reader.manifest.get("complete")) or planned is None:
        raise StoreError(f"{reader.incomplete_note() or uri + ' is not complete'}; finish the run (re-run the same "
                         "command) before compacting it")
    lease = RunLease(store.fs, store.root, store.uri).acquire()  # no writer may resume the run meanwhile
    try:
        store.sweep_temp([])
        comp = load_compaction(store, fp)
        markers, problems = _problems(store, fp, planned, comp)
        if problems:
            more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
            raise StoreError(f"{uri}: not compacted: {problems[0]}{more}; {fix_hint(uri)}")
        tables = sorted({t for rec in markers.values() for t in rec["files"]})
        committed_target = comp.record.get("target_bytes") if comp is not None else None
        asked = target_bytes is not None
        if target_bytes is None:  # a plain rerun resumes a compaction begun at another target, else keeps the run's
            target_bytes = int(_begun_target(store, fp, (comp.generation if comp else 0) + 1, markers, tables)
                               or committed_target or DEFAULT_TARGET_BYTES)
        retarget = comp is not None and committed_target != target_bytes
        if comp is not None:
            done = _finish_earlier(store, comp, markers, tables, stream, retarget)
            if done is not None:
                return dict(done, target_bytes=target_bytes)
        if retarget:
            print(f"[compact] {uri} was compacted to about {_mb(committed_target)} a file: rewriting its files "
                  f"to about {_mb(target_bytes)}", file=stream, flush=True)
        generation = (comp.generation if comp else 0) + 1
        plan = _plan(store, fp, generation, markers, tables, comp, target_bytes, retarget, asked, stream)
        records, written = _write_planned(store, comp, plan, generation, markers, tables, lease, stop_after, stream)
        if records is None:
            return {"status": "stopped", "written": written}
        _check_every_unit_once(uri, tables, records, markers)
        manifest = {"fingerprint": fp, "generation": generation, "target_bytes": plan["target_bytes"],
                    "units": sorted(markers), "tables": records, "written": timestamp()}
        lease.check()
        write_manifest(store, manifest)  # the commit point
        earlier = {r["path"] for recs in comp.tables.values() for r in recs} if comp is not None else set()
        comp = Compaction(store, read_compaction(store, fp))
        removed = _finish(store, comp, markers)
        moved = _move_foreign(store, comp, markers, stream)
        replaced = len(earlier - {r["path"] for recs in records.values() for r in recs})
        return {"status": "compacted", "written": written, "removed": removed, "replaced": replaced,
                "moved": moved, "files": {t: len(v) for t, v in records.items()}, "units": len(markers),
                "target_bytes": plan["target_bytes"]}
    finally:
        lease.release()


def _finish_earlier(store: ShardStore, comp: Compaction, markers: Dict[int, dict], tables: List[str],
                    stream, retarget: bool = False) -> Optional[dict]:
    """A kill after an earlier commit: finish that one first (a plan begun since is kept). The summary
    when the committed compaction still covers every unit at the target asked for, else None (compact again)."""
    removed = _finish(store, comp, markers, staging=False)
    legacy = any("staged" not in r or any(len(e) < 3 for e in r["units"])
                 for recs in comp.tables.values() for r in recs)
    covered = all(comp.covers(t, u, f) is not None for u, m in markers.items() for t, f in m["files"].items())
    if retarget or not covered or legacy or any(comp.stale(t, markers) for t in tables):
        return None
    _finish(store, comp, markers)
    moved = _move_foreign(store, comp, markers, stream)
    return {"status": "already compacted", "files": {t: len(v) for t, v in comp.tables.items()},
            "removed": removed, "written": 0, "moved": moved}


def _plan(store: ShardStore, fp: str, generation: int, markers: Dict[int, dict], tables: List[str],
          comp: Optional[Compaction], target_bytes: int, retarget: bool, asked: bool, stream) -> dict:
    """The committed plan of this generation if it still matches the markers, else a new one (committed).
    `retarget`: the committed compaction's files are regrouped to the new target (those that come out
    holding the very same units are kept), rather than kept whole."""
    plan_p = compact_path(store, PLAN)
    found, plan = sfs.read_json(store.fs, plan_p)
    if found:
        if not isinstance(plan, dict) or plan.get("generation") != generation or \
                not _plan_matches(plan, fp, markers, tables):
            plan = None  # begun on units that were redone since, or by another compaction: plan again
        elif asked and plan.get("target_bytes") != target_bytes:  # a plain rerun just resumes
            print(f"[compact] resuming the compaction begun with a target of {plan['target_bytes']:,} bytes; "
                  f"once it is done, run the command again to compact to {target_bytes:,} bytes",
                  file=stream, flush=True)
    if plan is None:
        plan = {"fingerprint": fp, "generation": generation, "target_bytes": target_bytes, "created": timestamp(),
                "tables": {t: _regrouped(markers, t, target_bytes, _kept_files(comp, t, markers)) if retarget
                           else plan_groups(markers, t, target_bytes, _kept_files(comp, t, markers))
                           for t in tables}}
        store.commit_bytes(plan_p, json.dumps(plan, sort_keys=True).encode())
    return plan


def _begun_target(store: ShardStore, fp: str, generation: int, markers: Dict[int, dict],
                  tables: List[str]) -> Optional[int]:
    """The target of a plan of this generation begun by a killed compaction and still valid, else None."""
    found, plan = sfs.read_json(store.fs, compact_path(store, PLAN))
    if found and isinstance(plan, dict) and plan.get("generation") == generation and \
            _plan_matches(plan, fp, markers, tables):
        return plan.get("target_bytes")
    return None


def _regrouped(markers: Dict[int, dict], table: str, target_bytes: int, valid: Dict[int, dict]) -> List[dict]:
    """Groups for a new target; a group that holds exactly the units of a committed file still valid
    (`valid`: first unit -> its record) keeps that file instead of writing the same rows again."""
    groups = plan_groups(markers, table, target_bytes)
    for g in groups:
        rec = valid.get(int(g["units"][0][0]))
        if rec is not None and [list(e) for e in rec["units"]] == g["units"]:
            g.update(units=rec["units"], keep=rec["path"])
    return groups


def _mb(n: Optional[int]) -> str:
    return f"{n / (1 << 20):.3g} MB" if n else "an unrecorded size"


def _write_planned(store: ShardStore, comp: Optional[Compaction], plan: dict, generation: int,
                   markers: Dict[int, dict], tables: List[str], lease, stop_after: Optional[int], stream) -> tuple:
    """Write every planned group not already written; (records by table, files written), or
    (None, written) once `stop_after` files are written."""
    sources = _Sources(store, comp)
    records: Dict[str, List[dict]] = {}
    written = 0
    for t in tables:
        records[t] = []
        for i, group in enumerate(plan["tables"][t]):
            if group["keep"]:  # its size and sha256 were checked above (_problems)
                records[t].append(next(r for r in comp.tables[t] if r["path"] == group["keep"]))
                continue
            rec = _reusable(store, f"{COMPACT_DIR}/{t}/{file_name(generation, i)[:-len('.parquet')]}.json", group)
            if rec is not None:
                records[t].append(rec)
                continue
            if stop_after is not None and written >= stop_after:
                return None, written
            lease.check()
            rec = _write_group(store, sources, t, generation, i, group, markers)
            records[t].append(rec)
            written += 1
            print(f"[compact] {t} {i + 1}/{len(plan['tables'][t])}: {len(group['units'])} units, "
                  f"{rec['rows']:,} rows, {rec['bytes']:,} bytes", file=stream, flush=True)
    return records, written


def _check_every_unit_once(uri: str, tables: List[str], records: Dict[str, List[dict]],
                           markers: Dict[int, dict]) -> None:
    """Every unit exactly once, from the shard its marker names, before anything is committed."""
    for t in tables:
        want = {u: (int(m["files"][t]["rows"]), m["files"][t]["sha256"]) for u, m in markers.items()
                if t in m["files"]}
        got = [(int(e[0]), (int(e[1]), e[2])) for r in records[t] for e in r["units"]]
        if dict(got) != want or len(got) != len(want) or \
                any(sum(int(e[1]) for e in r["units"]) != r["rows"] for r in records[t]):
            raise StoreError(f"{uri}: compacted {t} would not hold exactly the units' rows; nothing committed")


def _kept_files(comp: Optional[Compaction], table: str, markers: Dict[int, dict]) -> Dict[int, dict]:
    """Files of the committed compaction that still stand for all their units: kept as they are.
    (Files of compactions before staging existed live in _compact/, and those of compactions before the
    source sha256 was recorded cannot be matched by content: both are rewritten.)"""
    if comp is None:
        return {}
    stale = comp.stale(table, markers)
    return {int(rec["units"][0][0]): rec for rec in comp.tables.get(table, [])
            if rec["units"] and rec.get("staged") and rec["path"] not in stale
            and all(len(e) > 2 for e in rec["units"])}  # kept only with each unit's source sha256
