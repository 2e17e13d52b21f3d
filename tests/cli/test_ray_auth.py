"""Ray token auth stays on, and the local Ray sentsim starts listens on loopback only."""

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import RAY_TOKEN_PATH, ROOT, error_line
from conftest import is_loopback as _is_loopback
from conftest import listening_sockets as _listening
from test_ray_jobs import BIN

pytestmark = pytest.mark.slow


def test_local_ray_from_init_ray_listens_on_loopback_only_with_token_auth():
    import psutil
    import ray
    from ray._raylet import AuthenticationMode, get_authentication_mode

    from sentsim.runtime import init_ray

    if ray.is_initialized():
        pytest.skip("another module left a Ray running in this process")
    watcher = os.environ.pop("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", None)
    init_ray(num_cpus=1)
    try:
        # no Ray Train run on this one machine starts a preemption watcher (nothing drains its node)
        assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
        assert ray.get(ray.remote(lambda: 1 + 1).options(num_cpus=0).remote()) == 2  # a worker ran
        # its setup hook folded Ray's coordinator timeouts onto one line there (tests/cli/test_ray_console.py)
        def one_line_filters() -> list[int]:  # defined here: a worker cannot import this test module
            import logging

            from sentsim.runtime import COORDINATOR_LOGGERS

            return [sum(type(f).__name__ == "_ExceptionOnOneLine" for f in logging.getLogger(n).filters)
                    for n in COORDINATOR_LOGGERS]

        assert ray.get(ray.remote(one_line_filters).options(num_cpus=0).remote()) == [1, 1, 1]
        me = psutil.Process()
        listening = _listening([me.pid] + [p.pid for p in me.children(recursive=True)])
        names = {name for name, _, _ in listening}
        assert {"gcs_server", "raylet"} <= names, listening  # the check sees Ray's own servers
        exposed = [x for x in listening if not _is_loopback(x[1])]
        assert exposed == [], f"listening beyond loopback: {exposed}"
        assert get_authentication_mode() == AuthenticationMode.TOKEN
        # ss, where installed, agrees: the GCS port's listening socket, as the kernel reports it
        if shutil.which("ss"):
            ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
            gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)[1]
            local = [ln.split()[3] for ln in ss.splitlines() if "gcs_server" in ln]
            local = [a for a in local if a.rsplit(":", 1)[1] == gcs_port]
            assert local and all(_is_loopback(a.rsplit(":", 1)[0].strip("[]")) for a in local), ss
    finally:
        ray.shutdown()
        os.environ.pop("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", None)
        if watcher is not None:
            os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = watcher
    from ray._private import ray_constants

    assert ray_constants.ENABLE_RAY_CLUSTER  # only that start was single-node; attaching resolves IPs again


@pytest.fixture(scope="module")
def head(ray_head):
    """The session's `ray start` head (conftest): token auth on, and start_head has already checked
    that none of its sockets listens beyond loopback; checked again here, with its workers by now."""
    from conftest import assert_loopback_only, with_children

    assert_loopback_only(with_children(ray_head["proc"].pid))
    return ray_head


