"""A model export is all or nothing, and `sentsim eval sts` reads only whole model folders.

The export (sentsim.model_swap.replace_folder, used by the surrogate and every student) writes OUT/model.new beside
the old model and swaps it in by renames. Here a real export runs in a child process that SIGKILLs itself
at each point of that sequence; after each kill the folder a reader gets is the whole old or the whole
new model, and the next run's `finish_swap` leaves OUT/model whole with nothing beside it. Then the real
CLI refuses folders cut short (a truncated safetensors, no tokenizer, no config) in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, error_line, sentsim_cli
from harvest_support import tiny_bert

from sentsim.errors import UsageError
from sentsim.evaluation.model_folder import INFO_FILE, check_model_folder

pytestmark = pytest.mark.slow

# the child: export NEW over OUT, killing itself at the planted point (a real SIGKILL, no cleanup runs)
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import sentsim.model_swap as E
    from sentsim.training.encoder_models import export_model

    new, out, point = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    seal, steps = E.seal, E.swap_steps
    if point == "writing":  # the weights written, the rest of the folder not
        E.seal = lambda staged, info: die()
    elif point.startswith("after-"):  # after the sealed folder's first k renames/removals
        k = int(point.split("-")[1])
        E.swap_steps = lambda o: steps(o)[:k] + [die]
    export_model(new, out, "siamese", 32, card={"kind": "surrogate", "title": "new"})
""")
POINTS = ["writing", "after-0", "after-1", "after-2", "after-3"]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """(old export, new checkpoint, new export): two tiny BERTs of different weights."""
    import torch

    from sentsim.training.encoder_models import export_model

    root = tmp_path_factory.mktemp("export")
    old_hf = tiny_bert(root / "old_hf", layers=1, width=32, heads=2, positions=64)
    torch.manual_seed(1)
    new_hf = tiny_bert(root / "new_hf", layers=1, width=32, heads=2, positions=64)
    from safetensors.torch import load_file, save_file

    w = load_file(str(new_hf / "model.safetensors"))  # tiny_bert seeds 0: make the new weights differ
    save_file({k: v + 0.5 for k, v in w.items()}, str(new_hf / "model.safetensors"))
    old = export_model(old_hf, root / "old", "siamese", 32, card={"kind": "surrogate", "title": "old"})
    new = export_model(new_hf, root / "new", "siamese", 32, card={"kind": "surrogate", "title": "new"})
    return old, new_hf, new


def _which(folder: Path, old: Path, new: Path) -> str:
    """'old' or 'new': which whole model `folder` is (checked whole, and loaded by sentence-transformers)."""
    from sentence_transformers import SentenceTransformer

    weights = (folder / "model.safetensors").read_bytes()
    SentenceTransformer(str(folder), device="cpu")
    for name, ref in (("old", old), ("new", new)):
        if weights == (ref / "model.safetensors").read_bytes():
            return name
    raise AssertionError(f"{folder} holds neither model")


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_anywhere_in_an_export_leaves_the_old_or_the_new_model_whole(two_models, tmp_path, point):
    from sentsim.model_swap import finish_swap

    old, new_hf, new = two_models
    out = tmp_path / "model"
    shutil.copytree(old, out)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", CHILD, str(new_hf), str(out), point], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]  # killed where planted
    # what a reader (eval sts) gets now, without renaming anything
    seen = _which(check_model_folder(out), old, new)
    assert seen == {"writing": "old", "after-0": "old"}.get(point, "new")
    # the next export or training run finishes the swap: OUT/model whole, nothing left beside it
    finish_swap(out)
    assert _which(check_model_folder(out), old, new) == seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_failed_export_leaves_the_old_model(two_models, tmp_path):
    from sentsim.training.encoder_models import export_model

    old, _, new = two_models
    out = tmp_path / "model"
    shutil.copytree(old, out)
    with pytest.raises((OSError, ValueError)):
        export_model(tmp_path / "no_such_checkpoint", out, "siamese", 32)
    assert _which(check_model_folder(out), old, new) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# ---------------------------------------------------------------- eval sts refuses what is not a whole model


