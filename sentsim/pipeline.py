"""Stages and the one runner that executes a list of them, on Ray Data or in-process.

A Stage loads its models once in `setup()` and maps a batch of work items to a batch of work
items in `process()`. A pipeline is a plain list of `StageSpec`s: the stage's class, the keyword
arguments it is built with, and its `Resources`, which the job sets from its config
(`StageResources`), one declaration per stage.
`run_pipeline` turns it into chained `map_batches(compute=ActorPoolStrategy(...))` calls with
those resources, or runs the same objects in this process (tests, debugging): stages never
know which.

Work items are dicts. Between Ray actors they travel as one `item` column of serialised
dicts: our own objects, produced and consumed inside this pipeline only.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Type

import numpy as np
from pydantic import Field, model_validator

from sentsim.config import Section

PLACEMENT_KEY = "_placement"  # stage name -> where it ran, stamped on each output item by the runner


class StageResources(Section):
    """One stage's actor resources, as a job's config declares them (`resources.<stage>`).

    Fractional CPUs keep a 2-CPU node from starving Ray Data's reads; fractional GPUs pack
    several actors on one device. max_actors null = as many as the cluster's CPUs/GPUs fit.
    """

    num_cpus: float = Field(0.5, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    # Ray schedules an actor by the memory it reserves, not by what it then uses: a stage that holds a
    # large index (the harvest's contexts stage: ~2.5 GiB on the reference corpus) declares it, so that a
    # node is not packed with more such actors than its memory holds. null = none reserved (Ray's default).
    memory_gb: Optional[float] = Field(None, gt=0)
    min_actors: int = Field(1, ge=1)
    max_actors: Optional[int] = Field(1, ge=1)
    # Work units handed to one call of the stage. A GPU scoring stage needs several: one unit at |C_s| = 16
    # is a few thousand items, too few batches to keep a GPU busy (BENCHMARKS.md, "GPU").
    units_per_call: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self):
        if self.max_actors is not None and self.max_actors < self.min_actors:
            raise ValueError("max_actors must be at least min_actors")
        return self


@dataclass(frozen=True)
class Resources:
    """What one actor of a stage needs, and how many actors the pool may have."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 1  # work items per call
    min_actors: int = 1
    max_actors: Optional[int] = 1  # None: as many as the cluster fits
    memory_bytes: Optional[int] = None  # reserved per actor on Ray; None: none

    def asks(self) -> dict:
        """What one actor asks Ray for, by Ray's resource names (memory in bytes)."""
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, "memory": self.memory_bytes or 0}

    @classmethod
    def of(cls, r: StageResources) -> "Resources":
        memory = int(r.memory_gb * 2**30) if r.memory_gb else None
        return cls(r.num_cpus, r.num_gpus, r.units_per_call, r.min_actors, r.max_actors, memory)


class Stage:
    """Subclass, set `name`, implement `setup` and `process`. Resources come with its StageSpec."""

    name: str = "stage"

    def setup(self) -> None:
        """Load models, indexes, caches: once per actor."""

    def process(self, items: List[dict]) -> List[dict]:
        raise NotImplementedError


@dataclass(frozen=True)
class StageSpec:
    """A stage of a pipeline: its class, the keyword arguments it is built with, and the resources of
    each of its actors. Each Ray actor builds its own instance (`build`), so the arguments travel to
    the actors and the stage's models load there, in `setup`."""

    stage: Type[Stage]
    resources: Resources = Resources()
    args: Mapping[str, Any] = field(default_factory=dict)  # stage(**args)

    @property
    def name(self) -> str:
        return self.stage.name

    def build(self) -> Stage:
        return self.stage(**self.args)


