"""The shared pool of contexts (contexts.mode=pool) and the pairs a pool harvest labels.

Paper 003 (§3.3, Eq. 4) compares two sentences over C = C_s1 + C_s2, so every pair is scored over contexts of
its own, and a harvest's cost grows with its pairs. In pool mode every sentence is scored once, in the Eq. 3
directions, against one pool P of contexts that all sentences share; its scores over P are a vector, and any
pair's Eq. 4 is a comparison of two stored vectors. The cost is per sentence (|P| items each), and a pair's
label costs the reading of two vectors, so dense pair lists (every pair within clusters of K anchors,
`partners.cluster_size`) become cheap. The context effect that `double-centred` removes is each pool
context's mean score over every scored sentence.

The pool is |P| full windows around corpus sentences drawn with the run's seed, like the paper's random-context
ablation (§5.4) but shared; the harvest finds little difference between retrieved and random contexts at
equal size and a steady gain from more of them (BENCHMARKS.md, "Teacher quality"). `contexts.pool_draw:
clusters` draws a diverse pool instead: POOL_DRAW_OVERSAMPLE x |P| random windows cut into |P| equal TF-IDF
clusters of their centres (sentsim/harvest/clusters.py), the first drawn window of each. Its ids are kept
as the harvest's side table `pool_ids`, since k-means may cluster differently on another machine and a
resumed run must score the pool it began with.

The pairs are planned by the driver once and kept as the harvest's side table `pool_pairs`, so that a resumed
run labels exactly the pairs it began with (the clustering runs k-means, whose result may differ across
machines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa

from sentsim.errors import UsageError
from sentsim.harvest.work import Pair

POOL_TABLE = "pool"  # side table of the vectors run: the contexts every sentence was scored in
PAIRS_TABLE = "pool_pairs"  # side table of the harvest: the pairs it labels, in unit order
EFFECT_TABLE = "context_effect"  # side table of the harvest: each pool context's mean S over every sentence
POOL_IDS_TABLE = "pool_ids"  # side table of the harvest: the pool's corpus sentence ids (a clusters draw's)
POOL_DRAW_OVERSAMPLE = 8  # pool_draw=clusters: random windows drawn per pool context, then clustered
# Seed offsets of the run's draws: +1 the rank anchors (job.run_anchors), +2 the reference sentences.
POOL_SEED_OFFSET = 3

POOL_SCHEMA = pa.schema([("context_id", pa.int64()), ("left", pa.list_(pa.string())),
                         ("right", pa.list_(pa.string()))])
PAIRS_SCHEMA = pa.schema([("s1_id", pa.int64()), ("s2_id", pa.int64()), ("kind", pa.string()),
                          ("gold", pa.float64()), ("repeat", pa.int32())])


@dataclass(frozen=True)
class Pool:
    """The pool P: context j is the window around corpus sentence `ids[j]` (`left[j]`, centre, `right[j]`);
    `centres[j]` is that sentence's text, which no sentence is scored against (its own window)."""

    ids: np.ndarray
    left: List[List[str]]
    right: List[List[str]]
    centres: List[str]

    def __len__(self) -> int:
        return len(self.ids)

    def table(self) -> pa.Table:
        return pa.table({"context_id": pa.array(self.ids, pa.int64()), "left": self.left, "right": self.right},
                        schema=POOL_SCHEMA)


def draw_pool(corpus, size: int, window: int, seed: int, draw: str = "random",
              kept: Optional[np.ndarray] = None) -> Pool:
    """|P| = `size` distinct corpus sentences, each with `window` sentences a side: `kept` (a resumed run's
    ids, as it drew them), or drawn with the run's seed, at random or one from each of |P| TF-IDF clusters
    (`draw`), among the sentences with a full window (a side cut short by a document's edge would drop an Eq. 3
    term there and raise S for every sentence alike)."""
    from sentsim.screening.candidates import full_windows

    if kept is not None:
        ids = np.asarray(kept, dtype=np.int64)
    else:
        eligible = corpus.ids[full_windows(corpus.ids, corpus.ids, window)]
        n = len(eligible)
        if size > n:
            raise UsageError(f"contexts.pool_size={size} is more than the corpus's {n:,} sentences with {window} "
                             f"sentences a side in their document; choose {n:,} or fewer")
        if draw == "clusters":
            ids = _clustered_draw(corpus, eligible, size, seed)
        else:
            rng = np.random.default_rng(seed + POOL_SEED_OFFSET)
            ids = np.sort(rng.choice(eligible, size=size, replace=False)).astype(np.int64)
    windows = [corpus.window(int(c), window) for c in ids]
    return Pool(ids, [w[0] for w in windows], [w[1] for w in windows], [t or "" for t in corpus.texts(ids)])


