"""One executor for every sharded job: corpus build, rep cache, contexts, harvest, remix.

A job is a class that subclasses `ShardedJob`: one instance is one run, resolved before anything is
written. It says what it is by its class attributes (`stage`, `count`, ...) and by the methods it
overrides (`fingerprint_parts`, `units`, `stages`, `summary`, ...). `execute` runs any such object
the same way:

    open the run or resume it (printing what is done and which units will be redone)
    start Ray (`sentsim.runtime.init_ray`) when there is work, refuse GPU asks the cluster lacks
    go ahead: with --force-new, the old run is discarded only now, once the run's refusals are behind it
    run the stages over the pending units (`run_pipeline`), one progress line per unit
    finalize the manifest with the job's summary

Units are dicts with a `unit` number. A list of units is run as one Ray Data pass; units that
arrive from a generator (the corpus build streams its inputs) run in windows of `job.window`, so
that the driver never holds more than a window of them. A `UnitPlan` (units computed from their
number, the harvest's) is one streamed pass too: the driver keeps the pending unit numbers only.
"""

from __future__ import annotations

import os
import sys
import time
from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from sentsim.errors import UsageError
from sentsim.identity import fingerprint
from sentsim.memory_kills import watch_memory_kills
from sentsim.pipeline import PLACEMENT_KEY, StageSpec, UnitPlan, run_pipeline

EXECUTORS = ("ray", "inline")


