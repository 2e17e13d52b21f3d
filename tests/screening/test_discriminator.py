"""The BiLSTM coherence discriminator (paper 003 §3.2.1): trained inline (the shared loop in this process; its
Ray Train run is tests/training/test_train_cli.py's), held-out AUC, save/load, resume, and sentence-specific
screening scores."""

from __future__ import annotations

import gzip
import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import sentsim_cli
from run_support import without_ray

from sentsim.cli import main as cli_main
from sentsim.errors import UsageError

pytestmark = pytest.mark.slow

WIKI_DOCS = 800
TRAIN_SETTINGS = [
    "model.embed_dim=64", "model.hidden=64", "model.head_dim=64", "model.max_tokens=32",
    # one inline worker of 64 windows a step: the windows and the averaged gradient of the two Ray Train DDP workers
    # of 32 each that this trained on before, without a Ray of its own (which cost the suite ~50 s)
    "train.max_steps=100", "train.batch_size=64", "train.lr=5e-3",
]


def _build(tmp: Path, name: str, lines: list[str]) -> Path:
    from sentsim.corpus_job import build_corpus

    src = tmp / f"{name}.jsonl.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    build_corpus([str(src)], str(tmp / name), executor="inline", quiet=True)
    return tmp / name


@pytest.fixture(scope="module")
def wiki_corpus(shared_data, tmp_path_factory):
    """The first 800 articles of the Wikipedia slice: topically varied real text."""
    with gzip.open(shared_data / "corpus" / "enwiki_2014slice_docs.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, WIKI_DOCS))
    return _build(tmp_path_factory.mktemp("wiki"), "wiki", lines)


@pytest.fixture(scope="module")
def trained(wiki_corpus, tmp_path_factory):
    import torch

    out = tmp_path_factory.mktemp("disc") / "model"
    threads = torch.get_num_threads()  # the training loop sets this process's thread count: the next files get theirs
    try:
        rc = cli_main(["train", "discriminator", "--corpus", str(wiki_corpus), "--out", str(out), "--executor",
                       "inline", *itertools.chain.from_iterable(("--set", s) for s in TRAIN_SETTINGS)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    return out


def test_heldout_auc_clearly_above_chance_and_learned(trained):
    cfg = json.loads((trained / "config.json").read_text())
    m, hist = cfg["metrics"], cfg["history"]
    print("discriminator metrics:", {k: m[k] for k in ("heldout_auc", "heldout_accuracy", "fit_seconds")},
          "auc at step 0:", hist[0]["heldout_auc"])
    assert m["world_size"] == 1  # inline: this process is the one worker
    assert m["heldout_split"] == "documents" and m["heldout_windows"] >= 300
    assert m["heldout_auc"] > 0.70, m
    assert m["heldout_accuracy"] > 0.60, m
    assert m["heldout_auc_random"] > m["heldout_auc_same_doc"] > 0.5
    # training itself helped: the AUC before the first step (LSA init + cosine prior) was lower
    assert hist[0]["step"] == 0
    assert m["heldout_auc"] > hist[0]["heldout_auc"] + 0.04, (hist[0], m)


def test_saved_model_loads_and_refuses_another_corpus(trained, wiki_corpus, speech_corpus, tmp_path):
    import shutil

    from sentsim.discriminator import Discriminator

    names = {p.name for p in trained.iterdir()}
    # sentsim_model.json: the files' sizes; _train: the training state a longer run resumes from
    assert names == {"model.safetensors", "config.json", "vocab.json", "sentsim_model.json", "_train"}
    d = Discriminator.load(trained, corpus=wiki_corpus)
    reps = d.encode(["The river floods every spring.", "", "?!"])
    assert reps.shape == (3, 128) and np.isfinite(reps).all()
    np.testing.assert_allclose(reps, Discriminator.load(trained).encode(["The river floods every spring.", "", "?!"]),
                               atol=1e-6)
    with pytest.raises(UsageError, match="built for corpus"):
        Discriminator.load(trained, corpus=speech_corpus)
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    (broken / "vocab.json").write_text(json.dumps(["<pad>", "<unk>", "<empty>", "x"]))
    with pytest.raises(UsageError, match="vocab"):
        Discriminator.load(broken)
    with pytest.raises(UsageError, match="not a discriminator"):
        Discriminator.load(tmp_path)


def test_trained_head_ranks_contexts_per_sentence(trained, wiki_corpus):
    """Screening is sentence-specific: for 40 real windows of held-out documents, each centre
    sentence ranks its own context well above the others, so rankings differ between sentences."""
    from corpus.view import ChunkTable, SentenceTable
    from sentsim.discriminator import Discriminator
    from sentsim.discriminator.data import window_centres
    from sentsim.screening import ContextCache, expand_candidates, score_candidates

    d = Discriminator.load(trained, corpus=wiki_corpus)
    st = SentenceTable.load(wiki_corpus)
    rng = np.random.default_rng(3)
    centres = np.sort(rng.choice(window_centres(st.ids, 1), 40, replace=False))
    # cache only the sentences these windows need (the cache code path, on a small table)
    need = np.unique(np.concatenate([centres - 1, centres, centres + 1]))
    cache = ContextCache.build(d, SentenceTable(st.ids[need], [st.texts[p] for p in need]))
    one_slot_chunks = ChunkTable(np.arange(40), st.ids[centres], np.ones(40, np.int64))
    sub = expand_candidates(np.arange(40), np.ones(40, np.float32), one_slot_chunks, cache.sentence_ids, 1)
    assert np.array_equal(sub.centre_id, st.ids[centres])
    feats = d.project_sentences(d.encode([st.texts[p] for p in centres]))
    M = np.stack([score_candidates(d, cache, feats[i:i + 1], sub) for i in range(len(centres))])
    assert M.shape == (40, 40)
    ranks = (M > np.diag(M)[:, None]).sum(axis=1)  # 0 = own context ranked first
    assert np.mean(ranks) < 8, ranks  # chance would be 19.5
    tops = M.argmax(axis=1)
    assert len(set(tops.tolist())) > 10  # different sentences prefer different contexts


def test_inline_training_without_ray_resumes_exports_and_keeps_a_finished_model(tmp_path, speech_corpus,
                                                                             capsys, monkeypatch):
    """`--executor inline` on a machine without Ray: a run killed after its step-2 checkpoint (here: as its export
    begins) resumes there when given a larger --max-steps, and exports the files a Ray Train run does, keeping
    its training state beside them; the same command again is a no-op that says so. The finished model given a
    larger --max-steps goes on from its last checkpoint, exporting under the --out lease, which it gives back; a
    smaller one is refused; a model whose run was not marked finished is still this command's, unless a file of
    it was cut short (then it is written again); --force-new starts over. --num-workers 2 is taken as 1 and
    --address is said to be unused."""
    import subprocess
    import sys

    import torch

    import sentsim.discriminator.train as T
    from sentsim.identity import checkpoint_hash, model_files
    from storage.lease import LEASE

    env = without_ray(tmp_path)
    sets = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.batch_size=8", "train.max_heldout_windows=32"]
    out = tmp_path / "disc"
    args = ["train", "discriminator", "--executor", "inline", "--corpus", str(speech_corpus), "--out", str(out),
            "--num-workers", "2", *(x for s in sets for x in ("--set", s))]
    # killed once its training is checkpointed: the process ends where the export would begin
    kill = ("import os, sys, sentsim.discriminator.train as t; t.export_model = lambda *a, **k: os._exit(137); "
            "from sentsim.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", kill, *args, "--max-steps", "2"], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=300)
    assert r.returncode == 137, (r.stdout[-3000:], r.stderr[-3000:])
    assert (out / "_train" / "checkpoint" / "state.pt").is_file() and not (out / "_train" / "ray").exists()
    assert not (out / "config.json").exists()

    r = sentsim_cli(*args, "--max-steps", "4", "--address", "127.0.0.1:1", env=env)  # no cluster there to dial
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    assert "note: --address is not used (--executor inline runs in this process)" in r.stderr
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "vocab.json", "sentsim_model.json",
                                               "_train"}
    assert (out / "_train" / "checkpoint" / "state.pt").is_file() and not (out / "_train" / LEASE).exists()
    cfg = json.loads((out / "config.json").read_text())
    assert [h["step"] for h in cfg["history"]] == [0, 2, 4]  # resumed at step 2, not trained again from 0
    assert cfg["metrics"]["world_size"] == 1 and cfg["train"]["num_workers"] == 1  # one process, one worker
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 4

    def model_bytes() -> tuple:
        return checkpoint_hash(str(out)), {str(f.relative_to(out)): f.read_bytes() for f in model_files(out)}

    def in_process(*more: str) -> str:
        """The command in this process (a subprocess's start-up would cost more than the checks): its stdout."""
        threads = torch.get_num_threads()  # the training loop sets this process's thread count
        try:
            assert cli_main([*args, *more]) == 0
        finally:
            torch.set_num_threads(threads)
        return capsys.readouterr().out

    # the same command again
    before = model_bytes()
    again = in_process("--max-steps", "4")
    assert f"[discriminator] --out {out} already holds this finished model" in again
    assert "starting" not in again and "resuming" not in again and model_bytes() == before

    # a larger --max-steps goes on from the finished model's last checkpoint, and the export is written under the
    # --out lease; a Ray Train run's state beside it (not the model's) goes with that export
    (out / "_train" / "ray" / "discriminator").mkdir(parents=True)
    held = []
    export = T.export_model
    monkeypatch.setattr(T, "export_model", lambda o, state, *a, **k: (held.append((state / LEASE).is_file()),
                                                                     export(o, state, *a, **k)))
    weights_at_4 = (out / "model.safetensors").read_bytes()
    longer = in_process("--max-steps", "5")
    assert "resuming at step 4" in longer and held == [True]
    cfg = json.loads((out / "config.json").read_text())
    assert [h["step"] for h in cfg["history"]] == [0, 2, 4, 5] and cfg["metrics"]["step"] == 5
    # its one step trained at its own plan's lr, not at the finished plan's last (0, which changed nothing)
    assert (out / "model.safetensors").read_bytes() != weights_at_4
    assert not (out / "_train" / LEASE).exists() and not (out / "_train" / "ray").exists()
    assert (out / "_train" / "checkpoint" / "state.pt").is_file()
    before = model_bytes()
    again = in_process("--max-steps", "5")
    assert "already holds this finished model" in again and "resuming" not in again and model_bytes() == before

    # a smaller budget is refused in one line: resumed, it would export the step-6 weights labelled as 2 steps;
    # refused, it leaves every file as it was (its run record and vocabulary too)
    def files() -> dict:
        return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}

    unrefused = files()
    assert cli_main([*args, "--max-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "is at step 5, past the 2 steps this run plans" in err and len(err.strip().splitlines()) == 1, err
    assert model_bytes() == before and files() == unrefused
    # the run's record without its "finished" (as a kill after the export and before mark_finished, or a longer
    # run killed before its own export leaves it): the model this command exported is still its finished one
    run_json = out / "_train" / "run.json"
    rec = json.loads(run_json.read_text())
    rec.pop("finished", None)
    run_json.write_text(json.dumps(rec))
    again = in_process("--max-steps", "5")
    assert "already holds this finished model" in again and "resuming" not in again and model_bytes() == before
    assert "finished" in json.loads(run_json.read_text())  # recorded again: the next rerun reads it as before
    # a model file cut short is no finished model: the same command writes it again, whole, from its state
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    again = in_process("--max-steps", "5")
    assert "already holds this finished model" not in again, again
    assert weights.read_bytes() == before[1]["model.safetensors"]
    assert "already holds this finished model" in in_process("--max-steps", "5")

    # --force-new discards the run and its model: trained again from step 0
    fresh = in_process("--max-steps", "2", "--force-new")
    assert "starting" in fresh and "resuming" not in fresh
    assert [h["step"] for h in json.loads((out / "config.json").read_text())["history"]] == [0, 2]


def test_a_force_new_run_refused_after_its_claim_keeps_the_old_run_whole(tmp_path, speech_corpus, capsys, ray_local):
    """--force-new discards the run at --out (its state in _train, its model) when the new run goes ahead, not when
    it claims --out: a run refused after its claim (on Ray, where the inline run before it had its one worker: a
    batch no window fills, workers the cluster cannot hold) exits 2 in one line and leaves every file as it was,
    so the old command is still a no-op; a --force-new run that goes ahead replaces the model."""
    import torch
    from conftest import error_line
    from harvest_support import cli_in_process

    from sentsim.identity import checkpoint_hash

    sets = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.batch_size=8", "train.max_heldout_windows=32"]
    out = tmp_path / "disc"
    args = ["train", "discriminator", "--corpus", str(speech_corpus), "--out", str(out), "--max-steps", "2",
            *(x for s in sets for x in ("--set", s))]

    def files() -> dict:
        return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}

    threads = torch.get_num_threads()  # the training loop sets this process's thread count
    try:
        r = cli_in_process(capsys, *args, "--executor", "inline")
        assert r.returncode == 0, r.stderr[-3000:]
        old_fp = json.loads((out / "_train" / "run.json").read_text())["fingerprint"]
        old_model = checkpoint_hash(str(out))
        before = files()
        assert {"config.json", "model.safetensors", "_train/run.json", "_train/checkpoint/state.pt"} <= set(before)
        for refused, said in (
                (["--executor", "ray", "--set", "train.max_train_windows=4", "--set", "train.num_workers=8"],
                 "discriminator: 4 training rows cannot fill one batch of 8 per worker (8 worker(s))"),
                (["--executor", "ray", "--set", "train.num_workers=3"], "3 worker(s) of 1 CPU each ask for 3 CPUs")):
            r = cli_in_process(capsys, *args, *refused, "--force-new")
            assert r.returncode == 2 and "Traceback" not in r.stderr, (refused, r.stderr[-3000:])
            assert said in error_line(r.stderr) and len(r.stderr.strip().splitlines()) == 1, (refused, r.stderr)
            assert files() == before, refused
        r = cli_in_process(capsys, *args, "--executor", "inline")
        assert r.returncode == 0 and "already holds this finished model" in r.stdout, r.stdout[-3000:]
        assert files() == before

        r = cli_in_process(capsys, *args, "--executor", "inline", "--set", "train.lr=0.01", "--force-new")
        assert r.returncode == 0 and "starting" in r.stdout, r.stderr[-3000:]
    finally:
        torch.set_num_threads(threads)
    rec = json.loads((out / "_train" / "run.json").read_text())
    assert rec["fingerprint"] != old_fp and rec["job"]["train"]["lr"] == 0.01 and "finished" in rec
    # the weights, not only the hash: config.json, one of the hashed model files, holds the fit's timings
    # (fit_seconds, each history point's time_s), which alone would tell two runs of equal weights apart
    assert (out / "model.safetensors").read_bytes() != before["model.safetensors"][0]
    assert checkpoint_hash(str(out)) != old_model


def test_a_model_rewritten_from_the_other_executors_finished_state_keeps_that_state(tmp_path, speech_corpus,
                                                                                    capsys, ray_local):
    """A model file cut short, asked for on Ray where the inline run finished it: the fit is found finished in
    the inline state, the model is written again from it, and that state stays (the export removes only the
    executor's state the model did not come from), so a larger budget inline still goes on from it."""
    import torch

    from sentsim.cli import main as cli_main

    sets = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.batch_size=8", "train.max_heldout_windows=32", "train.num_workers=1"]
    out = tmp_path / "disc"
    args = ["train", "discriminator", "--corpus", str(speech_corpus), "--out", str(out), "--max-steps", "2",
            *(x for s in sets for x in ("--set", s))]
    threads = torch.get_num_threads()  # the training loop sets this process's thread count
    try:
        assert cli_main([*args, "--executor", "inline"]) == 0
        weights = out / "model.safetensors"
        whole = weights.read_bytes()
        weights.write_bytes(whole[:1000])
        capsys.readouterr()
        assert cli_main([*args, "--executor", "ray"]) == 0
        said = capsys.readouterr().out
        assert "already trained to step 2" in said and "starting" not in said, said[-2000:]
        assert weights.read_bytes() == whole and (out / "_train" / "checkpoint" / "state.pt").is_file()
        longer = [a if a != "2" else "3" for a in args]  # --max-steps 3
        assert cli_main([*longer, "--executor", "inline"]) == 0
        assert "resuming at step 2" in capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)


