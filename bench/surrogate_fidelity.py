"""How closely surrogates reproduce their Origin teacher on STS-B test, and what each costs per pair.

    .venv/bin/python bench/surrogate_fidelity.py --teacher TEACHER_HARVEST \
        --model "LABEL=PATH" [--model ...] [--data ../shared/data/sts] [--out bench/results/surrogate_fidelity.md]

TEACHER_HARVEST is a `sentsim harvest --pairs sts-test.csv` run: its `score` column is the Origin
similarity (003 Eq. 4) of every STS-B test pair. For each model (any folder `sentsim eval sts
--model` takes) the table gives, on the pairs the teacher scored:
  - Spearman x 100 against the gold labels (the STS-B figure) and against the teacher's scores
    (distillation fidelity: 100 would be a perfect copy of the teacher's order);
  - seconds per pair to score the whole test set from raw text, loading excluded, next to the
    teacher's harvest seconds per pair from its manifest/report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import machine  # noqa: E402


def rho(a, b) -> float:
    return float(spearmanr(a, b).statistic * 100)


def main() -> int:
    import pyarrow.dataset as ds

    from sentsim.evaluation import load_model_scorer
    from sentsim.evaluation.datasets import load_stsb

    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", required=True, help="harvest run of the STS-B test pairs (--pairs mode)")
    ap.add_argument("--model", action="append", default=[], metavar="LABEL=PATH")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "sts"))
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "surrogate_fidelity.md"))
    args = ap.parse_args()

    test = load_stsb(Path(args.data) / "stsbenchmark" / "sts-test.csv", "STSb-test").sets[0]
    teacher_dir = Path(args.teacher)
    t = ds.dataset(str(teacher_dir / "pairs")).to_table(columns=["s1", "s2", "score"]).to_pandas()
    lookup = {(a.strip(), b.strip()): v for a, b, v in zip(t.s1, t.s2, t.score) if v == v}
    teacher = np.array([lookup.get((a.strip(), b.strip()), np.nan) for a, b in zip(test.s1, test.s2)])
    ok = np.isfinite(teacher)
    gold = np.asarray(test.gold, dtype=float)
    report = json.loads((teacher_dir / "report.json").read_text()) if (teacher_dir / "report.json").is_file() else {}
    stage_s = sum((report.get("stage_seconds") or {}).values()) or None
    teacher_cost = stage_s / max(report.get("pairs", 0), 1) if stage_s else None

    rows = [{"model": "Origin teacher (harvest --pairs)", "pairs": int(ok.sum()),
             "vs_gold": rho(teacher[ok], gold[ok]), "vs_teacher": 100.0, "s_per_pair": teacher_cost}]
    for spec in args.model:
        label, path = spec.split("=", 1)
        scorer = load_model_scorer(path, args.batch_size, "cpu")
        t0 = time.perf_counter()
        pred = scorer.score_pairs(list(test.s1), list(test.s2))
        secs = time.perf_counter() - t0
        rows.append({"model": label, "path": path, "pairs": int(ok.sum()), "vs_gold": rho(pred[ok], gold[ok]),
                     "vs_gold_all": rho(pred, gold), "vs_teacher": rho(pred[ok], teacher[ok]),
                     "s_per_pair": secs / len(pred)})
        print(rows[-1], flush=True)

    lines = [f"Machine: {machine()}",
             f"Command: `{' '.join(sys.argv)}`", "",
             f"Teacher: {teacher_dir} ({int(ok.sum())} of {len(test.s1)} STS-B test pairs scored). Seconds per pair: "
             "the teacher's harvest stage seconds over its pairs; a model's wall time to score all test pairs from "
             "text (every unique sentence encoded once), loading excluded.", "",
             "| model | Spearman vs gold | Spearman vs teacher | seconds per pair |", "|---|---:|---:|---:|"]
    for r in rows:
        cost = f"{r['s_per_pair']:.4f}" if r["s_per_pair"] is not None else "n/a"
        lines.append(f"| {r['model']} | {r['vs_gold']:.2f} | {r['vs_teacher']:.2f} | {cost} |")
    md = "\n".join(lines) + "\n"
    print(md)
    Path(args.out).write_text(md, encoding="utf-8")
    Path(args.out).with_suffix(".json").write_text(json.dumps({"rows": rows, "machine": machine()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
