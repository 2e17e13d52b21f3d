"""`sentsim store compact`: per-unit shards rewritten into files of a target size, resumable, and
readers (RunReader, pyarrow, pandas, ray.data and `datasets`, through it or over DIR/<table>) see
exactly the same rows before and after. Compaction refuses a run with a lost, empty or edited marker
or shard, survives a kill at every step (bench/crash_points.py), and a resume or a second
compaction after it never drops or doubles a row."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
from conftest import load_bench, sentsim_cli
from test_store import s3_server  # noqa: F401  (the moto fixture, reused)

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


def test_same_rows_before_and_after_through_every_reader(tmp_path, ray_local):
    import datasets
    import pandas as pd
    import pyarrow.dataset as pads
    import ray

    from storage import RunReader, open_run, verify_store
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
        hf = open_run(str(run)).hf_dataset(t)
        assert hf.num_rows == before[t].num_rows and hf.column_names == before[t].column_names
    reader = RunReader(str(run))
    # the compacted files sit in the table's own folder, and nothing else does: plain readers are right too
    names = sorted(p.name for p in (run / "a").iterdir())
    assert names == [f"compact-001-{i:05d}.parquet" for i in range(r["files"]["a"])]
    assert [f.rsplit("/", 1)[1] for f in reader.files("a")] == sorted(p.name for p in (run / "a").iterdir())
    assert reader.rows("a") == before["a"].num_rows
    assert pads.dataset(str(run / "a")).to_table().equals(before["a"])
    assert len(pd.read_parquet(run / "b")) == before["b"].num_rows
    assert ray.data.read_parquet(str(run / "a")).count() == before["a"].num_rows
    hf = datasets.load_dataset("parquet", data_files=str(run / "a" / "*.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == before["a"].num_rows
    assert sorted(p.name for p in (run / "_compact").iterdir()) == ["manifest.json"]  # staging cleared
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
    (run / "_tmp" / ".tmp-999-x-compact-001-00003.parquet").write_bytes(b"half a file")  # killed mid-write
    assert snapshot(run)[0]["a"].equals(before["a"]) and verify_store(str(run)) == []  # still the unit files
    kept = {p.name: p.stat().st_mtime_ns for p in (run / "_compact" / "a").glob("compact-*.parquet")}
    assert len(kept) == 3 and not list((run / "a").glob("compact-*"))  # staged outside the table's folder
    r = compact_run(str(run), target_bytes=1 << 20)  # another target: the begun plan is kept
    assert r["status"] == "compacted" and r["written"] == sum(r["files"].values()) - 3
    assert {p: (run / "a" / p).stat().st_mtime_ns for p in kept} == kept  # moved, not rewritten
    assert not list((run / "_tmp").iterdir())
    after, _ = snapshot(run)
    assert all(after[t].equals(before[t]) for t in ("a", "b"))
    # a unit shard without a valid marker is named, and so is a lost marker
    from storage import ShardStore

    store = ShardStore(str(run))
    store.write_unit(0, {"a": before["a"].slice(0, 1), "b": before["b"].slice(0, 1)}, "fp1")  # a stray unit file
    (run / "_units" / "00000.json").write_bytes(b"")  # and its marker lost: an unmarked shard
    problems = verify_store(str(run))
    assert "a/part-00000.parquet: no completion marker (partial unit or foreign file)" in problems
    assert any("_units/00000.json: completion marker is empty" in p for p in problems)
    # a corrupt compacted file is named
    f = run / "b" / "compact-001-00000.parquet"
    f.write_bytes(f.read_bytes()[:-10] + b"x" * 10)
    assert "b/compact-001-00000.parquet: checksum differs from _compact/manifest.json (edited or corrupt)" in \
        verify_store(str(run))


def test_a_job_resumed_on_a_compacted_run_redoes_nothing(tmp_path):
    from run_support import toy_job

    from sentsim.executor import execute
    from storage import RunReader
    from storage.compact import compact_run

    units = [{"unit": u, "x": u * u} for u in range(6)]
    execute(toy_job(tmp_path / "r", units), executor="inline", quiet=True)
    before = RunReader(str(tmp_path / "r")).read_table("t")
    compact_run(str(tmp_path / "r"), target_bytes=1)
    assert compact_run(str(tmp_path / "r"), target_bytes=1)["files"] == {"t": 6}  # 1 byte: a unit per file
    m = execute(toy_job(tmp_path / "r", units), executor="inline", quiet=True)
    assert m["complete"] and m["this_run"]["units"] == 0
    assert RunReader(str(tmp_path / "r")).read_table("t").equals(before)
    # --force-new clears the compaction with the run
    execute(toy_job(tmp_path / "r", units), executor="inline", quiet=True, force_new=True)
    assert not (tmp_path / "r" / "_compact").exists()


@pytest.mark.parametrize("case", ["missing", "not a run", "incomplete", "bad target", "inf target", "nan target"])
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    run = tmp_path / "run"
    args = [run]
    if case == "not a run":
        run.mkdir()
        (run / "x.txt").write_text("hello")
    elif case == "incomplete":
        make_run(run, n_units=6, complete=False)
    elif case.endswith("target"):
        make_run(run, n_units=3)
        args += ["--target-mb", {"bad target": "0", "inf target": "inf", "nan target": "nan"}[case]]
    r = sentsim_cli("store", "compact", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    expected = {"missing": "no such directory", "not a run": "not a sentsim run directory",
                "incomplete": "not complete"}.get(case, "--target-mb must be positive and finite")
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


def test_compacting_again_with_another_target_regroups_the_files(tmp_path):
    """`--target-mb` on a compacted run rewrites its files to the new size (merged or split, a whole unit
    the smallest piece), same rows in the same order; without it the committed target stands."""
    import pyarrow.dataset as pads

    from storage import RunReader

    run = tmp_path / "run"
    make_run(run, n_units=30)
    before, _ = snapshot(run)

    def names(t):
        return sorted(p.name for p in (run / t).iterdir())

    def compact(*target):
        r = sentsim_cli("store", "compact", run, *target)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert verify_ok(run) and all(snapshot(run)[0][t].equals(before[t]) for t in ("a", "b"))
        assert all(pads.dataset(str(run / t)).to_table().equals(before[t]) for t in ("a", "b"))
        assert sorted(p.name for p in (run / "_compact").iterdir()) == ["manifest.json"]
        return r

    first = compact("--target-mb", "0.005")
    assert "compacted (a 10, b 4 file(s); 60 per-unit shard(s) removed); target 0.005 MB a file" in first.stdout
    again = compact()
    assert "already compacted (a 10, b 4 file(s)" in again.stdout and "target 0.005 MB a file" in again.stdout
    assert "pass --target-mb" in again.stdout
    merged = compact("--target-mb", "1")
    assert "compacted (a 1, b 1 file(s); 0 per-unit shard(s) removed; 14 earlier compacted file(s) replaced); " \
           "target 1 MB a file" in merged.stdout
    assert "was compacted to about 0.005 MB a file: rewriting its files to about 1 MB" in merged.stderr
    assert names("a") == names("b") == ["compact-002-00000.parquet"]
    split = compact("--target-mb", "0.0001")  # below any unit's shard: a unit a file
    assert "compacted (a 30, b 30 file(s)" in split.stdout
    assert names("a") == [f"compact-003-{i:05d}.parquet" for i in range(30)]
    assert [len(f["units"]) for f in RunReader(str(run)).compaction()["tables"]["a"]] == [1] * 30
    # another target that groups the units as they are: the files are kept, not written again
    kept = {p.name: p.stat().st_mtime_ns for p in (run / "a").iterdir()}
    same = compact("--target-mb", "0.00011")
    assert "compacted (a 30, b 30 file(s); 0 per-unit shard(s) removed)" in same.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (run / "a").iterdir()} == kept
    assert RunReader(str(run)).compaction()["generation"] == 4
    at_target = compact("--target-mb", "0.00011").stdout
    assert "already compacted" in at_target and "pass --target-mb" not in at_target  # it was passed


def test_a_killed_compaction_to_another_target_keeps_the_committed_files_and_resumes(tmp_path):
    from storage.compact import compact_run

    run = tmp_path / "run"
    make_run(run, n_units=30)
    before, _ = snapshot(run)
    assert compact_run(str(run), target_bytes=4_000)["status"] == "compacted"
    committed = sorted(p.name for p in (run / "a").iterdir())
    assert compact_run(str(run), target_bytes=1 << 20, stop_after=1) == {"status": "stopped", "written": 1}
    # killed before the new commit: readers still read the committed files, which are all still there
    assert sorted(p.name for p in (run / "a").iterdir()) == committed
    assert all(snapshot(run)[0][t].equals(before[t]) for t in ("a", "b")) and verify_ok(run)
    r = sentsim_cli("store", "compact", run, "--target-mb", "1")
    assert r.returncode == 0 and "compacted (a 1, b 1 file(s)" in r.stdout, r.stderr
    assert sorted(p.name for p in (run / "a").iterdir()) == ["compact-002-00000.parquet"]
    assert all(snapshot(run)[0][t].equals(before[t]) for t in ("a", "b")) and verify_ok(run)
    # the same command without --target-mb resumes the compaction it finds begun, as a first one does
    assert compact_run(str(run), target_bytes=4_000, stop_after=2) == {"status": "stopped", "written": 2}
    r = sentsim_cli("store", "compact", run)
    assert r.returncode == 0 and "compacted (a 10, b 5 file(s)" in r.stdout and "target 0.00381 MB" in r.stdout
    assert "resuming" not in r.stderr and not list((run / "a").glob("compact-002-*"))
    assert all(snapshot(run)[0][t].equals(before[t]) for t in ("a", "b")) and verify_ok(run)


def verify_ok(run) -> bool:
    from storage import verify_store

    return verify_store(str(run)) == []


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
        assert not list((src / t).glob("part-*.parquet"))  # only the compacted files are left to read
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
    rel = "context_scores/compact-001-00000.parquet"
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


# ---------------------------------------------------------------- a real corpus run: refusals, resumes, crashes

CORPUS_KEYS = {"sentences": "sentence_id", "chunks": "chunk_id"}


def corpus_rows(run):
    from storage import RunReader

    r = RunReader(str(run))
    return {t: r.read_table(t).sort_by(k) for t, k in CORPUS_KEYS.items()}


def resume_corpus(sample_path, run):
    """The job that wrote the run, run again as a user would: it redoes what is not done."""
    r = sentsim_cli("corpus", "build", sample_path, "--out", run, "--executor", "inline", "--set", "docs_per_unit=4")
    assert r.returncode == 0, r.stderr
    return r


def flip_a_byte(path):
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x01  # same size, other bytes: only a checksum tells
    path.write_bytes(bytes(blob))


def damage(run, case):
    """What a power loss, a stray edit or a user's `rm` can leave; returns what the refusal must name."""
    marker = run / "_units" / "00002.json"
    shard = run / "sentences" / "part-00003.parquet"
    if case == "marker deleted":
        marker.unlink()
        return "unit 00002's completion marker is missing"
    if case == "marker empty":
        marker.write_bytes(b"")
        return "unit 00002's completion marker is empty"
    if case == "marker edited":  # one digit of a row count: still valid JSON, same size
        text = marker.read_text()
        i = text.index('"rows": ') + len('"rows": ')
        marker.write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:])
        return "unit 00002's completion marker fails its own checksum"
    if case == "shard edited":
        flip_a_byte(shard)
        return "sentences/part-00003.parquet: size or sha256 differs from its unit marker"
    if case == "shard truncated":
        shard.write_bytes(shard.read_bytes()[:-7])
        return "sentences/part-00003.parquet: size"
    if case == "shard deleted":
        shard.unlink()
        return "sentences/part-00003.parquet: missing"
    raise ValueError(case)


