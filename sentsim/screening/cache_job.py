"""`sentsim cache build`: the discriminator's representation cache as a resumable shard-store run.

Paper 003 §3.3: "we cache sentence representations in advance, and compute model scores in the
last neural layer". Every corpus sentence is encoded once, here, and every screening actor then
loads the result (`ContextCache.from_store`) instead of running the LSTM itself.

A work unit is a run of whole documents (about `sentences_per_unit` sentences): a window never
crosses a document, so each unit's cache is `ContextCache.build` on its own sentences and the
units together equal the cache of the whole corpus. Each actor of the pool loads the
discriminator once and reads only its unit's rows of the corpus shards.

The identity of a cache is (corpus fingerprint, discriminator checkpoint hash, window): the
harvest and `sentsim contexts` put it into their own fingerprints, and a cache made for another
corpus or discriminator is refused. The run's fingerprint adds the unit size (the unit layout).
"""

from __future__ import annotations

import time
from typing import List, Optional

import numpy as np
from pydantic import Field, field_validator

from corpus.documents import doc_key_of
from sentsim.config import Section
from sentsim.errors import UsageError
from sentsim.executor import PrerequisiteStopped, RunContext, ShardedJob, execute
from sentsim.identity import REP_CACHE_FORMAT, REP_CACHE_STAGE, cache_identity, corpus_fingerprint
from sentsim.out_paths import check_out
from sentsim.pipeline import Resources, Stage, StageResources, StageSpec
from sentsim.screening.cache import store_schemas
from storage import ShardStore, StoreError

SUBDIR = "rep_cache"  # where the harvest and `sentsim contexts` build it inside their own --out


class RepCacheConfig(Section):
    corpus: str
    discriminator: str
    out: str
    # Units of whole documents of about this many sentences: large enough that the LSTM batches
    # well, small enough that a killed actor loses little.
    sentences_per_unit: int = Field(8192, ge=1)
    # Only 0 (the default): kept so that configs naming it with that value still load; any other value is refused,
    # since it would do nothing. A unit is encoded on one torch thread in every executor, so that its rows are
    # the same bits wherever it runs (more threads change the last digits, sentsim/screening/threads.py); a
    # build's parallelism is its units, on several Ray actors. One thread also spares a busy core OpenMP's
    # spinning: two threads sharing one ran the LSTM ~23x slower (185 against 4,225 sentences/s,
    # docs/experiments/2026-11-24-discriminator-screening.md)
    torch_threads: int = Field(0, ge=0)
    resources: StageResources = StageResources()

    @field_validator("torch_threads")
    @classmethod
    def _one_thread_a_unit(cls, v: int) -> int:
        if v:
            raise ValueError(f"{v} would do nothing: each unit is encoded on one torch thread wherever it runs, so "
                             "that the cache is the same bits on every executor (sentsim/screening/threads.py); "
                             "drop the key, and for more units at once raise resources.max_actors on a Ray cluster")
        return v


def plan_units(ids: np.ndarray, per_unit: int) -> List[dict]:
    """Sorted sentence ids -> units of whole documents, each an id range [lo, hi)."""
    if not len(ids):
        return []
    docs = doc_key_of(ids)
    starts = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])  # first position of each document
    units, lo = [], 0
    for s in list(starts[1:]) + [len(ids)]:
        if s - lo >= per_unit or s == len(ids):
            units.append({"unit": len(units), "lo": int(ids[lo]), "hi": int(ids[s - 1]) + 1, "n": int(s - lo)})
            lo = s
    return units


