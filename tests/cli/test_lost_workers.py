"""A Ray worker killed by Ray's memory monitor, or dead otherwise, is one line and exit 1, naming the stage and what
to change, never a traceback; the same command then resumes.

The trainer's kill is Ray's own, through the real command: its local Ray starts with RAY_memory_usage_threshold at
1% (any machine running Ray is above it), so the memory monitor kills a worker within its first refresh; Ray Train
restarts none of its actors, so the run fails at the first kill whichever worker Ray chose.

A sharded job's single kill is left to Ray: Ray Data restarts a stage's actors for ever (max_restarts=-1) and Ray
retries a task killed for memory for ever (RAY_task_oom_retries=-1), which is what a passing spike needs. Under a
lasting threshold the same command, through the real command too, ends once Ray has killed its workers
KILLS_WITHOUT_PROGRESS times with no unit committed since the first (sentsim.memory_kills), and then resumes
without the threshold to the rows of an uninterrupted run. The bound's rule is checked on its own, and its line
from Ray's own exception types, built as Ray builds them, with the message Ray gave a harvest's driver (RAY_OOM).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import error_line, sentsim_cli
from harvest_support import build_index_for, harvest_config, tiny_context_bundle

# Ray's settings, read by the raylet of the local Ray the command starts (it inherits the command's env)
MEMORY_KILL = {"RAY_memory_usage_threshold": "0.01", "RAY_memory_monitor_refresh_ms": "50"}


def _one_line(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return error_line(r.stderr)


@pytest.mark.slow
def test_a_training_whose_worker_ray_kills_for_memory_is_one_line_and_resumes(speech_corpus, tmp_path):
    out = tmp_path / "disc"
    # a small model (random word vectors, few held-out windows): the kill is Ray's at the workers' start, whatever
    # they would train
    tiny = ("train.max_steps=20", "model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.batch_size=8", "train.max_heldout_windows=32")
    args = ("train", "discriminator", "--corpus", speech_corpus, "--out", out, *[x for s in tiny for x in ("--set", s)])
    killed = sentsim_cli(*args, env=MEMORY_KILL, timeout=300)
    line = _one_line(killed)
    # Ray's own report of the kill stays, above the line: which worker, the node's memory, its top users
    assert "Ray's report:\n" in killed.stderr and "killed due to the node running low on memory" in killed.stderr
    assert killed.stderr.strip().endswith(line)
    assert line.startswith("sentsim: error: discriminator: Ray killed a worker of the training for memory"), line
    assert "train.batch_size" in line and "train.num_workers" in line, line
    assert line.endswith("run the same command again: it goes on from its last checkpoint"), line
    assert not (out / "model.safetensors").exists()

    r = sentsim_cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (Path(out) / "model.safetensors").exists()


# Ray's own message of a memory kill, as the harvest's driver received it (its object-store and top-users parts cut)
RAY_OOM = """1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 127.0.0.1, ID: \
68c270d4f082be53a0690a82f788f46a942879495de740e6dc65f93f) was 3.83GB used / 23.54GB limit (0.162684)
OOM kill reason: Memory usage 4206714880B exceeded threshold of 1263825536B (5.0% of 25276510208B limit)
Ray killed 1 worker(s) based on the killing policy
Considered workers: [
Selected to kill: (Task: job ID=01000000, lease ID=0100000001000000ffffffffffffffffffffffffffffffffffffffffffffffff, \
task name={task}, required resources={{}}, pid=28106, actual memory used=0.04GB, worker ID=4f3c93fc)
]"""
HARVEST_STAGES = ["contexts", "scoring", "rank", "write"]


def _harvest_resources() -> dict:
    from sentsim.harvest.config import HarvestResources

    return HarvestResources().model_dump()


def test_a_memory_kill_of_a_stage_actor_names_that_stage_and_its_knobs():
    from ray.exceptions import OutOfMemoryError

    from sentsim.lost_workers import lost_worker, sharded_job_line

    lost = lost_worker(OutOfMemoryError(RAY_OOM.format(task="MapWorker(MapBatches(ContextsActor)).__init__")))
    assert lost.memory
    line = sharded_job_line("harvest", lost, HARVEST_STAGES, _harvest_resources())
    assert line == ("harvest: Ray killed a worker of its contexts stage for memory (the node had 3.83GB of 23.54GB "
                    "in use, above Ray's kill threshold of 5.0%, RAY_memory_usage_threshold); reserve memory per actor "
                    "with resources.contexts.memory_gb (Ray then places fewer on a node), or lower "
                    "resources.contexts.max_actors or resources.contexts.units_per_call; then run the same command "
                    "again: it resumes from its last completed unit")


def test_a_memory_kill_of_a_read_task_names_the_stages_that_can_reserve_memory():
    from ray.exceptions import OutOfMemoryError

    from sentsim.lost_workers import lost_worker, sharded_job_line

    line = sharded_job_line("harvest", lost_worker(OutOfMemoryError(RAY_OOM.format(task="Read_UnitSource"))),
                            HARVEST_STAGES, _harvest_resources())
    assert line.startswith("harvest: Ray killed a worker (Read_UnitSource) for memory (the node had 3.83GB"), line
    assert ("resources.<stage>.memory_gb for the stages that hold the most (contexts, scoring, rank, label; " in line
            and line.endswith("it resumes from its last completed unit")), line


def test_an_actor_that_died_is_named_but_one_whose_constructor_raised_is_not_a_lost_worker():
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError, RayTaskError

    from sentsim.lost_workers import lost_worker, sharded_job_line

    ctx = ActorDiedErrorContext(class_name="MapWorker(MapBatches(ScoringActor))", actor_id=b"\x01" * 16, pid=7,
                                error_message="The actor is dead because its worker process has died.")
    lost = lost_worker(ActorDiedError(ctx))
    assert lost is not None and not lost.memory
    line = sharded_job_line("harvest", lost, HARVEST_STAGES, _harvest_resources())
    assert line.startswith("harvest: a worker of its scoring stage died (The actor died unexpectedly"), line
    assert "if its node ran out of memory: reserve memory per actor with resources.scoring.memory_gb" in line, line
    init_failed = ActorDiedError(RayTaskError("f", "Traceback ...", ValueError("bad model folder")))
    assert lost_worker(init_failed) is None
    assert lost_worker(ValueError("not Ray's")) is None


def test_the_executor_raises_worker_lost_naming_the_killed_stage_and_keeps_other_errors():
    from ray.exceptions import OutOfMemoryError

    from sentsim.errors import WorkerLost
    from sentsim.executor import RunContext, _raise_if_worker_lost
    from sentsim.pipeline import Stage, StageSpec

    specs = [StageSpec(type(f"{n.title()}Stage", (Stage,), {"name": n})) for n in HARVEST_STAGES]
    ctx = RunContext(job=None, fp="", store=None, manifest={"config": {"resources": _harvest_resources()}},
                     executor="ray", address=None, force_new=False, quiet=True, specs=specs)
    kill = OutOfMemoryError(RAY_OOM.format(task="MapWorker(MapBatches(ScoringActor)).submit"))
    with pytest.raises(WorkerLost) as lost:
        _raise_if_worker_lost(kill, "harvest", ctx)
    assert lost.value.exit_code == 1 and lost.value.__cause__ is kill
    assert str(lost.value).startswith("harvest: Ray killed a worker of its scoring stage for memory")
    assert "resources.scoring.memory_gb" in str(lost.value)
    _raise_if_worker_lost(ValueError("a bug of the stage"), "harvest", ctx)  # not a lost worker: left to the caller


def test_the_bound_counts_memory_kills_since_the_last_committed_unit():
    from sentsim.memory_kills import KILLS_WITHOUT_PROGRESS, KillBound

    bound = KillBound()
    assert not bound.killed(["a spike's kill"])  # one kill: Ray's retry is worth it
    bound.committed()  # ... and the retried unit completed
    for _ in range(3):  # kills that each let a unit through never add up
        assert not bound.killed(["k"] * (KILLS_WITHOUT_PROGRESS - 1))
        bound.committed()
    assert not bound.killed(["k"] * (KILLS_WITHOUT_PROGRESS - 1))
    assert bound.killed(["k"])  # the tenth with no unit since the first
    assert bound.crossed and len(bound.reports) == KILLS_WITHOUT_PROGRESS
    assert not KillBound(3).killed([]) and KillBound(3).killed(["a", "b", "c"])
    with pytest.raises(ValueError):
        KillBound(0)


def _report(task: str) -> str:
    return RAY_OOM.format(task=task)


class _Kills:
    """A worker table stand-in for the watch's thread: worker id -> report, added to while a pass runs."""

    def __init__(self, before: dict):
        self.table, self.lock = dict(before), threading.Lock()

    def add(self, n: int, task: str) -> None:
        with self.lock:
            for _ in range(n):
                self.table[f"w{len(self.table)}"] = _report(task)

    def __call__(self) -> dict:
        with self.lock:
            return dict(self.table)


