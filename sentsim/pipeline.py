"""Stages and the one runner that executes a list of them, on Ray Data or in-process.

A Stage declares its resources next to its code (NeMo Curator style), loads its models once in
`setup()`, and maps a batch of work items to a batch of work items in `process()`. A pipeline
is a plain list of stages. `run_pipeline` turns it into chained
`map_batches(compute=ActorPoolStrategy(...))` calls with those resources, or runs the same
objects in this process (tests, debugging): stages never know which.

Work items are dicts. Between Ray actors they travel as one `item` column of serialised
dicts: our own objects, produced and consumed inside this pipeline only.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Resources:
    """What one actor of a stage needs. Fractional CPUs keep a 2-CPU box from starving read tasks."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 1  # work items per call
    min_actors: int = 1
    max_actors: int = 1


class Stage:
    """Subclass, set `resources`, implement `setup` and `process`."""

    name: str = "stage"
    resources: Resources = Resources()

    def setup(self) -> None:
        """Load models, indexes, caches: once per actor."""

    def process(self, items: List[dict]) -> List[dict]:
        raise NotImplementedError


class _StageActor:
    """The callable class Ray Data instantiates once per actor."""

    def __init__(self, factory: Callable[[], Stage]):
        self.stage = factory()
        self.stage.setup()

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        items = [pickle.loads(b) for b in batch["item"]]
        out = self.stage.process(items)
        col = np.empty(len(out), dtype=object)
        col[:] = [pickle.dumps(x, protocol=5) for x in out]
        return {"item": col}


def run_pipeline(
    items: Sequence[dict],
    stages: Sequence[Callable[[], Stage]],
    executor: str = "ray",
    scale: Optional[Dict[str, Resources]] = None,
) -> Iterator[dict]:
    """Yield the last stage's outputs as they complete (streaming; order not guaranteed on Ray).

    `stages` are zero-argument factories (a class, or functools.partial of one), so that each Ray
    actor builds its own instance. `scale` overrides a stage's resources by its `name`.
    """
    if executor == "inline":
        built = []
        for factory in stages:
            st = factory()
            st.setup()
            built.append(st)
        for item in items:
            batch = [item]
            for st in built:
                batch = st.process(batch)
            yield from batch
        return
    import ray
    from ray.data import ActorPoolStrategy

    col = np.empty(len(items), dtype=object)
    col[:] = [pickle.dumps(x, protocol=5) for x in items]
    ds = ray.data.from_items([{"item": b} for b in col], override_num_blocks=max(1, len(items)))
    for factory in stages:
        proto = factory if isinstance(factory, type) else getattr(factory, "func", factory)
        name = getattr(proto, "name", "stage")
        res = (scale or {}).get(name, getattr(proto, "resources", Resources()))
        # One class per stage, so the dashboard and `ray list actors` show MapBatches(ScoringActor) etc.
        actor_cls = type(f"{name.title().replace('_', '')}Actor", (_StageActor,), {})
        ds = ds.map_batches(
            actor_cls,
            fn_constructor_args=(factory,),
            batch_size=res.batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(min_size=res.min_actors, max_size=res.max_actors),
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            # Ray Data's actor pools default to max_restarts=-1 and max_task_retries=-1: a killed
            # actor is restarted and its in-flight batch retried, so no unit is lost
            # (tests/test_harvest_ray.py kills one).
        )
    for row in ds.iter_rows():
        yield pickle.loads(row["item"])
