"""The pool harvest driver's reads of its vectors run on a first pass with double-centred: the context effect and
the label stage's shared copy (pipeline.Shared) each reading the whole run (`twice`, before Shared.hold) against
the effect's read handed to the shared copy (`once`).

A synthetic complete vectors run of --sentences x --pool float32 (S and the three terms, as VectorWriteStage
writes them) is written to disk once; each mode then runs in a fresh process on a local Ray: the calls
HarvestRun.prepare_pool makes for the effect (StoredVectors, context_effect) and the put run_pipeline makes
(Shared.in_object_store). Reported: the driver's peak RSS (ru_maxrss, which counts the object-store pages the
put wrote through the driver's mapping), its RSS once the value is put, and the seconds from the first read to
the put's return.

    python bench/driver_vectors.py                          # 100,000 sentences, |P| = 256, 3 runs each
    python bench/driver_vectors.py --sentences 20000 --runs 1
    python bench/driver_vectors.py --modes twice --run DIR  # at another commit (before Shared.hold), its own run

`twice` at a commit before Shared.hold measures what the driver did there; at this one, with the same
StoredVectors as `once`, it isolates the second read.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import alternated_children, machine, write_json_result  # noqa: E402

MiB = 2**20
PER_UNIT = 1000


def write_run(uri: str, n: int, pool: int, seed: int = 0) -> None:
    """A complete vectors run of n sentences over `pool` contexts, in units of PER_UNIT, as VectorWriteStage
    writes each unit."""
    import pyarrow as pa

    from sentsim.harvest.pool_vectors import DIRS, STAGE, VECTOR_SCHEMA, VECTORS_TABLE
    from storage import ShardStore

    rng = np.random.default_rng(seed)
    store, fp = ShardStore(uri), "bench-driver-vectors"
    units = -(-n // PER_UNIT)
    store.open_run(STAGE, fp, {"bench": True}, [{"sentences": n, "pool_size": pool}], {VECTORS_TABLE: VECTOR_SCHEMA},
                   planned_units=units)

    def rows(m: int) -> pa.Array:
        values = pa.array(rng.standard_normal(m * pool, dtype=np.float32))
        return pa.ListArray.from_arrays(pa.array(np.arange(0, m * pool + 1, pool, dtype=np.int32)), values)

    for u in range(units):
        ids = np.arange(u * PER_UNIT, min(n, (u + 1) * PER_UNIT), dtype=np.int64)
        m = len(ids)
        table = pa.table({"sentence_id": ids * 3, "text": [f"synthetic sentence number {i}" for i in ids],
                          "S": rows(m), **{d: rows(m) for d in DIRS}}, schema=VECTOR_SCHEMA)
        store.write_unit(u, {VECTORS_TABLE: table}, fp, {"sentences": m, "scored_items": m * pool})
    store.finalize(units, {})


def measure(mode: str, uri: str) -> dict:
    """One mode in this process: Ray up first, then the driver's reads and the put."""
    import resource
    import time

    import psutil
    import ray

    from sentsim.harvest.pool_vectors import StoredVectors
    from sentsim.pipeline import Shared

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    me = psutil.Process()
    base = me.memory_info().rss
    t0 = time.perf_counter()
    shared = Shared(functools.partial(StoredVectors, uri))
    stored = StoredVectors(uri)
    effect = stored.context_effect()
    if mode == "once":
        shared.hold(stored)
    del stored
    put = shared.in_object_store()
    seconds = time.perf_counter() - t0
    after = me.memory_info().rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert put.ref is not None and np.isfinite(effect).all()
    ray.shutdown()
    return {"mode": mode, "seconds": seconds, "peak_rss_mib": peak / MiB, "rss_after_put_mib": after / MiB,
            "rss_before_mib": base / MiB}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=100_000)
    p.add_argument("--pool", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", default="twice,once", help="comma-separated: twice, once")
    p.add_argument("--run", help="a vectors run written by an earlier call (kept); default: one written to a "
                                 "temporary folder and removed")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "driver_vectors.json"))
    p.add_argument("--measure", nargs=2, metavar=("MODE", "URI"), help=argparse.SUPPRESS)  # one child process
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0
    with tempfile.TemporaryDirectory(prefix="driver_vectors_") as tmp:
        uri = args.run or str(Path(tmp) / "pool_vectors")
        if not Path(uri, "manifest.json").exists():
            write_run(uri, args.sentences, args.pool)
        value_mib = args.sentences * args.pool * 4 * 4 / MiB
        runs = alternated_children(__file__, args.modes.split(","), args.runs, uri)
    med = {m: {k: statistics.median(x[k] for x in rs) for k in ("seconds", "peak_rss_mib", "rss_after_put_mib",
                                                                  "rss_before_mib")} for m, rs in runs.items()}
    result = {"bench": "driver_vectors", "machine": machine(), "sentences": args.sentences, "pool": args.pool,
              "matrices_mib": value_mib, "runs": runs, "median": med}
    for m, x in med.items():
        print(f"{m}: {x['seconds']:.2f} s, peak RSS {x['peak_rss_mib']:.0f} MiB (Ray up: {x['rss_before_mib']:.0f}), "
              f"RSS after the put {x['rss_after_put_mib']:.0f} MiB (median of {args.runs})")
    write_json_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
