"""Context models: tokenizer, sentence-position embeddings, save/load, training (inline and Ray Train), resume."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from sentsim.context.config import ContextModelConfig, ContextTrainConfig, ScorerConfig
from sentsim.context.model import build_model, load_bundle, save_bundle
from sentsim.context.tokenizer import ContextTokenizer, train_bpe
from sentsim.context.windows import build_example, iter_documents

TINY_MODEL = dict(vocab_size=500, d_model=64, encoder_layers=1, decoder_layers=1, attention_heads=2, ffn_dim=128,
                  dropout=0.0, context_sentences=1, max_source_tokens=96, max_target_tokens=48)
TRAIN = dict(lr=3e-3, warmup_steps=20, batch_tokens=1500, heldout_percent=20, heldout_windows=64,
             tokenizer_sentences=5000, shuffle_buffer=512, torch_threads=1, cpus_per_worker=0.5)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus_dir(speech_corpus):
    """The foundation's corpus (ingestion contract: sentences/part-*.parquet), ~3.8K speech sentences."""
    return str(speech_corpus)


def _sets(**kw) -> list[str]:
    out = [f"model.{k}={v}" for k, v in TINY_MODEL.items()]
    out += [f"{k}={v}" for k, v in {**TRAIN, **kw}.items()]
    return [x for kv in out for x in ("--set", kv)]


def test_tokenizer_roundtrip(tmp_path, corpus_dir):
    docs = list(iter_documents(corpus_dir, 20.0, "train"))[:5]
    tok = train_bpe((s for d in docs for s in d), 400)
    assert tok.vocab_size <= 400 and tok.ids["pad"] == 0
    tok.save(tmp_path)
    again = ContextTokenizer.load(tmp_path)
    assert again.sha256 == tok.sha256
    s = docs[0][0]
    assert again.decode(again.encode([s])[0]).strip() == s.strip()


def test_sentence_positions_and_roundtrip(tmp_path, corpus_dir):
    docs = list(iter_documents(corpus_dir, 20.0, "train"))[:3]
    tok = train_bpe((s for d in docs for s in d), 400)
    cfg = ContextModelConfig(**{**TINY_MODEL, "vocab_size": 400})
    m = build_model(cfg, tok).eval()
    ex = build_example(tok.ids, 1, "fwd", tok.encode(docs[0][:1]), tok.encode(docs[0][1:2])[0],
                       tok.encode(docs[0][2:3]), 96, 48)
    args = [torch.tensor([ex.src]), torch.tensor([ex.src_slots]), torch.ones(1, len(ex.src), dtype=torch.long),
            torch.tensor([[tok.bos_id] + ex.tgt[:-1]]), torch.tensor([[0] + ex.tgt_slots[:-1]])]
    with torch.no_grad():
        a = m(*args)
        moved = list(args)
        moved[1] = torch.zeros_like(args[1])  # same tokens, other sentence positions
        b = m(*moved)
    assert not torch.allclose(a, b), "sentence-position embeddings must reach the model"
    save_bundle(tmp_path, cfg, tok, {"shared": m}, {"fwd": "shared"})
    assert (tmp_path / "models/shared/model.safetensors").is_file()
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.pt"))
    _, _, loaded = load_bundle(tmp_path)
    with torch.no_grad():
        c = loaded["fwd"].eval()(*args)
    torch.testing.assert_close(a, c)


@pytest.mark.slow
def test_training_lowers_heldout_loss(tmp_path, corpus_dir):
    from sentsim.cli import main

    out = tmp_path / "model"
    rc = main(["train", "context", "--corpus", corpus_dir, "--direction", "all", "--out", str(out),
               *_sets(executor="inline", max_steps=150, eval_every=150, checkpoint_every=150)])
    assert rc == 0
    summary = json.loads((out / "train_summary.json").read_text())
    run = summary["runs"]["shared"]
    assert run["steps"] == 150 and run["tokens_seen"] > 0
    for d in ("fwd", "left", "right"):
        before, after = run["initial_eval"][d], run["final_eval"][d]
        assert after["loss"] < before["loss"] - 1.0, (d, before["loss"], after["loss"])
        assert after["perplexity"] < before["perplexity"] / 2
        assert "context_gap" in after and after["shuffled_loss"] > 0
    # the bundle scores
    from sentsim.context.scorer import ContextScorer

    res = ContextScorer(str(out), ScorerConfig(device="cpu")).score([("A sentence.", ["Before."], ["After."])])
    assert res.score[0] == res.score[0]


