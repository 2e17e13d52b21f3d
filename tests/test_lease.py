"""One writer per run: the lease file on local disk (the S3 conditional PUT is in test_s3_chain.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest

from storage.lease import LEASE, LeaseHeld, RunLease

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
