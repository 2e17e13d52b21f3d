"""What travels between the harvest's stages: one declared type per hand-off, read in this file alone.

    unit dict (job.plan)  {"unit", "anchors"} (corpus harvest) or {"unit", "pairs", "repeats"} (--pairs)
      ContextStage   ->  WithContexts   the unit's pairs, sentence texts, context sets C_s, discriminator terms
      ScoreStage     ->  Scored         Eq. 4 pair rows, what each sentence keeps of C_s (after the Eq. 3 re-rank,
                                        when on: rerank.py), context_scores rows
      RankStage      ->  Ranked         the same, each row with its rank similarity, and the sentences' rank targets
                                        (no RankStage with rank.enabled=false: WriteStage then takes the Scored)
      WriteStage     ->  result dict    the unit's counts for the executor's progress line, once its shards are written

The pool harvest (contexts.mode=pool, harvest/pool*.py) has two passes. Its vectors run:

    unit dict {"unit", "ids", "texts"}
      PoolScoreStage   ->  SentenceVectors  each sentence's Eq. 3 scores over the shared pool P
      VectorWriteStage ->  result dict      once its sentence_vectors shard is written

with rank targets on, its ranks run (harvest/pool_ranks.py), each sentence's rank targets encoded once:

    unit dict {"unit", "ids", "texts"}
      RankEncodeStage ->  EncodedRanks  each sentence's rank codes or float16 E1 vector
      RankWriteStage  ->  result dict   once its sentence_ranks shard is written

and its labelling, whose first stage builds the `Scored` that RankStage (PoolRankStage, which reads the
ranks run) and WriteStage take as above:

    unit dict {"unit", "pairs"}
      PoolLabelStage ->  Scored   Eq. 4 pair rows from the stored vectors (no items scored here)

The pipeline runner (sentsim.pipeline) hands dicts from stage to stage and stamps each with where it ran,
so a hand-off travels as the envelope {"unit": u, "work": <hand-off>} (`envelope`, `work_of`). A field
never changes type on the way: a stage that adds something builds the next type (`dataclasses.replace`
keeps the rest). A stage placed between two others takes and returns the type of that hand-off; one between
RankStage and WriteStage, e.g., reads a `Ranked` and returns a `Ranked` with fewer rows (a `Scored` when rank
targets are off).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, NamedTuple, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from sentsim.screening.contexts import ContextSet

WORK = "work"  # the envelope's key for the typed hand-off


@dataclass(frozen=True)
class Pair:
    """One pair to score: its sentence ids, how it was found (`kind`: a partner kind, or "explicit"), the
    gold score a pairs file gave it, and how many earlier rows of that file hold the same pair (`repeat`)."""

    s1_id: int
    s2_id: int
    kind: str
    gold: Optional[float] = None
    repeat: int = 0


@dataclass
class WithContexts:
    """ContextStage's output. `disc[(sentence, context key)]`: the discriminator term of that sentence in
    that context, for the sentence's own contexts and its partners' (empty without a discriminator).
    `held`: the (sentence, context key) items whose context's window holds the sentence, which Eq. 4 leaves
    out (ContextSetConfig.exclude_in_partner_contexts)."""

    unit: int
    anchored: bool  # a corpus harvest (pairs around anchors) rather than a pairs file
    pairs: List[Pair]
    texts: Dict[int, str]
    csets: Dict[int, "ContextSet"]
    disc: Dict[Tuple[int, int], float]
    timing: Dict[str, float] = field(default_factory=dict)
    held: FrozenSet[Tuple[int, int]] = frozenset()


@dataclass(frozen=True)
class SentenceContexts:
    """What the sentences table keeps of a sentence's C_s: its context ids in order, and why it has fewer
    contexts than asked for (None when it has them all). In a pool harvest every sentence shares the pool:
    `context_ids` is None (the run's `pool` side table lists them) and `pooled` counts its scored contexts."""

    context_ids: Optional[List[int]]
    shortfall: Optional[str]
    pooled: Optional[int] = None

    @property
    def n_contexts(self) -> int:
        return self.pooled if self.context_ids is None else len(self.context_ids)


class ContextScore(NamedTuple):
    """One context_scores row: the Eq. 3 terms and S of a sentence in one context."""

    sentence_id: int
    context_id: int
    fwd: float
    left: float
    right: float
    disc: Optional[float]
    S: float


@dataclass(frozen=True)
class PairRow:
    """A pair and its row of the pairs table so far: `eq4` holds the Eq. 4 columns (eq4_rows.pair_rows:
    score, null_reason, sim_*, n_ctx_*, and score_<variant> when grouped); RankStage fills `rank_sim`."""

    pair: Pair
    eq4: Dict[str, Any]
    group_id: Optional[int] = None
    rank_sim: Optional[float] = None

    @property
    def score(self) -> Optional[float]:
        return self.eq4.get("score")


@dataclass
class Scored:
    """ScoreStage's output. `n_scored`: the (sentence, context) items scored, of which `n_reranked` to choose C_s
    by Eq. 3 (contexts.rerank_shortlist; harvest/rerank.py); `precision`: the format they were scored in
    ("off" = fp32)."""

    unit: int
    texts: Dict[int, str]
    sentences: Dict[int, SentenceContexts]
    rows: List[PairRow]
    context_scores: List[ContextScore]
    n_scored: int
    precision: Optional[str]
    timing: Dict[str, float] = field(default_factory=dict)
    n_reranked: int = 0


@dataclass(frozen=True)
class SentenceRanks:
    """The rank targets of a unit's sentences (rows in `sorted(texts)` order): rank codes, or float16 E1
    vectors (rank.storage=vectors), or neither when rank targets are off (`storage` None)."""

    storage: Optional[str] = None
    codes: Optional[np.ndarray] = None
    vectors: Optional[np.ndarray] = None
    bytes_per_sentence: int = 0


@dataclass
class Ranked(Scored):
    """RankStage's output: Scored with each row's rank similarity set, and the sentences' rank targets."""

    ranks: SentenceRanks = SentenceRanks()

    @classmethod
    def of(cls, scored: Scored, rows: List[PairRow], ranks: SentenceRanks) -> "Ranked":
        kept = {f.name: getattr(scored, f.name) for f in fields(Scored)}
        return cls(**dict(kept, rows=rows, timing=dict(scored.timing)), ranks=ranks)


@dataclass
class SentenceVectors:
    """PoolScoreStage's output: for sentence i of the unit (`ids[i]`, `texts[i]`) and pool context j,
    `S[i, j]` (Eq. 3) and `terms[t][i, j]` (each scored direction alone), float32, NaN where not scored (a
    sentence is not scored in a context whose window holds it: contexts.exclude_query_centre and
    exclude_query_window, which C_s applies too; not in the paper).
    `n_scored`: the (sentence, context) items scored."""

    unit: int
    ids: List[int]
    texts: List[str]
    S: np.ndarray
    terms: Dict[str, np.ndarray]
    n_scored: int
    precision: Optional[str]
    timing: Dict[str, float] = field(default_factory=dict)


@dataclass
class EncodedRanks:
    """RankEncodeStage's output: the rank targets of the unit's sentences, row i that of sentence `ids[i]`."""

    unit: int
    ids: List[int]
    ranks: SentenceRanks
    timing: Dict[str, float] = field(default_factory=dict)


def envelope(work) -> dict:
    """The dict the pipeline carries a hand-off in."""
    return {"unit": work.unit, WORK: work}


def work_of(item: dict):
    """The hand-off an envelope carries."""
    return item[WORK]