class CacheStage(Stage):
    name = "rep_cache"

    def __init__(self, cfg: RepCacheConfig, fp: str):
        self.cfg, self.fp = cfg, fp
        self._corpus = None  # the corpus' committed sentences shards, opened by the first unit

    def setup(self) -> None:
        from sentsim.discriminator import Discriminator

        self.disc = Discriminator.load(self.cfg.discriminator, corpus=self.cfg.corpus)

    def _sentences(self, lo: int, hi: int):
        import pyarrow.dataset as pads

        from corpus.view import SentenceTable, open_corpus

        # only this unit's rows: Parquet statistics skip the other shards' row groups; only committed shards
        # (the run reader's), local or s3://
        if self._corpus is None:
            self._corpus = open_corpus(self.cfg.corpus).dataset("sentences")
        f = pads.field("sentence_id")
        t = self._corpus.to_table(columns=["sentence_id", "text"], filter=(f >= lo) & (f < hi))
        return SentenceTable(t.column("sentence_id").to_numpy().astype(np.int64), t.column("text").to_pylist())

    def process(self, items: List[dict]) -> List[dict]:
        from sentsim.screening.cache import ContextCache

        out = []
        for item in items:
            t0 = time.perf_counter()
            st = self._sentences(item["lo"], item["hi"])
            if len(st) != item["n"]:
                raise UsageError(f"{self.cfg.corpus}: sentences {item['lo']}..{item['hi']} changed while caching")
            cache = ContextCache.build(self.disc, st)
            ShardStore(self.cfg.out).write_unit(item["unit"], cache.to_tables(), self.fp,
                                                {"sentences": len(st), "centres": len(cache.centre_ids)})
            out.append({"unit": item["unit"], "sentences": len(st), "seconds": time.perf_counter() - t0})
        return out


def build_rep_cache(cfg: RepCacheConfig, executor: str = "ray", force_new: bool = False,
                    address: Optional[str] = None, quiet: bool = False, max_units: Optional[int] = None) -> dict:
    """Build (or finish, or confirm) the cache run at cfg.out; returns its manifest."""
    return execute(RepCacheRun(cfg, force_new), executor=executor, address=address, force_new=force_new,
                   quiet=quiet, max_units=max_units)


class RepCacheRun(ShardedJob):
    """One cache build, resolved before anything is written: the discriminator loaded (a model of another
    corpus is refused), the cache's identity fixed, the corpus's sentences cut into units."""

    stage = REP_CACHE_STAGE
    count = "sentences"

    def __init__(self, cfg: RepCacheConfig, force_new: bool = False):
        from corpus.view import read_table
        from sentsim.discriminator import Discriminator

        check_out(cfg.out, {"--corpus": cfg.corpus, "--discriminator": cfg.discriminator}, writes="run")
        self.cfg, self.out = cfg, cfg.out
        self.corpus_fp = corpus_fingerprint(cfg.corpus)
        disc = Discriminator.load(cfg.discriminator, corpus=cfg.corpus)  # refuses another corpus's model
        self.identity = cache_identity(self.corpus_fp, cfg.discriminator)
        old = None if force_new else ShardStore(cfg.out).read_manifest()  # --force-new: whatever is there goes
        if old is not None and old.get("stage") == REP_CACHE_STAGE and old.get("identity") != self.identity:
            raise UsageError(f"{cfg.out}: this representation cache was built for another corpus or discriminator; "
                             "choose another --out or pass --force-new to rebuild it")
        self.ids = np.sort(
            read_table(cfg.corpus, "sentences", ["sentence_id"]).column("sentence_id").to_numpy().astype(np.int64))
        self.meta = {"format": REP_CACHE_FORMAT, "corpus_fingerprint": self.corpus_fp,
                     "discriminator_fingerprint": disc.config.get("fingerprint"), "window": disc.window,
                     "rep_dim": disc.rep_dim, "core_dim": disc.model.head.context_core_dim}
        self.unit_list = plan_units(self.ids, cfg.sentences_per_unit)

    @property
    def units(self) -> List[dict]:
        return self.unit_list

    def fingerprint_parts(self) -> tuple:
        return (self.identity, self.cfg.sentences_per_unit)

    def config(self) -> dict:
        return self.cfg.model_dump()

    def inputs(self) -> List[dict]:
        return [{"corpus": self.cfg.corpus, "fingerprint": self.corpus_fp, "sentences": len(self.ids)}]

    def tables(self) -> dict:
        return store_schemas(self.meta["rep_dim"], self.meta["core_dim"])

    def open_extra(self) -> dict:
        return {"identity": self.identity, "cache": self.meta}

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        return [StageSpec(CacheStage, Resources.of(self.cfg.resources), args=dict(cfg=self.cfg, fp=ctx.fp))]

    def summary(self, ctx: RunContext) -> dict:
        markers = [m for m in ctx.store.markers().values() if m.get("fingerprint") == ctx.fp]
        return {"counts": {k: sum(m.get("extra", {}).get(k, 0) for m in markers) for k in ("sentences", "centres")}}


