"""The teacher's scoring stage on another device (issue 15, step 5): the dev curve on a GPU, bf16 against fp32.

    python bench/teacher_gpu.py export --sizes 16,32,64,128 [--dir bench/out/teacher_gpu]   # context sets (CPU)
    python bench/teacher_gpu.py score --dir DIR --out OUT [--bundle DIR] [--device cuda] [--fp32 16] [--units N]
    python bench/teacher_gpu.py report --scores OUT/teacher_gpu_scores.json

A harvest's two stages need different things: context selection (`ContextStage`: retrieval + selection,
configs/teacher.yaml with `contexts.size` = k) needs the reference corpus and its index (gigabytes); scoring
(`ScoreStage`: Eq. 3 on the context model, Eq. 4 per pair) needs only the context-model bundle. `export` runs the
first here on the fixed 300-pair STS-B dev sample and writes every sentence's context windows, per unit of 20
pairs as bench/teacher_curve.py harvests them, one gzipped JSON line per unit; `score` runs the library's
ScoreStage on them, unchanged, on any device (no Ray, no corpus), in bf16 autocast, and with `--fp32 K` scores
size K again without autocast, so the report shows how far bf16 moves each pair's similarity on the trained model
(the issue asks for Spearman >= 0.99 before bf16 may be a default).

The report gives Spearman x 100 against gold with a 95% bootstrap interval, the device-seconds per pair of the
scoring stage (its wall time, the device held alone), each larger |C_s| against the smallest paired by pair, and,
for a size that bench/teacher_curve.py ran in a CPU harvest, the per-pair agreement with it (an fp32 run here
must agree exactly: that checks the export). Results: bench/results/teacher_gpu.{json,md}, or
teacher_bf16_cpu.{json,md} for a run on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = ROOT / "bench" / "results"
PAIRS_PER_UNIT = 20  # as bench/teacher_curve.py harvests, so each unit's items match its CPU runs
TEACHER = ROOT / "configs" / "teacher.yaml"


def teacher_bundle() -> str:
    """configs/teacher.yaml's context model (its $SENTSIM_CACHE expanded): the model measured on STS-B test."""
    import yaml

    from sentsim.config import expand_path

    return expand_path(yaml.safe_load(TEACHER.read_text())["context_models"][0])


def teacher_config(size: int, pairs_file: str, out: str, device: str = "cpu", autocast: str = "auto",
                   bundle: str | None = None):
    from sentsim.config import load_config
    from sentsim.harvest.config import HarvestConfig

    return load_config(HarvestConfig, str(ROOT / "configs" / "teacher.yaml"),
                       [f"contexts.size={size}", f"pairs_per_unit={PAIRS_PER_UNIT}", f"scoring.device={device}",
                        f"scoring.autocast={autocast}"], pairs_file=pairs_file, out=out,
                       context_models=[bundle] if bundle else None)


def export(sizes: list[int], work: Path) -> None:
    """Each size's context sets for the dev sample, one JSON line per unit, gzipped."""
    from teacher_curve import dev_sample

    from sentsim.context.bundle_meta import read_bundle_meta
    from sentsim.harvest.stages import ContextStage
    from sentsim.pairs_file import read_pairs_file

    work.mkdir(parents=True, exist_ok=True)
    sample = dev_sample(work)
    pairs = read_pairs_file(str(sample))
    for k in sizes:
        dst = work / f"contexts-k{k}.jsonl.gz"
        if dst.exists():
            print(f"k={k}: {dst} exists, kept")
            continue
        cfg = teacher_config(k, str(sample), str(work / "unused"))
        window = int(read_bundle_meta(cfg.context_models[0])["model_config"].get("context_sentences", 1))
        stage = ContextStage(cfg, window)  # as job.py builds it (no discriminator in the teacher)
        stage.setup()
        t0 = time.perf_counter()
        lines = []
        for u in range(0, len(pairs), PAIRS_PER_UNIT):
            item = {"unit": u // PAIRS_PER_UNIT, "pairs": [tuple(p) for p in pairs[u:u + PAIRS_PER_UNIT]]}
            lines.append(unit_line(stage.process([item])[0]))
        tmp = dst.with_suffix(".tmp")
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, dst)
        print(f"k={k}: {len(pairs)} pairs, {time.perf_counter() - t0:.0f} s of context selection -> {dst} "
              f"({dst.stat().st_size / 2**20:.1f} MiB)", flush=True)