@pytest.mark.parametrize("case", ["marker deleted", "marker empty", "marker edited", "shard edited", "shard truncated",
                                  "shard deleted"])
def test_compaction_refuses_a_run_with_a_bad_marker_or_shard_and_resume_fixes_it(
        speech_corpus, sample_path, tmp_path, case):
    """The audit's loss: a deleted marker made compaction hide 1,249 of 3,772 sentences, and an edited
    shard was copied into the compacted file. Now nothing is written, the line says what to do, and
    doing it (verify, resume, compact) gives every row back."""
    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    want = corpus_rows(speech_corpus)
    named = damage(run, case)
    listing = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    r = sentsim_cli("store", "compact", run, "--target-mb", "0.1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert named in r.stderr and "sentsim store verify" in r.stderr and "resume the job" in r.stderr, r.stderr
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == listing  # nothing written or moved
    v = sentsim_cli("store", "verify", run)
    assert v.returncode == 1 and ("00002" in v.stderr or "part-00003" in v.stderr), v.stderr
    resumed = resume_corpus(sample_path, run)
    redone = "unit 00003" if case.startswith("shard") else "unit 00002"
    assert f"[corpus] {redone} | 1 units" in resumed.stderr, resumed.stderr  # that unit, and only it, is redone
    if case != "marker deleted":
        assert f"{redone} will be redone" in resumed.stderr, resumed.stderr
    r = sentsim_cli("store", "compact", run, "--target-mb", "0.1")
    assert r.returncode == 0 and "compacted" in r.stdout, r.stderr
    got = corpus_rows(run)
    assert all(got[t].equals(want[t]) for t in CORPUS_KEYS)
    assert sentsim_cli("store", "verify", run).returncode == 0


def test_resume_and_second_compaction_keep_the_rows_of_a_redone_unit(speech_corpus, sample_path, tmp_path):
    """The audit's second loss: after a resume and a second compaction, the 2,375 rows of the redone unit
    were deleted. A compacted slice now stands for a unit only while its marker names the same shard."""
    import pyarrow.dataset as pads
    redo_unit_with_other_bytes = load_bench("crash_points").redo_unit_with_other_bytes

    from storage import RunReader, StoreError
    from storage.compact import compact_run

    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    want = corpus_rows(speech_corpus)
    assert compact_run(str(run), target_bytes=100_000)["status"] == "compacted"
    # a marker lost after compaction: the unit is not committed any more, and the compacted file holding
    # its rows cannot be read whole; readers refuse rather than serve them, and say what to do
    (run / "_units" / "00002.json").unlink()
    with pytest.raises(StoreError, match="holds rows of unit.s. 00002 that no completion marker vouches for.*"
                                         "sentsim store compact"):
        RunReader(str(run)).read_table("sentences")
    r = sentsim_cli("store", "compact", run)
    assert r.returncode == 2 and "unit 00002's completion marker is missing" in r.stderr
    # the resume redoes it (bit for bit here): the redone shard is the compacted one, removed as such
    resumed = resume_corpus(sample_path, run)
    assert "unit 00002 will be redone" in resumed.stderr or "1 units" in resumed.stderr
    assert all(corpus_rows(run)[t].equals(want[t]) for t in CORPUS_KEYS)
    assert sentsim_cli("store", "verify", run).returncode == 0 and not list(run.glob("*/part-*.parquet"))
    # a redo with other bytes (one sentence fewer): readers refuse the stale compacted file; compacting
    # again keeps the redone rows and every other unit's, in a new generation of files
    redo_unit_with_other_bytes(run)
    expected = pa.concat_tables([RunReader(str(run)).unit_table(u, "sentences") for u in range(5)])
    assert expected.num_rows == want["sentences"].num_rows - 1
    v = sentsim_cli("store", "verify", run)
    assert v.returncode == 1 and "holds rows of unit(s) 00002" in v.stderr
    r = compact_run(str(run), target_bytes=100_000)
    # units 0-1 and 2-4 in two files: the first is kept, the second rewritten; chunks' one file is kept
    assert r["status"] == "compacted" and r["files"] == {"chunks": 1, "sentences": 2} and r["written"] == 1
    got = RunReader(str(run)).read_table("sentences")
    assert got.equals(expected)
    plain = pads.dataset(str(run / "sentences")).to_table()
    assert plain.sort_by("sentence_id").equals(expected.sort_by("sentence_id"))
    assert sorted(p.name for p in (run / "sentences").iterdir()) == ["compact-001-00000.parquet",
                                                                     "compact-002-00001.parquet"]
    assert sentsim_cli("store", "verify", run).returncode == 0
    assert compact_run(str(run), target_bytes=100_000)["status"] == "already compacted"
    assert RunReader(str(run)).read_table("sentences").equals(expected)


@pytest.mark.parametrize("case", ["edited", "deleted"])
def test_a_broken_compacted_file_is_withdrawn_and_its_units_redone(speech_corpus, sample_path, tmp_path, case):
    from storage import RunReader
    from storage.compact import compact_run

    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    want = corpus_rows(speech_corpus)
    compact_run(str(run), target_bytes=100_000)
    bad = run / "sentences" / "compact-001-00001.parquet"
    held = [u for u, _, _ in next(r for r in RunReader(str(run)).compaction()["tables"]["sentences"]
                                  if r["path"].endswith(bad.name))["units"]]
    flip_a_byte(bad) if case == "edited" else bad.unlink()
    v = sentsim_cli("store", "verify", run)
    assert v.returncode == 1 and "sentences/compact-001-00001.parquet" in v.stderr
    resumed = resume_corpus(sample_path, run)
    for u in held:
        assert f"unit {u:05d} will be redone: sentences/compact-001-00001.parquet" in resumed.stderr
    assert all(corpus_rows(run)[t].equals(want[t]) for t in CORPUS_KEYS)
    assert sentsim_cli("store", "verify", run).returncode == 0
    # the redone units' own shards are read beside the compacted files, until the next compaction folds them in
    assert sorted(p.name for p in (run / "sentences").glob("part-*")) == [f"part-{u:05d}.parquet" for u in held]
    assert compact_run(str(run), target_bytes=100_000)["status"] == "compacted"
    assert all(corpus_rows(run)[t].equals(want[t]) for t in CORPUS_KEYS) and not list(run.glob("*/part-*"))


@pytest.mark.slow
def test_every_crash_point_of_compaction_keeps_every_row(speech_corpus, tmp_path):
    """SIGKILL just before each durable step of `sentsim store compact` (plan, each output file and its
    record, the commit, each move into the table's folder, each removal), on a first compaction and on
    a second one after a unit was redone with other rows: RunReader reads exactly the committed rows at
    every point (or refuses, where a stale compacted file is still committed), and rerunning the command
    always ends with exactly those rows, in RunReader and in a plain read of DIR/<table>, and verify OK."""
    cp = load_bench("crash_points")
    KEYS, compaction_crash_points, compaction_table = cp.CORPUS_KEYS, cp.compaction_crash_points, cp.compaction_table
    redo_unit_with_other_bytes = cp.redo_unit_with_other_bytes

    from storage.compact import compact_run

    rows = compaction_crash_points(speech_corpus, tmp_path / "first", 100_000)
    compacted = tmp_path / "compacted"
    shutil.copytree(speech_corpus, compacted)
    compact_run(str(compacted), target_bytes=100_000)
    rows += compaction_crash_points(compacted, tmp_path / "second", 100_000, prepare=redo_unit_with_other_bytes,
                                    label="second")
    print(compaction_table(rows))
    steps = [r["killed before"] for r in rows]
    for kind in ("rename into _compact/plan.json", "rename into _compact/sentences/compact-001-00000.parquet",
                 "rename into _compact/sentences/compact-001-00000.json", "rename into _compact/manifest.json",
                 "rename into sentences/compact-001-00000.parquet", "delete sentences/part-00000.parquet",
                 "rename into _compact/sentences/compact-002-00001.parquet",
                 "delete sentences/compact-001-00001.parquet"):
        assert kind in steps, (kind, steps)
    for r in rows:
        for t in KEYS:
            stale_committed = r["scenario"] == "second" and r[f"{t} RunReader"] == "refused"
            assert r[f"{t} RunReader exact"] or stale_committed, r
            assert r[f"{t} after rerun exact"] and r[f"{t} plain after rerun"] == r[f"{t} committed"], r
        assert r["rerun rc"] == 0 and r["verify after rerun"] == "OK", r


@pytest.mark.slow
def test_every_crash_point_of_a_compaction_to_another_target_keeps_every_row(speech_corpus, tmp_path):
    """SIGKILL before each durable step of `sentsim store compact --target-mb` on a run compacted at
    another target: the earlier files are read until the new commit and removed only after it, so
    RunReader reads exactly the committed rows at every point, and rerunning the command ends with
    exactly those rows (RunReader and plain DIR/<table>), all in files of the new generation."""
    cp = load_bench("crash_points")

    from storage.compact import compact_run

    compacted = tmp_path / "compacted"
    shutil.copytree(speech_corpus, compacted)
    compact_run(str(compacted), target_bytes=100_000)
    rows = cp.compaction_crash_points(compacted, tmp_path / "retarget", 1 << 20, label="another target")
    print(cp.compaction_table(rows))
    steps = [r["killed before"] for r in rows]
    for kind in ("rename into _compact/sentences/compact-002-00000.parquet", "rename into _compact/manifest.json",
                 "rename into sentences/compact-002-00000.parquet", "delete sentences/compact-001-00000.parquet"):
        assert kind in steps, (kind, steps)
    for r in rows:
        for t in cp.CORPUS_KEYS:
            assert r[f"{t} RunReader exact"], r
            assert r[f"{t} after rerun exact"] and r[f"{t} plain after rerun"] == r[f"{t} committed"], r
        assert r["rerun rc"] == 0 and r["verify after rerun"] == "OK", r


def test_compaction_on_s3_through_the_command(s3_server, tmp_path):  # noqa: F811
    """The same commit order on the moto S3 server: one PUT per file, the compacted files copied into the
    table's prefix after the commit; the command, RunReader and a plain listing agree."""
    import pyarrow.fs as pafs

    from storage import RunReader, verify_store

    uri = "s3://sentsim/compact/run"
    make_run(uri, n_units=12)
    before = {t: RunReader(uri).read_table(t) for t in ("a", "b")}
    r = sentsim_cli("store", "compact", uri, "--target-mb", "0.005", env=s3_server)
    assert r.returncode == 0 and "compacted" in r.stdout, r.stderr
    reader = RunReader(uri)
    for t in ("a", "b"):
        assert reader.read_table(t).equals(before[t])
        listed = reader.fs.get_file_info(pafs.FileSelector(f"sentsim/compact/run/{t}"))
        assert {i.base_name for i in listed} == {f.rsplit("/", 1)[1] for f in reader.files(t)}
        assert all(i.base_name.startswith("compact-001-") for i in listed)
    assert verify_store(uri) == []
    assert sentsim_cli("store", "verify", uri, env=s3_server).returncode == 0


def test_compaction_moves_a_foreign_file_out_of_the_table_folder(speech_corpus, tmp_path):
    """A valid Parquet file no marker names, dropped into a table folder: `store compact` moves it into
    _foreign/<table>/ and names it, so plain readers of DIR/<table> read exactly the run's rows; the
    file itself is kept. A second call finds nothing more to move."""
    import pyarrow.dataset as pads

    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    want = corpus_rows(speech_corpus)
    shutil.copyfile(run / "sentences" / "part-00001.parquet", run / "sentences" / "extra.parquet")
    (run / "chunks" / "stray").mkdir()
    shutil.copyfile(run / "chunks" / "part-00000.parquet", run / "chunks" / "stray" / "part-00000.parquet")
    r = sentsim_cli("store", "compact", run, "--target-mb", "0.1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "moved 2 file(s) no marker names" in r.stderr and "_foreign/sentences/extra.parquet" in r.stderr, r.stderr
    for t, key in CORPUS_KEYS.items():
        plain = pads.dataset(str(run / t), format="parquet").to_table()
        assert plain.sort_by(key).equals(want[t].sort_by(key)), t
        assert corpus_rows(run)[t].equals(want[t])
    assert (run / "_foreign" / "sentences" / "extra.parquet").is_file()
    assert (run / "_foreign" / "chunks" / "stray" / "part-00000.parquet").is_file()
    assert sentsim_cli("store", "verify", run).returncode == 0
    again = sentsim_cli("store", "compact", run)
    assert again.returncode == 0 and "already compacted" in again.stdout and "moved" not in again.stderr


def _redo_unit_same_rows_other_bytes(run, unit: int = 2) -> pa.Table:
    """Unit `unit` written again after the compaction with as many rows, other content (its texts
    upper-cased): what a resumed job whose redo is not bit-identical leaves. Returns its new rows."""
    from storage import RunReader, ShardStore

    r = RunReader(str(run))
    tables = {t: r.unit_table(unit, t) for t in CORPUS_KEYS}
    s = tables["sentences"]
    tables["sentences"] = s.set_column(s.schema.get_field_index("text"), "text",
                                       pa.array([x.upper() for x in s["text"].to_pylist()]))
    extra = r.units()[unit].get("extra", {})
    (run / "_units" / f"{unit:05d}.json").unlink()
    ShardStore(str(run)).write_unit(unit, tables, r.fingerprint, extra)
    return tables["sentences"]


def _strip_source_sha(run) -> None:
    """The committed compaction as sentsim wrote it before it recorded each unit's source sha256."""
    from storage.records import record_check

    p = run / "_compact" / "manifest.json"
    rec = json.loads(p.read_text())
    for recs in rec["tables"].values():
        for r in recs:
            r["units"] = [e[:2] for e in r["units"]]
    rec["check"] = record_check(rec)
    p.write_text(json.dumps(rec, sort_keys=True))


@pytest.mark.parametrize("compaction", ["current", "without source sha256"])
def test_a_unit_redone_with_as_many_rows_but_other_bytes_is_never_the_compacted_one(
        speech_corpus, tmp_path, compaction):
    """A compacted slice stands for a unit by the content of the shard it copied, not by its row count:
    the redone unit's new rows are what every reader returns, and nothing deletes them."""
    import pyarrow.compute as pc

    from storage import RunReader, ShardStore, StoreError
    from storage.compact import compact_run

    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    assert compact_run(str(run), target_bytes=100_000)["status"] == "compacted"
    if compaction != "current":
        _strip_source_sha(run)
    new = _redo_unit_same_rows_other_bytes(run)
    assert new.num_rows == pq_rows(speech_corpus / "sentences" / "part-00002.parquet")
    assert RunReader(str(run)).unit_table(2, "sentences").equals(new)
    with pytest.raises(StoreError, match="holds rows of unit.s. 00002 that no completion marker vouches for"):
        RunReader(str(run)).read_table("sentences")
    ShardStore(str(run)).finalize(5, {})  # what the resumed job's end does: must keep the redone shard
    assert (run / "sentences" / "part-00002.parquet").is_file()
    r = compact_run(str(run), target_bytes=100_000)
    assert r["status"] == "compacted"
    got = RunReader(str(run)).read_table("sentences")
    assert got.filter(pc.is_in(got["sentence_id"], new["sentence_id"])).equals(new)
    assert got.num_rows == corpus_rows(speech_corpus)["sentences"].num_rows
    assert sentsim_cli("store", "verify", run).returncode == 0


def pq_rows(path) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows
