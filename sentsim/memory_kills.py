"""Ending a sharded job that Ray's memory monitor keeps killing without it making progress.

Ray retries a task killed for memory for ever (RAY_task_oom_retries=-1) and Ray Data restarts a stage's
actors for ever, so under lasting memory pressure (nodes too small for the stages placed on them) a harvest
would kill and restart workers until someone stopped it, saying nothing a user could act on. One kill is
worth Ray's retry: a passing spike (another job's, a large batch) frees its memory with the kill and the
retried unit completes. Many kills with no unit committed since the first of them are lasting pressure.

`KillBound` is that rule. `MemoryKillWatch` applies it to a running pass of the executor: a thread polls the
GCS's worker table for this job's workers that died with exit type NODE_OUT_OF_MEMORY, the executor reports
each committed unit, and when the bound is crossed the watch stops the pass by raising an exception in the
thread that iterates the pipeline. Ray Data shuts its executor down on any exception there (as on a Ctrl-C:
its actor pools are killed), and the watch turns it into Ray's own `OutOfMemoryError`, carrying Ray's report
of the last kill, which the executor already turns into `WorkerLost` and its one line (sentsim.lost_workers).
Every unit committed before stays committed, and the same command resumes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, Iterable, List, Optional, Sequence

__all__ = ["KILLS_WITHOUT_PROGRESS", "KillBound", "MemoryKillWatch", "watch_memory_kills"]

# Ray's memory monitor kills one worker per refresh (250 ms by default) for as long as the node stays above
# its threshold, and a spike that passes is over after the first one or few kills. A pipeline holds one
# actor pool per stage plus read tasks, so even a spike that takes out a worker of every stage stays well
# under ten. Ten kills in a row with no unit committed means each retry was killed again: the memory will
# not come back by waiting. Ray restarts a killed worker within seconds, so ten is well under a minute of
# waiting on a busy machine, small next to a sharded job's run, and nothing a user would tune: the fix is
# the stage's resources, which the line names.
KILLS_WITHOUT_PROGRESS = 10

# how often the watch reads the worker table: each read lists every worker the GCS remembers, so not
# much more often than Ray restarts a killed one
POLL_SECONDS = 2.0


class KillBound:
    """`limit` memory kills with no unit committed since the first of them. `killed` adds kills (Ray's
    report of each) and says whether the bound is crossed; `committed` starts over."""

    def __init__(self, limit: int = KILLS_WITHOUT_PROGRESS):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.reports: List[str] = []  # Ray's report of each kill since the last committed unit

    def committed(self) -> None:
        self.reports.clear()

    def killed(self, reports: Iterable[str]) -> bool:
        self.reports.extend(reports)
        return self.crossed

    @property
    def crossed(self) -> bool:
        return len(self.reports) >= self.limit


class KillsWithoutProgress(BaseException):
    """Raised by the watch in the thread that iterates the pipeline. A BaseException, as a Ctrl-C is: no
    `except Exception` between there and the watch takes it for an error of its own."""


def job_memory_kills() -> Callable[[], dict]:
    """A reader of this job's workers that Ray's memory monitor killed: worker id -> Ray's report, from the
    GCS's worker table (every worker of the cluster, alive or dead, with its job, exit type and exit detail),
    through the same GCS client as `ray.nodes()`. Ray's state API (`ray.util.state.list_workers`) serves the
    same table through the dashboard, which a local Ray started by the command does not run."""
    import ray
    from ray._private.state import state
    from ray.core.generated import common_pb2, gcs_pb2

    job = bytes.fromhex(ray.get_runtime_context().get_job_id())
    oom = common_pb2.WorkerExitType.NODE_OUT_OF_MEMORY

    def read() -> dict:
        out = {}
        for blob in state._connect_and_get_accessor().get_worker_table():
            w = gcs_pb2.WorkerTableData.FromString(blob)
            if w.exit_type == oom and w.job_id == job and not w.is_alive:
                out[w.worker_address.worker_id] = w.exit_detail or "killed due to the node running low on memory"
        return out

    return read


def _stage_report(reports: Sequence[str]) -> str:
    """The report to show: the last kill of a stage's actor (the line then names the stage and its knobs),
    else the last kill (a read task, one of Ray Data's own actors)."""
    from sentsim.lost_workers import memory_kill

    return next((r for r in reversed(reports) if memory_kill(r).names_a_stage), reports[-1])


class MemoryKillWatch:
    """Around one pass of the pipeline: `with MemoryKillWatch(read) as kills: for r in run_pipeline(...):
    kills.committed()`. Past the bound, the `with` raises Ray's OutOfMemoryError (see the module's docstring).
    `read`: worker id -> report of the job's workers killed for memory (`job_memory_kills`); the ones it
    gives when the watch starts (an earlier pass's) are not counted."""

    def __init__(self, read: Callable[[], dict], limit: int = KILLS_WITHOUT_PROGRESS,
                 poll_seconds: float = POLL_SECONDS):
        self.read, self.poll_seconds = read, poll_seconds
        self.bound = KillBound(limit)
        self._seen: set = set()
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._armed = False
        self._fired = False
        self._target: Optional[int] = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "MemoryKillWatch":
        self._seen = set(self._read_or_nothing())
        self._target = threading.get_ident()
        self._armed = True
        self._thread = threading.Thread(target=self._watch, name="sentsim-memory-kills", daemon=True)
        self._thread.start()
        return self

    def committed(self) -> None:
        """A unit was committed: the kills before it made no lasting harm."""
        with self._lock:
            self.bound.committed()

    def _read_or_nothing(self) -> dict:
        try:
            return self.read()
        except Exception:  # the watch only ever ends a run early; a GCS that does not answer it fails nothing
            return {}

    def _watch(self) -> None:
        while not self._halt.wait(self.poll_seconds):
            kills = self._read_or_nothing()
            new = [kills[w] for w in kills if w not in self._seen]
            self._seen.update(kills)
            with self._lock:
                if not self._armed:
                    return
                if self.bound.killed(new):
                    self._fired = True
                    self._armed = False
                    _raise_in(self._target, KillsWithoutProgress)
                    return

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self._halt.set()
            with self._lock:
                self._armed = False
                if self._fired:  # fired, but perhaps not yet delivered: never deliver it outside the watch
                    _raise_in(self._target, None)
        except KillsWithoutProgress:  # delivered here, after the pass had ended otherwise
            pass
        if self._thread is not None:
            self._thread.join()
        if self._fired and (exc_type is None or issubclass(exc_type, KillsWithoutProgress)):
            if exc_type is None:  # the pass finished before the exception reached it: nothing to stop
                return False
            from ray.exceptions import OutOfMemoryError

            n = len(self.bound.reports)
            err = OutOfMemoryError(_stage_report(self.bound.reports))
            err.kills = n  # read by sentsim.lost_workers: the line says the kills were repeated
            raise err from None
        return False


def _raise_in(thread_id: int, exc_type) -> None:
    """Raise `exc_type` in thread `thread_id` at its next Python instruction (None: cancel one pending).
    Ray Data's driver loop waits for results in short sleeps and queue reads with a timeout, so it is
    reached within a fraction of a second."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc_type) if exc_type is not None else None)


def watch_memory_kills(executor: str):
    """The watch for one pass of `run_pipeline`: on Ray, of this job's workers; in-process, none."""
    from contextlib import nullcontext

    if executor != "ray":
        return nullcontext(_NoWatch())
    try:
        read = job_memory_kills()
    except Exception:  # a Ray without this table: the pass runs as before, unwatched
        return nullcontext(_NoWatch())
    return MemoryKillWatch(read)


class _NoWatch:
    def committed(self) -> None:
        pass
