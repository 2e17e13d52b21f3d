"""`sentsim store compact`: per-unit shards rewritten into files of a target size, resumable, and
readers (RunReader, pyarrow and ray.data through it) see exactly the same rows before and after."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
from conftest import sentsim_cli

A = pa.schema([("unit", pa.int64()), ("i", pa.int64()), ("text", pa.string())])
B = pa.schema([("unit", pa.int64()), ("v", pa.float32())])


def make_run(out, n_units=30, complete=True, stage="toy"):
    """A run of two tables, unit u holding u % 7 + 1 rows of each (a unit of 0 rows in B too)."""
    from storage import ShardStore

    store = ShardStore(str(out))
    store.open_run(stage, "fp1", {}, [], {"a": A, "b": B}, planned_units=n_units)
    rng = np.random.default_rng(0)
    for u in range(n_units if complete else n_units - 3):
        k = u % 7 + 1
        a = pa.table({"unit": [u] * k, "i": list(range(k)), "text": [f"u{u} row {i} " * 20 for i in range(k)]},
                     schema=A)
        b = pa.table({"unit": [u] * (k if u % 5 else 0), "v": rng.random(k if u % 5 else 0).astype(np.float32)},
                     schema=B)
        store.write_unit(u, {"a": a, "b": b}, "fp1", {"rows": k})
    return store.finalize(n_units, {})


def snapshot(run):
    from storage import RunReader

    r = RunReader(str(run))
    return {t: r.read_table(t) for t in ("a", "b")}, {t: r.dataset(t).to_table() for t in ("a", "b")}


def test_same_rows_before_and_after_through_pyarrow_and_ray(tmp_path, ray_local):
    from storage import RunReader, verify_store
    from storage.compact import compact_run

    run = tmp_path / "run"
    assert make_run(run)["complete"]
    before, before_ds = snapshot(run)
    ray_before = {t: RunReader(str(run)).ray_dataset(t).to_pandas() for t in ("a", "b")}
    r = compact_run(str(run), target_bytes=4_000)
    assert r["status"] == "compacted" and r["removed"] == 60
    assert 1 < r["files"]["a"] < 30 and r["files"]["b"] < 30
    after, after_ds = snapshot(run)
    for t in ("a", "b"):
        assert after[t].equals(before[t]) and after_ds[t].equals(before_ds[t])  # same rows, same order
        got = RunReader(str(run)).ray_dataset(t).to_pandas()
        key = ["unit", "i"] if t == "a" else ["unit", "v"]
        assert got.sort_values(key).reset_index(drop=True).equals(
            ray_before[t].sort_values(key).reset_index(drop=True))
    reader = RunReader(str(run))
    assert all("/_compact/a/" in f for f in reader.files("a")) and len(reader.files("a")) == r["files"]["a"]
    assert reader.rows("a") == before["a"].num_rows and not list((run / "a").glob("*.parquet"))
    assert verify_store(str(run)) == []
    # once more: nothing to do
    assert compact_run(str(run), target_bytes=4_000)["status"] == "already compacted"


def test_killed_compaction_resumes_and_readers_never_see_a_mix(tmp_path):
    from storage import verify_store
    from storage.compact import compact_run

    run = tmp_path / "run"
    make_run(run)
    before, _ = snapshot(run)
    r = compact_run(str(run), target_bytes=4_000, stop_after=3)  # as if killed after 3 output files
    assert r == {"status": "stopped", "written": 3}
    (run / "_compact" / "a" / ".tmp-999-part-00003.parquet").write_bytes(b"half a file")  # killed mid-write
    assert snapshot(run)[0]["a"].equals(before["a"]) and verify_store(str(run)) == []  # still the unit files
    kept = {p.name: p.stat().st_mtime_ns for p in (run / "_compact" / "a").glob("part-*.parquet")}
    assert len(kept) == 3
    r = compact_run(str(run), target_bytes=1 << 20)  # another target: the begun plan is kept
    assert r["status"] == "compacted" and r["written"] == sum(r["files"].values()) - 3
    assert {p: (run / "_compact" / "a" / p).stat().st_mtime_ns for p in kept} == kept
    assert not list((run / "_compact" / "a").glob(".tmp-*"))
    after, _ = snapshot(run)
    assert all(after[t].equals(before[t]) for t in ("a", "b"))
    # killed while removing the unit files: a leftover is named by verify and removed by the next call
    shutil.copy(run / "_compact" / "a" / "part-00000.parquet", run / "a" / "part-00000.parquet")
    assert verify_store(str(run)) == ["a/part-00000.parquet: left over from compaction; run `sentsim store "
                                      "compact` again"]
    assert compact_run(str(run))["removed"] == 1 and verify_store(str(run)) == []
    # a corrupt compacted file is named
    f = run / "_compact" / "b" / "part-00000.parquet"
    f.write_bytes(f.read_bytes()[:-10] + b"x" * 10)
    assert verify_store(str(run)) == ["_compact/b/part-00000.parquet: checksum mismatch (edited or corrupt)"]


def test_a_job_resumed_on_a_compacted_run_redoes_nothing(tmp_path):
    from test_executor import _job

    from sentsim.executor import execute
    from storage import RunReader
    from storage.compact import compact_run

    units = [{"unit": u, "x": u * u} for u in range(6)]
    execute(_job(tmp_path / "r", units), executor="inline", quiet=True)
    before = RunReader(str(tmp_path / "r")).read_table("t")
    compact_run(str(tmp_path / "r"), target_bytes=1)
    assert compact_run(str(tmp_path / "r"), target_bytes=1)["files"] == {"t": 6}  # 1 byte: a unit per file
    m = execute(_job(tmp_path / "r", units), executor="inline", quiet=True)
    assert m["complete"] and m["this_run"]["units"] == 0
    assert RunReader(str(tmp_path / "r")).read_table("t").equals(before)
    # --force-new clears the compaction with the run
    execute(_job(tmp_path / "r", units), executor="inline", quiet=True, force_new=True)
    assert not (tmp_path / "r" / "_compact").exists()


@pytest.mark.parametrize("case", ["missing", "not a run", "incomplete", "bad target"])
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    run = tmp_path / "run"
    args = [run]
    if case == "not a run":
        run.mkdir()
        (run / "x.txt").write_text("hello")
    elif case == "incomplete":
        make_run(run, n_units=6, complete=False)
    elif case == "bad target":
        make_run(run, n_units=3)
        args += ["--target-mb", "0"]
    r = sentsim_cli("store", "compact", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    expected = {"missing": "no such directory", "not a run": "not a sentsim run directory",
                "incomplete": "not complete", "bad target": "--target-mb must be positive"}[case]
    assert expected in r.stderr
    if case == "incomplete":
        m = json.loads((run / "manifest.json").read_text())
        assert not m["complete"] and not (run / "_compact").exists()


def test_help_and_a_real_compaction_through_the_cli(tmp_path):
    r = sentsim_cli("store", "compact", "--help")
    assert r.returncode == 0 and "--target-mb" in r.stdout
    make_run(tmp_path / "run", n_units=4)
    r = sentsim_cli("store", "compact", tmp_path / "run")
    assert r.returncode == 0 and "compacted (a 1, b 1 file(s); 8 per-unit shard(s) removed)" in r.stdout


@pytest.fixture(scope="module")
def small_harvest(speech_corpus, tmp_path_factory):
    """A real harvest of 4 units (8 anchors, 2 a unit), with its context scores."""
    from harvest_support import build_index_for, harvest_config, tiny_context_bundle

    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("compact_harvest")
    cfg = harvest_config(speech_corpus, build_index_for(speech_corpus, root / "index"),
                         tiny_context_bundle(speech_corpus, root / "ctx"), root / "run",
                         anchors={"n": 8, "per_unit": 2}, rank={"enabled": False})
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    return root / "run"


HARVEST_KEYS = {"pairs": ["pair_id"], "sentences": ["sentence_id"], "context_scores": ["sentence_id", "context_id"]}


def harvest_tables(run):
    from storage import RunReader

    r = RunReader(str(run))
    return {t: r.read_table(t).sort_by([(k, "ascending") for k in key]) for t, key in HARVEST_KEYS.items()}


def compacted_copy(src, dst):
    """A compacted copy of `src`, files of about two units each, so that units share a file."""
    from storage import RunReader
    from storage.compact import compact_run

    shutil.copytree(src, dst)
    units = RunReader(str(dst)).units()
    # above any one unit's shard: each file holds 2 units or more (the last may hold one)
    target = max(f["bytes"] for rec in units.values() for f in rec["files"].values()) + 1
    assert compact_run(str(dst), target_bytes=target)["status"] == "compacted"
    return dst


@pytest.mark.slow
def test_remix_of_a_compacted_harvest_equals_the_remix_before_compacting(small_harvest, tmp_path):
    from sentsim.harvest.remix import RemixConfig, remix
    from storage import RunReader

    before = RunReader(str(small_harvest))
    n_units = len(before.units())
    assert n_units == 4
    m = remix(RemixConfig(source=str(small_harvest), out=str(tmp_path / "a"), lambda_fwd=0.5), quiet=True)
    assert m["complete"] and m["remix"]["rescored"] > 0
    src = compacted_copy(small_harvest, tmp_path / "src")
    after = RunReader(str(src))
    for t in HARVEST_KEYS:
        files = after.compaction()["tables"][t]
        assert not list((src / t).glob("*.parquet"))  # only the compacted files are left to read
        assert 1 < len(files) < n_units and len(files[0]["units"]) > 1  # units read from the middle of a file
        for u in range(n_units):  # each unit's rows as written, the slice of its compacted file
            assert after.unit_table(u, t).equals(before.unit_table(u, t)), (t, u)
            assert after.check_unit(u) is None
    m = remix(RemixConfig(source=str(src), out=str(tmp_path / "b"), lambda_fwd=0.5), quiet=True)
    assert m["complete"] and m["remix"]["rescored"] > 0
    a, b = harvest_tables(tmp_path / "a"), harvest_tables(tmp_path / "b")
    for t in HARVEST_KEYS:
        assert a[t].num_rows > 0 and b[t].equals(a[t]), t
    assert not a["pairs"].equals(harvest_tables(small_harvest)["pairs"])  # λ2 = 0.5 did change the scores


@pytest.mark.slow
def test_remix_names_a_corrupt_compacted_file_in_one_line(small_harvest, tmp_path):
    from storage import RunReader, StoreError

    src = compacted_copy(small_harvest, tmp_path / "src")
    rel = "_compact/context_scores/part-00000.parquet"
    blob = bytearray((src / rel).read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # same size, other bytes: only the checksum tells
    (src / rel).write_bytes(bytes(blob))
    r = sentsim_cli("remix", src, "--out", tmp_path / "out", "--lambda-fwd", "0.5")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert rel in r.stderr and "sentsim store verify" in r.stderr
    assert not (tmp_path / "out" / "pairs").exists()
    # a reader that did not check first (a remix actor) refuses the file when it loads it, naming it
    with pytest.raises(StoreError, match=f"{rel}: checksum differs .*sentsim store verify"):
        RunReader(str(src)).unit_table(0, "context_scores")
    (src / rel).write_bytes(bytes(blob[:-100]))
    with pytest.raises(StoreError, match=f"{rel}: size {len(blob) - 100} bytes.*truncated"):
        RunReader(str(src)).unit_table(0, "context_scores")
    assert RunReader(str(src)).unit_table(0, "pairs").num_rows > 0  # the other tables' files still read
