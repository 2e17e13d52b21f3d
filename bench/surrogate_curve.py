"""Surrogates distilled from the chosen teacher, against the number of harvested pairs (issue 15, step 6).

    python bench/surrogate_curve.py harvest --label NAME --anchors N [--minutes M] [--set KEY=VALUE ...]
    python bench/surrogate_curve.py snapshot --label NAME
    python bench/surrogate_curve.py train --run NAME[@PAIRS] --init scratch|pretrained [--epochs 4] [--tag T]
    python bench/surrogate_curve.py report --teacher TEST_RUN
    python bench/surrogate_curve.py compare MODEL_A MODEL_B

harvest: a real corpus-mode `sentsim harvest --config configs/teacher.yaml` on a local Ray (one contexts actor, two
  scoring actors of one torch thread), into SENTSIM_CACHE/surrogate/NAME: N anchors sampled from the reference corpus,
  5 partners each (2 retrieved neighbours, 1 from the same document, 2 random: the harvest's defaults), split
  80/10/10 so that a small harvest keeps held-out pairs. It stops at M minutes (SIGTERM, then Ray shuts down) and
  resumes where it stopped when run again; wall seconds and pairs add up in NAME.cost, with the scored items of
  the finished run's report.json (the scoring budget that two harvests are compared at). Any --set goes to the
  harvest: `--set contexts.mode=pool --set contexts.pool_size=64 --set partners.cluster_size=32` is a pool harvest.
snapshot: NAME@PAIRS, a hard-linked copy of the units committed so far (the harvest must be stopped), so that one
  harvest gives the surrogates of the curve their nested training sets.
train: `sentsim train surrogate --data RUN --init INIT --loss LOSS --epochs E` into RUN-INIT[-TAG] (LOSS cosent
  unless --loss says; from scratch: a 4x256 BERT with MiniLM's tokenizer and lr 5e-4; pretrained:
  all-MiniLM-L6-v2 at 2e-5), 1 Ray Train worker.
  TAG tells apart two trainings of one harvest (other epochs, so that two harvests meet at equal training steps);
  --set KEY=VALUE goes to the surrogate config (max_steps=N caps the steps: the trainer reads the harvest's shards
  in a seeded order and shuffles within shuffle_buffer rows, so a capped run sees whole shards drawn at random;
  a shuffle_buffer above the train pairs makes it a uniform draw of pairs).
report: for every trained surrogate and the two untrained starts, Spearman x 100 on all of STS-B test against gold
  (95% bootstrap interval) and against the teacher's scores on the pairs the teacher scored (TEST_RUN: a
  bench/teacher_test.py run of the same config), with the harvest's own held-out test split before and after
  training. Results: bench/results/surrogate_curve.{json,md}; every model's STS-B test scores go to
  bench/results/surrogate_curve_scores.json.
compare: two rows of the last report (their model names), paired: the bootstrap of A's Spearman minus B's on
  STS-B test (the same resampled pairs for both).
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import bootstrap, machine, print_paired  # noqa: E402
from teacher_curve import pairs_committed  # noqa: E402

from sentsim.config import user_cache  # noqa: E402

STSB_TEST = ROOT.parent / "shared" / "data" / "sts" / "stsbenchmark" / "sts-test.csv"
RESULTS = ROOT / "bench" / "results"
INITS = {"scratch": ["--init", "scratch", "--set", "lr=5e-4"], "pretrained": ["--init", "pretrained"]}


def work() -> Path:
    w = user_cache() / "surrogate"
    w.mkdir(parents=True, exist_ok=True)
    return w


def with_budget(run: Path, cost: dict) -> dict:
    """The cost record with the finished harvest's scored items (a stopped run has no report.json yet)."""
    report_file = run / "report.json"
    if (run / "_COMPLETE").exists() and report_file.exists():
        rep = json.loads(report_file.read_text())
        cost = dict(cost, scored_items=rep.get("scored_items"), labelled_pairs=rep.get("pairs"))
    return cost


