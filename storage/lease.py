"""One writer per run: a lease file, `DIR/_LEASE`, held by the process that drives a run.

- Local disk: created exclusively (O_CREAT|O_EXCL), so of two writers started together one wins.
- S3: a conditional PUT (`If-None-Match: *`), which S3 and the moto test server both refuse with
  412 when the key exists. pyarrow's S3 filesystem has no conditional write, so boto3 does this one
  request; endpoint and credentials come from the same AWS_* variables.
- The holder rewrites its heartbeat every `stale_after / 5` seconds from a daemon thread. A lease
  whose heartbeat is older than `stale_after` (default 300 s, SENTSIM_LEASE_STALE_SECONDS), or whose
  holder is a dead process on this host, is stale and is taken over by the next writer, which says so.
- A heartbeat never overwrites another holder's lease. On S3 it is a conditional PUT (`If-Match` on the
  ETag this holder last wrote; a takeover is `If-Match` on the ETag of the stale lease it read), so a
  holder whose lease was taken over gets 412 on its next heartbeat. On local disk the heartbeat reads
  the file first and finds it naming another holder. Either way the holder stops beating, sets `lost`
  (the reason), says so on stderr, and `check()` raises LeaseLost from then on.
- Taken by `ShardStore.open_run`, or earlier by `ShardStore.take_lease` for a job whose setup before the run
  opens takes minutes (a pool harvest's pool draw and clustering), which open_run then keeps: a second writer
  is refused before that setup. A SIGTERM during it releases the lease too (`released_on_sigterm`).
- Released (deleted) when the run ends, successfully or not.
- Anything but a regular file at the lease's name (a folder, a FIFO, a symlink) is refused in one line
  naming it: no writer ever leaves one (a lease is only created exclusively or renamed into place), so it
  is the user's and is neither read (a FIFO would block the read), judged stale, nor removed.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import pyarrow.fs as pafs

from sentsim.errors import UsageError
from storage import fs as sfs

LEASE = "_LEASE"


class LeaseHeld(UsageError):
    """Another live writer holds the run."""


class LeaseLost(UsageError):
    """This writer's lease was taken over (it was judged stale): another writer owns the run now."""


