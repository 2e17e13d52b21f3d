"""One writer per run: a lease file, `DIR/_LEASE`, held by the process that drives a run.

- Local disk: created exclusively (O_CREAT|O_EXCL), so of two writers started together one wins.
- S3: a conditional PUT (`If-None-Match: *`), which S3 and the moto test server both refuse with
  412 when the key exists. pyarrow's S3 filesystem has no conditional write, so boto3 does this one
  request; endpoint and credentials come from the same AWS_* variables.
- The holder rewrites its heartbeat every `stale_after / 5` seconds from a daemon thread. A lease
  whose heartbeat is older than `stale_after` (default 300 s, SENTSIM_LEASE_STALE_SECONDS), or whose
  holder is a dead process on this host, is stale and is taken over by the next writer, which says so.
- Released (deleted) when the run ends, successfully or not.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Optional

import pyarrow.fs as pafs

from sentsim.errors import UsageError
from storage import fs as sfs

LEASE = "_LEASE"


class LeaseHeld(UsageError):
    """Another live writer holds the run."""


def stale_after_default() -> float:
    return float(os.environ.get("SENTSIM_LEASE_STALE_SECONDS", "300"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLease:
    def __init__(self, fs: pafs.FileSystem, root: str, uri: str, stale_after: Optional[float] = None):
        self.fs, self.root, self.uri = fs, root, uri
        self.path = sfs.join(root, LEASE)
        self.stale_after = stale_after_default() if stale_after is None else stale_after
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.took_over: Optional[dict] = None

    # ---- the record ----------------------------------------------------------------------
    def _record(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                           "heartbeat": time.time(), "command": " ".join(sys.argv[:3])}).encode()

    def read(self) -> Optional[dict]:
        if not sfs.exists(self.fs, self.path):
            return None
        try:
            return json.loads(sfs.read_bytes(self.fs, self.path))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            return {}  # half-written or unreadable: judged by its age below

    def _is_s3(self) -> bool:
        return self.fs.type_name == "s3"

    def _create_exclusive(self) -> bool:
        """True when this call created the lease; False when one exists."""
        data = self._record()
        if self._is_s3():
            return _s3_put_if_absent(self.path, data)
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def _overwrite(self) -> None:
        if self._is_s3():  # one PUT replaces the object whole
            with self.fs.open_output_stream(self.path) as f:
                f.write(self._record())
        else:
            sfs.write_bytes_atomic(self.fs, self.path, self._record())

    def _stale_reason(self, rec: dict) -> Optional[str]:
        if not rec:
            info = self.fs.get_file_info(self.path)
            age = time.time() - (info.mtime.timestamp() if info.mtime else 0)
            return f"unreadable lease, {age:.0f}s old" if age > self.stale_after else None
        if rec.get("host") == socket.gethostname():
            if int(rec.get("pid", -1)) == os.getpid():
                return "left by an earlier run in this process"  # e.g. one that raised before finalize
            if not _pid_alive(int(rec.get("pid", -1))):
                return f"pid {rec.get('pid')} on this host has exited"
        age = time.time() - float(rec.get("heartbeat", 0))
        if age > self.stale_after:
            return f"no heartbeat for {age:.0f}s (stale after {self.stale_after:.0f}s)"
        return None

    # ---- acquire / release ---------------------------------------------------------------
    def acquire(self) -> "RunLease":
        if not self._create_exclusive():
            rec = self.read() or {}
            if rec.get("token") == self.token:
                pass
            else:
                why = self._stale_reason(rec)
                if why is None:
                    age = time.time() - float(rec.get("heartbeat", time.time()))
                    raise LeaseHeld(
                        f"{self.uri} is being written by pid {rec.get('pid', '?')} on host {rec.get('host', '?')} "
                        f"(`{rec.get('command', '?')}`, last heartbeat {age:.0f}s ago); one writer per run. Wait for "
                        f"it to finish, or, if it is gone, run again after {self.stale_after:.0f}s without a heartbeat "
                        f"(SENTSIM_LEASE_STALE_SECONDS sets that) and this run takes the lease over")
                self._overwrite()
                if (self.read() or {}).get("token") != self.token:  # another writer took it over first
                    raise LeaseHeld(f"{self.uri}: another writer took over the stale lease at the same moment")
                self.took_over = {**rec, "reason": why}
                if rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname():
                    pass  # our own earlier run: nothing to tell the user
                else:
                        print(f"note: {self.uri}: took over the lease of pid {rec.get('pid', '?')} on host "
                          f"{rec.get('host', '?')} ({why})", file=sys.stderr, flush=True)
        self._thread = threading.Thread(target=self._beat, name="sentsim-lease", daemon=True)
        self._thread.start()
        atexit.register(self.release)  # a run that raises still frees its lease; only a kill leaves it
        return self

    def _beat(self) -> None:
        interval = max(0.5, self.stale_after / 5)
        while not self._stop.wait(interval):
            try:
                if (self.read() or {}).get("token") != self.token:
                    return  # taken over (judged dead): the newer writer owns the run now
                self._overwrite()
            except OSError:
                pass  # a missed heartbeat is retried; staleness needs several in a row

    def release(self) -> None:
        atexit.unregister(self.release)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if (self.read() or {}).get("token") == self.token:
                self.fs.delete_file(self.path)
        except OSError:
            pass

    def __enter__(self) -> "RunLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _s3_put_if_absent(path: str, data: bytes) -> bool:
    import boto3
    from botocore.exceptions import ClientError

    bucket, _, key = path.partition("/")
    client = boto3.client("s3",
                          endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
                          region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return False
        raise
    return True
