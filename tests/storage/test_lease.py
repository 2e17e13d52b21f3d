"""One writer per run: the lease file on local disk and on the moto S3 server (a second writer of a
whole run on S3 is in test_s3_chain.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest
from test_store import s3_server  # noqa: F401  (the moto fixture, reused)

from storage.lease import LEASE, LeaseHeld, RunLease

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lease(root, **kw) -> RunLease:
    return RunLease(pafs.LocalFileSystem(), str(root), str(root), **kw)


def acquire_elsewhere(root, stale_after=None) -> subprocess.CompletedProcess:
    """Another process (a second writer) trying to take the lease."""
    code = (f"import pyarrow.fs as f; from storage.lease import RunLease; "
            f"RunLease(f.LocalFileSystem(), {str(root)!r}, {str(root)!r}, stale_after={stale_after!r}).acquire()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    first = lease(tmp_path).acquire()
    try:
        rec = json.loads((tmp_path / LEASE).read_text())
        assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
        r = acquire_elsewhere(tmp_path)
        assert r.returncode != 0 and f"being written by pid {os.getpid()} on host" in r.stderr
        assert "SENTSIM_LEASE_STALE_SECONDS" in r.stderr
    finally:
        first.release()
    assert not (tmp_path / LEASE).exists()
    assert acquire_elsewhere(tmp_path).returncode == 0  # free again once released


def test_heartbeat_keeps_a_live_lease_fresh(tmp_path):
    holder = lease(tmp_path, stale_after=2.5).acquire()
    try:
        t0 = json.loads((tmp_path / LEASE).read_text())["heartbeat"]
        time.sleep(3.5)  # longer than stale_after: only the heartbeat keeps it live
        assert json.loads((tmp_path / LEASE).read_text())["heartbeat"] > t0
        assert "being written by" in acquire_elsewhere(tmp_path, stale_after=2.5).stderr
    finally:
        holder.release()


def test_dead_holder_on_this_host_is_taken_over(tmp_path, capsys):
    # a real process that held the lease and died without releasing it (a kill -9)
    code = (f"import pyarrow.fs as f, os; from storage.lease import RunLease; "
            f"RunLease(f.LocalFileSystem(), {str(tmp_path)!r}, 'x').acquire(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    dead = json.loads((tmp_path / LEASE).read_text())["pid"]
    new = lease(tmp_path).acquire()
    try:
        assert new.took_over["pid"] == dead and "has exited" in new.took_over["reason"]
        assert f"took over the lease of pid {dead}" in capsys.readouterr().err
    finally:
        new.release()


def test_stale_lease_from_another_host_is_taken_over(tmp_path):
    (tmp_path / LEASE).write_text(
        json.dumps({"host": "elsewhere", "pid": 1, "token": "t", "heartbeat": time.time() - 60}))
    with pytest.raises(LeaseHeld, match="on host elsewhere"):
        lease(tmp_path, stale_after=120).acquire()
    new = lease(tmp_path, stale_after=30).acquire()
    try:
        assert "no heartbeat for" in new.took_over["reason"]
    finally:
        new.release()


def take_over_elsewhere(root: str, uri: str, fs: str = "f.LocalFileSystem()", env=None) -> dict:
    """Another process judges the lease stale (stale_after=0) and takes it over, then keeps it (exits
    without releasing): the record it wrote, as it printed it."""
    code = (f"import json, os, pyarrow.fs as f; from storage.lease import RunLease; "
            f"l = RunLease({fs}, {root!r}, {uri!r}, stale_after=0).acquire(); "
            f"print(json.dumps({{'pid': os.getpid(), 'token': l.token}}), flush=True); os._exit(0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0 and "took over the lease of pid" in r.stderr, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_holder_whose_lease_was_taken_over_notices_on_its_next_heartbeat(tmp_path, capsys):
    """Local disk: the heartbeat reads the file first; once it names another holder, the old holder
    stops beating and marks itself lost instead of writing its record over the new holder's."""
    from storage.lease import LeaseLost

    holder = lease(tmp_path, stale_after=60).acquire()  # its own thread beats only every 12 s
    try:
        assert holder.heartbeat() and holder.lost is None
        new = take_over_elsewhere(str(tmp_path), str(tmp_path))
        assert not holder.heartbeat()
        assert f"taken over by pid {new['pid']} on host {socket.gethostname()}" in holder.lost
        assert "lease was taken over" in capsys.readouterr().err
        with pytest.raises(LeaseLost, match="taken over"):
            holder.check()
        assert json.loads((tmp_path / LEASE).read_text())["token"] == new["token"]  # not overwritten
    finally:
        holder.release()
    assert json.loads((tmp_path / LEASE).read_text())["token"] == new["token"]  # release left it alone


def test_heartbeat_on_s3_is_a_conditional_put_and_a_taken_over_holder_notices(s3_server):  # noqa: F811
    """S3 (the moto server): the heartbeat is a PUT with If-Match on the ETag this holder last wrote.
    moto honours If-Match on put_object (412 PreconditionFailed when the ETag differs), checked here
    first with plain boto3, so the takeover is noticed by the condition itself, not by a read."""
    import boto3
    from botocore.exceptions import ClientError

    from storage.fs import resolve
    from storage.lease import LeaseLost

    s3 = boto3.client("s3")
    s3.put_object(Bucket="sentsim", Key="cond/obj", Body=b"a")
    etag = s3.head_object(Bucket="sentsim", Key="cond/obj")["ETag"]
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket="sentsim", Key="cond/obj", Body=b"b", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    s3.put_object(Bucket="sentsim", Key="cond/obj", Body=b"c", IfMatch=etag)  # the right ETag: written
    assert s3.get_object(Bucket="sentsim", Key="cond/obj")["Body"].read() == b"c"

    uri = "s3://sentsim/lease/takeover"
    fs, root = resolve(uri)
    holder = RunLease(fs, root, uri, stale_after=60).acquire()
    try:
        first = holder._etag
        assert first and holder.heartbeat() and holder._etag != first  # each beat is a new object
        new = take_over_elsewhere(root, uri, fs=f"__import__('storage.fs').fs.resolve({uri!r})[0]", env=s3_server)
        assert not holder.heartbeat()
        assert f"taken over by pid {new['pid']}" in holder.lost
        with pytest.raises(LeaseLost):
            holder.check()
        body = s3.get_object(Bucket="sentsim", Key=f"{root.partition('/')[2]}/{LEASE}")["Body"].read()
        assert json.loads(body)["token"] == new["token"]  # the new holder's lease, untouched
    finally:
        holder.release()
    assert holder.read()["token"] == new["token"]


# ---------------------------------------------------------------- taken before the run opens


def test_a_lease_taken_before_open_run_is_kept_by_it_and_gives_back_only_the_folders_it_made(tmp_path):
    """ShardStore.take_lease (a pool harvest's, before it clusters): a second writer is refused from then on;
    open_run keeps that same lease; released before any run opened, the folders the lease had to make are gone
    again, while a folder that was there, or one a run was opened in, stays."""
    import pyarrow as pa

    from storage import ShardStore

    run = tmp_path / "a" / "b" / "run"
    store = ShardStore(str(run))
    store.take_lease()
    held = json.loads((run / LEASE).read_text())
    assert held["pid"] == os.getpid()
    r = acquire_elsewhere(run)
    assert r.returncode != 0 and f"is being written by pid {os.getpid()}" in r.stderr, r.stderr[-2000:]
    store.take_lease()  # again: the same lease, not a second one
    store.release()
    assert not (tmp_path / "a").exists() and tmp_path.is_dir()  # a setup refused or stopped: no run folder left

    (tmp_path / "there").mkdir()
    store = ShardStore(str(tmp_path / "there"))
    store.take_lease()
    store.release()
    assert (tmp_path / "there").is_dir() and not (tmp_path / "there" / LEASE).exists()

    store = ShardStore(str(run))
    store.take_lease()
    token = json.loads((run / LEASE).read_text())["token"]
    store.open_run("corpus", "fp", {}, [], {"t": pa.schema([("x", pa.int64())])})
    assert json.loads((run / LEASE).read_text())["token"] == token  # open_run took no second lease
    assert acquire_elsewhere(run).returncode != 0
    store.release()
    assert not (run / LEASE).exists() and (run / "manifest.json").is_file()  # a run: its folder stays
    assert acquire_elsewhere(run).returncode == 0


# ---------------------------------------------------------------- training outputs


def test_claim_out_takes_the_lease_of_a_training_out(tmp_path):
    """claim_out: a second process claiming the same --out is refused naming the holder; a holder that was
    killed is taken over; the same process may claim again (a rerun, a second stage); a claim entered in a
    `with` block is given back when the block ends, by an error too."""
    from pathlib import Path

    from sentsim.training.run import claim_out, release_out

    out = tmp_path / "model_out"
    code = ("import sys, time; from pathlib import Path; from sentsim.training.run import claim_out; "
            f"claim_out(Path({str(out)!r}), 'fp', {{}}, False, 'OUT'); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match=f"OUT is being written by pid {holder.pid} on host"):
            claim_out(Path(out), "fp", {}, True, "OUT")  # --force-new too: nothing discarded under a live holder
    finally:
        holder.kill()
        holder.wait()
    claim_out(Path(out), "fp", {}, False, "OUT")  # a killed holder: taken over
    claim_out(Path(out), "fp", {}, False, "OUT")  # this process again
    assert json.loads((out / LEASE).read_text())["pid"] == os.getpid()
    release_out(out)
    # a claim given back before its run went ahead (go_ahead) recorded nothing in run.json
    assert not (out / LEASE).exists() and not (out / "run.json").exists()
    with pytest.raises(RuntimeError, match="in the run"):  # entered: given back when the block ends, however
        with claim_out(Path(out), "fp", {}, False, "OUT"):
            assert json.loads((out / LEASE).read_text())["pid"] == os.getpid()
            raise RuntimeError("in the run")
    assert not (out / LEASE).exists() and not (out / "run.json").exists()
    with claim_out(Path(out), "fp", {}, False, "OUT"):  # a block that ends as it should went ahead
        pass
    assert not (out / LEASE).exists() and json.loads((out / "run.json").read_text())["fingerprint"] == "fp"


def test_a_new_out_refused_after_its_claim_is_not_left_behind(tmp_path):
    """A run refused after it claimed a new --out (a batch no row fills, workers the cluster cannot hold) leaves
    no empty folder there, the folders above it the claim made included (a discriminator's OUT/_train); one
    that went ahead keeps its folder, and so does one that something was written into, or that was there."""
    from pathlib import Path

    from sentsim.training.run import claim_out

    out = tmp_path / "new" / "_train"
    with pytest.raises(RuntimeError, match="refused"):
        with claim_out(Path(out), "fp", {}, False, "OUT"):
            assert out.is_dir()
            raise RuntimeError("refused")
    assert not (tmp_path / "new").exists()
    with pytest.raises(RuntimeError):
        with claim_out(Path(out), "fp", {}, False, "OUT"):
            (out.parent / "model.safetensors").write_bytes(b"x")  # another writer's, or an export's: kept
            raise RuntimeError("refused")
    assert (out.parent / "model.safetensors").is_file() and not out.exists()
    with pytest.raises(RuntimeError):
        with claim_out(Path(out.parent), "fp", {}, False, "OUT"):  # there before the claim: kept
            raise RuntimeError("refused")
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.safetensors"]
    went = tmp_path / "went"
    with claim_out(Path(went), "fp", {}, False, "OUT"):
        pass
    assert json.loads((went / "run.json").read_text())["fingerprint"] == "fp"


@pytest.mark.slow
def test_two_trainings_into_one_out_second_exits_2_naming_the_holder(tmp_path, speech_corpus, ray_head):
    """Two real `sentsim train discriminator` processes with one --out: the second exits 2 in one line
    naming the first (with or without --force-new) and leaves its state alone; the first finishes; then
    the out is free again."""
    import signal

    from conftest import sentsim_cli

    env = {**ray_head["env"], "RAY_ADDRESS": ray_head["gcs"]}
    out = tmp_path / "disc"
    sets = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.max_steps=3", "train.batch_size=8", "train.max_heldout_windows=32"]
    args = ["train", "discriminator", "--corpus", str(speech_corpus), "--out", str(out), "--num-workers", "1",
            *[x for s in sets for x in ("--set", s)]]
    exe = os.path.join(os.path.dirname(sys.executable), "sentsim")
    first = subprocess.Popen([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, **env})
    try:
        lease_file = out / "_train" / LEASE
        deadline = time.time() + 300
        while not lease_file.exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.2)
        first.send_signal(signal.SIGSTOP)  # hold it mid-run, whatever the machine's speed
        try:
            for extra in ([], ["--force-new"]):
                r = sentsim_cli(*args, *extra, env=env)
                assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
                assert len(r.stderr.strip().splitlines()) == 1, r.stderr
                assert f"is being written by pid {first.pid} on host" in r.stderr, r.stderr
                assert json.loads(lease_file.read_text())["pid"] == first.pid and (out / "_train").is_dir()
        finally:
            first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=600)
        assert first.returncode == 0, stderr[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert (out / "model.safetensors").is_file() and not lease_file.exists()  # its state stays, its lease goes
    r = sentsim_cli(*args, env=env)
    assert r.returncode == 0, r.stderr[-3000:]


def test_force_new_against_a_live_local_run_exits_2_naming_the_holder_and_deletes_nothing(
        speech_corpus, sample_path, tmp_path):
    """`sentsim corpus build --force-new` into a run whose lease a live process holds: exit 2, one line
    naming that process, and every file of the run (manifest, markers, shards, the lease) as it was."""
    import shutil

    from conftest import sentsim_cli

    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code = (f"import time, pyarrow.fs as f; from storage.lease import RunLease; "
            f"RunLease(f.LocalFileSystem(), {str(run)!r}, {str(run)!r}).acquire(); print('held', flush=True); "
            f"time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = sentsim_cli("corpus", "build", sample_path, "--out", run, "--executor", "inline",
                        "--set", "docs_per_unit=4", "--force-new")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"is being written by pid {holder.pid} on host" in r.stderr, r.stderr
        after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
        assert json.loads(after.pop(run.relative_to(run) / LEASE))["pid"] == holder.pid
        assert after == before  # nothing deleted, nothing rewritten
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- something else at the lease's name


def _one_line_refusal(r, where) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"{where} is a folder, not a lease file" in lines[0] and "remove it and run again" in lines[0], lines
    return lines[0]


def test_a_folder_at_a_runs_lease_is_refused_in_one_line_and_left_alone(sample_path, tmp_path):
    """`sentsim corpus build` into a run whose lease is a folder: no writer ever leaves one (a lease is
    created exclusively or renamed into place), so it is the user's: exit 2 in one line naming it, at
    once and after it would have gone stale, with or without --force-new, and nothing removed; the same
    command runs once the folder is gone."""
    from conftest import sentsim_cli

    run = tmp_path / "run"
    run.mkdir()
    (run / LEASE).mkdir()
    (run / LEASE / "mine.txt").write_text("keep me")
    argv = ("corpus", "build", sample_path, "--out", run, "--executor", "inline", "--set", "docs_per_unit=4")
    for extra, env in (([], None), (["--force-new"], None), ([], {"SENTSIM_LEASE_STALE_SECONDS": "0"})):
        _one_line_refusal(sentsim_cli(*argv, *extra, env=env), run / LEASE)
        assert (run / LEASE / "mine.txt").read_text() == "keep me"
        assert sorted(p.name for p in run.iterdir()) == [LEASE]  # refused before anything was written
    (run / LEASE / "mine.txt").unlink()
    (run / LEASE).rmdir()
    r = sentsim_cli(*argv)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "_COMPLETE").is_file() and not (run / LEASE).exists()


