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


def pytest_collection_modifyitems(config, items):
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


def sentsim_cli(*args, env=None, timeout=600, cwd=None) -> subprocess.CompletedProcess:
    """Run the real `sentsim` console script (as a user would), capturing output."""
    exe = shutil.which("sentsim") or str(Path(sys.executable).parent / "sentsim")
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [exe, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT
    )


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