class Shared:
    """A large read-only value that every actor of a stage reads (a pool harvest's sentence vectors), built by
    `load` once per run rather than once per actor. On Ray the runner calls `load` in the driver and puts the
    value in the object store (`in_object_store`); each actor then maps it from its node's store, numpy arrays
    zero-copy and read-only, so a node holds one copy however many actors it runs. In-process, `load` runs at
    the first `get`. A driver that has read the value for itself first hands it over (`hold`) rather than have
    it read again. `load` must be picklable (a module-level function, or a functools.partial of one), and
    the value should be numpy arrays: a dict or a list of str would still be unpickled into every actor."""

    def __init__(self, load: Callable[[], Any]):
        self.load = load
        self.ref = None  # the object-store reference, once put
        self._value: Any = None
        self._loaded = False

    def get(self) -> Any:
        if not self._loaded:
            if self.ref is not None:
                import ray

                self._value = ray.get(self.ref)
            else:
                self._value = self.load()
            self._loaded = True
        return self._value

    def hold(self, value: Any) -> None:
        """Take `value` as what `load` would return, when the driver has just read it for a use of its own (a pool
        harvest's context effect), so that it is not read again: on Ray `in_object_store` puts it, in-process the
        stages `get` it."""
        self._value, self._loaded = value, True

    def in_object_store(self) -> "Shared":
        """A handle to the value put in Ray's object store, loaded for the put (or the value `hold` gave) and
        dropped by this Shared once put: the driver's heap keeps no copy. The put itself copies it into the object
        store of the driver's node (shared memory, which the driver's RSS counts while it has it mapped), and that
        copy, with one on each other node whose actors read it, stays pinned as long as the returned handle lives
        (the pipeline holds it while its actors run, restarts included)."""
        import ray

        out = Shared(self.load)
        value = self._value if self._loaded else self.load()
        self._value, self._loaded = None, False
        out.ref = ray.put(value)
        return out

    def __getstate__(self) -> dict:
        # what travels to an actor is the reference (or the loader), never a value loaded here
        return {"load": self.load, "ref": self.ref, "_value": None, "_loaded": False}


def _shared_in_object_store(stages: Sequence[StageSpec]) -> List[StageSpec]:
    """The stages with each `Shared` argument put in the object store once (a handle shared by several stages
    is put once)."""
    put: Dict[int, Shared] = {}
    out = []
    for spec in stages:
        args = dict(spec.args)
        for k, v in args.items():
            if isinstance(v, Shared):
                if id(v) not in put:
                    put[id(v)] = v.in_object_store()
                args[k] = put[id(v)]
        out.append(StageSpec(spec.stage, spec.resources, args))
    return out


