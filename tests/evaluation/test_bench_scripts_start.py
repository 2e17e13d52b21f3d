"""The bench scripts that borrow the tests' helpers (tests/ on their sys.path) import the library: tests/ holds
test folders named like the library's packages (tests/storage/), which such a script imported in place of the
`storage` package until it put the checkout on its path too. Tests that load a bench script as a module
(conftest.load_bench) run inside pytest, where the packages are imported already, so they cannot see it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BORROWERS = sorted(p for p in (ROOT / "bench").glob("*.py") if re.search(r'sys\.path\.insert\(0, .*"tests"\)',
                                                                          p.read_text()))


def test_there_are_such_scripts():
    assert {p.name for p in BORROWERS} >= {"harvest.py", "pool_cost.py", "rank_targets.py", "bad_inputs.py"}


@pytest.mark.parametrize("script", BORROWERS, ids=lambda p: p.name)
def test_a_bench_script_with_the_tests_helpers_imports_the_library(script, tmp_path):
    """The script's top level (its sys.path set-up, not its main) run as a script runs it, from another folder;
    then the packages its work imports later are the library's."""
    probe = (f"import runpy; runpy.run_path({str(script)!r}, run_name='bench_probe')\n"
             "import storage, sentsim.harvest.job\n"
             "assert hasattr(storage, 'ShardStore'), storage\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
