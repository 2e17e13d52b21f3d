"""The shard store: every stage writes its results through here.

A run directory (local path or any pyarrow filesystem URI, e.g. ``s3://bucket/run``) holds

    manifest.json                format version, stage, config, fingerprint, inputs, counts, its own checksum
    <table>/part-NNNNN.parquet   one file per work unit and output table
    _units/NNNNN.json            completion marker: rows, bytes and sha256 of each file
    _COMPLETE                    written once every planned unit has its marker

A unit becomes visible atomically: its Parquet goes to a dot-prefixed temporary name (which
dataset readers ignore), is renamed into place, and only then is the marker written.
"""

from storage.reader import RunReader, open_run
from storage.records import StoreError
from storage.store import ShardStore, UnitRecord, open_store
from storage.verify import verify_store

__all__ = ["RunReader", "ShardStore", "StoreError", "UnitRecord", "open_run", "open_store", "verify_store"]
