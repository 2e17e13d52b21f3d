"""Shared fixtures: the bundled sample corpus, real data in ../shared, and Ray settings."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"
SHARED = ROOT.parent / "shared"
SHARED_DATA = SHARED / "data"

# Token auth stays on, the Ray way: RAY_AUTH_MODE=token plus RAY_AUTH_TOKEN_PATH, a fresh token
# file per test session that every in-process Ray, `ray start` head, `ray job submit` and job client
# here inherits; no test reads or writes the developer's ~/.ray/auth_token.
RAY_TOKEN_PATH = Path(tempfile.mkdtemp(prefix="sentsim-ray-token-")) / "auth_token"  # dir is 0700
RAY_TOKEN_PATH.write_text(secrets.token_hex(32))
atexit.register(shutil.rmtree, RAY_TOKEN_PATH.parent, True)
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN_PATH"] = str(RAY_TOKEN_PATH)
os.environ.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over the file
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Two test processes (and the commands they start) share two cores, each torch with an OpenMP thread a
# core. OpenMP's threads spin while they wait for work, burning the core the other process needs: files
# of inline torch work ran 1.4x longer side by side (docs/notes/2026-11-28-ci-threads.md). PASSIVE makes them
# sleep instead; read when torch loads, so set before any test imports it, and inherited by every
# subprocess and `ray start` node a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Ray Train's controller looks at its workers every 2 s, so each state a run passes through (scheduling,
# running, finished) costs up to 2 s of waiting; a two-step training of the tests is mostly such waits
# (25.1 s against 27.6 s a `train student` on a local Ray, 0.2 s against the default). Ray Train hands the
# setting from the driver to its controller; the workers' health checks still time out after 10 minutes.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")


# The test files that take longest (CI's --durations, 2 cores), longest first. `make test` runs the files in
# two processes, each file whole, handed out in collection order: these go first, so that the run does not end
# with one process still inside a long file while the other waits. A file missing here only runs later.
SLOW_FILES = (
    "training/test_surrogate.py", "cli/test_rerun_is_noop.py", "storage/test_s3_chain.py",
    "harvest/test_harvest_ray.py", "training/test_train_cli.py", "cli/test_input_refusals.py",
    "storage/test_store_compact.py", "training/test_model_export.py", "context/test_context_model.py",
    "evaluation/test_bench_reference_teacher.py", "harvest/test_harvest.py", "evaluation/test_bench_gpu.py",
    "harvest/test_executor.py", "harvest/test_pool_harvest.py", "cli/test_ray_jobs.py", "cli/test_leaving_ray.py",
    "students/test_students.py",
    "training/test_training_notes.py", "cli/test_out_paths.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES)}

    def file_rank(item) -> int:
        rel = Path(str(item.fspath)).relative_to(ROOT / "tests").as_posix()
        return rank.get(rel, len(SLOW_FILES))

    items.sort(key=file_rank)  # stable: a file's tests keep their order, the other files theirs
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sample_path() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not beside the checkout")
    return SHARED_DATA


@pytest.fixture(scope="session")
def speech_corpus(tmp_path_factory) -> Path:
    """The bundled sample (20 speeches, ~3.8K sentences) built in-process: sentences/ and chunks/."""
    from sentsim.corpus_job import build_corpus

    out = tmp_path_factory.mktemp("speech_corpus") / "corpus"
    build_corpus([str(SAMPLE)], str(out), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    return out


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free TCP port below the kernel's ephemeral range (32768+) and above Ray's worker ports.

    A port from `bind(0)` is ephemeral: while `ray start` takes seconds to bind it, any outgoing
    connection on the machine (Ray's own, a concurrent test's) can be given the same number.
    """
    import random

    for _ in range(1000):
        port = random.randint(20000, 32000)  # Ray's worker ports default to 10002-19999
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free TCP port in 20000-32000")


