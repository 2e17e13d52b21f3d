"""Harvested pair shards: checked up front on the driver, then streamed to the trainers with ray.data
(or, for an inline run, read into pyarrow Tables: no Ray).

A harvest run (local or s3://) holds `pairs/part-NNNNN.parquet` (pair_id, s1_id, s2_id, s1, s2, score,
rank_sim, split, ...) and `manifest.json`, read through storage.RunReader: only units with a
completion marker. `score` is the Origin similarity (paper eq. 4); null means not scored. `split`
is train/dev/test (the paper splits 98/1/1, section 3.4). A small harvest has (almost) no dev pairs
at 1%: then a dev set is carved out of train (see plan_dev_carve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sentsim.errors import InputError, UsageError

SPLITS = ("train", "dev", "test")
NEEDED = ("s1", "s2", "score", "split")
MIN_DEV_PAIRS = 16  # fewer scored dev (or test) pairs than this: carve the rest out of train
CARVE_SEED = 0


@dataclass
class HarvestInfo:
    root: str
    files: list[str]  # paths inside reader.fs: exactly the completed pairs shards
    rows: int
    scored: dict[str, int]  # non-null scores per split (after any dev carve)
    score_range: tuple[float, float]
    manifest: dict = field(default_factory=dict)
    reader: object = None  # storage.RunReader
    carve: Optional[dict] = None  # plan_dev_carve's plan, None when the harvest's own dev split is used
    left_out: dict = field(default_factory=dict)  # the rows not trained on, by why (pairs_left_out)
    score_mean: float = 0.0  # of every scored row
    score_sd: float = 0.0
    pairs_sha256: str = ""  # pairs_content: the trained pairs by their bytes, wherever the harvest lies

    def loss_warnings(self, loss: str) -> list[str]:
        """What the scores' scale means for `loss`: cosine_regression fits them with a cosine, in [-1, 1],
        and is met by collapse when they sit in a narrow band (sentsim.losses.cosine_regression)."""
        from sentsim.losses.cosine_regression import narrow_targets_warning

        if loss != "cosine_regression":
            return []
        out = []
        if self.score_range[0] < -1 or self.score_range[1] > 1:
            out.append(f"warning: harvested scores span {self.score_range}, outside a cosine's [-1, 1]")
        narrow = narrow_targets_warning(self.score_mean, self.score_sd, "the harvested scores",
                                        "--loss cosent learns their order")
        return out + ([narrow] if narrow else [])

    def incomplete_note(self) -> str | None:
        return incomplete_harvest_note(self.reader or self.root, f"its {self.rows} pairs")

    def training_note(self) -> str:
        return training_note(self.scored["train"], self.rows, "pairs", self.left_out)

    def identity(self) -> dict:
        """What a surrogate's fingerprint holds of its harvest: its content (the run's fingerprint and its pairs
        shards' sha256) and the splits trained on, not its path, so a harvest moved or copied is the same data
        and one whose pairs changed at the same path is not."""
        return {"harvest": (self.manifest or {}).get("fingerprint"), "pairs_sha256": self.pairs_sha256,
                "scored": self.scored}

    def summary(self) -> dict:
        out = {"root": str(self.root), "files": len(self.files), "rows": self.rows, "scored": self.scored,
               "score_min": self.score_range[0], "score_max": self.score_range[1]}
        if self.carve:
            out["carved"] = self.carve["n"]
        return out


def open_harvest(data: str):
    """A RunReader over a harvest run; a missing folder or manifest is a one-line UsageError."""
    from storage import RunReader, StoreError

    try:
        reader = RunReader(str(data), what="--data", manifest_required=False)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    if not reader.manifest and reader.store.lost_manifest():
        from storage.store import LOST_MANIFEST

        raise UsageError(f"--data {reader.uri}: {LOST_MANIFEST}")
    stage = (reader.manifest or {}).get("stage")
    if isinstance(stage, str) and stage not in ("harvest", "harvest-remix"):
        from storage.store import part_of_run_refusal

        refusal = part_of_run_refusal(reader.uri, f"--data {reader.uri}")  # a pool harvest's pool_vectors/, say
        if refusal is not None:
            raise UsageError(refusal)
        raise UsageError(f"--data {reader.uri}: not a harvest run but a '{stage}' run; give the --out of "
                         "`sentsim harvest` (or `sentsim remix`)")
    return reader


def pairs_content(reader) -> str:
    """The completed units' pairs shards by their content (`shards_content`)."""
    return shards_content(reader, "pairs")


