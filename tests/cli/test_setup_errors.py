"""Setup errors are one line and exit 2, never a traceback, with nothing marked complete and the run
resumable (issue 37): a disk that fills up (ENOSPC) and a read-only output (EROFS) on real file systems
(a small tmpfs, remounted read-only; these tests need root to mount it), a file where the output folder
belongs, and a non-finite `store compact --target-mb`. S3 without credentials: tests/storage/test_s3_chain.py."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from conftest import sentsim_cli

from storage import RunReader, verify_store


def _one_line(r, *words) -> str:
    """Exit 2 and one error line, the last on stderr (after the progress lines of the units done before)."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    errors = [ln for ln in lines if not ln.startswith("[")]  # "[corpus] unit 00000 | ...": progress
    assert len(errors) == 1 and errors[0] == lines[-1] and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[-1].startswith("sentsim: error: ") and all(w in lines[-1] for w in words), lines[-1]
    return lines[-1]


@pytest.fixture()
def small_disk(tmp_path):
    """A tmpfs of 256 KiB at tmp_path/disk, with `resize(kib)` and `read_only(flag)`; unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")

    class Disk:
        path = mnt

        @staticmethod
        def remount(opts: str) -> None:
            subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], check=True)

    try:
        yield Disk
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _corpus_build(sample_path, out, *extra):
    return sentsim_cli("corpus", "build", sample_path, "--out", out, "--executor", "inline",
                       "--set", "docs_per_unit=4", *extra, timeout=300)


def _not_complete(run) -> None:
    m = json.loads((run / "manifest.json").read_text())
    assert m["complete"] is False and not (run / "_COMPLETE").exists()


def test_a_full_disk_is_one_line_and_the_run_resumes_once_there_is_room(small_disk, sample_path, speech_corpus):
    """The sample's corpus (~300 KB) does not fit in 256 KiB: the build stops at the unit that found the disk
    full, naming --out; after the disk grows the same command finishes with exactly the rows of a build that
    never failed."""
    out = small_disk.path / "corpus"
    line = _one_line(_corpus_build(sample_path, out), "no space left on the device", f"--out {out}",
                     "run the same command again")
    assert "resumable run goes on" in line
    _not_complete(out)
    done_before = len(RunReader(str(out)).units())
    assert 0 < done_before < 5
    small_disk.remount("size=4m")
    r = _corpus_build(sample_path, out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming {out}: {done_before} already complete" in r.stderr
    assert verify_store(str(out)) == []
    ours, ref = RunReader(str(out)), RunReader(str(speech_corpus))
    assert ours.is_complete() and ours.fingerprint == ref.fingerprint
    assert ours.read_table("sentences").equals(ref.read_table("sentences"))


def test_an_index_rebuild_on_a_full_disk_keeps_the_index_there(small_disk, speech_corpus):
    """index build on a full disk: one line; the index it was replacing still checks and searches alike."""
    from sentsim.retrieval import IndexConfig, build_index, open_retriever
    from sentsim.retrieval.base import check_index

    small_disk.remount("size=8m")
    index = small_disk.path / "index"
    build_index(speech_corpus, index, IndexConfig(n_shards=2))
    queries = ["the people of the United States", "the war in Europe"]
    hits = open_retriever(index).search(queries, 10)[0]
    used = sum(p.stat().st_size for p in small_disk.path.rglob("*") if p.is_file())
    small_disk.remount(f"size={used // 1024 + 600}k")  # room for less than a second copy of the index
    r = sentsim_cli("index", "build", "--corpus", speech_corpus, "--out", index, "--shards", "2",
                    "--set", "ngrams=unigram+bigram", "--force-new", timeout=300)
    _one_line(r, "no space left on the device")
    check_index(index, corpus=speech_corpus)
    np.testing.assert_array_equal(open_retriever(index).search(queries, 10)[0], hits)
    small_disk.remount("size=16m")
    r = sentsim_cli("index", "build", "--corpus", speech_corpus, "--out", index, "--shards", "2", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list(index.glob("build-*"))) == 1  # what the failed build left is swept


def test_a_read_only_out_is_one_line_naming_it_and_the_run_resumes_read_write(small_disk, sample_path,
                                                                               speech_corpus):
    small_disk.remount("size=4m")
    out = small_disk.path / "corpus"
    r = _corpus_build(sample_path, out, "--max-units", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    small_disk.remount("ro")
    try:
        _one_line(_corpus_build(sample_path, out), "read-only file system", str(out))
        _one_line(sentsim_cli("index", "build", "--corpus", speech_corpus, "--out", small_disk.path / "index",
                              timeout=300), "read-only file system", "index")
    finally:
        small_disk.remount("rw")
    _not_complete(out)
    r = _corpus_build(sample_path, out)
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-2000:]
    assert verify_store(str(out)) == [] and RunReader(str(out)).is_complete()


def test_a_file_where_the_output_folder_belongs_is_one_line(sample_path, speech_corpus, tmp_path):
    f = tmp_path / "out.txt"
    f.write_text("keep me")
    for args in (("corpus", "build", sample_path, "--out", f, "--executor", "inline"),
                 ("index", "build", "--corpus", speech_corpus, "--out", f),
                 ("harvest", "--corpus", speech_corpus, "--out", f, "--context-models", tmp_path / "m",
                  "--set", "contexts.mode=random"),
                 ("train", "discriminator", "--corpus", speech_corpus, "--out", f / "disc"),
                 ("train", "context", "--corpus", speech_corpus, "--out", f)):
        _one_line(sentsim_cli(*args, timeout=300), "--out", "not a folder")
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("target", ["inf", "nan", "-inf", "0", "-1"])
def test_store_compact_refuses_a_target_size_that_is_not_positive_and_finite(tmp_path, target):
    import pyarrow as pa

    from storage import ShardStore

    store = ShardStore(str(tmp_path / "run"))
    store.open_run("s", "fp", {}, [], {"t": pa.schema([("x", pa.int64())])}, planned_units=2)
    for u in range(2):
        store.write_unit(u, {"t": pa.table({"x": [u, u + 1]})}, "fp")
    store.finalize(2, {})
    before = sorted(p.name for p in (tmp_path / "run" / "t").iterdir())
    _one_line(sentsim_cli("store", "compact", tmp_path / "run", f"--target-mb={target}"),
              "--target-mb must be positive and finite")
    assert sorted(p.name for p in (tmp_path / "run" / "t").iterdir()) == before
    assert not (tmp_path / "run" / "_compact").exists()


def test_setup_errors_are_found_inside_wrapping_errors():
    """Ray hands a worker's error over as its `cause`, or (Ray Train) as text only; either way the line names
    the path the error names, else the command's output."""
    import errno
    from argparse import Namespace

    from sentsim.cli import _setup_error

    args = Namespace(out="s3://b/run")

    class TaskError(Exception):  # the shape of ray.exceptions.RayTaskError: the original as `cause`
        def __init__(self, cause):
            super().__init__("task failed")
            self.cause = cause

    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/pairs/.tmp-1-part-00003.parquet")
    assert "(/data/run/pairs/.tmp-1-part-00003.parquet)" in _setup_error(TaskError(full), args)
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as exc:
            raise RuntimeError("could not write") from exc
    except RuntimeError as exc:
        assert _setup_error(exc, args).startswith("--out s3://b/run: read-only file system")
    text = RuntimeError("Training failed.\n  OSError: [Errno 28] No space left on device: '/ckpt/model.safetensors'\n")
    assert _setup_error(text, args).startswith("no space left on the device (/ckpt/model.safetensors)")
    assert _setup_error(ValueError("bad"), args) is None
    assert _setup_error(OSError(errno.ENOENT, "No such file"), args) is None  # not a setup error: left alone


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS", "http listener"])
def test_an_address_where_no_ray_cluster_listens_is_one_line_in_seconds(how, sample_path, tmp_path):
    """No cluster at the address (a closed local port, or a port where an HTTP server listens): ray.init
    would retry for minutes with only Ray's "Failed to connect to GCS ... within 5 seconds" lines; the
    command says so in one line within seconds and exits 2, with no run written."""
    import threading
    import time
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    from conftest import LOOPBACK_ENV, error_line, free_port

    server = None
    if how == "http listener":  # on loopback, and Ray made to dial loopback (else it dials this machine's IP)
        server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address, env = f"127.0.0.1:{server.server_address[1]}", dict(LOOPBACK_ENV)
    else:
        address, env = f"127.0.0.1:{free_port()}", {}  # nothing listens there once free_port has closed it
    args = ["corpus", "build", sample_path, "--out", tmp_path / "corpus"]
    if how == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = address
    else:
        args += ["--address", address]
    start = time.monotonic()
    try:
        r = sentsim_cli(*args, env=env, timeout=120)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    took = time.monotonic() - start
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    shown = address + (" (from RAY_ADDRESS)" if how == "RAY_ADDRESS" else "")
    assert line.startswith(f"sentsim: error: cannot reach the Ray cluster at {shown} ("), line
    assert ("not a Ray GCS" if server else "connection refused") in line, line
    assert "`ray start`" in line and "RAY_ADDRESS" in line and "GCS port" in line, line
    assert "interrupted" not in r.stderr
    assert took < 60, took  # in practice a few seconds, of which most is importing Ray
    assert not (tmp_path / "corpus").exists()


def test_a_trainer_given_an_address_where_no_cluster_listens_writes_nothing(speech_corpus, tmp_path):
    """The trainers reach the cluster before they write their --out, as a sharded run does before its manifest:
    the discriminator's state (OUT/_train: run record, vocabulary) and an encoder trainer's run record are not
    left behind by a command that never trained, and the same command at the right address starts clean."""
    import json

    from conftest import error_line, free_port
    from harvest_support import tiny_bert

    address = f"127.0.0.1:{free_port()}"  # nothing listens there once free_port has closed it
    triples = [{"s_i": f"sentence {i} about {w}", "relation": "entailment", "s_j": f"a line on {w} {i}"}
               for i, w in enumerate("river city vote law war peace".split())]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in triples))
    backbone = tiny_bert(tmp_path / "bert", layers=1, width=32, heads=2, positions=64)
    commands = {"disc": ("train", "discriminator", "--corpus", speech_corpus),
                "stu": ("train", "student", "--objective", "rse", "--triples", tmp_path / "t.jsonl",
                        "--backbone", backbone, "--set", "batch_size=4", "--set", "max_seq_length=16")}
    for out, args in commands.items():
        r = sentsim_cli(*args, "--out", tmp_path / out, "--max-steps", "1", "--address", address, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert error_line(r.stderr).startswith(f"sentsim: error: cannot reach the Ray cluster at {address} ("), \
            r.stderr[-2000:]
        assert not (tmp_path / out).exists(), sorted(p.name for p in (tmp_path / out).rglob("*"))


def test_an_index_folder_that_does_not_exist_is_one_line_naming_what_builds_it(speech_corpus, tmp_path):
    """A harvest's --index that is not there says so and names the command that builds one; the reference
    teacher's (configs/teacher.yaml) names `make reference`. A folder without an index stays "not an index"."""
    base = ("harvest", "--corpus", speech_corpus, "--out", tmp_path / "h", "--context-models", tmp_path / "m",
            "--set", "contexts.mode=random", "--index")
    line = _one_line(sentsim_cli(*base, tmp_path / "nowhere" / "index", timeout=300), "no such index")
    assert "`sentsim index build`" in line
    line = _one_line(sentsim_cli(*base, tmp_path / "reference" / "index", timeout=300), "no such index")
    assert "`make reference`" in line
    (tmp_path / "empty").mkdir()
    _one_line(sentsim_cli(*base, tmp_path / "empty", timeout=300), "not an index directory")
    assert not (tmp_path / "h").exists()