@pytest.fixture(scope="module")
def tiny_sts(tmp_path_factory):
    d = tmp_path_factory.mktemp("sts") / "STS2013-en-test"
    d.mkdir()
    pairs = [("a man plays a flute", "a man is playing a flute", 5.0), ("a dog runs", "the cat sleeps", 0.5),
             ("prices rose", "prices went up", 4.0), ("it rains", "the senate voted", 0.0)]
    (d / "STS.input.a.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in pairs))
    (d / "STS.gs.a.txt").write_text("".join(f"{g}\n" for *_, g in pairs))
    return d.parent


def _cut(folder: Path, how: str) -> None:
    if how == "truncated weights":
        os.truncate(folder / "model.safetensors", (folder / "model.safetensors").stat().st_size // 2)
    elif how == "no tokenizer":
        (folder / "tokenizer.json").unlink()
    elif how == "no config":
        (folder / "config.json").unlink()
    elif how == "no pooling":
        shutil.rmtree(folder / "1_Pooling")


CASES = [  # (damage, sentsim's own export or a folder from elsewhere, the words the one line must hold)
    ("truncated weights", True, "model.safetensors is "),
    ("no tokenizer", True, "tokenizer.json is missing"),
    ("no config", True, "config.json is missing"),
    ("truncated weights", False, "model.safetensors is "),
    ("no tokenizer", False, "no tokenizer"),
    ("no config", False, "config.json is missing"),
    ("no pooling", False, "module folder 1_Pooling is missing"),
]


@pytest.mark.parametrize("how,ours,words", CASES)
def test_eval_sts_refuses_a_folder_that_is_not_a_whole_model(two_models, tiny_sts, tmp_path, how, ours, words):
    old, _, _ = two_models
    folder = tmp_path / "model"
    shutil.copytree(old, folder)
    if not ours:  # as a model from elsewhere would be: no sentsim file list
        (folder / INFO_FILE).unlink()
    _cut(folder, how)
    r = sentsim_cli("eval", "sts", "--model", folder, "--data", tiny_sts)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-3000:]
    assert str(folder) in lines[0] and "not a whole model" in lines[0] and words in lines[0], lines[0]


def test_eval_sts_reads_the_new_model_of_a_swap_cut_between_its_renames(two_models, tiny_sts, tmp_path):
    old, _, new = two_models
    shutil.copytree(old, tmp_path / "model.old")
    shutil.copytree(new, tmp_path / "model.new")
    r = sentsim_cli("eval", "sts", "--model", tmp_path / "model", "--data", tiny_sts)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "reading model.new" in r.stderr and "STS13" in r.stdout
    assert not (tmp_path / "model").exists()  # a reader renames nothing: a trainer may be exporting there
    with pytest.raises(UsageError, match="no such folder"):
        check_model_folder(tmp_path / "elsewhere")


def test_the_file_list_names_every_file_a_loader_reads(two_models):
    old, _, _ = two_models
    listed = set(json.loads((old / INFO_FILE).read_text())["files"])
    on_disk = {str(p.relative_to(old)) for p in old.rglob("*") if p.is_file()}
    assert on_disk - listed == {INFO_FILE, "README.md"}
    assert {"model.safetensors", "tokenizer.json", "config.json", "modules.json", "1_Pooling/config.json"} <= listed


# ---------------------------------------------------------------- in place: the discriminator and context bundles

# the child: replace the model in OUT (its trainer's state beside it) by the new one, killing itself at the
# planted point: while writing the staged folder, while linking it in, or after the first k steps
IN_PLACE_CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import sentsim.model_swap as S

    kind, src, out, point = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    die = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    steps, link, linked = S.in_place_steps, S._link_or_copy, []
    if point == "writing":
        S.seal = die
    elif point == "linking":  # one file linked in, the next not
        S._link_or_copy = lambda a, b: die() if linked else (linked.append(b), link(a, b))
    elif point.startswith("after-"):
        k = int(point.split("-")[1])
        S.in_place_steps = lambda f, c: steps(f, c)[:k] + [die]
    if kind == "discriminator":
        from sentsim.discriminator.train import DiscriminatorJob, export_model
        from sentsim.discriminator.vocab import Vocab

        job = DiscriminatorJob.model_validate_json(sys.argv[5])
        export_model(out, out / "_train", job, "corpus-fp", Vocab.load(out / "_train" / "vocab.json"), {}, [])
    else:
        from sentsim.context.model import load_bundle, save_bundle

        cfg, tok, models = load_bundle(src)
        save_bundle(out, cfg, tok, {"shared": models["fwd"]}, {d: "shared" for d in models})
""")
IN_PLACE_POINTS = ["writing", "linking", *(f"after-{k}" for k in range(7))]
# what a reader gets right after the kill: the old model until its config.json / context.json is removed
SEEN_AFTER_KILL = {"writing": "old", "after-0": "old"}
SMALL_DISC = {"embed_dim": 8, "hidden": 8, "head_dim": 8, "max_tokens": 16, "embed_init": "random"}
TEXTS = [f"sentence number {i} says {w} things about the {v}." for i in range(40)
         for w, v in (("many", "river"), ("few", "mountain"))]


def _in_place_child(kind: str, src: Path, out: Path, point: str, *more: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", IN_PLACE_CHILD, kind, str(src), str(out), point, *more],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]  # killed where planted


def _disc_state(state: Path, seed: int) -> None:
    """What a discriminator's training leaves in OUT/_train for the export: weights and vocabulary."""
    import torch
    from safetensors.torch import save_file

    from sentsim.discriminator.model import CoherenceModel, ModelConfig
    from sentsim.discriminator.vocab import Vocab

    state.mkdir(parents=True)
    vocab = Vocab.build(TEXTS, 100, 1)
    vocab.save(state / "vocab.json")
    torch.manual_seed(seed)
    model = CoherenceModel(len(vocab), ModelConfig(**SMALL_DISC))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(state / "model.safetensors"))


