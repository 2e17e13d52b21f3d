"""`sentsim store compact`: rewrite a finished run's per-unit shards into files of a target size.

A harvest writes one Parquet file per unit and table (16 anchors, ~80 pairs a file): at 100M pairs
that is over a million small files per table. Units keep their atomic commit while a run is written;
once it is complete, compaction concatenates consecutive units' shards, in unit order, into files of
about `target_bytes` each. Layout and commit order (every step atomic, a kill anywhere is safe):

    _compact/plan.json                      1. the groups of units per output file (fixed once written)
    _compact/<table>/part-NNNNN.parquet     2. each output file, then its record part-NNNNN.json
                                               (rows, bytes, sha256, the units it holds and their rows)
    _compact/manifest.json                  3. the commit point: from here RunReader reads the
                                               compacted files instead of the per-unit ones
    <table>/part-NNNNN.parquet removed      4. the per-unit files, only after the commit

Until step 3 readers see the per-unit files (unchanged); from step 3 on, the compacted ones, which
hold exactly the same rows in the same order (units ascending, each unit's rows as written). A
compaction killed in 1-2 resumes where it stopped (records whose file checks out are kept); one
killed in 4 finishes removing on the next call. Unit markers stay: they keep each unit's counts,
and `store verify` and a resumed job know their files were compacted (`_compact/manifest.json`).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from typing import Dict, List, Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage import fs as sfs
from storage.lease import RunLease
from storage.store import ShardStore, StoreError, _now

COMPACT_DIR = "_compact"
COMPACT_MANIFEST = "manifest.json"
PLAN = "plan.json"


def compact_path(store: ShardStore, *parts: str) -> str:
    return store.path(COMPACT_DIR, *parts)


def read_compaction(store: ShardStore, fingerprint: Optional[str]) -> Optional[dict]:
    """The committed compaction of this run (same fingerprint), or None: the run reads per-unit files."""
    p = compact_path(store, COMPACT_MANIFEST)
    if not sfs.exists(store.fs, p):
        return None
    try:
        rec = json.loads(sfs.read_bytes(store.fs, p))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise StoreError(f"{store.uri}/{COMPACT_DIR}/{COMPACT_MANIFEST} is not valid JSON; "
                         "run `sentsim store compact` again to rewrite it") from None
    return rec if isinstance(rec, dict) and rec.get("fingerprint") == fingerprint else None


def compacted_units(store: ShardStore, fingerprint: Optional[str]) -> set:
    """Units whose rows live in the committed compacted files (their own shards may be gone)."""
    rec = read_compaction(store, fingerprint)
    return set(rec.get("units", [])) if rec else set()


def plan_groups(units: Dict[int, dict], table: str, target_bytes: int) -> List[List[int]]:
    """Consecutive units, in unit order, grouped until their shards reach `target_bytes` (the
    source's compressed bytes: the rewritten file is about that size, often a little smaller)."""
    groups: List[List[int]] = []
    size = 0
    for u in sorted(units):
        f = units[u]["files"].get(table)
        if f is None:
            continue
        if not groups or size >= target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(u)
        size += int(f["bytes"])
    return groups


def _record_ok(store: ShardStore, rec: dict) -> bool:
    p = store.path(rec["path"])
    info = store.fs.get_file_info(p)
    if info.type == pafs.FileType.NotFound or info.size != rec["bytes"]:
        return False
    return sfs.sha256_file(store.fs, p)[0] == rec["sha256"]


def _write_group(store: ShardStore, table: str, i: int, group: List[int], units: Dict[int, dict]) -> dict:
    parts, held = [], []
    for u in group:
        f = units[u]["files"][table]
        with store.fs.open_input_file(store.path(f["path"])) as fh:
            t = pq.read_table(fh)
        if t.num_rows != f["rows"]:
            raise StoreError(f"{store.uri}/{f['path']}: {t.num_rows} rows, its marker says {f['rows']}; "
                             "run `sentsim store verify`")
        parts.append(t)
        held.append([u, t.num_rows])
    data = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
    buf = io.BytesIO()
    pq.write_table(data, buf, compression="zstd")
    blob = buf.getvalue()
    rel = f"{COMPACT_DIR}/{table}/part-{i:05d}.parquet"
    sfs.write_bytes_atomic(store.fs, store.path(rel), blob)
    rec = {"path": rel, "rows": data.num_rows, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
           "units": held}
    sfs.write_bytes_atomic(store.fs, compact_path(store, table, f"part-{i:05d}.json"),
                           json.dumps(rec, sort_keys=True).encode())
    return rec


def _sweep(store: ShardStore, tables) -> None:
    for t in tables:
        d = compact_path(store, t)
        if sfs.exists(store.fs, d):
            for info in store.fs.get_file_info(pafs.FileSelector(d)):
                if info.base_name.startswith(".tmp-"):
                    store.fs.delete_file(info.path)


def _remove_unit_files(store: ShardStore, units: Dict[int, dict], tables) -> int:
    n = 0
    for rec in units.values():
        for t in tables:
            f = rec["files"].get(t)
            if f is not None and sfs.exists(store.fs, store.path(f["path"])):
                store.fs.delete_file(store.path(f["path"]))
                n += 1
    return n


def compact_run(uri: str, target_bytes: int = 128 << 20, stop_after: Optional[int] = None, stream=None) -> dict:
    """Compact the complete run at `uri` (resumable). `stop_after`: write at most that many output
    files, then stop before the commit (tests; a kill does the same). Returns a summary dict."""
    from storage.reader import RunReader

    stream = stream or sys.stderr
    if target_bytes < 1:
        raise StoreError(f"target size must be positive, got {target_bytes} bytes")
    reader = RunReader(uri)
    store = reader.store
    fp = reader.fingerprint
    if not (reader.is_complete() and reader.manifest.get("complete")):
        raise StoreError(f"{reader.incomplete_note() or uri + ' is not complete'}; finish the run (re-run the same "
                         "command) before compacting it")
    units = reader.units()
    tables = sorted({t for rec in units.values() for t in rec.get("files", {})})
    lease = RunLease(store.fs, store.root, store.uri).acquire()  # no writer may resume the run meanwhile
    try:
        done = read_compaction(store, fp)
        if done is not None:  # committed earlier: only the per-unit files may be left to remove
            removed = _remove_unit_files(store, units, done["tables"])
            return {"status": "already compacted", "files": {t: len(v) for t, v in done["tables"].items()},
                    "removed": removed}
        plan_p = compact_path(store, PLAN)
        plan = None
        if sfs.exists(store.fs, plan_p):
            plan = json.loads(sfs.read_bytes(store.fs, plan_p))
            if plan.get("fingerprint") != fp:
                plan = None
            elif plan.get("target_bytes") != target_bytes:
                print(f"[compact] resuming the compaction begun with a target of {plan['target_bytes']:,} bytes",
                      file=stream, flush=True)
        if plan is None:
            plan = {"fingerprint": fp, "target_bytes": target_bytes, "created": _now(),
                    "tables": {t: plan_groups(units, t, target_bytes) for t in tables}}
            sfs.write_bytes_atomic(store.fs, plan_p, json.dumps(plan, sort_keys=True).encode())
        _sweep(store, tables)
        records: Dict[str, List[dict]] = {}
        written = 0
        for t in tables:
            records[t] = []
            for i, group in enumerate(plan["tables"][t]):
                rec_p = compact_path(store, t, f"part-{i:05d}.json")
                rec = json.loads(sfs.read_bytes(store.fs, rec_p)) if sfs.exists(store.fs, rec_p) else None
                if rec is not None and [u for u, _ in rec.get("units", [])] == group and _record_ok(store, rec):
                    records[t].append(rec)
                    continue
                if stop_after is not None and written >= stop_after:
                    return {"status": "stopped", "written": written}
                lease.check()
                rec = _write_group(store, t, i, group, units)
                records[t].append(rec)
                written += 1
                print(f"[compact] {t} {i + 1}/{len(plan['tables'][t])}: {len(group)} units, {rec['rows']:,} rows, "
                      f"{rec['bytes']:,} bytes", file=stream, flush=True)
        for t in tables:  # the same rows as the markers say, before anything is committed
            want = sum(int(units[u]["files"][t]["rows"]) for u in units if t in units[u]["files"])
            got = sum(r["rows"] for r in records[t])
            if got != want:
                raise StoreError(f"{uri}: compacted {t} holds {got} rows but the unit markers say {want}")
        manifest = {"fingerprint": fp, "target_bytes": plan["target_bytes"], "units": sorted(units),
                    "tables": records, "written": _now()}
        lease.check()
        sfs.write_bytes_atomic(store.fs, compact_path(store, COMPACT_MANIFEST),
                               json.dumps(manifest, sort_keys=True).encode())  # the commit point
        removed = _remove_unit_files(store, units, tables)
        return {"status": "compacted", "written": written, "removed": removed,
                "files": {t: len(v) for t, v in records.items()},
                "units": len(units)}
    finally:
        lease.release()
