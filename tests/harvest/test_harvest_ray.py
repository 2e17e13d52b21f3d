"""The harvest on real Ray: killed driver, killed scoring actor, a killed and rejoined worker node,
and `ray job submit`.

Each run must end with exactly the rows of an uninterrupted run with the same seed.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, alive_nodes, assert_loopback_only, kill_node, start_worker, stop_head, with_children
from harvest_support import build_index_for, harvest_config, tiny_context_bundle

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


SORT = {"pairs": [("pair_id", "ascending")], "sentences": [("sentence_id", "ascending")],
        "context_scores": [("sentence_id", "ascending"), ("context_id", "ascending")]}


def pairs_of(run):
    """Every table of a run, side tables included, read through its markers and sorted: a resumed
    run must equal an uninterrupted one in all of them, not only in `pairs`."""
    from storage import RunReader

    r = RunReader(str(run))
    out = {t: r.read_table(t).sort_by(SORT[t]) for t in SORT}
    out.update({f"_side/{name}": r.side_table(name) for name in ("rank_anchors",) if r.side_table(name) is not None})
    return out


@pytest.fixture(scope="module")
def setup(speech_corpus, tmp_path_factory):
    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("hray")
    index = build_index_for(speech_corpus, root / "index")
    bundle = tiny_context_bundle(speech_corpus, root / "ctx")
    # 6 units, no rank targets (covered elsewhere) so that each run is dominated by scoring
    over = dict(anchors={"n": 12, "per_unit": 2}, rank={"enabled": False})
    reference = root / "reference"
    harvest(harvest_config(speech_corpus, index, bundle, reference, **over), executor="inline", quiet=True)

    def config(out, **more):
        cfg = harvest_config(speech_corpus, index, bundle, out, **{**over, **more})
        path = Path(str(out) + ".yaml")
        path.write_text(yaml.safe_dump(cfg.model_dump()))
        return cfg, path

    return {"reference": pairs_of(reference), "config": config, "root": root}


@pytest.fixture(scope="module")
def head(ray_head):
    """The session's `ray start` head (conftest): 127.0.0.1 only, token auth on."""
    return ray_head


def _markers(out: Path) -> int:
    d = out / "_units"
    return len(list(d.glob("*.json"))) if d.is_dir() else 0


