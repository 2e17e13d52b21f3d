"""A run's manifest carries a checksum of itself: a hand edit (its config, its tables, its counts) is named by
`store verify` and refused in one line by every reader and by a resume; a manifest from before the checksum reads,
verifies (said to be unchecked) and resumes as it did; and on S3 through the same code."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pyarrow as pa
import pytest
from harvest_support import cli_in_process
from run_support import before_manifest_checksums
from test_store import s3_server  # noqa: F401  (the moto fixture, reused)

from storage import RunReader, ShardStore, StoreError
from storage.records import record_check
from storage.store import FORMAT_VERSION, MANIFEST_CHECK, SEALED_FORMAT, manifest_checks
from storage.verify import verify_run

EDITED = "manifest.json does not match its own checksum (edited by hand, or corrupt)"


@pytest.fixture()
def run_copy(speech_corpus, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(speech_corpus, dst)
    return dst


def _build(sample_path, run, *extra):
    return ("corpus", "build", sample_path, "--out", run, "--executor", "inline", "--set", "docs_per_unit=4", *extra)


def _edit(m: dict, what: str) -> None:
    if what == "config":
        m["config"]["docs_per_unit"] = 8
    elif what == "tables":
        m["tables"].pop("chunks")
    else:
        m["counts"]["sentences"] += 1


def test_the_manifest_and_its_checksum_are_one_write(tmp_path):
    """What JSON does not keep (a tuple, an int key) is checked as it reads back; a reader of a manifest being
    rewritten over and over (as a writer rewrites it under the run's lease) never sees one without its checksum."""
    schema = pa.schema([("x", pa.int64())])
    store = ShardStore(str(tmp_path / "run"))
    store.open_run("t", "fp1", {"splits": (0.9, 0.1), "by_unit": {3: "a", 10: "b"}}, [], {"rows": schema},
                   planned_units=1)
    store.write_unit(0, {"rows": pa.table({"x": [1]}, schema=schema)}, "fp1")
    m = store.finalize(1, {"counts": {"rows": 1}})
    assert m["complete"]
    on_disk = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest_checks(on_disk) is True and on_disk["config"]["splits"] == [0.9, 0.1]
    notes: list = []
    assert verify_run(str(tmp_path / "run"), notes) == ([], None) and notes == []

    stop, seen, failures = threading.Event(), [], []

    def read():
        reader = ShardStore(str(tmp_path / "run"))
        while not stop.is_set():
            try:
                seen.append(reader.read_manifest()["counts"]["rows"])
            except StoreError as exc:
                failures.append(str(exc))

    t = threading.Thread(target=read)
    t.start()
    try:
        for i in range(300):
            store.write_manifest(dict(on_disk, counts={"rows": i}))
    finally:
        stop.set()
        t.join()
    assert failures == [] and len(seen) > 0


@pytest.mark.parametrize("what", ["config", "tables", "counts"])
def test_an_edited_manifest_is_named_by_verify_and_refused_by_readers_and_a_resume(run_copy, sample_path, capsys,
                                                                                  what):
    m = json.loads((run_copy / "manifest.json").read_text())
    _edit(m, what)
    (run_copy / "manifest.json").write_text(json.dumps(m, indent=2))
    before = {p.name: p.read_bytes() for p in [run_copy / "manifest.json", *(run_copy / "_units").iterdir()]}

    r = cli_in_process(capsys, "store", "verify", run_copy)
    bad = [line for line in r.stderr.splitlines() if line.startswith("BAD")]
    assert r.returncode == 1 and "OK" not in r.stdout, r.stdout + r.stderr
    assert bad[0].startswith("BAD  manifest.json: does not match its own checksum (edited by hand, or corrupt)")
    assert sum("manifest.json" in line for line in bad) == 1, r.stderr

    with pytest.raises(StoreError) as refused:
        RunReader(str(run_copy))
    assert str(refused.value).startswith(f"{run_copy}/{EDITED}")
    for args in (_build(sample_path, run_copy), ("store", "compact", run_copy)):
        r = cli_in_process(capsys, *args)
        assert r.returncode == 2 and f"{run_copy}/{EDITED}" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # refused before anything was read into the run or written there
    assert {p.name: p.read_bytes() for p in [run_copy / "manifest.json", *(run_copy / "_units").iterdir()]} == before

    r = cli_in_process(capsys, *_build(sample_path, run_copy, "--force-new"))  # what the line says to do
    assert r.returncode == 0, r.stderr
    r = cli_in_process(capsys, "store", "verify", run_copy)
    assert r.returncode == 0 and r.stdout.strip() == f"{run_copy}: OK", r.stdout + r.stderr


def test_a_manifest_from_before_checksums_verifies_reads_and_resumes_as_before(run_copy, sample_path, capsys):
    """A run of a format from before the checksum (5 or earlier) verifies with a note, reads and resumes as it did,
    and keeps its format and its manifest without a checksum: a sentsim of that format may resume it again, and
    would keep one stale. One such manifest holding a checksum that no longer matches (sealed by a sentsim of the
    checksum's first commits, rewritten since by an older one) is not checked either."""
    rows = RunReader(str(run_copy)).read_table("sentences")
    m = before_manifest_checksums(json.loads((run_copy / "manifest.json").read_text()))
    assert m["format_version"] == SEALED_FORMAT - 1
    (run_copy / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True))
    note = (f"{run_copy}/manifest.json: run format {SEALED_FORMAT - 1}, from before manifests carried a checksum of "
            "their own, so a hand edit of it is not detected: not checked")

    r = cli_in_process(capsys, "store", "verify", run_copy)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    assert r.stdout.splitlines() == [note, f"{run_copy}: OK"]
    assert RunReader(str(run_copy)).read_table("sentences").equals(rows)

    (run_copy / "_units" / "00002.json").unlink()  # stopped before unit 2's marker
    (run_copy / "_COMPLETE").unlink()
    r = cli_in_process(capsys, *_build(sample_path, run_copy))
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr
    assert RunReader(str(run_copy)).read_table("sentences").sort_by("sentence_id").equals(rows.sort_by("sentence_id"))
    # the resume rewrote the manifest in the run's own format: no checksum, as that format's manifests are
    resumed = json.loads((run_copy / "manifest.json").read_text())
    assert manifest_checks(resumed) is None and {k: v for k, v in resumed.items() if k != "finished"} == {
        k: v for k, v in m.items() if k != "finished"}
    r = cli_in_process(capsys, "store", "verify", run_copy)
    assert r.returncode == 0 and r.stdout.splitlines() == [note, f"{run_copy}: OK"], r.stdout + r.stderr

    stale = dict(resumed, check=record_check(dict(resumed, finished="earlier")))
    (run_copy / "manifest.json").write_text(json.dumps(stale))
    assert manifest_checks(stale) is False and RunReader(str(run_copy)).read_table("sentences").num_rows == len(rows)
    r = cli_in_process(capsys, "store", "verify", run_copy)
    assert r.returncode == 0 and r.stdout.splitlines() == [note, f"{run_copy}: OK"], r.stdout + r.stderr
    (run_copy / "_COMPLETE").unlink()
    r = cli_in_process(capsys, *_build(sample_path, run_copy))
    assert r.returncode == 0, r.stderr
    assert MANIFEST_CHECK not in json.loads((run_copy / "manifest.json").read_text())


