"""The pool harvest's labelling: a unit of planned pairs -> `Scored` (harvest/work.py), Eq. 4 of each pair from
the two sentences' stored vectors over the shared pool (eq4_rows.vector_rows). Nothing is scored here, so the
stage asks for a CPU share only; RankStage and WriteStage then treat its output as any harvest's.

The stage reads the whole vectors run (|P| x 4 float32 a sentence: 4 KB at |P| = 256), loaded once a run and
shared by its actors (`pipeline.Shared`: on Ray one copy a node, mapped from the object store), and the context
effect the driver computed over all of it (side table context_effect).
"""

from __future__ import annotations

import time
from typing import List, Optional

import numpy as np

from sentsim.harvest.eq4_rows import vector_rows
from sentsim.harvest.work import Pair, PairRow, Scored, SentenceContexts, envelope
from sentsim.pipeline import Shared, Stage


class PoolLabelStage(Stage):
    """{"unit", "pairs"} -> Scored, from `vectors`, the harvest's complete vectors run (`shared_vectors`)."""

    name = "label"

    def __init__(self, out: str, fp: str, metric: str, precision: Optional[str], vectors: Shared):
        self.out, self.fp, self.metric, self.precision, self.vectors = out, fp, metric, precision, vectors

    def setup(self) -> None:
        from sentsim.harvest import metrics
        from sentsim.harvest.pool import EFFECT_TABLE
        from storage import ShardStore

        self.stored = self.vectors.get()
        self.effect = None
        if metrics.get(self.metric).uses_context_effect:  # written by the driver before the first unit
            t = ShardStore(self.out).read_side_table(EFFECT_TABLE, fingerprint=self.fp)
            self.effect = t.column("effect").to_numpy()

    def process(self, items: List[dict]) -> List[dict]:
        v = self.stored
        out = []
        for unit in items:
            t0 = time.perf_counter()
            pairs: List[Pair] = unit["pairs"]
            first, second = v.rows([p.s1_id for p in pairs]), v.rows([p.s2_id for p in pairs])
            eq4 = vector_rows(np.stack([first, second], axis=1), v.S, v.terms, self.metric, self.effect)
            sids = sorted({s for p in pairs for s in (p.s1_id, p.s2_id)})
            rows = v.rows(sids).tolist()
            texts = {s: v.texts[r] for s, r in zip(sids, rows)}
            scored = np.isfinite(v.S[rows]).sum(axis=1) if sids else []
            sentences = {s: SentenceContexts(None, None, int(n)) for s, n in zip(sids, scored)}
            out.append(envelope(Scored(
                unit=unit["unit"], texts=texts, sentences=sentences,
                rows=[PairRow(p, row) for p, row in zip(pairs, eq4)], context_scores=[], n_scored=0,
                precision=self.precision, timing={"label": time.perf_counter() - t0})))
        return out


def shared_vectors(out: str) -> Shared:
    """The harvest's vectors run (at `out`/pool_vectors), loaded once for all of a run's label actors."""
    import functools

    from sentsim.harvest.pool_vectors import StoredVectors, vectors_uri

    return Shared(functools.partial(StoredVectors, vectors_uri(out)))