class ShardedJob(ABC):
    """One run of a sharded job. A subclass sets `out` (the run's location) when it is built, and overrides
    the abstract methods; the others have defaults that do nothing."""

    stage: str  # the manifest's stage, and the label of the progress lines
    out: str
    count: str = "items"  # the key of a stage result that the progress line counts, and its noun
    gauges: Optional[str] = None  # publish progress as Ray metrics named <gauges>_<name>
    # resume re-checks each done unit's sha256, so an edited shard of unchanged size is redone, never kept;
    # False (size only) is for a job whose shards are too big to hash on every resume
    deep: bool = True
    window: Optional[int] = None  # units per Ray Data pass when units are a generator
    # config keys outside the fingerprint (flattened, e.g. "resources"; "inputs.0.corpus" for an input): a
    # refused resume does not list their differences as if they had caused it
    unfingerprinted: Sequence[str] = ("out", "resources")

    @abstractmethod
    def fingerprint_parts(self) -> tuple:
        """What identifies the run's rows: `fingerprint(*parts)` is its fingerprint."""

    @property
    def fp(self) -> str:
        return fingerprint(*self.fingerprint_parts())

    def fingerprint_in_format(self, version: int, stored: dict) -> Optional[str]:
        """The fingerprint this same run held when written in run format `version` (older than
        storage.store.FORMAT_VERSION), given its stored manifest; None where it held today's. A stored run
        of that format holding it resumes under it (sentsim/run_formats.py)."""
        return None

    def holds_this_run(self, stored: dict) -> bool:
        """Whether `stored` (a manifest at --out) is this run's, so that it resumes: today's fingerprint, or the
        one this same run held in the earlier run format the manifest records (`fingerprint_in_format`)."""
        from storage.store import FORMAT_VERSION, run_format

        if stored.get("stage") != self.stage or stored.get("fingerprint") is None:
            return False
        if stored["fingerprint"] == self.fp:
            return True
        version = run_format(stored)
        return version < FORMAT_VERSION and self.fingerprint_in_format(version, stored) == stored["fingerprint"]

    def fingerprint_to_resume(self, store) -> str:
        """This run's fingerprint, or the one the run at `store` holds when that is this same run written in an
        earlier run format (`fingerprint_in_format`; sentsim/run_formats.py says which formats and why)."""
        from storage import StoreError

        try:
            stored = store.read_manifest()
        except StoreError:  # open_run says what is wrong with it
            return self.fp
        return stored["fingerprint"] if stored and self.holds_this_run(stored) else self.fp

    def refuse_another_run_now(self, store, force_new: bool) -> None:
        """What `open_run` refuses at `store` (a part of another run, a run of another stage or settings), said
        before a job plans for minutes: the harvest calls it before it clusters the anchors."""
        store.refuse_another_runs_part(self.stage)
        stored = None if force_new else store.read_manifest()
        if stored is not None and not self.holds_this_run(stored):
            store.refuse_another_run(stored, self.stage, self.fp, self.config(), self.inputs(), self.unfingerprinted)

    # the run's store, when the job took the run's lease before `execute` (hold_run_now): execute opens the run
    # on it, keeping that lease, and releases it
    held_store: Optional[object] = None

    def hold_run_now(self, store) -> None:
        """Take the run's lease at `store` now, before a setup of minutes (the harvest's pool and clustering), so
        that a second writer is refused before it, not after: the message and exit status open_run's lease
        gives. The caller runs the job (`execute` releases the lease, whatever happens), or, when its setup
        fails first, calls `let_go_of_run`."""
        store.take_lease()
        self.held_store = store

    def let_go_of_run(self) -> None:
        """Release the lease `hold_run_now` took (and the run folder it made, when no run was opened there);
        safe to call twice."""
        if self.held_store is not None:
            self.held_store.release()

    @abstractmethod
    def config(self) -> dict:
        """The resolved config, stored in the manifest."""

    @abstractmethod
    def inputs(self) -> List[dict]:
        """What the run reads, as the manifest lists it."""

    @abstractmethod
    def tables(self) -> Dict[str, object]:
        """Table name -> pyarrow schema."""

    @property
    @abstractmethod
    def units(self) -> Iterable[dict]:
        """A list (planned up front), a UnitPlan, or a generator (planned while streaming; `execute` reads
        this once per run)."""

    @abstractmethod
    def stages(self, ctx: "RunContext") -> List[StageSpec]:
        """The stage specs a unit goes through, built once there is work (after Ray is up)."""

    def prepare(self, ctx: "RunContext") -> None:
        """After the resource check, once the run goes ahead (--force-new has discarded the old run), before the
        first unit. A run this job needs first (a rep cache, a pool's vectors) is built here within
        ctx.max_units; stopped there, it raises PrerequisiteStopped. What the stages read from the run's own
        files (the harvest's rank anchors, stored with the run) is filled into ctx.specs here: `stages` writes
        nothing, and reads no file of the run, which is still the old one under --force-new."""

    def runs_first(self, ctx: "RunContext") -> List["ShardedJob"]:
        """The runs `prepare` would build first (a pool's vectors, the job's own rep cache), for `execute` to check
        with --force-new before the old run is discarded: what their own execute would refuse before it writes
        (their folder, their stages' resources on Ray), so that a run refused there leaves the old run whole. One
        complete there already is left out by `execute`. Builds nothing and writes nothing."""
        return []

    def recheck(self, ctx: "RunContext") -> None:
        """On a rerun with no unit to do: what the finished run still reads from outside its units (a pool's
        vectors, which remix reads) is checked and mended here, as `prepare` would build it."""

    def on_result(self, result: dict) -> bool:
        """Sees each finished unit's result; True: start no further units."""
        return False

    def detail(self, result: dict) -> Optional[str]:
        """The job's own tail of a unit's progress line (None: none)."""
        return None

    def summary(self, ctx: "RunContext") -> dict:
        """The manifest's counts when the run is finalized; may raise to leave it unfinished."""
        return {}

    def open_extra(self) -> dict:
        """Extra manifest keys written when the run is opened."""
        return {}


class PrerequisiteStopped(Exception):
    """A run that a job builds before its own units (`ShardedJob.prepare`) stopped at --max-units: the job
    runs none of its units this time, and the same command goes on with that run, then with the job's."""


@dataclass
class RunContext:
    job: ShardedJob
    fp: str
    store: object
    manifest: dict
    executor: str
    address: Optional[str]
    force_new: bool
    quiet: bool
    done: dict = field(default_factory=dict)
    planned: int = 0
    progress: Optional["Progress"] = None
    wall: float = 0.0
    specs: Optional[List[StageSpec]] = None
    actors: Dict[str, list] = field(default_factory=dict)  # stage -> distinct placements seen this run
    # --max-units: each run the job builds first (prepare) runs at most this many of its units, then the job's own
    max_units: Optional[int] = None

    def note_placement(self, result: dict) -> None:
        for stage, where in (result.pop(PLACEMENT_KEY, None) or {}).items():
            seen = self.actors.setdefault(stage, [])
            if where not in seen:
                seen.append(where)


