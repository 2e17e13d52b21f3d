"""`sentsim harvest` / jobs/harvest_pairs.py: plan units, run the stages on Ray, resume, report.

With a discriminator (screened contexts), the corpus representation cache (003 §3.3) comes first:
`contexts.rep_cache` when given (checked against this corpus and discriminator), else one built
through the shard store under <out>/rep_cache, resumable like the harvest itself. Its identity
is part of the harvest's fingerprint, and each context actor loads it once.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from sentsim.config import fingerprint, load_config
from sentsim.errors import UsageError
from sentsim.harvest.config import HarvestConfig
from sentsim.harvest.stages import (
    CONTEXT_SCORE_SCHEMA, PAIR_SCHEMA, SENTENCE_SCHEMA, ContextStage, RankAndWriteStage, ScoreStage, sentence_schema_of,
)
from sentsim.pipeline import run_pipeline
from storage import ShardStore

STAGE = "harvest"
ANCHORS_TABLE = "rank_anchors"  # side table: the anchor sentences behind every rank vector


def read_pairs_file(path: str) -> List[tuple]:
    """(s1, s2, gold or None) from STS-B style TSV, CSV/TSV with s1,s2 headers, JSONL or Parquet."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: pairs file not found")
    name = p.name.lower()
    rows: List[tuple] = []
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        t = pq.read_table(p)
        if not {"s1", "s2"} <= set(t.column_names):
            raise UsageError(f"{path}: needs columns s1 and s2 (has {', '.join(t.column_names)})")
        gold = t.column("gold").to_pylist() if "gold" in t.column_names else [None] * t.num_rows
        return list(zip(t.column("s1").to_pylist(), t.column("s2").to_pylist(), gold))
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if name.endswith(".jsonl"):
                try:
                    obj = json.loads(line)
                    rows.append((obj["s1"], obj["s2"], obj.get("gold")))
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise UsageError(f"{path}:{n}: expected a JSON object with s1 and s2") from None
                continue
            cols = line.split("\t")
            if len(cols) >= 7:  # STS-B: genre, file, year, id, score, s1, s2[, ...]
                try:
                    rows.append((cols[5], cols[6], float(cols[4])))
                except ValueError:
                    raise UsageError(f"{path}:{n}: score column is not a number") from None
            elif len(cols) >= 2:
                rows.append((cols[0], cols[1], None))
            else:
                raise UsageError(f"{path}:{n}: expected tab-separated s1 and s2")
    if not rows:
        raise UsageError(f"{path}: no pairs")
    return rows


