"""Real Ray: a SIGKILLed build resumed to the exact dataset, and `ray job submit` to a `ray start` cluster."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from conftest import ROOT, free_port, sentsim_cli

from storage import verify_store

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def table(run, name):
    key = "sentence_id" if name == "sentences" else "chunk_id"
    return ds.dataset(str(Path(run) / name)).to_table().sort_by(key)


def test_sigkill_midway_then_rerun_gives_the_uninterrupted_dataset(tmp_path, sample_path, speech_corpus):
    out = tmp_path / "killed"
    cmd = [str(BIN / "sentsim"), "corpus", "build", str(sample_path), "--out", str(out),
           "--set", "docs_per_unit=1", "--set", "max_in_flight=1"]
    env = dict(os.environ)  # with the session's token (conftest): the local Ray runs with auth
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    units = out / "_units"
    deadline = time.time() + 240
    while time.time() < deadline:
        if units.is_dir() and len(list(units.glob("*.json"))) >= 3:
            break
        assert proc.poll() is None, "build ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started, all at once
    proc.wait(30)
    done_at_kill = len(list(units.glob("*.json")))
    assert 3 <= done_at_kill < 20, done_at_kill
    assert not (out / "_COMPLETE").exists()
    assert verify_store(str(out))  # incomplete: verify says so

    r = sentsim_cli(*cmd[1:], env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    # Units finished before the kill are not redone (a worker may have finished one more
    # unit in the instant between the kill and our count: it is complete, so it is skipped too).
    import re

    skipped = {int(x) for x in re.findall(r"(\d+) already complete", r.stderr)}
    assert len(skipped) == 1 and done_at_kill <= skipped.pop() < 20
    assert verify_store(str(out)) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["completed_units"] == 20 and manifest["complete"]
    # Same rows and ids as an uninterrupted run (built with other unit sizes, even).
    assert table(out, "sentences").equals(table(speech_corpus, "sentences"))
    assert table(out, "chunks").equals(table(speech_corpus, "chunks"))


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """`ray start --head` as a user would, from this venv (a job's python comes from ray start's PATH).

    `--block` keeps the head in its own process group, so teardown stops exactly this cluster
    (`ray stop` would stop every Ray cluster of the user on this machine).
    """
    head = start_head(tmp_path_factory.mktemp("ray"))
    yield head
    stop_head(head)


def start_head(tmp, num_cpus=2):
    """Start a head; a start that fails (a port taken meanwhile, a dashboard that died) is retried once."""
    try:
        return _start_head_once(Path(tmp) / "a", num_cpus)
    except RuntimeError as first:
        print(f"first ray head failed, retrying with other ports: {first}", file=sys.stderr)
        return _start_head_once(Path(tmp) / "b", num_cpus)


def _start_head_once(tmp, num_cpus):
    tmp.mkdir(parents=True, exist_ok=True)
    port, dash, metrics = free_port(), free_port(), free_port()
    # Every fixed-default port gets a free one too, so that a Ray already running on this machine
    # (a developer's, or a local `ray.init()`) cannot make the head fail to bind.
    more = {flag: free_port() for flag in ("object-manager-port", "node-manager-port", "ray-client-server-port",
                                           "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                           "runtime-env-agent-port")}
    # RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH come from conftest: the head, its jobs and every
    # client given this env share the session's token.
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    assert env.get("RAY_AUTH_MODE") == "token" and env.get("RAY_AUTH_TOKEN_PATH")
    log = open(Path(tmp) / "ray_start.log", "wb")
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--num-cpus={num_cpus}", f"--port={port}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--include-dashboard=true",
         f"--metrics-export-port={metrics}", *(f"--{k}={v}" for k, v in more.items()),
         f"--temp-dir={tmp}", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()  # the child keeps its own descriptor
    address = f"http://127.0.0.1:{dash}"
    from ray.job_submission import JobStatus, JobSubmissionClient

    # The head answers before its job agent is ready ("No available agent to submit job"):
    # wait until a trivial job has run end to end.
    deadline = time.time() + 240
    while True:
        try:
            client = JobSubmissionClient(address)
            sid = client.submit_job(entrypoint="python -c pass")
            while client.get_job_status(sid) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                time.sleep(0.5)
            break
        except Exception:
            if time.time() > deadline or proc.poll() is not None:
                stop_head({"proc": proc})
                raise RuntimeError("ray head did not come up; " + _head_logs(tmp)) from None
            time.sleep(1)
    return {"env": env, "address": address, "gcs": f"127.0.0.1:{port}", "proc": proc,
            "metrics": f"http://127.0.0.1:{metrics}/metrics"}


def _head_logs(tmp, chars=1500):
    """The tails of `ray start`'s output and of the dashboard's log, which say why a head is not up."""
    parts = []
    for name in ("ray_start.log", "session_latest/logs/dashboard.log"):
        path = Path(tmp) / name
        if path.is_file():
            parts.append(f"--- {name}:\n" + path.read_text(errors="replace")[-chars:])
    return "\n".join(parts) or "no logs"


def stop_head(head):
    proc = head["proc"]
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_ray_job_submit_build_corpus(ray_head, tmp_path, sample_path):
    out = tmp_path / "job_corpus"
    sid = f"corpus-{uuid.uuid4().hex[:8]}"
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--submission-id", sid,
         "--working-dir", ".", "--", "python", "jobs/build_corpus.py", str(sample_path.relative_to(ROOT)),
         "--out", str(out), "--set", "docs_per_unit=5"],
        env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from ray.job_submission import JobStatus, JobSubmissionClient

    assert JobSubmissionClient(ray_head["address"]).get_job_status(sid) == JobStatus.SUCCEEDED
    assert "corpus: 20 documents" in r.stdout
    assert verify_store(str(out)) == []
    assert json.loads((out / "manifest.json").read_text())["completed_units"] == 4


def test_ray_job_bad_input_fails_cleanly(ray_head, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"paragraphs": [\n')
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".", "--",
         "python", "jobs/build_corpus.py", str(bad), "--out", str(tmp_path / "o")],
        env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode != 0
    assert "bad.jsonl:1: malformed JSON" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_cluster_yaml_passes_rays_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    validate_config(prepare_config(raw))
    types = raw["available_node_types"]
    assert any(t["resources"].get("GPU") for t in types.values())
    assert not types[raw["head_node_type"]]["resources"].get("GPU")
    assert any("make install" in c for c in raw["setup_commands"])
    assert all("127.0.0.1" in c for c in raw["head_start_ray_commands"] if "--head" in c)
    # token auth on every node, all with the same token file
    starts = [c for c in raw["head_start_ray_commands"] + raw["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token" in c for c in starts)
    assert raw["file_mounts"].get("/home/ubuntu/.ray/auth_token") == "~/.ray/auth_token"
    broken = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    broken["available_node_types"]["gpu_worker"]["not_a_field"] = 1
    import jsonschema

    with pytest.raises(jsonschema.ValidationError, match="not_a_field"):
        validate_config(prepare_config(broken))
