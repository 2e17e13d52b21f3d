"""Every `sentsim train ...` command, as typed at a shell: relative --out and input paths, from a
working directory that is not the checkout, attached to the session's `ray start` head through
RAY_ADDRESS (as a user with a running cluster would be; it spares each command a local Ray of its own).
Ray Train workers run in their own working directory, so a path that reached them relative named
nothing there (the context trainer failed with "no tokenizer.json in <out>/context/tokenizer"). One
small run each. Refusals that no Ray part of the command makes (argparse's, a config check's) run in this
process, where a subprocess's start-up would cost more than the check."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import error_line, sentsim_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A 1-layer BERT from config with all-MiniLM-L6-v2's tokenizer (the surrogate uses its tokenizer only)."""
    from harvest_support import tiny_bert as build

    return build(tmp_path_factory.mktemp("tiny_bert"), layers=1, width=32, heads=2, positions=64)


@pytest.fixture(scope="module")
def head_env(ray_head) -> dict:
    """The env of a shell on a machine of the session's cluster: its token, loopback, RAY_ADDRESS."""
    return {**ray_head["env"], "RAY_ADDRESS": ray_head["gcs"]}


def toy_harvest(path: Path) -> None:
    """A 60-pair harvest of ten words (10 dev, 10 test, 40 train pairs), scores in 0..6/7."""
    from test_surrogate import write_harvest

    words = "the a river city vote law war peace tax school".split()
    s1 = [f"{words[i % 10]} {words[(i * 3) % 10]} {words[(i * 7) % 10]}" for i in range(60)]
    s2 = [f"{words[(i + 1) % 10]} {words[(i * 3) % 10]}" for i in range(60)]
    write_harvest(path, s1, s2, [((i % 7) / 7.0) for i in range(60)], ["dev"] * 10 + ["test"] * 10 + ["train"] * 40)


def _run(cwd: Path, env: dict, *args):
    r = sentsim_cli(*args, cwd=cwd, env=env, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    return r


def test_train_discriminator_relative_paths(tmp_path, speech_corpus, head_env, capsys, monkeypatch):
    from sentsim.cli import main

    corpus = os.path.relpath(speech_corpus, tmp_path)
    sets = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.batch_size=8", "train.max_heldout_windows=32"]
    sets = [x for s in sets for x in ("--set", s)]
    # --max-steps is spelt as in every trainer; a bad count is argparse's one line (in this process: argparse
    # refuses it before anything is read)
    with pytest.raises(SystemExit) as refused:
        main(["train", "discriminator", "--corpus", corpus, "--out", "disc", "--max-steps", "-1", *sets])
    assert refused.value.code == 2
    assert "--max-steps: expected a whole number of steps, 0 or more (got '-1')" in capsys.readouterr().err
    # two DDP workers: each takes every other training window, in equal steps (the only multi-worker discriminator)
    r = _run(tmp_path, head_env, "train", "discriminator", "--corpus", corpus, "--out", "disc", "--num-workers", "2",
             "--set", "train.cpus_per_worker=0.5", "--max-steps", "2", *sets)
    out = tmp_path / "disc"
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "vocab.json", "sentsim_model.json",
                                               "_train"}
    # Ray Train's state stays beside the model, for a longer run to resume; the lease is given back
    assert (out / "_train" / "ray" / "discriminator").is_dir() and not (out / "_train" / "checkpoint").exists()
    assert not (out / "_train" / "_LEASE").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["metrics"]["step"] == 2 and [h["step"] for h in cfg["history"]] == [0, 2]
    assert cfg["metrics"]["world_size"] == 2 and cfg["train"]["num_workers"] == 2
    assert 0.0 <= cfg["metrics"]["heldout_auc"] <= 1.0
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 2
    from sentsim.discriminator import Discriminator

    assert Discriminator.load(out).encode(["A sentence."]).shape == (1, 32)
    # the finished model given a larger --max-steps goes on from Ray Train's last checkpoint, not from step 0
    r = _run(tmp_path, head_env, "train", "discriminator", "--corpus", corpus, "--out", "disc", "--num-workers", "2",
             "--set", "train.cpus_per_worker=0.5", "--max-steps", "4", *sets)
    assert "resuming at step 2" in r.stdout, r.stdout[-2000:]
    assert [h["step"] for h in json.loads((out / "config.json").read_text())["history"]] == [0, 2, 4]
    assert not (out / "_train" / "_LEASE").exists()

    # the executor is no setting of the run, and the inline one does not read Ray Train's checkpoints (each
    # command in this process, inline): the same settings and budget are the finished model, nothing trained;
    # a smaller budget is refused as on Ray, a larger one naming the executor that continues it, and neither
    # trains a model from step 0 nor removes the Ray Train state the model came from
    from harvest_support import cli_in_process

    from sentsim.identity import checkpoint_hash

    def kept() -> tuple:
        return checkpoint_hash(str(out)), {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}

    monkeypatch.chdir(tmp_path)
    ray_state = sorted(p.name for p in (out / "_train" / "ray" / "discriminator").glob("checkpoint_*"))
    before = kept()
    inline = ["train", "discriminator", "--corpus", corpus, "--out", "disc", "--executor", "inline", *sets]
    r = cli_in_process(capsys, *inline, "--max-steps", "4")
    assert r.returncode == 0 and "disc already holds this finished model" in r.stdout, r.stderr[-2000:]
    assert "starting" not in r.stdout and kept() == before
    for steps, said in (("3", "is at step 4, past the 3 steps this run plans"),
                        ("6", "at step 4 on --executor ray, which --executor inline does not read")):
        r = cli_in_process(capsys, *inline, "--max-steps", steps)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        line = error_line(r.stderr)
        assert said in line and "--executor ray" in line and "--force-new" in line, line
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert kept() == before and not (out / "_train" / "checkpoint").exists()
    assert sorted(p.name for p in (out / "_train" / "ray" / "discriminator").glob("checkpoint_*")) == ray_state
    r = cli_in_process(capsys, *inline, "--max-steps", "4")
    assert r.returncode == 0 and "already holds this finished model" in r.stdout and kept() == before


