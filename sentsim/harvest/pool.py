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
from typing import Dict, List, Optional, Sequence, Tuple

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
              kept: Optional[np.ndarray] = None, quiet: bool = False) -> Pool:
    """|P| = `size` distinct corpus sentences, each with `window` sentences a side: `kept` (a resumed run's
    ids, as it drew them), or drawn with the run's seed, at random or one from each of |P| TF-IDF clusters
    (`draw`), among the sentences with a full window (a side cut short by a document's edge would drop an Eq. 3
    term there and raise S for every sentence alike). `quiet` silences the clustering's progress lines."""
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
            ids = _clustered_draw(corpus, eligible, size, seed, quiet)
        else:
            rng = np.random.default_rng(seed + POOL_SEED_OFFSET)
            ids = np.sort(rng.choice(eligible, size=size, replace=False)).astype(np.int64)
    windows = [corpus.window(int(c), window) for c in ids]
    return Pool(ids, [w[0] for w in windows], [w[1] for w in windows], [t or "" for t in corpus.texts(ids)])


def _clustered_draw(corpus, eligible: np.ndarray, size: int, seed: int, quiet: bool = False) -> np.ndarray:
    """`size` sentence ids, one from each of `size` equal TF-IDF clusters of POOL_DRAW_OVERSAMPLE x `size`
    random `eligible` ones (all of them when too few for that): the first drawn of each cluster, so the choice
    within a cluster stays random."""
    from sentsim.harvest.clusters import balanced_clusters, say_progress

    n = len(eligible)
    rng = np.random.default_rng(seed + POOL_SEED_OFFSET)
    candidates = rng.choice(eligible, size=min(n, size * POOL_DRAW_OVERSAMPLE), replace=False).astype(np.int64)
    per = len(candidates) // size  # >= 1: size <= n
    if per < 2:
        return np.sort(candidates[:size])
    labels = balanced_clusters([t or "" for t in corpus.texts(candidates)], per, seed,
                               progress=None if quiet else say_progress)
    # ceil(m / per) >= size clusters, none empty: the first `size` clusters in draw order, each by its first member
    _, first = np.unique(labels, return_index=True)
    return np.sort(candidates[np.sort(first)[:size]])


@dataclass(frozen=True)
class PairColumns:
    """Planned pairs as numpy columns, in unit order; `pairs(start, stop)` is that slice as `Pair`s.

    Not a list of `Pair`s: the plan is shipped to every read task of the labelling pipeline (pipeline.py
    `_unit_dataset`) and held by the driver for the whole run. At 1.39M pairs a list pickled to 50 MiB and took
    each read task 2.5 s and ~600 MiB to unpickle; numpy arrays pickle out of band, so Ray maps them read-only
    from its object store, and a unit builds only its own `Pair`s. `gold` is NaN for a pair without gold (a
    pairs file's gold is always finite, pairs_file.parse_score), and None when no pair has gold."""

    s1: np.ndarray  # int64
    s2: np.ndarray  # int64
    kind: np.ndarray  # uint8, an index into `kinds`
    kinds: Tuple[str, ...]
    repeat: np.ndarray  # int32, as PAIRS_SCHEMA keeps it
    gold: Optional[np.ndarray] = None  # float64

    def __len__(self) -> int:
        return len(self.s1)

    def pairs(self, start: int = 0, stop: Optional[int] = None) -> List[Pair]:
        part = slice(start, stop)
        s1, s2, repeat = self.s1[part].tolist(), self.s2[part].tolist(), self.repeat[part].tolist()
        kind = [self.kinds[k] for k in self.kind[part].tolist()]
        gold = [None] * len(s1) if self.gold is None else [None if g != g else g for g in self.gold[part].tolist()]
        return [Pair(a, b, k, g, r) for a, b, k, g, r in zip(s1, s2, kind, gold, repeat)]

    def sentence_ids(self) -> np.ndarray:
        """Every sentence id of the pairs, sorted."""
        return np.unique(np.concatenate([self.s1, self.s2]))

    def table(self) -> pa.Table:
        n = len(self)
        kind = pa.DictionaryArray.from_arrays(pa.array(self.kind, pa.uint8()), pa.array(self.kinds, pa.string()))
        gold = pa.nulls(n, pa.float64()) if self.gold is None else pa.array(self.gold, pa.float64(),
                                                                              mask=np.isnan(self.gold))
        return pa.table({"s1_id": pa.array(self.s1, pa.int64()), "s2_id": pa.array(self.s2, pa.int64()),
                         "kind": kind.cast(pa.string()), "gold": gold, "repeat": pa.array(self.repeat, pa.int32())},
                        schema=PAIRS_SCHEMA)

    @classmethod
    def build(cls, s1, s2, kind, gold=None, repeat=None) -> "PairColumns":
        """From a value a pair in each of `s1`, `s2`, `kind` (or one str, the kind of every pair), `gold` (None:
        no gold) and `repeat` (None: 0 for every pair)."""
        s1, s2 = np.asarray(s1, np.int64).reshape(-1), np.asarray(s2, np.int64).reshape(-1)
        n = len(s1)
        if isinstance(kind, str):
            kinds, codes = (kind,), np.zeros(n, np.uint8)
        else:
            kinds, codes = _codes(list(kind))
        rep = np.zeros(n, np.int32) if repeat is None else np.asarray(repeat, np.int32).reshape(-1)
        g = None
        if gold is not None and any(x is not None for x in gold):
            g = np.array([np.nan if x is None else x for x in gold], np.float64).reshape(-1)
        return cls(s1, s2, codes, kinds, rep, g)

    @classmethod
    def of_pairs(cls, pairs: Sequence[Pair]) -> "PairColumns":
        return cls.build([p.s1_id for p in pairs], [p.s2_id for p in pairs], [p.kind for p in pairs],
                         [p.gold for p in pairs], [p.repeat for p in pairs])

    @classmethod
    def of_table(cls, t: pa.Table) -> "PairColumns":
        """A stored plan (side table pool_pairs), read column by column, with no Python object a pair."""
        kind = t.column("kind").combine_chunks().dictionary_encode()
        kinds = tuple(kind.dictionary.to_pylist())
        if len(kinds) > 255:
            raise ValueError(f"{len(kinds)} pair kinds: more than a uint8 code holds")
        gold = t.column("gold").combine_chunks()
        g = None if gold.null_count == len(gold) else \
            gold.to_numpy(zero_copy_only=False).astype(np.float64)  # null -> NaN
        return cls(t.column("s1_id").to_numpy().astype(np.int64), t.column("s2_id").to_numpy().astype(np.int64),
                   kind.indices.to_numpy(zero_copy_only=False).astype(np.uint8), kinds,
                   t.column("repeat").to_numpy().astype(np.int32), g)


