"""The CLI's error contract: a user's mistake is one line and exit 2, even from inside Ray."""

from pathlib import Path

import pytest
from conftest import sentsim_cli

from sentsim.cli import _usage_line_in, _wrapped_usage_error
from sentsim.errors import UsageError


def test_usage_error_raised_in_a_ray_task_is_unwrapped():
    import ray

    @ray.remote
    def bad():
        raise UsageError("corpus.json: the thing is wrong")

    ray.init(address="local", num_cpus=1, include_dashboard=False, ignore_reinit_error=True)
    try:
        with pytest.raises(ray.exceptions.RayTaskError) as exc:
            ray.get(bad.remote())
    finally:
        ray.shutdown()
    assert _wrapped_usage_error(exc.value) == "corpus.json: the thing is wrong"


def test_usage_line_in_train_worker_text():
    text = "Training failed due to worker errors:\n[Rank 0]\nTraceback (most recent call last):\n  ...\n" \
           "sentsim.errors.UsageError: /c: fewer than 2 held-out windows\n"
    assert _usage_line_in(text) == "/c: fewer than 2 held-out windows"
    assert _usage_line_in("ValueError: something else") is None


def test_unknown_command_and_missing_args_exit_2():
    r = sentsim_cli("nonsense")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = sentsim_cli("corpus", "build")
    assert r.returncode == 2 and "--out" in r.stderr
    r = sentsim_cli("store", "verify", "/nonexistent/run")  # as store compact and every reader say it
    assert r.returncode == 2 and r.stderr.strip() == "sentsim: error: /nonexistent/run: no such directory"
    r = sentsim_cli("store", "verify", Path(__file__).parent)  # a folder, but no run
    assert r.returncode == 2
    assert r.stderr.strip() == (f"sentsim: error: {Path(__file__).parent}: no manifest.json here; "
                                "is this a sentsim run directory?")


def run_main(capsys, *args):
    from sentsim.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command, flags", [
    (("harvest", "--context-models", "m"), ["--corpus", "--out"]),
    (("contexts",), ["--corpus", "--index", "--out"]),
    (("cache", "build", "--corpus", "c"), ["--discriminator", "--out"]),
])
def test_a_missing_required_flag_is_named_as_the_flag(capsys, tmp_path, command, flags):
    code, _, err = run_main(capsys, *command)
    assert code == 2 and err == "sentsim: error: " + "; ".join(
        f"{f} is required (or {f[2:]}: in --config)" for f in flags) + "\n"
    cfg = tmp_path / "c.yaml"  # given in the config file, it is not asked for
    cfg.write_text(f"out: {tmp_path / 'run'}\n")
    code, _, err = run_main(capsys, *command, "--config", cfg)
    assert code == 2 and "--out" not in err and f"{flags[0]} is required" in err, err
    code, _, err = run_main(capsys, *command, "--set", "seed=-1")  # other config errors keep their key
    assert code == 2 and "--out is required (or out: in --config); invalid config: seed:" in err, err


def test_help_describes_every_command_group():
    from sentsim.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "cache build the discriminator's representation cache" in text


@pytest.mark.parametrize("tasks", ["", " , "])
def test_eval_sts_refuses_an_empty_tasks_list(capsys, tmp_path, tasks):
    code, _, err = run_main(capsys, "eval", "sts", "--tfidf", "--data", tmp_path, "--tasks", tasks)
    assert code == 2 and err.startswith(f"sentsim: error: --tasks {tasks!r} names no task;"), err
    code, _, err = run_main(capsys, "eval", "sts", "--tfidf", "--data", tmp_path, "--set", "tasks=[]")  # the config's
    assert code == 2 and err.startswith("sentsim: error: invalid config: tasks: List should have at least 1 item"), err


def test_corpus_build_names_an_input_that_is_no_regular_file(capsys, tmp_path):
    code, _, err = run_main(capsys, "corpus", "build", "/dev/null", "--out", tmp_path / "c", "--executor", "inline")
    assert code == 2 and err == ("sentsim: error: /dev/null: not a regular file (a device, pipe or socket); "
                                 "pass a file of documents\n")
    assert not (tmp_path / "c").exists()