@pytest.mark.slow
def test_killed_run_resumes_from_checkpoint(tmp_path, corpus_dir):
    out = tmp_path / "model"
    cmd = [sys.executable, "-m", "sentsim.cli", "train", "context", "--corpus", corpus_dir, "--direction", "fwd",
           "--out", str(out), *_sets(executor="inline", max_steps=100000, eval_every=100000, checkpoint_every=6)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    from sentsim.training.loop import STATE_FILE, inline_checkpoint

    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            if inline_checkpoint(out / "runs" / "fwd") is not None:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.5)
        else:
            pytest.fail("no checkpoint within 120 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ck = inline_checkpoint(out / "runs" / "fwd")
    resumed_from = torch.load(ck / STATE_FILE, weights_only=True)["step"]
    assert resumed_from >= 6
    from sentsim.cli import main

    rc = main(["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
               *_sets(executor="inline", max_steps=resumed_from + 5, eval_every=100000, checkpoint_every=6)])
    assert rc == 0
    recs = json.loads((out / "runs/fwd/history.json").read_text())
    assert [r["step"] for r in recs].count(0) == 1, "the initial evaluation is not redone on resume"
    assert recs[-1]["step"] == resumed_from + 5
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["runs"]["fwd"]["steps"] == resumed_from + 5
    assert json.loads((out / "context.json").read_text())["directions"] == {"fwd": "models/fwd"}


def test_a_run_from_before_micro_batches_resumes_with_the_setting_the_refusal_names(tmp_path, corpus_dir, capsys):
    """A bucketed run recorded before `micro_batches` existed trained one micro-batch a step: resumed under
    today's default it is refused in one line naming the setting that resumes it, and resumes with it."""
    from sentsim.cli import main

    out = tmp_path / "model"
    args = ["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out)]
    sets = dict(executor="inline", eval_every=100000, checkpoint_every=1)
    assert main(args + _sets(micro_batches=1, max_steps=2, **sets)) == 0
    run = json.loads((out / "run.json").read_text())
    del run["config"]["micro_batches"]  # as such a run recorded its config
    (out / "run.json").write_text(json.dumps(run))
    capsys.readouterr()
    assert main(args + _sets(max_steps=3, **sets)) == 2
    err = capsys.readouterr().err
    assert "--set micro_batches=1" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(args + _sets(micro_batches=1, max_steps=3, **sets)) == 0
    assert json.loads((out / "train_summary.json").read_text())["runs"]["fwd"]["steps"] == 3


@pytest.mark.slow
def test_compiled_training_takes_the_eager_steps_and_compiles_once_for_every_batch_shape(tmp_path, corpus_dir):
    """`compile: true` (for GPUs; here on the CPU) trains the step's loss as one compiled graph for every batch
    shape of the bucketed stream: the losses are eager's step by step, and a run resumes with it switched."""
    from torch._dynamo.utils import counters

    from sentsim.cli import main

    def train(out, steps, **kw):
        assert main(["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
                     *_sets(executor="inline", max_steps=steps, eval_every=100000, checkpoint_every=3, log_every=1,
                            bf16="off", **kw)]) == 0
        return [h["train_loss"] for h in json.loads((out / "runs" / "fwd" / "history.json").read_text())
                if h.get("train_loss") is not None]

    eager = train(tmp_path / "eager", 6)
    torch._dynamo.reset()
    counters.clear()
    compiled = train(tmp_path / "compiled", 6, compile="true")
    assert len(compiled) == len(eager) == 6
    assert compiled == pytest.approx(eager, rel=1e-4)
    # each step has micro-batches of new shapes; a one-row batch may be specialised once
    assert 1 <= counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    assert train(tmp_path / "compiled", 8)[:6] == compiled  # resumed eager from its step-6 checkpoint


def test_a_finished_run_run_again_trains_no_further(tmp_path, corpus_dir):
    """A target-token budget already spent (the same command again, or a smaller budget on a bundle trained
    past it) trains no step: one more would move the model past the budget it is named by."""
    from sentsim.cli import main

    out = tmp_path / "model"

    def train(budget: int) -> dict:
        assert main(["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
                     *_sets(executor="inline", max_steps=100000, max_target_tokens=budget, eval_every=100000,
                            checkpoint_every=1)]) == 0
        return json.loads((out / "train_summary.json").read_text())["runs"]["fwd"]

    first = train(300)
    weights = (out / "models" / "fwd" / "model.safetensors").read_bytes()
    assert first["target_tokens_seen"] >= 300 and first["steps"] >= 1
    for budget in (300, 100):
        again = train(budget)
        assert (again["steps"], again["target_tokens_seen"]) == (first["steps"], first["target_tokens_seen"])
        assert (out / "models" / "fwd" / "model.safetensors").read_bytes() == weights


def test_a_run_refused_for_a_smaller_budget_leaves_out_as_it_was(tmp_path, corpus_dir, capsys):
    """A budget below the state's step is refused (a model is not trained back), and the refused run leaves
    every file of --out as it was, run.json included: the finished run's command again is then the no-op it
    was, not a resume at its last step that trains nothing and writes the bundle again."""
    from sentsim.cli import main

    out = tmp_path / "model"

    def args(steps: int) -> list:
        return ["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
                *_sets(executor="inline", max_steps=steps, eval_every=100000, checkpoint_every=1)]

    def files() -> dict:
        return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}

    assert main(args(2)) == 0
    before = files()
    capsys.readouterr()
    assert main(args(1)) == 2
    err = capsys.readouterr().err
    assert "is at step 2, past the 1 step this run plans" in err and "Traceback" not in err, err
    assert files() == before
    assert main(args(2)) == 0
    assert "already holds this finished bundle" in capsys.readouterr().out
    assert files() == before


def test_a_force_new_run_refused_after_its_claim_keeps_the_old_run_whole(tmp_path, corpus_dir, capsys, ray_session):
    """--force-new discards the bundle at --out (its runs, tokenizer and model files) when the new run goes
    ahead, not when it claims --out: a run refused after its claim (inline, too few held-out windows; on Ray,
    workers the cluster cannot hold) exits 2 in one line and leaves every file as it was, so the old command is
    still a no-op; a --force-new run that goes ahead replaces the bundle."""
    from conftest import error_line

    from sentsim.cli import main
    from sentsim.identity import checkpoint_hash

    out = tmp_path / "model"

    def args(*more: str, **kw) -> list:
        return ["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
                *_sets(**{"executor": "inline", "max_steps": 1, "eval_every": 100000, "checkpoint_every": 1, **kw}),
                *more]

    def files() -> dict:
        return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}

    assert main(args()) == 0
    old_fp, old_bundle = json.loads((out / "run.json").read_text())["fingerprint"], checkpoint_hash(str(out))
    before = files()
    assert {"context.json", "run.json", "tokenizer/tokenizer.json"} <= set(before), sorted(before)
    for refused, said in (({"heldout_percent": 0.01}, "fewer than 2 held-out windows"),
                          ({"executor": "ray", "num_workers": 5}, "5 worker(s) of 0.5 CPU each ask for 2.5 CPUs")):
        capsys.readouterr()
        assert main(args("--force-new", **refused)) == 2, refused
        err = capsys.readouterr().err
        assert said in error_line(err) and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert files() == before, refused
    assert main(args()) == 0 and "already holds this finished bundle" in capsys.readouterr().out
    assert files() == before

    # warm-up 0: the one step runs at lr 1e-3 (the old run's first step, at warm-up's lr 0, left the seeded
    # initial weights), so the replaced bundle differs in its weights, not only in context.json's timings
    old_weights = (out / "models" / "fwd" / "model.safetensors").read_bytes()
    assert main(args("--force-new", lr=1e-3, warmup_steps=0)) == 0
    rec = json.loads((out / "run.json").read_text())
    assert rec["fingerprint"] != old_fp and rec["config"]["lr"] == 1e-3 and "finished" in rec
    assert (out / "models" / "fwd" / "model.safetensors").read_bytes() != old_weights
    assert checkpoint_hash(str(out)) != old_bundle


