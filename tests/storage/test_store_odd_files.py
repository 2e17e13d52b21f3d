"""A folder (or anything not a regular file) where a run's marker, manifest, completion flag or shard
belongs never wedges the run: `sentsim store verify` names it, a resume treats the unit as not done,
removes it and redoes the unit, `store compact` refuses in one line, and a manifest that is a folder is
refused in one line by every command until `--force-new` clears it. Through the real CLI, no traceback."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
from conftest import sentsim_cli

from storage import RunReader


def build(sample_path, run, *extra):
    return sentsim_cli("corpus", "build", sample_path, "--out", run, "--executor", "inline",
                       "--set", "docs_per_unit=4", *extra)


def one_line(r, code: int = 2) -> str:
    assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def rows(run) -> dict:
    r = RunReader(str(run))
    return {t: r.read_table(t).sort_by(key) for t, key in (("sentences", "sentence_id"), ("chunks", "chunk_id"))}


def make_folder(path) -> None:
    if path.exists():
        path.unlink()
    path.mkdir()
    (path / "inside.txt").write_text("not a run file")  # a non-empty folder: a rename cannot replace it


@pytest.mark.parametrize("where", ["_units/00002.json", "sentences/part-00002.parquet"])
def test_a_folder_at_a_marker_or_shard_is_named_and_the_unit_redone(speech_corpus, sample_path, tmp_path, where):
    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    want = rows(speech_corpus)
    make_folder(run / where)
    v = sentsim_cli("store", "verify", run)
    assert v.returncode == 1 and "Traceback" not in v.stderr, v.stderr
    assert f"{where}: " in v.stderr and "not a regular file (a folder)" in v.stderr, v.stderr
    c = one_line(sentsim_cli("store", "compact", run))
    assert "not compacted" in c and ("unit 00002's completion marker is not a regular file" in c or where in c), c
    if where.startswith("_units"):  # the run reads, less the unit, and says so
        r = RunReader(str(run))
        assert 2 not in r.units() and "only 4/5 units are readable" in r.incomplete_note()
        unit2 = pq.read_metadata(run / "sentences" / "part-00002.parquet").num_rows
        assert r.read_table("sentences").num_rows == want["sentences"].num_rows - unit2
    resumed = build(sample_path, run)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr
    assert "unit 00002 will be redone" in resumed.stderr and "not a regular file" in resumed.stderr, resumed.stderr
    assert (run / where).is_file() and sentsim_cli("store", "verify", run).returncode == 0
    got = rows(run)
    assert all(got[t].equals(want[t]) for t in want)


def test_a_folder_at_complete_is_not_a_finished_run(speech_corpus, sample_path, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    make_folder(run / "_COMPLETE")
    assert not RunReader(str(run)).is_complete()
    one_line(sentsim_cli("store", "compact", run))
    resumed = build(sample_path, run)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr
    assert (run / "_COMPLETE").is_file() and sentsim_cli("store", "verify", run).returncode == 0


def test_a_folder_at_the_manifest_is_refused_in_one_line_until_force_new(speech_corpus, sample_path, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    want = rows(speech_corpus)
    make_folder(run / "manifest.json")
    commands = {"verify": ("store", "verify", run), "compact": ("store", "compact", run),
                "resume": ("corpus", "build", sample_path, "--out", run, "--executor", "inline",
                           "--set", "docs_per_unit=4"),
                "index build": ("index", "build", "--corpus", run, "--out", tmp_path / "index")}
    for name, args in commands.items():
        err = one_line(sentsim_cli(*args))
        assert "manifest.json is a folder, not a file" in err and "--force-new" in err, (name, err)
    assert (run / "manifest.json" / "inside.txt").exists()  # nothing was removed but by --force-new
    r = build(sample_path, run, "--force-new")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads((run / "manifest.json").read_text())["complete"]
    assert sentsim_cli("store", "verify", run).returncode == 0
    got = rows(run)
    assert all(got[t].equals(want[t]) for t in want)


def test_force_new_clears_a_manifest_that_is_not_valid_json(speech_corpus, sample_path, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    (run / "manifest.json").write_text("{not json")
    err = one_line(build(sample_path, run))
    assert "not valid JSON" in err and "--force-new" in err
    r = build(sample_path, run, "--force-new")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert sentsim_cli("store", "verify", run).returncode == 0


def test_a_run_that_lost_its_manifest_is_damage_and_other_outputs_are_named(speech_corpus, tmp_path):
    """No manifest.json beside the completion markers: `store verify` reports damage (exit 1), and every
    command that reads the run says what happened and what to do, in one line. An index given to
    `store verify` or `store compact` is named as an index, not as "no manifest"."""
    from harvest_support import build_index_for

    run = tmp_path / "corpus"
    shutil.copytree(speech_corpus, run)
    (run / "manifest.json").unlink()
    lost = "manifest.json is missing, though _units/ holds the run's completion markers"
    r = sentsim_cli("store", "verify", run)
    assert r.returncode == 1 and f"BAD  {lost}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    for args in (("store", "compact", run), ("train", "surrogate", "--data", run, "--out", tmp_path / "s"),
                 ("remix", run, "--out", tmp_path / "m")):
        assert lost in one_line(sentsim_cli(*args)), args
    index = build_index_for(speech_corpus, tmp_path / "index")
    for command in ("verify", "compact"):
        assert f"{index}: holds a retrieval index, not a sharded run" in one_line(sentsim_cli("store", command, index))


def test_force_new_starts_over_a_run_that_lost_its_manifest_beside_its_nested_runs_and_reports(speech_corpus,
                                                                                                sample_path, tmp_path):
    """LOST_MANIFEST's advice holds: --force-new starts the run over although its folder also holds what a
    harvest writes there besides its tables (its rep_cache/, report.json, report.png), which a folder without
    a run's completion markers keeps refusing."""
    run = tmp_path / "corpus"
    shutil.copytree(speech_corpus, run)
    (run / "manifest.json").unlink()
    (run / "report.json").write_text("{}")
    (run / "report.png").write_bytes(b"png")
    (run / "rep_cache").mkdir()
    r = build(sample_path, run, "--force-new")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert sentsim_cli("store", "verify", run).returncode == 0
    # the lost run's reports go with it (no reader takes them for the new run's); its nested runs are checked
    # by their own fingerprints before anything reuses them
    assert not (run / "report.json").exists() and not (run / "report.png").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "report.json").write_text("{}")  # a user's file, no run's markers: still refused
    assert "holds no sentsim run" in one_line(build(sample_path, other, "--force-new"))


