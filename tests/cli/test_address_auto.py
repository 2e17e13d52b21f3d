"""`--address auto`: attach to the cluster `ray start --head` started on this machine, as Ray looks it up; with
no cluster, one line and exit 2.

Ray (2.60, ray._private.services.get_ray_address_from_environment) resolves "auto" as: RAY_ADDRESS if set;
else the GCS address in `<ray temp dir>/ray_current_cluster`, the file the last `ray start` wrote there (the
default temp dir is $RAY_TMPDIR/ray, else $TMPDIR/ray, else /tmp/ray); else, its legacy fallback, any raylet
it finds in the machine's process list. Every command here runs with RAY_ADDRESS unset and its own
RAY_TMPDIR, so that neither a user's cluster nor another test's (xdist) can be the one "auto" names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, error_line

BIN = Path(sys.executable).parent


def _env(base: dict, ray_tmpdir: Path) -> dict:
    env = dict(base, RAY_TMPDIR=str(ray_tmpdir))
    env.pop("RAY_ADDRESS", None)  # it overrides "auto" (and a `ray job` this runs in would set it)
    return env


@pytest.mark.slow
def test_address_auto_attaches_to_the_ray_start_cluster(ray_head, sample_path, tmp_path):
    """The session's `ray start --head` (conftest.ray_head) wrote its address to ray_current_cluster in its
    --temp-dir; that file, seen where Ray looks for the default temp dir's, is what "auto" finds. The
    command runs there: the cluster lists it as its driver, finished, by its command line."""
    from ray.job_submission import JobSubmissionClient

    head_temp = next(a.split("=", 1)[1] for a in ray_head["proc"].args if a.startswith("--temp-dir="))
    written = Path(head_temp) / "ray_current_cluster"
    assert written.read_text().strip() == ray_head["gcs"]  # what `ray start` itself wrote
    ray_tmpdir = tmp_path / "raytmp"
    (ray_tmpdir / "ray").mkdir(parents=True)
    (ray_tmpdir / "ray" / "ray_current_cluster").symlink_to(written)

    out = tmp_path / "corpus"
    cmd = [str(BIN / "sentsim"), "corpus", "build", str(sample_path), "--out", str(out), "--address", "auto"]
    r = subprocess.run(cmd, env=_env(ray_head["env"], ray_tmpdir), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "corpus: 20 documents" in r.stdout, r.stdout

    # The cluster's record of the driver: its command line (unique here by --out), and its end.
    drivers = [j for j in JobSubmissionClient(ray_head["address"]).list_jobs()
               if j.type == "DRIVER" and str(out) in (j.entrypoint or "")]
    assert len(drivers) == 1, [(j.type, j.entrypoint) for j in JobSubmissionClient(ray_head["address"]).list_jobs()]
    assert "--address auto" in drivers[0].entrypoint
    assert drivers[0].status == "SUCCEEDED" and drivers[0].end_time, drivers[0]


# Runs sentsim's entry point with Ray's legacy "auto" fallback (a scan of the process list for any raylet's
# --gcs-address) seeing no raylet: whatever else runs on this machine (the session's `ray start` head, the
# other xdist process's clusters, a developer's local Ray) must not be taken for a cluster started here.
_NO_OTHER_RAYLETS = (
    "from ray._private import services\n"
    "services._find_address_from_flag = lambda flag: set()\n"
    "from sentsim.cli import entry\n"
    "entry()\n"
)


def test_address_auto_without_a_cluster_is_one_line_and_exit_2(sample_path, tmp_path):
    ray_tmpdir = tmp_path / "raytmp"  # empty: no ray/ray_current_cluster, as on a machine where no `ray start` ran
    ray_tmpdir.mkdir()
    out = tmp_path / "corpus"
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _NO_OTHER_RAYLETS, "corpus", "build", str(sample_path), "--out",
                        str(out), "--address", "auto"], env=_env(os.environ, ray_tmpdir), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr) == (
        "sentsim: error: --address auto: no Ray cluster runs on this machine (`ray start --head` starts one; "
        "without --address or RAY_ADDRESS sentsim starts its own local Ray)")
    assert "token" not in r.stderr.lower()  # not the hint for a cluster that refused us
    assert took < 60, took  # no minutes of ray.init retries
    assert not out.exists()