def test_address_is_offered_only_where_it_is_used(capsys, tmp_path, speech_corpus):
    """eval sts scores in its own process: --address there is refused as unknown, not accepted and ignored;
    index build uses it only to build on Ray (sklearn, --num-workers 2 or more), and says so otherwise, as an inline
    run of any job does."""
    with pytest.raises(SystemExit) as stop:  # argparse's own exit
        run_main(capsys, "eval", "sts", "--tfidf", "--data", tmp_path, "--address", "127.0.0.1:6379")
    assert stop.value.code == 2 and "unrecognized arguments: --address" in capsys.readouterr().err
    code, out, err = run_main(capsys, "index", "build", "--corpus", speech_corpus, "--out", tmp_path / "index",
                              "--address", "127.0.0.1:1")  # no cluster there: it must not be dialled
    assert code == 0, err
    assert err.splitlines()[0] == ("note: --address is not used (one worker builds here); the sklearn backend builds "
                                   "on Ray with --num-workers 2 or more"), err
    # an inline run (remix's default, any job's --executor inline) says so too, and dials nothing
    code, out, err = run_main(capsys, "remix", tmp_path / "none", "--out", tmp_path / "r", "--address", "127.0.0.1:1")
    assert code == 2 and err.splitlines()[0] == ("note: --address is not used (--executor inline runs in this "
                                                 "process); --executor ray runs on 127.0.0.1:1"), err


@pytest.mark.parametrize("job, args, prog", [
    ("harvest_pairs.py", [], "sentsim harvest"),
    ("screen_contexts.py", [], "sentsim contexts"),
    ("build_rep_cache.py", [], "sentsim cache build"),
    ("verify_store.py", ["run"], "sentsim store verify"),  # its required arguments given: only --bogus is wrong
    ("remix_harvest.py", ["run", "--out", "o"], "sentsim remix"),
    ("eval_sts.py", ["--tfidf", "--data", "d"], "sentsim eval sts"),
])
def test_a_jobs_unknown_flag_is_refused_with_the_jobs_own_usage(tmp_path, job, args, prog):
    """argparse passed a command's unknown flag up to `sentsim` itself, whose usage (`sentsim [-h] COMMAND ...`)
    says nothing of the job's flags. Refused before Ray starts: no cluster is needed (or dialled) here."""
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([sys.executable, str(ROOT / "jobs" / job), *args, "--bogus"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if ": error:" in ln]
    assert r.returncode == 2 and errors == [f"{prog}: error: unrecognized arguments: --bogus"], r.stderr
    assert r.stderr.startswith(f"usage: {prog} [-h]") and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.iterdir()), "a refused job wrote something"


@pytest.mark.parametrize("argv, prog, given", [
    (["--bogus", "harvest"], "sentsim", "--bogus"),
    (["--bogus=1", "store", "verify", "run"], "sentsim", "--bogus=1"),
    (["-x", "harvest", "--also-bogus"], "sentsim", "-x"),  # the first word's own first: its usage is the one
    (["store", "--bogus", "verify", "run"], "sentsim store", "--bogus"),
    (["store", "verify", "run", "--bogus"], "sentsim store verify", "--bogus"),
    (["harvest", "--out", "harvest", "--bogus"], "sentsim harvest", "--bogus"),  # a value spelt as a command word
])
def test_an_unknown_flag_is_refused_with_the_usage_of_the_word_it_was_given_to(capsys, argv, prog, given):
    """A flag before the command is `sentsim`'s (or a group's) and is refused with that usage, not the command's,
    which lists flags the misplaced one is none of; a command's own unknown flag keeps the command's usage."""
    from sentsim.cli import main

    with pytest.raises(SystemExit) as stop:  # argparse's own exit, before any work
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"usage: {prog} [-h]"), err
    assert [ln for ln in err.splitlines() if ": error:" in ln] == [f"{prog}: error: unrecognized arguments: {given}"]


@pytest.mark.parametrize("argv, flag, what", [
    (["corpus", "build", "in.jsonl", "--out", "o", "--chunk-size", "0"], "--chunk-size", "sentences"),
    (["index", "build", "--corpus", "c", "--out", "o", "--shards", "0"], "--shards", "shards"),
    (["index", "build", "--corpus", "c", "--out", "o", "--workers", "-1"], "--num-workers/--workers", "workers"),
    (["eval", "sts", "--tfidf", "--data", "d", "--batch-size", "0"], "--batch-size", "items"),
    (["train", "student", "--out", "o", "--epochs", "0"], "--epochs", "epochs"),
    (["train", "surrogate", "--out", "o", "--num-workers", "0"], "--num-workers", "workers"),
    (["train", "context", "--corpus", "c", "--out", "o", "--num-workers", "2.5"], "--num-workers", "workers"),
])
def test_a_count_flag_below_one_is_refused_in_the_flags_own_name(capsys, tmp_path, argv, flag, what):
    """A count given by a flag is refused by argparse under that flag, before any input is read, not by the
    config under its key (`chunk.size`, `n_shards`), which the user never typed."""
    from sentsim.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if ": error:" in ln] == [
        f"sentsim {argv[0]} {argv[1]}: error: argument {flag}: expected a whole number of {what}, 1 or more "
        f"(got {argv[-1]!r})"]


