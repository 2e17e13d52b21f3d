"""The chosen teacher on all of STS-B test, beside TF-IDF, in one run (issue 15, step 5).

    python bench/teacher_test.py --label NAME [--config configs/teacher.yaml] [--actors 2] [--set KEY=VALUE ...]
                                 [--remix METRIC,...]
    python bench/teacher_test.py --compare NAME_A NAME_B

A real `sentsim harvest --config CONFIG --pairs sts-test.csv` on a local Ray, into SENTSIM_CACHE/test/NAME, with
one contexts actor and --actors scoring actors of one torch thread each (scoring is the cost). It resumes:
a run that is cut off is continued by running the same command again. Then, on the same pairs, Spearman x 100
against gold with 95% bootstrap intervals (1,000 resamples) for Origin and for TF-IDF cosine, and their
paired difference (2,000 resamples).
Every choice (λ, |C_s|, the model) comes from the config, chosen on STS-B dev (bench/teacher_curve.py).

A pool harvest (--set contexts.mode=pool --set contexts.pool_size=P, issue 47) scores each STS-B test
sentence once against one shared pool; --remix adds a row per other Eq. 4 metric, `sentsim remix --metric`
of the same vectors (nothing scored again), labelled NAME/METRIC. Its contexts per pair are |P| and its
items per pair come from the harvest's report.

Each row's per-pair scores are kept in bench/results/teacher_test_scores.json, so that --compare pairs two rows
(a paired bootstrap of their Spearman difference on the pairs both scored) after their runs are gone.

Cost: wall seconds of the harvest processes, summed over resumed runs (NAME.cost), and the seconds each
stage's actors spent per pair, from the units' completion markers. Results: bench/results/teacher_test.{json,md}
(one row per NAME; a name run again replaces its row).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import bootstrap, machine, paired_bootstrap, print_paired  # noqa: E402
from teacher_curve import pairs_committed, remix_metric  # noqa: E402

from sentsim.config import user_cache  # noqa: E402

STSB_TEST = ROOT.parent / "shared" / "data" / "sts" / "stsbenchmark" / "sts-test.csv"
RESULTS = ROOT / "bench" / "results"
SCORES = "teacher_test_scores.json"


def harvest(config: Path, out: Path, actors: int, sets: list[str]) -> tuple[float, int]:
    """Run (or resume) the harvest; returns its wall seconds and the pairs it scored (0, 0 when complete)."""
    if (out / "_COMPLETE").exists():
        return 0.0, 0
    before = pairs_committed(out)
    # pairs_per_unit is part of the run's fingerprint: keep it fixed so that a resumed run matches (the pairs
    # file's path was too, until 2026-11-24; runs from before were started with this relative path)
    pairs = os.path.relpath(STSB_TEST, ROOT)
    cmd = [sys.executable, "-m", "sentsim.cli", "harvest", "--config", str(config), "--pairs", pairs,
           "--out", str(out), "--executor", "ray", "--set", "pairs_per_unit=20", "--set", "scoring.torch_threads=1",
           "--set", f"resources.scoring.min_actors={actors}", "--set", f"resources.scoring.max_actors={actors}"]
    for s in sets:
        cmd += ["--set", s]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    if subprocess.call(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1")) != 0:
        raise SystemExit(f"teacher_test: harvest into {out} failed; run again to resume")
    return time.perf_counter() - t0, pairs_committed(out) - before


def stage_seconds(run: Path) -> dict:
    """Seconds per pair that each stage's actor spent, summed over the units' completion markers. A pool
    harvest (contexts.mode=pool) scores in its vectors run (`pool_vectors/`, units of sentences): its
    stages' seconds count too, shared over the pairs labelled."""
    total, pairs = {}, 0
    for units in (run / "_units", run / "pool_vectors" / "_units"):
        for f in sorted(units.glob("*.json")):
            extra = json.loads(f.read_text()).get("extra", {})
            pairs += extra.get("pairs", 0) if units.parent == run else 0
            for stage, s in extra.get("timing", {}).items():
                total[stage] = total.get(stage, 0.0) + s
    return {k: v / max(pairs, 1) for k, v in total.items()}