def unit_line(out: dict) -> str:
    """ContextStage's hand-off for one unit as a line of the export: its pairs as [s1_id, s2_id, kind, gold],
    its texts and every sentence's context set."""
    from sentsim.harvest.work import work_of

    w = work_of(out)
    return json.dumps({"unit": w.unit, "pairs": [[p.s1_id, p.s2_id, p.kind, p.gold] for p in w.pairs],
                       "texts": {str(s): t for s, t in w.texts.items()},
                       "csets": {str(s): dataclasses.asdict(cs) for s, cs in w.csets.items()}})


def _item(u: dict) -> dict:
    """One exported unit as the hand-off ScoreStage takes from ContextStage."""
    from sentsim.harvest.work import Pair, WithContexts, envelope
    from sentsim.screening.contexts import Context, ContextSet

    return envelope(WithContexts(
        unit=u["unit"], anchored=False, pairs=[Pair(int(a), int(b), kind, gold) for a, b, kind, gold in u["pairs"]],
        texts={int(s): t for s, t in u["texts"].items()},
        csets={int(s): ContextSet([Context(**c) for c in d["contexts"]], d["candidates"], d["shortfall_reason"])
               for s, d in u["csets"].items()}, disc={}))


def scored(out: dict) -> dict:
    """ScoreStage's hand-off for one unit as plain data: items scored, texts, and each pair's Eq. 4 row with its
    sentence ids and gold."""
    from sentsim.harvest.work import work_of

    w = work_of(out)
    return {"n_scored": w.n_scored, "texts": w.texts,
            "rows": [{**r.eq4, "s1_id": r.pair.s1_id, "s2_id": r.pair.s2_id, "gold": r.pair.gold} for r in w.rows]}


