"""Which pairs a harvest scores, and which split each pair belongs to.

For every anchor sentence the partners are a seeded mix of retrieval neighbours (likely
similar), sentences of the same document, and random corpus sentences (likely dissimilar), so
that harvested scores cover the whole similarity range. Everything is a pure function of the
seed and the anchor id, so a resumed unit samples exactly the pairs it sampled before.
"""

from __future__ import annotations

import hashlib
from typing import List, Sequence, Set, Tuple

import numpy as np

SPLITS = ("train", "dev", "test")


def pair_key(a: int, b: int) -> Tuple[int, int]:
    return (a, b) if a <= b else (b, a)


def _digest(a: int, b: int) -> bytes:
    lo, hi = pair_key(int(a), int(b))
    return hashlib.blake2b(f"{lo}:{hi}".encode(), digest_size=16).digest()


def pair_id(a: int, b: int, repeat: int = 0) -> int:
    """A stable non-negative int64 id for the unordered pair; `repeat` k > 0 is the pair's (k+1)-th row in a
    pairs file that lists it more than once, so that every row keeps an id of its own."""
    digest = _digest(a, b) if not repeat else hashlib.blake2b(
        f"{min(a, b)}:{max(a, b)}:{int(repeat)}".encode(), digest_size=16).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def repeats(pairs: Sequence[Tuple[str, str]]) -> List[int]:
    """For each (s1, s2) of a pairs file, how many earlier rows hold the same unordered pair (0 for a first)."""
    seen: dict = {}
    out = []
    for s1, s2 in pairs:
        key = (s1, s2) if s1 <= s2 else (s2, s1)
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return out


def pair_split(a: int, b: int, fractions: Sequence[float] = (0.98, 0.01, 0.01)) -> str:
    """train/dev/test from a hash of the pair itself (003 §3.4: 98/1/1), so it never changes on resume."""
    u = int.from_bytes(_digest(a, b)[8:16], "big") / 2**64
    edge = 0.0
    for name, frac in zip(SPLITS, fractions):
        edge += frac
        if u < edge:
            return name
    return SPLITS[-1]


def anchor_rng(seed: int, anchor: int) -> np.random.Generator:
    return np.random.default_rng([seed, int(anchor) & 0x7FFFFFFFFFFFFFFF])


def sample_partners(
    anchor: int,
    seed: int,
    same_doc_pool: np.ndarray,
    corpus_ids: np.ndarray,
    neighbours: Sequence[int],
    n_neighbours: int,
    n_same_doc: int,
    n_random: int,
) -> List[Tuple[int, str]]:
    """[(partner_id, kind)] with kind in {neighbour, same-doc, random}; no repeats, never the anchor."""
    rng = anchor_rng(seed, anchor)
    chosen: List[Tuple[int, str]] = []
    seen: Set[int] = {int(anchor)}

    def take(cands, n, kind):
        for c in cands:
            if len([1 for _, k in chosen if k == kind]) >= n:
                break
            c = int(c)
            if c not in seen:
                seen.add(c)
                chosen.append((c, kind))

    take(list(neighbours), n_neighbours, "neighbour")
    pool = same_doc_pool[same_doc_pool != anchor]
    if len(pool):
        take(rng.permutation(pool)[: n_same_doc * 3], n_same_doc, "same-doc")
    if len(corpus_ids):
        take(rng.choice(corpus_ids, size=min(len(corpus_ids), n_random * 3 + 2), replace=False), n_random, "random")
    return chosen


def is_anchor(sorted_anchors: np.ndarray, ids) -> np.ndarray:
    """Membership of `ids` in a sorted int64 array of anchor ids, by binary search: one array per
    actor serves every unit (a set per unit would cost units x anchors)."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(sorted_anchors) == 0 or ids.size == 0:
        return np.zeros(ids.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_anchors, ids), len(sorted_anchors) - 1)
    return sorted_anchors[pos] == ids


def owned_pairs(anchor: int, partners: List[Tuple[int, str]], anchors) -> List[Tuple[int, str]]:
    """Drop (a, p) when p is also an anchor with a smaller id: that anchor's unit owns the pair, if it
    sampled it. Keeps the harvest free of duplicates without units talking to each other.

    `anchors`: the run's anchor ids as a sorted int64 array (any other collection is sorted first)."""
    if not partners:
        return []
    if not isinstance(anchors, np.ndarray):
        anchors = np.asarray(sorted(anchors), dtype=np.int64)
    member = is_anchor(anchors, [p for p, _ in partners])
    return [(p, k) for (p, k), m in zip(partners, member) if not (m and p < anchor)]


class AnchorPartners:
    """Each anchor's pairs with its partners, as a corpus harvest scores them (`sample_partners`, then
    `owned_pairs`): the per-pair harvest's context stage asks it per unit, the pool harvest for every anchor
    up front. `partners` is the config's PartnerConfig; `anchors` the run's sorted anchor ids."""

    def __init__(self, corpus, retriever, partners, seed: int, anchors: np.ndarray):
        self.corpus, self.retriever, self.cfg, self.seed = corpus, retriever, partners, seed
        self.anchors = anchors

    def _neighbours(self, anchors: List[int], texts: List[str]) -> List[List[int]]:
        """For each anchor, the sentence of each retrieved chunk with the most words in common with it,
        from chunks outside the anchor's own document."""
        neigh: List[List[int]] = [[] for _ in anchors]
        ids, _ = self.retriever.search(texts, self.cfg.neighbour_chunks)
        for i, (a, row) in enumerate(zip(anchors, ids)):
            words = set(texts[i].lower().split())
            for cid in row:
                ch = self.corpus.chunk(int(cid)) if cid >= 0 else None
                if ch is None:
                    continue
                first, n = ch
                if self.corpus.same_doc(first, a):
                    continue
                cand = list(range(first, first + n))
                ov = [len(words & set((t or "").lower().split())) for t in self.corpus.texts(cand)]
                neigh[i].append(cand[int(np.argmax(ov))])
        return neigh

    def pairs(self, anchors: List[int]) -> list:
        """The `Pair`s of these anchors (a unit's, or all), anchor first."""
        from sentsim.harvest.work import Pair

        p = self.cfg
        neigh: List[List[int]] = [[] for _ in anchors]
        if self.retriever is not None and p.neighbours:
            neigh = self._neighbours(anchors, self.corpus.texts(anchors))
        out = []
        for a, nb in zip(anchors, neigh):
            parts = sample_partners(a, self.seed, self.corpus.doc_members(a), self.corpus.ids, nb,
                                    p.neighbours, p.same_doc, p.random)
            out.extend(Pair(a, q, kind) for q, kind in owned_pairs(a, parts, self.anchors))
        return out