def shards_content(reader, table: str) -> str:
    """The completed units' `table` shards by the sha256 their markers record, in unit order: what the reader
    reads (a compacted file holds the very shards its markers name, so a compaction keeps it; a unit redone
    changes it). The bytes behind a record are `sentsim store verify`'s to check."""
    from sentsim.identity import fingerprint

    return fingerprint([(u, rec["files"][table]["sha256"]) for u, rec in reader.units().items()
                        if table in (rec.get("files") or {})])


def incomplete_harvest_note(root, what: str) -> str | None:
    """Set when the harvest is still running or stopped part-way: training uses what is there.
    One wording for surrogate and student training. `root`: a RunReader, path or URI."""
    from storage import open_store

    store = root.store if hasattr(root, "store") else open_store(str(root))
    note = store.incomplete_note()
    return f"note: harvest {note}; training on {what}. Resume the harvest to add the rest." if note else None


def refuse_nonfinite_scores(score, shown: str) -> None:
    """A harvest marks an unscored pair with a null score; a NaN or infinite one is a broken shard or a
    hand-made table, and training on it would diverge (or drop it unseen): one InputError naming `shown`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    finite = pc.is_finite(score.cast(pa.float64()))
    n_nonfinite = int(pc.sum(pc.invert(finite.fill_null(True))).as_py() or 0)
    if n_nonfinite:
        raise InputError(f"{shown}: {n_nonfinite} score(s) are NaN or infinite "
                         "(null is the way to mark 'not scored')")


def refuse_unknown_splits(split, shown: str) -> None:
    """Every pair is train, dev or test: a row of another split (or none) would be read by no one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    known = pc.is_in(split, pa.array(SPLITS)).fill_null(False)
    bad = pc.unique(split.filter(pc.invert(known))).to_pylist()
    if bad:
        raise InputError(f"{shown}: split must be train, dev or test; found {bad[:3]}")


def pairs_left_out(rows: int, scored: dict, carve: Optional[dict]) -> dict:
    """Why each of a harvest's `rows` pairs that is not a training pair is left out: a null score, the
    harvest's own dev or test split, or carved out of train into them. `scored`: scored rows per split
    before any carve. What is left, scored["train"] less the carve, is what training reads."""
    carved = sum(carve["n"].values()) if carve else 0
    return {"null score": rows - sum(scored.values()), "dev": scored.get("dev", 0), "test": scored.get("test", 0),
            "carved out of train to dev/test": carved}


def training_note(used: int, total: int, noun: str, left_out: dict) -> str:
    """The one line a trainer prints about what it reads: both counts, and every row left out by why."""
    why = ", ".join(f"{n} {reason}" for reason, n in left_out.items() if n)
    return f"note: training on {used} of {total} {noun}" + (f" ({why})" if why else "")


# ----------------------------------------------------------------------------- dev carve


def _pair_hash(table, seed: int):
    """A seeded 64-bit hash of each row's (s1, s2): which rows are carved depends on the pair
    alone, never on shard order or worker count."""
    import numpy as np
    import pandas as pd
    import pyarrow.compute as pc

    joined = pc.binary_join_element_wise(pc.fill_null(table["s1"], ""), pc.fill_null(table["s2"], ""), "\x1f")
    arr = np.asarray(joined.to_pylist(), dtype=object)
    return pd.util.hash_array(arr, hash_key=f"sentsimdev{seed % 10**6:06d}", categorize=False)