class Progress:
    """One progress line per finished unit: units done of planned, rows, rate and ETA. With
    `gauges`, the same numbers as Ray application metrics (the dashboard's Metrics view and
    Prometheus show them, tagged by run)."""

    def __init__(self, label: str, total: Optional[int], already: int, noun: str, stream=sys.stderr,
                 gauges: Optional[str] = None, run: str = "",
                 detail: Optional[Callable[[dict], Optional[str]]] = None):
        self.label, self.total, self.already, self.noun = label, total, already, noun
        self.done, self.rows = 0, 0
        self.t0 = time.time()
        self.stream = stream
        self.detail = detail
        self.stage_seconds: Dict[str, float] = {}
        self.gauges = {}
        if gauges:
            import ray

            if ray.is_initialized():
                from ray.util.metrics import Gauge

                for name, what in (("units_done", "completed work units (resumed ones included)"),
                                   ("units_planned", "planned work units"),
                                   (f"{noun}_written", f"{noun} written by this run"),
                                   (f"{noun}_per_second", f"{noun} per second since start"),
                                   ("eta_seconds", "estimated seconds left")):
                    g = Gauge(f"{gauges}_{name}", description=what, tag_keys=("run",))
                    g.set_default_tags({"run": run})
                    self.gauges[name] = g
                if total is not None:
                    self.gauges["units_planned"].set(total)
                self.gauges["units_done"].set(already)

    def update(self, r: dict) -> None:
        self.done += 1
        self.rows += int(r.get(self.noun, 0))
        for k, v in (r.get("timing") or {}).items():
            self.stage_seconds[k] = self.stage_seconds.get(k, 0.0) + v
        el = max(time.time() - self.t0, 1e-9)
        units = f"{self.already + self.done}/{self.total} units" if self.total is not None else f"{self.done} units"
        # a resumed run's units count the units done before it, its rows only its own: said so, as its end does
        this_run = " this run" if self.already else ""
        line = (f"[{self.label}] unit {r['unit']:05d} | {units} | {self.rows:,} {self.noun}{this_run} "
                f"| {self.rows / el:,.1f} {self.noun}/s")
        values = {"units_done": self.already + self.done, f"{self.noun}_written": self.rows,
                  f"{self.noun}_per_second": self.rows / el}
        if self.total is not None:
            eta = el / self.done * max(0, self.total - self.already - self.done)
            line += f" | ETA {eta:,.0f}s"
            values["eta_seconds"] = eta
        for name, v in values.items():
            if name in self.gauges:
                self.gauges[name].set(v)
        tail = self.detail(r) if self.detail else None
        if tail:
            line += f" | {tail}"
        print(line, file=self.stream, flush=True)


def check_resources(specs: Sequence[StageSpec], executor: str, run: str = "") -> None:
    """Refuse stages that ask for more GPUs, CPUs or reserved memory than the Ray cluster has (min_actors of
    each at once): Ray Data would start the pools that fit and wait for the rest for ever, e.g. a harvest
    whose write stage never gets its quarter CPU commits no unit. In-process (`inline`) nothing is placed,
    so there is nothing to check. `run`: the run the stages are of, named in the line when it is not the one
    the command was given (a run the job builds first)."""
    if executor != "ray":
        return
    import ray

    have = ray.cluster_resources()
    for key, scale, what, knob, more in (("GPU", 1, "GPUs", "num_gpus", "add GPU nodes"),
                                         ("CPU", 1, "CPUs", "num_cpus", "add nodes"),
                                         ("memory", 2**30, "GiB of memory", "memory_gb", "add nodes")):
        want = sum(s.resources.asks()[key] * s.resources.min_actors for s in specs)
        if want > 0 and want > have.get(key, 0) + 1e-9:  # fractions of a CPU add up with rounding
            raise UsageError(f"{run + ': ' if run else ''}resources ask for {want / scale:g} {what} but the cluster "
                             f"has {have.get(key, 0) / scale:.3g}; lower resources.*.{knob} or min_actors, or {more}")