class LeaseNotAFile(UsageError):
    """Something other than a regular file stands where the run's lease belongs."""


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
        self.lost: Optional[str] = None  # why this holder no longer holds the lease, once it noticed
        self._etag: Optional[str] = None  # S3: the ETag of the lease object this holder last wrote

    # ---- the record ----------------------------------------------------------------------
    def _record(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                           "heartbeat": time.time(), "command": " ".join(sys.argv[:3])}).encode()

    def read(self) -> Optional[dict]:
        if self._is_s3():
            got = _s3_get(self.path)
            if got is None:
                return None
            return _parse(got[0])
        if not sfs.exists(self.fs, self.path):
            return None
        if self._odd_local() is not None:
            return {}  # never opened: no writer left it, and a FIFO would block the read
        try:
            return json.loads(sfs.read_bytes(self.fs, self.path))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            return {}  # half-written or unreadable: judged by its age below

    def _is_s3(self) -> bool:
        return self.fs.type_name == "s3"

    def _odd_local(self) -> Optional[str]:
        """What stands at the lease's name on local disk when it is not a regular file (lstat: a symlink
        is named as one), else None."""
        if self._is_s3():
            return None
        try:
            mode = os.lstat(self.path).st_mode
        except OSError:
            return None
        if stat.S_ISREG(mode):
            return None
        return ("a folder" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file")

    def _refuse_odd(self) -> None:
        odd = self._odd_local()
        if odd is not None:
            raise LeaseNotAFile(
                f"{self.uri}: {self.path} is {odd}, not a lease file (the run's one writer keeps its lease "
                f"there, and sentsim never leaves anything but a file); remove it and run again")

    def _create_exclusive(self) -> bool:
        """True when this call created the lease; False when one exists."""
        data = self._record()
        if self._is_s3():
            self._etag = _s3_put(self.path, data, if_none_match="*")
            return self._etag is not None
        parent = os.path.dirname(self.path)
        for attempt in range(3):
            os.makedirs(parent, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse_odd()
                return False
            except FileNotFoundError:
                # the folder was removed in between by a writer whose setup ended before its run opened
                # (ShardStore.take_lease removes the folder its lease made): made again
                if attempt == 2:
                    raise
                continue
            break
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def _overwrite(self, if_match: Optional[str] = None) -> bool:
        """Rewrite the lease with this holder's record. On S3 a conditional PUT on `if_match` (the ETag
        the caller saw; None: only if there is no object): False when the object changed since, i.e.
        someone else wrote the lease."""
        if self._is_s3():  # one PUT replaces the object whole
            etag = _s3_put(self.path, self._record(), if_match=if_match, if_none_match=None if if_match else "*")
            if etag is None:
                return False
            self._etag = etag
            return True
        sfs.write_bytes_atomic(self.fs, self.path, self._record())
        return True

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
            seen_etag = None
            if self._is_s3():
                got = _s3_get(self.path)
                rec, seen_etag = (_parse(got[0]), got[1]) if got else ({}, None)
                rec = rec or {}
            else:
                rec = self.read() or {}
            if rec.get("token") == self.token:
                self._etag = seen_etag  # already ours: the next heartbeat is conditional on this object
            else:
                why = self._stale_reason(rec)
                if why is None:
                    age = time.time() - float(rec.get("heartbeat", time.time()))
                    raise LeaseHeld(
                        f"{self.uri} is being written by pid {rec.get('pid', '?')} on host {rec.get('host', '?')} "
                        f"(`{rec.get('command', '?')}`, last heartbeat {age:.0f}s ago); one writer per run. Wait for "
                        f"it to finish, or, if it is gone, run again after {self.stale_after:.0f}s without a heartbeat "
                        f"(SENTSIM_LEASE_STALE_SECONDS sets that) and this run takes the lease over")
                # on S3 only if the stale lease is still the one judged (If-Match on its ETag)
                if not self._overwrite(if_match=seen_etag) or \
                        (self.read() or {}).get("token") != self.token:  # another writer took it over first
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
                self.heartbeat()
            except OSError:
                pass  # a missed heartbeat is retried; staleness needs several in a row
            if self.lost:
                return

    def heartbeat(self) -> bool:
        """One heartbeat: rewrite the lease if this holder still holds it. False (and `lost` set, once,
        with a line on stderr) when another writer took it over; the lease is then left alone."""
        if self.lost:
            return False
        if self._is_s3():
            # If-Match on the ETag this holder last wrote: a takeover changed the object, so 412
            ok = self._overwrite(if_match=self._etag)
            holder = None if ok else (self.read() or {})
        else:
            holder = self.read() or {}
            ok = holder.get("token") == self.token and self._overwrite()
        if not ok:
            holder = holder or {}
            self.lost = (f"{self.uri}: this writer's lease was taken over by pid {holder.get('pid', '?')} on host "
                         f"{holder.get('host', '?')} (it judged this one stale); stopped writing the heartbeat")
            print(f"error: {self.lost}", file=sys.stderr, flush=True)
        return ok

    def check(self) -> None:
        """Raise LeaseLost once a heartbeat found the lease taken over."""
        if self.lost:
            raise LeaseLost(self.lost)

    def release(self) -> None:
        atexit.unregister(self.release)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if not self.lost and (self.read() or {}).get("token") == self.token:
                self.fs.delete_file(self.path)
        except OSError:
            pass

    def __enter__(self) -> "RunLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextmanager
def released_on_sigterm(release: Callable[[], None]) -> Iterator[None]:
    """Within the block: a SIGTERM (a scheduler stopping the job, a plain `kill`) calls `release` (a lease's),
    then ends the process as SIGTERM would have. For a lease taken before a long setup that writes nothing (a
    pool harvest's clustering): by default SIGTERM ends the process with no `finally` or atexit run, and the
    lease it leaves waits for the stale-takeover rules. Only where SIGTERM has its default action and in the
    main thread (the only one a handler can be set from); a handler someone else set is left to do its work.

    Python runs the handler in the main thread between bytecodes, so a SIGTERM that comes during one long native
    call takes effect when that call returns. In a pool harvest's clustering of 300,000 enwiki sentences on 2 shared
    cores (bench/signal_latency.py, bench/results/signal_latency.md) a signal waited at most 3.6 s: for
    scikit-learn's TF-IDF sorting its whole uni- and bigram vocabulary with Python's sorted() (1.4 s at 100,000
    sentences), which holds the GIL, so no other thread could act sooner either; then up to 2.7 s for a k-means
    step and 1.4 s for `clusters._assign`'s lexsort of n*16 candidates. These grow with n. `ray job stop` sends
    SIGKILL 3 s after SIGTERM (RAY_JOB_STOP_WAIT_TIME_S), so a job stopped in one of those calls may keep the
    lease: the next writer takes it over once it is stale."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            release()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the default action now: the process ends as it would have

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _parse(data: bytes) -> dict:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}  # half-written or unreadable: judged by its age


def _s3_client():
    import boto3

    return boto3.client("s3",
                        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
                        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))


def _s3_get(path: str) -> Optional[tuple]:
    """(body, ETag) of the object, or None when there is none."""
    from botocore.exceptions import ClientError

    bucket, _, key = path.partition("/")
    try:
        resp = _s3_client().get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise OSError(f"s3://{path}: {exc}") from None
    return resp["Body"].read(), resp["ETag"]


def _s3_put(path: str, data: bytes, if_match: Optional[str] = None, if_none_match: Optional[str] = None):
    """One PUT, conditional on If-Match (the ETag the writer last saw) or If-None-Match: "*" (absent).
    Returns the new ETag, or None when the condition failed (412; 409 when a concurrent conditional
    write won, and 404 when If-Match names an object that is gone). The moto test server honours both
    headers on put_object (moto >= 5.1 compares If-Match with the stored ETag), see tests/storage/test_lease.py."""
    from botocore.exceptions import ClientError

    bucket, _, key = path.partition("/")
    cond = {"IfMatch": if_match} if if_match else {"IfNoneMatch": if_none_match} if if_none_match else {}
    try:
        resp = _s3_client().put_object(Bucket=bucket, Key=key, Body=data, **cond)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return None
        # gone is a failed condition only for If-Match; a 404 to any other PUT is a missing bucket, or an
        # endpoint that is no S3 server, and taken for "a lease exists" it ended as a takeover race
        if if_match and (code == "NoSuchKey" or status == 404) and code != "NoSuchBucket":
            return None
        raise OSError(f"s3://{path}: {exc}") from None
    return resp["ETag"]
