"""Scale costs of a harvest (issue 16): the plan's driver cost against anchors.n, object-store bytes
per unit, and bytes per pair / sentence / item of each table of a small real harvest.

    .venv/bin/python bench/scale.py plan --corpus /tmp/scale/corpus --n 10000,100000,1000000 \
        --roots /tmp/scale-old,.           # old code (a worktree of HEAD) against this checkout
    .venv/bin/python bench/scale.py bytes --roots /tmp/scale-old,.

Every measurement of `plan` runs in a fresh process with the given code root first on sys.path,
so peak RSS (ru_maxrss) is that process's alone. What is measured there is what the driver does
before Ray sees a unit: plan() and, as `run_pipeline` did, pickling every unit for
`ray.data.from_items`; the new code hands Ray the unit numbers only and builds the units in read
tasks, so that cost (building and pickling every unit) is reported beside it as work done off
the driver. Where the old code cannot run at all (1M anchors: every unit pickles all anchor ids),
its cost is projected from a sample of units and marked so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

PLAN_CHILD = r"""
import json, pickle, resource, sys, time
import numpy as np

def rss_mb(field="VmHWM"):
    # VmHWM: peak RSS since the last reset (below, after the corpus load, whose own peak would
    # otherwise hide the plan's); VmRSS: now
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

corpus_path, n, sample_only = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
from sentsim.harvest.config import HarvestConfig
from corpus.view import CorpusIndex
from sentsim.harvest import job

cfg = HarvestConfig.model_validate(dict(corpus=corpus_path, out="/tmp/unused", context_models=["m"],
                                        contexts={"mode": "random"}, anchors={"n": n, "per_unit": 16}))
t0 = time.perf_counter()
corpus = CorpusIndex(corpus_path)
load_s = time.perf_counter() - t0
import ctypes, gc; gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # the load's freed buffers back to the OS, or they hide what follows
reset_peak()
base = rss_mb("VmRSS")
t0 = time.perf_counter()
units, info = job.plan(cfg, corpus)
plan_s = time.perf_counter() - t0
after_plan = rss_mb()
n_units = len(units)
streamed = type(units).__name__ == "UnitPlan"
# what the driver pickles for Ray: every unit (old: run_pipeline before from_items), or nothing (new)
idx = np.linspace(0, n_units - 1, min(n_units, 64)).astype(int)
sizes = [len(pickle.dumps(units[int(i)], protocol=5)) for i in idx]
out = {"n": n, "anchors": info.get("anchors"), "units": n_units, "streamed": streamed, "corpus_load_s": load_s,
       "plan_s": plan_s, "rss_base_mb": base, "rss_after_plan_mb": after_plan,
       "unit_pickle_bytes_mean": float(np.mean(sizes)), "unit_pickle_bytes_max": int(max(sizes))}
total = float(np.mean(sizes)) * n_units
out["all_units_pickled_bytes"] = total
if not sample_only:
    t0 = time.perf_counter()
    blobs = [pickle.dumps(u, protocol=5) for u in units]
    out["pickle_all_s"] = time.perf_counter() - t0
    out["all_units_pickled_bytes"] = sum(map(len, blobs))
    del blobs
    out["rss_after_pickle_mb"] = rss_mb()
else:
    t0 = time.perf_counter()
    for i in idx:
        pickle.dumps(units[int(i)], protocol=5)
    out["pickle_all_s_projected"] = (time.perf_counter() - t0) / len(idx) * n_units
# the per-unit anchor-membership structure of ContextStage: old set(all_anchors) per unit, new one
# sorted array per actor and np.searchsorted over the unit's ~5 partners per anchor
anchors = np.asarray(units[0]["all_anchors"] if "all_anchors" in units[0] else units.make.anchors)
rng = np.random.default_rng(0)
partners = rng.choice(corpus.ids, size=16 * 5)
t0 = time.perf_counter()
reps = 5
for _ in range(reps):
    if "all_anchors" in units[0]:
        s = set(units[0]["all_anchors"]); [int(p) in s for p in partners]
    else:
        from sentsim.harvest.pairs import is_anchor
        is_anchor(anchors, partners)
