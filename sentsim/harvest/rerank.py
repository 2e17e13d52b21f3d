"""C_s chosen by Eq. 3 (003 §3.3: "C_s is built by selecting top ranked contexts by Eq. 3").

With `contexts.rerank_shortlist` = N, ContextStage hands ScoreStage each sentence's shortlist: the screening's
top N diverse contexts (by the discriminator's head-only log p(y=1 | s, c), or in retrieval order without
one). ScoreStage scores every sentence in each context of its own shortlist, S(s, c) with every kept Eq. 3
term, keeps the top |C_s| by S (best first) and only then plans the unit's Eq. 4 items, so a pair is compared
over the re-ranked C_s1 + C_s2.

- Diversity holds: the shortlist obeys 003's constraints (one context per chunk, Jaccard of the (i-1)-th
  sentences below the threshold), each a condition on two chosen contexts, so every subset obeys them too.
  The rules are applied in the screening's order, though, where the paper adds contexts in Eq. 3's order: of
  two contexts from one chunk, the shortlist keeps the one the discriminator ranks higher even when the other
  has the higher S. Eq. 3 over every candidate (tens of thousands a sentence) is what a shortlist avoids.
- A context whose S is NaN (no term could be scored) ranks below every scored one; equal scores keep the
  screening's order. S is Eq. 3 as the harvest combines it (context.scorer.combine_terms): a term that could
  not be scored (a target with no token) is left out of that item's sum.
- A sentence with no more than |C_s| contexts in its shortlist keeps them all, in the screening's order,
  and costs no re-rank item. Every other sentence of a unit is re-ranked, a pair's or not, and a sentence in
  several units once in each.
- Every item scored here is handed to the Eq. 4 pass (`Reranked.rows`), so an item is scored once whether its
  context is kept or is a partner's (a cross term). Only the items Eq. 4 reads are written to context_scores,
  and a remix under other weights keeps C_s as the harvest chose it (commands/remix.py says so).
- C_s now depends on the context models' scores, whose last digits vary with what is batched together (about
  1e-6 in fp32 on a CPU, e.g. with another resources.scoring.units_per_call; more under bf16): two contexts
  whose S nearly tie at the cut can swap between runs, or between a run's units and its resumed ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional

import numpy as np

from sentsim.harvest.work import WithContexts


@dataclass(frozen=True)
class Reranked:
    """The re-rank of one scoring call's units: the units with C_s cut to the Eq. 3 top |C_s|, the scorer's
    result for the shortlist items (None when no sentence needed a re-rank), and per unit the row of that
    result for each (sentence, context key) of its shortlists and how many items the unit's re-rank scored."""

    units: List[WithContexts]
    result: Optional[object]  # context.scorer.ScoreResult
    rows: List[Dict[tuple, int]]
    items: List[int]


def eq3_order(S: np.ndarray, size: int) -> np.ndarray:
    """Indices of the `size` best contexts by S, best first: NaN last, ties in shortlist order."""
    S = np.asarray(S, dtype=np.float64)
    order = np.lexsort((np.arange(len(S)), -np.where(np.isnan(S), -np.inf, S), np.isnan(S)))
    return order[:size]


def rerank(units: List[WithContexts], scorer, size: int) -> Reranked:
    """Score each sentence of `units` in its own shortlist in one scorer call and cut C_s to |C_s| = `size`."""
    from sentsim.context.scorer import ContextItem

    batch, spans = [], []  # spans: (unit index, sentence, first item, shortlist length)
    for u, w in enumerate(units):
        for s, cs in w.csets.items():
            if len(cs.contexts) > size:
                spans.append((u, s, len(batch), len(cs.contexts)))
                batch += [ContextItem(w.texts[s], c.left, c.right, w.disc.get((s, c.key))) for c in cs.contexts]
    result = scorer.score(batch) if batch else None
    rows: List[Dict[tuple, int]] = [{} for _ in units]
    items = [0] * len(units)
    csets = [dict(w.csets) for w in units]
    for u, s, start, n in spans:
        keep = eq3_order(result.score[start:start + n], size)
        shortlist = csets[u][s].contexts
        csets[u][s] = replace(csets[u][s], contexts=[shortlist[i] for i in keep])
        rows[u].update({(s, c.key): start + i for i, c in enumerate(shortlist)})
        items[u] += n
    return Reranked([replace(w, csets=c) for w, c in zip(units, csets)], result, rows, items)