def _pass(watch, results, kills, per_result):
    """A pass of the pipeline as the executor runs it: each result arrives after Ray killed workers, once the
    watch has seen those kills (a kill it read only after the commit would count towards the next unit);
    Ray Data's driver loop waits in short sleeps, where the watch's exception would land."""
    got = []
    with watch:
        for r in results:
            kills.add(*per_result)
            deadline = time.time() + 120
            while len(watch.bound.reports) < per_result[0] and time.time() < deadline:
                time.sleep(0.01)
            watch.committed()
            got.append(r)
    return got


def test_the_watch_ends_a_pass_that_kills_make_no_progress_with_rays_memory_error():
    from ray.exceptions import OutOfMemoryError

    from sentsim.lost_workers import lost_worker, sharded_job_line
    from sentsim.memory_kills import MemoryKillWatch

    # kills before the pass (an earlier pass of the same job) are not counted
    kills = _Kills({f"old{i}": _report("Read_UnitSource") for i in range(20)})
    watch = MemoryKillWatch(kills, limit=3, poll_seconds=0.05)
    with pytest.raises(OutOfMemoryError) as stopped:
        with watch:
            kills.add(1, "MapWorker(MapBatches(ScoringActor)).__init__")
            kills.add(2, "Read_UnitSource")
            deadline = time.time() + 120
            while time.time() < deadline:  # Ray Data's wait for a result that never comes
                time.sleep(0.01)
    assert time.time() < deadline
    lost = lost_worker(stopped.value)
    assert lost.memory and lost.kills == 3 and lost.names_a_stage  # the stage's kill is the one reported
    line = sharded_job_line("harvest", lost, HARVEST_STAGES, _harvest_resources())
    assert line.startswith("harvest: Ray killed a worker of its scoring stage for memory (the node had 3.83GB"), line
    assert ", the last of 3 kills with no unit completed since the first; reserve memory per actor" in line, line
    assert not watch._thread.is_alive()


