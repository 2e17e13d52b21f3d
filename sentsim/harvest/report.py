"""report.json and report.png at the end of a harvest: scores per split, score vs rank similarity,
and the time each stage spent."""

from __future__ import annotations

import json
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import RunReader


def write_report(out: str, manifest: dict, progress, wall: float) -> dict:
    reader = RunReader(out)
    store = reader.store
    # only the units with a completion marker of this run: never a killed writer's leftovers
    cols = ["score", "rank_sim", "split", "null_reason", "kind"]
    # text where a number belongs is named in one line here, not cast (numeric text) or a ValueError below
    t = reader.read_table("pairs", cols, numeric=["score", "rank_sim"]) if reader.files("pairs", required=False) else \
        pa.table({c: pa.array([], pa.float64() if c in ("score", "rank_sim") else pa.string()) for c in cols})
    # columns stay numpy (strings as codes): a Python object per pair cost seconds and hundreds of MiB at 400K pairs
    score, rank = _floats(t.column("score")), _floats(t.column("rank_sim"))
    split, kind = Labels(t.column("split")), Labels(t.column("kind"))
    reasons = {}
    null_reasons = Labels(t.column("null_reason"))
    # in order of first appearance, as the rows gave them
    for r, n in zip(null_reasons.values, null_reasons.counts().tolist()):
        if r:
            key = r.split(":")[0]
            reasons[key] = reasons.get(key, 0) + n

    def stats(x):
        x = x[np.isfinite(x)]
        if not len(x):
            return {"n": 0}
        return {"n": int(len(x)), "mean": float(x.mean()), "std": float(x.std()), "min": float(x.min()),
                "p50": float(np.median(x)), "max": float(x.max())}

    ok = np.isfinite(score) & np.isfinite(rank)
    corr = None
    # None also where it has no value: rank targets off (rank_sim null), too few pairs, or a constant column
    if ok.sum() > 2 and np.ptp(score[ok]) > 0 and np.ptp(rank[ok]) > 0:
        from scipy.stats import spearmanr

        corr = float(spearmanr(score[ok], rank[ok]).statistic)
    units = reader.units()
    # a pool harvest scores in its vectors run (pool_vectors.py) and only labels here: both count
    pooled = ((manifest.get("config") or {}).get("contexts") or {}).get("mode") == "pool"
    vectors = _vectors_units(out) if pooled else None
    scoring_units = list(units.values()) + (list(vectors[1].values()) if vectors is not None else [])
    scored = sum(m.get("extra", {}).get("scored_items", 0) for m in scoring_units)
    stage_s = {}
    for m in scoring_units:
        for k, v in m.get("extra", {}).get("timing", {}).items():
            stage_s[k] = stage_s.get(k, 0.0) + v
    rep = {
        "fingerprint": manifest.get("fingerprint"),
        "complete": manifest.get("complete"),
        "units": {"planned": manifest.get("planned_units"), "completed": manifest.get("completed_units")},
        # a pool harvest labels no pair until every unit of its vectors run is done
        **({"vectors_units": {"planned": vectors[0], "completed": len(vectors[1])}} if vectors is not None else {}),
        "pairs": int(len(score)),
        "null_scores": int((~np.isfinite(score)).sum()),
        "null_reasons": reasons,
        "score": {s: stats(score[split.mask(s)]) for s in ("train", "dev", "test")},
        "score_by_kind": {k: stats(score[kind.mask(k)]) for k in sorted(set(kind.values))},
        "spearman_score_vs_rank_sim": corr,
        "scored_items": int(scored),
        # what a label costs: (sentence, context) items scored, each in every Eq. 3 direction, per labelled pair
        "scored_items_per_pair": scored / len(score) if len(score) else None,
        # of those, the items scored to choose C_s by Eq. 3 (contexts.rerank_shortlist; harvest/rerank.py)
        **({"rerank_items": int(sum(m.get("extra", {}).get("rerank_items", 0) for m in units.values()))}
           if ((manifest.get("config") or {}).get("contexts") or {}).get("rerank_shortlist") else {}),
        "stage_seconds": stage_s,
        "stage_items_per_second": {k: (scored / v if v else None) for k, v in stage_s.items()},
        "this_run": {"wall_seconds": wall, "units": progress.done, "pairs": progress.rows},
        "placement": placement_summary(units),
        # units by the format they were scored in (bf16, fp16, off = fp32); more than one key: a mixed run
        "scoring_precision": precision_counts(units),
        **rank_target_bytes(units),
    }
    store.fs.create_dir(store.root, recursive=True)
    with store.fs.open_output_stream(f"{store.root}/report.json") as f:
        f.write(json.dumps(rep, indent=2).encode())
    _plot(store, score, rank, split, stage_s)
    return rep


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64, null as NaN."""
    return col.cast(pa.float64()).to_numpy()


class Labels:
    """A string column as integer codes into its distinct values, in order of first appearance (None last, for
    nulls), so a mask or a count is one numpy operation."""

    def __init__(self, col: pa.ChunkedArray):
        enc = (col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col).dictionary_encode()
        self.values: list = enc.dictionary.to_pylist()
        if enc.null_count:
            self.values.append(None)
        self.codes = pc.fill_null(enc.indices, len(self.values) - 1).to_numpy(zero_copy_only=False) \
            if enc.null_count else enc.indices.to_numpy(zero_copy_only=False)

    def mask(self, value) -> np.ndarray:
        """Which rows hold `value` (none where no row does)."""
        if value not in self.values:
            return np.zeros(len(self.codes), dtype=bool)
        return self.codes == self.values.index(value)

    def counts(self) -> np.ndarray:
        """Rows per value, aligned with `values`."""
        return np.bincount(self.codes, minlength=len(self.values))


def _vectors_units(out: str) -> Optional[tuple[Optional[int], dict]]:
    """A pool harvest's vectors run: its planned units and its unit markers (None when it is missing)."""
    from sentsim.harvest.pool_vectors import vectors_uri
    from storage import StoreError

    try:
        reader = RunReader(vectors_uri(out))
        return reader.manifest.get("planned_units"), reader.units()
    except StoreError:
        return None


