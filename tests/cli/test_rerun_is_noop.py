"""Rerunning a finished command is a no-op that keeps every identity: one small pipeline, chained once
through the real `sentsim` commands (corpus build -> index build -> train discriminator -> cache build ->
contexts -> train context -> harvest -> remix -> train surrogate -> eval sts -> train student), then each
step run again, exactly as typed the first time, into its finished --out.

What a rerun must leave as it is: the identity the next step fingerprints it by (a model's checkpoint_hash,
a run's fingerprint), and the bytes and modification times of what that identity stands for (a model's
files, a sharded run's shards and markers). Before, `train discriminator` trained again from step 0 and
every trainer's rerun wrote Ray Train's timestamped checkpoint folders into the folder checkpoint_hash
read, so a harvest on those models refused to resume (`make demo` failed the second time)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from conftest import SAMPLE, SHARED_DATA, sentsim_cli

pytestmark = pytest.mark.slow

TINY_DISC = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
             "model.embed_init=random", "train.max_steps=2", "train.batch_size=8", "train.max_heldout_windows=32"]
TINY_CONTEXT = ["model.vocab_size=400", "model.d_model=32", "model.encoder_layers=1", "model.decoder_layers=1",
                "model.attention_heads=2", "model.ffn_dim=64", "model.max_source_tokens=64",
                "model.max_target_tokens=32", "max_steps=2", "eval_every=2", "warmup_steps=1", "batch_tokens=512",
                "heldout_percent=20", "heldout_windows=8", "tokenizer_sentences=2000", "shuffle_buffer=64",
                "torch_threads=1"]
TINY_HARVEST = ["anchors.n=24", "anchors.per_unit=8", "contexts.size=4", "contexts.retrieve_chunks=40",
                "rank.n_anchors=64", "scoring.batch_tokens=2048"]
TINY_SCRATCH = ["scratch.hidden_size=32", "scratch.num_layers=1", "scratch.num_heads=2",
                "scratch.intermediate_size=64", "batch_size=8", "max_seq_length=16"]


def sets(values: list[str]) -> list[str]:
    return [x for s in values for x in ("--set", s)]


def files(root: Path) -> dict:
    """relative path -> (mtime_ns, sha256) of every file in root's folders: a sharded run's shards and
    markers (its top-level files are its manifest, completion flag, lease and report, which a rerun
    may rewrite without changing what the run holds)."""
    return {str(f.relative_to(root)): (f.stat().st_mtime_ns, hashlib.sha256(f.read_bytes()).hexdigest())
            for f in sorted(root.rglob("*")) if f.is_file() and f.parent != root}


def run_fingerprint(run: Path) -> str:
    return json.loads((run / "manifest.json").read_text())["fingerprint"]


def model_identity(path: Path) -> tuple:
    """What the next step fingerprints a model by, and the bytes and times of the files it stands for."""
    from sentsim.identity import checkpoint_hash, model_files

    return checkpoint_hash(str(path)), {str(f.relative_to(path)): (f.stat().st_mtime_ns, f.read_bytes())
                                        for f in model_files(path)}


def run_identity(run: Path) -> tuple:
    """A sharded run's fingerprint, and its shards and markers as they are on disk (reports aside)."""
    return run_fingerprint(run), files(run)


class Chain:
    """The pipeline's commands, each run once by the fixture; `again(step)` reruns one as typed."""

    def __init__(self, root: Path, env: dict, backbone: Path):
        self.root, self.env, self.argv, self.out = root, env, {}, {}
        self.backbone = backbone

    def run(self, step: str, *argv) -> str:
        t0 = time.time()
        r = sentsim_cli(*argv, cwd=self.root, env=self.env, timeout=600)
        print(f"{step}: {time.time() - t0:.1f}s")
        # (a busy Ray may log a TrainController's retried call with a traceback: the exit status is what counts)
        assert r.returncode == 0, (step, r.stdout[-3000:], r.stderr[-3000:])
        self.argv.setdefault(step, argv)
        return r.stdout + r.stderr

    def again(self, step: str) -> str:
        return self.run(step, *self.argv[step])


