"""bench/reference_teacher.py (`make reference`) end to end on a few documents of each shared corpus.

The real script and the real `sentsim` commands it runs, at a size a test can afford: corpus, index,
the warm-start context model to one milestone, and with --discriminator the coherence discriminator
and its rep cache. A second run finds every step done and redoes none of them, a kept
discriminator trained from other settings is refused rather than reused, a milestone the model has
already trained past is not snapshotted under its name, and `--seed 1` trains a second seed beside the
first, in folders of its own.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPORA = ("enwiki_2014slice_docs.jsonl.gz", "gutenberg_docs.jsonl.gz", "us_speeches_docs.jsonl.gz")


def _tiny_data(shared: Path, out: Path) -> Path:
    """The first documents of each shared corpus, each cut to its first 60 paragraphs."""
    (out / "corpus").mkdir(parents=True)
    for name, docs in zip(CORPORA, (400, 1, 1)):  # 0.5% of articles are held out
        with gzip.open(shared / "corpus" / name, "rt") as src, gzip.open(out / "corpus" / name, "wt") as dst:
            for _, line in zip(range(docs), src):
                doc = json.loads(line)
                doc["paragraphs"] = doc["paragraphs"][:60]
                dst.write(json.dumps(doc) + "\n")
    return out


def _reference(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([sys.executable, str(ROOT / "bench" / "reference_teacher.py"), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def first_build(shared_data, tmp_path_factory) -> dict:
    """One `make reference --discriminator` from nothing, shared by the file's tests (its corpus, index and
    seed-0 model are what the second seed is trained beside)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    data = _tiny_data(shared_data, tmp_path / "data")
    disc = tmp_path / "disc.yaml"
    disc.write_text("model: {embed_dim: 16, hidden: 16, head_dim: 16, vocab_size: 2000}\n"
                    "train: {batch_size: 8, max_steps: 4, eval_every: 4}\n")
    base = ("--data", data, "--cache", tmp_path / "cache", "--milestones", "200", "--threads", "1")
    args = (*base, "--discriminator", "--discriminator-config", disc)
    r = _reference(*args)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return {"tmp": tmp_path, "disc": disc, "base": base, "args": args, "first": r}