def test_force_new_over_another_stages_run_removes_all_of_it_and_the_same_stage_keeps_its_nested_runs(tmp_path):
    """--force-new replacing a run of another stage (a harvest over a cache build's run, a remix over a pool
    harvest) removes that run's tables, the runs it built inside its folder and its reports, so nothing of it
    lies beside the new run for a reader to take as the new run's; a run of the same stage keeps its nested runs
    (a pool harvest's vectors are reused by a harvest that labels otherwise)."""
    import pyarrow as pa

    from storage import ShardStore, verify_store

    def old_run(root, stage):
        store = ShardStore(str(root))
        store.open_run(stage, "a" * 16, {}, [], {"reps": pa.schema([("x", pa.int64())])}, planned_units=1)
        store.write_unit(0, {"reps": pa.table({"x": [1, 2]})}, "a" * 16)
        store.finalize(1, {})
        (root / "report.json").write_text("{}")
        (root / "pool_vectors").mkdir()
        (root / "pool_vectors" / "manifest.json").write_text("{}")
        return store

    def new_run(root, stage):
        store = ShardStore(str(root))
        store.open_run(stage, "b" * 16, {}, [], {"pairs": pa.schema([("y", pa.int64())])}, planned_units=1,
                       force_new=True)
        store.write_unit(0, {"pairs": pa.table({"y": [3]})}, "b" * 16)
        store.finalize(1, {})
        store.release()

    old_run(tmp_path / "other", "rep_cache").release()
    new_run(tmp_path / "other", "harvest")
    left = {p.name for p in (tmp_path / "other").iterdir()}
    assert "pairs" in left and not left & {"reps", "pool_vectors", "report.json"}, left
    assert verify_store(str(tmp_path / "other")) == []
    old_run(tmp_path / "same", "harvest").release()
    new_run(tmp_path / "same", "harvest")
    assert (tmp_path / "same" / "pool_vectors").is_dir()
