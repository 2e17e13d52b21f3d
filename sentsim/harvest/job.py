"""`sentsim harvest` / jobs/harvest_pairs.py: plan units, run the stages on Ray, resume, report.

With a discriminator (screened contexts), the corpus representation cache (003 §3.3) comes first:
`contexts.rep_cache` when given (checked against this corpus and discriminator), else one built
through the shard store under <out>/rep_cache, resumable like the harvest itself. Its identity
is part of the harvest's fingerprint, and each context actor loads it once.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Optional, Sequence

import numpy as np

from sentsim.config import load_config
from sentsim.errors import UsageError
from sentsim.executor import ShardedJob, execute
from sentsim.harvest.config import HarvestConfig
from sentsim.harvest.stages import (
    CONTEXT_SCORE_SCHEMA,
    PAIR_SCHEMA,
    SENTENCE_SCHEMA,
    ContextStage,
    RankAndWriteStage,
    ScoreStage,
    sentence_schema_of,
)
from sentsim.pairs_file import read_pairs_file
from sentsim.pipeline import Resources, StageSpec
from sentsim.screening.cache_job import ensure_rep_cache, rep_cache_uri
from storage import ShardStore
from storage.fs import sha256_path

STAGE = "harvest"
ANCHORS_TABLE = "rank_anchors"  # side table: the anchor sentences behind every rank vector


def plan(cfg: HarvestConfig, corpus) -> tuple[list, dict]:
    """Units of work: shards of anchors (or of explicit pairs). Pure function of the config."""
    if cfg.pairs_file:
        pairs = read_pairs_file(cfg.pairs_file)
        units = [{"unit": u, "pairs": pairs[i:i + cfg.pairs_per_unit]}
                 for u, i in enumerate(range(0, len(pairs), cfg.pairs_per_unit))]
        return units, {"pairs_file": cfg.pairs_file, "pairs_file_sha256": sha256_path(cfg.pairs_file)[:16],
                       "pairs": len(pairs)}
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


def harvest(
    cfg: HarvestConfig, executor: str = "ray", force_new: bool = False, address: Optional[str] = None,
    quiet: bool = False, max_units: Optional[int] = None,
) -> dict:
    from sentsim.harvest.corpus_index import CorpusIndex
    from sentsim.harvest.report import write_report

    corpus = CorpusIndex(cfg.corpus)
    units, plan_info = plan(cfg, corpus)
    hashes = model_hashes(cfg)
    rep_cache = rep_cache_uri(cfg.contexts.rep_cache, cfg.out) if uses_rep_cache(cfg) else None

    def stages(ctx) -> list:
        from sentsim.context.model import read_bundle_meta

        window = int(read_bundle_meta(cfg.context_models[0]).get("model_config", {}).get("context_sentences", 1))
        anchor_ids = anchor_texts = None
        if cfg.rank.enabled:
            anchor_ids, anchor_texts = run_anchors(cfg, ctx.store, ctx.fp)
        rng = np.random.default_rng(cfg.seed + 2)
        refs = list(corpus.texts(rng.choice(corpus.ids, size=min(cfg.reference_sentences, len(corpus.ids)),
                                            replace=False)))
        # a run resumed from before sentences.context_ids keeps one schema across its shards
        sentence_schema = sentence_schema_of(ctx.manifest)
        r = cfg.resources
        return [
            StageSpec(functools.partial(ContextStage, cfg, window, rep_cache), Resources.of(r.contexts)),
            StageSpec(functools.partial(ScoreStage, cfg, refs), Resources.of(r.scoring)),
            StageSpec(functools.partial(RankAndWriteStage, cfg, ctx.fp, anchor_ids, anchor_texts, sentence_schema),
                      Resources.of(r.rank)),
        ]

    def prepare(ctx) -> None:
        if rep_cache:  # every corpus sentence encoded once, before the pipeline
            ensure_rep_cache(cfg.contexts.rep_cache, cfg.out, cfg.corpus, cfg.discriminator, hashes["rep_cache"],
                             cfg.resources.contexts, executor=ctx.executor, force_new=ctx.force_new,
                             address=ctx.address, quiet=ctx.quiet)

    job = ShardedJob(
        stage=STAGE, out=cfg.out, fingerprint_parts=(STAGE, cfg.semantic(), corpus.fingerprint, plan_info, hashes),
        config=cfg.model_dump(), inputs=[{"corpus": cfg.corpus, "fingerprint": corpus.fingerprint, **plan_info}],
        tables={"pairs": PAIR_SCHEMA, "sentences": SENTENCE_SCHEMA, "context_scores": CONTEXT_SCORE_SCHEMA},
        units=units, stages=stages, prepare=prepare, summary=lambda ctx: {"plan": plan_info}, count="pairs",
        detail=lambda r: f"nulls {r['null_scores']}", gauges="sentsim_harvest", deep=True)
    m = execute(job, executor=executor, address=address, force_new=force_new, quiet=quiet, max_units=max_units)
    this = m["this_run"]
    write_report(cfg.out, m, SimpleNamespace(done=this["units"], rows=this["pairs"]), this["wall_seconds"])
    return dict(ShardStore(cfg.out).read_manifest(), this_run=m["this_run"])


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


def load_harvest_config(path: Optional[str], overrides: Sequence[str], **explicit) -> HarvestConfig:
    return load_config(HarvestConfig, path, overrides, **explicit)