def _codes(values: List[str]) -> Tuple[Tuple[str, ...], np.ndarray]:
    """The distinct strings of `values` in first-seen order, and each value's index among them (uint8)."""
    index: Dict[str, int] = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int64, len(values))
    if len(index) > 255:
        raise ValueError(f"{len(index)} pair kinds: more than a uint8 code holds")
    return tuple(index), codes.astype(np.uint8)


@dataclass(frozen=True)
class PoolPlan:
    """What a pool harvest labels: its pairs in unit order, and the text of every sentence they hold."""

    pairs: PairColumns
    texts: Dict[int, str]

    def table(self) -> pa.Table:
        return self.pairs.table()

    @property
    def sentence_ids(self) -> np.ndarray:
        return np.array(sorted(self.texts), dtype=np.int64)


def plan_pool_pairs(cfg, corpus, anchors: Optional[np.ndarray], file_pairs: Optional[list],
                    stored: Optional[pa.Table] = None, quiet: bool = False) -> PoolPlan:
    """The pairs of a pool harvest: the stored plan when the run has one; else a pairs file's rows, every pair
    within TF-IDF clusters of `partners.cluster_size` anchors, or each anchor with its partners as in a
    per-pair harvest. `quiet` silences the clustering's progress lines."""
    from corpus.documents import text_id

    if file_pairs is not None:
        from sentsim.harvest.pairs import repeats

        texts: Dict[int, str] = {}
        s1_ids, s2_ids = [], []
        for s1, s2, _ in file_pairs:
            a, b = text_id(s1), text_id(s2)
            texts[a], texts[b] = s1, s2
            s1_ids.append(a)
            s2_ids.append(b)
        if stored is not None:
            return PoolPlan(PairColumns.of_table(stored), texts)
        return PoolPlan(PairColumns.build(s1_ids, s2_ids, "explicit", [g for _, _, g in file_pairs],
                                          repeats([(a, b) for a, b, _ in file_pairs])), texts)
    if stored is not None:
        pairs = PairColumns.of_table(stored)
    elif cfg.partners.cluster_size:
        from sentsim.harvest.clusters import balanced_clusters, cluster_pairs, say_progress

        k, n = cfg.partners.cluster_size, len(anchors)
        if n <= k and not quiet:  # no clustering to report, and the user may have meant many clusters
            say_progress(f"partners.cluster_size={k} holds all {n:,} anchors: one cluster, every pair among them "
                         f"labelled ({n * (n - 1) // 2:,} pairs)")
        clusters = balanced_clusters([t or "" for t in corpus.texts(anchors)], k, cfg.seed,
                                     progress=None if quiet else say_progress, levels=cfg.partners.cluster_levels)
        both = cluster_pairs(anchors, clusters)
        pairs = PairColumns.build(both[:, 0], both[:, 1], "cluster")
    else:
        from sentsim.harvest.pairs import AnchorPartners

        retriever = None
        if cfg.index and cfg.partners.neighbours:
            from sentsim.retrieval import open_retriever

            retriever = open_retriever(cfg.index, corpus=cfg.corpus)
        pairs = PairColumns.of_pairs(AnchorPartners(corpus, retriever, cfg.partners, cfg.seed, anchors)
                                     .pairs(anchors.tolist()))
    ids = pairs.sentence_ids().tolist()
    return PoolPlan(pairs, dict(zip(ids, (t or "" for t in corpus.texts(ids)))))


class PoolPairUnits:
    """Unit u of a pool harvest's labelling: its slice of the planned pairs, as `Pair`s built from the columns
    when the unit is (a read task holds the columns zero-copy, PairColumns)."""

    def __init__(self, pairs: PairColumns, per_unit: int):
        self.pairs, self.per_unit = pairs, per_unit

    def __call__(self, u: int) -> dict:
        return {"unit": u, "pairs": self.pairs.pairs(u * self.per_unit, (u + 1) * self.per_unit)}