def test_a_count_flag_below_one_through_the_command(tmp_path):
    r = sentsim_cli("corpus", "build", tmp_path / "in.jsonl", "--out", tmp_path / "o", "--chunk-size", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "sentsim corpus build: error: argument --chunk-size: expected a whole number of sentences, 1 or more " \
           "(got '0')" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_top_level_unknown_flag_through_the_command(tmp_path):
    r = sentsim_cli("--bogus", "harvest", cwd=tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if ": error:" in ln]
    assert r.returncode == 2 and errors == ["sentsim: error: unrecognized arguments: --bogus"], r.stderr
    assert r.stderr.startswith("usage: sentsim [-h] COMMAND ...") and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_every_command_has_its_ray_job_file_and_the_readme_names_it():
    """README's Commands table: "each runs as a Ray job through the file beside it". Each jobs/*.py runs one
    command (its `--help` is that command's), and each command has one."""
    import re
    import subprocess
    import sys

    from conftest import ROOT

    from sentsim.cli import _command_modules

    commands = {" ".join(mod.COMMAND) for mod in _command_modules()}
    ran = {}
    for job in sorted((ROOT / "jobs").glob("*.py")):
        m = re.search(r'entry\(\[((?:"[a-z]+", )+)\*sys\.argv\[1:\]\]\)', job.read_text())
        assert m, f"{job.name}: does not run one sentsim command"
        ran[" ".join(re.findall(r'"([a-z]+)"', m.group(1)))] = job.name
    assert set(ran) == commands, (sorted(commands - set(ran)), sorted(set(ran) - commands))
    readme = (ROOT / "README.md").read_text()
    for command, job in ran.items():
        assert re.search(rf"\| `sentsim {command}(?:[^|]|\\\|)*` \| `jobs/{job}` \|", readme), (command, job)
    r = subprocess.run([sys.executable, str(ROOT / "jobs" / "compact_store.py"), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "--target-mb" in r.stdout, r.stderr


def test_the_demo_names_a_text_score_in_one_line(tmp_path, capsys):
    """`make demo` shows the harvest's least and most similar pairs; a score column of text stops it with
    RunReader's one line and exit 2, as a failed step does, where it sorted the text and then failed on the
    number format with a traceback."""
    import pyarrow as pa
    from harvest_support import small_pairs_run, write_pairs_run

    from sentsim.demo import show_pairs

    pairs, sentences = small_pairs_run()
    pairs = pairs.append_column("kind", pa.array(["random"] * pairs.num_rows))
    show_pairs(str(write_pairs_run(tmp_path / "numbers", pairs, sentences)))
    shown = capsys.readouterr().out.splitlines()
    assert shown[1] == "least and most similar harvested pairs:" and len(shown) == 6, shown
    text = pairs.set_column(pairs.schema.get_field_index("score"), "score", pairs["score"].cast(pa.string()))
    run = write_pairs_run(tmp_path / "text", text, sentences)
    with pytest.raises(SystemExit) as stop:
        show_pairs(str(run))
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "", out
    assert err == (f"demo: error: {run}: column score of table pairs holds string, not numbers (its numeric "
                   "columns: pair_id)\n"), err


@pytest.mark.parametrize("command, passes", [
    (("corpus", "build"), None), (("cache", "build"), None), (("remix",), None),
    (("contexts",), "the rep cache it builds first with --discriminator is one"),
    (("harvest",), "a pool harvest's vectors, rank targets and labels are three"),
])
def test_max_units_help_names_the_passes_of_its_own_command_only(command, passes):
    r = sentsim_cli(*command, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    own = text.split("--max-units N run at most N of the pending units", 1)[1].split("the same command resumes")[0]
    assert ("pass" not in own) if passes is None else (passes in own)
