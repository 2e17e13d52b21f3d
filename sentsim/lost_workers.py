"""A Ray worker killed for memory, or dead otherwise, as one line that says what to change.

Ray's memory monitor kills a task or actor when its node is above RAY_memory_usage_threshold (95% of the
node's memory by default) and reports it as `ray.exceptions.OutOfMemoryError`, a whole memory report in its
message; a worker that died otherwise (the kernel's OOM killer, a segfault, a lost node) arrives as
`ActorDiedError`, `WorkerCrashedError` or `NodeDiedError`, wrapped by Ray Data and Ray Train in their own
errors or, from Train's workers, as text only. Neither is a bug of the run: the machine ran short, or a
process was killed. `lost_worker` finds such an error in what a run raised; the sharded executor and the
trainers turn it into `WorkerLost`, naming the stage and its knobs, and the CLI prints that as one line.
A sharded job that Ray keeps killing without progress is stopped by sentsim.memory_kills with Ray's
`OutOfMemoryError` of its last kill, which counts the kills (`kills`): its line says they were repeated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from sentsim.errors import WorkerLost

__all__ = ["LostWorker", "WorkerLost", "error_chain", "lost_worker", "memory_kill", "sharded_job_line",
           "trainer_line"]

# what Ray's memory monitor writes into the error of each task or actor it kills
_MEMORY_TEXT = re.compile(r"killed due to the node running low on memory")
_USED = re.compile(r"was ([\d.]+\s*[KMGT]?B) used / ([\d.]+\s*[KMGT]?B) limit")
_THRESHOLD = re.compile(r"exceeded threshold of \d+B \(([\d.]+%) of")
_TASK_NAME = re.compile(r"task name=([^,\n]+)")
_CLASS_NAME = re.compile(r"class_name: ([^\n]+)")
# the class of a stage's actor as sentsim.pipeline.run_pipeline names it, as Ray Data wraps it
_STAGE_ACTOR = re.compile(r"MapBatches\((\w+?)Actor\)")
# Ray Train reports a worker's failure as text: the type names Ray gave it
_DIED_TEXT = re.compile(r"\b(ActorDiedError|WorkerCrashedError|NodeDiedError|LocalRayletDiedError)\b"
                        r"|The actor died unexpectedly|The worker died unexpectedly")


@dataclass(frozen=True)
class LostWorker:
    memory: bool  # killed by Ray's memory monitor; False: died otherwise
    text: str  # Ray's message
    worker: Optional[str]  # the task or actor class Ray names, e.g. "MapWorker(MapBatches(ContextsActor)).__init__"
    kills: int = 1  # memory kills with no unit committed since the first (sentsim.memory_kills), this one the last

    @property
    def names_a_stage(self) -> bool:
        """Whether Ray names an actor of a pipeline's stage (not a read task, nor one of Ray Data's own actors)."""
        return _STAGE_ACTOR.search(self.worker or self.text) is not None

    def stage(self, names: Iterable[str]) -> Optional[str]:
        """Which of the pipeline's stage names the worker was an actor of (None: another worker, a read task)."""
        m = _STAGE_ACTOR.search(self.worker or self.text)
        if m is None:
            return None
        return next((n for n in names if n.title().replace("_", "") == m.group(1)), None)

    def why(self) -> str:
        """'(the node had 3.8GB of 23.5GB in use, above Ray's kill threshold of 5.0%, ...)' for a memory kill,
        '(Ray's first line)' for a death."""
        if not self.memory:
            first = next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "no reason given")
            return f"({first.rstrip('.')})"
        used, threshold = _USED.search(self.text), _THRESHOLD.search(self.text)
        node = f"the node had {used.group(1)} of {used.group(2)} in use" if used else "the node was short of memory"
        limit = f"Ray's kill threshold of {threshold.group(1)}" if threshold else "Ray's kill threshold"
        return f"({node}, above {limit}, RAY_memory_usage_threshold)"