EVAL_SPLITS = ("dev", "test")


def plan_dev_carve(train_pairs, have, seed: int = CARVE_SEED) -> Optional[dict]:
    """When a harvest has fewer than MIN_DEV_PAIRS scored dev (or test) pairs, move the scored train
    pairs with the smallest seeded hashes (at most a fifth of train per split) into it: dev takes the
    lowest hashes, test the next ones. `train_pairs`: a table (s1, s2) of the scored train rows;
    `have`: scored rows per split (an int means dev alone). None: nothing to carve."""
    import numpy as np

    have = {"dev": have, "test": MIN_DEV_PAIRS} if isinstance(have, int) else dict(have)
    want = {s: min(max(MIN_DEV_PAIRS - have.get(s, 0), 0), train_pairs.num_rows // 5) for s in EVAL_SPLITS}
    want = {s: (n if have.get(s, 0) + n >= 2 else 0) for s, n in want.items()}
    if not any(want.values()):
        return None
    h = np.sort(_pair_hash(train_pairs, seed))
    bounds, n, start = {}, {}, 0
    for split in EVAL_SPLITS:
        if not want[split]:
            continue
        lo = None if start == 0 else int(h[start - 1])
        hi = int(h[start + want[split] - 1])
        bounds[split] = (lo, hi)
        n[split] = int(((h <= hi) & (h > lo if lo is not None else True)).sum())
        start += want[split]
    return {"seed": seed, "bounds": bounds, "n": n, "train": train_pairs.num_rows,
            "have": {s: have.get(s, 0) for s in EVAL_SPLITS}}


def carve_note(carve: dict) -> str:
    had = " and ".join(f"{carve['have'][s]} scored {s}" for s in EVAL_SPLITS if s in carve["n"])
    moved = " and ".join(f"{n} {s}" for s, n in carve["n"].items())
    kept = carve["train"] - sum(carve["n"].values())
    return (f"note: the harvest has {had} pair(s); carved {moved} pairs out of its {carve['train']} train pairs "
            f"(seed {carve['seed']}, by a hash of the pair), training on the other {kept}")


def carved_mask(table, carve: Optional[dict], split: str):
    """Rows of `table` (s1, s2, score, split) that the carve moves from train into `split`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not carve or table.num_rows == 0 or split not in carve["bounds"]:
        return pa.array(np.zeros(table.num_rows, bool))
    in_train = pc.and_(pc.equal(table["split"], "train"), pc.is_valid(table["score"])).fill_null(False)
    h = _pair_hash(table, carve["seed"])
    lo, hi = carve["bounds"][split]
    sel = (h <= np.uint64(hi)) & ((h > np.uint64(lo)) if lo is not None else True)
    return pc.and_(in_train, pa.array(np.asarray(sel, bool)))


def keep_split(table, split: str, carve: Optional[dict] = None):
    """The scored rows of `split`, after the carve when there is one."""
    import pyarrow.compute as pc

    keep = pc.and_(pc.equal(table["split"], split), pc.is_valid(table["score"])).fill_null(False)
    if carve:
        if split == "train":
            for s in carve["bounds"]:
                keep = pc.and_(keep, pc.invert(carved_mask(table, carve, s)))
        elif split in carve["bounds"]:
            keep = pc.or_(keep, carved_mask(table, carve, split))
    return table.filter(keep)


# ----------------------------------------------------------------------------- the surrogate's reader


def inspect_harvest(root: str | Path, seed: int = CARVE_SEED) -> HarvestInfo:
    """Validate a harvest before any worker starts; every problem is a UsageError naming the file."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from storage.reader import check_file_columns

    reader = open_harvest(str(root))
    if not reader.manifest:
        raise UsageError(f"--data {reader.uri}: not a harvest run (no manifest.json)")
    files = reader.files("pairs", required=False)
    if not files:
        raise UsageError(f"--data {reader.uri}: empty harvest, no completed pairs/*.parquet shards")

    rows = 0
    scored = dict.fromkeys(SPLITS, 0)
    lo, hi = math.inf, -math.inf
    n_valid, total, squares = 0, 0.0, 0.0
    for f in files:
        schema = _schema(reader, f)
        shown = reader.display(f)
        check_file_columns(shown, schema, NEEDED, numeric=["score"])
        table = reader.read_file(f, ["score", "split"])  # two narrow columns: cheap at any size
        rows += table.num_rows
        score = table["score"].cast(pa.float64())
        refuse_unknown_splits(table["split"], shown)
        refuse_nonfinite_scores(score, shown)
        valid = pc.is_valid(score)
        for s in SPLITS:
            scored[s] += int(pc.sum(pc.and_(valid, pc.equal(table["split"], s))).as_py() or 0)
        if table.num_rows and pc.any(valid).as_py():
            mm = pc.min_max(score)
            lo, hi = min(lo, mm["min"].as_py()), max(hi, mm["max"].as_py())
            n_valid += int(pc.sum(valid).as_py())
            total += pc.sum(score).as_py()
            squares += pc.sum(pc.multiply(score, score)).as_py()
    if rows == 0:
        raise UsageError(f"--data {reader.uri}: empty harvest, {len(files)} shard(s) but no rows")
    if sum(scored.values()) == 0:
        raise UsageError(f"--data {reader.uri}: all {rows} scores are null; the harvest has not been scored")
    carve = None
    harvested = dict(scored)  # before any carve
    if min(scored["dev"], scored["test"]) < MIN_DEV_PAIRS and scored["train"]:
        # only small harvests get here (1% of the pairs is under MIN_DEV_PAIRS): reading train's texts is cheap
        pairs = reader.read_table("pairs", list(NEEDED))
        carve = plan_dev_carve(keep_split(pairs, "train").select(["s1", "s2"]), scored, seed)
        if carve:
            for split, n in carve["n"].items():
                scored["train"] -= n
                scored[split] += n
            print(carve_note(carve))
    empty = [s for s in SPLITS if scored[s] == 0]
    if empty:
        names = " and ".join(repr(s) for s in empty)
        raise UsageError(
            f"--data {reader.uri}: {'splits ' + names + ' have' if len(empty) > 1 else 'split ' + names + ' has'} "
            f"no scored rows (scored rows per split: {scored}); training needs train, dev and test, and an empty "
            f"dev or test is carved out of train only when train has enough scored pairs (a fifth of train, at "
            f"least 2): harvest more pairs"
        )
    mean = total / n_valid
    return HarvestInfo(reader.uri, files, rows, scored, (lo, hi), reader.manifest, reader, carve,
                       pairs_left_out(rows, harvested, carve), score_mean=mean,
                       score_sd=math.sqrt(max(squares / n_valid - mean * mean, 0.0)),
                       pairs_sha256=pairs_content(reader))


def _schema(reader, path: str):
    import pyarrow.parquet as pq

    return reader.guarded(path, lambda: pq.read_schema(path, filesystem=reader.fs))


def harvest_datasets(info: HarvestInfo, eval_max_pairs: int, seed: int = 0) -> dict:
    """ray.data Datasets per split, unscored rows dropped (Ray Train; `harvest_tables` is the inline run's).

    train is streamed by Ray Data tasks from exactly the completed shards (local or s3://), in an
    order seeded by `seed`: the trainer's shuffle is a local buffer, and in unit order a run capped
    below an epoch would see only the harvest's first anchors. dev and test are `eval_tables`, handed
    over as in-memory datasets.
    """
    import ray.data

    reader = info.reader or open_harvest(info.root)
    base = reader.ray_dataset("pairs", NEEDED, shard_order_seed=seed)
    out = {"train": base.map_batches(keep_split, fn_kwargs={"split": "train", "carve": info.carve},
                                     batch_format="pyarrow")}
    out.update({split: ray.data.from_arrow(t) for split, t in eval_tables(info, eval_max_pairs).items()})
    return out


def harvest_tables(info: HarvestInfo, eval_max_pairs: int) -> dict:
    """pyarrow Tables per split for an inline run (no Ray): train whole in memory, read from exactly the
    completed shards (the inline loop permutes it each epoch itself), dev and test as `eval_tables`. The
    inline run is for a laptop's harvest: train's texts are held at once, as the student's inline run does."""
    reader = info.reader or open_harvest(info.root)
    train = keep_split(reader.read_table("pairs", list(NEEDED)), "train", info.carve).combine_chunks()
    return {"train": train, **eval_tables(info, eval_max_pairs)}


def eval_tables(info: HarvestInfo, eval_max_pairs: int) -> dict:
    """dev and test, each capped at `eval_max_pairs` for the evaluations: the driver reads just that many
    rows with pyarrow, since at 1% of a 100M-pair harvest (section 3.4) the full dev split would be a million
    pairs, and tiny reads are where Ray Data's per-execution start-up cost dominates."""
    import pyarrow as pa

    reader = info.reader or open_harvest(info.root)
    kept: dict[str, list] = {"dev": [], "test": []}
    for batch in reader.iter_batches("pairs", list(NEEDED), batch_size=65536):
        if all(sum(t.num_rows for t in v) >= eval_max_pairs for v in kept.values()):
            break
        table = pa.Table.from_batches([batch])
        for split, parts in kept.items():
            have = sum(t.num_rows for t in parts)
            if have < eval_max_pairs:
                parts.append(keep_split(table, split, info.carve).slice(0, eval_max_pairs - have))
    return {split: pa.concat_tables(parts).combine_chunks() for split, parts in kept.items()}


def stsb_datasets(stsb_dir: str | Path) -> tuple[dict, dict]:
    """`stsb_tables` as ray.data datasets (Ray Train)."""
    import ray.data

    tables, counts = stsb_tables(stsb_dir)
    return {split: ray.data.from_arrow(t) for split, t in tables.items()}, counts


def stsb_files(stsb_dir: str | Path) -> dict:
    """{split: (task, path)} of the STS-B files `stsb_tables` reads, each refused in one line when missing."""
    from sentsim.evaluation.datasets import STSB_SPLITS

    root = Path(stsb_dir)
    if (root / "stsbenchmark").is_dir():
        root = root / "stsbenchmark"
    out = {}
    for split, task in (("train", "STSb-train"), ("dev", "STSb-dev"), ("test", "STSb")):
        path = root / STSB_SPLITS[task]
        if not path.is_file():
            raise UsageError(f"--finetune-sts {stsb_dir}: {path.name} not found")
        out[split] = (task, path)
    return out


def stsb_content(stsb_dir: str | Path) -> dict:
    """{split: sha256} of the files the fine-tune stage reads (`stsb_files`): what a surrogate's fingerprint
    holds of --finetune-sts, so the folder moved or copied is the same data and one edited in place is not."""
    from storage.fs import input_sha256

    return {split: input_sha256(str(path)) for split, (_, path) in stsb_files(stsb_dir).items()}


def stsb_tables(stsb_dir: str | Path) -> tuple[dict, dict]:
    """STS-B train/dev/test as pyarrow Tables with score = gold / 5 (the cosine's scale), for the paper's
    supervised setting (section 4.1: fine-tune on STS-B train with L2); and their row counts."""
    import pyarrow as pa

    from sentsim.evaluation.datasets import load_stsb

    out, counts = {}, {}
    for split, (task, path) in stsb_files(stsb_dir).items():
        st = load_stsb(path, task).sets[0]
        out[split] = pa.table({"s1": pa.array(list(st.s1), pa.string()), "s2": pa.array(list(st.s2), pa.string()),
                               "score": pa.array([float(g) / 5.0 for g in st.gold], pa.float64()),
                               "split": pa.array([split] * len(st.s1), pa.string())})
        counts[split] = out[split].num_rows
    return out, counts
