"""An output never overlaps an input (issue 37): every command refuses an --out that is, lies inside or
holds one of its inputs, before anything is written or deleted, --force-new or not."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import ROOT, sentsim_cli

from sentsim.errors import UsageError
from sentsim.out_paths import check_out, location, overlap


def test_overlap_of_local_paths_follows_symlinks_and_segments(tmp_path):
    (tmp_path / "corpus").mkdir()
    os.symlink(tmp_path / "corpus", tmp_path / "link")
    assert overlap(tmp_path / "corpus", tmp_path / "link") == "is"
    assert overlap(tmp_path / "link" / "h", tmp_path / "corpus") == "lies inside"
    assert overlap(tmp_path, tmp_path / "link") == "holds"
    assert overlap(f"{tmp_path}/corpus/../corpus/", tmp_path / "corpus") == "is"
    assert overlap(tmp_path / "corpus2", tmp_path / "corpus") is None  # a prefix of the name is not a parent
    assert overlap(f"file://{tmp_path}/corpus", tmp_path / "corpus") == "is"
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert overlap("corpus", tmp_path / "corpus") == "is" and overlap("./", "corpus") == "holds"
    finally:
        os.chdir(cwd)


def test_overlap_of_s3_uris_is_by_bucket_and_key_segments():
    assert overlap("s3://b/runs/corpus", "s3://b/runs/corpus/") == "is"
    assert overlap("s3://b//runs/corpus", "s3://b/runs/corpus") == "is"
    assert overlap("s3://b/runs/corpus/h", "s3://b/runs/corpus") == "lies inside"
    assert overlap("s3://b", "s3://b/runs/corpus") == "holds"
    assert overlap("s3://b/runs/corpus2", "s3://b/runs/corpus") is None
    assert overlap("s3://other/runs/corpus", "s3://b/runs/corpus") is None
    assert overlap("/b/runs/corpus", "s3://b/runs/corpus") is None  # a local path is never an object key
    assert location("S3://b/k") == ("s3", "b", "k")


def test_check_out_names_the_flag_and_a_file_where_a_folder_belongs(tmp_path):
    with pytest.raises(UsageError, match=r"^--out .*/c is the input --corpus .*/c; write to a folder outside"):
        check_out(tmp_path / "c", {"--corpus": str(tmp_path / "c"), "--index": None})
    with pytest.raises(UsageError, match="lies inside the input --context-models"):
        check_out(tmp_path / "m" / "h", {"--context-models": [str(tmp_path / "x"), str(tmp_path / "m")]})
    check_out(tmp_path / "h", {"--corpus": str(tmp_path / "c"), "--pairs": None, "--context-models": []})
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="f: is a file, not a folder"):
        check_out(tmp_path / "f", {})
    with pytest.raises(UsageError, match="lies under .*f, which is a file"):
        check_out(tmp_path / "f" / "run", {})
    check_out(tmp_path / "f", {}, out_flag="--json", folder=False)  # a report file is overwritten
    with pytest.raises(UsageError, match="^--out s3://b/m: a model and its training state go to a local folder"):
        check_out("s3://b/m", {}, local="a model and its training state")  # not a local folder named s3:
    check_out("s3://b/run", {})


@pytest.fixture()
def corpus(speech_corpus, tmp_path):
    """A copy of the sample corpus that a wrong refusal could delete without harming other tests."""
    dst = tmp_path / "corpus"
    shutil.copytree(speech_corpus, dst)
    return dst


def _unchanged(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(r, *words) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert lines[0].startswith("sentsim: error: ") and all(w in lines[0] for w in words), lines[0]


def _refused_each(capsys, cases) -> None:
    """Each (args, *words) case refused: the first through the console script (its start-up and exit status),
    the rest by sentsim.cli.main in this process, the same code from argument parsing to the line without a
    subprocess start-up each (seconds apiece on a loaded machine)."""
    from harvest_support import cli_in_process

    for i, (args, *words) in enumerate(cases):
        _refused(sentsim_cli(*args, timeout=300) if i == 0 else cli_in_process(capsys, *args), *words)


def test_every_command_refuses_an_out_over_its_input_before_deleting(corpus, sample_path, tmp_path, capsys):
    """The audit's case first (a harvest with --out its corpus and --force-new deleted the corpus), then every
    other command with each way of overlapping; the input's files are byte for byte what they were."""
    from storage import verify_store

    before = _unchanged(corpus)
    c = str(corpus)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a b c\td e f\n")
    cases = [
        (("harvest", "--corpus", c, "--out", c, "--index", c + "-index", "--context-models", str(model),
          "--force-new"), "--out", "is the input --corpus"),
        (("harvest", "--corpus", c, "--out", str(tmp_path / "h"), "--index", str(tmp_path / "h" / "index"),
          "--context-models", str(model), "--force-new"), "holds the input --index"),
        (("harvest", "--corpus", c, "--out", str(model / "h"), "--set", "contexts.mode=random",
          "--context-models", str(model), "--force-new"), "lies inside the input --context-models"),
        (("harvest", "--corpus", c, "--out", str(pairs), "--pairs", str(pairs), "--set", "contexts.mode=random",
          "--context-models", str(model), "--force-new"), "is the input --pairs"),
        (("corpus", "build", str(sample_path), "--out", str(sample_path.parent), "--force-new"),
         "holds the input INPUT"),
        (("index", "build", "--corpus", c, "--out", c), "is the input --corpus"),
        (("index", "build", "--corpus", c, "--out", f"{c}/index"), "lies inside the input --corpus"),
        (("cache", "build", "--corpus", c, "--discriminator", str(model), "--out", c, "--force-new"),
         "is the input --corpus"),
        (("cache", "build", "--corpus", c, "--discriminator", str(model), "--out", str(model), "--force-new"),
         "is the input --discriminator"),
        (("contexts", "--corpus", c, "--index", str(model), "--out", str(tmp_path), "--force-new"),
         "holds the input --corpus"),
        (("remix", c, "--out", c, "--force-new"), "is the input HARVEST"),
        (("train", "discriminator", "--corpus", c, "--out", c, "--force-new"), "is the input --corpus"),
        (("train", "context", "--corpus", c, "--out", f"{c}/ctx", "--force-new"), "lies inside the input --corpus"),
        (("train", "surrogate", "--data", c, "--out", c, "--force-new"), "is the input --data"),
        (("train", "student", "--data", c, "--backbone", str(model), "--out", str(model), "--force-new"),
         "is the input --backbone"),
        (("train", "student", "--data", c, "--out", str(pairs), "--set", f"rse.triples={pairs}",
          "--objective", "rse", "--force-new"), "is the input --triples"),
        (("eval", "sts", "--scores", str(pairs), "--data", c, "--json", str(pairs)), "--json", "is the input --scores"),
        (("eval", "sts", "--tfidf", "--data", c, "--markdown", f"{c}/report.md"), "--markdown",
         "lies inside the input --data"),
        # trainers write local folders: an s3:// --out was a local folder named "s3:"
        (("train", "discriminator", "--corpus", c, "--out", "s3://bucket/disc"), "go to a local folder"),
        (("train", "context", "--corpus", c, "--out", "s3://bucket/ctx"), "go to a local folder"),
    ]
    _refused_each(capsys, cases)
    assert _unchanged(corpus) == before and verify_store(c) == []
    assert pairs.read_text() == "a b c\td e f\n" and (model / "config.json").read_text() == "{}"
    assert not (ROOT / "s3:").exists()