def rank_target_bytes(units: dict) -> dict:
    """What a sentence's rank target takes, from the first unit marker: `rank_storage` (codes, vectors; None with
    rank targets off, or where the marker predates the key), and its bytes as `bytes_per_sentence_rank_targets`,
    also given as `bytes_per_sentence_rank_codes`, the key's first name, for the readers of that one: under
    rank.storage=vectors it holds the base vector's bytes too, not what codes would take."""
    first = next((m.get("extra", {}) for m in units.values()), {})
    size = first.get("bytes_per_sentence")
    return {"rank_storage": first.get("rank_storage"), "bytes_per_sentence_rank_targets": size,
            "bytes_per_sentence_rank_codes": size}


def precision_counts(units: dict) -> dict:
    """format -> units scored in it, from the unit markers ("unrecorded" for units of a format 1 run, whose
    markers may lack it)."""
    out: dict = {}
    for m in units.values():
        p = m.get("extra", {}).get("scoring_precision") or "unrecorded"
        out[p] = out.get(p, 0) + 1
    return dict(sorted(out.items()))


def placement_summary(units: dict) -> dict:
    """stage -> {node: units that stage ran there}, from the unit markers (each records where its
    stages ran), so a resumed run's report covers every attempt that committed a unit. Nodes are
    Ray node ids ("local" without Ray); a node that died and rejoined counts as a new node."""
    out: dict = {}
    for m in units.values():
        for stage, w in (m.get("extra", {}).get("placement") or {}).items():
            node = w.get("node") or "local"
            out.setdefault(stage, {})
            out[stage][node] = out[stage].get(node, 0) + 1
    return out


def placement_line(placement: dict) -> str:
    """One line for the harvest's summary: each stage's units per node (node ids shortened)."""
    return "; ".join(f"{stage}: " + ", ".join(f"{node[:8]} x{n}" for node, n in sorted(nodes.items()))
                     for stage, nodes in placement.items())


# most pairs report.png's scatter draws; above this, a fixed-seed sample of them (said in its title)
SCATTER_MAX = 20_000


def scatter_points(score: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, str]:
    """The pairs report.png's scatter draws (indices, in row order) and its title: every pair with both values,
    or above SCATTER_MAX of them a sample fixed by its seed, so a rerun draws the same plot. A marker per pair
    cost seconds and memory at 400K pairs and drew one blot; report.json's statistics cover every pair."""
    ok = np.flatnonzero(np.isfinite(score) & np.isfinite(rank))
    title = "score vs rank similarity"
    if len(ok) <= SCATTER_MAX:
        return ok, title
    sample = np.sort(np.random.default_rng(0).choice(ok, size=SCATTER_MAX, replace=False))
    return sample, f"{title} ({SCATTER_MAX:,} of {len(ok):,} pairs, sampled)"


def _plot(store, score: np.ndarray, rank: np.ndarray, split: Labels, stage_s: dict) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for s in ("train", "dev", "test"):
        x = score[split.mask(s) & np.isfinite(score)]
        if len(x):
            ax[0].hist(x, bins=30, alpha=0.5, label=f"{s} ({len(x)})")
    ax[0].set_title("harvested score by split")
    ax[0].set_xlabel("Eq. 4 similarity")
    if ax[0].get_legend_handles_labels()[0]:  # a run with no scored pair yet has nothing to name
        ax[0].legend()
    ok, title = scatter_points(score, rank)
    ax[1].scatter(rank[ok], score[ok], s=6, alpha=0.5)
    ax[1].set_xlabel("rank similarity (base encoder)")
    ax[1].set_ylabel("harvested score")
    ax[1].set_title(title)
    if stage_s:
        ax[2].bar(list(stage_s), list(stage_s.values()))
    ax[2].set_title("seconds per stage (all units)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    with store.fs.open_output_stream(f"{store.root}/report.png") as f:
        f.write(buf.getvalue())