def test_train_context_relative_paths(tmp_path, speech_corpus, head_env, capsys, monkeypatch):
    from sentsim.cli import main

    def refused_inline(*args) -> str:
        """A refusal made before any training, whatever the executor: the command in this process, inline
        (no Ray attached, no subprocess started); its stderr."""
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        rc = main([*map(str, args), "--executor", "inline"])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err, err[-2000:]
        return err

    corpus = os.path.relpath(speech_corpus, tmp_path)
    sets = ["model.vocab_size=400", "model.d_model=32", "model.encoder_layers=1", "model.decoder_layers=1",
            "model.attention_heads=2", "model.ffn_dim=64", "model.max_source_tokens=64", "model.max_target_tokens=32",
            "eval_every=2", "warmup_steps=1", "batch_tokens=512", "heldout_percent=20",
            "heldout_windows=8", "tokenizer_sentences=2000", "shuffle_buffer=64", "torch_threads=1"]
    sets = [x for s in sets for x in ("--set", s)]
    sets += ["--max-steps", "2"]
    r = _run(tmp_path, head_env, "train", "context", "--corpus", corpus, "--out", "ctx", "--direction", "fwd",
             "--num-workers", "1", *sets)
    assert "model fwd:" in r.stdout and "2 steps" in r.stdout
    out = tmp_path / "ctx"
    assert json.loads((out / "context.json").read_text())["directions"] == {"fwd": "models/fwd"}
    assert (out / "tokenizer" / "tokenizer.json").is_file() and (out / "models/fwd/model.safetensors").is_file()
    assert [h["step"] for h in json.loads((out / "runs/fwd/history.json").read_text())] == [0, 2]
    # a finished run given a larger --max-steps goes on from where it stopped (the last flag given wins)
    r = _run(tmp_path, head_env, "train", "context", "--corpus", corpus, "--out", "ctx", "--direction", "fwd",
             "--num-workers", "1", *sets, "--max-steps", "4")
    assert "4 steps" in r.stdout, r.stdout[-2000:]
    assert [h["step"] for h in json.loads((out / "runs/fwd/history.json").read_text())] == [0, 2, 4]
    # other settings against the same --out are refused before any training; --force-new is the way out (the
    # executor is no setting of the run: the Ray run's --out refuses an inline command for its lr alone)
    err = refused_inline("train", "context", "--corpus", corpus, "--out", "ctx", "--direction", "fwd", *sets,
                         "--set", "lr=1e-3")
    assert "--force-new" in err, err[-2000:]
    assert "config.lr: " in error_line(err) and "0.001" in error_line(err), err[-2000:]
    # a corpus with too few held-out windows is said on the driver, before a Train worker (whose failure
    # policy retries, printing each worker's traceback) starts
    r = sentsim_cli("train", "context", "--corpus", corpus, "--out", "ctx_small", "--direction", "fwd", *sets,
                    "--set", "heldout_percent=1", cwd=tmp_path, env=head_env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "RayTrainWorker" not in r.stderr, r.stderr[-2000:]
    assert ("fewer than 2 held-out windows for direction 'fwd'; raise heldout_percent or use a larger corpus ("
            f"{os.path.abspath(tmp_path / corpus)} holds 20 document(s), of which heldout_percent=1.0 holds out about "
            "0.2: the split takes whole documents") in error_line(r.stderr), r.stderr[-2000:]
    # a document filter that matches nothing is named as such (raising heldout_percent could not help)
    err = refused_inline("train", "context", "--corpus", corpus, "--out", "ctx_prefix", "--direction", "fwd", *sets,
                         "--set", "doc_id_prefixes=[nope]")
    assert "no document has a doc_id starting with any of doc_id_prefixes ['nope']" in error_line(err), err[-2000:]
    # ... and leaves no training state behind (its tokenizer is saved only once the inputs pass), so the
    # command the message asks for is not refused as a run of other settings (run inline: whether it is
    # refused is the driver's check, the same for either executor, and the Ray Train run is the first one's)
    assert not (tmp_path / "ctx_small" / "tokenizer").exists()
    _run(tmp_path, head_env, "train", "context", "--corpus", corpus, "--out", "ctx_small", "--direction", "fwd",
         "--num-workers", "1", *sets, "--executor", "inline")
    assert (tmp_path / "ctx_small" / "models/fwd/model.safetensors").is_file()
    # more workers than the cluster holds: refused in one line, where Ray Train would wait for them for ever
    r = sentsim_cli("train", "context", "--corpus", corpus, "--out", "ctx_wide", "--direction", "fwd", *sets,
                    "--num-workers", "64", cwd=tmp_path, env=head_env, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert "context fwd: 64 worker(s) of" in line and "but the Ray cluster has" in line, line


def test_max_steps_bounds_the_finetune_stage_and_each_line_names_its_measures(tmp_path, tiny_bert, head_env,
                                                                             shared_data):
    """`--max-steps 2 --finetune-sts`: a smoke test stays one (the fine-tune stage ran its 4 epochs of
    STS-B train before, ~1,400 steps). Each stage's line names what it measured: under cosent the dev
    Spearman (the cosines keep the targets' order, not their values), and the fine-tune stage's test
    Spearman is against STS-B gold, not the teacher. The same run is `train surrogate`'s relative-paths
    check: --data, --backbone and --out as typed at a shell, relative to its working directory."""
    toy_harvest(tmp_path / "h")
    bb = os.path.relpath(tiny_bert, tmp_path)
    r = _run(tmp_path, head_env, "train", "surrogate", "--data", "h", "--backbone", bb, "--out", "sur",
             "--init", "scratch", "--num-workers", "1", "--max-steps", "2", "--force-new", "--loss", "cosent",
             "--finetune-sts", shared_data / "sts" / "stsbenchmark",
             *[x for s in ("scratch.hidden_size=32", "scratch.num_layers=1", "scratch.num_heads=2",
                           "scratch.intermediate_size=64", "batch_size=8", "eval_every=2", "max_seq_length=16",
                           "finetune.batch_size=8", "finetune.eval_every=2") for x in ("--set", s)])
    lines = {ln.split(":")[0]: ln for ln in r.stdout.splitlines() if ln.startswith(("harvest:", "finetune-sts:"))}
    assert re.match(r"harvest: \d+ pairs, 2 steps; dev Spearman -?[\d.]+ -> -?[\d.]+; Spearman vs teacher \(test\)",
                    lines["harvest"]), r.stdout
    assert lines["finetune-sts"].startswith("finetune-sts: 5749 pairs, 2 steps; dev L2 ") and \
        "Spearman vs gold (test)" in lines["finetune-sts"], r.stdout
    assert "dev/test Spearman vs gold" in r.stdout and "dev L2" not in r.stdout.split("finetune-sts")[0]
    # --loss is the harvest stage's: the fine-tune stage keeps 003 §4.1's L2, and its model card says so
    cards = {m: json.loads((tmp_path / "sur" / m / "sentsim_model.json").read_text()) for m in ("model", "model-sts")}
    assert [cards[m]["card"]["objective"]["name"] for m in ("model", "model-sts")] == ["cosent", "cosine_regression"]
    summary = json.loads((tmp_path / "sur/summary.json").read_text())
    assert summary["stages"][0]["last"]["step"] == 2
    assert (tmp_path / "sur/model/config.json").is_file()


def test_train_student_relative_paths(tmp_path, tiny_bert, head_env):
    triples = [{"s_i": f"sentence {i} about {w}", "relation": "entailment", "s_j": f"a line on {w} {i}"}
               for i, w in enumerate("river city vote law war peace tax school farm road".split())]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in triples))
    bb = os.path.relpath(tiny_bert, tmp_path)
    r = _run(tmp_path, head_env, "train", "student", "--objective", "rse", "--triples", "t.jsonl", "--backbone", bb,
             "--out", "stu", "--num-workers", "1", "--max-steps", "2", "--force-new",
             "--set", "batch_size=4", "--set", "max_seq_length=16")
    # each progress line of the Train worker reaches the terminal once (Ray Train's print patch logged it to
    # stderr and teed it to stdout as well)
    said = (r.stdout + r.stderr).splitlines()
    for line in ("[student rse] step 2/2", "[student rse] 1 worker(s) on cpu"):
        assert sum(line in x for x in said) == 1, (r.stdout[-2000:], r.stderr[-2000:])
    summary = json.loads((tmp_path / "stu/summary.json").read_text())
    assert summary["total_steps"] == 2 and summary["history"][-1]["step"] == 2
    assert (tmp_path / "stu/model/relations.json").is_file()