@pytest.fixture(scope="module")
def two_discriminators(tmp_path_factory):
    """(old export, new state, new export, job JSON): two tiny discriminators of different weights."""
    from sentsim.discriminator.train import DiscriminatorJob, export_model
    from sentsim.discriminator.vocab import Vocab

    root = tmp_path_factory.mktemp("disc")
    job = DiscriminatorJob.model_validate({"model": SMALL_DISC})
    for name, seed in (("old", 0), ("new", 1)):
        _disc_state(root / name / "_train", seed)
        shutil.copytree(root / name / "_train", root / f"{name}_state")
        export_model(root / name, root / name / "_train", job, "corpus-fp",
                     Vocab.load(root / name / "_train" / "vocab.json"), {}, [])
        shutil.rmtree(root / name / "_train")  # the exports alone: each test puts beside them the state it needs
    return root / "old", root / "new_state", root / "new", job.model_dump_json()


def _which_disc(folder: Path, old: Path, new: Path) -> str:
    """'old' or 'new': which whole discriminator a reader loads for `folder`."""
    from sentsim.discriminator.io import Discriminator
    from sentsim.model_swap import resolve_in_place

    Discriminator.load(folder).encode(["A sentence."])
    weights = (resolve_in_place(folder, "config.json") / "model.safetensors").read_bytes()
    for name, ref in (("old", old), ("new", new)):
        if weights == (ref / "model.safetensors").read_bytes():
            return name
    raise AssertionError(f"{folder} holds neither model")


