"""Harvested pair shards: checked up front on the driver, then streamed to the trainers with ray.data.

A harvest directory holds `pairs/part-NNNNN.parquet` (pair_id, s1_id, s2_id, s1, s2, score,
rank_sim, split, ...) and `manifest.json`. `score` is the Origin similarity (paper eq. 4); null
means not scored. `split` is train/dev/test (the paper splits 98/1/1, section 3.4).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from sentsim.errors import InputError, UsageError

SPLITS = ("train", "dev", "test")
NEEDED = ("s1", "s2", "score", "split")


@dataclass
class HarvestInfo:
    root: Path
    files: list[Path]
    rows: int
    scored: dict[str, int]  # non-null scores per split
    score_range: tuple[float, float]
    manifest: dict = field(default_factory=dict)

    def incomplete_note(self) -> str | None:
        return incomplete_harvest_note(self.root, f"its {self.rows} pairs")

    def summary(self) -> dict:
        return {"root": str(self.root), "files": len(self.files), "rows": self.rows, "scored": self.scored,
                "score_min": self.score_range[0], "score_max": self.score_range[1]}


def incomplete_harvest_note(root: str | Path, what: str) -> str | None:
    """Set when the harvest is still running or stopped part-way: training uses what is there.
    One wording for surrogate and student training."""
    from storage import open_store

    note = open_store(str(root)).incomplete_note()
    return f"note: harvest {note}; training on {what}. Resume the harvest to add the rest." if note else None


def inspect_harvest(root: str | Path) -> HarvestInfo:
    """Validate a harvest before any worker starts; every problem is a UsageError naming the file."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"--data {root}: no such directory")
    pairs = root / "pairs"
    files = sorted(pairs.glob("*.parquet")) if pairs.is_dir() else []
    if not files:
        raise UsageError(f"--data {root}: empty harvest, no pairs/*.parquet shards")
    manifest = {}
    if (root / "manifest.json").is_file():
        try:
            manifest = json.loads((root / "manifest.json").read_text())
        except json.JSONDecodeError:
            raise InputError(f"{root / 'manifest.json'}: not valid JSON") from None

    rows = 0
    scored = dict.fromkeys(SPLITS, 0)
    lo, hi = math.inf, -math.inf
    for f in files:
        try:
            schema = pq.read_schema(f)
        except Exception as exc:
            raise InputError(f"{f}: not a readable Parquet file ({exc})") from None
        missing = [c for c in NEEDED if c not in schema.names]
        if missing:
            raise InputError(f"{f}: missing column(s) {', '.join(missing)}")
        if not pa.types.is_floating(schema.field("score").type) and not pa.types.is_integer(schema.field("score").type):
            raise InputError(f"{f}: column score has type {schema.field('score').type}, expected float")
        table = pq.read_table(f, columns=["score", "split"])  # two narrow columns: cheap at any size
        rows += table.num_rows
        score = table["score"].cast(pa.float64())
        bad_split = pc.unique(table["split"].filter(pc.invert(pc.is_in(table["split"], pa.array(SPLITS))))).to_pylist()
        if bad_split:
            raise InputError(f"{f}: split must be train, dev or test; found {bad_split[:3]}")
        finite = pc.is_finite(score)
        n_nonfinite = int(pc.sum(pc.invert(finite.fill_null(True))).as_py() or 0)
        if n_nonfinite:
            raise InputError(f"{f}: {n_nonfinite} score(s) are NaN or infinite (null is the way to mark 'not scored')")
        valid = pc.is_valid(score)
        for s in SPLITS:
            scored[s] += int(pc.sum(pc.and_(valid, pc.equal(table["split"], s))).as_py() or 0)
        if table.num_rows and pc.any(valid).as_py():
            mm = pc.min_max(score)
            lo, hi = min(lo, mm["min"].as_py()), max(hi, mm["max"].as_py())
    if rows == 0:
        raise UsageError(f"--data {root}: empty harvest, {len(files)} shard(s) but no rows")
    if sum(scored.values()) == 0:
        raise UsageError(f"--data {root}: all {rows} scores are null; the harvest has not been scored")
    empty = [s for s in SPLITS if scored[s] == 0]
    if empty:
        raise UsageError(
            f"--data {root}: split {', '.join(repr(s) for s in empty)} has no scored rows "
            f"(scored rows per split: {scored}); training needs train, dev and test"
        )
    return HarvestInfo(root, files, rows, scored, (lo, hi), manifest)


def harvest_datasets(info: HarvestInfo, eval_max_pairs: int) -> dict:
    """ray.data Datasets per split, unscored rows dropped.

    train is streamed from the shards by Ray Data tasks. dev and test are capped at
    `eval_max_pairs` for the evaluations, so the driver reads just that many rows with pyarrow
    and hands them over as in-memory datasets: at 1% of a 100M-pair harvest (section 3.4) the
    full dev split would be a million pairs, and tiny reads are where Ray Data's per-execution
    start-up cost dominates.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray.data

    base = ray.data.read_parquet([str(f) for f in info.files]).select_columns(list(NEEDED))
    out = {"train": base.map_batches(_keep_split, fn_kwargs={"split": "train"}, batch_format="pyarrow")}
    kept: dict[str, list] = {"dev": [], "test": []}
    for f in info.files:
        if all(sum(t.num_rows for t in v) >= eval_max_pairs for v in kept.values()):
            break
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=65536, columns=list(NEEDED)):
            table = pa.Table.from_batches([batch])
            for split, parts in kept.items():
                have = sum(t.num_rows for t in parts)
                if have < eval_max_pairs:
                    parts.append(_keep_split(table, split).slice(0, eval_max_pairs - have))
    for split, parts in kept.items():
        out[split] = ray.data.from_arrow(pa.concat_tables(parts).combine_chunks())
    return out


def _keep_split(table, split: str):
    import pyarrow.compute as pc

    return table.filter(pc.and_(pc.equal(table["split"], split), pc.is_valid(table["score"])))


def stsb_datasets(stsb_dir: str | Path) -> tuple[dict, dict]:
    """STS-B train/dev/test as ray.data datasets with score = gold / 5 (the cosine's scale),
    for the paper's supervised setting (section 4.1: fine-tune on STS-B train with L2)."""
    import ray.data

    from sentsim.evaluation.datasets import STSB_SPLITS, load_stsb

    root = Path(stsb_dir)
    if (root / "stsbenchmark").is_dir():
        root = root / "stsbenchmark"
    out, counts = {}, {}
    for split, task in (("train", "STSb-train"), ("dev", "STSb-dev"), ("test", "STSb")):
        path = root / STSB_SPLITS[task]
        if not path.is_file():
            raise UsageError(f"--finetune-sts {stsb_dir}: {path.name} not found")
        st = load_stsb(path, task).sets[0]
        rows = [{"s1": a, "s2": b, "score": float(g) / 5.0, "split": split} for a, b, g in zip(st.s1, st.s2, st.gold)]
        out[split] = ray.data.from_items(rows)
        counts[split] = len(rows)
    return out, counts