def test_ctrl_c_in_a_ray_train_run_says_so_and_the_same_command_resumes(tmp_path, tiny_bert, head_env):
    """Ray Train's own SIGINT handler aborts the run and hands fit() the last checkpoint (or exits from
    inside it): either way the command says it was interrupted (exit 130) and exports nothing, and the
    same command resumes from that checkpoint rather than taking it for a finished model."""
    import signal
    import subprocess
    import sys
    import time

    toy_harvest(tmp_path / "h")
    sets = ("scratch.hidden_size=32", "scratch.num_layers=1", "scratch.num_heads=2", "scratch.intermediate_size=64",
            "batch_size=8", "eval_every=5", "max_seq_length=16")
    args = ["train", "surrogate", "--data", "h", "--backbone", str(tiny_bert), "--out", "sur", "--init", "scratch",
            "--num-workers", "1", "--epochs", "400", *[x for s in sets for x in ("--set", s)]]
    log = tmp_path / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "sentsim"), *args], cwd=tmp_path, env=head_env,
                                stdout=fh, stderr=subprocess.STDOUT)
    # once Ray Train's controller has registered a checkpoint (its snapshot is written then): a report it has
    # not polled yet is lost with the abort, and the rerun would rightly start over
    snapshot = tmp_path / "sur" / "ray" / "harvest" / "checkpoint_manager_snapshot.json"
    deadline = time.time() + 300
    while not snapshot.is_file():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130, log.read_text()[-3000:]
    text = log.read_text()
    assert "sentsim: interrupted; run the same command again to resume" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert not (tmp_path / "sur" / "model").exists()
    r = _run(tmp_path, head_env, *args, "--max-steps", "20")
    resumed = re.search(r"resuming at step (\d+)\b", r.stdout + r.stderr)
    assert resumed and 0 < int(resumed.group(1)) < 20, (r.stdout + r.stderr)[-3000:]
    assert json.loads((tmp_path / "sur/summary.json").read_text())["stages"][0]["last"]["step"] == 20
    # the checkpoints the interrupted run wrote and Ray Train never registered are gone, not left on disk
    listed = {r["checkpoint_dir_name"] for r in json.loads(snapshot.read_text())["checkpoint_results"]}
    assert {d.name for d in snapshot.parent.glob("checkpoint_*") if d.is_dir()} == listed
