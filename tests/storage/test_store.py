"""The shard store: atomic units, verify, resume redo, every reader, and S3 through the same path."""

import json
import os
import shutil
import subprocess
import sys
import time

import pandas as pd
import pyarrow.dataset as ds
import pytest
from conftest import free_port, load_bench, sentsim_cli

from sentsim.corpus_job import build_corpus
from storage import ShardStore, verify_store


@pytest.fixture()
def run_copy(speech_corpus, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(speech_corpus, dst)
    return dst


def test_verify_ok_then_names_truncated_and_edited_shards(run_copy):
    r = sentsim_cli("store", "verify", run_copy)
    assert r.returncode == 0 and "OK" in r.stdout
    truncated = run_copy / "sentences" / "part-00001.parquet"
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    edited = run_copy / "chunks" / "part-00002.parquet"
    blob = bytearray(edited.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # same size, one flipped byte
    edited.write_bytes(bytes(blob))
    r = sentsim_cli("store", "verify", run_copy)
    assert r.returncode == 1
    bad = [line for line in r.stderr.splitlines() if line.startswith("BAD")]
    assert len(bad) == 2
    assert any("sentences/part-00001.parquet" in line and "truncated" in line for line in bad)
    assert any("chunks/part-00002.parquet" in line and "checksum" in line for line in bad)


def test_verify_flags_orphans_missing_and_foreign_dirs(run_copy, tmp_path):
    shutil.copy(run_copy / "sentences" / "part-00000.parquet", run_copy / "sentences" / "part-00099.parquet")
    os.remove(run_copy / "_units" / "00003.json")
    problems = verify_store(str(run_copy))
    assert any("part-00099.parquet" in p and "no completion marker" in p for p in problems)
    assert any("sentences/part-00003.parquet" in p for p in problems)
    assert any("00003" in p and "not complete" in p for p in problems)
    # a marker copied or renamed by hand: no reader reads it, and verify says so rather than passing it over
    shutil.copy(run_copy / "_units" / "00002.json", run_copy / "_units" / "00002 (copy).json")
    (run_copy / "_units" / ".00004.json.tmp").write_text("{}")  # a writer's temporary: not the user's doing
    r = sentsim_cli("store", "verify", run_copy)
    assert r.returncode == 1
    bad = [line for line in r.stderr.splitlines() if "_units/" in line and "not a completion marker" in line]
    assert len(bad) == 1 and "_units/00002 (copy).json" in bad[0], r.stderr
    r = sentsim_cli("store", "verify", tmp_path / "nothing")
    assert r.returncode == 2 and "nothing: no such directory" in r.stderr


def test_verify_says_a_run_stopped_part_way_is_ok_and_incomplete(sample_path, tmp_path):
    """A run --max-units stopped is healthy, just unfinished: OK, how far it got, exit 0. Damage in it is
    still named (exit 1), and a finished run that lost a unit is damaged, not unfinished."""
    run = tmp_path / "run"
    build_corpus([str(sample_path)], str(run), overrides=["docs_per_unit=4"], executor="inline", quiet=True,
                 max_units=2)
    r = sentsim_cli("store", "verify", run)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    assert r.stdout.strip() == f"{run}: OK (incomplete: 2 of 5 units done; the same command resumes it)"
    shard = run / "sentences" / "part-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    r = sentsim_cli("store", "verify", run)
    assert r.returncode == 1 and "OK" not in r.stdout
    bad = [ln for ln in r.stderr.splitlines() if ln.startswith("BAD")]
    assert len(bad) == 1 and bad[0].startswith("BAD  sentences/part-00001.parquet: size 100 bytes"), r.stderr
    assert r.stderr.strip().endswith("1 problem(s); incomplete: 2 of 5 units done; the same command resumes it")
    build_corpus([str(sample_path)], str(run), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    assert sentsim_cli("store", "verify", run).stdout.strip() == f"{run}: OK"
    os.remove(run / "_units" / "00004.json")
    os.remove(run / "sentences" / "part-00004.parquet")
    os.remove(run / "chunks" / "part-00004.parquet")
    r = sentsim_cli("store", "verify", run)
    assert r.returncode == 1 and "BAD  1 of 5 units not complete: 00004" in r.stderr, r.stderr


def test_resume_redoes_a_corrupt_unit(run_copy, sample_path, speech_corpus):
    before = ds.dataset(str(speech_corpus / "sentences")).to_table().sort_by("sentence_id")
    shard = run_copy / "sentences" / "part-00002.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    (run_copy / "sentences" / ".tmp-123-part-00004.parquet").write_bytes(b"half written")
    m = build_corpus([str(sample_path)], str(run_copy), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    assert m["complete"]
    assert verify_store(str(run_copy)) == []
    assert not (run_copy / "sentences" / ".tmp-123-part-00004.parquet").exists()
    after = ds.dataset(str(run_copy / "sentences")).to_table().sort_by("sentence_id")
    assert after.equals(before)


def test_unit_write_is_atomic_and_marker_last(tmp_path):
    import pyarrow as pa

    store = ShardStore(str(tmp_path / "s"))
    schema = pa.schema([("x", pa.int64())])
    store.open_run("t", "fp1", {}, [], {"rows": schema}, planned_units=2)
    store.write_unit(0, {"rows": pa.table({"x": [1, 2, 3]}, schema=schema)}, "fp1")
    assert set(store.completed_units("fp1")) == {0}
    assert [p.name for p in (tmp_path / "s" / "rows").iterdir()] == ["part-00000.parquet"]
    assert not store.finalize(2, {})["complete"]
    # readers that train on a run part-way are told how much of it there is
    assert store.incomplete_note() == f"{tmp_path / 's'} is not complete (1/2 units written)"
    store.write_unit(1, {"rows": pa.table({"x": [4]}, schema=schema)}, "fp1")
    assert store.finalize(2, {})["complete"] and store.is_complete()
    assert store.incomplete_note() is None
    # a marker from another fingerprint does not count as done
    assert store.completed_units("other") == {}


def test_all_readers_see_one_dataset(speech_corpus):
    import datasets
    import ray

    expected = json.loads((speech_corpus / "manifest.json").read_text())["counts"]["sentences"]
    assert ds.dataset(str(speech_corpus / "sentences")).count_rows() == expected
    assert len(pd.read_parquet(speech_corpus / "sentences")) == expected
    hf = datasets.load_dataset(
        "parquet", data_files=str(speech_corpus / "sentences" / "*.parquet"), split="train",
        cache_dir=str(speech_corpus.parent / "hf_cache"),
    )
    assert hf.num_rows == expected and "text" in hf.column_names
    ray.init(address="local", num_cpus=1, include_dashboard=False, ignore_reinit_error=True)
    try:
        rd = ray.data.read_parquet(str(speech_corpus / "sentences"))
        assert rd.count() == expected
        assert set(rd.schema().names) >= {"sentence_id", "text", "n_tokens"}
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def s3_server():
    """A real S3-compatible endpoint on localhost (moto in server mode)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except Exception:
            time.sleep(0.1)
    env = {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="sentsim")
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.terminate()
    proc.wait(10)


def test_s3_write_resume_and_verify(s3_server, sample_path, speech_corpus):
    uri = "s3://sentsim/runs/speech"
    m = build_corpus([str(sample_path)], uri, overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    assert m["complete"] and m["completed_units"] == 5
    assert verify_store(uri) == []
    store = ShardStore(uri)
    table = ds.dataset("sentsim/runs/speech/sentences", filesystem=store.fs).to_table().sort_by("sentence_id")
    assert table.equals(ds.dataset(str(speech_corpus / "sentences")).to_table().sort_by("sentence_id"))
    # lose one unit's marker: resume redoes exactly that unit, through the same S3 code path
    store.fs.delete_file("sentsim/runs/speech/_units/00002.json")
    assert verify_store(uri)
    m2 = build_corpus([str(sample_path)], uri, overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    assert m2["complete"] and verify_store(uri) == []
    # and the CLI verifies it too, naming a damaged object
    with store.fs.open_output_stream("sentsim/runs/speech/chunks/part-00001.parquet") as f:
        f.write(b"garbage")
    r = sentsim_cli("store", "verify", uri, env=s3_server)
    assert r.returncode == 1 and "chunks/part-00001.parquet" in r.stderr


def test_a_refused_force_new_on_s3_keeps_every_object_of_the_old_run(s3_server):
    """On S3 as on local disk, --force-new deletes the old run only once the new one goes ahead: refused in its
    stages, the new run leaves every object of the old one (bytes and mtime); one that goes ahead replaces it."""
    from run_support import every_file, refused_toy_job, toy_job

    from sentsim.errors import UsageError
    from sentsim.executor import execute

    uri = "s3://sentsim/runs/force-new"
    units = [{"unit": u, "x": u} for u in range(3)]
    assert execute(toy_job(uri, units), executor="inline", quiet=True)["complete"]
    before = every_file(uri)
    assert "manifest.json" in before and "_units/00002.json" in before and "t/part-00002.parquet" in before
    with pytest.raises(UsageError, match="refused in stages"):
        execute(refused_toy_job(uri, units[:2], True), executor="inline", quiet=True, force_new=True)
    assert every_file(uri) == before
    m = execute(toy_job(uri, units[:2]), executor="inline", quiet=True, force_new=True)
    assert m["complete"] and (m["planned_units"], m["this_run"]["units"]) == (2, 2)
    after = every_file(uri)
    assert "_units/00002.json" not in after and "t/part-00002.parquet" not in after


def test_refused_resume_names_changed_keys_and_inputs(tmp_path):
    import pyarrow as pa

    from storage import StoreError

    schemas = {"t": pa.schema([("x", pa.int64())])}
    store = ShardStore(str(tmp_path / "run"))
    store.open_run("s", "fp1", {"chunk": {"size": 8}, "seed": 0, "splits": (0.9, 0.1)},
                   [{"name": "a.txt", "sha256": "aa"}], schemas)
    with pytest.raises(StoreError) as err:
        store.open_run("s", "fp2", {"chunk": {"size": 9}, "seed": 0, "splits": (0.9, 0.1)},
                       [{"name": "a.txt", "sha256": "bb"}], schemas)
    msg = str(err.value)
    assert "chunk.size: 8 -> 9" in msg and "inputs.0.sha256" in msg and "seed" not in msg and "\n" not in msg
    assert "splits" not in msg  # a tuple is the list it was stored as, not a change


def test_a_run_records_its_format_and_every_reader_refuses_a_newer_one(run_copy, sample_path):
    """The manifest carries the run format; a run from before format versions reads as format 1 and
    still resumes; a run of a format newer than this sentsim knows is refused by every reader and by a
    resume, in one line (exit 2 through the commands), rather than misread or extended with shards of
    another layout."""
    from storage import RunReader, StoreError
    from storage.store import FORMAT_VERSION

    manifest = json.loads((run_copy / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION == RunReader(str(run_copy)).format_version
    manifest.pop("format_version")  # as a run written before the manifest carried one
    manifest.pop("check")  # nor its own checksum
    (run_copy / "manifest.json").write_text(json.dumps(manifest))
    assert RunReader(str(run_copy)).format_version == 1 and verify_store(str(run_copy)) == []
    (run_copy / "_units" / "00002.json").unlink()  # stopped before unit 2's marker: resumed by this sentsim
    r = sentsim_cli("corpus", "build", sample_path, "--out", run_copy, "--executor", "inline",
                    "--set", "docs_per_unit=4")
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr
    resumed = json.loads((run_copy / "manifest.json").read_text())
    assert resumed["complete"] and "format_version" not in resumed  # a run keeps the format it began in

    (run_copy / "manifest.json").write_text(json.dumps(dict(resumed, format_version=FORMAT_VERSION + 1)))
    newer = f"written by a newer sentsim (run format {FORMAT_VERSION + 1}"
    with pytest.raises(StoreError, match=r"newer sentsim.*read it with that sentsim"):
        RunReader(str(run_copy))
    store = ShardStore(str(run_copy))
    with pytest.raises(StoreError, match=r"newer sentsim.*--force-new"):
        store.open_run("corpus", resumed["fingerprint"], {}, [], {})
    store.release()  # the lease open_run took before it read the manifest
    build = ("corpus", "build", sample_path, "--out", run_copy, "--executor", "inline", "--set", "docs_per_unit=4")
    for args in (("store", "verify", run_copy), ("store", "compact", run_copy), build):
        r = sentsim_cli(*args)
        assert r.returncode == 2 and newer in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = sentsim_cli(*build, "--force-new")  # starts it over, in this sentsim's format
    assert r.returncode == 0, r.stderr
    assert json.loads((run_copy / "manifest.json").read_text())["format_version"] == FORMAT_VERSION


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]"])
def test_broken_manifest_says_what_to_do(tmp_path, content):
    from storage import StoreError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_bytes(content)
    with pytest.raises(StoreError, match="empty or not valid JSON.*--force-new"):
        ShardStore(str(tmp_path / "run")).read_manifest()


def test_clear_removes_commit_points_before_data(tmp_path, monkeypatch):
    """A crash inside clear() never leaves markers (or _COMPLETE) whose data is gone; the manifest stays until the
    new one replaces it, so the folder is still the run --force-new clears."""
    import pyarrow as pa

    store = ShardStore(str(tmp_path / "run"))
    schemas = {"t": pa.schema([("x", pa.int64())])}
    store.open_run("s", "fp", {}, [], schemas, planned_units=1)
    store.write_unit(0, {"t": pa.table({"x": [1]})}, "fp")
    store.finalize(1, {})
    assert store.is_complete()
    class CrashOnData:  # the real filesystem, except that deleting the table's data crashes
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def delete_dir(self, path):
            if path.endswith("/t"):
                raise OSError("crash while deleting the data")
            self.fs.delete_dir(path)

    monkeypatch.setattr(store, "fs", CrashOnData(store.fs))
    with pytest.raises(OSError):
        store.clear(["t"])
    assert not store.is_complete() and store.markers() == {} and store.read_manifest()["fingerprint"] == "fp"
    assert (tmp_path / "run" / "t" / "part-00000.parquet").exists()  # only unreferenced data is left


# ---------------------------------------------------------------- commit order, durability, crashes


@pytest.mark.slow
def test_a_kill_between_a_shards_write_and_its_marker_never_shows_a_partial_unit(tmp_path):
    """`sentsim corpus build` SIGKILLed just before each durable step of unit 2 (the rename of each of its
    two shards into place, the rename of its marker) and just after them. At every point a reader sees
    unit 2 whole or not at all: every unit with a marker has all its files, RunReader reads exactly the
    markers' rows, and the resume ends with the rows of an uninterrupted build. (A marker committed
    before the shards are renamed into place fails here: the reader would list a unit whose files are
    missing.)"""
    rows = load_bench("crash_points").unit_write_crash_points(tmp_path)
    assert [r["killed before"] for r in rows] == [
        "rename into sentences/part-00002.parquet", "rename into chunks/part-00002.parquet",
        "rename into _units/00002.json", "rename into sentences/part-00003.parquet"]
    for r, visible in zip(rows, (False, False, False, True)):
        assert r["marked units whose files fail"] == {}, r
        assert (2 in r["units with a marker"]) == visible, r
        assert r["sentences RunReader"] == r["sentences markers"] and r["chunks RunReader"] == r["chunks markers"], r
        assert not any("missing" in p or "checksum" in p or "size" in p for p in r["verify"]), r
        # temporaries live in _tmp/, never in a table's folder; only a renamed, unmarked shard can sit there
        assert all(name.startswith("part-") for name in r["unit files on disk"]), r
        assert r["resume rc"] == 0 and r["resume verify"] == "OK", r
        assert r["sentences after resume exact"] and r["chunks after resume exact"], r


def test_resume_redoes_a_shard_edited_without_changing_its_size(run_copy, sample_path, speech_corpus):
    """Only the sha256 tells such an edit (the size check passes): a resume that skipped it would keep the
    edited rows. Through the command, as a user resumes."""
    shard = run_copy / "sentences" / "part-00001.parquet"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    shard.write_bytes(bytes(blob))
    store = ShardStore(str(run_copy))
    assert store.check_unit(store.read_marker(1)) == "sentences/part-00001.parquet: checksum mismatch (edited or " \
                                                     "corrupt)"  # the library's default checks the sha256
    r = sentsim_cli("corpus", "build", sample_path, "--out", run_copy, "--executor", "inline",
                    "--set", "docs_per_unit=4")
    assert r.returncode == 0, r.stderr
    assert "unit 00001 will be redone: sentences/part-00001.parquet: checksum mismatch" in r.stderr, r.stderr
    assert "[corpus] unit 00001 | 1 units" in r.stderr
    assert verify_store(str(run_copy)) == []
    key = "sentence_id"
    assert ds.dataset(str(run_copy / "sentences")).to_table().sort_by(key).equals(
        ds.dataset(str(speech_corpus / "sentences")).to_table().sort_by(key))


@pytest.mark.parametrize("damage", ["empty", "edited", "not a marker"])
def test_an_empty_or_edited_marker_is_not_a_done_unit(run_copy, damage):
    """A power loss could once empty a marker (nothing was fsynced); a stray edit can keep it valid JSON.
    Either way the unit is not done: readers leave it out, resume redoes it, verify names it."""
    from storage import RunReader

    marker = run_copy / "_units" / "00003.json"
    if damage == "empty":
        marker.write_bytes(b"")
    elif damage == "edited":  # one digit of the sentences' sha256: same size, still valid JSON
        text = marker.read_text()
        i = text.index('"sha256": "') + len('"sha256": "')
        marker.write_text(text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1:])
    else:
        marker.write_text(json.dumps([1, 2, 3]))
    store = ShardStore(str(run_copy))
    fp = store.read_manifest()["fingerprint"]
    assert 3 not in store.completed_units(fp) and "its completion marker" in store.redo_reasons[3]
    assert 3 not in RunReader(str(run_copy)).units()
    assert any(p.startswith("_units/00003.json: completion marker") for p in verify_store(str(run_copy)))


def test_each_commit_is_durable_shards_before_the_marker(tmp_path, monkeypatch):
    """Every rename into place is preceded by an fsync of the file and followed by an fsync of its folder,
    and a unit's marker is renamed only after each of its shards is durably in place. Temporaries are
    written in DIR/_tmp, where no table reader looks."""
    import pyarrow as pa

    import storage.fs as sfs

    events = []
    real_fsync, real_replace = sfs.fsync_path, os.replace
    monkeypatch.setattr(sfs, "fsync_path", lambda p: (events.append(("fsync", os.path.relpath(p, tmp_path))),
                                                      real_fsync(p)))
    monkeypatch.setattr(sfs.os, "replace", lambda a, b: (events.append(("rename", os.path.relpath(a, tmp_path),
                                                                        os.path.relpath(b, tmp_path))),
                                                         real_replace(a, b)))
    store = ShardStore(str(tmp_path / "s"))
    schema = pa.schema([("x", pa.int64())])
    store.open_run("t", "fp", {}, [], {"a": schema, "b": schema}, planned_units=1)
    events.clear()
    store.write_unit(0, {"a": pa.table({"x": [1]}, schema=schema), "b": pa.table({"x": [2]}, schema=schema)}, "fp")
    renames = [e for e in events if e[0] == "rename"]
    assert [e[2] for e in renames] == ["s/a/part-00000.parquet", "s/b/part-00000.parquet", "s/_units/00000.json"]
    for _, src, dst in renames:
        assert src.startswith("s/_tmp/.tmp-")
        i = events.index(("rename", src, dst))
        assert events[i - 1] == ("fsync", src)  # the bytes first
        assert ("fsync", os.path.dirname(dst)) in events[i + 1:i + 3]  # then the rename itself
    # the marker's rename comes after the fsync of both shards' folders
    marker_at = events.index(renames[-1])
    assert events.index(("fsync", "s/a")) < marker_at and events.index(("fsync", "s/b")) < marker_at
    # the same helper commits the manifest, _COMPLETE, side tables and the lease's heartbeat
    events.clear()
    store.write_side_table("anchors", pa.table({"x": [1]}), "fp")
    store.finalize(1, {})
    done = [e[2] for e in events if e[0] == "rename"]
    assert done == ["s/_side/anchors.parquet", "s/_side/anchors.json", "s/manifest.json", "s/_COMPLETE"]


def test_has_side_table_checks_without_reading(tmp_path, monkeypatch):
    """has_side_table answers as read_side_table would (None: False; damaged: the same StoreError) and never
    parses the table: a pool harvest's plan of a million pairs is checked for on every resume."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage import StoreError

    store = ShardStore(str(tmp_path / "s"))
    assert not store.has_side_table("plan", fingerprint="fp")
    store.write_side_table("plan", pa.table({"x": list(range(100))}), "fp")
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("parsed"))
    assert store.has_side_table("plan", fingerprint="fp") and store.has_side_table("plan")
    assert not store.has_side_table("plan", fingerprint="other") and not store.has_side_table("none")
    path = tmp_path / "s" / "_side" / "plan.parquet"
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(StoreError, match="checksum mismatch"):
        store.has_side_table("plan", fingerprint="fp")
    with pytest.raises(StoreError, match="checksum mismatch"):
        store.read_side_table("plan", fingerprint="fp")


def test_every_sharded_job_checks_the_sha256_on_resume(tmp_path):
    """The executor's default: a job that does not choose (the contexts and rep-cache jobs) re-checks
    each done unit's sha256 when it resumes, so a same-size edit is redone there too."""
    from run_support import toy_job

    from sentsim.executor import execute
    from storage import RunReader

    units = [{"unit": u, "x": u * 10} for u in range(4)]
    execute(toy_job(tmp_path / "r", units), executor="inline", quiet=True)
    before = RunReader(str(tmp_path / "r")).read_table("t")
    shard = tmp_path / "r" / "t" / "part-00002.parquet"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    shard.write_bytes(bytes(blob))
    m = execute(toy_job(tmp_path / "r", units), executor="inline", quiet=True)
    assert m["complete"] and m["this_run"]["units"] == 1
    assert RunReader(str(tmp_path / "r")).read_table("t").equals(before) and verify_store(str(tmp_path / "r")) == []


def test_a_changed_input_is_named_by_what_it_holds():
    """A refused resume names each changed input key with what it holds: a remix's `fingerprint` is its source
    run's, a job's the corpus's."""
    from storage.store import what_changed

    remix = what_changed({"config": {}, "inputs": [{"harvest": "/runs/h", "fingerprint": "a"}]}, {},
                         [{"harvest": "/runs/h", "fingerprint": "b"}])
    assert "inputs.0.fingerprint (the content of the source run /runs/h)" in remix, remix
    job = what_changed({"config": {}, "inputs": [{"corpus": "/c", "fingerprint": "a"}]}, {},
                       [{"corpus": "/c", "fingerprint": "b"}])
    assert "inputs.0.fingerprint (the corpus's content)" in job, job
    # a model the settings read no longer (rank targets turned off) is not said to have changed its content
    models = {"corpus": "/c", "fingerprint": "a", "models": {"discriminator": "d1", "base_encoder": "e1"}}
    off = what_changed({"config": {"rank": True}, "inputs": [models]}, {"rank": False},
                       [{**models, "models": {"discriminator": "d1"}}])
    assert off == "rank: True -> False; input(s) changed: inputs.0.models.base_encoder (base encoder: no longer read)"
    on = what_changed({"config": {}, "inputs": [{**models, "models": {"discriminator": "d1"}}]}, {}, [models])
    assert "inputs.0.models.base_encoder (base encoder: now read)" in on, on
    changed = what_changed({"config": {}, "inputs": [models]}, {}, [{**models, "models": {"discriminator": "d2",
                                                                                           "base_encoder": "e1"}}])
    assert "inputs.0.models.discriminator (the content of discriminator)" in changed, changed


def test_a_finished_runs_own_cache_left_unfinished_is_a_note_and_its_other_nested_runs_are_damage(tmp_path, capsys):
    """A finished harvest's own representation cache (rep_cache/) is read only by its screening: one left
    unfinished (its _COMPLETE deleted, a unit lost) is no damage to the run, and `store verify` says so in a
    note (exit 0). A nested run the finished run reads later (pool_vectors/, which remix reads) is damage."""
    import pyarrow as pa
    from harvest_support import cli_in_process

    def run(root, stage, planned, done):
        store = ShardStore(str(root))
        store.open_run(stage, "a" * 16, {}, [], {"rows": pa.schema([("x", pa.int64())])}, planned_units=planned)
        for unit in range(done):
            store.write_unit(unit, {"rows": pa.table({"x": [unit]})}, "a" * 16)
        if done == planned:
            store.finalize(planned, {})
        store.release()

    outer = tmp_path / "harvest"
    run(outer, "harvest", 1, 1)
    run(outer / "rep_cache", "rep_cache", 2, 1)
    r = cli_in_process(capsys, "store", "verify", outer)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    assert r.stdout.splitlines() == [
        f"{outer}/rep_cache: incomplete: 1 of 2 units done; a cache the finished run does not read again (its "
        "screening did; a run that screens again resumes it first)", f"{outer}: OK"], r.stdout
    (outer / "rep_cache" / "rows" / "part-00000.parquet").write_bytes(b"PAR1")  # damage in it is still named
    r = cli_in_process(capsys, "store", "verify", outer)
    assert r.returncode == 1 and "BAD  rep_cache/rows/part-00000.parquet" in r.stderr, r.stderr
    shutil.rmtree(outer / "rep_cache")
    run(outer / "pool_vectors", "pool_vectors", 2, 1)
    r = cli_in_process(capsys, "store", "verify", outer)
    assert r.returncode == 1 and ("BAD  pool_vectors/: run incomplete: 1 of 2 units done; the same command resumes "
                                  "it; the finished run it belongs to needs it whole") in r.stderr, r.stderr