def rep_cache_uri(rep_cache: Optional[str], out: str) -> str:
    """The cache a job uses: the one given, else its own under <out>/rep_cache."""
    return rep_cache or f"{out.rstrip('/')}/{SUBDIR}"


def given_rep_cache(rep_cache: Optional[str], out: str) -> Optional[str]:
    """A cache the job reads as an input: one given that is not the job's own (<out>/rep_cache)."""
    from sentsim.out_paths import location

    if rep_cache is None or location(rep_cache) == location(rep_cache_uri(None, out)):
        return None
    return rep_cache


def check_rep_cache(uri: str, identity: str) -> None:
    """A given (not built here) cache must be complete and made for this corpus and discriminator."""
    store = ShardStore(uri)
    m = store.read_manifest()
    if m is None or m.get("stage") != REP_CACHE_STAGE:
        raise UsageError(f"{uri}: not a representation cache (build one with `sentsim cache build`)")
    if m.get("identity") != identity:
        raise UsageError(f"{uri}: the representation cache was built for another corpus or discriminator; rebuild it")
    if not store.is_complete():
        raise UsageError(f"{uri}: the representation cache is incomplete; finish it with `sentsim cache build`")


def own_rep_cache_run(rep_cache: Optional[str], out: str, corpus: str, discriminator: str, identity: str,
                      resources: StageResources) -> Optional["RepCacheRun"]:
    """The job's own cache as the run ensure_rep_cache would build under --force-new (for the checks before the
    job's old run is discarded: ShardedJob.runs_first), or None: a cache given, or its own one complete with this
    identity, which it keeps."""
    if rep_cache:
        return None
    uri = rep_cache_uri(None, out)
    store = ShardStore(uri)
    try:
        old = store.read_manifest()
    except StoreError:
        old = None
    if old is not None and old.get("identity") == identity and old.get("complete"):
        return None
    return RepCacheRun(RepCacheConfig(corpus=corpus, discriminator=discriminator, out=uri, resources=resources),
                       force_new=True)


def ensure_rep_cache(rep_cache: Optional[str], out: str, corpus: str, discriminator: str, identity: str,
                     resources: StageResources, executor: str = "ray", force_new: bool = False,
                     address: Optional[str] = None, quiet: bool = False, max_units: Optional[int] = None) -> str:
    """Check the given cache, or build (resume) the job's own one, at most `max_units` of its units; returns
    its URI, or raises PrerequisiteStopped when --max-units left it unfinished."""
    uri = rep_cache_uri(rep_cache, out)
    if rep_cache:
        check_rep_cache(uri, identity)
        return uri
    # --force-new on the job replaces its own cache only when that cache is not this one: for other models, or
    # a folder whose manifest is missing or unreadable (which names no identity to keep). A cache of the same
    # identity is still right, and rebuilding it would only cost time.
    try:
        old = ShardStore(uri).read_manifest()
    except StoreError:
        old = None
    same = old is not None and old.get("identity") == identity
    m = build_rep_cache(RepCacheConfig(corpus=corpus, discriminator=discriminator, out=uri, resources=resources),
                        executor=executor, force_new=force_new and not same, address=address, quiet=quiet,
                        max_units=max_units)
    if not m["complete"] and max_units is not None:
        raise PrerequisiteStopped(f"the representation cache ({uri}) stopped at --max-units {max_units}, "
                                  f"{m['completed_units']}/{m['planned_units']} units done; no context is screened "
                                  "until it is all done")
    if not m["complete"]:
        raise UsageError(f"{uri}: the representation cache did not complete; run the job again to resume it")
    return uri