def error_chain(exc: BaseException):
    """The error, the errors it wraps (`cause`: Ray's task errors; Train's per-worker failures), and their
    causes and contexts."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        cause = getattr(e, "cause", None)
        todo += [cause if isinstance(cause, BaseException) else None, e.__cause__, e.__context__]
        failures = getattr(e, "worker_failures", None)  # Ray Train's WorkerGroupError: rank -> exception
        if isinstance(failures, dict):
            todo += [f for f in failures.values() if isinstance(f, BaseException)]


def lost_worker(exc: BaseException) -> Optional[LostWorker]:
    """The worker loss `exc` reports, by Ray's error types or, where only text survives, by Ray's words."""
    try:
        from ray.exceptions import (
            ActorDiedError,
            LocalRayletDiedError,
            NodeDiedError,
            OutOfMemoryError,
            WorkerCrashedError,
        )
    except ImportError:
        return None
    died = None
    for e in error_chain(exc):
        if isinstance(e, OutOfMemoryError) or (isinstance(e, Exception) and _MEMORY_TEXT.search(str(e))):
            return _found(True, str(e), getattr(e, "kills", 1))
        if died is None and isinstance(e, (WorkerCrashedError, NodeDiedError, LocalRayletDiedError)):
            died = e
        # an actor whose constructor raised is its code's error, not a lost process
        if died is None and isinstance(e, ActorDiedError) and not e.actor_init_failed:
            died = e
    if died is not None:
        return _found(False, str(died))
    text = str(exc)
    if _DIED_TEXT.search(text) and "raised in its creation task" not in text:
        return _found(False, text[_DIED_TEXT.search(text).start():])
    return None


def _found(memory: bool, text: str, kills: int = 1) -> LostWorker:
    m = _TASK_NAME.search(text) or _CLASS_NAME.search(text)
    return LostWorker(memory, text, m.group(1).strip() if m else None, kills)


def memory_kill(report: str) -> LostWorker:
    """The kill Ray's memory monitor reports in `report` (a worker's exit detail, as the GCS keeps it)."""
    return _found(True, report)


_RESUME = "then run the same command again: it resumes from its last completed unit"


def sharded_job_line(job_stage: str, lost: LostWorker, stages: Sequence[str], resources: dict) -> str:
    """The line of a sharded job (harvest, corpus build, ...): which stage's worker, what to change in its
    resources, and that the same command resumes. `stages`: the pipeline's stage names; `resources`: the
    job's `resources` config as stored in its manifest (one section per stage, or one for every stage)."""
    stage = lost.stage(stages)
    if stage is not None:
        who = f"a worker of its {stage} stage"
    else:
        who = f"a worker ({lost.worker})" if lost.worker else "a worker"
    if "memory_gb" in resources:  # one section for all its stages (remix)
        knobs = ["resources"]
    else:
        sections = [k for k, v in resources.items() if isinstance(v, dict)]
        knobs = [f"resources.{stage}"] if stage in sections else [f"resources.{k}" for k in sections]
    if not knobs:
        change = "give Ray's nodes more memory, or run fewer jobs on them at once"
    elif len(knobs) == 1:
        k = knobs[0]
        change = (f"reserve memory per actor with {k}.memory_gb (Ray then places fewer on a node), or lower "
                  f"{k}.max_actors or {k}.units_per_call")
    else:
        each = ", ".join(k.split(".", 1)[1] for k in knobs)
        change = ("reserve memory per actor with resources.<stage>.memory_gb for the stages that hold the most "
                  f"({each}; Ray then places fewer on a node), or lower their max_actors or units_per_call")
    if lost.memory:
        # repeated kills: the run was stopped rather than left to Ray's retries for ever (sentsim.memory_kills)
        repeated = f", the last of {lost.kills} kills with no unit completed since the first" if lost.kills > 1 else ""
        return f"{job_stage}: Ray killed {who} for memory {lost.why()}{repeated}; {change}; {_RESUME}"
    return f"{job_stage}: {who} died {lost.why()}; {_RESUME} (if its node ran out of memory: {change})"


def trainer_line(label: str, lost: LostWorker, knobs: str) -> str:
    """The line of a trainer: `knobs` says its own settings that lower a worker's memory."""
    resume = "then run the same command again: it goes on from its last checkpoint"
    if lost.memory:
        return f"{label}: Ray killed a worker of the training for memory {lost.why()}; {knobs}; {resume}"
    return f"{label}: a worker of the training died {lost.why()}; {resume} (if its node ran out of memory: {knobs})"