def _file_hash(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()[:16]


def plan(cfg: HarvestConfig, corpus) -> tuple[list, dict]:
    """Units of work: shards of anchors (or of explicit pairs). Pure function of the config."""
    if cfg.pairs_file:
        pairs = read_pairs_file(cfg.pairs_file)
        units = [{"unit": u, "pairs": pairs[i:i + cfg.pairs_per_unit]}
                 for u, i in enumerate(range(0, len(pairs), cfg.pairs_per_unit))]
        return units, {"pairs_file": cfg.pairs_file, "pairs_file_sha256": _file_hash(cfg.pairs_file), "pairs": len(pairs)}
    ok = corpus.ids[corpus.n_tokens >= cfg.anchors.min_tokens]
    if len(ok) == 0:
        raise UsageError(f"{cfg.corpus}: no sentence has {cfg.anchors.min_tokens} or more words to use as an anchor")
    rng = np.random.default_rng(cfg.seed)
    n = min(cfg.anchors.n, len(ok))
    anchors = np.sort(rng.choice(ok, size=n, replace=False)).tolist()
    units = [{"unit": u, "anchors": anchors[i:i + cfg.anchors.per_unit], "all_anchors": anchors, "pairs": None}
             for u, i in enumerate(range(0, len(anchors), cfg.anchors.per_unit))]
    return units, {"anchors": n}


def uses_rep_cache(cfg: HarvestConfig) -> bool:
    """Screening with a discriminator scores contexts from its representation cache (003 §3.3)."""
    return bool(cfg.discriminator) and cfg.contexts.mode == "screened"


def model_hashes(cfg: HarvestConfig) -> dict:
    from sentsim.rank.targets import checkpoint_hash, default_base_encoder

    out = {"context_models": [checkpoint_hash(p) for p in cfg.context_models]}
    if cfg.index:
        from sentsim.retrieval.base import read_index_manifest

        out["index"] = read_index_manifest(cfg.index).get("fingerprint") or checkpoint_hash(cfg.index)
    if cfg.discriminator:
        out["discriminator"] = checkpoint_hash(cfg.discriminator)
    if uses_rep_cache(cfg):
        from sentsim.retrieval.corpus_view import corpus_fingerprint
        from sentsim.screening.cache_job import cache_identity

        out["rep_cache"] = cache_identity(corpus_fingerprint(cfg.corpus), cfg.discriminator)
    if cfg.rank.enabled:
        out["base_encoder"] = checkpoint_hash(cfg.rank.encoder or default_base_encoder())
    return out


def check_gpus(cfg: HarvestConfig, executor: str) -> None:
    want = sum(r.num_gpus * r.min_actors for r in (cfg.resources.contexts, cfg.resources.scoring, cfg.resources.rank))
    if want <= 0:
        return
    if executor == "ray":
        import ray

        have = ray.cluster_resources().get("GPU", 0)
    else:
        import torch

        have = torch.cuda.device_count()
    if want > have:
        raise UsageError(f"resources ask for {want:g} GPUs but the cluster has {have:g}; "
                         "lower resources.*.num_gpus or min_actors, or add GPU nodes")


class Progress:
    """Live progress on the console and, when Ray is up, as application metrics (the dashboard's
    Metrics view and Prometheus show them, tagged by run) beside Ray Data's per-stage rows."""

    def __init__(self, total: int, already: int, stream=sys.stderr, run: str = ""):
        self.total, self.done, self.already = total, 0, already
        self.rows = 0
        self.t0 = time.time()
        self.stream = stream
        self.stage_seconds = {}
        self.gauges = {}
        import ray

        if ray.is_initialized():
            from ray.util.metrics import Gauge

            for name, what in (("units_done", "completed work units (resumed ones included)"),
                               ("units_planned", "planned work units"), ("pairs_written", "pairs written by this run"),
                               ("pairs_per_second", "pairs per second since start"), ("eta_seconds", "estimated seconds left")):
                g = Gauge(f"sentsim_harvest_{name}", description=what, tag_keys=("run",))
                g.set_default_tags({"run": run})
                self.gauges[name] = g
            self.gauges["units_planned"].set(total)
            self.gauges["units_done"].set(already)

    def update(self, r: dict) -> None:
        self.done += 1
        self.rows += r["pairs"]
        for k, v in r["timing"].items():
            self.stage_seconds[k] = self.stage_seconds.get(k, 0.0) + v
        el = time.time() - self.t0
        left = self.total - self.already - self.done
        eta = el / self.done * left
        for name, v in (("units_done", self.already + self.done), ("pairs_written", self.rows),
                        ("pairs_per_second", self.rows / el), ("eta_seconds", eta)):
            if name in self.gauges:
                self.gauges[name].set(v)
        print(f"[harvest] unit {r['unit']:05d} | {self.already + self.done}/{self.total} units | {self.rows:,} pairs "
              f"| {self.rows / el:,.1f} pairs/s | ETA {eta:,.0f}s | nulls {r['null_scores']}", file=self.stream, flush=True)


def harvest(
    cfg: HarvestConfig, executor: str = "ray", force_new: bool = False, address: Optional[str] = None,
    quiet: bool = False, max_units: Optional[int] = None,
) -> dict:
    from sentsim.harvest.corpus_index import CorpusIndex
    from sentsim.context.model import read_bundle_meta

    corpus = CorpusIndex(cfg.corpus)
    units, plan_info = plan(cfg, corpus)
    hashes = model_hashes(cfg)
    fp = fingerprint(STAGE, cfg.semantic(), corpus.fingerprint, plan_info, hashes)
    store = ShardStore(cfg.out)
    manifest = store.open_run(
        STAGE, fp, cfg.model_dump(), [{"corpus": cfg.corpus, "fingerprint": corpus.fingerprint, **plan_info}],
        {"pairs": PAIR_SCHEMA, "sentences": SENTENCE_SCHEMA, "context_scores": CONTEXT_SCORE_SCHEMA},
        planned_units=len(units), force_new=force_new)
    # a run resumed from before sentences.context_ids keeps one schema across its shards
    sentence_schema = sentence_schema_of(manifest)
    done = store.completed_units(fp, deep=True)
    for u, why in sorted(getattr(store, "redo_reasons", {}).items()):
        print(f"[harvest] unit {u:05d} will be redone: {why}", file=sys.stderr)
    pending = [u for u in units if u["unit"] not in done]
    if max_units is not None:
        pending = pending[:max_units]
    window = int(read_bundle_meta(cfg.context_models[0]).get("model_config", {}).get("context_sentences", 1))
    anchor_ids = anchor_texts = None
    if cfg.rank.enabled:
        anchor_ids, anchor_texts = run_anchors(cfg, store, fp)
    rng = np.random.default_rng(cfg.seed + 2)
    refs = [t for t in corpus.texts(rng.choice(corpus.ids, size=min(cfg.reference_sentences, len(corpus.ids)), replace=False))]
    if executor == "ray":
        from sentsim.runtime import init_ray

        init_ray(address)
    elif executor != "inline":
        raise UsageError(f"unknown executor {executor!r} (ray or inline)")
    check_gpus(cfg, executor)
    rep_cache = None
    if uses_rep_cache(cfg) and pending:  # every corpus sentence encoded once, before the pipeline
        from sentsim.screening.cache_job import ensure_rep_cache

        rep_cache = ensure_rep_cache(cfg.contexts.rep_cache, cfg.out, cfg.corpus, cfg.discriminator,
                                     hashes["rep_cache"], cfg.resources.contexts, executor=executor,
                                     force_new=force_new, address=address, quiet=quiet)
    stages = [
        functools.partial(ContextStage, cfg, window, rep_cache),
        functools.partial(ScoreStage, cfg, refs),
        functools.partial(RankAndWriteStage, cfg, fp, anchor_ids, anchor_texts, sentence_schema),
    ]
    scale = {"contexts": _r(cfg.resources.contexts), "scoring": _r(cfg.resources.scoring), "rank": _r(cfg.resources.rank)}
    progress = Progress(len(units), len(done), stream=open(os.devnull, "w") if quiet else sys.stderr, run=cfg.out)
    t0 = time.time()
    if pending:
        for r in run_pipeline(pending, stages, executor=executor, scale=scale):
            progress.update(r)
    wall = time.time() - t0
    from sentsim.harvest.report import write_report

    manifest = store.finalize(len(units), {"plan": plan_info})
    write_report(cfg.out, manifest, progress, wall)
    return store.read_manifest()


def run_anchors(cfg: HarvestConfig, store: ShardStore, fp: str) -> tuple[np.ndarray, list]:
    """The rank-vector anchor set (004 §3.2), sampled once and stored with the run as the side
    table `rank_anchors`, so students read the exact anchors back instead of re-sampling the corpus
    (which may have moved or changed). A resumed run reuses the stored set."""
    import pyarrow as pa

    from sentsim.rank.targets import sample_anchors

    stored = store.read_side_table(ANCHORS_TABLE, fingerprint=fp)
    if stored is not None:
        return stored.column("sentence_id").to_numpy(), stored.column("text").to_pylist()
    ids, texts = sample_anchors(cfg.corpus, cfg.rank.n_anchors, seed=cfg.seed + 1)
    table = pa.table({"anchor": pa.array(np.arange(len(ids)), pa.int32()), "sentence_id": pa.array(ids, pa.int64()),
                      "text": pa.array(texts, pa.string())})
    store.write_side_table(ANCHORS_TABLE, table, fp)
    return ids, texts


def _r(r):
    from sentsim.pipeline import Resources

    return Resources(num_cpus=r.num_cpus, num_gpus=r.num_gpus, batch_size=1, min_actors=r.min_actors, max_actors=r.max_actors)


def load_harvest_config(path: Optional[str], overrides: Sequence[str], **explicit) -> HarvestConfig:
    return load_config(HarvestConfig, path, overrides, **explicit)