def test_each_input_of_every_command_is_checked_on_its_own(corpus, tmp_path, capsys):
    """Every input a command reads, with --out over that input alone (the other inputs apart), so that no
    input is refused only because another one that it sits beside is checked first."""
    c, t = str(corpus), tmp_path
    model, sts, enc = t / "model", t / "sts", t / "enc"
    for d in (model, sts, enc, t / "idx", t / "disc", t / "rcache", t / "tok", t / "pt", t / "ws"):
        d.mkdir()
    (model / "config.json").write_text("{}")
    pairs = t / "pairs.tsv"
    pairs.write_text("a b c\td e f\n")
    m, idx = str(model), str(t / "idx")
    harvest = ("harvest", "--corpus", c, "--index", idx, "--context-models", m, "--force-new")
    contexts = ("contexts", "--corpus", c, "--index", idx, "--force-new")
    context = ("train", "context", "--corpus", c, "--force-new")
    student = ("train", "student", "--data", c, "--backbone", m, "--force-new")
    cases = [
        ((*harvest, "--discriminator", str(t / "disc"), "--out", str(t / "disc" / "h")),
         "lies inside the input --discriminator"),
        ((*harvest, "--set", f"rank.encoder={enc}", "--out", str(enc)), "is the input rank.encoder"),
        ((*harvest, "--discriminator", str(t / "disc"), "--set", f"contexts.rep_cache={t / 'rcache'}",
          "--out", str(t / "rcache" / "h")),
         "lies inside the input contexts.rep_cache"),
        ((*contexts, "--out", f"{c}/x"), "lies inside the input --corpus"),
        ((*contexts, "--out", f"{idx}/x"), "lies inside the input --index"),
        ((*contexts, "--discriminator", m, "--out", m), "is the input --discriminator"),
        ((*contexts, "--sentences", str(pairs), "--out", str(pairs)), "is the input --sentences"),
        ((*contexts, "--discriminator", str(t / "disc"), "--set", f"contexts.rep_cache={t / 'rcache'}",
          "--out", str(t / "rcache" / "x")),
         "lies inside the input contexts.rep_cache"),
        ((*context, "--tokenizer-from", str(t / "tok"), "--out", str(t / "tok")), "is the input --tokenizer-from"),
        ((*context, "--set", f"model.pretrained_path={t / 'pt'}", "--out", str(t / "pt" / "x")),
         "lies inside the input model.pretrained_path"),
        ((*context, "--set", f"model.warm_start_path={t / 'ws'}", "--out", str(t / "ws")),
         "is the input model.warm_start_path"),
        (("train", "surrogate", "--data", c, "--backbone", m, "--out", m, "--force-new"), "is the input --backbone"),
        (("train", "surrogate", "--finetune-sts", str(sts), "--backbone", str(t / "bb"), "--out", str(sts),
          "--force-new"), "is the input --finetune-sts"),
        ((*student, "--out", f"{c}/s"), "lies inside the input --data"),
        ((*student, "--eval-sts", str(sts), "--out", str(sts)), "is the input --eval-sts"),
        ((*student, "--set", f"rankencoder.base_encoder={enc}", "--out", str(enc)),
         "is the input rankencoder.base_encoder"),
        (("eval", "sts", "--model", m, "--data", c, "--json", f"{m}/r.json"), "--json",
         "lies inside the input --model"),
    ]
    before = _unchanged(corpus)
    _refused_each(capsys, cases)
    assert _unchanged(corpus) == before and (model / "config.json").read_text() == "{}"
    assert pairs.read_text() == "a b c\td e f\n" and not any(any(p.iterdir()) for p in (sts, enc, t / "disc"))