def test_a_fifo_or_symlink_at_the_lease_is_refused_without_reading_it(tmp_path):
    """A FIFO is never opened (a read would block for good); a symlink is not a lease a writer left."""
    from storage.lease import LeaseNotAFile

    fifo, link = tmp_path / "fifo", tmp_path / "link"
    for d in (fifo, link):
        d.mkdir()
    os.mkfifo(fifo / LEASE)
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", link / LEASE)
    for root, what in ((fifo, "a FIFO"), (link, "a symlink")):
        with pytest.raises(LeaseNotAFile, match=f"is {what}, not a lease file"):
            lease(root, stale_after=0).acquire()
        assert lease(root).read() == {}
    assert (tmp_path / "elsewhere.json").read_text() == "{}"


def test_a_folder_at_a_training_outs_lease_is_refused_in_one_line(speech_corpus, tmp_path):
    """The trainers' --out lease (claim_out) is the same lease: `sentsim train discriminator` into an --out
    whose lease is a folder exits 2 in one line naming it, before it trains or starts Ray."""
    from conftest import sentsim_cli

    out = tmp_path / "disc"
    (out / "_train" / LEASE).mkdir(parents=True)
    r = sentsim_cli("train", "discriminator", "--corpus", speech_corpus, "--out", out, "--num-workers", "1",
                    "--set", "train.max_steps=1", timeout=300)
    _one_line_refusal(r, out / "_train" / LEASE)
    assert sorted(p.name for p in (out / "_train").iterdir()) == [LEASE] and (out / "_train" / LEASE).is_dir()


