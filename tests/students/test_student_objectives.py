"""Student objectives come from one registry (sentsim.students.objectives): the config's choices and sections,
the command's --objective choices and the trainer all read it, and name no objective themselves, so a new
objective is one new file plus a registration line. Shown with tests/students/toy_objective.py, registered from
outside the package and trained through the `sentsim train student` command."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from conftest import ROOT, sentsim_cli

from sentsim.students import objectives

BUILT_IN = ("rankencoder", "rse", "paser")


def test_the_config_and_the_command_take_their_objectives_from_the_registry():
    import argparse

    from sentsim.commands import train_student
    from sentsim.students.config import StudentConfig

    names = objectives.names()
    assert names == BUILT_IN  # this process registered nothing else
    fields = StudentConfig.model_fields
    assert typing.get_args(fields["objective"].annotation) == names and fields["objective"].default == names[0]
    for name in names:  # each objective's own section, its settings class, with the paper's defaults
        settings = objectives.objective_class(name).settings
        assert fields[name].annotation is settings and getattr(StudentConfig(), name) == settings()
    parser = argparse.ArgumentParser()
    train_student.add_arguments(parser)
    assert parser._option_string_actions["--objective"].choices == names
    for r in objectives.registered():
        assert f"{r.name} ({r.summary})" in parser._option_string_actions["--objective"].help


def test_the_trainer_and_the_command_name_no_objective():
    """What differs per objective lives in its own module: the trainer, the config and the command hold
    no objective's name, neither as a string nor as a `cfg.objective == ...` branch, nor a section."""
    for rel in ("sentsim/students/train.py", "sentsim/students/config.py", "sentsim/commands/train_student.py"):
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in BUILT_IN]
        sections = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in BUILT_IN]
        branches = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                    and "objective" in ast.unparse(n.left)]
        assert not names and not sections and not branches, (rel, names, sections, branches)


def test_a_registration_is_checked_and_refused_once_the_config_is_built():
    import sentsim.students.config  # noqa: F401  (builds StudentConfig from the registry, which seals it)

    with pytest.raises(ValueError, match="registered already"):
        objectives.register("rse", "elsewhere:RSE", "a second rse")
    with pytest.raises(ValueError, match="letters, digits and _"):
        objectives.register("my-objective", "somewhere:Mine", "not a section name")
    with pytest.raises(ValueError, match="not 'module:Class'"):
        objectives.register("mine", "somewhere.Mine", "no class")
    with pytest.raises(RuntimeError, match="registered after sentsim.students.config was imported"):
        objectives.register("late", "somewhere:Late", "too late")
    assert objectives.names() == BUILT_IN


def test_an_unset_batch_size_is_the_objectives_own_through_the_command(tmp_path):
    """batch_size defaults per objective, from its paper (RSE: 000 appendix D's smallest, 128), and a value
    given anywhere wins. The command applies it: RSE on a small harvest is refused for want of 128 rows."""
    from harvest_support import small_pairs_run, tiny_bert, write_pairs_run

    from sentsim.students.config import StudentConfig

    assert {r.name: r.batch_size for r in objectives.registered()} == {"rankencoder": 64, "rse": 128, "paser": 64}
    for r in objectives.registered():
        assert StudentConfig(objective=r.name).batch_size == r.batch_size
        assert StudentConfig(objective=r.name, batch_size=16).batch_size == 16
    assert StudentConfig().batch_size == 64  # the first registered objective, rankencoder
    assert StudentConfig.model_validate(StudentConfig(objective="rse").model_dump()).batch_size == 128

    harvest = write_pairs_run(tmp_path / "h", *small_pairs_run())
    r = sentsim_cli("train", "student", "--objective", "rse", "--data", harvest, "--out", tmp_path / "o",
                    "--executor", "inline", "--backbone", tiny_bert(tmp_path / "bert", layers=1, width=32, heads=2,
                                                                    positions=64))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "cannot fill one batch of 128 per worker" in r.stderr, r.stderr[-2000:]


