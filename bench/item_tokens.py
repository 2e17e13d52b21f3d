"""How long the items of two harvests are: why a pool item costs more CPU than a per-pair one (issue 47).

    .venv/bin/python bench/item_tokens.py --per-pair RUN --pool RUN [--sample 4000]

An item is one sentence scored in one context in every Eq. 3 direction, so its cost grows with the tokens of
the sentence and of the context's two sides. For a per-pair harvest (its `context_scores` table: every item it
scored, less the null rows of the items it left out) and a pool harvest (its vectors run's `pool` side table
and scored sentences), this counts the context model's tokens an item, beside windows drawn at random from the
same corpus (`--sample` of them, seed 0), the expectation of a random pool. Both runs must be of one corpus
and one context model; the corpus and the model are read from the per-pair run's manifest. Results:
bench/results/item_tokens.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import machine  # noqa: E402


def run_inputs(run: Path) -> tuple[str, str, int]:
    """The corpus, the first context model and its window (sentences a side) of a harvest run."""
    from sentsim.config import expand_path
    from sentsim.context.bundle_meta import read_bundle_meta

    config = json.loads((run / "manifest.json").read_text())["config"]
    corpus, model = expand_path(config["corpus"]), expand_path(config["context_models"][0])
    window = int(read_bundle_meta(model).get("model_config", {}).get("context_sentences", 1))
    return corpus, model, window


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-pair", type=Path, required=True, help="a per-pair harvest run")
    ap.add_argument("--pool", type=Path, required=True, help="a pool harvest run (contexts.mode=pool)")
    ap.add_argument("--sample", type=int, default=4000)
    args = ap.parse_args(argv)

    from corpus.view import CorpusIndex
    from sentsim.context.tokenizer import ContextTokenizer
    from sentsim.harvest.pool import POOL_TABLE
    from storage.reader import RunReader

    corpus_path, model, window = run_inputs(args.per_pair)
    tok = ContextTokenizer.load(model)
    corpus = CorpusIndex(corpus_path)

    def ntok(texts) -> np.ndarray:
        return np.array([len(ids) for ids in tok.encode([t or "" for t in texts])])

    def window_tokens(ids) -> np.ndarray:
        sides = [corpus.window(int(i), window) for i in ids]
        return ntok([" ".join(left + right) for left, right in sides])

    scores = RunReader(str(args.per_pair)).read_table("context_scores", ["sentence_id", "context_id", "S"])
    # a row with a null S is an item Eq. 4 left out unscored (a partner's window holding the sentence)
    scores = scores.filter(scores.column("S").is_valid())
    ctx, sent = scores.column("context_id").to_numpy(), scores.column("sentence_id").to_numpy()
    uc, ci = np.unique(ctx, return_inverse=True)
    us, si = np.unique(sent, return_inverse=True)
    per_pair = {"items": int(len(ctx)), "context_tokens": float(window_tokens(uc)[ci].mean()),
                "sentence_tokens": float(ntok(corpus.texts(us))[si].mean())}

    vectors = RunReader(str(args.pool / "pool_vectors"))
    pool = vectors.side_table(POOL_TABLE)
    if pool is None:
        raise SystemExit(f"item_tokens: {args.pool} has no pool side table; is it a contexts.mode=pool harvest?")
    sides = [" ".join(left + right) for left, right in zip(pool.column("left").to_pylist(),
                                                            pool.column("right").to_pylist())]
    texts = vectors.read_table("sentence_vectors", ["text"])
    pooled = {"contexts": len(sides), "context_tokens": float(ntok(sides).mean()),
              "sentence_tokens": float(ntok(texts.column("text").to_pylist()).mean())}

    rng = np.random.default_rng(0)
    drawn = rng.choice(corpus.ids, size=min(args.sample, len(corpus.ids)), replace=False)
    w = window_tokens(drawn)
    random = {"windows": int(len(drawn)), "context_tokens": float(w.mean()),
              "sd_of_a_pool_mean": float(w.std() / np.sqrt(max(pooled["contexts"], 1))),
              "sentence_tokens": float(ntok(corpus.texts(drawn)).mean())}

    def item(r):
        return r["context_tokens"] + r["sentence_tokens"]

    out = {"machine": machine(), "per_pair_run": str(args.per_pair), "pool_run": str(args.pool), "model": model,
           "window": window, "per_pair": per_pair, "pool": pooled, "random_windows": random,
           "pool_over_per_pair": item(pooled) / item(per_pair), "random_over_per_pair": item(random) / item(per_pair)}
    for name in ("per_pair", "pool", "random_windows"):
        r = out[name]
        print(f"{name:>15}: context {r['context_tokens']:.1f} + sentence {r['sentence_tokens']:.1f} tokens an item")
    print(f"tokens an item, pool / per-pair: {out['pool_over_per_pair']:.2f}x; "
          f"random windows / per-pair: {out['random_over_per_pair']:.2f}x "
          f"(a pool of {pooled['contexts']} random windows: context mean +- {random['sd_of_a_pool_mean']:.1f})")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "item_tokens.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
