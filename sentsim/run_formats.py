"""What this sentsim still accepts of runs written in an earlier run format (storage.store.FORMAT_VERSION).

Every item here is asked of a run by its format (`storage.store.run_format` of its manifest), so each
goes when that format is no longer read; docs/notes/2026-11-27-jobs-as-classes.md is the migration note.

Format 1, every run opened before manifests recorded their format:

- its fingerprint may hold the input paths as they were spelt: a job's `fingerprint_in_format(1, stored)`
  re-spells today's config that way (`spelt_as_stored`), and a stored run holding that fingerprint is this
  same run and resumes under it (sentsim/executor.py);
- a harvest's scoring config may hold the scorer's removed actor settings (`actor_num_cpus`,
  `actor_num_gpus`): `scoring_config` leaves them out, so remix reads such a harvest;
- a harvest's sentences table may lack `context_ids` and `base_vector`, and its context_scores may be
  float64: `sentence_schema_of` and `context_score_schema_of` (sentsim/harvest/stages.py) read them so, for
  a format 1 run and for a remix, whose tables keep its source's schemas.
"""

from __future__ import annotations

import copy
from typing import Sequence

from storage.store import run_format

REMOVED_SCORING_KEYS = {1: ("actor_num_cpus", "actor_num_gpus")}


def spelt_as_stored(semantic: dict, stored: dict, keys: Sequence[str]) -> dict:
    """`semantic` (a config dump that keeps its input paths) with each path in `keys` (dotted for a nested
    key, e.g. "rank.encoder") spelt as the stored run's config spelt it, where that config has it."""
    out = copy.deepcopy(semantic)
    old = stored.get("config") or {}
    for key in keys:
        *parents, leaf = key.split(".")
        here, there = out, old
        for p in parents:
            here, there = here[p], (there.get(p) or {}) if isinstance(there, dict) else {}
        if isinstance(there, dict) and leaf in there:
            here[leaf] = there[leaf]
    return out


def scoring_config(manifest: dict) -> dict:
    """A harvest's stored scoring settings, without those its run format held that this sentsim removed."""
    removed = REMOVED_SCORING_KEYS.get(run_format(manifest), ())
    return {k: v for k, v in (manifest.get("config") or {}).get("scoring", {}).items() if k not in removed}