def execute(job: ShardedJob, executor: str = "ray", address: Optional[str] = None, force_new: bool = False,
            quiet: bool = False, max_units: Optional[int] = None) -> dict:
    """Open or resume `job`'s run, run its pending units (at most `max_units` of them), finalize.

    Returns the final manifest, plus `this_run` (not stored): the wall time, units run and the
    distinct actors each stage ran on (pid, node, CUDA_VISIBLE_DEVICES).
    """
    from storage import ShardStore

    store = job.held_store  # the store whose lease the job took already (hold_run_now); else open_run takes it
    try:
        if executor not in EXECUTORS:
            raise UsageError(f"unknown executor {executor!r} (ray or inline)")
        fp = job.fp
        planned = job.units  # read once: a generator's units are planned while they stream
        listed = isinstance(planned, Sequence)
        units = planned
        if listed and not units:
            raise UsageError(f"{job.stage}: nothing to do (0 units planned); refusing to write an empty run at "
                             f"{job.out}")
        if not listed:  # peek: a stream that yields no unit (an empty input) is refused before any write
            units = iter(units)
            first = next(units, None)
            if first is None:
                raise UsageError(f"{job.stage}: the inputs hold nothing to process; refusing to write an empty run "
                                 f"at {job.out}")
            units = _chain_first(first, units)
        if store is None:
            store = ShardStore(job.out)
        fp = fp if force_new else job.fingerprint_to_resume(store)
        # a quiet run's lines go to os.devnull, closed with the run: left to the garbage collector, each quiet
        # run held a descriptor until then and its collection warned (ResourceWarning)
        with open(os.devnull, "w") if quiet else nullcontext(sys.stderr) as stream:
            return _execute(job, store, fp, planned, units, executor, address, force_new, quiet, max_units, stream)
    finally:
        if store is not None:
            store.release()  # the run's lease: free again for the next writer, whatever happened


def check_runs_first(job: ShardedJob, ctx: RunContext) -> None:
    """What the runs `job` builds first (`ShardedJob.runs_first`) would refuse before they write, said before
    --force-new discards the old run: a folder their run cannot be written in, and on Ray their stages'
    resources (each run's own stages at once, as its execute checks them). One complete there, of the same
    run, has nothing to do and is not checked."""
    from storage import ShardStore, StoreError

    for first in job.runs_first(ctx):
        store = ShardStore(first.out)
        try:
            stored = store.read_manifest()
        except StoreError:
            stored = None  # a broken manifest: that run is started over (its --force-new), as below
        if stored and stored.get("complete") and first.holds_this_run(stored):
            continue
        store.refuse_another_runs_part(first.stage)
        store.refuse_other_files(first.tables())
        if ctx.executor == "ray":
            nested = RunContext(first, first.fp, store, {}, ctx.executor, ctx.address, True, True)
            check_resources(first.stages(nested), ctx.executor, run=f"{first.out} (built before the {job.stage})")


def _raise_if_worker_lost(exc: Exception, stage: str, ctx: RunContext) -> None:
    """A Ray worker killed for memory or dead is the machine's doing: WorkerLost, one line naming the stage
    and its resources, instead of Ray's traceback (the units done so far stay done; the command resumes)."""
    from sentsim.lost_workers import WorkerLost, lost_worker, sharded_job_line

    lost = lost_worker(exc)
    if lost is None:
        return
    resources = (ctx.manifest.get("config") or {}).get("resources") or {}
    names = [s.name for s in ctx.specs or ()]
    line = sharded_job_line(stage, lost, names, resources if isinstance(resources, dict) else {})
    raise WorkerLost(line, lost.text) from exc


def _chain_first(first: dict, rest):
    yield first
    yield from rest


