"""Quality of the Origin model (Eq. 3 + Eq. 4 through the harvest's `--pairs` mode) on STS-B test.

    .venv/bin/python bench/origin_quality.py --context-models DIR [DIR ...] --index DIR --corpus DIR \
        [--discriminator DIR] [--pairs 300] [--size 16]

Reports Spearman x 100 with a bootstrap 95% interval, in one run, for:
  - Origin (screened contexts, default metric),
  - the paper's random-context ablation at the same |C_s|,
  - the pair-independent control -(std v_s1 + std v_s2), from the same harvested context scores,
  - a TF-IDF cosine baseline on the same pairs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bootstrap, machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STSB = ROOT.parent / "shared" / "data" / "sts" / "stsbenchmark" / "sts-test.csv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context-models", nargs="+", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--discriminator")
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "origin_quality.md"))
    args = ap.parse_args()

    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.job import harvest
    from sentsim.pairs_file import read_pairs_file

    work = Path(tempfile.mkdtemp(prefix="sentsim-origin-"))
    pairs = read_pairs_file(str(STSB))
    rng = np.random.default_rng(0)
    pick = sorted(rng.choice(len(pairs), size=min(args.pairs, len(pairs)), replace=False))
    pf = work / "pairs.jsonl"
    pf.write_text("".join(json.dumps({"s1": pairs[i][0], "s2": pairs[i][1], "gold": pairs[i][2]}) + "\n"
                          for i in pick), encoding="utf-8")

    def run(mode):
        cfg = HarvestConfig.model_validate(dict(
            corpus=args.corpus, index=args.index, discriminator=args.discriminator if mode == "screened" else None,
            context_models=args.context_models, out=str(work / mode), pairs_file=str(pf), pairs_per_unit=25,
            contexts={"size": args.size, "retrieve_chunks": 2000, "mode": mode}, rank={"enabled": False}))
        t0 = time.time()
        harvest(cfg, executor="inline", quiet=True)
        t = ds.dataset(str(work / mode / "pairs")).to_table().to_pandas()
        return t, time.time() - t0

    rows = []
    origin, t_origin = run("screened")
    rand, t_rand = run("random")
    gold = origin.gold.to_numpy()
    rows.append(("Origin (screened C_s, pearson metric)",) + bootstrap(origin.score.to_numpy(dtype=float), gold))
    for d in ("fwd", "left", "right"):
        rows.append((f"  component: {d} direction only",) + bootstrap(origin[f"sim_{d}"].to_numpy(dtype=float), gold))
    rows.append(("Random-context ablation (same |C_s|)",)
                + bootstrap(rand.score.to_numpy(dtype=float), rand.gold.to_numpy()))
    # pair-independent control from the stored per-(sentence, context) scores
    cs = ds.dataset(str(work / "screened" / "context_scores")).to_table().to_pandas()
    by_s = cs.groupby("sentence_id").S.std()
    ctrl = np.array([-(by_s.get(a, np.nan) + by_s.get(b, np.nan)) for a, b in zip(origin.s1_id, origin.s2_id)])
    rows.append(("Control: -(std v_s1 + std v_s2)",) + bootstrap(ctrl, gold))
    from sentsim.evaluation import TfidfScorer

    tf = TfidfScorer()
    from types import SimpleNamespace

    tf.begin_task(SimpleNamespace(sets=[SimpleNamespace(s1=list(origin.s1), s2=list(origin.s2))]))
    rows.append(("TF-IDF cosine baseline",)
                + bootstrap(np.asarray(tf.score_pairs(list(origin.s1), list(origin.s2))), gold))
    gaps = []
    for m in args.context_models:  # the issue asks for the context models' context-use gap alongside
        runs = (json.loads((Path(m) / "context.json").read_text()).get("trained") or {}).get("runs") or {}
        for name, r in runs.items():
            ev = r.get("final_eval") or {}
            gaps.append(f"{Path(m).name}/{name}: " + ", ".join(f"{d} {e['context_gap']:+.3f}" for d, e in ev.items()))
    out = [f"Machine: {machine()}",
           f"Command: `{' '.join(sys.argv)}`: {len(origin)} STS-B test pairs (seeded sample), |C_s| = {args.size}, "
           f"Origin harvest {t_origin:.0f}s, random ablation {t_rand:.0f}s.",
           f"Context-use gap of the context models (nats/token, held-out): {'; '.join(gaps) or 'not recorded'}.", "",
           "| scorer | Spearman x 100 | 95% bootstrap interval | pairs scored |", "|---|---|---|---|"]
    for name, rho, lo, hi, n in rows:
        out.append(f"| {name} | {rho:.1f} | [{lo:.1f}, {hi:.1f}] | {n} |")
    report = "\n".join(out) + "\n"
    print(report)
    Path(args.out).write_text(report)
    (Path(args.out).with_suffix(".json")).write_text(
        json.dumps([dict(zip(("scorer", "spearman", "lo", "hi", "n"), r)) for r in rows], indent=1))


if __name__ == "__main__":
    main()
