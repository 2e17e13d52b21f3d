"""Connecting to Ray: attach to a cluster when given an address, else start a local one."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Optional

from sentsim.errors import UsageError

_PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # ray.train.v2._internal.constants
_TOKEN_HINT = ("a cluster with token auth needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN, "
               "in the file RAY_AUTH_TOKEN_PATH names, or in ~/.ray/auth_token")


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Attach to `address` (or RAY_ADDRESS, set by `ray job submit`), else run an in-process local Ray.

    Token auth stays on. Attaching follows Ray's own convention: RAY_AUTH_MODE=token with the
    token in RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH names, or in ~/.ray/auth_token
    (a job started by `ray job submit` inherits all that from its head). A local Ray always runs
    with token auth and binds every server (GCS, raylet, object manager, agents) to 127.0.0.1; its
    dashboard binds to 127.0.0.1 unless SENTSIM_DASHBOARD_HOST says otherwise.
    """
    import ray

    if ray.is_initialized():
        return
    from_env = not address and bool(os.environ.get("RAY_ADDRESS"))
    address = address or os.environ.get("RAY_ADDRESS")
    # A job's env may carry Ray's own log spam settings; keep the console for our progress lines.
    kwargs = dict(log_to_driver=True, configure_logging=True, logging_level="WARNING")
    try:
        if address:
            _check_reachable(address, from_env)
            ray.init(address=address, **kwargs)
        else:
            _require_token_auth()
            # Ray Train's preemption watcher (an actor process a training run) waits for nodes that a cluster's
            # autoscaler drains; a local Ray is this one machine, which nothing drains. Read by Ray Train when a
            # run starts, from the driver's environment; a user's own setting stands.
            os.environ.setdefault(_PREEMPTION_WATCHER, "0")
            with loopback_only(), patient_node_registration():
                ray.init(
                    address="local",  # never attach to some other cluster running on this machine
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    dashboard_host=os.environ.get("SENTSIM_DASHBOARD_HOST", "127.0.0.1"),
                    runtime_env={"worker_process_setup_hook": quiet_state_api_probe},
                    **kwargs,
                )
    except UsageError:
        raise
    except ConnectionError as exc:
        # A cluster refusing a missing or wrong token looks the same to ray.init (its log says
        # "InvalidAuthToken"), so the hint goes with every failed attach.
        # one line: the command prints a usage error's first line only, and the hint is the likelier cause
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise UsageError(f"cannot reach the Ray cluster at {address} ({reason}); {_TOKEN_HINT}") from None
    except Exception as exc:  # e.g. a local raylet that times out on an overloaded machine
        if address:
            if _is_auth_error(exc):  # e.g. RAY_AUTH_MODE=token but no token anywhere
                raise UsageError(f"Ray token auth: {str(exc).splitlines()[0].rstrip('.')}; {_TOKEN_HINT}") from None
            raise
        raise UsageError(f"could not start a local Ray: {str(exc).splitlines()[0]}") from None
    one_line_coordinator_warnings()  # the driver runs Ray Data's executor and Ray Train's driver side


def leave_ray_at_exit() -> Optional[int]:
    """At the end of a process that may have run Ray (sentsim.cli.entry): disconnect this driver from its cluster
    (stopping a local Ray this process started) now, SIGINT and SIGTERM only recorded from here until the
    process ends. Returns the first of them that came during the shutdown, None if none did.

    Left to Ray's own atexit callback, a Ctrl-C during the shutdown (its first half second is a sleep, for the
    workers' last log lines) raises KeyboardInterrupt inside it, and a SIGTERM SystemExit (Ray's handler): Python
    prints "Exception ignored in atexit callback" with a traceback, the exit status stays the command's, and a
    driver whose core worker was left half torn down can then die of SIGSEGV or SIGABRT on its way out. Here
    the shutdown runs to its end and the caller says that it was interrupted. A second signal of the same kind
    ends the process at once, as it would have without a handler (a shutdown that hangs can still be stopped,
    by a second Ctrl-C too). Ray's atexit callback then finds nothing to shut down; a signal after the shutdown
    (the rest of the interpreter's exit: milliseconds) changes nothing, as the exit status is decided. A signal
    that is ignored (SIGINT in a process a non-interactive shell started in the background) stays ignored; off
    the main thread no handler can be set, and Ray's shutdown is called as is."""
    if "ray" not in sys.modules:  # a command that never imported Ray started none
        return None
    import ray

    if not ray.is_initialized():
        return None
    came: list = []

    def record(signum, frame):
        came.append(signum)
        signal.signal(signum, signal.SIG_DFL)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, record)
    # as Ray's atexit callback calls it: the same wait for the workers' last log lines first
    ray.shutdown(_exiting_interpreter=True)
    return came[0] if came else None


