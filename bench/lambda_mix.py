"""Eq. 3's λ mix re-derived from a harvest's stored per-direction context scores, without re-scoring.

    .venv/bin/python bench/lambda_mix.py HARVEST_DIR [--mix fwd,left,right ...]

For a `--pairs` harvest with gold labels (e.g. STS-B), recompute every pair's Eq. 4 similarity
under other weights for the fwd / left / right terms (003 Eq. 3; the discriminator term keeps its
weight) and report Spearman x 100 against gold. A pair's contexts are those both of its sentences
were scored in (C_s1 + C_s2, plus any shared with other pairs), so the default mix reproduces the
stored score closely but not always exactly; the script prints the largest difference.
Use it on a dev set to choose λ, not on the test set you report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentsim.harvest.similarity import pair_similarity  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("harvest")
    ap.add_argument("--mix", action="append", default=[], metavar="FWD,LEFT,RIGHT",
                    help="λ for the fwd, left and right terms (repeatable; default: a few ablations)")
    args = ap.parse_args()
    mixes = [tuple(float(x) for x in m.split(",")) for m in args.mix] or [(1, 1, 1), (0, 1, 1), (0.5, 1, 1), (1, 0, 0)]
    root = Path(args.harvest)
    pairs = ds.dataset(str(root / "pairs")).to_table(columns=["s1_id", "s2_id", "score", "gold"]).to_pandas()
    pairs = pairs.dropna(subset=["score", "gold"])
    if pairs.empty:
        sys.exit(f"{root}: no pairs with both a score and a gold label (use a --pairs harvest of a labelled set)")
    cs = ds.dataset(str(root / "context_scores")).to_table().to_pandas()
    # a sentence scored in several units has its rows repeated: one row per (sentence, context)
    by_sentence = {k: g.drop_duplicates("context_id").set_index("context_id") for k, g in cs.groupby("sentence_id")}
    sims = {m: [] for m in mixes}
    worst = 0.0
    for r in pairs.itertuples():
        a, b = by_sentence[r.s1_id], by_sentence[r.s2_id]
        common = a.index.intersection(b.index)
        a, b = a.loc[common], b.loc[common]
        worst = max(worst, abs(pair_similarity(a.S.to_numpy(), b.S.to_numpy()) - r.score))
        for m in mixes:
            va = m[0] * a.fwd + m[1] * a.left + m[2] * a.right + a.disc.fillna(0)
            vb = m[0] * b.fwd + m[1] * b.left + m[2] * b.right + b.disc.fillna(0)
            sims[m].append(pair_similarity(va.to_numpy(), vb.to_numpy()))
    print(f"{root}: {len(pairs)} scored pairs with gold; stored vs recomputed default score, max |diff| {worst:.3f}")
    print("| λ fwd, left, right | Spearman x 100 vs gold |\n|---|---:|")
    for m, v in sims.items():
        rho = spearmanr(np.asarray(v), pairs.gold.to_numpy(), nan_policy="omit").statistic * 100
        print(f"| {m[0]:g}, {m[1]:g}, {m[2]:g} | {rho:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
