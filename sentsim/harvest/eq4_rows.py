"""Eq. 4 rows of one work unit, from its per-(sentence, context) terms: the one place they are built.

The harvest's ScoreStage builds a unit's rows here from the terms it has just scored; `sentsim remix`
rebuilds them here from the terms a harvest stored (context_scores), under new λ or another metric.
Each pair (s1, s2) is compared over C = C_s1 + C_s2 (003 §3.3, Eq. 4), and its row holds:

    score        Eq. 4 of S (Eq. 3) under the metric (sentsim/harvest/metrics/), given the context
                 effect when the metric reads one; in a grouped harvest, the variant `variant` instead
    null_reason  why score is null: NO_CONTEXTS (neither sentence has a context; their shortfall
                 reasons follow), FEW_CONTEXTS (fewer than MIN_POINTS distinct ones) or DEGENERATE
    sim_<term>   Eq. 4 of each Eq. 3 term alone (disc, fwd, left, right): what each term says of the pair
    n_ctx_s1/2   |C_s1|, |C_s2|
    score_paper, score_union, score_centred
                 grouped harvests only: the three variants over the pair's group (grouping.py)

The caller adds what is not Eq. 4 (ids, texts, kind, gold, group id, rank similarity, split).
"""

from __future__ import annotations

from functools import cached_property
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from sentsim.harvest import metrics
from sentsim.harvest.grouping import group_scores
from sentsim.harvest.similarity import MIN_POINTS, enough_points, pair_similarity

# null_reason values (the harvest's reports and refusals list them; remix recognises the first)
NO_CONTEXTS = "no contexts for either sentence"
DEGENERATE = "score vectors degenerate (constant or unscored)"
FEW_CONTEXTS = (f"fewer than {MIN_POINTS} distinct contexts for the pair (over two, Eq. 4 is exactly +1 or -1 "
                "whatever the sentences)")

Key = Hashable  # a context's key (an int in the harvest), or anything a caller scores sentences in


def no_contexts_reason(shortfalls: Iterable[Optional[str]]) -> str:
    """NO_CONTEXTS with the two sentences' shortfall reasons (ContextSet.shortfall_reason)."""
    return f"{NO_CONTEXTS}: " + "; ".join(filter(None, shortfalls))


def has_no_contexts(reason: Optional[str]) -> bool:
    return (reason or "").startswith(NO_CONTEXTS)


class MissingTerm(LookupError):
    """A context of a pair's C_s1 + C_s2 was not scored for one of its sentences (`pair`: its index)."""

    def __init__(self, pair: int):
        super().__init__(pair)
        self.pair = pair


class UnitTerms:
    """A unit's scored items: for item i, keys[i] = (sentence, context), S[i] its Eq. 3 score and
    terms[t][i] each Eq. 3 term alone (t in disc, fwd, left, right; NaN where not scored)."""

    def __init__(self, keys: Iterable[Tuple[Hashable, Key]], S: np.ndarray, terms: Mapping[str, np.ndarray]):
        self.index: Dict[tuple, int] = {key: i for i, key in enumerate(keys)}
        self.S = S
        self.terms = dict(terms)

    def items_of(self, s: Hashable, keys: Sequence[Key]) -> List[Optional[int]]:
        return [self.index.get((s, k)) for k in keys]

    def s_at(self, s: Hashable, k: Key) -> float:
        """S(s, k); NaN when it was not scored."""
        i = self.index.get((s, k))
        return self.S[i] if i is not None else float("nan")

    def shared_contexts(self, a: Hashable, b: Hashable) -> List[Key]:
        """The contexts both sentences were scored in, in a's order: C for harvests from before
        sentences.context_ids kept each C_s (which can include a few contexts of other pairs)."""
        shared = set(self._contexts_of.get(b, []))
        return [k for k in self._contexts_of.get(a, []) if k in shared]

    @cached_property
    def _contexts_of(self) -> Dict[Hashable, List[Key]]:
        out: Dict[Hashable, List[Key]] = {}
        for s, k in self.index:
            out.setdefault(s, []).append(k)
        return out


def context_effect(terms: UnitTerms, references: Sequence[Hashable], contexts: Iterable[Key]) -> Dict[Key, float]:
    """Per context, the mean S of the reference sentences there: the context effect that metrics such as
    double-centred read (harvest `reference_sentences`)."""
    return {k: float(np.nanmean([terms.S[terms.index[(r, k)]] for r in references])) for k in contexts}


def _value(x: float) -> Optional[float]:
    return x if np.isfinite(x) else None