def test_the_watch_leaves_a_pass_alone_while_units_complete_between_kills():
    from sentsim.memory_kills import MemoryKillWatch

    kills = _Kills({})
    watch = MemoryKillWatch(kills, limit=3, poll_seconds=0.05)
    # two kills per unit: more than the bound in all, never as many as it between two committed units
    assert _pass(watch, range(4), kills, (2, "MapWorker(MapBatches(ContextsActor)).submit")) == [0, 1, 2, 3]
    assert len(kills()) == 8 and not watch._thread.is_alive()
    time.sleep(0.2)  # nothing is delivered after the pass either


@pytest.mark.slow
def test_a_harvest_ray_keeps_killing_for_memory_ends_in_one_line_and_the_same_command_resumes(speech_corpus,
                                                                                                  tmp_path):
    from sentsim.harvest.job import harvest
    from sentsim.memory_kills import KILLS_WITHOUT_PROGRESS
    from storage import RunReader, verify_store

    index = build_index_for(speech_corpus, tmp_path / "index")
    bundle = tiny_context_bundle(speech_corpus, tmp_path / "ctx")
    reference = tmp_path / "reference"
    harvest(harvest_config(speech_corpus, index, bundle, reference), executor="inline", quiet=True)
    out = tmp_path / "run"
    config = tmp_path / "harvest.yaml"
    config.write_text(yaml.safe_dump(harvest_config(speech_corpus, index, bundle, out).model_dump()))

    # under a lasting threshold every worker is killed again soon after Ray restarts it: without the bound the
    # command would never end. It ends after ten restarts, half a minute here when the machine is idle; the
    # timeout only fails the test rather than hang it, with room for a machine busy with other Ray clusters
    killed = sentsim_cli("harvest", "--config", config, env=MEMORY_KILL, timeout=420)
    line = _one_line(killed)
    assert "Ray's report:\n" in killed.stderr and "killed due to the node running low on memory" in killed.stderr
    assert line.startswith("sentsim: error: harvest: Ray killed a worker"), line
    # the watch reads Ray's worker table every few seconds: it may find more kills than the bound at once
    repeated = re.search(r", the last of (\d+) kills with no unit completed since the first; ", line)
    assert repeated and int(repeated.group(1)) >= KILLS_WITHOUT_PROGRESS, line
    assert "memory_gb" in line and "max_actors" in line and "units_per_call" in line, line
    assert line.endswith("then run the same command again: it resumes from its last completed unit"), line
    # whatever it committed before is whole, and the run is left to be resumed
    assert [p for p in verify_store(str(out)) if not p.startswith("run incomplete: ")] == []

    r = sentsim_cli("harvest", "--config", config, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert verify_store(str(out)) == []
    for t, key in (("pairs", "pair_id"), ("sentences", "sentence_id")):
        got, want = (RunReader(str(run)).read_table(t).sort_by(key) for run in (out, reference))
        assert got.equals(want), t


# what a `ray job submit` job's driver reads: the same reader as the watch's, and the table it filters, which
# holds a worker's job once the worker has exited (here an actor the job kills)
_JOB_READS_KILLS = """
import time
import ray
from ray._private.state import state
from ray.core.generated import gcs_pb2
from sentsim.memory_kills import job_memory_kills
from sentsim.runtime import init_ray

init_ray()
actor = ray.remote(num_cpus=0)(type("Probe", (), {"ping": lambda self: 1})).remote()
ray.get(actor.ping.remote())
ray.kill(actor)
job = bytes.fromhex(ray.get_runtime_context().get_job_id())
deadline = time.time() + 120
while time.time() < deadline:
    ended = [w for w in map(gcs_pb2.WorkerTableData.FromString, state._connect_and_get_accessor().get_worker_table())
             if w.job_id == job and not w.is_alive]
    if ended:
        break
    time.sleep(0.5)
print("memory kills", len(job_memory_kills()()), "ended workers of this job", len(ended))
"""


@pytest.mark.slow
def test_a_job_submitted_to_a_token_auth_cluster_reads_its_workers_memory_kills(ray_head):
    """The watch reads the GCS's worker table through the driver's own GCS client: on a `ray start` cluster
    with token auth, from a `ray job submit` job, it answers (the watch would otherwise be silently off) and
    holds the job's own workers under the job's id."""
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", ray_head["address"],
                        "--working-dir", ".", "--", "python", "-c", _JOB_READS_KILLS],
                       env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = re.search(r"memory kills (\d+) ended workers of this job (\d+)", r.stdout)
    assert found and found.group(1) == "0" and int(found.group(2)) >= 1, r.stdout[-3000:]
