"""Eq. 3's λ mix over a labelled `--pairs` harvest: Spearman x 100 vs gold for several mixes.

    .venv/bin/python bench/lambda_mix.py HARVEST_DIR [--mix [DISC,]FWD,LEFT,RIGHT ...] [--out FILE.md]

Each mix is a `sentsim remix` of the harvest into a temporary run, so the numbers are exactly what
`sentsim remix` and a re-scored harvest give. A mix of three weighs fwd, left and right and keeps the
harvest's discriminator weight; a mix of four weighs the discriminator term too (003 §3.3's λ1: the
harvest must have scored it, i.e. screened with a discriminator and λ_disc > 0). Every mix after the
first is also compared with the first on the same pairs (paired bootstrap, 2,000 resamples).
Use it on a dev set to choose λ, then report the chosen mix on the test set.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import paired_bootstrap  # noqa: E402

from sentsim.errors import UsageError  # noqa: E402
from sentsim.harvest.remix import RemixConfig, remix  # noqa: E402

DEFAULT_MIXES = [(1, 1, 1), (0, 1, 1), (0.25, 1, 1), (0.5, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1)]


def parse_mix(text: str) -> tuple[float, ...]:
    try:
        mix = tuple(float(x) for x in text.split(","))
    except ValueError:
        mix = ()
    if len(mix) not in (3, 4) or min(mix) < 0:
        raise SystemExit(f"lambda_mix: --mix {text!r}: give FWD,LEFT,RIGHT or DISC,FWD,LEFT,RIGHT (weights >= 0)")
    return mix


def scores_of(run: str) -> dict:
    """pair_id -> (score, gold) of a run's pairs that have both."""
    from storage.reader import RunReader

    t = RunReader(run).read_table("pairs", columns=["pair_id", "score", "gold"], numeric=["score", "gold"]).to_pandas()
    return {p: (s, g) for p, s, g in zip(t.pair_id, t.score, t.gold) if s == s and g == g}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("harvest")
    ap.add_argument("--mix", action="append", default=[], metavar="[DISC,]FWD,LEFT,RIGHT",
                    help="λ for the fwd, left and right terms, or for disc, fwd, left and right (repeatable; "
                         "default: a set of ablations)")
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    mixes = [parse_mix(m) for m in args.mix] or DEFAULT_MIXES
    lines = ["| λ disc, fwd, left, right | Spearman x 100 vs gold | against the first mix [95%] | pairs "
             "| approximate |", "|---|---:|---|---:|---:|"]
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, mix in enumerate(mixes):
            disc, (f, left, right) = (mix[0], mix[1:]) if len(mix) == 4 else (None, mix)
            try:  # e.g. a mix that weighs a term the harvest did not score (its λ was 0, or no discriminator)
                m = remix(RemixConfig(source=args.harvest, out=f"{tmp}/{i}", lambda_disc=disc, lambda_fwd=f,
                                      lambda_left=left, lambda_right=right), quiet=True)["remix"]
            except UsageError as e:
                sys.exit(f"lambda_mix: {e}")
            if "remix_spearman_vs_gold" not in m:
                sys.exit(f"{args.harvest}: mix {mix} has no Spearman vs gold: fewer than two pairs with both a score "
                         "and a gold label (use a --pairs harvest of a labelled set), or its scores or the gold "
                         "all the same")
            scores = scores_of(f"{tmp}/{i}")
            against = ""
            if first is None:
                first = scores
            else:
                both = sorted(set(first) & set(scores))
                a, b, g = (np.array([d[p][k] for p in both], dtype=float)
                           for d, k in ((scores, 0), (first, 0), (scores, 1)))
                d, lo, hi = paired_bootstrap(a, b, g)
                against = f"{d:+.2f} [{lo:+.1f}, {hi:+.1f}]"
            name = ", ".join("kept" if w is None else f"{w:g}" for w in (disc, f, left, right))
            lines.append(f"| {name} | {m['remix_spearman_vs_gold']:.2f} | {against} | {m['gold_pairs']} | "
                         f"{m['approximate']} |")
    text = f"{args.harvest}\n\n" + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
