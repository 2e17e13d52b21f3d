"""The CLI's error contract: a user's mistake is one line and exit 2, even from inside Ray."""

import pytest
from conftest import sentsim_cli

from sentsim.cli import _usage_line_in, _wrapped_usage_error
from sentsim.errors import UsageError


def test_usage_error_raised_in_a_ray_task_is_unwrapped():
    import ray

    @ray.remote
    def bad():
        raise UsageError("corpus.json: the thing is wrong")

    ray.init(address="local", num_cpus=1, include_dashboard=False, ignore_reinit_error=True)
    try:
        with pytest.raises(ray.exceptions.RayTaskError) as exc:
            ray.get(bad.remote())
    finally:
        ray.shutdown()
    assert _wrapped_usage_error(exc.value) == "corpus.json: the thing is wrong"


def test_usage_line_in_train_worker_text():
    text = "Training failed due to worker errors:\n[Rank 0]\nTraceback (most recent call last):\n  ...\n" \
           "sentsim.errors.UsageError: /c: fewer than 2 held-out windows\n"
    assert _usage_line_in(text) == "/c: fewer than 2 held-out windows"
    assert _usage_line_in("ValueError: something else") is None


def test_unknown_command_and_missing_args_exit_2():
    r = sentsim_cli("nonsense")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = sentsim_cli("corpus", "build")
    assert r.returncode == 2 and "--out" in r.stderr
    r = sentsim_cli("store", "verify", "/nonexistent/run")
    assert r.returncode == 2
    assert r.stderr.strip() == ("sentsim: error: /nonexistent/run: no manifest.json here; "
                                "is this a sentsim run directory?")