def pair_rows(pairs: Sequence[Tuple[Hashable, Hashable]], terms: UnitTerms, metric: str,
              own: Optional[Mapping[Hashable, Sequence[Key]]], shortfall: Optional[Mapping] = None,
              effect: Optional[Mapping[Key, float]] = None, group_of: Optional[Sequence] = None,
              variant: str = "paper") -> List[dict]:
    """The Eq. 4 columns of each pair's row (module docstring), in the order of `pairs`.

    `own`: C_s (its context keys, in order) of each sentence; None for a harvest from before
    context_ids, whose pairs are compared over the contexts both were scored in (no n_ctx then).
    `shortfall`: each sentence's shortfall reason, for NO_CONTEXTS rows. `effect`: the context effect,
    per context, for the score's metric. `group_of`: each pair's group, for the grouped variants
    (grouping.py; needs `own`), of which `variant` fills score. Raises MissingTerm when a context of
    a pair's C was not scored for one of its sentences."""
    shortfall = shortfall or {}
    variants = None
    if group_of is not None:
        variants = group_scores(pairs, group_of, own, terms.s_at, metric)
    rows = []
    for i, (a, b) in enumerate(pairs):
        row: dict = {}
        if own is not None:
            c1, c2 = list(own.get(a) or []), list(own.get(b) or [])
            keys = c1 + c2
            row.update(n_ctx_s1=len(c1), n_ctx_s2=len(c2))
        else:
            keys = terms.shared_contexts(a, b)
        if variants is not None:
            for name, x in variants[i].items():
                row[f"score_{name}"] = _value(x)
        if not keys:
            row.update(score=None, null_reason=no_contexts_reason((shortfall.get(a), shortfall.get(b))),
                       **{f"sim_{t}": None for t in terms.terms})
            rows.append(row)
            continue
        idx1, idx2 = terms.items_of(a, keys), terms.items_of(b, keys)
        if any(j is None for j in idx1 + idx2):
            raise MissingTerm(i)
        eff = np.array([effect[k] for k in keys]) if effect is not None else None
        score = pair_similarity(terms.S[idx1], terms.S[idx2], metric, eff)
        if variants is not None and variant != "paper":
            score = variants[i][variant]
        row["score"] = _value(score)
        row["null_reason"] = None if np.isfinite(score) else FEW_CONTEXTS if len(set(keys)) < MIN_POINTS else DEGENERATE
        for t, values in terms.terms.items():
            row[f"sim_{t}"] = _value(pair_similarity(values[idx1], values[idx2], metric))
        rows.append(row)
    return rows


def vector_rows(pairs: Sequence[Tuple[int, int]], S: np.ndarray, terms: Mapping[str, np.ndarray], metric: str,
                effect: Optional[np.ndarray] = None) -> List[dict]:
    """The Eq. 4 columns of each pair of a pool harvest (harvest/pool.py), whose sentences share the pool:
    pair (i, j) of row indices compares S[i] and S[j] over every pool context (NaN ones dropped pairwise), and
    each term alike. n_ctx_s1/2 count the contexts each sentence was scored in.

    Each value is what pair_similarity gives the pair (the metric is handed the same float64 entries), but the
    finiteness masks and the distinct-point test are done for a block of pairs at once, and the contexts scored
    are counted over the rows the pairs touch only: S holds every sentence of the harvest (100K+ rows), a unit
    a few hundred of them."""
    if not len(pairs):
        return []
    compare = metrics.get(metric).compare
    idx = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    touched, where = np.unique(idx, return_inverse=True)
    scored = np.isfinite(S[touched]).sum(axis=1)[where.reshape(-1, 2)].tolist()
    eff = None if effect is None else np.asarray(effect, dtype=np.float64)
    rows = []
    step = max(1, _BLOCK_FLOATS // max(1, S.shape[1]))
    for lo in range(0, len(idx), step):
        block = idx[lo:lo + step]
        score, both = _block_similarity(S, block, compare, eff)
        sims = {t: _block_similarity(values, block, compare, None)[0] for t, values in terms.items()}
        for r in range(len(block)):
            n1, n2 = scored[lo + r]
            row: dict = {"n_ctx_s1": n1, "n_ctx_s2": n2, "score": _value(score[r])}
            row["null_reason"] = None if np.isfinite(score[r]) else FEW_CONTEXTS if both[r] < MIN_POINTS \
                else DEGENERATE
            for t in terms:
                row[f"sim_{t}"] = _value(sims[t][r])
            rows.append(row)
    return rows


# vector_rows holds a block of pairs' two vectors at once: 2**20 float64 each (8 MiB), 4,096 pairs at |P| = 256
_BLOCK_FLOATS = 2**20


def _block_similarity(M: np.ndarray, block: np.ndarray, compare, effect: Optional[np.ndarray]
                      ) -> Tuple[list, List[int]]:
    """pair_similarity(M[i], M[j], effect) for each (i, j) of `block`, and the contexts finite in both rows.
    The metric sees exactly the arrays pair_similarity hands it, one pair at a time: a metric computed over the
    whole block at once would sum in another order and could differ in the last bit."""
    a = np.asarray(M[block[:, 0]], dtype=np.float64)
    b = np.asarray(M[block[:, 1]], dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    ok = both & np.isfinite(effect) if effect is not None else both
    valid = (ok.sum(axis=1) >= MIN_POINTS) & enough_points(a, b, ok)
    out: list = [float("nan")] * len(block)
    for r in np.flatnonzero(valid).tolist():
        m = ok[r]
        out[r] = compare(a[r][m], b[r][m], None if effect is None else effect[m])
    return out, both.sum(axis=1).tolist()