def test_an_out_the_file_system_cannot_make_is_one_line_for_every_command(corpus, sample_path, shared_data, tmp_path,
                                                                          capsys):
    """A symlink to nothing (a disk not mounted) as --out or on the way to it was followed into a traceback
    (FileExistsError from makedirs, pyarrow's "non-directory entry exists"); it is refused in one line naming the
    link, before anything is written. A folder the file system will not make though nothing could tell
    beforehand (/proc/x: "no such file") is one line too, naming the output."""
    import errno

    from harvest_support import small_pairs_run, write_pairs_run

    c = str(corpus)
    harvest = str(write_pairs_run(tmp_path / "harvest", *small_pairs_run()))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    sts = ("eval", "sts", "--tfidf", "--data", shared_data / "sts", "--tasks", "STSb")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "unmounted-disk" / "runs")

    def commands(out):
        return [
            ("harvest", "--corpus", c, "--out", out, "--set", "contexts.mode=random", "--context-models", str(model)),
            ("corpus", "build", str(sample_path), "--out", out),
            ("index", "build", "--corpus", c, "--out", out),
            ("cache", "build", "--corpus", c, "--discriminator", str(model), "--out", out),
            ("contexts", "--corpus", c, "--index", str(model), "--out", out),
            ("remix", c, "--out", out),
            ("train", "discriminator", "--corpus", c, "--out", out),
            ("train", "context", "--corpus", c, "--out", out),
            ("train", "surrogate", "--data", harvest, "--out", out),
            ("train", "student", "--objective", "paser", "--data", harvest, "--out", out),  # the default backbone
        ]

    for out in (link, link / "run"):
        _refused_each(capsys, [(args, "is a symlink to", "which does not exist", str(link))
                               for args in commands(str(out))] + [((*sts, "--json", out / "r.json"), "--json",
                                                                   "is a symlink to")])
    assert not (tmp_path / "unmounted-disk").exists() and link.is_symlink()

    try:
        os.mkdir("/proc/sentsim-test")
        pytest.skip("this /proc makes folders")
    except OSError as e:
        if e.errno != errno.ENOENT:
            pytest.skip(f"/proc refuses a folder otherwise here ({e})")
    _refused_each(capsys, [(args, f"--out {out}: /proc/sentsim-test cannot be made there")
                           for out in ("/proc/sentsim-test", "/proc/sentsim-test/run")
                           for args in commands(out)[1:3] + commands(out)[-1:]]
                  + [((*sts, "--json", "/proc/sentsim-test/r.json"),
                      "--json /proc/sentsim-test/r.json: /proc/sentsim-test cannot be made there")])