def test_sigkill_driver_then_resume(setup, head, tmp_path):
    out = tmp_path / "killed"
    _, cfg_path = setup["config"](out)
    cmd = [str(BIN / "sentsim"), "harvest", "--config", str(cfg_path), "--address", head["gcs"]]
    proc = subprocess.Popen(cmd, env=head["env"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while _markers(out) < 2:
        assert proc.poll() is None and time.time() < deadline, "harvest ended before it could be killed"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert _markers(out) < 6
    r = subprocess.run(cmd, env=head["env"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert pairs_of(out) == setup["reference"]
    from storage import verify_store

    assert verify_store(str(out)) == []


def test_killed_scoring_actor_is_restarted_and_its_unit_redone(setup, head, tmp_path):
    """The scoring actor's process is SIGKILLed mid-run (what `ray.kill` or a crash does to it);
    Ray restarts the actor and retries its in-flight batch."""
    import ray
    from ray.util.state import list_actors

    from sentsim.harvest.job import harvest
    from sentsim.runtime import loopback_only

    out = tmp_path / "actor"
    cfg, _ = setup["config"](out)
    with loopback_only():  # else Ray resolves 127.0.0.1 to this machine's routable IP, where nothing listens
        ray.init(address=head["gcs"])
    try:
        result = {}
        t = threading.Thread(target=lambda: result.update(m=harvest(cfg, executor="ray", quiet=True)))
        t.start()
        killed = None
        deadline = time.time() + 300
        while killed is None and time.time() < deadline and t.is_alive():
            # the head's own dashboard: left to itself the state API picks the newest local
            # cluster, which is someone else's when another Ray runs on this machine
            for a in list_actors(address=head["address"], filters=[("state", "=", "ALIVE")]):
                if "ScoringActor" in a.class_name and _markers(out) >= 1:
                    os.kill(a.pid, signal.SIGKILL)
                    killed = a.pid
                    break
            time.sleep(0.2)
        t.join(600)
        assert killed is not None, "no scoring actor found to kill"
        assert result["m"]["complete"]
    finally:
        ray.shutdown()
    assert _markers(out) == 6
    assert pairs_of(out) == setup["reference"]


def _scored_on(out: Path) -> set:
    """The Ray nodes that scored this run's committed units, from the units' own markers."""
    nodes = set()
    for f in (out / "_units").glob("*.json") if (out / "_units").is_dir() else ():
        try:
            nodes.add(json.loads(f.read_text())["extra"]["placement"]["scoring"]["node"])
        except (ValueError, KeyError):  # another run's marker, or one from before placement was kept
            pass
    return nodes


def test_worker_node_killed_mid_job_then_rejoins(setup, head, tmp_path):
    """A head and two worker nodes, each a separate `ray start` on 127.0.0.1, the workers with one
    logical GPU each; a harvest submitted with `ray job submit` that scores on GPUs only. As soon
    as a committed unit says which worker scored it, that worker is killed (its raylet and every
    process under it) and then started again, rejoining as a new node. The job still succeeds
    with exactly the rows of an uninterrupted run, and its report says which node ran each stage
    of each unit."""
    from ray.job_submission import JobStatus, JobSubmissionClient
    short = Path(tempfile.mkdtemp(prefix="mn-"))  # Ray's unix sockets live under it: 107 bytes at most
    nodes = []  # joined to the session's head (2 CPUs, no GPU); stopped at the end, they stay listed as dead
    try:
        for name in ("a", "b"):
            nodes.append(start_worker(head, short / name, num_gpus=1))
        assert_loopback_only(with_children(head["proc"].pid, *(n["proc"].pid for n in nodes)), servers=("raylet",))
        out = tmp_path / "job"
        _, cfg_path = setup["config"](out, resources={
            "contexts": {"num_cpus": 0.25}, "rank": {"num_cpus": 0.25},
            "scoring": {"num_cpus": 0.25, "num_gpus": 1, "min_actors": 2, "max_actors": 2}})
        sid = f"harvest-{uuid.uuid4().hex[:8]}"
        r = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--no-wait", "--address", head["address"], "--submission-id", sid,
             "--working-dir", ".", "--", "python", "jobs/harvest_pairs.py", "--config", str(cfg_path)],
            env=head["env"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        client = JobSubmissionClient(head["address"])
        final = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
        deadline = time.time() + 400
        while not _scored_on(out):
            assert client.get_job_status(sid) not in final and time.time() < deadline, client.get_job_logs(sid)[-3000:]
            time.sleep(0.1)
        at_kill = _markers(out)
        victim = next(n for n in nodes if n["node"] in _scored_on(out))
        kill_node(victim)
        nodes.append(start_worker(head, short / "again", num_gpus=1))
        while client.get_job_status(sid) not in final:
            assert time.time() < deadline + 400, "the job did not finish after the node came back"
            time.sleep(1)
        logs = client.get_job_logs(sid)
        assert client.get_job_status(sid) == JobStatus.SUCCEEDED, logs[-3000:]
    finally:
        for node in nodes:
            stop_head(node)
        shutil.rmtree(short, ignore_errors=True)
        # the later tests share this head: wait until it no longer counts these nodes' resources
        ours = {n["node"] for n in nodes}
        gone_by = time.time() + 90
        while time.time() < gone_by and alive_nodes(head) & ours:
            time.sleep(1)
    assert at_kill < 6, "the run had ended before the node was killed"
    assert pairs_of(out) == setup["reference"]
    # where each stage ran, per unit, as the report sums the markers; scoring never on the head (no GPU)
    placement = json.loads((out / "report.json").read_text())["placement"]
    assert victim["node"] in placement["scoring"] and set(placement["scoring"]) <= ours
    assert sum(placement["scoring"].values()) == 6 and sum(placement["contexts"].values()) == 6
    assert f"{victim['node'][:8]} x" in logs and "units per node: " in logs
    print(f"killed at {at_kill}/6 units; scoring units per node {placement['scoring']}; killed "
          f"{victim['node'][:8]}, rejoined as {nodes[-1]['node'][:8]}")


def test_ray_job_submit_harvest(setup, head, tmp_path):
    out = tmp_path / "job"
    _, cfg_path = setup["config"](out)
    sid = f"harvest-{uuid.uuid4().hex[:8]}"
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", head["address"], "--submission-id", sid, "--working-dir", ".",
         "--", "python", "jobs/harvest_pairs.py", "--config", str(cfg_path)],
        env=head["env"], cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from ray.job_submission import JobStatus, JobSubmissionClient

    assert JobSubmissionClient(head["address"]).get_job_status(sid) == JobStatus.SUCCEEDED
    assert re.search(r"harvest: \d+ pairs", r.stdout)
    assert pairs_of(out) == setup["reference"]
    assert json.loads((out / "report.json").read_text())["complete"]
    # live progress reaches the cluster's metrics (the dashboard's Metrics view, Prometheus)
    planned = json.loads((out / "manifest.json").read_text())["planned_units"]
    assert _gauge(head["metrics"], "sentsim_harvest_units_done", str(out)) == planned


def _gauge(url: str, name: str, run: str, wait: float = 60.0):
    """The value of an application gauge for one run, as the node's metrics agent exports it."""
    import urllib.request

    pat = re.compile(rf'^ray_{name}\{{[^}}]*run="{re.escape(run)}"[^}}]*\}} (\S+)$', re.M)
    deadline = time.time() + wait
    while True:
        m = pat.search(urllib.request.urlopen(url, timeout=10).read().decode())
        if m or time.time() > deadline:
            return float(m.group(1)) if m else None
        time.sleep(2)
