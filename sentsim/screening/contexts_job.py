"""`sentsim contexts`: the context set C_s of each sentence, as resumable shards (003 §3.3).

Sentences come from the corpus (a seeded sample, or all of them) or from a file: one sentence per
line, or a pairs file in any format `harvest --pairs` reads (sentsim.pairs_file), both sides of each
pair. Each work unit is a block of sentences; an actor pool of `ScreenStage`s, each holding the index,
the discriminator and its representation cache once, writes one shard per unit. With a discriminator, the cache
(`contexts.rep_cache`, else built under <out>/rep_cache first, resumable) scores every
candidate context by the head alone (003 §3.3); its identity is part of the run's fingerprint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from sentsim.config import Section, Seed
from sentsim.errors import UsageError
from sentsim.executor import RunContext, ShardedJob, execute
from sentsim.identity import fingerprint
from sentsim.out_paths import check_out
from sentsim.pipeline import Resources, Stage, StageResources, StageSpec
from sentsim.run_formats import spelt_as_stored
from sentsim.screening.config import ContextSetConfig, discriminator_in_use
from storage import ShardStore

STAGE = "contexts"
PATHS = ("corpus", "index", "discriminator", "sentences")  # input files and folders of a ScreenConfig
CONTEXT_SCHEMA = pa.schema([
    ("sentence_id", pa.int64()), ("rank", pa.int32()), ("chunk_id", pa.int64()), ("slot", pa.int32()),
    ("centre_id", pa.int64()), ("retrieval_score", pa.float32()), ("log_p_disc", pa.float32()),
])
QUERY_SCHEMA = pa.schema([
    ("sentence_id", pa.int64()), ("text", pa.string()), ("n_contexts", pa.int32()), ("candidates", pa.int32()),
    ("shortfall", pa.string()),
])


class ScreenConfig(Section):
    corpus: str
    index: str
    out: str
    discriminator: Optional[str] = Field(
        None, description="a `sentsim train discriminator` model: it screens the retrieved contexts (003 §3.2.1) and "
                          "scores Eq. 3's disc term over them; contexts.mode=screened only")
    sentences: Optional[str] = Field(None, description="file of sentences (one per line, or a pairs file as "
                                                       "`harvest --pairs` reads it: both sentences of each pair); "
                                                       "default: sample the corpus")
    sample: int = Field(1000, ge=1, description="corpus sentences to screen when no file is given")
    seed: Seed = 0
    window: int = Field(1, ge=1, le=8, description="sentences on each side of a context")
    per_unit: int = Field(64, ge=1)
    contexts: ContextSetConfig = ContextSetConfig()
    resources: StageResources = StageResources()

    @model_validator(mode="after")
    def _own_context_sets(self):
        if self.contexts.mode == "pool":
            raise ValueError("contexts.mode=pool is a harvest's shared pool; `sentsim contexts` builds each "
                             "sentence's own C_s (mode screened or random)")
        if self.contexts.rerank_shortlist:
            raise ValueError(f"contexts.rerank_shortlist: the re-rank scores each context with the context models, "
                             f"which `sentsim contexts` does not load; set it to 0 (contexts.size="
                             f"{self.contexts.rerank_shortlist} writes the same shortlist) and re-rank where you score")
        self.contexts.refuse_an_unused_discriminator(self.discriminator)
        self.contexts.refuse_an_unused_rep_cache(self.discriminator)
        return self


class ScreenStage(Stage):
    name = "screen"

    def __init__(self, cfg: ScreenConfig, fp: str, rep_cache: Optional[str] = None):
        self.cfg = cfg
        self.fp = fp
        self.rep_cache = rep_cache

    def setup(self) -> None:
        from corpus.view import CorpusIndex
        from sentsim.retrieval import open_retriever
        from sentsim.screening.contexts import ContextSource

        corpus = CorpusIndex(self.cfg.corpus)
        disc = cache = None
        if discriminator_in_use(self.cfg.discriminator, self.cfg.contexts.mode):
            from sentsim.discriminator import Discriminator
            from sentsim.screening.cache import ContextCache

            disc = Discriminator.load(self.cfg.discriminator, corpus=self.cfg.corpus)
            if self.rep_cache:
                cache = ContextCache.from_store(self.rep_cache, disc)
        self.source = ContextSource(corpus, self.cfg.contexts, self.cfg.window, self.cfg.seed,
                                    open_retriever(self.cfg.index, corpus=self.cfg.corpus), disc, cache)

    def process(self, items: List[dict]) -> List[dict]:
        out = []
        for item in items:
            t0 = time.perf_counter()
            ids, texts = item["ids"], item["texts"]
            sets = self.source.context_sets(texts)
            rows = {k: [] for k in CONTEXT_SCHEMA.names}
            for sid, cs in zip(ids, sets):
                for rank, c in enumerate(cs.contexts):
                    for k, v in zip(CONTEXT_SCHEMA.names, (sid, rank, c.chunk_id, c.slot, c.centre_id,
                                                            c.retrieval_score, c.log_p_disc)):
                        rows[k].append(v)
            q = pa.Table.from_pydict({
                "sentence_id": ids, "text": texts, "n_contexts": [len(c.contexts) for c in sets],
                "candidates": [c.candidates for c in sets], "shortfall": [c.shortfall_reason for c in sets],
            }, schema=QUERY_SCHEMA)
            ShardStore(self.cfg.out).write_unit(
                item["unit"], {"contexts": pa.Table.from_pydict(rows, schema=CONTEXT_SCHEMA), "queries": q}, self.fp,
                {"sentences": len(ids), "shortfalls": sum(c.shortfall_reason is not None for c in sets)})
            out.append({"unit": item["unit"], "sentences": len(ids), "seconds": time.perf_counter() - t0})
        return out


def _file_sentences(path: str) -> list:
    """The sentences of a --sentences file, each once: both sentences of each pair of a pairs file, read by
    sentsim.pairs_file as `harvest --pairs` reads it (any format, a header, gzip), else one sentence a line."""
    from sentsim.pairs_file import decode_text, file_bytes, holds_pairs, read_pairs_file, split_lines

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: sentence file not found")
    raw, name, _ = file_bytes(p)
    text = None if name.endswith(".parquet") else decode_text(p, raw)
    if text is None or holds_pairs(text, name):
        texts = [s for s1, s2, _ in read_pairs_file(path) for s in (s1, s2)]
    else:
        texts = []
        for n, line in enumerate(split_lines(text), 1):
            if "\t" in line:  # a pair below a first line that is a sentence: no one format reads both
                raise UsageError(f"{path}:{n}: a TAB in a file of one sentence a line (its first line has "
                                 "none); give a pair s1<TAB>s2 on every line, or one sentence on each")
            texts.append(line)
    texts = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
    if not texts:
        raise UsageError(f"{path}: no sentences")
    return texts


def _queries(cfg: ScreenConfig, corpus) -> tuple[list, list]:
    from corpus.documents import text_id

    if cfg.sentences:
        texts = _file_sentences(cfg.sentences)
        return [text_id(t) for t in texts], texts
    rng = np.random.default_rng(cfg.seed)
    ids = np.sort(rng.choice(corpus.ids, size=min(cfg.sample, len(corpus.ids)), replace=False)).tolist()
    return ids, corpus.texts(ids)


def screen_contexts(cfg: ScreenConfig, executor: str = "ray", force_new: bool = False,
                    address: Optional[str] = None, quiet: bool = False, max_units: Optional[int] = None) -> dict:
    return execute(ContextsRun(cfg), executor=executor, address=address, force_new=force_new, quiet=quiet,
                   max_units=max_units)


class ContextsRun(ShardedJob):
    """One `sentsim contexts` run, resolved before anything is written: its inputs checked, its
    sentences read and cut into units, its models identified."""

    stage = STAGE
    count = "sentences"
    unfingerprinted = ("out", "resources", "contexts.rep_cache", "inputs.0.corpus") + PATHS

    def __init__(self, cfg: ScreenConfig):
        from corpus.view import CorpusIndex
        from sentsim.identity import cache_identity, checkpoint_hash
        from sentsim.retrieval.base import check_index
        from sentsim.screening.cache_job import check_rep_cache, given_rep_cache, rep_cache_uri

        check_out(cfg.out, {"--corpus": cfg.corpus, "--index": cfg.index, "--discriminator": cfg.discriminator,
                            "--sentences": cfg.sentences,
                            "contexts.rep_cache": given_rep_cache(cfg.contexts.rep_cache, cfg.out)}, writes="run")
        index = check_index(cfg.index, corpus=cfg.corpus)  # whole and for this corpus, before a unit searches it
        self.cfg, self.out = cfg, cfg.out
        self.corpus = CorpusIndex(cfg.corpus)
        self.ids, texts = _queries(cfg, self.corpus)
        self.unit_list = [{"unit": u, "ids": self.ids[i:i + cfg.per_unit], "texts": texts[i:i + cfg.per_unit]}
                          for u, i in enumerate(range(0, len(self.ids), cfg.per_unit))]
        self.screened = discriminator_in_use(cfg.discriminator, cfg.contexts.mode)
        self.identity = cache_identity(self.corpus.fingerprint, cfg.discriminator) if self.screened else None
        self.models = {"index": index.get("fingerprint"),
                       "discriminator": checkpoint_hash(cfg.discriminator) if cfg.discriminator else None,
                       "rep_cache": self.identity}
        self.rep_cache = rep_cache_uri(cfg.contexts.rep_cache, cfg.out) if self.screened else None
        if self.rep_cache and cfg.contexts.rep_cache:  # a given cache is checked before the run folder is made
            check_rep_cache(self.rep_cache, self.identity)

    @property
    def units(self) -> List[dict]:
        return self.unit_list

    def _semantic(self) -> dict:
        own = self.cfg.model_dump(exclude={"out": True, "resources": True})
        contexts = self.cfg.contexts.semantic()
        contexts.pop("exclude_in_partner_contexts", None)  # a harvest's Eq. 4 key: these runs have no pairs
        return dict(own, contexts=contexts)

    def fingerprint_parts(self) -> tuple:
        # the input paths' contents are fingerprinted (corpus and index fingerprints, checkpoint hash, the queries
        # themselves), not their spelling, so a run resumes from another folder (HarvestConfig.semantic, the same)
        sem = {k: v for k, v in self._semantic().items() if k not in PATHS}
        return (STAGE, sem, self.corpus.fingerprint, self.models, len(self.ids), fingerprint(self.ids))

    def fingerprint_in_format(self, version: int, stored: dict) -> Optional[str]:
        """Format 1: the input paths were fingerprinted as spelt (as the stored run spelt them), with the
        number of sentences but not the sentences themselves."""
        if version != 1:
            return None
        sem = spelt_as_stored(self._semantic(), stored, PATHS)
        return fingerprint(STAGE, sem, self.corpus.fingerprint, self.models, len(self.ids))

    def config(self) -> dict:
        return self.cfg.model_dump()

    def inputs(self) -> List[dict]:
        return [{"corpus": self.cfg.corpus, "sentences": len(self.ids)}]

    def tables(self) -> dict:
        return {"contexts": CONTEXT_SCHEMA, "queries": QUERY_SCHEMA}

    def stages(self, ctx: RunContext) -> List[StageSpec]:
        return [StageSpec(ScreenStage, Resources.of(self.cfg.resources),
                          args=dict(cfg=self.cfg, fp=ctx.fp, rep_cache=self.rep_cache))]

    def prepare(self, ctx: RunContext) -> None:
        from sentsim.screening.cache_job import ensure_rep_cache

        if self.screened:  # the discriminator's reps, cached once before screening (003 §3.3)
            cfg = self.cfg
            ensure_rep_cache(cfg.contexts.rep_cache, cfg.out, cfg.corpus, cfg.discriminator, self.identity,
                             cfg.resources, executor=ctx.executor, force_new=ctx.force_new, address=ctx.address,
                             quiet=ctx.quiet, max_units=ctx.max_units)

    def runs_first(self, ctx: RunContext) -> List[ShardedJob]:
        from sentsim.screening.cache_job import own_rep_cache_run

        cfg = self.cfg
        own = own_rep_cache_run(cfg.contexts.rep_cache, cfg.out, cfg.corpus, cfg.discriminator, self.identity,
                                cfg.resources) if self.screened else None
        return [own] if own is not None else []

    def summary(self, ctx: RunContext) -> dict:
        # the done units' counts, so that a run stopped by --max-units reports what it holds, not what it plans
        markers = [m for m in ctx.store.markers().values() if m.get("fingerprint") == ctx.fp]
        return {"counts": {"sentences": sum(int(m.get("files", {}).get("queries", {}).get("rows", 0)) for m in markers),
                           "shortfalls": sum(m.get("extra", {}).get("shortfalls", 0) for m in markers)}}