def test_a_report_file_its_folder_will_not_take_is_one_line_before_scoring(shared_data, tmp_path):
    """`eval sts --json /proc/r.json`: the folder exists but makes no file, so the report's temporary file was
    "no such file", a traceback after the whole scoring. The report's folder is now tried with an empty file
    under that temporary name first: one line naming the flag, nothing scored, nothing left behind."""
    import errno

    try:
        open("/proc/sentsim-test-file", "wb").close()
        os.remove("/proc/sentsim-test-file")
        pytest.skip("this /proc makes files")
    except OSError as e:
        if e.errno != errno.ENOENT:
            pytest.skip(f"/proc refuses a file otherwise here ({e})")
    sts = ("eval", "sts", "--tfidf", "--data", shared_data / "sts", "--tasks", "STSb")
    for flag in ("--json", "--markdown"):
        r = sentsim_cli(*sts, flag, "/proc/r.out")
        _refused(r, f"{flag} /proc/r.out: /proc takes no new file")
        assert "Spearman" not in r.stdout  # refused before the scoring, not after it
    report = tmp_path / "new" / "r.json"  # a folder still to make is made, and holds only the report
    assert sentsim_cli(*sts, "--json", report).returncode == 0
    assert [p.name for p in report.parent.iterdir()] == ["r.json"]