def attach_before_writing(address: Optional[str] = None) -> None:
    """Attach to the cluster `address` (or RAY_ADDRESS) names now, before a trainer writes its --out: a cluster
    that cannot be reached, or that turns this driver away, is refused in one line with nothing written (a
    sharded run reaches its cluster before its manifest too). Without an address nothing happens here: a local
    Ray cannot refuse the driver, and starting one takes seconds that a refused --out should not wait for."""
    if address or os.environ.get("RAY_ADDRESS"):
        init_ray(address)


# How long the check before ray.init waits for a TCP connection, then for a gRPC (HTTP/2) handshake: a
# healthy cluster answers both in well under a second, even over a slow link.
_PROBE_TIMEOUT_S = 5.0


def _check_reachable(address: str, from_env: bool) -> None:
    """Fail in seconds, as a one-line UsageError, where nothing at `address` could be a Ray cluster.

    ray.init(address=...) itself retries for minutes where nothing answers (Ray 2.60: Node._init_gcs_client
    makes NUM_REDIS_GET_RETRIES=20 GcsClient attempts, each waiting up to py_gcs_connect_timeout_s=30 s for
    the cluster ID, after gcs_rpc_server_connect_timeout_s=5 s for the channel), logging only "Failed to
    connect to GCS at address ... within 5 seconds". So first dial what Ray would dial (an address of this
    machine canonicalised as Ray does, "auto" looked up as Ray does, a ray:// client address as given):
    a refused or unanswered TCP connect, an unknown host name, or a listener that does not speak gRPC
    (a dashboard's or any other HTTP port) is refused here. Anything that does answer is left to ray.init,
    which still says why a live cluster turns the driver away (a missing or wrong token).
    """
    try:  # Ray's own address handling (pinned Ray); without it, ray.init alone decides
        from ray._common.network_utils import parse_address
        from ray._private import services
    except ImportError:
        return

    client = "://" in address
    if client:  # ray://host:port: Ray Client dials it as given
        target = address.split("://", 1)[1].split("/", 1)[0]
    else:
        try:
            target = services.canonicalize_bootstrap_address(address)
        except ConnectionError:  # "auto", and no cluster started on this machine: no token is at fault
            raise UsageError(f"--address {address}{' (from RAY_ADDRESS)' if from_env else ''}: no Ray cluster runs "
                             "on this machine (`ray start --head` starts one; without --address or RAY_ADDRESS "
                             "sentsim starts its own local Ray)") from None
        if target is None:  # "local"
            return
    parsed = parse_address(target)
    if parsed is None or not parsed[1].isdigit():
        return  # ray.init says what is wrong with it
    host, port = parsed[0], int(parsed[1])
    reason = _tcp_refusal(host, port) or _grpc_refusal(target, client)
    if reason is None:
        return
    shown = address + (" (from RAY_ADDRESS)" if from_env else "")
    dialled = "" if target in (address, address.split("://", 1)[-1]) else f"{target}: "
    what = ("its Ray Client port (`ray start --ray-client-server-port`, 10001 by default)" if client else
            "its GCS port (`ray start --head --port`, 6379 by default; not the dashboard's 8265)")
    source = "RAY_ADDRESS (or --address, which overrides it)" if from_env else "--address (or RAY_ADDRESS)"
    raise UsageError(f"cannot reach the Ray cluster at {shown} ({dialled}{reason}); check that `ray start` "
                     f"runs there, that {port} is {what}, and that {source} names that cluster")


