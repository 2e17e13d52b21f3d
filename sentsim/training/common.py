"""Small helpers both sides of the loop use (driver: run.py, workers: loop.py); kept apart so that
neither imports the other. `quiet_progress` is sentsim.runtime's (rank targets use it too), handed on here."""

from __future__ import annotations

from typing import Optional

from sentsim.runtime import quiet_progress

__all__ = ["counted", "quiet_progress", "use_gpu"]


def counted(n: int, noun: str) -> str:
    """A count and its noun, agreeing: "1 step", "2 steps"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def use_gpu(want: Optional[bool], num_workers: int) -> bool:
    """want None: one GPU per worker when the Ray cluster has that many."""
    if want is not None:
        return want
    import ray

    return ray.cluster_resources().get("GPU", 0) >= num_workers
