"""Small helpers both sides of the loop use (driver: run.py, workers: loop.py); kept apart so that
neither imports the other."""

from __future__ import annotations

from typing import Optional


def quiet_progress() -> None:
    """Per-step progress bars from ray.data and transformers would bury the curves in job logs."""
    try:
        from sentsim.runtime import no_data_progress_bars

        no_data_progress_bars()
    except ImportError:  # no Ray Data (the GPU machine's slim Ray)
        pass
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def use_gpu(want: Optional[bool], num_workers: int) -> bool:
    """want None: one GPU per worker when the Ray cluster has that many."""
    if want is not None:
        return want
    import ray

    return ray.cluster_resources().get("GPU", 0) >= num_workers