def _submit(head, env, sid, tmp_path):
    (tmp_path / "job.py").write_text("print('job ran')\n")
    return subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", head["address"], "--submission-id", sid,
         "--working-dir", str(tmp_path), "--", "python", "job.py"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def _without_token(env, home: Path):
    """The env minus every way Ray finds a token (the variables, and ~/.ray/auth_token via HOME)."""
    env = {k: v for k, v in env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    return dict(env, HOME=str(home))


def test_ray_job_submit_needs_the_clusters_token(head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    tag = uuid.uuid4().hex[:8]
    no_token = _without_token(head["env"], tmp_path)
    wrong = dict(head["env"], RAY_AUTH_TOKEN="0" * 64)  # takes precedence over RAY_AUTH_TOKEN_PATH
    r_none = _submit(head, no_token, f"none-{tag}", tmp_path)
    r_wrong = _submit(head, wrong, f"wrong-{tag}", tmp_path)
    r_ok = _submit(head, head["env"], f"ok-{tag}", tmp_path)

    assert r_none.returncode != 0
    assert "401" in r_none.stdout + r_none.stderr or "Authentication required" in r_none.stdout + r_none.stderr
    assert r_wrong.returncode != 0
    assert "403" in r_wrong.stdout + r_wrong.stderr or "Invalid" in r_wrong.stdout + r_wrong.stderr
    assert r_ok.returncode == 0, r_ok.stdout[-2000:] + r_ok.stderr[-2000:]
    assert "job ran" in r_ok.stdout
    assert not (tmp_path / ".ray").exists()  # the refused client did not make itself a token

    client = JobSubmissionClient(head["address"])  # this process has the session's token (conftest)
    jobs = {j.submission_id: j.status for j in client.list_jobs()}
    assert jobs.get(f"ok-{tag}") == JobStatus.SUCCEEDED
    assert f"none-{tag}" not in jobs and f"wrong-{tag}" not in jobs  # refused before anything ran


def test_dashboard_http_api_refuses_requests_without_the_token(head):
    import urllib.error
    import urllib.request

    url = head["address"] + "/api/jobs/"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(url, timeout=30)
    assert missing.value.code == 401
    bad = urllib.request.Request(url, headers={"Authorization": "Bearer " + "0" * 64})
    with pytest.raises(urllib.error.HTTPError) as wrong:
        urllib.request.urlopen(bad, timeout=30)
    assert wrong.value.code == 403
    good = urllib.request.Request(url, headers={"Authorization": "Bearer " + RAY_TOKEN_PATH.read_text().strip()})
    with urllib.request.urlopen(good, timeout=30) as resp:
        assert resp.status == 200


_ATTACH = """
import sys
from sentsim.errors import UsageError
from sentsim.runtime import init_ray
try:
    init_ray(sys.argv[1])
except UsageError as exc:
    print(exc)
    sys.exit(3)
import ray
print("CPU", ray.cluster_resources()["CPU"])
"""


def test_sentsim_attaches_with_the_token_and_is_refused_without(head, tmp_path):
    import sys

    def attach(env):
        return subprocess.run([sys.executable, "-c", _ATTACH, head["gcs"]], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    ok = attach(head["env"])
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert f"CPU {float(head['num_cpus'])}" in ok.stdout
    refused = attach(_without_token(head["env"], tmp_path))
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "cannot reach the Ray cluster" in refused.stdout and "RAY_AUTH_MODE=token" in refused.stdout
    assert "InvalidAuthToken" in refused.stderr  # Ray's own log: refused for the token, not unreachable


def test_a_command_refused_by_the_cluster_says_why_in_one_line_and_writes_no_run(head, sample_path, tmp_path):
    """What the command prints, not only what init_ray raises: the token hint on the one line it prints,
    and no run folder (the cluster is reached before a new run's manifest is written)."""
    out = tmp_path / "corpus"
    for env in (_without_token(head["env"], tmp_path), dict(head["env"], RAY_AUTH_TOKEN="0" * 64)):
        # the env as given (the tests' sentsim_cli adds this process's env, whose token is the cluster's)
        r = subprocess.run([str(BIN / "sentsim"), "corpus", "build", str(sample_path), "--out", str(out), "--address",
                            head["gcs"]], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        line = error_line(r.stderr)
        assert line.startswith(f"sentsim: error: cannot reach the Ray cluster at {head['gcs']} (") and \
            line.endswith("needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH "
                          "names, or in ~/.ray/auth_token"), line
        assert not out.exists()


def test_without_any_token_sentsim_makes_a_private_one_ray_finds(tmp_path, monkeypatch):
    from sentsim.runtime import _ensure_default_token_file

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    _ensure_default_token_file()
    token_file = tmp_path / ".ray" / "auth_token"
    token = token_file.read_text()
    assert len(token) == 64 and int(token, 16) >= 0
    assert token_file.stat().st_mode & 0o777 == 0o600
    _ensure_default_token_file()
    assert token_file.read_text() == token  # kept, not replaced
    assert [p.name for p in token_file.parent.iterdir()] == ["auth_token"]  # no temp file left
    shown = subprocess.run([str(BIN / "ray"), "get-auth-token"], env=dict(os.environ, RAY_AUTH_MODE="token"),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.strip() == token  # Ray's own lookup finds it


def test_a_local_ray_waits_for_a_slow_raylet_and_gives_the_lookup_back():
    """A raylet that registers late (a busy machine) is waited for, up to the given seconds, not Ray's 30; a
    node that never registers still fails; and Ray's own lookup is back in place afterwards. The lookup is
    made to fail as Ray's does before a node registers (RuntimeError), since a slow raylet cannot be made
    on demand."""
    from ray._private import services

    from sentsim.runtime import patient_node_registration

    original, calls = services.get_node, []

    def registers_on_third_call(*args, **kwargs):
        calls.append(args)
        if len(calls) < 3:
            raise RuntimeError("node not found")
        return {"node_id": "n"}

    services.get_node = registers_on_third_call
    try:
        with patient_node_registration(seconds=30):
            assert services.get_node("gcs", "n") == {"node_id": "n"} and len(calls) == 3
        assert services.get_node is registers_on_third_call
        calls.clear()

        def never_registers(*args, **kwargs):
            calls.append(args)
            raise RuntimeError("node not found")

        services.get_node = never_registers
        with patient_node_registration(seconds=0.6), pytest.raises(RuntimeError, match="node not found"):
            services.get_node("gcs", "n")
        assert len(calls) >= 2  # tried again before giving up
    finally:
        services.get_node = original