out["membership_per_unit_s"] = (time.perf_counter() - t0) / reps
out["rss_peak_mb"] = rss_mb()
print("RESULT " + json.dumps(out))
"""


def run_plan(root: str, corpus: str, n: int, sample_only: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(root).resolve()))
    with tempfile.TemporaryDirectory() as cwd:  # nothing of this checkout on sys.path but PYTHONPATH
        r = subprocess.run([sys.executable, "-c", PLAN_CHILD, corpus, str(n), "1" if sample_only else "0"],
                           capture_output=True, text=True, env=env, cwd=cwd)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not line:
        raise SystemExit(f"{root} n={n}: failed\n{r.stderr[-3000:]}")
    return json.loads(line[0][7:])


def cmd_plan(args) -> list:
    rows = []
    for root in args.roots.split(","):
        for n in map(int, args.n.split(",")):
            # the old plan pickles every anchor id into every unit: beyond ~2 GB of pickles, sample
            old_bytes = 9.0 * n * (n / 16)
            sample = old_bytes > args.max_pickle_gb * 1e9
            r = run_plan(root, args.corpus, n, sample)
            r["root"] = root
            rows.append(r)
            print(json.dumps(r), flush=True)
    return rows


def tiny_inputs(work: Path) -> dict:
    """The tests' tiny harvest inputs (tests/harvest_support.py): sample corpus, TF-IDF index, 1+1-layer BART."""
    sys.path.insert(0, str(ROOT / "tests"))
    # the checkout too: else tests/storage/, a test folder, is imported as the storage package
    sys.path.append(str(ROOT))
    from harvest_support import build_index_for, tiny_context_bundle

    from sentsim.corpus_job import build_corpus

    corpus = work / "corpus"
    if not (corpus / "_COMPLETE").exists():
        build_corpus([str(ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], str(corpus),
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    index = work / "index"
    if not (index / "manifest.json").exists() and not index.exists():
        build_index_for(corpus, index)
    bundle = work / "ctx"
    if not bundle.exists():
        tiny_context_bundle(corpus, bundle)
    return {"corpus": corpus, "index": index, "bundle": bundle}


HARVEST_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[5])
from harvest_support import harvest_config
from sentsim.harvest.job import harvest
over = json.loads(sys.argv[6])
cfg = harvest_config(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], **over)
harvest(cfg, executor="inline", quiet=True)
"""


def table_bytes(run: Path) -> dict:
    """Per table: files, rows, bytes (from the unit markers), and the sentences' and pairs' counts."""
    out = {}
    for marker in sorted((run / "_units").glob("*.json")):
        rec = json.loads(marker.read_text())
        for t, f in rec["files"].items():
            d = out.setdefault(t, {"files": 0, "rows": 0, "bytes": 0})
            d["files"] += 1
            d["rows"] += f["rows"]
            d["bytes"] += f["bytes"]
    for name in ("rank_anchors",):
        p = run / "_side" / f"{name}.parquet"
        if p.exists():
            import pyarrow.parquet as pq

            out[f"_side/{name}"] = {"files": 1, "rows": pq.read_metadata(p).num_rows, "bytes": p.stat().st_size}
    return out


def cmd_bytes(args) -> dict:
    import pyarrow.dataset as ds

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    inp = tiny_inputs(work)
    over = {"anchors": {"n": args.anchors, "per_unit": 16}, "contexts": {"size": args.contexts, "retrieve_chunks": 40}}
    res = {}
    for root in args.roots.split(","):
        tag = "old" if Path(root).resolve() != ROOT else "new"
        for keep in (["all", "none"] if tag == "new" else ["all"]):
            out = work / f"harvest-{tag}-{keep}"
            if not (out / "_COMPLETE").exists():
                o = dict(over, **({"keep_context_scores": keep} if keep != "all" else {}))
                env = dict(os.environ, PYTHONPATH=str(Path(root).resolve()))
                t0 = time.time()
                with tempfile.TemporaryDirectory() as cwd:
                    r = subprocess.run([sys.executable, "-c", HARVEST_CHILD, str(inp["corpus"]), str(inp["index"]),
                                        str(inp["bundle"]), str(out), str(Path(root).resolve() / "tests"),
                                        json.dumps(o)], env=env, cwd=cwd, capture_output=True, text=True)
                if r.returncode:
                    raise SystemExit(f"harvest {tag}/{keep} failed\n{r.stderr[-3000:]}")
                print(f"harvest {tag}/{keep}: {time.time() - t0:.0f} s", flush=True)
            res[f"{tag}-{keep}"] = table_bytes(out)
    # the same pairs, ids and scores old and new (partner sampling and pair ownership unchanged)
    if "old-all" in res and "new-all" in res:
        a = ds.dataset(str(work / "harvest-old-all" / "pairs")).to_table().sort_by("pair_id")
        b = ds.dataset(str(work / "harvest-new-all" / "pairs")).to_table().sort_by("pair_id")
        cols = [c for c in a.column_names if c in b.column_names]
        res["old_new_pairs_identical"] = a.select(cols).equals(b.select(cols))
        res["pairs"] = a.num_rows
    # remix from the float32 terms against the harvest's own float64 scores
    from sentsim.harvest.remix import RemixConfig, remix

    re = work / "remix-new"
    if not (re / "_COMPLETE").exists():
        remix(RemixConfig(source=str(work / "harvest-new-all"), out=str(re)), quiet=True, force_new=True)
    s1 = ds.dataset(str(work / "harvest-new-all" / "pairs")).to_table(columns=["pair_id", "score"]).to_pandas()
    s2 = ds.dataset(str(re / "pairs")).to_table(columns=["pair_id", "score"]).to_pandas()
    j = s1.set_index("pair_id").score - s2.set_index("pair_id").score
    res["remix_max_abs_diff_vs_harvest"] = float(j.abs().max())
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan")
    a.add_argument("--corpus", required=True)
    a.add_argument("--n", default="10000,100000,1000000")
    a.add_argument("--roots", default=".")
    a.add_argument("--max-pickle-gb", type=float, default=6.0)
    a.add_argument("--json", default=None)
    b = sub.add_parser("bytes")
    b.add_argument("--roots", default=".")
    b.add_argument("--work", default="/tmp/scale/bytes")
    b.add_argument("--anchors", type=int, default=48)
    b.add_argument("--contexts", type=int, default=6)
    b.add_argument("--json", default=None)
    args = p.parse_args()
    res = cmd_plan(args) if args.cmd == "plan" else cmd_bytes(args)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