def _clustered_draw(corpus, eligible: np.ndarray, size: int, seed: int) -> np.ndarray:
    """`size` sentence ids, one from each of `size` equal TF-IDF clusters of POOL_DRAW_OVERSAMPLE x `size`
    random `eligible` ones (all of them when too few for that): the first drawn of each cluster, so the choice
    within a cluster stays random."""
    from sentsim.harvest.clusters import balanced_clusters

    n = len(eligible)
    rng = np.random.default_rng(seed + POOL_SEED_OFFSET)
    candidates = rng.choice(eligible, size=min(n, size * POOL_DRAW_OVERSAMPLE), replace=False).astype(np.int64)
    per = len(candidates) // size  # >= 1: size <= n
    if per < 2:
        return np.sort(candidates[:size])
    labels = balanced_clusters([t or "" for t in corpus.texts(candidates)], per, seed)
    # ceil(m / per) >= size clusters, none empty: the first `size` clusters in draw order, each by its first member
    _, first = np.unique(labels, return_index=True)
    return np.sort(candidates[np.sort(first)[:size]])


@dataclass(frozen=True)
class PoolPlan:
    """What a pool harvest labels: its pairs in unit order, and the text of every sentence they hold."""

    pairs: List[Pair]
    texts: Dict[int, str]

    def table(self) -> pa.Table:
        p = self.pairs
        return pa.table({"s1_id": [x.s1_id for x in p], "s2_id": [x.s2_id for x in p], "kind": [x.kind for x in p],
                         "gold": [x.gold for x in p], "repeat": [x.repeat for x in p]}, schema=PAIRS_SCHEMA)

    @property
    def sentence_ids(self) -> np.ndarray:
        return np.array(sorted(self.texts), dtype=np.int64)


def pairs_from_table(t: pa.Table) -> List[Pair]:
    cols = t.to_pydict()
    return [Pair(int(a), int(b), k, g, int(r)) for a, b, k, g, r in
            zip(cols["s1_id"], cols["s2_id"], cols["kind"], cols["gold"], cols["repeat"])]


def plan_pool_pairs(cfg, corpus, anchors: Optional[np.ndarray], file_pairs: Optional[list],
                    stored: Optional[pa.Table] = None) -> PoolPlan:
    """The pairs of a pool harvest: the stored plan when the run has one; else a pairs file's rows, every pair
    within TF-IDF clusters of `partners.cluster_size` anchors, or each anchor with its partners as in a
    per-pair harvest."""
    from corpus.documents import text_id

    if file_pairs is not None:
        from sentsim.harvest.pairs import repeats

        texts: Dict[int, str] = {}
        pairs = []
        for (s1, s2, gold), k in zip(file_pairs, repeats([(a, b) for a, b, _ in file_pairs])):
            a, b = text_id(s1), text_id(s2)
            texts[a], texts[b] = s1, s2
            pairs.append(Pair(a, b, "explicit", gold, k))
        if stored is not None:
            pairs = pairs_from_table(stored)
        return PoolPlan(pairs, texts)
    if stored is not None:
        pairs = pairs_from_table(stored)
    elif cfg.partners.cluster_size:
        from sentsim.harvest.clusters import balanced_clusters, cluster_pairs

        clusters = balanced_clusters([t or "" for t in corpus.texts(anchors)], cfg.partners.cluster_size, cfg.seed)
        pairs = [Pair(int(a), int(b), "cluster") for a, b in cluster_pairs(anchors.tolist(), clusters)]
    else:
        from sentsim.harvest.pairs import AnchorPartners

        retriever = None
        if cfg.index and cfg.partners.neighbours:
            from sentsim.retrieval import open_retriever

            retriever = open_retriever(cfg.index, corpus=cfg.corpus)
        pairs = AnchorPartners(corpus, retriever, cfg.partners, cfg.seed, anchors).pairs(anchors.tolist())
    ids = sorted({s for p in pairs for s in (p.s1_id, p.s2_id)})
    return PoolPlan(pairs, dict(zip(ids, (t or "" for t in corpus.texts(ids)))))


class PoolPairUnits:
    """Unit u of a pool harvest's labelling: its slice of the planned pairs."""

    def __init__(self, pairs: List[Pair], per_unit: int):
        self.pairs, self.per_unit = pairs, per_unit

    def __call__(self, u: int) -> dict:
        return {"unit": u, "pairs": self.pairs[u * self.per_unit:(u + 1) * self.per_unit]}
