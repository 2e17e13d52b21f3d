"""The harvest on real Ray: killed driver, killed scoring actor, lost node, and `ray job submit`.

Each run must end with exactly the rows of an uninterrupted run with the same seed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, assert_loopback_only, with_children
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


def test_node_removed_mid_run(setup, tmp_path, monkeypatch):
    """Two raylets on this machine, both on 127.0.0.1; the second one is removed while units are in
    flight, after it has done work: the run's placement records (every stage's actor, node
    included) show a unit's stage on the removed node, and the result is still exactly the rows
    of an uninterrupted run."""
    import ray
    from ray.cluster_utils import Cluster

    from sentsim import executor
    from sentsim.harvest.job import harvest
    from sentsim.runtime import loopback_only

    # when the removed node has done work is seen as it happens, through the run's own placement
    # records (RunContext.note_placement, unchanged: this only watches what it records)
    seen: list = []
    note = executor.RunContext.note_placement

    def watch(ctx, result):
        seen.extend((result.get(executor.PLACEMENT_KEY) or {}).values())
        note(ctx, result)

    monkeypatch.setattr(executor.RunContext, "note_placement", watch)
    with loopback_only():  # the nodes' processes inherit it; ray.init needs it to attach to 127.0.0.1
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                                "node_ip_address": "127.0.0.1"})
        worker = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
    head_id, worker_id = cluster.head_node.node_id, worker.node_id  # (shutdown forgets the nodes)
    out = tmp_path / "node"
    cfg, _ = setup["config"](out)
    try:
        with loopback_only():
            ray.init(address=cluster.address)
        result = {}
        t = threading.Thread(target=lambda: result.update(m=harvest(cfg, executor="ray", quiet=True)))
        t.start()
        deadline = time.time() + 300
        while not any(w.get("node") == worker_id for w in seen) and t.is_alive() and time.time() < deadline:
            time.sleep(0.05)
        done_at_removal = _markers(out)
        assert t.is_alive() and done_at_removal < 6, f"the run ended before the node was removed ({seen})"
        # neither node listens beyond loopback (their actors and workers included)
        pids = [p.process.pid for node in (cluster.head_node, worker)
                for procs in node.all_processes.values() for p in procs]
        assert_loopback_only(with_children(*pids))
        cluster.remove_node(worker)
        t.join(600)
        assert result["m"]["complete"]
        assert len(ray.nodes()) == 2 and sum(n["Alive"] for n in ray.nodes()) == 1
    finally:
        ray.shutdown()
        cluster.shutdown()
    # the run's own record of where its stages ran (the manifest harvest returned) names the removed node
    placements = [w for stage in result["m"]["this_run"]["actors"].values() for w in stage]
    on_removed = [w for w in placements if w.get("node") == worker_id]
    assert on_removed, f"no stage ran on the removed node {worker_id}: {placements}"
    assert any(w.get("node") == head_id for w in placements)  # and the rest on the head
    assert pairs_of(out) == setup["reference"]


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
