"""The pool harvest's labelling: a unit of planned pairs -> `Scored` (harvest/work.py), Eq. 4 of each pair from
the two sentences' stored vectors over the shared pool (eq4_rows.vector_rows). Nothing is scored here, so the
stage asks for a CPU share only; RankStage and WriteStage then treat its output as any harvest's.

Each actor holds the whole vectors run in memory (|P| x 4 float32 a sentence: 4 KB at |P| = 256), read once
through RunReader, and the context effect the driver computed over all of it (side table context_effect).
"""

from __future__ import annotations

import time
from typing import List, Optional

import numpy as np

from sentsim.harvest.eq4_rows import vector_rows
from sentsim.harvest.work import Pair, PairRow, Scored, SentenceContexts, envelope
from sentsim.pipeline import Stage


class PoolLabelStage(Stage):
    """{"unit", "pairs"} -> Scored, from the vectors run at `vectors` (complete: the harvest built it first)."""

    name = "label"

    def __init__(self, out: str, fp: str, metric: str, precision: Optional[str]):
        self.out, self.fp, self.metric, self.precision = out, fp, metric, precision

    def setup(self) -> None:
        from sentsim.harvest import metrics
        from sentsim.harvest.pool import EFFECT_TABLE
        from sentsim.harvest.pool_vectors import StoredVectors, vectors_uri
        from storage import ShardStore

        self.stored = StoredVectors(vectors_uri(self.out))
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
            idx = [(v.row[p.s1_id], v.row[p.s2_id]) for p in pairs]
            eq4 = vector_rows(idx, v.S, v.terms, self.metric, self.effect)
            sids = sorted({s for p in pairs for s in (p.s1_id, p.s2_id)})
            texts = {s: v.texts[v.row[s]] for s in sids}
            scored = np.isfinite(v.S[[v.row[s] for s in sids]]).sum(axis=1) if sids else []
            sentences = {s: SentenceContexts(None, None, int(n)) for s, n in zip(sids, scored)}
            out.append(envelope(Scored(
                unit=unit["unit"], texts=texts, sentences=sentences,
                rows=[PairRow(p, row) for p, row in zip(pairs, eq4)], context_scores=[], n_scored=0,
                precision=self.precision, timing={"label": time.perf_counter() - t0})))
        return out
