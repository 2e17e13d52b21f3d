"""`make demo` stopped by Ctrl-C: the step running then stops in its own way, and the demo says where it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import ROOT, SHARED

# A demo step as `make demo` runs it (sentsim.demo.step), over a corpus long enough that the Ctrl-C lands while its
# units are being written: the signal is sent once the step has said it wrote its first unit.
STEP = ("import signal, sys\n"
        # Ctrl-C at a terminal: a process started in the background by a non-interactive shell inherits SIGINT
        # ignored, and Python then leaves it ignored; a user's terminal gives it Python's own handler
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from sentsim.demo import step\n"
        "step('corpus', sys.argv[1:])\n"
        "print('demo went on', flush=True)\n")


def test_ctrl_c_during_a_demo_step_lets_the_step_stop_itself_and_says_where(tmp_path):
    """The terminal's Ctrl-C reaches the whole process group: the step's command says it was interrupted
    (exit 130) and leaves a run its rerun resumes; the demo waits for it rather than killing it, then says
    which step was stopped, in one line, with no traceback, and exits 130 instead of going on."""
    corpus = SHARED / "data" / "corpus" / "enwiki_2014slice_docs.jsonl.gz"
    out = tmp_path / "corpus"
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", STEP, "corpus", "build", str(corpus), "--out", str(out),
         "--executor", "inline", "--set", "docs_per_unit=1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[corpus] unit "):
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the demo and its step alike
            break
    text = "".join(seen) + proc.stdout.read()
    assert proc.wait(timeout=300) == 130, text[-3000:]
    assert "Traceback" not in text and "demo went on" not in text, text[-3000:]
    assert "sentsim: interrupted; run the same command again to resume" in text, text[-3000:]
    assert text.rstrip().endswith("demo: interrupted during step 'corpus'; run the demo again to go on from there"), \
        text[-3000:]
    # the step's run goes on: its next unit (the one the Ctrl-C cut short, whose shard may be on disk without its
    # marker) is redone, and the run then checks out as a run stopped part-way
    build = [sys.executable, "-m", "sentsim.cli", "corpus", "build", str(corpus), "--out", str(out),
             "--executor", "inline", "--set", "docs_per_unit=1"]
    resumed = subprocess.run([*build, "--max-units", "1"], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0 and "resum" in resumed.stdout + resumed.stderr, resumed.stdout + resumed.stderr
    verify = subprocess.run([sys.executable, "-m", "sentsim.cli", "store", "verify", str(out)], cwd=ROOT,
                            capture_output=True, text=True)
    assert verify.returncode == 0 and "OK (incomplete" in verify.stdout, verify.stdout + verify.stderr
