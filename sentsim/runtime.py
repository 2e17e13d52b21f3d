"""Connecting to Ray: attach to a cluster when given an address, else start a local one."""

from __future__ import annotations

import os
from typing import Optional

from sentsim.errors import UsageError


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Attach to `address` (or RAY_ADDRESS, set by `ray job submit`), else run an in-process local Ray.

    The dashboard binds to 127.0.0.1 unless SENTSIM_DASHBOARD_HOST says otherwise.
    """
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    # A job's env may carry Ray's own log spam settings; keep the console for our progress lines.
    kwargs = dict(log_to_driver=True, configure_logging=True, logging_level="WARNING")
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(
                address="local",  # never attach to some other cluster running on this machine
                num_cpus=num_cpus,
                include_dashboard=False,
                dashboard_host=os.environ.get("SENTSIM_DASHBOARD_HOST", "127.0.0.1"),
                runtime_env={"worker_process_setup_hook": quiet_state_api_probe},
                **kwargs,
            )
    except ConnectionError as exc:
        raise UsageError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    except Exception as exc:  # e.g. a local raylet that times out on an overloaded machine
        if address:
            raise
        raise UsageError(f"could not start a local Ray: {str(exc).splitlines()[0]}") from None


def quiet_state_api_probe() -> None:
    """Worker setup hook for the local, dashboard-less Ray.

    Ray Train's PlacementGroupCleaner asks the state API (which the dashboard serves) every
    second whether the controller still lives. Without a dashboard each answer is a warning on
    the console, hundreds per training run, burying sentsim's progress lines; and with a second
    local Ray on the machine (two trainings at once) its address lookup fails outright and the
    monitor thread dies with a traceback. Pointing the lookup at this worker's own cluster and
    muting that one logger fixes both; a local Ray's placement groups go with it anyway.
    """
    import logging

    try:
        import ray

        os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    except Exception:  # a failing setup hook would take the worker down with it
        pass
    logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner").setLevel(logging.ERROR)


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
