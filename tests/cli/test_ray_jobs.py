"""Real Ray: a SIGKILLed build resumed to the exact dataset, and `ray job submit` to a `ray start` cluster."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from conftest import ROOT, sentsim_cli, start_head, stop_head  # noqa: F401  (the head helpers, for importers)

from storage import verify_store

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def table(run, name):
    key = "sentence_id" if name == "sentences" else "chunk_id"
    return ds.dataset(str(Path(run) / name)).to_table().sort_by(key)


def test_sigkill_midway_then_rerun_gives_the_uninterrupted_dataset(tmp_path, sample_path, speech_corpus):
    out = tmp_path / "killed"
    cmd = [str(BIN / "sentsim"), "corpus", "build", str(sample_path), "--out", str(out),
           "--set", "docs_per_unit=2", "--set", "max_in_flight=1"]  # 10 units
    env = dict(os.environ)  # with the session's token (conftest): the local Ray runs with auth
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    units = out / "_units"
    deadline = time.time() + 240
    while time.time() < deadline:
        if units.is_dir() and len(list(units.glob("*.json"))) >= 3:
            break
        assert proc.poll() is None, "build ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started, all at once
    proc.wait(30)
    done_at_kill = len(list(units.glob("*.json")))
    assert 3 <= done_at_kill < 10, done_at_kill
    assert not (out / "_COMPLETE").exists()
    assert verify_store(str(out))  # incomplete: verify says so

    r = sentsim_cli(*cmd[1:], env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    # Units finished before the kill are not redone (a worker may have finished one more
    # unit in the instant between the kill and our count: it is complete, so it is skipped too).
    import re

    skipped = {int(x) for x in re.findall(r"(\d+) already complete", r.stderr)}
    assert len(skipped) == 1 and done_at_kill <= skipped.pop() < 10
    assert verify_store(str(out)) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["completed_units"] == 10 and manifest["complete"]
    # Same rows and ids as an uninterrupted run (built with other unit sizes, even).
    assert table(out, "sentences").equals(table(speech_corpus, "sentences"))
    assert table(out, "chunks").equals(table(speech_corpus, "chunks"))


def test_ray_job_submit_build_corpus(ray_head, tmp_path, sample_path):
    out = tmp_path / "job_corpus"
    sid = f"corpus-{uuid.uuid4().hex[:8]}"
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--submission-id", sid,
         "--working-dir", ".", "--", "python", "jobs/build_corpus.py", str(sample_path.relative_to(ROOT)),
         "--out", str(out), "--set", "docs_per_unit=5"],
        env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from ray.job_submission import JobStatus, JobSubmissionClient

    assert JobSubmissionClient(ray_head["address"]).get_job_status(sid) == JobStatus.SUCCEEDED
    assert "corpus: 20 documents" in r.stdout
    assert verify_store(str(out)) == []
    assert json.loads((out / "manifest.json").read_text())["completed_units"] == 4


def test_ray_job_bad_input_fails_cleanly(ray_head, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"paragraphs": [\n')
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".", "--",
         "python", "jobs/build_corpus.py", str(bad), "--out", str(tmp_path / "o")],
        env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode != 0
    assert "bad.jsonl:1: malformed JSON" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_a_relative_out_in_a_ray_job_is_refused_not_left_in_rays_copy(ray_head, sample_path, tmp_path):
    """The job runs in Ray's temporary copy of --working-dir: a relative --out would be written there and
    deleted with it, while the job reports success. Refused in one line, nothing written in the copy."""
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".", "--",
         "python", "jobs/build_corpus.py", str(sample_path.relative_to(ROOT)), "--out", "rel_out/corpus"],
        env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    text = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in text, text[-3000:]
    assert ("sentsim: error: --out rel_out/corpus is relative, and this Ray job runs in Ray's temporary copy of "
            "its --working-dir, which Ray deletes: give an absolute path (one every node sees) or s3://") in text
    assert not (ROOT / "rel_out").exists()
    # a relative input the copy lacks (Ray uploads the working dir less what .gitignore lists, demo_out/ among
    # it) is named with why it is missing there
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".", "--",
         "python", "jobs/build_index.py", "--corpus", "demo_out/corpus", "--out", str(tmp_path / "index")],
        env=ray_head["env"], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    text = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in text, text[-3000:]
    assert ("demo_out/corpus is relative, and this Ray job runs in Ray's copy of its --working-dir, which holds "
            "neither what .gitignore lists nor anything outside it: give an absolute path that every node sees, or "
            "s3://)") in text, text[-3000:]


def test_in_a_job_a_folder_changed_in_place_must_be_absolute_and_hints_name_only_paths(speech_corpus, tmp_path):
    """In a `ray job submit --working-dir` job (the driver's env as Ray's supervisor sets it), `store compact`
    and `eval sts --model` change their folder in place, so a relative one (Ray's deleted copy) is refused as a
    relative --out is; an error that names no missing relative path gets no hint about one (a command word or a
    --set number is none)."""
    import shutil

    from conftest import SAMPLE, error_line

    job = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "gcs://x.zip"}})}
    shutil.copytree(speech_corpus, tmp_path / "run")
    r = sentsim_cli("store", "compact", "run", env=job, cwd=tmp_path)
    assert r.returncode == 2 and error_line(r.stderr).startswith(
        "sentsim: error: DIR run is relative, and this Ray job runs in Ray's temporary copy"), r.stderr
    assert not (tmp_path / "run" / "_compact").exists()
    r = sentsim_cli("eval", "sts", "--model", "m", "--data", tmp_path, env=job, cwd=tmp_path)
    assert r.returncode == 2 and "--model m is relative, and this Ray job" in error_line(r.stderr), r.stderr
    assert error_line(r.stderr).endswith("(one every node sees)"), r.stderr  # no s3:// for a local-only path
    # the same for outputs that go to a local folder only: a report, a model; a run's --out may be s3://
    for args, flag, s3 in (
            (("eval", "sts", "--tfidf", "--data", tmp_path / "sts", "--json", "r.json"), "--json r.json", False),
            (("train", "discriminator", "--corpus", tmp_path / "run", "--out", "d"), "--out d", False),
            (("store", "compact", "run"), "DIR run", True),
            # an output inside an input: the relative line, not the overlap's with a hint of a missing input
            (("eval", "sts", "--tfidf", "--data", tmp_path, "--json", "r.json"), "--json r.json", False)):
        line = error_line(sentsim_cli(*args, env=job, cwd=tmp_path).stderr)
        assert line.startswith(f"sentsim: error: {flag} is relative") and line.endswith("or s3://") == s3, line
    # a resume refused for a changed setting: no word about relative paths (the words harvest, 9 are none)
    r = sentsim_cli("corpus", "build", str(SAMPLE), "--out", tmp_path / "run", "--set", "docs_per_unit=9",
                    env=job, cwd=tmp_path)
    line = error_line(r.stderr)
    assert r.returncode == 2 and "docs_per_unit" in line and "is relative" not in line, r.stderr


def test_in_a_job_a_relative_input_a_trainer_made_absolute_gets_the_hint(tmp_path):
    """A trainer makes its inputs absolute before it reads them, so its error names Ray's copy of the working
    dir, not the relative path the user typed: the hint about that copy is given all the same, for each trainer
    that reads a run. It offers s3:// only for an input that may be one."""
    from conftest import error_line

    job = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "gcs://x.zip"}})}
    hint = ("(../w/h is relative, and this Ray job runs in Ray's copy of its --working-dir, which holds neither "
            "what .gitignore lists nor anything outside it")
    for args in (("train", "surrogate", "--data", "../w/h", "--out", tmp_path / "s"),
                 ("train", "student", "--data", "../w/h", "--out", tmp_path / "st"),
                 ("train", "discriminator", "--corpus", "../w/h", "--out", tmp_path / "d")):
        r = sentsim_cli(*args, env=job, cwd=tmp_path)
        line = error_line(r.stderr)
        assert r.returncode == 2 and str(tmp_path.parent / "w" / "h") in line and hint in line, (args, r.stderr)
        assert line.endswith("every node sees, or s3://)"), line  # a run: read through the shard store
    line = error_line(sentsim_cli("remix", "../w/h", "--out", tmp_path / "r", env=job, cwd=tmp_path).stderr)
    assert hint in line and line.endswith("every node sees, or s3://)"), line  # a harvest run to remix
    # an input read from local files only is offered no object store: corpus build's input files, eval's STS folder
    for args in (("corpus", "build", "../w/h", "--out", tmp_path / "c"),
                 ("eval", "sts", "--tfidf", "--data=../w/h")):
        line = error_line(sentsim_cli(*args, env=job, cwd=tmp_path).stderr)
        assert hint in line and line.endswith("every node sees)"), line