def tfidf(s1: list[str], s2: list[str], test: list[tuple]) -> np.ndarray:
    """TF-IDF cosine of each pair, IDF fitted on the unique sentences of all of STS-B test (as the STS suite's
    TF-IDF row is, bench/sts_suite.py), so both TF-IDF columns share one vocabulary."""
    from types import SimpleNamespace

    from sentsim.evaluation import TfidfScorer

    tf = TfidfScorer()
    tf.begin_task(SimpleNamespace(sets=[SimpleNamespace(s1=[p[0] for p in test], s2=[p[1] for p in test])]))
    return np.asarray(tf.score_pairs(s1, s2), dtype=float)


def evaluate(run: Path, label: str, cost: dict, harvest_run: Path | None = None) -> dict:
    """One row: the pair scores in `run` (the harvest, or a remix of `harvest_run` to another metric)."""
    from sentsim.pairs_file import read_pairs_file
    from storage.reader import RunReader

    harvest_run = harvest_run or run
    everything = read_pairs_file(str(STSB_TEST))
    reader = RunReader(str(run))
    contexts = reader.manifest["config"].get("contexts", {})
    report = harvest_run / "report.json"
    items = json.loads(report.read_text()).get("scored_items_per_pair") if report.exists() else None
    t = reader.read_table("pairs", ["pair_id", "s1", "s2", "score", "gold", "null_reason", "n_ctx_s1", "n_ctx_s2"],
                          numeric=["score", "gold", "n_ctx_s1", "n_ctx_s2"]).to_pandas()
    origin = t.score.to_numpy(dtype=float)
    gold = t.gold.to_numpy(dtype=float)
    ok = np.isfinite(origin)
    base = tfidf(t.s1.tolist(), t.s2.tolist(), everything)
    base_all = tfidf([p[0] for p in everything], [p[1] for p in everything], everything)
    o, b = bootstrap(origin, gold), bootstrap(base[ok], gold[ok])
    a = bootstrap(base_all, np.array([p[2] for p in everything], dtype=float))
    d = paired_bootstrap(origin[ok], base[ok], gold[ok])
    reasons = t.null_reason[~ok].value_counts().to_dict()
    # a pool run's n_ctx columns count each sentence's scored pool contexts; the pair compares over |P|
    per_pair = (float(contexts["pool_size"]) if contexts.get("mode") == "pool"
                else float((t.n_ctx_s1 + t.n_ctx_s2)[ok].mean()))
    kept = [[int(i), float(x), float(g)] for i, x, g in zip(t.pair_id, origin, gold) if x == x]
    return {"scores": kept, "label": label, "config": os.path.relpath(str(cost.get("config")), ROOT),
            "file_pairs": len(everything),
            "harvest_pairs": len(t),
            "scored": int(ok.sum()), "null_reasons": reasons,
            "contexts_per_pair": per_pair, "items_per_pair": items,
            "metric": reader.manifest["config"].get("metric"),
            "origin": o[:3], "tfidf_same_pairs": b[:3], "tfidf_all_pairs": a[:3], "difference": list(d),
            "wall_s": cost.get("wall_s"), "wall_pairs": cost.get("pairs"),
            "stage_s_per_pair": stage_seconds(harvest_run)}


def compare(results: Path, a: str, b: str) -> int:
    """The paired difference of two rows' Spearman (a - b) on the pairs both scored, from the kept scores."""
    kept = json.loads((results / SCORES).read_text()) if (results / SCORES).exists() else {}
    missing = [x for x in (a, b) if x not in kept]
    if missing:
        raise SystemExit(f"teacher_test: no kept scores for {', '.join(missing)} in {results / SCORES}")
    sa, sb = ({int(i): (x, g) for i, x, g in kept[k]} for k in (a, b))
    both = sorted(set(sa) & set(sb))
    x, y = (np.array([s[i][0] for i in both]) for s in (sa, sb))
    print_paired(a, b, x, y, np.array([sa[i][1] for i in both]))
    return 0