@pytest.mark.parametrize("point", IN_PLACE_POINTS)
def test_a_kill_anywhere_in_a_discriminator_export_leaves_the_old_or_the_new_model_whole(two_discriminators,
                                                                                         tmp_path, point):
    from sentsim.identity import checkpoint_hash
    from sentsim.model_swap import finish_in_place

    old, new_state, new, job = two_discriminators
    out = tmp_path / "disc"
    shutil.copytree(old, out)
    shutil.copytree(new_state, out / "_train")  # the finished training the export takes its model from
    _in_place_child("discriminator", new_state, out, point, job)
    seen = _which_disc(out, old, new)
    assert seen == SEEN_AFTER_KILL.get(point, "new")
    # the next export or training run completes a replacement whose new model was sealed
    finish_in_place(out, "config.json")
    after = "old" if point == "writing" else "new"
    assert _which_disc(out, old, new) == after
    assert checkpoint_hash(str(out)) == checkpoint_hash(str(old if after == "old" else new))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disc"]  # nothing staged beside it
    # the training state stays beside the model, whatever the point: a longer run resumes from it
    assert sorted(p.name for p in (out / "_train").iterdir()) == ["model.safetensors", "vocab.json"]


def test_a_discriminator_export_keeps_its_state_and_drops_the_other_executors(two_discriminators, tmp_path):
    """The export keeps OUT/_train (a longer run resumes from it) but not the checkpoints of the executor that
    did not train the model: no later run resumes a state the model did not come from."""
    from sentsim.discriminator.train import DiscriminatorJob, export_model
    from sentsim.discriminator.vocab import Vocab

    old, new_state, new, job = two_discriminators
    out = tmp_path / "disc"
    shutil.copytree(old, out)
    shutil.copytree(new_state, out / "_train")
    for d in ("checkpoint", "ray/discriminator"):
        (out / "_train" / d).mkdir(parents=True)
        (out / "_train" / d / "state.pt").write_text("x")
    export_model(out, out / "_train", DiscriminatorJob.model_validate_json(job), "corpus-fp",
                 Vocab.load(out / "_train" / "vocab.json"), {}, [], executor="inline")
    assert _which_disc(out, old, new) == "new"
    assert sorted(p.name for p in (out / "_train").iterdir()) == ["checkpoint", "model.safetensors", "vocab.json"]
    assert (out / "_train" / "checkpoint" / "state.pt").is_file()