def _tcp_refusal(host: str, port: int) -> Optional[str]:
    """Why a TCP connection to host:port fails within _PROBE_TIMEOUT_S, or None once one is made."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return None
    except socket.gaierror as exc:
        return f"host name not resolved: {exc.strerror or exc}"
    except ConnectionRefusedError:
        return "connection refused: nothing listens on that port"
    except (TimeoutError, socket.timeout):
        return f"no answer within {_PROBE_TIMEOUT_S:g} s"
    except OSError as exc:  # no route to host, network unreachable
        return (exc.strerror or str(exc)).lower()


def _grpc_refusal(target: str, client: bool) -> Optional[str]:
    """Why the listener at `target` is no Ray GCS (or, for a ray:// address, no gRPC server), or None.

    Asks a GCS for its cluster ID, the first thing ray.init asks, with the token where there is one:
    any answer but "no such method" (another gRPC or HTTP/2 server) or none at all is a GCS's, and a
    GCS turning the driver away (a wrong token) is left to ray.init to say. Ray Client is only
    handshaken with. Skipped under RAY_USE_TLS, where Ray's channels are TLS ones; no HTTP proxy, as
    Ray's own channels use none (grpc_enable_http_proxy)."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    import grpc

    timeout = 1.6 * _PROBE_TIMEOUT_S
    channel = grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])
    try:
        if client:
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
                return None
            except grpc.FutureTimeoutError:
                return f"a listener there, but no gRPC answer within {timeout:g} s: not a Ray Client server"
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        try:
            from ray._private.authentication.grpc_authentication_client_interceptor import (
                _get_authentication_metadata_tuple,
            )

            metadata = _get_authentication_metadata_tuple()
        except Exception:  # a Ray without it: ask without the token
            metadata = ()
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return "a server there, but not a Ray GCS"
            if code == grpc.StatusCode.UNAVAILABLE:
                return "a listener there, but not a gRPC server: not a Ray GCS"
            # DEADLINE_EXCEEDED is left to ray.init: a GCS on a loaded machine may be slow, and only a wrong
            # refusal would cost the user anything
        return None
    finally:
        channel.close()


def _require_token_auth() -> None:
    """Token auth for the local Ray even when the environment turns it off.

    Ray itself turns it on for a new local cluster only when RAY_AUTH_MODE is unset; it finds the
    token as usual (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token).
    """
    _ensure_default_token_file()
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return
    from ray._raylet import Config

    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")  # the mode is cached in RayConfig: re-read it, as ray.init does


def _ensure_default_token_file() -> None:
    """Without any token, make ~/.ray/auth_token readable by its owner only.

    ray.init would write it with the umask's mode (often world-readable) and unsynchronised; here it
    appears whole or not at all (hard link of a finished 0600 file), so two sentsim processes
    starting at once end up with one token.
    """
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    import secrets
    import tempfile
    from pathlib import Path

    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".auth_token.")  # mkstemp files are 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` makes
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: use theirs
    finally:
        os.unlink(tmp)


@contextmanager
def loopback_only():
    """Make this single-node Ray take 127.0.0.1 as its node IP, so every server binds to loopback.

    On Linux Ray resolves 127.0.0.1 (`_node_ip_address`, `--node-ip-address`) to the machine's
    routable IP and its servers then listen on all interfaces. Its own switch for single-node use
    is RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (read once at import, so the constant is set too); it
    is set only while the processes start, so that a later attach to a real cluster resolves
    this machine's IP as usual.
    """
    from ray._private import ray_constants

    var = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env, saved_const = os.environ.get(var), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[var] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_const
        if saved_env is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved_env


# Ray gives a new node's raylet a fixed 30 s to register with the GCS (ray/_private/node.py,
# `raylet_start_wait_time_s`, no setting), then fails with "The current node timed out during startup". On
# a machine whose cores are busy (2 cores, a training process beside the command) a local Ray took longer.
RAYLET_REGISTER_WAIT_S = 150


@contextmanager
def patient_node_registration(seconds: float = RAYLET_REGISTER_WAIT_S):
    """Give a node this process starts `seconds`, not Ray's 30, to register: the one lookup node.py polls
    (services.get_node, used by nothing else while a node starts) keeps trying until then. For a local
    Ray's start only, and for `ray start` in the tests (tests/conftest.py)."""
    import time

    from ray._private import services

    original = services.get_node

    def get_node(*args, **kwargs):
        deadline = time.monotonic() + seconds
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = get_node
    try:
        yield
    finally:
        services.get_node = original


