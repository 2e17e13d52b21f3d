"""Identities: what a run's fingerprint is made of, each computed in one place.

A resumable run is refused when its fingerprint changes, and a fingerprint holds what the run's
output depends on, never how a path was spelt:

    fingerprint(*parts)         the hash of JSON-able parts: a resolved config, the identities below
    checkpoint_hash(path)       a model folder (or file) by the bytes of its weight, config and vocab files,
                                not a trainer's scratch beside them nor its model card (`model_files`)
    corpus_fingerprint(corpus)  a corpus run by the fingerprint its build recorded (config and inputs' sha256)
    cache_identity(corpus, d)   a representation cache by its format, corpus, discriminator and window

Files by their bytes are `storage.fs` (`sha256_file`, and `input_sha256` for the inputs a job reads:
corpus documents, a pairs file); the store's own checksums of shards and records stay in storage/.
Each job composes these into its fingerprint parts: corpus_job, screening/cache_job.py,
screening/contexts_job.py, harvest/job.py (model_hashes), harvest/remix.py, and the trainers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sentsim.errors import UsageError

# A representation cache (screening/cache.py, written by `sentsim cache build`) is known by the stage name of
# its run and the format of its content, both part of its identity: a change to either makes every cache
# made before another cache, rebuilt rather than misread.
REP_CACHE_STAGE = "rep_cache"
REP_CACHE_FORMAT = "sentsim-repcache-v1"


def fingerprint(*parts: Any) -> str:
    """Stable hash of JSON-able parts (resolved config, input manifests, checkpoint hashes)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


# The files that make a model, by suffix: weights, configs, vocabularies and tokenizers.
MODEL_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".bin")
# What a trainer keeps in its --out beside the model it exports: training state (Ray Train's timestamped
# checkpoints, the inline checkpoint, the discriminator's _train), curves and its own records of the run.
# A rerun rewrites them and none of it is the model, so none of it is the model's identity.
TRAINER_SCRATCH = frozenset({"ray", "runs", "checkpoint", "checkpoint.old", "checkpoint.tmp", "_train", "curves",
                             "run.json", "summary.json", "train_summary.json", "eval.json"})
# A context bundle (context.json) also keeps its training copy of the tokenizer in tokenizer/; the
# bundle's own is the tokenizer.json beside context.json.
CONTEXT_BUNDLE_SCRATCH = frozenset({"tokenizer"})
# What an exported model says about itself (sentsim_model.json: its file list, provenance and the STS scores
# `eval sts` records there): it describes the model and changes when the model is evaluated, so it is no part
# of its identity, like the model card README.md.
MODEL_DESCRIPTION = frozenset({"sentsim_model.json"})


def model_files(path: str | Path) -> list[Path]:
    """The files that are a model folder's model (or the file itself): its weight, config and vocab
    files, not the trainer's scratch (TRAINER_SCRATCH), documentation (a model card README.md or the
    export's sentsim_model.json, both of which `eval sts` updates with scores, or any other README) nor a
    killed writer's temporary file."""
    from storage.fs import TMP_PREFIX

    p = Path(path)
    if not p.is_dir():
        return [p] if p.suffix in MODEL_SUFFIXES or p.name == "tokenizer.json" else []
    scratch = TRAINER_SCRATCH | (CONTEXT_BUNDLE_SCRATCH if (p / "context.json").is_file() else frozenset())
    out = []
    for f in p.rglob("*"):
        rel = f.relative_to(p)
        if (rel.parts[0] in scratch or not f.is_file() or f.name.upper().startswith("README")
                or f.name in MODEL_DESCRIPTION or f.name.startswith(TMP_PREFIX)):
            continue
        if f.suffix in MODEL_SUFFIXES or f.name == "tokenizer.json":
            out.append(f)
    return sorted(out)


def checkpoint_hash(path: str) -> str:
    """sha256 over a model folder's model files (`model_files`): goes into every fingerprint. A rerun of
    the trainer that wrote it, which rewrites only its scratch, keeps it."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such model checkpoint")
    from pyarrow.fs import LocalFileSystem

    from storage.fs import hash_into

    local = LocalFileSystem()
    h = hashlib.sha256()
    for f in model_files(p):
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        hash_into(h, local, str(f))
    return h.hexdigest()[:16]


def corpus_fingerprint(corpus: str | Path) -> str:
    """The corpus run's fingerprint, as its build recorded it (a UsageError line when it is no corpus)."""
    from corpus.view import open_corpus

    return open_corpus(corpus).fingerprint


def cache_identity(corpus_fp: str, discriminator: str) -> str:
    """What a representation cache's content depends on: its format, the corpus, the discriminator
    checkpoint and the discriminator's window. The harvest and `sentsim contexts` put it into their
    own fingerprints, and a cache made for another corpus or discriminator is refused."""
    cp = Path(discriminator) / "config.json"
    if not cp.is_file():
        raise UsageError(f"{discriminator}: not a discriminator directory (no config.json)")
    window = int(json.loads(cp.read_text(encoding="utf-8")).get("model", {}).get("window", 1))
    return fingerprint(REP_CACHE_STAGE, REP_CACHE_FORMAT, corpus_fp, checkpoint_hash(discriminator), window)