def test_reference_builds_the_teacher_and_the_discriminator_and_a_rerun_redoes_nothing(first_build):
    tmp_path, disc, args, r = (first_build[k] for k in ("tmp", "disc", "args", "first"))
    # the recipe trains in fp32 on every CPU (configs/reference_context.yaml pins bf16: off), so the model
    # does not depend on the CPU's flags; on a CPU with native bf16 `auto` would have said "on cpu bf16"
    assert "[context shared] 1 worker(s) on cpu;" in r.stdout + r.stderr
    ref = tmp_path / "cache" / "reference"
    done = json.loads((ref / "DONE-enwiki.json").read_text())
    assert done["train_on"] == ["enwiki"] and done["milestones"] == [200]
    assert {"corpus_s", "index_s", "training_s", "discriminator_s", "rep_cache_s"} <= set(done["times"])
    snap = ref / "snapshots-enwiki" / "tokens-200"
    summary = json.loads((snap / "train_summary.json").read_text())
    # the bundle at the milestone, without the training state
    assert summary["runs"]["shared"]["target_tokens_seen"] >= 200 and not (snap / "runs").exists()
    # the discriminator was trained with the given settings, and its cache covers every corpus sentence
    cfg = json.loads((ref / "discriminator" / "config.json").read_text())
    assert cfg["model"]["hidden"] == 16 and (ref / "discriminator" / "model.safetensors").is_file()
    assert (ref / "rep_cache" / "_COMPLETE").exists()
    n_sentences = ds.dataset(str(ref / "corpus" / "sentences")).count_rows()
    cache = json.loads((ref / "rep_cache" / "manifest.json").read_text())
    assert cache["counts"]["sentences"] == n_sentences > 100
    assert f"--set discriminator={ref / 'discriminator'}" in r.stdout

    # a second run: every step is found done, nothing is trained or encoded again
    stamps = {p: p.stat().st_mtime_ns for p in (ref / "discriminator" / "model.safetensors",
                                                snap / "context.json", ref / "rep_cache" / "manifest.json")}
    r = _reference(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "$ sentsim" not in r.stdout  # no command ran
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    # the skipped steps keep the times they took; training's is the trainer's own cumulative count
    again = json.loads((ref / "DONE-enwiki.json").read_text())
    assert again["times"] == done["times"] and set(done["times"]["training_s"]) == {"200"}
    assert done["times"]["training_s"]["200"] == round(summary["runs"]["shared"]["train_seconds"], 1) > 0
    assert done["trained_in"] == {"200": {"fp32": summary["runs"]["shared"]["steps"]}}
    # and by thread count (--threads 1): a rebuild matches bit for bit only with the same seed, format and count
    assert done["trained_threads"] == {"200": {"1": summary["runs"]["shared"]["steps"]}}

    # a kept snapshot trained in another format than the recipe pins (one from before the pin, trained in
    # bf16 on a CPU that has it): kept, but said, with what to move to rebuild it
    bf16 = dict(summary, runs={"shared": dict(summary["runs"]["shared"], precision_steps={"bf16": 5, "fp32": 2})})
    (snap / "train_summary.json").write_text(json.dumps(bf16))
    r = _reference(*args)
    assert r.returncode == 0 and "$ sentsim" not in r.stdout
    assert "trained 5 steps in bf16, but the recipe trains fp32" in r.stderr and str(snap.parent) in r.stderr
    assert json.loads((ref / "DONE-enwiki.json").read_text())["trained_in"] == {"200": {"bf16": 5, "fp32": 2}}
    (snap / "train_summary.json").write_text(json.dumps(summary))

    # a milestone below where training already stands (the list changed after training went past it):
    # said, and not snapshotted, since the copy would be the 200-token model named as the 100-token one
    lower = ("--milestones", "100,200")
    r = _reference(*args[:4], *lower, *args[6:])
    assert r.returncode == 0 and "$ sentsim" not in r.stdout, r.stderr[-2000:]
    assert "no snapshot at 100 target tokens" in r.stderr and "has trained to" in r.stderr
    assert not (ref / "snapshots-enwiki" / "tokens-100").exists()
    assert json.loads((ref / "DONE-enwiki.json").read_text())["milestones"] == [200]
    # a snapshot lost after training stopped at it (a kill during the copy) is copied again, not skipped
    shutil.rmtree(snap)
    r = _reference(*args)
    assert r.returncode == 0 and "no snapshot" not in r.stderr, r.stderr[-2000:]
    again = json.loads((snap / "train_summary.json").read_text())["runs"]["shared"]
    assert again["target_tokens_seen"] == summary["runs"]["shared"]["target_tokens_seen"]
    stamps[snap / "context.json"] = (snap / "context.json").stat().st_mtime_ns

    # other settings than the kept discriminator was trained with: refused in one line, not reused
    other = tmp_path / "other.yaml"
    other.write_text(disc.read_text().replace("hidden: 16", "hidden: 24"))
    r = _reference(*args[:-1], other)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "$ sentsim" not in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and "(model.hidden)" in r.stderr and "move that folder" in r.stderr
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())

    # a discriminator config the command refuses: named by the command that read it, no traceback
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {batch_size: 0}\n")
    shutil.rmtree(ref / "discriminator")
    r = _reference(*args[:-1], bad)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "batch_size" in r.stderr and "sentsim train discriminator` exited" in r.stderr
    assert "$ sentsim train context" not in r.stdout  # the steps before it were found done


def test_a_second_seed_trains_beside_the_first_in_its_own_folders(first_build):
    tmp_path, base = first_build["tmp"], first_build["base"]
    r = _reference(*base, "--seed", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    # corpus and index are shared (found done); only the context model is trained again
    assert "$ sentsim corpus" not in r.stdout and "$ sentsim index" not in r.stdout
    assert "$ sentsim train context" in r.stdout and "--set seed=1" in r.stdout
    ref = tmp_path / "cache" / "reference"
    first, second = (ref / f"snapshots-enwiki{s}" / "tokens-200" for s in ("", "-seed1"))
    assert json.loads((first / "train_summary.json").read_text())["config"]["seed"] == 0
    assert json.loads((second / "train_summary.json").read_text())["config"]["seed"] == 1
    weights = "models/shared/model.safetensors"
    assert (first / weights).read_bytes() != (second / weights).read_bytes()
    assert json.loads((ref / "DONE-enwiki-seed1.json").read_text())["seed"] == 1
    assert json.loads((ref / "DONE-enwiki.json").read_text())["seed"] == 0
    # not a seed: one line from the argument parser, nothing run
    r = _reference(*base, "--seed", "x1")
    assert r.returncode == 2 and "is not a seed" in r.stderr and "Traceback" not in r.stderr
