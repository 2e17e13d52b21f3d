"""Shared fixtures: the bundled sample corpus, real data in ../shared, and Ray settings."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"
SHARED = ROOT.parent / "shared"
SHARED_DATA = SHARED / "data"

# Ray 2.60 turns token auth on by default; every test cluster and client states its mode.
os.environ["RAY_AUTH_MODE"] = "disabled"
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
    from corpus.build import build_corpus

    out = tmp_path_factory.mktemp("speech_corpus") / "corpus"
    build_corpus([str(SAMPLE)], str(out), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """A module's own in-process Ray; address="local" never attaches to another cluster here."""
    import ray

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