def test_an_endpoint_that_is_no_s3_server_is_named_not_taken_for_a_lease_race(sample_path, tmp_path):
    """An HTTP server that answers 404 to everything (a proxy, a wrong port) at AWS_ENDPOINT_URL: its 404
    to the lease's first PUT is no "a lease exists", so the command says the store cannot be used, in one
    line, and never that another writer took the lease over."""
    import http.server
    import threading

    from conftest import sentsim_cli

    class NotFound(http.server.BaseHTTPRequestHandler):
        def answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
           "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        r = sentsim_cli("corpus", "build", sample_path, "--out", "s3://bucket/corpus", "--executor", "inline",
                        env=env, timeout=300)
    finally:
        server.shutdown()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("sentsim: error: cannot use the object store (") and "took over" not in lines[0]


def test_a_refusal_of_an_earlier_record_format_does_not_name_an_input_it_held_as_a_path():
    """A format-1 record held a student's --data (a surrogate's --finetune-sts) as its path alone, where today's
    holds {"path", its content}: the same path is no change, and only what differs is named."""
    from sentsim.training.run import _changed

    stored = {"fingerprint": "a", "config": {"lr": 1}, "data": "/h"}
    same = {"config": {"lr": 2}, "data": {"path": "/h", "harvest": "x", "pairs_sha256": "y"}}
    content = ("data.harvest", "data.pairs_sha256")
    assert _changed(stored, same, content) == "; config.lr: 1 -> 2"
    moved = {"config": {"lr": 1}, "data": {"path": "/h2", "harvest": "x", "pairs_sha256": "y"}}
    assert _changed(stored, moved, content) == "; data.path: '/h' -> '/h2'"