def _is_auth_error(exc: BaseException) -> bool:
    from ray.exceptions import AuthenticationError

    text = str(exc).lower()
    return isinstance(exc, AuthenticationError) or "authentication" in text or "unauthenticated" in text


def quiet_state_api_probe() -> None:
    """Worker setup hook for the local, dashboard-less Ray.

    Ray Train's PlacementGroupCleaner asks the state API (which the dashboard serves) every
    second whether the controller still lives. Without a dashboard each answer is a warning on
    the console, hundreds per training run, burying sentsim's progress lines; and with a second
    local Ray on the machine (two trainings at once) its address lookup fails outright and the
    monitor thread dies with a traceback. Pointing the lookup at this worker's own cluster and
    muting that one logger fixes both; a local Ray's placement groups go with it anyway. The
    autoscaling coordinator's timeouts are folded onto one line here too (COORDINATOR_LOGGERS).
    """
    import logging

    try:
        import ray

        if not os.environ.get("RAY_ADDRESS"):  # unset or empty (RAY_ADDRESS= in a shell): this cluster's
            os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    except Exception:  # a failing setup hook would take the worker down with it
        pass
    logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner").setLevel(logging.ERROR)
    logging.getLogger(DATA_PROGRESS_LOGGER).setLevel(logging.ERROR)
    one_line_coordinator_warnings()


# Ray Data warns, once in every process that runs a dataset, that its progress bars are off and how to turn
# them on: sentsim turns them off on purpose (its own progress lines speak for a run), so the notice is noise,
# printed by the driver, each Train worker and each split coordinator
DATA_PROGRESS_LOGGER = "ray.data._internal.progress"


def no_data_progress_bars() -> None:
    """Ray Data's progress bars off (a DataContext setting, which datasets carry to their workers), and its
    notice that they are off muted in this process (the driver, or a worker's setup hook)."""
    import logging

    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    logging.getLogger(DATA_PROGRESS_LOGGER).setLevel(logging.ERROR)


def quiet_progress() -> None:
    """Per-step progress bars from ray.data and transformers would bury the curves and progress lines in job
    logs. Here, below every user of it, so that rank targets take it without importing the training package."""
    try:
        no_data_progress_bars()
    except ImportError:  # no Ray Data (the GPU machine's slim Ray)
        pass
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# Ray's clients of the autoscaling coordinator (Train's resource requests, Data's autoscalers) give a
# call 5 s; on an overloaded CPU it times out and they warn with a whole traceback, while their own
# message says that this is safe to ignore when transient. A 2-core machine training beside a harvest
# printed one in the middle of sentsim's progress lines. The warning stays, on one line.
COORDINATOR_LOGGERS = (
    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client",
    "ray.data._internal.cluster_autoscaler.default_cluster_autoscaler_v2",
    "ray.data._internal.cluster_autoscaler.rate_based_cluster_autoscaler",
)


def one_line_coordinator_warnings() -> None:
    """Fold the traceback of the COORDINATOR_LOGGERS' warnings into one line (the exception's type
    and message); idempotent, in whichever process calls it (driver, or a worker's setup hook)."""
    import logging

    for name in COORDINATOR_LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _ExceptionOnOneLine) for f in log.filters):
            log.addFilter(_ExceptionOnOneLine())


class _ExceptionOnOneLine:
    """A logging filter: a record's exception becomes a suffix of its message instead of a traceback."""

    def filter(self, record) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            detail = (str(exc).strip().splitlines() or [""])[0]
            record.msg = f"{record.getMessage()} ({type(exc).__name__}{': ' + detail if detail else ''})"
            record.args = ()
            record.exc_info, record.exc_text = None, None
        return True


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def absolute_local(path: Optional[str]) -> Optional[str]:
    """A local path made absolute on the driver: Ray workers run in their own working directory,
    so a relative `--backbone` or `--data` would name nothing there. URIs (s3://...) pass as given."""
    import os

    if path is None or "://" in str(path):
        return path
    return os.path.abspath(os.path.expanduser(str(path)))
