"""`make bench`: run every benchmark in turn; each writes bench/results/<name>.md for BENCHMARKS.md.

Benchmarks are not tests: run them on a quiet machine, and copy the tables into BENCHMARKS.md
with the date. Heavy ones (origin_quality, context_training, students) need trained models and
take their own arguments; see each script's docstring.
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIGHT = [
    ["ingest.py", "--docs", "40", "--runs", "3"],
    ["retrieval.py"],
    ["context_scoring.py"],
    ["harvest.py", "--runs", "3"],
    ["sts_suite.py"],
    ["bad_inputs.py", "--out", str(HERE / "results" / "bad_inputs.md")],
]

if __name__ == "__main__":
    failed = []
    for cmd in LIGHT:
        if not (HERE / cmd[0]).exists():
            continue
        print(f"== {' '.join(cmd)}", flush=True)
        if subprocess.run([sys.executable, str(HERE / cmd[0]), *cmd[1:]]).returncode:
            failed.append(cmd[0])
    if failed:
        print("failed: " + ", ".join(failed))
        sys.exit(1)