@pytest.fixture(scope="module")
def chain(tmp_path_factory, ray_head) -> Chain:
    from harvest_support import tiny_bert

    root = tmp_path_factory.mktemp("rerun")
    c = Chain(root, {**ray_head["env"], "RAY_ADDRESS": ray_head["gcs"]},
              tiny_bert(root / "bert", layers=1, width=32, heads=2, positions=64))
    c.run("corpus", "corpus", "build", str(SAMPLE), "--out", "corpus", "--set", "docs_per_unit=4",
          "--executor", "inline")
    c.run("index", "index", "build", "--corpus", "corpus", "--out", "index")
    c.run("discriminator", "train", "discriminator", "--corpus", "corpus", "--out", "disc", "--num-workers", "1",
          *sets(TINY_DISC))
    c.run("cache", "cache", "build", "--corpus", "corpus", "--discriminator", "disc", "--out", "cache",
          "--executor", "inline")
    (root / "sentences.txt").write_text("The tax bill passed.\nWe will build the road.\n")
    c.run("contexts", "contexts", "--corpus", "corpus", "--index", "index", "--discriminator", "disc",
          "--sentences", "sentences.txt", "--out", "ctxsets", "--executor", "inline",
          "--set", "contexts.size=4", "--set", "contexts.retrieve_chunks=40", "--set", "contexts.rep_cache=cache")
    # the context trainer and the student in-process (their Ray Train path is `make demo`'s), the others on Ray
    c.run("context", "train", "context", "--corpus", "corpus", "--out", "ctx", "--direction", "all",
          "--executor", "inline", *sets(TINY_CONTEXT))
    c.run("harvest", "harvest", "--corpus", "corpus", "--index", "index", "--discriminator", "disc",
          "--context-models", "ctx", "--out", "harvest", "--executor", "inline",
          "--set", "contexts.rep_cache=cache", *sets(TINY_HARVEST))
    c.run("remix", "remix", "harvest", "--out", "remix", "--lambda-fwd", "0.5")
    c.run("surrogate", "train", "surrogate", "--data", "harvest", "--backbone", "bert", "--out", "sur",
          "--init", "scratch", "--num-workers", "1", "--max-steps", "2", "--set", "eval_every=2",
          *sets(TINY_SCRATCH))
    c.run("student", "train", "student", "--objective", "rankencoder", "--data", "harvest", "--backbone", "bert",
          "--out", "stu", "--init", "scratch", "--executor", "inline", "--max-steps", "2", "--set", "log_every=1",
          *sets(TINY_SCRATCH))
    return c


# (the harvest's rerun is test_a_harvest_on_the_rerun_models_resumes's: the same check, after the trainers it
# reads ran again too)
@pytest.mark.parametrize("step,out", [("corpus", "corpus"), ("cache", "cache"), ("contexts", "ctxsets"),
                                      ("remix", "remix")])
def test_rerun_of_a_finished_sharded_run_keeps_its_shards_and_fingerprint(chain, step, out):
    before = run_identity(chain.root / out)
    chain.again(step)
    assert run_identity(chain.root / out) == before


def index_files(index: Path) -> dict:
    """relative path -> (mtime_ns, bytes) of every file of the index, index.json included."""
    return {str(f.relative_to(index)): (f.stat().st_mtime_ns, f.read_bytes()) for f in sorted(index.rglob("*"))
            if f.is_file()}


def test_rerun_of_index_build_keeps_its_fingerprint_and_rewrites_nothing(chain):
    from sentsim.retrieval.base import read_index_manifest

    index = chain.root / "index"
    before, on_disk = read_index_manifest(str(index))["fingerprint"], index_files(index)
    assert "index.json" in on_disk and any(p.endswith("matrix.npz") for p in on_disk)
    said = chain.again("index")
    assert "already holds this finished index" in said and "nothing to do" in said, said[-2000:]
    assert read_index_manifest(str(index))["fingerprint"] == before
    assert index_files(index) == on_disk and sorted(p.name for p in index.iterdir()) == sorted(
        {p.split("/")[0] for p in on_disk})


@pytest.mark.parametrize("step,model", [("surrogate", "sur/model"), ("student", "stu/model")])
def test_rerun_of_train_surrogate_and_student_is_a_noop(chain, step, model):
    before = model_identity(chain.root / model)
    said = chain.again(step)
    assert "nothing to do" in said and "worker(s) on" not in said, said[-2000:]
    assert model_identity(chain.root / model) == before


def test_rerun_of_eval_sts_writes_the_same_report_and_keeps_the_model(chain):
    if not (SHARED_DATA / "sts").is_dir():
        pytest.skip("../shared/data/sts is not beside the checkout")
    model = chain.root / "sur/model"
    argv = ("eval", "sts", "--model", "sur/model", "--data", str(SHARED_DATA / "sts"), "--tasks", "STSb",
            "--json", "sts.json")
    chain.run("eval", *argv)

    def scores() -> dict:  # the report less its own wall time, which an evaluation run again measures again
        return {k: v for k, v in json.loads((chain.root / "sts.json").read_text()).items() if k != "seconds"}

    before, report = model_identity(model), scores()
    chain.again("eval")
    assert model_identity(model) == before and scores() == report


def test_a_harvest_on_the_rerun_models_resumes(chain):
    """The end-to-end form of the above: the discriminator's and the context trainer's reruns are no-ops
    that keep their models, and after them the harvest built on those models is still the same run, its
    shards and fingerprint kept (before, it refused: 'same config and inputs, so a model or checkpoint they
    name changed')."""
    disc = chain.root / "disc"
    before, listing = model_identity(disc), sorted(p.name for p in disc.iterdir())
    said = chain.again("discriminator")
    assert "already holds this finished model" in said and "worker(s) on" not in said, said[-2000:]
    assert model_identity(disc) == before and sorted(p.name for p in disc.iterdir()) == listing

    ctx = chain.root / "ctx"
    before = model_identity(ctx)
    said = chain.again("context")
    assert "already holds this finished bundle" in said and "worker(s) on" not in said, said[-2000:]
    assert model_identity(ctx) == before

    before = run_identity(chain.root / "harvest")
    said = chain.again("harvest")
    assert "changed" not in said, said[-2000:]
    assert run_identity(chain.root / "harvest") == before