def test_an_unknown_objective_is_refused_in_one_line(tmp_path):
    r = sentsim_cli("train", "student", "--objective", "nope", "--out", tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "invalid choice: 'nope' (choose from 'rankencoder', 'rse', 'paser')" in r.stderr, r.stderr
    r = sentsim_cli("train", "student", "--set", "objective=nope", "--out", tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "objective" in r.stderr and "'paser'" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- the toy objective, through the command


def toy_cli(*args, timeout=600) -> subprocess.CompletedProcess:
    """`sentsim ARGS` in a process that imported tests/students/toy_objective.py first, as a user's wrapper would."""
    code = "import sys, toy_objective; from sentsim.cli import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=timeout)


@pytest.mark.slow
def test_a_toy_objective_in_one_file_trains_through_the_command(tmp_path):
    from harvest_support import small_pairs_run, tiny_bert, write_pairs_run
    from sentence_transformers import SentenceTransformer

    harvest = write_pairs_run(tmp_path / "h", *small_pairs_run())
    backbone = tiny_bert(tmp_path / "bert", layers=1, width=32, heads=2, positions=64)
    out = tmp_path / "toy"
    common = ["--backbone", backbone, "--executor", "inline", "--set", "max_seq_length=16", "--set", "batch_size=8",
              "--set", "log_every=1", "--set", "eval_every=2", "--max-steps", "4"]

    r = toy_cli("train", "student", "--objective", "toy", "--data", harvest, "--out", out, "--set", "toy.weight=2",
                *common)
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout[-2000:], r.stderr[-3000:])
    assert "toy: 53 rows, 4 steps, loss " in r.stdout  # 60 sentence rows, 5 repeated, 2 empty
    s = json.loads((out / "summary.json").read_text())
    assert s["objective"] == "toy" and s["counts"] == {"sentences": 53} and s["skips"] == {"repeated or empty": 7}
    steps = [h for h in s["history"] if h.get("train_loss") is not None]
    assert [h["step"] for h in steps] == [1, 2, 3, 4]
    for h in steps:  # its own metric, and its own setting applied to it
        assert h["train_loss"] == pytest.approx(2 * h["l_views"], rel=1e-6) and h["l_views"] > 0
    assert any("dev_spearman" in h for h in s["history"])  # the shared dev metric, on the harvest's dev pairs
    assert json.loads((out / "run.json").read_text())["config"]["toy"] == {"weight": 2.0}
    assert json.loads((out / "model" / "toy.json").read_text()) == {"weight": 2.0}  # its side file, exported
    v = SentenceTransformer(str(out / "model"), device="cpu").encode(["a river", "a city"])
    assert v.shape == (2, 32)

    # its refusals are the trainer's and the config's, in one line each
    r = toy_cli("train", "student", "--objective", "toy", "--out", tmp_path / "o1", *common)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--objective toy needs --data HARVEST_DIR (its sentences)" in r.stderr
    r = toy_cli("train", "student", "--objective", "toy", "--data", harvest, "--out", tmp_path / "o2",
                "--set", "toy.weight=0", *common)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "toy.weight" in r.stderr, r.stderr
    r = toy_cli("train", "student", "--objective", "nope", "--out", tmp_path / "o3")
    assert r.returncode == 2 and "toy" in r.stderr and "rankencoder" in r.stderr


def test_settings_that_contradict_themselves_are_refused_naming_both():
    """RSE: a pair scoring between a hard-negative bound above the positive threshold would be its anchor's
    positive and its hard negative at once; RankEncoder: tau_lower above tau_upper keeps no pair."""
    from sentsim.config import load_config
    from sentsim.errors import UsageError
    from sentsim.students.config import StudentConfig

    with pytest.raises(UsageError, match="hard_negative_below 0.8 > score_threshold 0.5"):
        load_config(StudentConfig, None, ["objective=rse", "rse.hard_negative_below=0.8"])
    with pytest.raises(UsageError, match="tau_lower 0.9 > tau_upper 0.8"):
        load_config(StudentConfig, None, ["objective=rankencoder", "rankencoder.tau_lower=0.9"])
    equal = load_config(StudentConfig, None, ["objective=rse", "rse.hard_negative_below=0.5"])
    assert equal.rse.hard_negative_below == 0.5
