"""`sentsim store verify`: re-read every shard of a run against its manifest and markers."""

from __future__ import annotations

from typing import List

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage import fs as sfs
from storage.store import ShardStore, StoreError, schema_signature

COMPACT = "_compact"


def verify_store(uri: str) -> List[str]:
    """Every problem found, one line each, naming the shard. Empty means the run checks out."""
    store = ShardStore(uri)
    manifest = store.read_manifest()
    if manifest is None:
        raise StoreError(f"{uri}: no manifest.json here; is this a sentsim run directory?")
    problems: List[str] = []
    fp = manifest.get("fingerprint")
    tables = manifest.get("tables", {})
    markers = store.markers()
    claimed = set()
    from storage.compact import read_compaction

    compaction = read_compaction(store, fp) or {}
    compacted = compaction.get("tables", {})  # tables whose rows now live in _compact/ (store compact)
    for unit, rec in sorted(markers.items()):
        if rec.get("fingerprint") != fp:
            problems.append(f"unit {unit:05d}: marker from another run (fingerprint {rec.get('fingerprint')})")
            continue
        for table, f in rec["files"].items():
            claimed.add(f["path"])
            p = store.path(f["path"])
            if table in compacted:
                if sfs.exists(store.fs, p):
                    problems.append(f"{f['path']}: left over from compaction; run `sentsim store compact` again")
                continue
            info = store.fs.get_file_info(p)
            if info.type == pafs.FileType.NotFound:
                problems.append(f"{f['path']}: missing")
                continue
            if info.size != f["bytes"]:
                problems.append(f"{f['path']}: size {info.size} bytes, expected {f['bytes']} (truncated or edited)")
                continue
            digest, _ = sfs.sha256_file(store.fs, p)
            if digest != f["sha256"]:
                problems.append(f"{f['path']}: checksum mismatch (edited or corrupt)")
                continue
            try:
                with store.fs.open_input_file(p) as fh:
                    table_data = pq.read_table(fh)
            except Exception as exc:  # a corrupt Parquet footer or page
                problems.append(f"{f['path']}: unreadable Parquet ({type(exc).__name__})")
                continue
            if table_data.num_rows != f["rows"]:
                problems.append(f"{f['path']}: {table_data.num_rows} rows, marker says {f['rows']}")
            expected = tables.get(table)
            if expected is not None and schema_signature(table_data.schema) != expected:
                problems.append(f"{f['path']}: schema differs from the manifest's '{table}' schema")
    for table, recs in sorted(compacted.items()):
        want = sum(int(m["files"][table]["rows"]) for m in markers.values()
                   if m.get("fingerprint") == fp and table in m.get("files", {}))
        if sum(int(r["rows"]) for r in recs) != want:
            problems.append(f"{COMPACT}/{table}: {sum(int(r['rows']) for r in recs)} rows, the markers say {want}")
        for r in recs:
            p = store.path(r["path"])
            if not sfs.exists(store.fs, p):
                problems.append(f"{r['path']}: missing")
            elif sfs.sha256_file(store.fs, p)[0] != r["sha256"]:
                problems.append(f"{r['path']}: checksum mismatch (edited or corrupt)")
            elif tables.get(table) is not None and schema_signature(pq.read_schema(
                    p, filesystem=store.fs)) != tables[table]:
                problems.append(f"{r['path']}: schema differs from the manifest's '{table}' schema")
    # Shards without a marker: half-written units or files dropped in by hand.
    for table in tables:
        d = store.path(table)
        if not sfs.exists(store.fs, d):
            continue
        for info in store.fs.get_file_info(pafs.FileSelector(d)):
            rel = f"{table}/{info.base_name}"
            if info.base_name.endswith(".parquet") and not info.base_name.startswith(".") and rel not in claimed:
                problems.append(f"{rel}: no completion marker (partial unit or foreign file)")
    for name, rec in sorted(store.side_records().items()):
        problem = store.check_side_table(rec)
        if problem is None and rec.get("fingerprint") != fp:
            problem = f"{rec['path']}: written by another run (fingerprint {rec.get('fingerprint')})"
        if problem:
            problems.append(problem)
    planned = manifest.get("planned_units")
    if planned is not None:
        missing = [u for u in range(planned) if u not in markers]
        if missing:
            shown = ", ".join(f"{u:05d}" for u in missing[:10]) + (" ..." if len(missing) > 10 else "")
            problems.append(f"{len(missing)} of {planned} units not complete: {shown}")
    if not problems and not store.is_complete():
        problems.append(
            f"run incomplete: {len(markers)} units done and no _COMPLETE marker; re-run the same command to finish it"
        )
    return problems
