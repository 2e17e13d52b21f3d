"""Held-out loss and context-use gap of every reference snapshot, on one fixed set of held-out windows.

    python bench/reference_curves.py [--cache ~/.cache/sentsim] [--windows 256] [--threads 1]

Each training run evaluates on the held-out windows its own code drew, and the stream fixes of
issue 15 changed which windows those are, so losses logged by different runs are not comparable.
This script scores every snapshot under CACHE/reference/snapshots*/tokens-N (and the warm start, at
0 tokens) on the same windows: the held-out documents of configs/reference_context.yaml
(`heldout_examples`, as the trainer draws them now), `--windows` per direction. Writes
bench/results/reference_curves.{json,md,png}: per snapshot and direction the held-out loss (nats per
target token) and the context-use gap (loss with sources shuffled across windows, minus the loss).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import machine, pyplot  # noqa: E402

DIRECTIONS = ["fwd", "left", "right"]


def snapshots(ref: Path) -> list[tuple[str, int, Path]]:
    """(stream, target tokens, folder) of every snapshot: stream is the folder's suffix (snapshots-corpus-order/
    holds the models of the old corpus-order stream, snapshots-enwiki/ those of `make reference`, trained on
    Wikipedia), "windows" for snapshots/, every corpus on the window stream (`--train-on all`; the results'
    snapshots-mixed/ rows were its models before 73c5abd)."""
    out = []
    for folder in sorted(ref.glob("snapshots*")):
        stream = folder.name.removeprefix("snapshots").lstrip("-") or "windows"
        for snap in folder.glob("tokens-*"):
            if (snap / "context.json").is_file():
                summary = json.loads((snap / "train_summary.json").read_text())
                tokens = sum(r["target_tokens_seen"] for r in summary["runs"].values())
                out.append((stream, tokens, snap))
    return sorted(out, key=lambda x: (x[0], x[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None, help="cache folder (default: SENTSIM_CACHE or ~/.cache/sentsim)")
    ap.add_argument("--windows", type=int, default=256, help="held-out windows per direction")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--redo", action="store_true", help="score again the snapshots already in the results json")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from sentsim.config import load_config, user_cache
    from sentsim.context.config import ContextTrainConfig
    from sentsim.context.model import build_model, load_bundle
    from sentsim.context.train import evaluate, heldout_examples
    from sentsim.identity import checkpoint_hash

    ref = (Path(args.cache).expanduser() if args.cache else user_cache()) / "reference"
    corpus = str(ref / "corpus")
    cfg = load_config(ContextTrainConfig, str(ROOT / "configs" / "reference_context.yaml"),
                      [f"heldout_windows={args.windows}"])
    found = snapshots(ref)
    if not found:
        raise SystemExit(f"reference_curves: no snapshots under {ref}/snapshots*/ (run `make reference`)")
    heldout: dict = {}  # per tokenizer: the same documents give the same windows
    results = Path(args.results)
    store = results / "reference_curves.json"
    # rows already scored on the same number of windows are kept (an evaluation is minutes on a CPU)
    rows = [] if args.redo or not store.is_file() else [
        r for r in json.loads(store.read_text()) if r.get("windows_asked", r["windows"]["fwd"]) == args.windows]
    # a row stands for the model it scored (the harvest's checkpoint_hash), not for a folder name: the cache
    # is rebuilt on a new machine, and a snapshot of the same name can hold another model (rows from
    # before the hash are never matched)
    done = {r.get("checkpoint_hash") for r in rows} - {None}

    def measure(name: str, stream: str, tokens: int, tok, model, model_id: Optional[str] = None) -> None:
        if tok.sha256 not in heldout:
            heldout[tok.sha256] = heldout_examples(corpus, tok, cfg, DIRECTIONS)
        t0 = time.perf_counter()
        ev = evaluate(model, heldout[tok.sha256], tok, cfg.batch_tokens)
        rows.append({"snapshot": name, "stream": stream, "target_tokens": tokens, "windows_asked": args.windows,
                     "checkpoint_hash": model_id,
                     **{f"{d}_{k}": ev[d][k] for d in DIRECTIONS for k in ("loss", "context_gap")},
                     "windows": {d: ev[d]["windows"] for d in DIRECTIONS},
                     "tokens": {d: ev[d]["tokens"] for d in DIRECTIONS}, "seconds": round(time.perf_counter() - t0, 1)})
        r = rows[-1]
        print(f"[curves] {name}: loss {r['fwd_loss']:.3f}/{r['left_loss']:.3f}/{r['right_loss']:.3f} gap "
              f"{r['fwd_context_gap']:+.3f}/{r['left_context_gap']:+.3f}/{r['right_context_gap']:+.3f} "
              f"({r['seconds']:.0f}s)", flush=True)

    if not any(r["snapshot"] == "warm start (untrained)" for r in rows):
        first_cfg, first_tok, _ = load_bundle(found[0][2])
        measure("warm start (untrained)", "-", 0, first_tok, build_model(first_cfg, first_tok, seed=cfg.seed))
    for stream, tokens, snap in found:
        model_id = checkpoint_hash(str(snap))
        if model_id in done:
            continue
        _, tok, models = load_bundle(snap)
        if len({id(m) for m in models.values()}) != 1:
            raise SystemExit(f"reference_curves: {snap} has one model per direction; this script scores shared ones")
        measure(f"{snap.parent.name}/{snap.name}", stream, tokens, tok, models["fwd"], model_id)

    rows.sort(key=lambda r: (r["stream"] != "-", r["stream"], r["target_tokens"]))
    store.write_text(json.dumps(rows, indent=1))
    w = rows[0]["windows"]
    lines = [f"Machine: {machine()}", "",
             f"Held-out windows: {w['fwd']} / {w['left']} / {w['right']} (fwd / left / right) from the held-out "
             f"documents of configs/reference_context.yaml, the same for every row. Loss in nats per target "
             "token; gap = loss with each window's source taken from another window, minus the loss.", "",
             "| snapshot | training stream | target tokens | loss fwd / left / right "
             "| context-use gap fwd / left / right |",
             "|---|---|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['snapshot']} | {r['stream']} | {r['target_tokens']:,} | "
                     f"{r['fwd_loss']:.3f} / {r['left_loss']:.3f} / {r['right_loss']:.3f} | "
                     f"{r['fwd_context_gap']:+.3f} / {r['left_context_gap']:+.3f} / {r['right_context_gap']:+.3f} |")
    (results / "reference_curves.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = pyplot("reference_curves")
    if plt is None:
        return 0
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for stream in sorted({r["stream"] for r in rows if r["stream"] != "-"}):
        pts = [r for r in rows if r["stream"] == stream]
        for d, style in zip(DIRECTIONS, ("o-", "s--", "^:")):
            x = [r["target_tokens"] for r in pts]
            axes[0].plot(x, [r[f"{d}_loss"] for r in pts], style, label=f"{stream}, {d}")
            axes[1].plot(x, [r[f"{d}_context_gap"] for r in pts], style, label=f"{stream}, {d}")
    axes[0].set_ylabel("held-out loss (nats / target token)")
    axes[1].set_ylabel("context-use gap (nats / target token)")
    for ax in axes:
        ax.set_xlabel("target tokens trained")
        ax.legend(fontsize=7)
    fig.suptitle("Reference context model: snapshots on the same held-out windows")
    fig.tight_layout()
    fig.savefig(results / "reference_curves.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