def load_bench(name: str):
    """A bench/ script as a module (bench/ is not a package): tests share its harnesses and sums."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def error_line(stderr: str) -> str:
    """The command's one `sentsim: error:` line. Not simply the last line of stderr: a Ray cluster's own log
    lines (a raylet's disk-space warning, its GCS on the actors it stops) may arrive after it."""
    errors = [ln for ln in stderr.splitlines() if ln.startswith("sentsim: error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


def sentsim_cli(*args, env=None, timeout=600, cwd=None) -> subprocess.CompletedProcess:
    """Run the real `sentsim` console script (as a user would), capturing output."""
    exe = shutil.which("sentsim") or str(Path(sys.executable).parent / "sentsim")
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [exe, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT
    )


# ---- Ray clusters the tests start: loopback only, token auth on -------------------------------------

# What makes `ray start` keep 127.0.0.1 as the node IP (Ray otherwise swaps it for this machine's
# routable IP, and its GCS, raylet and agents then listen on all interfaces): Ray's single-node switch,
# the one sentsim.runtime.loopback_only() sets for the in-process Ray. Every process of such a cluster
# (its jobs too) and every driver that attaches to it needs it in its env: a driver without it
# resolves "127.0.0.1:PORT" to the routable IP, where nothing listens.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def listening_sockets(pids):
    """(process name, ip, port) of every TCP socket the given processes listen on."""
    import psutil

    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.NoSuchProcess:  # a worker that exited meanwhile
            continue
        out += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def is_loopback(ip: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)  # [::ffff:127.0.0.1] on a dual-stack socket
    return (mapped or addr).is_loopback


def with_children(*pids):
    """The given processes and all their descendants (a Ray node: gcs_server, raylet, agents, workers)."""
    import psutil

    out = []
    for pid in pids:
        try:
            out += [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return sorted(set(out))


def assert_loopback_only(pids, servers=("gcs_server", "raylet")):
    """No listening socket of these processes is bound beyond loopback (0.0.0.0, ::, a routable IP),
    and the check did see Ray's own servers among them. Returns what listens."""
    listening = listening_sockets(pids)
    names = {name for name, _, _ in listening}
    assert set(servers) <= names, f"Ray's servers not among the processes checked: {listening}"
    exposed = [x for x in listening if not is_loopback(x[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"
    return listening


def start_head(tmp, num_cpus=2):
    """`ray start --head` (Ray's CLI, through RAY_START) on 127.0.0.1 with token auth; a start that
    fails (a port taken meanwhile, a dashboard that died) is retried once.
    Checks that nothing of the head listens beyond loopback."""
    head = _start_twice("ray head", lambda folder: _start_head_once(folder, num_cpus), tmp)
    try:
        head["listening"] = assert_loopback_only(with_children(head["proc"].pid))
    except BaseException:
        stop_head(head)
        raise
    return head


def _start_twice(what: str, start, tmp):
    """`start(folder)`, and once more in a fresh folder (so with fresh ports and temp dir) if it raises
    RuntimeError: a port taken meanwhile, or a node that died on its way up."""
    try:
        return start(Path(tmp) / "a")
    except RuntimeError as first:
        print(f"first {what} failed, retrying with other ports: {first}", file=sys.stderr)
        return start(Path(tmp) / "b")


def ray_temp_dir() -> Path:
    """A short folder for a node's `--temp-dir`: Ray puts its AF_UNIX sockets there, whose paths may not pass
    107 bytes, and a pytest tmp path (one level deeper per xdist worker) leaves too little room for Ray's
    session_<date>_<pid>/sockets/plasma_store. Removed when the session ends."""
    path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _start_head_once(tmp, num_cpus):
    import time

    tmp.mkdir(parents=True, exist_ok=True)
    temp = ray_temp_dir()
    port, dash, metrics = free_port(), free_port(), free_port()
    # Every fixed-default port gets a free one too, so that a Ray already running on this machine
    # (a developer's, or a local `ray.init()`) cannot make the head fail to bind.
    more = {flag: free_port() for flag in ("object-manager-port", "node-manager-port", "ray-client-server-port",
                                           "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                           "runtime-env-agent-port")}
    # RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH come from above: the head, its jobs and every
    # client given this env share the session's token. LOOPBACK_ENV keeps --node-ip-address 127.0.0.1.
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", **LOOPBACK_ENV)
    assert env.get("RAY_AUTH_MODE") == "token" and env.get("RAY_AUTH_TOKEN_PATH")
    log = open(Path(tmp) / "ray_start.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", RAY_START, "start", "--head", "--block", f"--num-cpus={num_cpus}", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         "--include-dashboard=true", f"--metrics-export-port={metrics}", *(f"--{k}={v}" for k, v in more.items()),
         f"--temp-dir={temp}", "--disable-usage-stats"],
        # RAY_ADDRESS in the node's own env (not in head["env"]): its workers inherit it, so that the state
        # API lookups Ray makes inside them (Ray Train's PlacementGroupCleaner) find this cluster, not the
        # newest one on the machine (another xdist process's head, or a local Ray), where the lookup fails
        # and the thread dies with a traceback on the console of whatever job runs there
        env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
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
                raise RuntimeError("ray head did not come up; " + _node_logs(tmp, temp)) from None
            time.sleep(1)
    return {"env": env, "address": address, "gcs": f"127.0.0.1:{port}", "proc": proc, "num_cpus": num_cpus,
            "metrics": f"http://127.0.0.1:{metrics}/metrics"}


# `ray start` gives its new raylet a fixed 30 s to register with the GCS; on two cores shared by two test
# processes, one of them training torch models beside a running harvest, a node took longer than that.
# RAY_START runs Ray's own CLI entry point (`ray start`, the same arguments) with only that wait raised,
# to RAYLET_REGISTER_WAIT_S, as sentsim's own local Ray has it (sentsim.runtime.patient_node_registration).
_RAY_START = (
    "import sys\n"
    "from ray._private import ray_constants, services\n"
    "from sentsim.runtime import patient_node_registration\n"
    "{guards}"
    "from ray.scripts.scripts import main\n"
    "sys.argv[0] = 'ray'\n"
    "with patient_node_registration():\n"
    "    main()\n"
)
RAY_START = _RAY_START.format(guards="")

# Ray 2.60's `ray start` cannot add a worker node on loopback: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
# (what keeps 127.0.0.1, LOOPBACK_ENV) it refuses any non-head node, and with it on it swaps
# 127.0.0.1 for the machine's routable IP. RAY_START_WORKER_ON_LOOPBACK turns exactly those two guards
# as well: the node may join, and keeps 127.0.0.1. The processes it starts (raylet, agents, workers)
# see LOOPBACK_ENV and stay on loopback too.
RAY_START_WORKER_ON_LOOPBACK = _RAY_START.format(guards=(
    "ray_constants.ENABLE_RAY_CLUSTER = True\n"
    "services.resolve_ip_for_localhost = lambda host: host\n"))


def start_worker(head, tmp, num_cpus=1, num_gpus=0):
    """Another node for `head`: a separate `ray start --address` raylet on 127.0.0.1, with logical
    GPUs if asked (Ray schedules by them; nothing here touches a device). Returns {"proc", "node"}:
    its `ray start` process (own process group) and its Ray node id, once the head lists it alive.
    A start that fails (a port taken meanwhile, a raylet that died) is retried once, as the head's is."""
    return _start_twice("ray worker node", lambda folder: _start_worker_once(head, folder, num_cpus, num_gpus), tmp)


def _start_worker_once(head, tmp, num_cpus, num_gpus):
    import time

    tmp.mkdir(parents=True, exist_ok=True)
    temp = ray_temp_dir()
    before = alive_nodes(head)
    # a second raylet on this machine: every port it would take by default gets a free one
    ports = {flag: free_port() for flag in ("object-manager-port", "node-manager-port", "dashboard-agent-listen-port",
                                            "dashboard-agent-grpc-port", "runtime-env-agent-port",
                                            "metrics-export-port")}
    log = open(tmp / "ray_start.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", RAY_START_WORKER_ON_LOOPBACK, "start", "--block", f"--address={head['gcs']}",
         f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", "--node-ip-address=127.0.0.1",
         "--min-worker-port=0", "--max-worker-port=0", *(f"--{k}={v}" for k, v in ports.items()),
         f"--temp-dir={temp}", "--disable-usage-stats"],
        env={**head["env"], "RAY_ADDRESS": head["gcs"]}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # RAY_ADDRESS: as for the head (_start_head_once)
    )
    log.close()
    from sentsim.runtime import RAYLET_REGISTER_WAIT_S

    deadline = time.time() + RAYLET_REGISTER_WAIT_S + 30
    while True:
        new = sorted(alive_nodes(head) - before)
        if new:
            return {"proc": proc, "node": new[0], "env": head["env"]}
        if proc.poll() is not None or time.time() > deadline:
            stop_head({"proc": proc})
            raise RuntimeError("ray worker node did not join: " + _node_logs(tmp, temp))
        time.sleep(0.5)


def alive_nodes(head) -> set:
    """Ids of the head's cluster's live nodes. The state API's own filter reports dead nodes as
    "missing output" and raises, so it filters here."""
    from ray.util.state import list_nodes

    return {n.node_id for n in list_nodes(address=head["address"], limit=10_000, raise_on_missing_output=False)
            if n.state == "ALIVE"}


def kill_node(node) -> None:
    """What a crashed machine does to a node: SIGKILL to its raylet and every process under it
    (actors and agents included, whatever process group they put themselves in)."""
    import signal

    for pid in with_children(node["proc"].pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node["proc"].wait(30)


def _node_logs(tmp, temp, chars=1500):
    """The tails of `ray start`'s output (in `tmp`) and of the node's raylet and dashboard logs (under its
    --temp-dir `temp`), which say why a node is not up."""
    parts = []
    logs = Path(temp) / "session_latest" / "logs"
    for name, path in (("ray_start.log", Path(tmp) / "ray_start.log"), ("raylet.out", logs / "raylet.out"),
                       ("raylet.err", logs / "raylet.err"), ("dashboard.log", logs / "dashboard.log")):
        if path.is_file():
            parts.append(f"--- {name}:\n" + path.read_text(errors="replace")[-chars:])
    return "\n".join(parts) or "no logs"


def stop_head(head):
    """Stop exactly this node, as Ctrl-C stops a user's `ray start --block`: SIGINT to that process,
    which stops its Ray processes and exits in about a second. (It ignores SIGTERM: it would wait out
    the whole grace period, 30 s a node, and `ray stop` would stop every Ray cluster of the user on this
    machine.) Then SIGKILL to its process group (`--block` keeps it in its own) for anything left."""
    import signal

    proc = head["proc"]
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """One `ray start --head` (2 CPUs, loopback, token auth) for the whole session, as a user would
    start it, from this venv (a job's python comes from ray start's PATH). Shared by the job-submit,
    auth and Ray-harvest tests: each head takes ~20 s of the 2 cores to come up."""
    head = start_head(tmp_path_factory.mktemp("rayhead"))
    yield head
    stop_head(head)


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_for_the_next_module():
    """A test file's in-process Ray (started by a fixture, by a command run in-process, or by a run's
    ray_dataset()) ends with the file: a test worker runs several files, and the next one's `ray.init` would
    otherwise find Ray already up ("called ray.init twice") or attach its work to the wrong cluster."""
    yield
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="module")
def ray_local():
    """A module's own in-process Ray; address="local" never attaches to another cluster here.

    Bound to 127.0.0.1 like the local Ray sentsim starts; token auth as set above."""
    import ray

    from sentsim.runtime import loopback_only

    with loopback_only():
        ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def one_torch_thread():
    """2 shared cores: OpenMP spinning across threads costs 10-50x on small matmuls."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