def score(work: Path, out: Path, bundle: Path, fp32: list[int], device: str = "cuda", units: int = 0) -> None:
    import torch

    from sentsim.harvest.stages import ScoreStage

    out.mkdir(parents=True, exist_ok=True)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    result = {"device": torch.cuda.get_device_name(0) if cuda else device, "torch": torch.__version__, "runs": []}
    sizes = sorted(int(p.name.split("-k")[1].split(".")[0]) for p in work.glob("contexts-k*.jsonl.gz"))
    # smallest first, its fp32 rerun right after it: a call cut off at its time limit still returns them
    runs = [(k, a) for k in sizes for a in (("bf16", "off") if k in fp32 else ("bf16",))]
    for k, autocast in runs:
        path = work / f"contexts-k{k}.jsonl.gz"
        lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
        todo = [json.loads(x) for x in (lines[:units] if units else lines)]
        cfg = teacher_config(k, "unused", "unused", device=device, autocast=autocast, bundle=str(bundle))
        cfg = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update={"batch_tokens": 65536})})
        stage = ScoreStage(cfg, [])
        stage.setup()
        rows, items = [], 0
        if not result["runs"]:  # CUDA context, cuBLAS handles and allocator warm-up stay out of the first timing
            stage.process([_item(todo[0])])
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        for u in todo:
            item = scored(stage.process([_item(u)])[0])
            items += item["n_scored"]
            rows += [{"s1": item["texts"][r["s1_id"]], "s2": item["texts"][r["s2_id"]], "gold": r["gold"],
                      "score": r["score"], "contexts": r["n_ctx_s1"] + r["n_ctx_s2"]} for r in item["rows"]]
        sync()
        wall = time.perf_counter() - t0
        run = {"size": k, "autocast": autocast, "pairs": len(rows), "items": items, "wall_s": wall, "rows": rows,
               "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
        result["runs"].append(run)
        print(f"k={k} {autocast}: {len(rows)} pairs, {items:,} items in {wall:.1f} s "
              f"({items / wall:,.0f} items/s, {wall / len(rows):.3f} s/pair)", flush=True)
        (out / "teacher_gpu_scores.json").write_text(json.dumps(result))
        del stage
        if cuda:
            torch.cuda.empty_cache()


def report(scores: Path) -> None:
    from common import bootstrap, paired_bootstrap
    from scipy.stats import spearmanr

    res = json.loads(scores.read_text())
    cpu = json.loads((RESULTS / "teacher_curve_scores.json").read_text())
    curve = json.loads((RESULTS / "teacher_curve.json").read_text())
    from corpus.documents import text_id
    from sentsim.harvest.pairs import pair_id

    def by_pair(rows):
        return {(pair_id(text_id(r["s1"]), text_id(r["s2"])), float(r["gold"])): r["score"] for r in rows}

    out = {"device": res["device"], "torch": res["torch"], "points": []}
    bf16 = {r["size"]: by_pair(r["rows"]) for r in res["runs"] if r["autocast"] == "bf16"}
    for r in res["runs"]:
        s = np.array([np.nan if x["score"] is None else x["score"] for x in r["rows"]], dtype=float)
        g = np.array([x["gold"] for x in r["rows"]], dtype=float)
        rho, lo, hi, used = bootstrap(s, g)
        point = {"size": r["size"], "autocast": r["autocast"], "spearman": rho, "lo": lo, "hi": hi, "pairs": used,
                 "of": r["pairs"], "contexts_per_pair": float(np.mean([x["contexts"] for x in r["rows"]])),
                 "items_per_pair": r["items"] / r["pairs"], "device_s_per_pair": r["wall_s"] / r["pairs"],
                 "items_per_s": r["items"] / r["wall_s"], "peak_gib": r["peak_gib"]}
        mine = by_pair(r["rows"])
        key = f"enwiki-150K:{r['size']}:1:paper"
        if key in cpu:  # the CPU harvest of the same pairs (bench/teacher_curve.py), fp32
            theirs = {(int(pid), float(gd)): sc for pid, sc, gd in cpu[key]}
            both = [k for k in mine if k in theirs and mine[k] is not None]
            a, b = np.array([mine[k] for k in both]), np.array([theirs[k] for k in both])
            point["vs_cpu_fp32"] = {"pairs": len(both), "spearman_of_scores": float(spearmanr(a, b)[0]),
                                    "max_abs_diff": float(np.max(np.abs(a - b)))}
            cpu_pt = [p for p in curve if p["label"] == "enwiki-150K" and p["size"] == r["size"]
                      and p["variant"] == "paper"]
            if cpu_pt:
                point["cpu_s_per_pair"] = cpu_pt[0]["cpu_s_per_pair"]
                point["cpu_spearman"] = cpu_pt[0]["spearman"]
        if r["autocast"] == "off" and r["size"] in bf16:
            other = bf16[r["size"]]
            both = [k for k in mine if mine[k] is not None and other.get(k) is not None]
            a, b = np.array([mine[k] for k in both]), np.array([other[k] for k in both])
            point["bf16_vs_fp32"] = {"pairs": len(both), "spearman_of_scores": float(spearmanr(a, b)[0]),
                                     "max_abs_diff": float(np.max(np.abs(a - b)))}
        out["points"].append(point)
    base = {r["size"]: r for r in res["runs"] if r["autocast"] == "bf16"}
    smallest = min(base) if base else None
    for r in res["runs"]:  # each larger |C_s| against the smallest, paired by pair
        if r["autocast"] != "bf16" or r["size"] == smallest:
            continue
        a, b = by_pair(r["rows"]), by_pair(base[smallest]["rows"])
        both = [k for k in a if a[k] is not None and b.get(k) is not None]
        d, dlo, dhi = paired_bootstrap(np.array([a[k] for k in both]), np.array([b[k] for k in both]),
                                       np.array([k[1] for k in both]))
        pt = next(p for p in out["points"] if p["size"] == r["size"] and p["autocast"] == "bf16")
        pt["minus_smallest"] = {"size": smallest, "delta": d, "lo": dlo, "hi": dhi, "pairs": len(both)}
    name = "teacher_bf16_cpu" if res["device"] == "cpu" else "teacher_gpu"  # a CPU run is the precision check
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1))
    lines = [f"Device: {res['device']} (torch {res['torch']}), scoring stage alone; context selection ran on the CPU",
             "", "Fixed sample: 300 STS-B dev pairs (seed 0), configs/teacher.yaml with contexts.size = |C_s|.", "",
             "| \\|C_s\\| | autocast | contexts per pair | items per pair | device-s per pair | items/s "
             "| peak GiB | Spearman x 100 | 95% interval | pairs | vs smallest \\|C_s\\| (paired) "
             "| CPU fp32 run of the same pairs |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for p in out["points"]:
        ms = p.get("minus_smallest")
        vs = (f"+{ms['delta']:.2f} [{ms['lo']:+.2f}, {ms['hi']:+.2f}]" if ms and ms["delta"] >= 0 else
              f"{ms['delta']:.2f} [{ms['lo']:+.2f}, {ms['hi']:+.2f}]" if ms else "")
        cpu_col = ""
        if "vs_cpu_fp32" in p:
            v = p["vs_cpu_fp32"]
            cpu_col = (f"{p.get('cpu_spearman', float('nan')):.2f} at {p.get('cpu_s_per_pair', float('nan')):.2f} "
                       f"CPU-s/pair; scores agree {v['spearman_of_scores']:.4f} (max diff {v['max_abs_diff']:.4f})")
        if "bf16_vs_fp32" in p:
            v = p["bf16_vs_fp32"]
            cpu_col += ("; " if cpu_col else "") + (f"bf16 vs fp32 on this device: {v['spearman_of_scores']:.4f} "
                        f"(max diff {v['max_abs_diff']:.4f})")
        lines.append(f"| {p['size']} | {p['autocast']} | {p['contexts_per_pair']:.1f} | {p['items_per_pair']:.1f} "
                     f"| {p['device_s_per_pair']:.3f} | {p['items_per_s']:,.0f} | {p['peak_gib'] or 0:.1f} "
                     f"| {p['spearman']:.2f} | [{p['lo']:.1f}, {p['hi']:.1f}] | {p['pairs']}/{p['of']} | {vs} "
                     f"| {cpu_col} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--sizes", default="16,32,64,128")
    e.add_argument("--dir", default=str(ROOT / "bench" / "out" / "teacher_gpu"))
    s = sub.add_parser("score")
    s.add_argument("--dir", default=str(ROOT / "bench" / "out" / "teacher_gpu"))
    s.add_argument("--out", required=True)
    s.add_argument("--bundle", default=None,
                   help="the context-model bundle the contexts were chosen for (default: configs/teacher.yaml's)")
    s.add_argument("--fp32", default="", help="sizes to score again without autocast")
    s.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    s.add_argument("--units", type=int, default=0, help="score only the first N units (of 20 pairs)")
    r = sub.add_parser("report")
    r.add_argument("--scores", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "export":
        export([int(x) for x in a.sizes.split(",")], Path(a.dir))
    elif a.cmd == "score":
        score(Path(a.dir), Path(a.out), Path(a.bundle or teacher_bundle()), [int(x) for x in a.fp32.split(",") if x],
              a.device, a.units)
    else:
        report(Path(a.scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