def test_an_out_inside_another_output_is_refused_before_anything_is_written(corpus, tmp_path, capsys):
    """An --out inside another sentsim output (a model folder, a discriminator's training state, a harvest) would
    mix its files with that output's, and --force-new would delete that output's state: refused in one line naming
    the output, before anything is written, --force-new or not. A run's nested runs (a harvest's own rep_cache/)
    are built inside it by design, and a folder with a manifest.json of its own (no sentsim stage) is no output."""
    import json

    from harvest_support import cli_in_process

    disc = tmp_path / "disc"  # a finished discriminator: its listing, and its training state beside it
    (disc / "_train" / "ray").mkdir(parents=True)
    (disc / "sentsim_model.json").write_text(json.dumps({"format": "sentsim-discriminator-v1", "files": {}}))
    (disc / "_train" / "run.json").write_text(json.dumps({"fingerprint": "f" * 16, "job": {}}))
    harvest = tmp_path / "harvest"
    harvest.mkdir()
    (harvest / "manifest.json").write_text(json.dumps({"stage": "harvest"}))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    c = str(corpus)
    for args, where, words in (
            (("train", "surrogate", "--data", c, "--out", disc / "_train", "--force-new"), disc, "a discriminator"),
            (("train", "discriminator", "--corpus", c, "--out", disc / "_train" / "x"), disc, "a discriminator"),
            (("index", "build", "--corpus", c, "--out", harvest / "index"), harvest, "a sentsim 'harvest' run")):
        r = cli_in_process(capsys, *args)
        line = r.stderr.strip()
        assert r.returncode == 2 and len(line.splitlines()) == 1, r.stderr
        assert f"lies inside {where}, which holds {words}" in line, line
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # nothing written
    check_out(harvest / "rep_cache", {}, writes="run")  # the harvest's own cache
    project = tmp_path / "project"
    project.mkdir()
    (project / "manifest.json").write_text("{}")
    check_out(project / "corpus", {}, writes="run")


def test_a_trainer_refuses_an_out_of_other_files_before_replacing_or_deleting_them(corpus, tmp_path, capsys):
    """A trainer exports `model`, `curves`, `config.json` by name into its --out, and --force-new deletes those
    names and its state (`ray`, `checkpoint`): into a folder of the user's own files that replaced or deleted them.
    Such a folder (no sentsim output in it) is refused in one line naming what it holds, --force-new or not, as
    the sharded runs and the index refuse one; its files stay byte for byte. A folder holding only a lease (a
    trainer killed before it went ahead), hidden names or a trainer's run record is taken."""
    import json

    from harvest_support import small_pairs_run, write_pairs_run

    harvest = str(write_pairs_run(tmp_path / "harvest", *small_pairs_run()))
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "pytorch_model.bin").write_bytes(b"weights")
    (mine / "curves").mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    (mine / ".DS_Store").write_text("")
    before = _unchanged(mine)
    words = (f"--out {mine} is not empty (config.json, curves, model) and holds no sentsim output; refusing to "
             "write")
    c = str(corpus)
    _refused_each(capsys, [
        (("train", "surrogate", "--data", harvest, "--out", mine, "--force-new"), words,
         "a surrogate's training output among other files"),
        (("train", "surrogate", "--data", harvest, "--out", mine), words),
        (("train", "student", "--objective", "paser", "--data", harvest, "--out", mine, "--force-new"), words,
         "(--force-new discards only a student's training output)"),
        (("train", "context", "--corpus", c, "--out", mine, "--force-new"), words, "a context-model bundle"),
        (("train", "discriminator", "--corpus", c, "--out", mine, "--force-new"), words, "a discriminator")])
    assert _unchanged(mine) == before and sorted(p.name for p in mine.iterdir()) == [
        ".DS_Store", "config.json", "curves", "model"]
    for kind in ("surrogate", "student", "context", "discriminator"):
        check_out(tmp_path / "new", {}, writes=kind)
        empty = tmp_path / f"empty-{kind}"
        (empty / "_train").mkdir(parents=True)
        (empty / "_LEASE").write_text("{}")
        (empty / ".hidden").write_text("")
        check_out(empty, {}, writes=kind)
    recorded = tmp_path / "recorded"  # a run record of a format held_kind does not name: still a trainer's
    recorded.mkdir()
    (recorded / "run.json").write_text(json.dumps({"fingerprint": "f" * 16}))
    (recorded / "checkpoint").mkdir()
    check_out(recorded, {}, writes="surrogate")