def test_a_corpus_of_one_text_file_is_told_that_a_file_is_one_document(tmp_path, capsys):
    """A plain-text input is one document, and the held-out split takes whole documents: a corpus built from one
    file holding several speeches has one document, so one of the splits is empty. The refusal says so, with
    what to do, instead of only "raise heldout_percent or use a larger corpus" (which cannot help)."""
    import gzip

    from conftest import SAMPLE, error_line

    from sentsim.cli import main
    from sentsim.corpus_job import build_corpus

    speeches = [json.loads(line)["paragraphs"] for line in gzip.open(SAMPLE, "rt")][:3]
    text = tmp_path / "all.txt"
    text.write_text("\n\n".join(p for paragraphs in speeches for p in paragraphs), encoding="utf-8")
    corpus = tmp_path / "corpus"
    build_corpus([str(text)], str(corpus), executor="inline", quiet=True)
    capsys.readouterr()
    rc = main(["train", "context", "--corpus", str(corpus), "--direction", "fwd", "--out", str(tmp_path / "m"),
               *_sets(executor="inline", max_steps=1, heldout_percent=40)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (f"({corpus} holds 1 document(s), of which heldout_percent=40.0 holds out about 0.4: the split takes whole "
            "documents, and a plain-text input file is one document; give `sentsim corpus build` one file per "
            "document") in error_line(err), err


def test_a_tokenizer_cut_short_at_out_is_one_line_naming_it_and_force_new(tmp_path, corpus_dir):
    """A kill while the trainer saved OUT/tokenizer/ left a cut-off tokenizer.json, and every later run with that
    --out stopped in the tokenizers library's bare traceback. The save is now whole or absent (roles first,
    tokenizer.json last, each renamed into place); a file that still does not read is refused in one line
    naming it and --force-new, which starts the run over."""
    from conftest import error_line, sentsim_cli

    from sentsim.cli import main

    out = tmp_path / "model"
    args = ["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
            *_sets(executor="inline", max_steps=1, eval_every=100000, checkpoint_every=1)]
    assert main(args) == 0
    assert not (out / "_LEASE").exists()  # given back when the call returned: the next command is not refused
    tok = out / "tokenizer" / "tokenizer.json"
    assert (out / "tokenizer" / "tokenizer_roles.json").is_file()
    assert sorted(p.name for p in tok.parent.iterdir()) == ["tokenizer.json", "tokenizer_roles.json"]
    tok.write_bytes(tok.read_bytes()[:1000])  # as a kill mid-write of the old, in-place save left it
    again = [a if a != "max_steps=1" else "max_steps=2" for a in args]  # unfinished: it resumes
    r = sentsim_cli(*again, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    assert str(tok) in line and "--force-new" in line and "not a readable tokenizer" in line
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert main([*again, "--force-new"]) == 0
    assert ContextTokenizer.load(out / "tokenizer").vocab_size > 0


def test_a_kill_while_the_trainer_writes_its_reports_leaves_the_last_ones_whole(tmp_path, corpus_dir, monkeypatch):
    """train_summary.json and each run's history.json are renamed into place whole: a kill while the resumed
    run writes its summary leaves the last run's, not half a new one, and no temporary file in sight."""
    from run_support import Killed, killed_before_renaming

    from sentsim.cli import main

    out = tmp_path / "model"
    args = ["train", "context", "--corpus", corpus_dir, "--direction", "fwd", "--out", str(out),
            *_sets(executor="inline", max_steps=1, eval_every=100000, checkpoint_every=1)]
    assert main(args) == 0
    summary = (out / "train_summary.json").read_bytes()
    renamed = killed_before_renaming(monkeypatch, "train_summary.json")
    with pytest.raises(Killed):
        main([a if a != "max_steps=1" else "max_steps=2" for a in args])
    assert (out / "train_summary.json").read_bytes() == summary
    assert json.loads(summary)["runs"]["fwd"]["steps"] == 1
    history = out / "runs" / "fwd" / "history.json"
    assert str(history) in renamed and json.loads(history.read_text())[-1]["step"] == 2
    assert not [p for p in out.rglob(".tmp-*")]


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.slow
def test_ray_train_ddp_two_workers(tmp_path, corpus_dir, ray_session):
    from sentsim.context.train import train_context

    cfg = ContextTrainConfig.model_validate({
        "model": TINY_MODEL, **TRAIN, "direction": "right", "executor": "ray", "num_workers": 2,
        "max_steps": 4, "eval_every": 4, "checkpoint_every": 4, "heldout_windows": 16})
    summary = train_context(corpus_dir, str(tmp_path / "m"), cfg)
    run = summary["runs"]["right"]
    assert run["steps"] == 4
    assert set(run["final_eval"]) == {"right"}
    _, _, models = load_bundle(tmp_path / "m")
    assert set(models) == {"right"}

    # the executor is no setting of the run, and the inline one does not read Ray Train's checkpoints: asked
    # inline with the same settings and budget, the bundle is finished (nothing trained, every byte kept); a
    # smaller budget is refused as on Ray, a larger one naming the executor that continues it, both before the
    # run goes ahead (its record is written), so its run record keeps the bundle finished for either executor
    from sentsim.errors import UsageError
    from sentsim.identity import checkpoint_hash

    out = tmp_path / "m"

    def kept() -> tuple:
        state = {str(f.relative_to(out)) for f in (out / "runs").rglob("*")}
        files = {str(f.relative_to(out)): f.read_bytes() for f in out.rglob("*") if f.is_file()
                 and "runs" not in f.relative_to(out).parts}
        return checkpoint_hash(str(out)), files, state

    before = kept()
    inline = cfg.model_copy(update={"executor": "inline"})
    assert train_context(corpus_dir, str(out), inline)["runs"]["right"]["steps"] == 4 and kept() == before
    for steps, said in ((3, "is at step 4, past the 3 steps this run plans"),
                        (6, "at step 4 on --executor ray, which --executor inline does not read")):
        with pytest.raises(UsageError) as refused:
            train_context(corpus_dir, str(out), inline.model_copy(update={"max_steps": steps}))
        line = str(refused.value)
        assert said in line and "--executor ray" in line and "--force-new" in line and "\n" not in line, line
        assert kept() == before
    assert train_context(corpus_dir, str(out), inline)["runs"]["right"]["steps"] == 4 and kept() == before
    assert train_context(corpus_dir, str(out), cfg)["runs"]["right"]["steps"] == 4 and kept() == before


def test_cli_usage_errors(tmp_path, capsys):
    from sentsim.cli import main

    assert main(["train", "context", "--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()  # refused before the --out was claimed
    (tmp_path / "c").mkdir()
    assert main(["train", "context", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o"),
                 "--set", "lr=0"]) == 2
    assert main(["train", "context", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o"),
                 "--set", "executor=inline"]) == 2  # no parquet parts
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("sentsim: error:") == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_training(tmp_path, corpus_dir, capsys):
    from sentsim.context.train import train_context
    from sentsim.hardware import bf16_native

    if not bf16_native("cuda"):
        pytest.skip("this GPU has no native bf16")
    cfg = ContextTrainConfig.model_validate({
        "model": TINY_MODEL, **TRAIN, "direction": "fwd", "executor": "inline", "use_gpu": "yes",
        "max_steps": 150, "eval_every": 150, "checkpoint_every": 150})
    s = train_context(corpus_dir, str(tmp_path / "g"), cfg)["runs"]["fwd"]
    assert s["final_eval"]["fwd"]["loss"] < s["initial_eval"]["fwd"]["loss"] - 1.0
    # the loop's start-up line names the device it trained on and bf16 autocast: a run that fell
    # back to the CPU (or to fp32) says "on cpu" (or no bf16) and fails here
    out = capsys.readouterr().out
    assert re.search(r"\[context fwd\] 1 worker\(s\) on cuda(:\d+)? bf16;", out), out[-2000:]


def test_a_run_records_the_format_each_step_ran_in(tmp_path, corpus_dir, monkeypatch):
    """bf16: auto resolves per process: a run resumed on a CPU without native bf16 goes on in fp32, and the
    summary counts the steps of each format instead of calling the whole run one or the other. The same
    for the torch thread count, which changes the arithmetic too: a run resumed with another counts both."""
    import torch

    from sentsim.context.train import train_context

    def train(steps, native, threads):
        monkeypatch.setenv("SENTSIM_CPU_BF16", native)
        cfg = ContextTrainConfig.model_validate({
            "model": TINY_MODEL, **TRAIN, "direction": "fwd", "executor": "inline", "use_gpu": "no",
            "max_steps": steps, "eval_every": 2, "checkpoint_every": 2, "torch_threads": threads})
        return train_context(corpus_dir, str(tmp_path / "m"), cfg)["runs"]["fwd"]

    before = torch.get_num_threads()
    try:
        first = train(2, "1", 1)
        s = train(4, "0", 2)
    finally:  # the thread count is the process's: give the tests after this one what they had
        torch.set_num_threads(before)
    assert first["precision_steps"] == {"bf16": 2} and first["threads_steps"] == {"1": 2}
    assert s["steps"] == 4 and s["precision_steps"] == {"bf16": 2, "fp32": 2}
    assert s["threads_steps"] == {"1": 2, "2": 2}
    hist = json.loads((tmp_path / "m/runs/fwd/history.json").read_text())
    assert [(h["step"], h["precision"], h["threads"]) for h in hist] == [(0, "bf16", 1), (2, "bf16", 1),
                                                                         (4, "fp32", 2)]
    # the CPU-seconds count goes on across the resume, as the clock does, and the summary keeps it
    assert 0.0 == hist[0]["cpu_s"] < hist[1]["cpu_s"] < hist[2]["cpu_s"] == s["train_cpu_seconds"]


def test_start_from_pretrained_bart_checkpoint(tmp_path, corpus_dir):
    """A user's pretrained seq2seq checkpoint (save_pretrained layout) is a valid starting point."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import BartConfig, BartForConditionalGeneration

    from sentsim.context.train import train_context

    docs = list(iter_documents(corpus_dir, 20.0, "train"))[:5]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator((s for d in docs for s in d), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False))
    ck = tmp_path / "pretrained"
    BartForConditionalGeneration(BartConfig(
        vocab_size=raw.get_vocab_size(), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=160,
    )).save_pretrained(ck)
    raw.save(str(ck / "tokenizer.json"))
    cfg = ContextTrainConfig.model_validate({
        "model": {**TINY_MODEL, "pretrained_path": str(ck)}, **TRAIN, "direction": "fwd", "executor": "inline",
        "max_steps": 3, "eval_every": 3, "checkpoint_every": 3, "heldout_windows": 8})
    s = train_context(corpus_dir, str(tmp_path / "m"), cfg)
    assert s["runs"]["fwd"]["steps"] == 3
    mcfg, tok, models = load_bundle(tmp_path / "m")
    assert tok.vocab_size == raw.get_vocab_size() + 3  # <fwd> <left> <right> added
    assert models["fwd"].seq2seq.config.d_model == 32


def test_warm_start_cross_attention_from_self_attention(tmp_path, corpus_dir):
    """cross_attention_init=self_attention copies each decoder layer's pretrained self-attention into its
    cross-attention; new_params_lr_scale gives the warm start's new parameters their own learning rate."""
    from pydantic import ValidationError

    from sentsim.context.model import init_cross_attention_from_self, new_parameter_names, warm_start_tokenizer
    from sentsim.context.train import train_context

    mcfg = ContextModelConfig(arch="warm_start", context_sentences=1, max_source_tokens=64, max_target_tokens=32,
                              dropout=0.0)
    m = build_model(mcfg, warm_start_tokenizer(mcfg))
    layers = m.seq2seq.get_decoder().base_model.encoder.layer
    assert not torch.equal(layers[0].crossattention.self.key.weight, layers[0].attention.self.key.weight)
    assert init_cross_attention_from_self(m) == len(layers)
    for layer in layers:
        for a, b in zip(layer.crossattention.parameters(), layer.attention.parameters()):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()  # copied, not tied
    new = new_parameter_names(m)
    assert "sentence_positions.weight" in new and any("crossattention" in n for n in new)
    pretrained = [n for n in new if ".encoder.encoder." in n or ("attention.self" in n and "crossattention" not in n)]
    assert not pretrained, pretrained

    cfg = ContextTrainConfig.model_validate({
        "model": mcfg.model_dump(), **TRAIN, "direction": "fwd", "executor": "inline", "freeze_encoder": True,
        "cross_attention_init": "self_attention", "new_params_lr_scale": 10.0, "lr": 1e-4, "warmup_steps": 0,
        "schedule": "constant", "batch_tokens": 384, "max_steps": 2, "eval_every": 2, "checkpoint_every": 2,
        "heldout_windows": 8})
    s = train_context(corpus_dir, str(tmp_path / "w"), cfg)
    assert s["runs"]["fwd"]["steps"] == 2
    last = json.loads((tmp_path / "w/runs/fwd/history.json").read_text())[-1]
    assert last["lr_groups"] == pytest.approx([1e-4, 1e-3])
    # BART from a config has no pretrained self-attention to copy: refused by the schema, before any work
    with pytest.raises(ValidationError, match="needs model.arch=warm_start"):
        ContextTrainConfig.model_validate({"model": TINY_MODEL, "cross_attention_init": "self_attention"})


def test_training_stream_shuffles_windows_not_documents(corpus_dir):
    """A pass hands out every training sentence once, as (document, sentence) windows shuffled across
    the slice's documents. With whole documents in the stream, one novel filled the reference run's
    shuffle buffer for its first 600 steps (docs/experiments/2026-11-23-window-stream.md); here the first tenth
    of a pass must already reach every document of the slice it starts in, and runs of one document are rare."""
    from sentsim.context.train import _examples_of_doc, _examples_of_window, train_windows
    from sentsim.context.windows import iter_slices, mix_seed

    cfg = ContextTrainConfig.model_validate({"model": TINY_MODEL, **TRAIN})
    seq = list(train_windows(corpus_dir, cfg, 0, 1, seed=7, epoch=0, slices=2))
    every = sorted((tuple(d), i) for d in iter_documents(corpus_dir, 20, "train") for i in range(len(d)))
    assert sorted((tuple(d), i) for d, i in seq) == every
    assert [(tuple(d), i) for d, i in train_windows(corpus_dir, cfg, 0, 1, seed=7, epoch=0, slices=2)] == \
        [(tuple(d), i) for d, i in seq]
    assert [i for _, i in train_windows(corpus_dir, cfg, 0, 1, seed=7, epoch=1, slices=2)] != [i for _, i in seq]

    _, first_slice = next(iter_slices(corpus_dir, 20, "train", 0, 1, mix_seed(7, 0), 2))
    assert len(first_slice) >= 4
    head = {tuple(d) for d, _ in seq[: len(seq) // 10]}
    assert head == {tuple(d) for d in first_slice}
    same_doc = sum(a[0] is b[0] for a, b in zip(seq, seq[1:])) / (len(seq) - 1)
    assert same_doc < 0.3, same_doc  # about 1/len(first_slice); whole documents gave ~1

    # a window tokenises only its neighbours, and yields what the whole document yields for that sentence
    tok = train_bpe((s for d in first_slice for s in d), 500)
    doc = first_slice[0]
    assert list(_examples_of_doc(doc, tok, cfg, ["fwd", "left", "right"])) == [
        ex for i in range(len(doc)) for ex in _examples_of_window(doc, i, tok, cfg, ["fwd", "left", "right"])]


def test_training_stream_mixes_the_corpus_and_a_resume_goes_on_where_it_stopped(corpus_dir):
    """Documents come in a seeded order of corpus slices (each document once per pass, none lost),
    and a resumed trainee's stream is the uninterrupted stream minus the batches already trained on:
    re-reading from the corpus' first document after every resume is what made the reference model
    memorise its first Wikipedia articles (docs/experiments/2026-11-23-training-stream.md)."""
    import itertools
    from types import SimpleNamespace

    from sentsim.context.train import ContextTrainee, train_batches

    in_order = [tuple(d) for d in iter_documents(corpus_dir, 20, "train")]
    mixed = [tuple(d) for d in iter_documents(corpus_dir, 20, "train", order_seed=7)]
    assert sorted(mixed) == sorted(in_order) and mixed != in_order
    assert mixed == [tuple(d) for d in iter_documents(corpus_dir, 20, "train", order_seed=7)]
    # Within a slice too: with 2 slices, the stream's first quarter reaches both halves of the corpus
    # (corpus order is source order). Read in corpus order, a slice handed out its first source first.
    halves = [tuple(d) for d in iter_documents(corpus_dir, 20, "train", order_seed=7, slices=2)]
    assert sorted(halves) == sorted(in_order)
    at = [in_order.index(d) for d in halves[: len(halves) // 4]]
    assert min(at) < len(in_order) // 2 <= max(at), at

    # the legacy stream (batching=buffer; tests/context/test_training_stream.py has the bucketed one)
    cfg = ContextTrainConfig.model_validate({"model": TINY_MODEL, **TRAIN, "batching": "buffer"})
    tok = train_bpe((s for d in in_order[:50] for s in d), 500)
    fresh = list(itertools.islice(train_batches(corpus_dir, tok, cfg, ["fwd"], 0, 1, seed=cfg.seed), 8))
    trainee = ContextTrainee(None, cfg, tok, corpus_dir, ["fwd"], None)
    resumed = list(itertools.islice(trainee.batches(SimpleNamespace(rank=0, world=1, device=torch.device("cpu")),
                                                    0, 5), 3))
    for a, b in zip(fresh[5:], resumed, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_doc_id_prefixes_train_and_hold_out_only_the_chosen_documents(corpus_dir):
    """doc_id_prefixes keeps the training stream and the held-out set to the documents it names (a
    Wikipedia-only teacher from the full corpus), every such sentence once a pass; a prefix that names
    nothing is a one-line error, and a run trained before the setting existed keeps its fingerprint."""
    from sentsim.config import load_config
    from sentsim.context.train import RESUMABLE, heldout_examples, run_fingerprint, train_windows
    from sentsim.errors import UsageError
    from sentsim.identity import fingerprint

    cfg = ContextTrainConfig.model_validate({"model": TINY_MODEL, **TRAIN, "doc_id_prefixes": ["nltk:inaugural"]})
    every = list(iter_documents(corpus_dir, 20, "train"))
    chosen = list(iter_documents(corpus_dir, 20, "train", doc_prefixes=["nltk:inaugural"]))
    assert 0 < len(chosen) < len(every)
    seq = [(tuple(d), i) for d, i in train_windows(corpus_dir, cfg, 0, 1, seed=7, epoch=0, slices=2)]
    assert sorted(seq) == sorted((tuple(d), i) for d in chosen for i in range(len(d)))
    others = {tuple(d) for d in every} - {tuple(d) for d in chosen}
    assert others and not others & {d for d, _ in seq}

    tok = train_bpe((s for d in every for s in d), 500)
    held_all = list(iter_documents(corpus_dir, 20, "heldout"))
    held_chosen = list(iter_documents(corpus_dir, 20, "heldout", doc_prefixes=["nltk:inaugural"]))
    assert 0 < len(held_chosen) < len(held_all)
    # a fwd example's target is its sentence (+ </s>, or cut): compare its first 16 tokens
    allowed = {tuple((tok.encode([s])[0] + [tok.ids["eos"]])[:16]) for d in held_chosen for s in d}
    exs = heldout_examples(corpus_dir, tok, cfg, ["fwd"])["fwd"]
    assert exs and all(tuple(e.tgt[:16]) in allowed for e in exs)

    nothing = cfg.model_copy(update={"doc_id_prefixes": ["enwiki:"]})
    with pytest.raises(UsageError,
                       match=r"no document has a doc_id starting with any of doc_id_prefixes \['enwiki:'\]"):
        heldout_examples(corpus_dir, tok, nothing, ["fwd"])
    with pytest.raises(UsageError, match="empty prefix"):
        load_config(ContextTrainConfig, None, ['doc_id_prefixes=[""]'])
    with pytest.raises(UsageError, match="quote a prefix"):  # YAML reads [enwiki:] as [{enwiki: null}]
        load_config(ContextTrainConfig, None, ["doc_id_prefixes=[enwiki:]"])
    assert load_config(ContextTrainConfig, None, ['doc_id_prefixes=["enwiki:", nltk]']).doc_id_prefixes == \
        ["enwiki:", "nltk"]

    # a config recorded before doc_id_prefixes (and batching) existed had no such key: at the value those
    # runs had, each is left out; the bucketed stream is another run
    plain = ContextTrainConfig.model_validate({"model": TINY_MODEL, **TRAIN, "batching": "buffer"})
    later = ("doc_id_prefixes", "batching", "bucket_batches", "micro_batches", "pack_tokens")
    before = {k: v for k, v in plain.model_dump().items() if k not in RESUMABLE and k not in later}
    assert run_fingerprint(plain, "c", "") == fingerprint("context", before, "c", "")
    assert run_fingerprint(cfg, "c", "") != run_fingerprint(plain, "c", "")
    assert run_fingerprint(plain.model_copy(update={"batching": "bucketed"}), "c", "") != \
        run_fingerprint(plain, "c", "")


def test_tokenizer_from_another_run_sizes_the_vocabulary_and_says_so(tmp_path, corpus_dir, capsys):
    """--tokenizer-from reuses another context-model folder's tokenizer (so separate runs combine): the models
    are built to its size, and a model.vocab_size that differs is said not to be used, not taken silently."""
    from sentsim.cli import main

    sets = [x for k, v in {**TRAIN, "max_steps": 1, "eval_every": 1, "heldout_windows": 8}.items()
            for x in ("--set", f"{k}={v}")]
    sets += [x for k, v in TINY_MODEL.items() for x in ("--set", f"model.{k}={v}")]
    first = tmp_path / "first"
    assert main(["train", "context", "--corpus", corpus_dir, "--out", str(first), "--direction", "fwd",
                 "--executor", "inline", *sets]) == 0
    vocab = json.loads((first / "context.json").read_text())["vocab_size"]
    capsys.readouterr()
    second = tmp_path / "second"
    assert main(["train", "context", "--corpus", corpus_dir, "--out", str(second), "--direction", "left",
                 "--executor", "inline", "--tokenizer-from", str(first), *sets, "--set", "model.vocab_size=900"]) == 0
    out = capsys.readouterr().out
    assert (f"note: --tokenizer-from {first}: its {vocab:,} tokens size the models' vocabulary; model.vocab_size "
            "(900) is not used") in out
    a, b = (json.loads((d / "context.json").read_text()) for d in (first, second))
    assert b["vocab_size"] == vocab and b["tokenizer_sha256"] == a["tokenizer_sha256"]
