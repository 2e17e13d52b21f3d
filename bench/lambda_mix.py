"""Eq. 3's λ mix over a labelled `--pairs` harvest: Spearman x 100 vs gold for several mixes.

    .venv/bin/python bench/lambda_mix.py HARVEST_DIR [--mix fwd,left,right ...] [--out FILE.md]

Each mix is a `sentsim remix` of the harvest (the discriminator term keeps its weight) into a
temporary run, so the numbers are exactly what `sentsim remix` and a re-scored harvest give.
Use it on a dev set to choose λ, then report the chosen mix on the test set.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentsim.errors import UsageError  # noqa: E402
from sentsim.harvest.remix import RemixConfig, remix  # noqa: E402

DEFAULT_MIXES = [(1, 1, 1), (0, 1, 1), (0.25, 1, 1), (0.5, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("harvest")
    ap.add_argument("--mix", action="append", default=[], metavar="FWD,LEFT,RIGHT",
                    help="λ for the fwd, left and right terms (repeatable; default: a set of ablations)")
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    mixes = [tuple(float(x) for x in m.split(",")) for m in args.mix] or DEFAULT_MIXES
    lines = ["| λ fwd, left, right | Spearman x 100 vs gold | pairs | approximate |", "|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (f, left, right) in enumerate(mixes):
            try:  # e.g. a mix that weighs a direction the harvest did not score (its λ was 0)
                m = remix(RemixConfig(source=args.harvest, out=f"{tmp}/{i}", lambda_fwd=f, lambda_left=left,
                                      lambda_right=right), quiet=True)["remix"]
            except UsageError as e:
                sys.exit(f"lambda_mix: {e}")
            if "remix_spearman_vs_gold" not in m:
                sys.exit(f"{args.harvest}: no pairs with both a score and a gold label "
                         "(use a --pairs harvest of a labelled set)")
            lines.append(f"| {f:g}, {left:g}, {right:g} | {m['remix_spearman_vs_gold']:.2f} | {m['gold_pairs']} | "
                         f"{m['approximate']} |")
    text = f"{args.harvest}\n\n" + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
