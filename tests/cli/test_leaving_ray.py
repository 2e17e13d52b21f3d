"""A Ctrl-C (or a SIGTERM) while a command leaves its Ray cluster at exit: one line, no traceback, the shutdown
run to its end, and an exit status that says the process was interrupted (sentsim.cli.entry,
sentsim.runtime.leave_ray_at_exit).

Each command runs against the session's `ray start --head` (conftest.ray_head), or a local Ray it starts, as the
real entry point a user or `ray job submit` runs, in a process group of its own, whose first process sends the
group the signal (as a terminal sends Ctrl-C: a local Ray's own processes get it too) the moment Ray's shutdown
starts to disconnect the driver (ray._private.worker.disconnect, which only the shutdown calls). The signal is
the only thing added, and no timing decides where it lands: Python runs a signal's handler as soon as os.killpg
returns, inside the shutdown. Left to Ray's atexit callback, that printed "Exception ignored in atexit callback" with a
traceback, and the driver, its core worker half torn down, died of SIGSEGV or exited 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, SAMPLE

pytestmark = pytest.mark.slow

# Ctrl-C at a terminal: a process a non-interactive shell starts in the background (a CI runner's `cmd &`)
# inherits SIGINT ignored, and Python then leaves it ignored; a user's terminal gives it Python's own handler.
_SIGNALLED_IN_RAYS_SHUTDOWN = (
    "import os, runpy, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "import ray._private.worker as worker\n"
    "disconnect = worker.disconnect\n"
    "signals = sys.argv.pop(1).split(',')\n"
    "def signalled(*args, **kwargs):\n"
    "    worker.disconnect = disconnect\n"
    "    print('(the test sends', ' and '.join(signals), 'now)', file=sys.stderr, flush=True)\n"
    "    for name in signals:\n"
    "        os.killpg(os.getpgid(0), getattr(signal, name))\n"
    "    return disconnect(*args, **kwargs)\n"
    "worker.disconnect = signalled\n"
    "script = sys.argv.pop(1)\n"
    "if script == 'sentsim':\n"
    "    from sentsim.cli import entry\n"
    "    entry()\n"
    "sys.argv[0] = script\n"
    "runpy.run_path(script, run_name='__main__')\n"
)


def signalled_at_exit(ray_head, out, signals: str, entry: str):
    """`sentsim corpus build SAMPLE --out OUT`: the console script's entry attached to the session's cluster by
    --address ("sentsim") or starting a local Ray ("local"), or jobs/build_corpus.py as `ray job submit` runs it
    (the cluster's address in RAY_ADDRESS)."""
    command = ["corpus", "build", SAMPLE, "--out", out]
    if entry == "job":
        args, env = ["jobs/build_corpus.py", *command[2:]], dict(ray_head["env"], RAY_ADDRESS=ray_head["gcs"])
    else:
        attach = entry == "sentsim"
        args = ["sentsim", *command, *(["--address", ray_head["gcs"]] if attach else [])]
        env = ray_head["env"] if attach else os.environ
    return subprocess.run([sys.executable, "-c", _SIGNALLED_IN_RAYS_SHUTDOWN, signals, *map(str, args)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600, start_new_session=True)


def drivers_of(ray_head, out) -> list:
    """The cluster's record of the drivers whose command line names `out`."""
    from ray.job_submission import JobSubmissionClient

    return [j for j in JobSubmissionClient(ray_head["address"]).list_jobs()
            if j.type == "DRIVER" and str(out) in (j.entrypoint or "")]


@pytest.mark.parametrize("signame, entry", [("SIGINT", "sentsim"), ("SIGINT", "job"), ("SIGTERM", "sentsim"),
                                            ("SIGINT", "local")])
def test_a_signal_while_leaving_ray_is_one_line_and_not_exit_0(ray_head, tmp_path, signame, entry):
    """The command has done its work and said so; the signal comes while Ray disconnects it. The shutdown still
    runs to its end (a cluster records the driver as finished, not lost), then one line says what happened,
    and the exit status is the shell's for that signal (130 for Ctrl-C, 143 for SIGTERM), not 0."""
    out = tmp_path / "corpus"
    r = signalled_at_exit(ray_head, out, signame, entry)
    assert "the test sends" in r.stderr, r.stderr[-3000:]  # the signal did come inside Ray's shutdown
    assert r.returncode == 128 + getattr(signal, signame), (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]
    assert "corpus: 20 documents" in r.stdout, r.stdout  # the command's own report came first, whole
    named = "" if signame == "SIGINT" else f" ({signame})"
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sentsim:")]
    assert lines == [f"sentsim: interrupted{named} while leaving Ray, after the command had ended with exit "
                     "status 0; Ray was left all the same"], r.stderr[-3000:]
    assert r.stderr.rstrip().endswith(lines[0]), r.stderr[-3000:]
    # what the command wrote is whole, and the cluster saw the driver disconnect, not die
    v = subprocess.run([sys.executable, "-m", "sentsim.cli", "store", "verify", str(out)], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert v.returncode == 0 and v.stdout.strip() == f"{out}: OK", v.stdout + v.stderr[-1500:]
    if entry != "local":  # a local Ray is gone with its driver
        drivers = drivers_of(ray_head, out)
        assert [(d.status, bool(d.end_time)) for d in drivers] == [("SUCCEEDED", True)], drivers


def test_a_second_ctrl_c_while_leaving_ray_ends_the_process_at_once(ray_head, tmp_path):
    """The first Ctrl-C lets the shutdown finish; a second one (a shutdown that seems to hang) ends the process
    as SIGINT does by default: at once, with no traceback and no line."""
    out = tmp_path / "corpus"
    r = signalled_at_exit(ray_head, out, "SIGINT,SIGINT", "sentsim")
    assert "the test sends" in r.stderr and "corpus: 20 documents" in r.stdout, r.stderr[-3000:]
    assert r.returncode == -signal.SIGINT, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("sentsim:")], r.stderr[-3000:]