def _execute(job: ShardedJob, store, fp: str, planned, units, executor: str, address: Optional[str],
             force_new: bool, quiet: bool, max_units: Optional[int], stream) -> dict:
    """`planned`: the job's units as it gave them (a list, a UnitPlan or a stream); `units`: the same,
    a stream's first unit already read back in front. `stream`: where the run's lines go."""
    listed = isinstance(planned, Sequence)
    extra = job.open_extra()
    store.refuse_other_files(job.tables())  # said before a local Ray takes seconds to start
    if executor == "ray" and (force_new or not store.has_manifest()):
        # a new run always has work: reach the cluster before its manifest is written, so that a cluster refusing
        # the client leaves no run
        from sentsim.runtime import init_ray

        init_ray(address)
    # --force-new: the old run is discarded, and the new manifest written, only when the new run goes ahead
    # (store.go_ahead, in `run` below), once its stages and the runs it builds first have been checked: a run
    # refused before then leaves the old one whole. Until then ctx.manifest is the new run's, unwritten.
    manifest = store.open_run(job.stage, fp, job.config(), job.inputs(), job.tables(),
                              planned_units=len(planned) if listed else None, force_new=force_new,
                              unfingerprinted=job.unfingerprinted, defer_clear=force_new,
                              **({"extra": extra} if extra else {}))
    ctx = RunContext(job, fp, store, manifest, executor, address, force_new, quiet, max_units=max_units)
    # the old run's units are none of a --force-new run's, even of the same fingerprint: it starts over
    ctx.done = {} if force_new else store.completed_units(fp, deep=job.deep)
    for u, why in sorted(() if force_new else (getattr(store, "redo_reasons", None) or {}).items()):
        print(f"[{job.stage}] unit {u:05d} will be redone: {why}", file=stream, flush=True)
    plan = planned if isinstance(planned, UnitPlan) else None
    pending = None
    if plan is not None:  # a plan: pending units by number, never a list of unit dicts here
        pending = plan.numbers[~np.isin(plan.numbers, np.fromiter(ctx.done, np.int64, len(ctx.done)))]
    if ctx.done:
        todo = (f", {len(pending)} to do" if pending is not None
                else f", {sum(u['unit'] not in ctx.done for u in planned)} to do" if listed else "")
        print(f"[{job.stage}] resuming {job.out}: {len(ctx.done)} already complete{todo}", file=stream, flush=True)

    stopped = False
    started = False

    def run(window: List[dict]) -> None:
        nonlocal stopped, started
        if not started:  # Ray, the stages and their GPUs only once there is work
            started = True
            if executor == "ray":
                from sentsim.runtime import init_ray

                init_ray(address)
            ctx.specs = job.stages(ctx)
            check_resources(ctx.specs, executor)
            if force_new:
                check_runs_first(job, ctx)
            store.go_ahead()  # the run's refusals are behind it: --force-new discards the old run now
            try:
                job.prepare(ctx)
            except PrerequisiteStopped as stop:
                print(f"[{job.stage}] {stop}", file=stream, flush=True)
                stopped = True
            ctx.progress = Progress(job.stage, len(planned) if listed else None, len(ctx.done), job.count,
                                    stream=stream, gauges=job.gauges, run=job.out, detail=job.detail)
        if stopped:
            return
        try:
            # Ray's memory monitor killing this pass's workers again and again with no unit committed ends the
            # pass with Ray's OutOfMemoryError, which becomes WorkerLost below, instead of retries for ever
            with watch_memory_kills(executor) as kills:
                for r in run_pipeline(window, ctx.specs, executor=executor):
                    kills.committed()  # a result reaches the driver once its unit is committed
                    if store.lease is not None:
                        store.lease.check()  # another writer took the run over (stale lease): stop here, exit 2
                    ctx.note_placement(r)
                    ctx.progress.update(r)
                    if job.on_result(r):
                        stopped = True
        except Exception as exc:
            _raise_if_worker_lost(exc, job.stage, ctx)
            raise

    t0 = time.time()
    window: List[dict] = []
    budget = max_units if max_units is not None else -1
    size = None if listed else max(1, job.window or 1)
    if plan is not None:  # one streamed pass over the pending units (run_pipeline builds them on Ray)
        units = ()
        if budget >= 0:
            pending = pending[:budget]
        if len(pending):
            run(plan.subset(pending))
    for u in units:
        ctx.planned = max(ctx.planned, u["unit"] + 1)  # a stream keeps planning after a stop
        if u["unit"] in ctx.done or stopped or budget == 0:
            continue
        window.append(u)
        budget -= 1
        if size is not None and len(window) >= size:
            run(window)
            window = []
    if window:
        run(window)
    store.go_ahead()  # no unit run (--max-units 0): the new run's manifest all the same, as asked
    if not started and max_units != 0:
        try:
            job.recheck(ctx)
        except PrerequisiteStopped as stop:
            print(f"[{job.stage}] {stop}", file=stream, flush=True)
    ctx.wall = time.time() - t0
    if listed:
        ctx.planned = len(planned)
    if store.lease is not None:
        store.lease.check()  # never finalize a run that another writer now holds
    manifest = store.finalize(ctx.planned, job.summary(ctx))
    return dict(manifest, this_run={"wall_seconds": ctx.wall, "units": ctx.progress.done if ctx.progress else 0,
                                    job.count: ctx.progress.rows if ctx.progress else 0, "actors": ctx.actors})