def test_corpus_without_windows_is_a_usage_error(tmp_path, capsys):
    corpus = _build(tmp_path, "tiny", [
        json.dumps({"id": "a", "paragraphs": ["Only one sentence here."]}) + "\n",
        json.dumps({"id": "b", "paragraphs": ["Two sentences. Still too short."]}) + "\n"])
    rc = cli_main(["train", "discriminator", "--corpus", str(corpus), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert rc == 2 and "window" in err and "Traceback" not in err
    assert cli_main(["train", "discriminator", "--corpus", str(corpus), "--out", str(tmp_path / "m"),
                     "--set", "model.hidden=0"]) == 2
    assert "model.hidden" in capsys.readouterr().err


def test_one_document_split_and_negatives():
    from sentsim.discriminator.data import batch_windows, doc_ranges, sample_negatives, split_heldout, window_centres

    ids = np.arange(30, dtype=np.int64) + (7 << 20)  # one document of 30 sentences
    c = window_centres(ids, 2)
    assert c.tolist() == list(range(2, 28))
    train, held, how = split_heldout(ids, c, 0.2, seed=0)
    assert how.startswith("window tail") and len(held) == 5 and set(train).isdisjoint(held)
    two_docs = np.concatenate([ids, np.arange(10, dtype=np.int64) + (9 << 20)])
    c2 = window_centres(two_docs, 1)
    assert 29 not in c2 and 30 not in c2  # document edges never centre a window
    s, e, _ = doc_ranges(two_docs)
    rng = np.random.default_rng(0)
    neg = sample_negatives(c2, two_docs, s, e, 0.5, rng)
    assert np.all(neg != c2)
    same = (two_docs[neg] >> 20) == (two_docs[c2] >> 20)
    assert 0.2 < same.mean() < 1.0
    uniq, L, C, R, y = batch_windows(c2[:4], neg[:4], 1)
    assert y.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert np.array_equal(uniq[L[:4, 0]], c2[:4] - 1) and np.array_equal(uniq[C[4:]], neg[:4])
    with pytest.raises(UsageError):
        split_heldout(ids[:3], window_centres(ids[:3], 1), 0.1, 0)
