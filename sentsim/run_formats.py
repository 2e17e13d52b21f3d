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

Format 2, every pool harvest (contexts.mode=pool) opened before format 3 (none has format 1):

- its fingerprint and its vectors run's hold the contexts keys only screening reads
  (`ContextSetConfig.SCREENED_ONLY`) and `keep_context_scores`, which a pool run never reads: a change to one
  made a new run and rescored every vector. `HarvestRun.fingerprint_in_format(2, ...)` and
  `PoolVectorsRun.fingerprint_in_format` give them back as the stored run holds them
  (`sentsim.screening.config.screened_as_stored`, beside the keys it reads: this module stays below screening,
  whose jobs use it), so such a run and its vectors resume under the fingerprints they hold, whatever those keys
  are set to now.

Formats 1 to 3, every per-pair harvest (contexts.mode screened or random) opened before format 4:

- its fingerprint holds the keys its mode does not read (`HarvestConfig.unread_keys`): a corpus harvest's
  `pairs_per_unit` (its units are `anchors.per_unit` anchors) and, grouped, `grouping.pairs_per_group` (its
  groups are an anchor and its partners); an explicit (--pairs) harvest's `anchors` and `partners`. A change to
  one made a new run, or refused a resume, that would write the same rows. `HarvestRun.fingerprint_in_format`
  gives them back as the stored run holds them (`HarvestRun.config_unread_as_stored`), so such a run resumes
  under the fingerprint it holds, whatever those keys are set to now.

Formats 2 to 4, every pool harvest (contexts.mode=pool) opened before format 5:

- its fingerprint holds the keys its mode does not read (`HarvestConfig.unread_keys`): a corpus harvest's
  `anchors.per_unit` (it labels units of `pairs_per_unit` planned pairs and scores units of
  `sentences_per_unit` sentences) and, clustered (`partners.cluster_size`), `partners.neighbours`, `same_doc`,
  `random` and `neighbour_chunks` (it pairs the anchors within clusters); an explicit (--pairs) harvest's
  `anchors` and `partners`. A change to one refused a resume of a run it could not change.
  `HarvestRun.fingerprint_in_format` gives them back as the stored run holds them (`config_unread_as_stored`,
  with the screened-only keys too for format 2), so such a run resumes under the fingerprint it holds, whatever
  those keys are set to now. Its vectors and ranks runs never held them: their fingerprints are unchanged.

Formats 1 to 5, every run opened before format 6:

- its manifest carries no checksum of itself (`storage.store.SEALED_FORMAT`, `manifest_seal_broken`): it is
  not checked (`store verify` says so in a note), and a resume rewrites it without one, in its own format, since a
  sentsim of that format may resume it next and would keep a checksum stale.

Training run records (a trainer's OUT/run.json, sentsim.training.run.claim_out; their own format,
`sentsim.training.config.TRAINING_FORMAT`), format 1, every record written before records had a `format`:

- a surrogate's fingerprint holds its config less the top-level RESUMABLE_KEYS only, so with the fine-tune
  stage's budget (`finetune.epochs`, `finetune.max_steps`, `finetune.eval_every`), and its harvest by its path
  and counts (`HarvestInfo.summary`), not its content (`HarvestInfo.identity`).
  Its `--finetune-sts` folder is held by its path as given, not by the content of the STS-B files the fine-tune
  stage reads (`stsb_content`: train, dev and test by their sha256; a format-2 record made before that held the
  path as well, and is another run to today's code).
  `SurrogateRun.fingerprint_in_format(1, ...)` makes it so, with the fine-tune budget as the record's config
  held it when first recognised (kept since as the record's `fingerprinted_with`), so such a run goes on under
  the fingerprint it holds, its record keeping format 1, whatever that budget is set to now. A harvest or STS-B
  folder moved since is another run to it (its fingerprint held the path).
- a student's fingerprint holds its config less the top-level RESUMABLE_KEYS (the same keys: no section of a
  student's config has one), `--data` as given and the counts, so its harvest by its path, not its content
  (`sentsim.students.data.harvest_content`: the harvest's fingerprint and its pairs and sentences shards'
  sha256), and its objective's data files (`Objective.data_files`: rse's `triples`) by their paths in its
  config, not their sha256. `StudentRun.fingerprint_in_format(1, ...)` makes it so (nothing kept beside the
  record), and such a run's fit keeps those paths in the workers' config (`StudentRun.workers_config`), as its
  fit's record was made with them, so the same command is a no-op and a larger budget a resume. A harvest or
  triples file moved since is another run to it.
- the other trainers' fingerprints are the same in both formats.
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


# Harvest scoring revisions: a fix that changes what some harvests score, within one run format. A new harvest
# records the revision it was scored under ("scoring_revision" in its manifest); an unfinished harvest of an
# earlier revision that a fix changed is refused on resume, so its done units and the rest are never scored two
# ways in one run. A finished one is read (and rerun as a no-op) as it is. Revisions:
# 1: every harvest whose manifest has no scoring_revision;
# 2: the discriminator term is scored for every item Eq. 4 reads: grouped items in their group-mates' contexts
#    and the reference sentences' items of a double-centred metric, not only a sentence's own and its partner's
#    (revision 1 left those S without λ_disc·log p).
SCORING_REVISION = 2


def scoring_revision(manifest: dict) -> int:
    v = (manifest or {}).get("scoring_revision", 1)
    return v if isinstance(v, int) and not isinstance(v, bool) else 1


def revision_changes(revision: int, *, disc: bool, grouped: bool, context_effect: bool) -> list:
    """What this sentsim scores differently from a harvest of `revision` with these settings: [] where nothing."""
    changes = []
    if revision < 2 and disc and (grouped or context_effect):
        changes.append("the discriminator term of " + " and of ".join(
            (["grouped items in their group-mates' contexts"] if grouped else [])
            + (["the reference sentences' items (the context effect)"] if context_effect else [])))
    return changes