def run_harvest(args) -> int:
    run = work() / args.label
    cost_file = run.with_suffix(".cost")
    cost = json.loads(cost_file.read_text()) if cost_file.exists() else {"wall_s": 0.0, "pairs": 0}
    if (run / "_COMPLETE").exists():
        print(f"{run}: complete, {pairs_committed(run)} pairs")
        cost_file.write_text(json.dumps(with_budget(run, cost)))
        return 0
    before = pairs_committed(run)
    cmd = ["timeout", "--signal=TERM", "--kill-after=120", str(int(args.minutes * 60)),
           sys.executable, "-m", "sentsim.cli", "harvest", "--config", str(ROOT / "configs" / "teacher.yaml"),
           "--out", str(run), "--executor", "ray", "--set", f"anchors.n={args.anchors}",
           "--set", "anchors.per_unit=4", "--set", "splits=[0.8,0.1,0.1]", "--set", "scoring.torch_threads=1",
           "--set", "resources.scoring.min_actors=2", "--set", "resources.scoring.max_actors=2"]
    for s in args.sets:
        cmd += ["--set", s]
    print("$", " ".join(cmd[6:]), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    if rc not in (0, 124):  # 124: stopped at the deadline, resumable
        raise SystemExit(f"surrogate_curve: harvest into {run} failed (exit {rc}); run again to resume")
    scored = pairs_committed(run) - before
    cost = {"wall_s": cost["wall_s"] + wall, "pairs": cost["pairs"] + scored, "sets": args.sets,
            "anchors": args.anchors}
    cost_file.write_text(json.dumps(with_budget(run, cost)))
    print(f"{run}: +{scored} pairs in {wall:.0f}s ({'stopped at the deadline' if rc == 124 else 'complete'}); "
          f"{cost['pairs']} pairs in {cost['wall_s']:.0f}s over all runs")
    return 0


def snapshot(args) -> int:
    run = work() / args.label
    n = pairs_committed(run)
    dest = work() / f"{args.label}@{n}"
    if dest.exists():
        print(f"{dest} exists")
        return 0
    subprocess.check_call(["cp", "-al", str(run), str(dest)])  # shards are never rewritten in place
    print(f"{dest}: {n} pairs")
    return 0


def train(args) -> int:
    run = work() / args.run
    out = Path(f"{run}-{args.init}" + (f"-{args.tag}" if args.tag else ""))
    cmd = [sys.executable, "-m", "sentsim.cli", "train", "surrogate", "--data", str(run), "--out", str(out),
           "--loss", args.loss, "--epochs", str(args.epochs), *INITS[args.init]]
    for kv in args.sets:
        cmd += ["--set", kv]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    if subprocess.call(cmd, cwd=ROOT) != 0:
        raise SystemExit(f"surrogate_curve: training {out} failed; run again to resume")
    (out / "bench.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0, "epochs": args.epochs,
                                                "init": args.init, "harvest": args.run.split("@")[0],
                                                "loss": args.loss,
                                                "sets": args.sets}))
    return 0


def bench_record(out: Path) -> dict:
    """What `train` recorded beside a surrogate (wall seconds, epochs, init): {} for one trained otherwise."""
    f = out / "bench.json"
    return json.loads(f.read_text()) if f.exists() else {}


def untrained_scratch() -> Path:
    """The scratch surrogates' start: the same seeded random 4x256 BERT, exported as they are."""
    from sentsim.rank.targets import default_base_encoder
    from sentsim.surrogate.config import SurrogateConfig
    from sentsim.training.encoder_models import build_model, export_model, save_hf

    out = work() / "scratch-untrained"
    if not (out / "modules.json").exists():
        cfg = SurrogateConfig()
        model, tok = build_model("siamese", default_base_encoder(), "scratch", cfg.scratch.model_dump(), cfg.seed)
        save_hf(model, tok, work() / "scratch-untrained-hf")
        export_model(work() / "scratch-untrained-hf", out, "siamese", cfg.max_seq_length)
    return out