@pytest.mark.parametrize("how", ["truncated weights", "no vocabulary"])
@pytest.mark.parametrize("ours", [True, False])
def test_a_discriminator_folder_that_is_not_whole_is_refused_in_one_line(two_discriminators, tmp_path, how, ours):
    from sentsim.discriminator.io import Discriminator

    folder = tmp_path / "disc"
    shutil.copytree(two_discriminators[0], folder)
    if not ours:  # as an export from before the file list was written
        (folder / INFO_FILE).unlink()
    if how == "truncated weights":
        os.truncate(folder / "model.safetensors", (folder / "model.safetensors").stat().st_size // 2)
    else:
        (folder / "vocab.json").unlink()
    with pytest.raises(UsageError) as err:
        Discriminator.load(folder)
    msg = str(err.value)
    assert "\n" not in msg and str(folder) in msg and "not a whole model" in msg, msg


@pytest.fixture(scope="module")
def two_bundles(tmp_path_factory):
    """(old bundle, new bundle): tiny context models of different weights and layouts."""
    from sentsim.context.config import ContextModelConfig
    from sentsim.context.model import build_model, save_bundle
    from sentsim.context.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("bundles")
    cfg = ContextModelConfig(vocab_size=300, d_model=16, encoder_layers=1, decoder_layers=1, attention_heads=2,
                             ffn_dim=32, dropout=0.0, context_sentences=1, max_source_tokens=48,
                             max_target_tokens=24)
    tok = train_bpe(TEXTS, 300)
    save_bundle(root / "old", cfg, tok, {d: build_model(cfg, tok, seed=0) for d in ("fwd", "left")},
                {"fwd": "fwd", "left": "left"})
    save_bundle(root / "new", cfg, tok, {"shared": build_model(cfg, tok, seed=1)}, {"fwd": "shared", "left": "shared"})
    return root / "old", root / "new"


def _which_bundle(folder: Path, old: Path, new: Path) -> str:
    """'old' or 'new': which whole bundle a reader loads for `folder` (by its forward model's weights)."""
    import torch

    from sentsim.context.model import load_bundle

    def weights(p):
        return load_bundle(p)[2]["fwd"].seq2seq.get_input_embeddings().weight

    w = weights(folder)
    for name, ref in (("old", old), ("new", new)):
        if torch.equal(w, weights(ref)):
            return name
    raise AssertionError(f"{folder} holds neither bundle")


@pytest.mark.parametrize("point", IN_PLACE_POINTS)
def test_a_kill_anywhere_in_a_bundle_resave_leaves_the_old_or_the_new_bundle_whole(two_bundles, tmp_path, point):
    from sentsim.model_swap import finish_in_place

    old, new = two_bundles
    out = tmp_path / "bundle"
    shutil.copytree(old, out)
    (out / "runs").mkdir()  # a trainer's state beside the bundle: a save keeps it
    (out / "runs" / "history.json").write_text("[]")
    _in_place_child("bundle", new, out, point)
    seen = _which_bundle(out, old, new)
    assert seen == SEEN_AFTER_KILL.get(point, "new")
    finish_in_place(out, "context.json")
    after = "old" if point == "writing" else "new"
    assert _which_bundle(out, old, new) == after
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    assert (out / "runs" / "history.json").read_text() == "[]"
    # no file of the other bundle is left: the old per-direction models go with the old bundle
    assert sorted(p.name for p in (out / "models").iterdir()) == (["fwd", "left"] if after == "old" else ["shared"])


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_eval_sts_names_a_context_model_as_one_and_says_how_its_scores_are_evaluated(two_bundles, tiny_sts):
    """A context model (the bundle, or one of its model folders, whose BART config and weights look like an
    encoder's but whose tokenizer lies above them) given to `eval sts --model` is named as what it is, with the
    way to evaluate it, instead of "no tokenizer"."""
    old, _ = two_bundles
    for folder, said in ((old, "a sentsim context-model bundle (a seq2seq scorer"),
                         (old / "models" / "fwd", f"a model folder of the sentsim context-model bundle {old}")):
        r = sentsim_cli("eval", "sts", "--model", folder, "--data", tiny_sts)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-3000:]
        assert f"--model {folder}: {said}" in lines[0] and "eval sts --scores" in lines[0], lines[0]
        assert "no tokenizer" not in lines[0], lines[0]


def test_a_model_export_never_replaces_a_model_of_another_kind(two_discriminators, two_bundles, tmp_path):
    """An in-place export lists the old model's files for removal: over a model of another kind that
    listing is the other model's, so the export refuses instead, and the folder keeps every byte."""
    from sentsim.context.config import ContextModelConfig
    from sentsim.context.model import build_model, load_bundle, save_bundle
    from sentsim.context.tokenizer import train_bpe
    from sentsim.discriminator.train import DiscriminatorJob, export_model
    from sentsim.discriminator.vocab import Vocab

    old_disc, new_state, _, job = two_discriminators
    bundle = tmp_path / "bundle"
    shutil.copytree(two_bundles[0], bundle)
    shutil.copytree(new_state, bundle / "_train")
    before = _files(bundle)
    with pytest.raises(UsageError, match=r"holds a model of another kind \(sentsim-context/1\), not "
                                         r"sentsim-discriminator-v1; give another --out"):
        export_model(bundle, bundle / "_train", DiscriminatorJob.model_validate_json(job), "corpus-fp",
                     Vocab.load(bundle / "_train" / "vocab.json"), {}, [])
    assert _files(bundle) == before
    load_bundle(bundle)

    disc = tmp_path / "disc"
    shutil.copytree(old_disc, disc)
    before = _files(disc)
    cfg = ContextModelConfig(vocab_size=300, d_model=16, encoder_layers=1, decoder_layers=1, attention_heads=2,
                             ffn_dim=32, dropout=0.0, context_sentences=1, max_source_tokens=48, max_target_tokens=24)
    tok = train_bpe(TEXTS, 300)
    with pytest.raises(UsageError, match="holds a model of another kind"):
        save_bundle(disc, cfg, tok, {"fwd": build_model(cfg, tok, seed=0)}, {"fwd": "fwd"})
    assert _files(disc) == before