def test_the_job_hint_offers_s3_for_a_run_given_by_set_and_not_for_a_local_file(tmp_path, monkeypatch):
    """`--set KEY=PATH` names an input as a flag does: a run (corpus, contexts.rep_cache) may be s3://, a file
    read locally (a context-model folder) may not."""
    from sentsim.cli import _job_copy_hint

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://x.zip"}}))
    monkeypatch.chdir(tmp_path)
    for key, s3 in (("contexts.rep_cache", True), ("corpus", True), ("context_models", False)):
        hint = _job_copy_hint("../w/h: no such directory", ["harvest", "--set", f"{key}=../w/h", "--out", "/o"])
        assert "../w/h is relative" in hint and hint.endswith("every node sees, or s3://)") == s3, (key, hint)


def test_cluster_yaml_passes_rays_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    validate_config(prepare_config(raw))
    types = raw["available_node_types"]
    assert any(t["resources"].get("GPU") for t in types.values())
    assert not types[raw["head_node_type"]]["resources"].get("GPU")
    assert any("make install" in c for c in raw["setup_commands"])
    assert all("127.0.0.1" in c for c in raw["head_start_ray_commands"] if "--head" in c)
    # token auth on every node, all with the same token file
    starts = [c for c in raw["head_start_ray_commands"] + raw["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token" in c for c in starts)
    assert raw["file_mounts"].get("/home/ubuntu/.ray/auth_token") == "~/.ray/auth_token"
    broken = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    broken["available_node_types"]["gpu_worker"]["not_a_field"] = 1
    import jsonschema

    with pytest.raises(jsonschema.ValidationError, match="not_a_field"):
        validate_config(prepare_config(broken))
