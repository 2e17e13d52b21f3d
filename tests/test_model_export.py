"""A model export is all or nothing, and `sentsim eval sts` reads only whole model folders.

The export (sentsim.surrogate.export, used by the surrogate and every student) writes OUT/model.new beside
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
from conftest import ROOT, sentsim_cli
from harvest_support import tiny_bert

from sentsim.errors import UsageError
from sentsim.evaluation.model_folder import INFO_FILE, check_model_folder

pytestmark = pytest.mark.slow

# the child: export NEW over OUT, killing itself at the planted point (a real SIGKILL, no cleanup runs)
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import sentsim.surrogate.export as E
    from sentsim.surrogate.models import export_model

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

    from sentsim.surrogate.models import export_model

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
    from sentsim.surrogate.export import finish_swap

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
    from sentsim.surrogate.models import export_model

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