def report(args) -> int:
    from scipy.stats import spearmanr

    from sentsim.evaluation import load_model_scorer
    from sentsim.evaluation.datasets import load_stsb
    from sentsim.rank.targets import default_base_encoder
    from storage.reader import RunReader

    test = load_stsb(STSB_TEST, "STSb-test").sets[0]
    gold = np.asarray(test.gold, dtype=float)
    t = RunReader(str(args.teacher)).read_table("pairs", ["s1", "s2", "score"], numeric=["score"]).to_pandas()
    lookup = {(a.strip(), b.strip()): v for a, b, v in zip(t.s1, t.s2, t.score) if v == v}
    teacher = np.array([lookup.get((a.strip(), b.strip()), np.nan) for a, b in zip(test.s1, test.s2)])
    ok = np.isfinite(teacher)
    kept = {"gold": gold.tolist(), "models": {"Origin teacher": np.where(ok, teacher, None).tolist()}}
    models = [("all-MiniLM-L6-v2 (untrained start)", "pretrained", 0, None, default_base_encoder()),
              ("random 4x256 BERT (untrained start)", "scratch", 0, None, untrained_scratch())]
    for out in sorted(work().iterdir()):
        if (out / "summary.json").exists():
            stage = json.loads((out / "summary.json").read_text())["stages"][0]
            init = bench_record(out).get("init") or out.name.rsplit("-", 1)[1]  # older trainings: NAME-INIT
            models.append((out.name, init, stage["train_pairs"], out, stage["model"]))
    rows = [{"model": "Origin teacher", "train_pairs": None, "vs_gold": bootstrap(teacher, gold)[:3],
             "vs_teacher": 100.0, "pairs": int(ok.sum())}]
    for label, init, n, out, path in models:
        pred = np.asarray(load_model_scorer(str(path), 128, "cpu").score_pairs(list(test.s1), list(test.s2)))
        kept["models"][label] = pred.tolist()
        row = {"model": label, "init": init, "train_pairs": n, "vs_gold": bootstrap(pred, gold)[:3],
               "vs_teacher": float(spearmanr(pred[ok], teacher[ok]).statistic * 100)}
        if out is not None:
            stage = json.loads((out / "summary.json").read_text())["stages"][0]
            row["split_test"] = [stage["first"].get("test_spearman"), stage["last"].get("test_spearman")]
            row["split_dev"] = [stage["first"].get("dev_spearman"), stage["last"].get("dev_spearman")]
            bench = bench_record(out)
            row.update(train_s=bench.get("wall_s"), epochs=bench.get("epochs"), steps=stage.get("total_steps"))
        rows.append(row)
        print(row, flush=True)
    harvests = {p.stem: json.loads(p.read_text()) for p in sorted(work().glob("*.cost"))}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "surrogate_curve.json").write_text(json.dumps({"machine": machine(), "teacher": str(args.teacher),
                                                              "harvests": harvests, "rows": rows}, indent=1) + "\n")
    f = lambda x: f"{x[0]:.2f} [{x[1]:.1f}, {x[2]:.1f}]"  # noqa: E731
    g = lambda x: f"{x[0]:.1f} -> {x[1]:.1f}" if x and None not in x else "-"  # noqa: E731
    steps = lambda r: f"{r['steps']} ({r['epochs']})" if r.get("steps") else "-"  # noqa: E731
    lines = [f"Machine: {machine()}", "",
             f"Teacher: `{Path(args.teacher).name}` ({int(ok.sum())} of {len(gold)} STS-B test pairs scored). "
             "Spearman x 100 on all of STS-B test [95% bootstrap interval]; against the teacher on the pairs it "
             "scored; on the harvest's own held-out splits against the teacher, before -> after training.", "",
             "| model | train pairs | steps (epochs) | STS-B test vs gold | vs teacher | harvest dev split "
             "| harvest test split | training s |", "|---|---:|---:|---|---:|---|---|---:|"]
    for r in rows:
        s = f"{r['train_s']:.0f}" if r.get("train_s") else "-"
        lines.append(f"| {r['model']} | {r['train_pairs'] if r['train_pairs'] is not None else '-'} | "
                     f"{steps(r)} | {f(r['vs_gold'])} | {r['vs_teacher']:.2f} | "
                     f"{g(r.get('split_dev'))} | {g(r.get('split_test'))} | {s} |")
    for name, c in harvests.items():
        items = (f", {c['scored_items']:,} scored items ({c['scored_items'] / max(c['pairs'], 1):.2f} a pair)"
                 if c.get("scored_items") else "")
        lines.append(f"\nHarvest {name}: {c['pairs']} pairs in {c['wall_s']:.0f} s of wall "
                     f"({c['wall_s'] / max(c['pairs'], 1):.2f} s a pair){items}, settings {c.get('sets')}")
    (RESULTS / "surrogate_curve.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "surrogate_curve_scores.json").write_text(json.dumps(kept) + "\n")
    print("\n".join(lines))
    return 0


def compare(args) -> int:
    kept = json.loads((RESULTS / "surrogate_curve_scores.json").read_text())
    missing = [m for m in (args.a, args.b) if m not in kept["models"]]
    if missing:
        print(f"surrogate_curve: no model {missing[0]!r} in the last report; it has: {', '.join(kept['models'])}",
              file=sys.stderr)
        return 2
    a, b = (np.array(kept["models"][m], dtype=float) for m in (args.a, args.b))
    gold = np.array(kept["gold"], dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    print_paired(args.a, args.b, a[ok], b[ok], gold[ok])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("harvest")
    h.add_argument("--label", required=True)
    h.add_argument("--anchors", type=int, required=True)
    h.add_argument("--minutes", type=float, default=60.0)
    h.add_argument("--set", dest="sets", action="append", default=[])
    s = sub.add_parser("snapshot")
    s.add_argument("--label", required=True)
    t = sub.add_parser("train")
    t.add_argument("--run", required=True, help="NAME or NAME@PAIRS under SENTSIM_CACHE/surrogate")
    t.add_argument("--init", choices=sorted(INITS), required=True)
    t.add_argument("--epochs", type=int, default=4)
    t.add_argument("--loss", choices=["cosent", "cosine_regression"], default="cosent")
    t.add_argument("--tag", default="", help="a suffix for the output folder: two trainings of one harvest")
    t.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for the surrogate config")
    r = sub.add_parser("report")
    r.add_argument("--teacher", required=True, help="a bench/teacher_test.py run (SENTSIM_CACHE/test/LABEL)")
    c = sub.add_parser("compare")
    c.add_argument("a", help="a model of the last report (its name in the table)")
    c.add_argument("b")
    args = ap.parse_args(argv)
    return {"harvest": run_harvest, "snapshot": snapshot, "train": train, "report": report,
            "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