def test_a_sealed_run_is_refused_by_an_older_sentsim_and_is_edited_without_its_checksum(run_copy, sample_path, capsys,
                                                                                       monkeypatch):
    """A run that carries the checksum is of a format an older sentsim refuses (its own check_format), so none
    resumes it and leaves the checksum stale; a manifest of that format without its checksum was edited (the key
    deleted along with the edit): verify names it, readers and a resume refuse it, --force-new starts it over."""
    import storage.store

    m = json.loads((run_copy / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION >= SEALED_FORMAT and manifest_checks(m) is True
    monkeypatch.setattr(storage.store, "FORMAT_VERSION", SEALED_FORMAT - 1)  # the last format an older one knows
    with pytest.raises(StoreError, match=f"written by a newer sentsim \\(run format {FORMAT_VERSION};"):
        RunReader(str(run_copy))
    store = ShardStore(str(run_copy))
    with pytest.raises(StoreError, match="newer sentsim.*--force-new"):
        store.open_run("corpus", m["fingerprint"], {}, [], {})
    store.release()
    monkeypatch.undo()

    m.pop(MANIFEST_CHECK)
    m["config"]["docs_per_unit"] = 8
    (run_copy / "manifest.json").write_text(json.dumps(m, indent=2))
    words = (f"has no checksum of itself, which every manifest of run format {SEALED_FORMAT} and later carries "
             "(edited by hand, or corrupt)")
    r = cli_in_process(capsys, "store", "verify", run_copy)
    assert r.returncode == 1 and f"BAD  manifest.json: {words}" in r.stderr, r.stderr
    assert "not checked" not in r.stdout, r.stdout
    with pytest.raises(StoreError, match="has no checksum of itself"):
        RunReader(str(run_copy))
    r = cli_in_process(capsys, *_build(sample_path, run_copy))
    assert r.returncode == 2 and f"{run_copy}/manifest.json {words}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli_in_process(capsys, *_build(sample_path, run_copy, "--force-new"))
    assert r.returncode == 0, r.stderr
    assert manifest_checks(json.loads((run_copy / "manifest.json").read_text())) is True


def test_an_edited_manifest_on_s3_is_caught_through_the_same_code(s3_server):  # noqa: F811
    uri = "s3://sentsim/manifest-check/run"
    schema = pa.schema([("x", pa.int64())])
    store = ShardStore(uri)
    store.open_run("t", "fp1", {"k": 1}, [], {"rows": schema}, planned_units=2)
    for u in range(2):
        store.write_unit(u, {"rows": pa.table({"x": [u]}, schema=schema)}, "fp1")
    assert store.finalize(2, {})["complete"]
    assert verify_run(uri) == ([], None)
    key = "sentsim/manifest-check/run/manifest.json"
    with store.fs.open_input_stream(key) as f:
        m = json.loads(f.read())

    def put(manifest):
        with store.fs.open_output_stream(key) as f:
            f.write(json.dumps(manifest).encode())

    put(dict(m, config={"k": 2}))
    problems, _ = verify_run(uri)
    assert len(problems) == 1 and problems[0].startswith("manifest.json: does not match its own checksum")
    with pytest.raises(StoreError, match=f"^{uri}/manifest.json does not match its own checksum"):
        RunReader(uri)
    again = ShardStore(uri)
    with pytest.raises(StoreError, match="does not match its own checksum"):
        again.open_run("t", "fp1", {"k": 1}, [], {"rows": schema}, planned_units=2)
    again.release()  # the lease open_run took before it read the manifest

    put(before_manifest_checksums(dict(m)))  # a manifest an earlier sentsim wrote there
    notes: list = []
    assert verify_run(uri, notes) == ([], None) and len(notes) == 1 and "not checked" in notes[0]
    assert np.array_equal(RunReader(uri).read_table("rows").column("x").to_numpy(), [0, 1])
    resumed = ShardStore(uri)
    assert resumed.open_run("t", "fp1", {"k": 1}, [], {"rows": schema}, planned_units=2)["fingerprint"] == "fp1"
    assert resumed.finalize(2, {})["complete"]
    with store.fs.open_input_stream(key) as f:  # rewritten in its own format, which carries no checksum
        again = json.loads(f.read())
    assert manifest_checks(again) is None and again["format_version"] == SEALED_FORMAT - 1


def _harvest(root, n: int = 6):
    """A finished two-unit harvest written through the store, as test_surrogate's write_harvest writes one."""
    s1 = ["a one", "a three", "b uno", "b two", "b three", "c"]
    s2 = ["a uno", "a tres", "b one", "b dos", "b tres", "d"]
    score = [0.1, 0.4, 0.2, 0.3, 0.5, 0.6]
    table = pa.table({"pair_id": pa.array(np.arange(n), pa.int64()), "s1_id": pa.array(np.arange(n), pa.int64()),
                      "s2_id": pa.array(np.arange(n, 2 * n), pa.int64()), "s1": s1, "s2": s2,
                      "score": pa.array(score, pa.float64()), "rank_sim": pa.array(score, pa.float64()),
                      "split": ["test"] * n})
    store = ShardStore(str(root))
    store.open_run("harvest", "test-harvest", {"rank": {"n_anchors": 64}}, [], {"pairs": table.schema},
                   planned_units=2)
    for k in range(2):
        store.write_unit(k, {"pairs": table.slice(3 * k, 3)}, "test-harvest")
    store.finalize(2, {})
    return root


def test_the_harvests_readers_refuse_an_edited_manifest_in_one_line(tmp_path, capsys):
    """eval sts --scores, and the surrogate and the student reading --data: the file named, exit 2."""
    sts = tmp_path / "sts" / "STS2013-en-test"
    sts.mkdir(parents=True)
    (sts / "STS.input.a.txt").write_text("a one\ta uno\na three\ta tres\nb one\tb uno\nb two\tb dos\n")
    (sts / "STS.gs.a.txt").write_text("1.0\n3.0\n2.0\n4.0\n")
    run = _harvest(tmp_path / "h")
    scores = ("eval", "sts", "--scores", run, "--data", tmp_path / "sts", "--tasks", "STS13")
    r = cli_in_process(capsys, *scores)
    assert r.returncode == 0, r.stderr  # read while its manifest is the one it wrote
    m = json.loads((run / "manifest.json").read_text())
    m["config"]["rank"]["n_anchors"] = 32
    (run / "manifest.json").write_text(json.dumps(m))
    for args in (scores, ("train", "surrogate", "--data", run, "--out", tmp_path / "s"),
                 ("train", "student", "--data", run, "--out", tmp_path / "t")):
        r = cli_in_process(capsys, *args)
        assert r.returncode == 2 and f"{run}/{EDITED}" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists()


def _toy_run(root, stage: str, summary: dict | None = None) -> ShardStore:
    """A finished one-unit run of `stage` at `root`, written through the store."""
    schema = pa.schema([("x", pa.int64())])
    store = ShardStore(str(root))
    store.open_run(stage, f"{stage}-fp", {"k": 1}, [], {"rows": schema}, planned_units=1)
    store.write_unit(0, {"rows": pa.table({"x": [1]}, schema=schema)}, f"{stage}-fp")
    store.finalize(1, summary or {})
    return store


def _edit_by_hand(root) -> None:
    m = json.loads((root / "manifest.json").read_text())
    m["config"] = dict(m.get("config") or {}, edited=True)
    (root / "manifest.json").write_text(json.dumps(m))


def test_force_new_of_another_stage_over_an_edited_manifest_removes_the_old_run_whole(run_copy):
    """--force-new is what the refusal of an edited manifest says to run: replacing a run of another stage, it
    removes the old run's tables (and nested runs and reports) as it does for one whose manifest is intact, so
    nothing of the old run lies beside the new manifest."""
    (run_copy / "report.json").write_text("{}")
    _edit_by_hand(run_copy)
    old_tables = set(json.loads((run_copy / "manifest.json").read_text())["tables"])
    assert old_tables and all((run_copy / t).is_dir() for t in old_tables)
    schema = pa.schema([("y", pa.int64())])
    store = ShardStore(str(run_copy))
    store.open_run("harvest", "new-fp", {}, [], {"pairs": schema}, planned_units=1, force_new=True)
    store.write_unit(0, {"pairs": pa.table({"y": [3]}, schema=schema)}, "new-fp")
    store.finalize(1, {})
    left = {p.name for p in run_copy.iterdir()}
    assert not left & (old_tables | {"report.json"}) and "pairs" in left, left
    assert verify_run(str(run_copy)) == ([], None)


def test_force_new_never_deletes_what_an_edited_manifests_table_names_point_outside_the_run(run_copy):
    """An edited manifest's table names are read to clear another stage's run, and only names of the run's own
    folders are cleared: `../x`, an absolute path, the run's markers and lease are not the old run's tables."""
    outside = run_copy.parent / "sibling"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    m = json.loads((run_copy / "manifest.json").read_text())
    m["tables"] = dict(m["tables"], **{"../sibling": "x", str(outside): "x", "_units": "x", ".": "x"})
    (run_copy / "manifest.json").write_text(json.dumps(m))
    schema = pa.schema([("y", pa.int64())])
    store = ShardStore(str(run_copy))
    store.open_run("harvest", "new-fp", {}, [], {"pairs": schema}, planned_units=1, force_new=True)
    store.write_unit(0, {"pairs": pa.table({"y": [3]}, schema=schema)}, "new-fp")
    store.finalize(1, {})
    assert (outside / "keep.txt").read_text() == "mine"
    assert verify_run(str(run_copy)) == ([], None)


def test_a_nested_runs_edited_manifest_keeps_the_notes_and_refusals_that_read_its_stage(tmp_path, capsys):
    """What reads only a manifest's stage, or whether a run is there, reads an edited one too: a pool harvest's
    inner run is still refused as an --out and still named as part of its harvest, and `store verify` still gives
    the notes on the harvest's other nested runs, while it names each edited manifest as damage."""
    run = tmp_path / "h"
    _toy_run(run, "harvest", {"pool": {"vectors_fingerprint": "v", "ranks_fingerprint": "r"},
                              "unread_nested_runs": ["rep_cache"]})
    for name, stage in (("pool_vectors", "harvest-pool-vectors"), ("rep_cache", "rep_cache")):
        _toy_run(run / name, stage)
    written = (run / "pool_vectors" / "manifest.json").read_bytes()
    _edit_by_hand(run / "pool_vectors")
    kept = (run / "pool_vectors" / "manifest.json").read_bytes()

    r = cli_in_process(capsys, "store", "verify", run)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "BAD  pool_vectors/manifest.json: does not match its own checksum" in r.stderr, r.stderr
    for note in (f"{run}/rep_cache: not read by this run", f"{run}/pool_ranks: not there (deleted?)"):
        assert note in r.stdout, r.stdout
    assert f"{run}/pool_vectors: not there" not in r.stdout, r.stdout

    inner = ShardStore(str(run / "pool_vectors"))
    with pytest.raises(StoreError, match="holds the pool_vectors run of the 'harvest' run"):
        inner.open_run("corpus", "c-fp", {}, [], {"rows": pa.schema([("x", pa.int64())])}, force_new=True)
    inner.release()
    assert (run / "pool_vectors" / "manifest.json").read_bytes() == kept

    (run / "pool_vectors" / "manifest.json").write_bytes(written)
    _edit_by_hand(run)  # the harvest's own manifest: named, and the notes it gives are still given
    r = cli_in_process(capsys, "store", "verify", run)
    assert r.returncode == 1 and "BAD  manifest.json: does not match its own checksum" in r.stderr, r.stderr
    for note in (f"{run}/rep_cache: not read by this run", f"{run}/pool_ranks: not there (deleted?)"):
        assert note in r.stdout, r.stdout
    r = cli_in_process(capsys, "remix", run / "pool_vectors", "--out", tmp_path / "r")
    assert r.returncode == 2 and f"not a harvest run but a part of the harvest {run}" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()
