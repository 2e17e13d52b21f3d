"""The driver of a pool harvest's remix: its memory and seconds for S and the context effect under new λ
(harvest/remix.py pool_remix_inputs), this commit's code against the code of --baseline, in one invocation.

A synthetic complete vectors run of --sentences x --pool float32 (bench/driver_vectors.py write_run: S and the
three terms, as VectorWriteStage writes them) is written to disk once; each mode then runs in a fresh process
on a local Ray, as the remix's driver does with --executor ray: pool_remix_inputs through pipeline.Shared,
loaded and put in the object store. `before` is pool_remix_inputs as it is at --baseline (its remix.py read
from git and loaded as a module of its own, against this commit's other modules); `after` is this commit's.
With --executor inline (`sentsim remix`'s default) the same load runs in the process with no Ray and no put,
as the first unit's `Shared.get` does there. Reported per mode: the driver's peak RSS (ru_maxrss, which counts
the object-store pages the put wrote through the driver's mapping), its RSS before the first read (Ray up) and
after the put (or the load), and the seconds from the first read to the put's return (or the load's); and
whether both modes gave the same S and context effect to the bit (a sha256 of each, taken after the timing).

    python bench/remix_memory.py                              # 100,000 sentences, |P| = 256, 3 runs each
    python bench/remix_memory.py --sentences 20000 --runs 3 --json bench/results/remix_memory_20k.json
    python bench/remix_memory.py --executor inline --json bench/results/remix_memory_inline.json
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import alternated_children, machine, write_json_result  # noqa: E402
from driver_vectors import write_run  # noqa: E402

MiB = 2**20
BASELINE = "e678a9f"  # the last commit before pool_scores went blockwise
# a remix under new λ (no disc: a pool harvest scores none) to a metric that reads the context effect, the
# driver's largest case
LAMBDA = {"disc": 0.0, "fwd": 1.0, "left": 0.5, "right": 0.25}
METRIC = "double-centred"


def baseline_inputs(rev: str, folder: str):
    """pool_remix_inputs as sentsim/harvest/remix.py has it at `rev`, loaded from git as a module of its own."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:sentsim/harvest/remix.py"], capture_output=True,
                            text=True, check=True).stdout
    path = Path(folder) / "remix_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("remix_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pool_remix_inputs


def measure(mode: str, uri: str, rev: str, executor: str) -> dict:
    """One mode in this process: Ray up first (--executor ray), then the driver's load and put (or, inline, the
    load alone), then the digests of what it loaded."""
    import resource
    import time

    import psutil
    import ray

    from sentsim.pipeline import Shared

    with tempfile.TemporaryDirectory(prefix="remix_baseline_") as tmp:
        if mode == "before":
            inputs = baseline_inputs(rev, tmp)
        else:
            from sentsim.harvest.remix import pool_remix_inputs as inputs
        on_ray = executor == "ray"
        if on_ray:
            ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        me = psutil.Process()
        base = me.memory_info().rss
        t0 = time.perf_counter()
        shared = Shared(functools.partial(inputs, uri, LAMBDA, METRIC))
        # on Ray the value is read back from the store once measured; inline, the load is what is measured
        put = shared.in_object_store() if on_ray else shared
        value = None if on_ray else put.get()
        seconds = time.perf_counter() - t0
        after = me.memory_info().rss
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        stored, S, effect = value or put.get()
        digest = {"S": hashlib.sha256(np.ascontiguousarray(S).tobytes()).hexdigest(),
                  "effect": hashlib.sha256(np.ascontiguousarray(effect).tobytes()).hexdigest(),
                  "S_dtype": str(S.dtype), "put_mib": (sum(m.nbytes for m in stored.terms.values()) + S.nbytes
                                                       + (stored.S.nbytes if stored.S is not None else 0)) / MiB}
        del stored, S, effect, put, shared, value
        if on_ray:
            ray.shutdown()
    return {"mode": mode, "seconds": seconds, "peak_rss_mib": peak / MiB, "rss_after_put_mib": after / MiB,
            "rss_before_mib": base / MiB, "peak_growth_mib": (peak - base) / MiB, **digest}


KEYS = ("seconds", "peak_rss_mib", "peak_growth_mib", "rss_after_put_mib", "rss_before_mib")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=100_000)
    p.add_argument("--pool", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", default="before,after", help="comma-separated: before, after")
    p.add_argument("--executor", choices=("ray", "inline"), default="ray",
                   help="ray: the load put in the object store, as the driver of --executor ray; "
                        "inline: the load alone")
    p.add_argument("--baseline", default=BASELINE, help="the commit whose pool_remix_inputs `before` runs")
    p.add_argument("--run", help="a vectors run written by an earlier call (kept); default: one written to a "
                                 "temporary folder and removed")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "remix_memory.json"))
    # one child process
    p.add_argument("--measure", nargs=4, metavar=("MODE", "URI", "REV", "EXECUTOR"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0
    with tempfile.TemporaryDirectory(prefix="remix_memory_") as tmp:
        uri = args.run or str(Path(tmp) / "pool_vectors")
        if not Path(uri, "manifest.json").exists():
            write_run(uri, args.sentences, args.pool)
        runs = alternated_children(__file__, args.modes.split(","), args.runs, uri, args.baseline, args.executor)
    med = {m: {k: statistics.median(x[k] for x in rs) for k in KEYS} for m, rs in runs.items()}
    digests = {(x["S"], x["effect"]) for rs in runs.values() for x in rs}
    result = {"bench": "remix_memory", "machine": machine(), "sentences": args.sentences, "pool": args.pool,
              "baseline": args.baseline, "executor": args.executor, "lambda": LAMBDA, "metric": METRIC,
              "float64_matrix_mib": args.sentences * args.pool * 8 / MiB,
              "same_S_and_effect_to_the_bit": len(digests) == 1, "runs": runs, "median": med}
    if {"before", "after"} <= set(med):
        result["ratio_after_over_before"] = {k: med["after"][k] / med["before"][k]
                                             for k in ("seconds", "peak_rss_mib", "peak_growth_mib")}
    for m, x in med.items():
        print(f"{m}: {x['seconds']:.2f} s, peak RSS {x['peak_rss_mib']:.0f} MiB "
              f"(at the start: {x['rss_before_mib']:.0f}, growth {x['peak_growth_mib']:.0f}), "
              f"RSS after the load/put {x['rss_after_put_mib']:.0f} MiB (median of {args.runs})")
    print(f"same S and effect to the bit in every run: {result['same_S_and_effect_to_the_bit']}")
    write_json_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
