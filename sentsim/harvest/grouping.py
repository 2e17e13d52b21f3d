"""Grouped scoring: Eq. 4 over a group's union of context sets (not in paper 003).

The paper compares s1 and s2 over C_s1 + C_s2 (003 §3.3, Eq. 4). Grouped scoring scores every
sentence of a *group* against the union U of the group's context sets, and keeps three similarities
per pair, all from the same S(s, c) values:

  (a) `paper`    Eq. 4 over C_s1 + C_s2, exactly what an ungrouped harvest gives;
  (b) `union`    Eq. 4 over U: g·|C_s| contexts instead of 2·|C_s|;
  (c) `centred`  Eq. 4 over U after removing each context's mean S over the group's sentences (the
                 `double-centred` metric with the group itself as the reference set). Most of S(s, c)
                 is how predictable the context is, which every sentence shares (harvested pearson
                 scores sit near 1); centring removes that shared part and leaves what depends on s.

A group is an anchor and its partners in a corpus harvest, and `pairs_per_group` pairs that are
TF-IDF neighbours of each other in a `--pairs` run (within a work unit). `sentsim remix` recomputes
all three from the stored context_scores, so the choice can be changed after the scoring.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import pyarrow as pa

from sentsim.harvest.metrics import DOUBLE_CENTRED
from sentsim.harvest.similarity import pair_similarity

VARIANTS = ("paper", "union", "centred")
# the pairs-table columns a grouped harvest adds (group_id: the pair's group, unique within the run)
GROUP_FIELDS = [("group_id", pa.int64()), ("score_paper", pa.float64()), ("score_union", pa.float64()),
                ("score_centred", pa.float64())]


def neighbour_groups(texts: Sequence[Tuple[str, str]], size: int) -> List[int]:
    """Group index of each pair: greedily, the first ungrouped pair and its `size - 1` nearest ungrouped
    pairs by TF-IDF (word uni+bigrams) cosine of the two sentences together. Deterministic."""
    n = len(texts)
    if size <= 1 or n <= 1:
        return list(range(n))
    from sklearn.feature_extraction.text import TfidfVectorizer

    docs = [f"{a} {b}" for a, b in texts]
    try:
        X = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True).fit_transform(docs)
        sim = (X @ X.T).toarray()
    except ValueError:  # no word in any sentence (e.g. only punctuation): groups in input order
        return [i // size for i in range(n)]
    group = [-1] * n
    g = 0
    for i in range(n):
        if group[i] >= 0:
            continue
        group[i] = g
        free = [j for j in range(n) if group[j] < 0]
        # stable: ties keep input order
        for j in sorted(free, key=lambda j: (-sim[i, j], j))[: size - 1]:
            group[j] = g
        g += 1
    return group


def members(pairs: Sequence[Tuple[int, int]], group_of: Sequence[int]) -> Dict[int, List[int]]:
    """group -> its sentence ids, in first-seen order."""
    out: Dict[int, List[int]] = {}
    for (a, b), g in zip(pairs, group_of):
        ss = out.setdefault(g, [])
        for s in (a, b):
            if s not in ss:
                ss.append(s)
    return out


def union_keys(sentences: Sequence[int], own: Dict[int, Sequence[int]]) -> List[int]:
    """The group's context union U, in first-seen order."""
    return list(dict.fromkeys(k for s in sentences for k in own.get(s) or ()))


def needed(pairs: Sequence[Tuple[int, int]], group_of: Sequence[int], own: Dict[int, Sequence[int]]) -> List[tuple]:
    """Every (sentence, context) a grouped unit must score: each group's sentences against its union."""
    need: Dict[tuple, None] = {}
    for g, ss in members(pairs, group_of).items():
        keys = union_keys(ss, own)
        for s in ss:
            for k in keys:
                need.setdefault((s, k), None)
    return list(need)


def group_scores(pairs: Sequence[Tuple[int, int]], group_of: Sequence[int], own: Dict[int, Sequence[int]],
                 S: Callable[[int, int], float], metric: str) -> List[Dict[str, float]]:
    """(a), (b), (c) for each pair (NaN where undefined), from S(sentence, context)."""
    groups = members(pairs, group_of)
    per_group = {}
    for g, ss in groups.items():
        keys = union_keys(ss, own)
        M = np.array([[S(s, k) for k in keys] for s in ss], dtype=np.float64).reshape(len(ss), len(keys))
        with np.errstate(invalid="ignore"):
            effect = np.nanmean(M, axis=0) if len(keys) else np.zeros(0)
        per_group[g] = ({s: i for i, s in enumerate(ss)}, keys, M, effect)
    out = []
    for (a, b), g in zip(pairs, group_of):
        row_of, keys, M, effect = per_group[g]
        paper_keys = list(own.get(a) or []) + list(own.get(b) or [])
        v1 = np.array([S(a, k) for k in paper_keys], dtype=np.float64)
        v2 = np.array([S(b, k) for k in paper_keys], dtype=np.float64)
        u1, u2 = M[row_of[a]], M[row_of[b]]
        out.append({
            "paper": pair_similarity(v1, v2, metric),
            "union": pair_similarity(u1, u2, metric),
            "centred": pair_similarity(u1, u2, DOUBLE_CENTRED, effect),
        })
    return out


__all__ = ["GROUP_FIELDS", "VARIANTS", "group_scores", "members", "needed", "neighbour_groups", "union_keys"]