def write(rows: list[dict], results: Path) -> None:
    f = lambda x: f"{x[0]:.2f} [{x[1]:.1f}, {x[2]:.1f}]"  # noqa: E731
    lines = [f"Machine: {machine()}", "",
             f"All of STS-B test ({STSB_TEST.name}). Spearman x 100 [95% bootstrap interval]; the difference is a "
             "paired bootstrap over the pairs Origin scored.", "",
             "| teacher | config | pairs scored | contexts per pair | items per pair | Origin | TF-IDF, same pairs "
             "| Origin - TF-IDF "
             "| TF-IDF, all pairs | wall s per pair | actor s per pair (contexts / scoring) |",
             "|---|---|---:|---:|---:|---|---|---|---|---:|---|"]
    for r in rows:
        d = r["difference"]
        wall = f"{r['wall_s'] / r['wall_pairs']:.2f}" if r.get("wall_pairs") else "-"
        st = r["stage_s_per_pair"]
        items = f"{r['items_per_pair']:.1f}" if r.get("items_per_pair") else "-"
        lines.append(f"| {r['label']} | `{Path(r['config']).name}` | {r['scored']}/{r['file_pairs']} | "
                     f"{r['contexts_per_pair']:.1f} | {items} | **{f(r['origin'])}** | {f(r['tfidf_same_pairs'])} | "
                     f"{d[0]:+.2f} [{d[1]:+.1f}, {d[2]:+.1f}] | {f(r['tfidf_all_pairs'])} | {wall} | "
                     f"{st.get('contexts', 0):.2f} / {st.get('scoring', 0):.2f} |")
    (results / "teacher_test.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", help="name of this teacher run (its folder under SENTSIM_CACHE/test)")
    ap.add_argument("--config", default=str(ROOT / "configs" / "teacher.yaml"))
    ap.add_argument("--actors", type=int, default=2,
                    help="scoring actors (one torch thread each)")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--remix", default="", metavar="METRIC,...",
                    help="more rows from the same pool vectors by other Eq. 4 metrics (e.g. double-centred)")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--compare", nargs=2, metavar="NAME",
                    help="paired bootstrap of two rows' difference (NAME_A - NAME_B) on the pairs both scored")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(Path(args.results), *args.compare)
    if not args.label:
        ap.error("--label is needed to run a teacher (or give --compare)")
    if not STSB_TEST.is_file():
        raise SystemExit(f"teacher_test: {STSB_TEST} not found (../shared beside the repository)")
    work = user_cache() / "test"
    work.mkdir(parents=True, exist_ok=True)
    run = work / args.label
    cost_file = run.with_suffix(".cost")
    cost = json.loads(cost_file.read_text()) if cost_file.exists() else {}
    wall, scored = harvest(Path(args.config), run, args.actors, args.sets)
    if scored:  # wall seconds and pairs add up over the runs of a resumed harvest
        cost = {"config": args.config, "wall_s": cost.get("wall_s", 0.0) + wall,
                "pairs": cost.get("pairs", 0) + scored}
        cost_file.write_text(json.dumps(cost))
    cost.setdefault("config", args.config)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    store = results / "teacher_test.json"
    remixes = [m.strip() for m in args.remix.split(",") if m.strip()]
    labels = {args.label, *(f"{args.label}/{m}" for m in remixes)}
    rows = [r for r in (json.loads(store.read_text()) if store.exists() else []) if r["label"] not in labels]
    rows.append(evaluate(run, args.label, cost))
    for metric in remixes:
        remixed = run.with_name(f"{run.name}-{metric}")
        remix_metric(run, remixed, metric)
        rows.append(evaluate(remixed, f"{args.label}/{metric}", cost, harvest_run=run))
    kept = json.loads((results / SCORES).read_text()) if (results / SCORES).exists() else {}
    kept.update({r["label"]: r.pop("scores") for r in rows if "scores" in r})
    (results / SCORES).write_text(json.dumps(kept) + "\n")
    store.write_text(json.dumps(rows, indent=1, default=float) + "\n")
    write(rows, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
