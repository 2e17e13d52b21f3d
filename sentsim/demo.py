"""`make demo`: the whole chain on the bundled sample corpus, with small models, on a laptop CPU.

corpus -> index -> discriminator -> context models -> harvest -> report. Each step is the same
entry point a user calls (`sentsim ...`); the demo only chains them and keeps every model tiny.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sentsim.cli import main as sentsim

SAMPLE = Path(__file__).resolve().parent.parent / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"


def step(title: str, argv: list[str]) -> None:
    print(f"\n$ sentsim {' '.join(argv)}", flush=True)
    t0 = time.time()
    rc = sentsim(argv)
    if rc != 0:
        print(f"demo: step '{title}' failed with exit code {rc}", file=sys.stderr)
        sys.exit(rc)
    print(f"  ({title}: {time.time() - t0:.1f}s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="demo_out")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    corpus, index, disc, ctx, harvest = (str(out / n) for n in ("corpus", "index", "discriminator", "context", "harvest"))
    step("corpus", ["corpus", "build", str(SAMPLE), "--out", corpus, "--set", "docs_per_unit=4"])
    step("verify", ["store", "verify", corpus])
    step("index", ["index", "build", "--corpus", corpus, "--out", index])
    step("discriminator", ["train", "discriminator", "--corpus", corpus, "--out", disc,
                           "--set", "train.max_steps=150", "--set", "model.embed_dim=64", "--set", "model.hidden=64"])
    step("context models", ["train", "context", "--corpus", corpus, "--out", ctx, "--direction", "all",
                            "--set", "max_steps=150", "--set", "model.vocab_size=2000", "--set", "model.d_model=64",
                            "--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1",
                            "--set", "model.ffn_dim=128", "--set", "eval_every=150", "--set", "warmup_steps=20",
                            "--set", "heldout_percent=15", "--set", "heldout_windows=64"])
    step("harvest", ["harvest", "--corpus", corpus, "--index", index, "--discriminator", disc,
                     "--context-models", ctx, "--out", harvest,
                     "--set", "anchors.n=24", "--set", "anchors.per_unit=4", "--set", "contexts.size=16",
                     "--set", "contexts.retrieve_chunks=300", "--set", "rank.n_anchors=1000"])
    rep = json.loads((out / "harvest" / "report.json").read_text())
    print(f"\nreport.json: {rep['pairs']} pairs, {rep['null_scores']} null, "
          f"{rep['scored_items']:,} (sentence, context) items scored, "
          f"rank codes {rep['bytes_per_sentence_rank_codes']:,} bytes/sentence")
    for split, st in rep["score"].items():
        if st["n"]:
            print(f"  {split:<5} n={st['n']:<4} mean={st['mean']:+.3f} std={st['std']:.3f} range [{st['min']:+.3f}, {st['max']:+.3f}]")
    print(f"  spearman(score, rank_sim) = {rep['spearman_score_vs_rank_sim']:+.3f}")
    import pyarrow.dataset as ds

    t = ds.dataset(str(out / "harvest" / "pairs")).to_table().to_pandas().sort_values("score")
    show = t[t.score.notna()]
    print("\nleast and most similar harvested pairs:")
    for _, r in list(show.head(2).iterrows()) + list(show.tail(2).iterrows()):
        print(f"  {r.score:+.3f}  [{r.kind}] {r.s1[:60]!r} ~ {r.s2[:60]!r}")
    print(f"\nplots: {out / 'harvest' / 'report.png'}")


if __name__ == "__main__":
    main()