def where_this_runs() -> dict:
    """Where this process runs: its pid, host, Ray node and actor, and the GPUs Ray gave it
    (CUDA_VISIBLE_DEVICES). Stamped on every unit's items, and kept in the unit's marker by the
    stage that writes it, so a run can say which node did each stage of each unit."""
    import socket

    out = {"pid": os.getpid(), "host": socket.gethostname(),
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            out["node"] = ctx.get_node_id()
            out["actor"] = ctx.get_actor_id()
    except Exception:  # placement is a report, never a reason to fail a unit
        pass
    return out


def _run_stage(stage: Stage, items: List[dict], name: str, where: dict) -> List[dict]:
    """`stage.process`, then each output carries where every stage so far ran for its unit
    (a stage may return new dicts, so earlier stamps are carried over by `unit`)."""
    before = {x.get("unit"): x.get(PLACEMENT_KEY) or {} for x in items if isinstance(x, dict)}
    out = stage.process(items)
    for x in out:
        if isinstance(x, dict):
            x[PLACEMENT_KEY] = {**before.get(x.get("unit"), {}), **x.get(PLACEMENT_KEY, {}), name: where}
    return out


class _StageActor:
    """The callable class Ray Data instantiates once per actor."""

    def __init__(self, spec: StageSpec, name: str):
        self.name = name
        self.where = where_this_runs()
        self.stage = spec.build()
        self.setup_error: Optional[Exception] = None
        try:
            self.stage.setup()
        except Exception as exc:
            # raised from the first batch instead: Ray Data takes an error in an actor's constructor for a
            # failure of its own (the actor's death, a full traceback on the console, "please open an
            # issue"), and one in a batch for the stage's, which the command then says in one line (an
            # s3:// input a node cannot open, a model folder it cannot read)
            self.setup_error = exc

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        if self.setup_error is not None:
            raise self.setup_error
        items = [pickle.loads(b) for b in batch["item"]]
        out = _run_stage(self.stage, items, self.name, self.where)
        col = np.empty(len(out), dtype=object)
        col[:] = [pickle.dumps(x, protocol=5) for x in out]
        return {"item": col}


def pool_size(res: Resources) -> tuple[int, int]:
    """(min, max) actors; max None is what the cluster fits, never below min."""
    if res.max_actors is not None:
        return res.min_actors, res.max_actors
    import ray

    have = ray.cluster_resources()
    fits = [int(have.get(k, 0) / need + 1e-9) for k, need in res.asks().items() if need > 0]
    return res.min_actors, max(res.min_actors, min(fits) if fits else res.min_actors)


class UnitPlan(Sequence):
    """Units computed from their number, `make(u) -> dict`: the driver keeps what `make` needs once
    (e.g. the sorted anchor ids) and the numbers of the units to run, never a list of unit dicts.
    On Ray the unit dicts are built inside the pipeline (`_UnitSource`), a few at a time; `make`
    must therefore be picklable (a module-level class instance, not a closure)."""

    def __init__(self, n: int, make: Callable[[int], dict], numbers: Optional[np.ndarray] = None):
        self.n = int(n)
        self.make = make
        self.numbers = np.arange(self.n, dtype=np.int64) if numbers is None else np.asarray(numbers, np.int64)

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.subset(self.numbers[i])
        return self.make(int(self.numbers[i]))

    def __iter__(self):
        for u in self.numbers:
            yield self.make(int(u))

    def subset(self, numbers) -> "UnitPlan":
        """The same plan restricted to these unit numbers (pending ones, a budget)."""
        return UnitPlan(self.n, self.make, np.asarray(numbers, np.int64))


# read tasks of a UnitPlan on Ray: enough for load balancing over many actors, few enough that the
# driver's per-task bookkeeping stays small at a million units
UNIT_READ_TASKS = 4096


def _read_units(make_ref, numbers: np.ndarray):
    """One read task: the unit dicts of `numbers`, built here, one block each (one unit per block
    as with `from_items(override_num_blocks=len(items))`)."""
    import pyarrow as pa
    import ray

    make = ray.get(make_ref)
    for u in numbers:
        yield pa.table({"item": pa.array([pickle.dumps(make(int(u)), protocol=5)], pa.binary())})


def _unit_dataset(plan: UnitPlan):
    """A ray.data dataset of a UnitPlan's pickled units, built in read tasks from the unit numbers."""
    import functools as ft

    import ray
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    make_ref = ray.put(plan.make)  # once in the object store, not once per read task
    numbers = plan.numbers

    class _UnitSource(Datasource):
        def estimate_inmemory_data_size(self):
            return None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            parts = np.array_split(numbers, max(1, min(len(numbers), parallelism)))
            return [ReadTask(ft.partial(_read_units, make_ref, part),
                             BlockMetadata(num_rows=len(part), size_bytes=None, input_files=None, exec_stats=None))
                    for part in parts if len(part)]

    # building a unit dict takes microseconds: read tasks ask for no CPU, so that stage actors holding
    # every CPU of the cluster can never starve them (from_items needed no task at all)
    return ray.data.read_datasource(_UnitSource(), override_num_blocks=max(1, min(len(numbers), UNIT_READ_TASKS)),
                                    num_cpus=0, concurrency=2)


def run_pipeline(items: Sequence[dict], stages: Sequence[StageSpec], executor: str = "ray") -> Iterator[dict]:
    """Yield the last stage's outputs as they complete (streaming; order not guaranteed on Ray)."""
    if executor == "inline":
        built = []
        for spec in stages:
            st = spec.build()
            st.setup()
            built.append((spec.name, st))
        where = where_this_runs()
        per_call = max(spec.resources.batch_size for spec in stages)  # units handed through together
        it = iter(items)
        while batch := list(itertools.islice(it, per_call)):
            for name, st in built:
                batch = _run_stage(st, batch, name, where)
            yield from batch
        return
    import ray
    from ray.data import ActorPoolStrategy

    from sentsim.runtime import no_data_progress_bars

    # our one progress printer (sentsim.executor) speaks for the run; Ray Data's per-dataset INFO
    # lines and progress bars would bury it in a job's log (the dashboard still shows them)
    no_data_progress_bars()
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    if isinstance(items, UnitPlan):  # streamed: unit dicts are built in read tasks, never on the driver
        ds = _unit_dataset(items)
    else:
        col = np.empty(len(items), dtype=object)
        col[:] = [pickle.dumps(x, protocol=5) for x in items]
        ds = ray.data.from_items([{"item": b} for b in col], override_num_blocks=max(1, len(items)))
    for spec in _shared_in_object_store(stages):
        res, name = spec.resources, spec.name
        lo, hi = pool_size(res)
        # One class per stage, so the dashboard and `ray list actors` show MapBatches(ScoringActor) etc.
        actor_cls = type(f"{name.title().replace('_', '')}Actor", (_StageActor,), {})
        ds = ds.map_batches(
            actor_cls,
            fn_constructor_args=(spec, name),
            batch_size=res.batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(min_size=lo, max_size=hi),
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            memory=res.memory_bytes,
            # Ray Data's actor pools default to max_restarts=-1 and max_task_retries=-1: a killed
            # actor is restarted and its in-flight batch retried, so no unit is lost
            # (tests/harvest/test_harvest_ray.py kills one).
        )
    for row in ds.iter_rows():
        yield pickle.loads(row["item"])
