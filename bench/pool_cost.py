"""What a labelled pair costs: the per-pair harvest against the pool harvest (contexts.mode=pool), in one run.

    .venv/bin/python bench/pool_cost.py [--anchors 128,512] [--pools 64,256] [--clusters 32,128] [--out DIR]
                                        [--plan-only] [--baseline REPORT] [--inputs DEMO_OUT]

On the bundled sample corpus (its index, and the demo's context-model shape, untrained: what an item costs does
not depend on the weights), inline and in fp32 so that machines with and without bf16 compare. Rows:

- the demo's per-pair harvest (24 anchors, |C_s| = 16, retrieved contexts), the baseline;
- the pool harvest of the same anchors and partners at each |P|;
- pool harvests labelling every pair within TF-IDF clusters of K anchors, for N anchors, at each |P| and K.

Each row gives (sentence, context) items scored (each in every Eq. 3 direction), labelled pairs, items per
pair, and CPU seconds of scoring per pair (this process's CPU time over the harvest, rank targets off). The
ratio column is the baseline's items per pair over the row's. Results: bench/results/pool_cost.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# the checkout too: else tests/storage/, a test folder, is imported as the storage package
sys.path.append(str(Path(__file__).resolve().parent.parent))
from common import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def inputs(work: Path) -> dict:
    from harvest_support import build_index_for

    from sentsim.context.config import DIRECTIONS, ContextModelConfig
    from sentsim.context.model import build_model, save_bundle
    from sentsim.context.tokenizer import train_bpe
    from sentsim.corpus_job import build_corpus
    from storage import RunReader

    corpus, index, bundle = work / "corpus", work / "index", work / "ctx"
    if not (corpus / "_COMPLETE").exists():
        build_corpus([str(SAMPLE)], str(corpus), executor="inline", quiet=True)
    if not (index / "manifest.json").exists():
        build_index_for(corpus, index)
    if not bundle.exists():  # the demo's shape (sentsim/demo.py): BPE 2,000, d_model 64, 1+1 layers
        texts = RunReader(str(corpus)).read_table("sentences", ["text"]).column("text").to_pylist()
        cfg = ContextModelConfig(vocab_size=2000, d_model=64, encoder_layers=1, decoder_layers=1, ffn_dim=128)
        tok = train_bpe(texts, cfg.vocab_size)
        save_bundle(bundle, cfg, tok, {"shared": build_model(cfg, tok, seed=0)}, {d: "shared" for d in DIRECTIONS})
    return {"corpus": corpus, "index": index, "bundle": bundle}


def planned(label: str, base: dict, out: Path, **over) -> dict:
    """A pool harvest's items and pairs as its plan fixes them (`--plan-only`): it scores every planned sentence
    in every pool context, so the counts are exact without scoring (no CPU seconds then)."""
    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.job import HarvestRun

    cfg = HarvestConfig.model_validate({**base, "out": str(out), **over})
    shutil.rmtree(out, ignore_errors=True)
    job = HarvestRun(cfg, "inline", True, True)
    items, pairs = len(job.pool_plan.texts) * len(job.pool), len(job.pool_plan.pairs)
    row = {"run": label, "items": items, "pairs": pairs, "items_per_pair": items / pairs, "cpu_s_per_pair": None,
           "wall_s": None}
    print(json.dumps(row), flush=True)
    return row


def run(label: str, base: dict, out: Path, plan_only: bool = False, **over) -> dict:
    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.job import harvest

    if plan_only and (over.get("contexts") or {}).get("mode") == "pool":
        return planned(label, base, out, **over)
    cfg = HarvestConfig.model_validate({**base, "out": str(out), **over})
    shutil.rmtree(out, ignore_errors=True)
    c0, t0 = cpu_seconds(), time.time()
    harvest(cfg, executor="inline", quiet=True)
    cpu, wall = cpu_seconds() - c0, time.time() - t0
    rep = json.loads((out / "report.json").read_text())
    pairs, items = rep["pairs"], rep["scored_items"]
    row = {"run": label, "items": items, "pairs": pairs, "items_per_pair": items / pairs,
           "cpu_s_per_pair": cpu / pairs, "wall_s": wall}
    print(json.dumps(row), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", default="128,512", help="N anchors of the clustered pool harvests")
    ap.add_argument("--pools", default="64,256", help="|P| values")
    ap.add_argument("--clusters", default="32,128", help="K values (cluster sizes)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "pool_cost"))
    ap.add_argument("--results", default=str(ROOT / "bench" / "results" / "pool_cost"))
    ap.add_argument("--plan-only", action="store_true",
                    help="count the pool runs' items and pairs from their plans, without scoring (exact counts)")
    ap.add_argument("--baseline", default=None, metavar="REPORT",
                    help="a per-pair harvest's report.json to use as the baseline row instead of running one")
    ap.add_argument("--inputs", default=None, metavar="DIR",
                    help="a `make demo` output folder: its corpus, index and context models instead of building them")
    a = ap.parse_args()
    work = Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    d = Path(a.inputs) if a.inputs else None
    inp = {"corpus": d / "corpus", "index": d / "index", "bundle": d / "context"} if d else inputs(work)
    base = {"corpus": str(inp["corpus"]), "index": str(inp["index"]), "context_models": [str(inp["bundle"])],
            "anchors": {"n": 24, "per_unit": 4}, "rank": {"enabled": False},
            "contexts": {"size": 16, "retrieve_chunks": 300}, "scoring": {"autocast": "off", "torch_threads": 1}}
    pools = [int(x) for x in a.pools.split(",")]
    if a.baseline:
        rep = json.loads(Path(a.baseline).read_text())
        rows = [{"run": f"per-pair, {a.baseline}", "items": rep["scored_items"], "pairs": rep["pairs"],
                 "items_per_pair": rep["scored_items"] / rep["pairs"], "cpu_s_per_pair": None, "wall_s": None}]
    else:
        rows = [run("per-pair, demo (24 anchors, |C_s| = 16)", base, work / "h")]
    for P in pools:
        rows.append(run(f"pool |P| = {P}, same anchors and partners", base, work / "h", a.plan_only,
                        contexts={"mode": "pool", "pool_size": P}))
    for n in (int(x) for x in a.anchors.split(",")):
        for K in (int(x) for x in a.clusters.split(",")):
            if K > n:
                continue
            for P in pools:
                rows.append(run(f"pool |P| = {P}, N = {n} anchors, clusters of K = {K}", base, work / "h", a.plan_only,
                                anchors={"n": n, "per_unit": 64}, partners={"cluster_size": K},
                                contexts={"mode": "pool", "pool_size": P}))
    baseline = rows[0]["items_per_pair"]
    for r in rows:
        r["items_per_pair_ratio"] = baseline / r["items_per_pair"]
    flags = (" --plan-only" if a.plan_only else "") + (f" --baseline {a.baseline}" if a.baseline else "")
    head = (f"`bench/pool_cost.py --anchors {a.anchors} --pools {a.pools} --clusters {a.clusters}{flags}`, "
            f"{time.strftime('%Y-%m-%d')}, {machine()}; one run (the item counts are exact; CPU seconds are of "
            "this process, inline, fp32, one torch thread)")
    lines = [head, "", "| run | items | pairs | items per pair | baseline / row | CPU-s per pair |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['items']:,} | {r['pairs']:,} | {r['items_per_pair']:.2f} | "
              f"{r['items_per_pair_ratio']:.1f}x | "
              f"{'' if r['cpu_s_per_pair'] is None else format(r['cpu_s_per_pair'], '.3f')} |" for r in rows]
    Path(a.results + ".md").write_text("\n".join(lines) + "\n")
    Path(a.results + ".json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