def test_every_command_refuses_an_out_that_holds_something_else(two_discriminators, two_bundles, speech_corpus,
                                                                sample_path, tmp_path):
    """Each command's --out holding another kind of output (a model, an index, a run): one line, exit 2,
    before any work, --force-new or not, and the folder keeps every byte. A folder of the user's own
    files is no run either: a sharded job refuses to write among them."""
    from sentsim.retrieval import build_index

    corpus = tmp_path / "corpus"
    shutil.copytree(speech_corpus, corpus)
    c = str(corpus)
    disc, bundle, index, notes = tmp_path / "disc", tmp_path / "bundle", tmp_path / "index", tmp_path / "notes"
    shutil.copytree(two_discriminators[0], disc)
    shutil.copytree(two_bundles[0], bundle)
    build_index(c, str(index))
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    folders = {p: _files(p) for p in (disc, bundle, index, notes, corpus)}
    cases = [
        (("train", "discriminator", "--corpus", c, "--out", str(bundle), "--force-new"),
         "holds a context-model bundle, not a discriminator"),
        (("train", "context", "--corpus", c, "--out", str(disc), "--force-new"),
         "holds a discriminator, not a context-model bundle"),
        (("train", "context", "--corpus", c, "--out", str(index)), "holds a retrieval index, not a context-model"),
        (("index", "build", "--corpus", c, "--out", str(bundle)), "holds a context-model bundle, not a retrieval"),
        (("corpus", "build", str(sample_path), "--out", str(disc), "--force-new"), "holds a discriminator, not a"),
        (("harvest", "--corpus", c, "--index", str(index), "--context-models", str(bundle), "--out", str(disc),
          "--force-new"), "holds a discriminator, not a sentsim run"),
        (("contexts", "--corpus", c, "--index", str(index), "--out", str(bundle)), "holds a context-model bundle"),
        (("train", "surrogate", "--data", c, "--out", str(index), "--force-new"),
         "holds a retrieval index, not a surrogate's training output"),
        (("train", "student", "--data", c, "--backbone", str(disc), "--out", str(bundle)),
         "holds a context-model bundle, not a student's"),
        (("corpus", "build", str(sample_path), "--out", str(notes), "--force-new"),
         "is not empty (notes.txt) and holds no sentsim run"),
    ]
    for args, words in cases:
        r = sentsim_cli(*args, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr[-1500:])
        assert words in error_line(r.stderr), (args, r.stderr[-800:])
    assert {p: _files(p) for p in folders} == folders


def test_discarding_an_in_place_model_keeps_the_folders_other_names(two_discriminators, two_bundles, tmp_path):
    """--force-new discards the model of the run it replaces with that run's state (model_swap.discard_in_place):
    the commit file goes first, then every file the model's listing names; the trainer's state, written for the
    new run, stays. A reader then finds no model there, not the old one taken for the new run's."""
    from sentsim.discriminator.io import Discriminator
    from sentsim.errors import UsageError
    from sentsim.model_swap import discard_in_place

    old_disc, _, _, _ = two_discriminators
    old_bundle, _ = two_bundles
    for model, commit, state in ((old_disc, "config.json", "_train"), (old_bundle, "context.json", "runs")):
        out = tmp_path / model.name / commit
        shutil.copytree(model, out)
        (out / state).mkdir(exist_ok=True)
        (out / state / "run.json").write_text("{}")  # the new run's record, written by claim_out before
        discard_in_place(out, commit)
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [f"{state}/run.json"]
        discard_in_place(out, commit)  # nothing left to discard: a no-op
    with pytest.raises(UsageError, match="not a discriminator directory"):
        Discriminator.load(tmp_path / old_disc.name / "config.json")
