"""bench/label_memory.py runs end to end on a tiny synthetic vectors run, so the benchmark cannot rot between
the runs that fill BENCHMARKS.md ("Scale")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_label_memory_measures_both_ways_on_two_actors(tmp_path):
    out = tmp_path / "label_memory.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "label_memory.py"), "--sentences", "300", "--pool", "8",
                        "--units", "6", "--pairs-per-unit", "4", "--runs", "1", "--json", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    assert set(got["runs"]) == {"own", "shared"}
    for mode, runs in got["runs"].items():
        assert runs[0]["actors"] == 2 and runs[0]["uss_sum_mib"] > 0, (mode, runs)
    assert got["object_store_copy_mib"] > 0 and got["ratio_shared_over_own"] > 0
