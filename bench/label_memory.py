"""Memory of a pool harvest's label actors on Ray: every actor loading the whole vectors run itself (`own`, how
PoolLabelStage loaded it before pipeline.Shared) against one copy put in the object store by the driver and mapped
by each actor (`shared`).

The real PoolLabelStage labels units of random pairs over a synthetic vectors run of --sentences x --pool float32
(S and the three terms: 16 bytes a sentence a context). Each actor reports its unique set size (USS: memory no
other process shares) after its last unit; the `shared` run adds the one copy in the node's object store (the
value's bytes, counted once: every actor on a node maps the same pages). The `own` run builds the same numpy
arrays in each actor, so it slightly understates the old stage, which also held a dict and a list of str per
sentence.

    python bench/label_memory.py                       # 20,000 sentences, |P| = 256, 2 actors, 3 runs each
    python bench/label_memory.py --sentences 50000 --runs 1
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import machine, write_json_result  # noqa: E402

from sentsim.harvest.pool_label import PoolLabelStage  # noqa: E402
from sentsim.pipeline import Resources, Shared, StageSpec, run_pipeline  # noqa: E402

MiB = 2**20


def synthetic_vectors(n: int, pool: int, seed: int = 0):
    """A StoredVectors of n sentences over `pool` contexts, built in memory (no run on disk)."""
    from sentsim.harvest.pool_vectors import DIRS, PackedTexts, StoredVectors

    rng = np.random.default_rng(seed)
    v = StoredVectors.__new__(StoredVectors)
    v.ids = np.arange(n, dtype=np.int64) * 3
    v.texts = PackedTexts([f"synthetic sentence number {i}" for i in range(n)])
    v.S = rng.standard_normal((n, pool), dtype=np.float32)
    v.terms = {d: rng.standard_normal((n, pool), dtype=np.float32) for d in DIRS}
    return v


class OwnCopy(Shared):
    """Not put in the object store: each actor calls `load` in its setup, as every label actor read the whole
    vectors run before."""

    def in_object_store(self) -> "OwnCopy":
        return self


class MeasuredLabel(PoolLabelStage):
    """PoolLabelStage, and this actor's USS after each call."""

    def process(self, items):
        import psutil

        out = super().process(items)
        uss = psutil.Process().memory_full_info().uss
        for x in out:
            x["uss"] = uss
            x["pid"] = psutil.Process().pid
        return out


def units(n: int, count: int, per_unit: int, seed: int = 1) -> list:
    from sentsim.harvest.work import Pair

    rng = np.random.default_rng(seed)
    out = []
    for u in range(count):
        a, b = rng.integers(0, n, size=(2, per_unit)) * 3
        out.append({"unit": u, "pairs": [Pair(int(x), int(y), "cluster") for x, y in zip(a, b)]})
    return out


def one_run(mode: str, args) -> dict:
    handle = (Shared if mode == "shared" else OwnCopy)(functools.partial(synthetic_vectors, args.sentences,
                                                                          args.pool))
    res = Resources(num_cpus=0.25, min_actors=args.actors, max_actors=args.actors)
    spec = StageSpec(MeasuredLabel, res, dict(out="unused", fp="unused", metric="pearson", precision=None,
                                              vectors=handle))
    done = list(run_pipeline(units(args.sentences, args.units, args.pairs_per_unit), [spec], executor="ray"))
    last = {}
    for x in done:
        last[x["pid"]] = max(last.get(x["pid"], 0), x["uss"])
    return {"actors": len(last), "uss_per_actor_mib": sorted(v / MiB for v in last.values()),
            "uss_sum_mib": sum(last.values()) / MiB}


def value_bytes(v) -> int:
    """The bytes a StoredVectors puts in the object store: its arrays."""
    return sum(a.nbytes for a in (v.ids, v.texts.ends, v.texts.data, v.S, *v.terms.values()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=20_000)
    p.add_argument("--pool", type=int, default=256)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--units", type=int, default=16)
    p.add_argument("--pairs-per-unit", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "label_memory.json"))
    args = p.parse_args(argv)
    import ray

    store_mib = value_bytes(synthetic_vectors(args.sentences, args.pool)) / MiB
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().wait_for_min_actors_s = 300  # both actors up before the first unit
    runs = {"own": [], "shared": []}
    for _ in range(args.runs):
        for mode in runs:  # alternated, so a change in the machine's load falls on both
            runs[mode].append(one_run(mode, args))
    ray.shutdown()
    med = {m: statistics.median(r["uss_sum_mib"] for r in rs) for m, rs in runs.items()}
    node = {"own": med["own"], "shared": med["shared"] + store_mib}
    result = {"bench": "label_memory", "machine": machine(), "sentences": args.sentences, "pool": args.pool,
              "actors": args.actors, "object_store_copy_mib": store_mib, "runs": runs,
              "median_uss_sum_mib": med, "node_mib": node, "ratio_shared_over_own": node["shared"] / node["own"]}
    print(f"vectors run {store_mib:.0f} MiB; {args.actors} label actors (median of {args.runs} runs): own copies "
          f"{med['own']:.0f} MiB of USS; shared {med['shared']:.0f} MiB of USS + {store_mib:.0f} MiB in the object "
          f"store = {node['shared']:.0f} MiB ({result['ratio_shared_over_own']:.2f}x of own)")
    write_json_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
