"""bench/gpu.py (issue 38) runs on a CPU in seconds with --tiny, so that the GPU bench never rots between the
rare runs on a GPU: every section completes and the last line is the JSON object the issue names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_bench_runs_every_section_on_a_cpu(tmp_path, speech_corpus):
    out, files = tmp_path / "gpu", _pair_files(tmp_path / "pairs")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny", "--device", "cpu",
                           "--corpus", str(speech_corpus), "--teacher-minutes", "0.05", "--micro-batches", "8,1",
                           "--compile", "score", "--pack", "400", "--attention", "flex",
                           "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                           "--teacher-pairs", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("device", "peak_tflops", "train_mfu", "train_padding", "score_mfu", "score_padding",
                "host_target_tokens_per_s"):
        assert last[key] is not None, (key, last)
    errors = json.loads((out / "gpu.json").read_text())["errors"]
    # FlexAttention has no backward pass on a CPU: its runs are refused there, each in its own entry
    flex = ["train bart, attention=flex", "train bart, pack_tokens=400, attention=flex"]
    assert last["failed"] == flex, errors
    assert all("trains on a GPU only" in errors[k] for k in flex)
    assert last["score_fp32_max_rel_diff"] < 1e-4  # the scorer's fp32 log-probs are a plain forward's
    assert 0 <= last["train_padding"] < 0.25 and 0 < last["train_mfu"] < 1
    assert (out / "gpu.md").read_text().startswith("Device: cpu")
    trained = [r["shape"] for r in json.loads((out / "gpu.json").read_text())["sections"]["train"]["rows"]]
    assert trained == ["bart", "bart, micro_batches=1", "bart, pack_tokens=400", "warm_start"]
    assert last["train_mfu_packed"] is not None
    scored = json.loads((out / "gpu.json").read_text())["sections"]["score"]["rows"]
    assert [r["compile"] for r in scored] == [False, False, True]
    assert scored[-1]["max_abs_diff_vs_eager"] < 0.05  # bf16 where this CPU has it
    # a compiled figure says whether it is of whole-function graphs: the scorer's two functions, no break
    assert scored[-1]["compiled_graph_breaks"] == 0 and 1 <= scored[-1]["compiled_graphs"] <= 6, scored[-1]
    assert last["transformers"] and "graph(s), 0 break(s)" in (out / "gpu.md").read_text()


def test_a_gpu_asked_for_where_there_is_none_is_refused_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cuda", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


# The one-run teacher (bench/gpu.py --teacher-minutes, bench/gpu_teacher.py): a CPU dry run of the GPU command,
# on pair files in each format the harvest reads, with no Ray importable (the GPU machine has none).
STSB_LINES = [("5.000", "The government of the United States must act now.", "The United States government must act."),
              ("1.200", "The people of this country want peace.", "The Congress passed a law on taxes."),
              ("3.400", "We must protect the rights of all citizens.", "The rights of every citizen are protected."),
              ("0.400", "Our army is strong.", "The year has been a good one for trade.")]
DEV_ROWS = [("The Constitution gives the President power.", "The President holds power under the Constitution.", 4.6),
            ("Taxes must be reduced this year.", "The navy needs new ships.", 0.2),
            ("I thank the Congress for its work.", "Congress has done good work, and I thank it.", 4.0),
            ("Our economy is growing.", "The public debt must be paid.", 1.0)]


def _pair_files(d: Path) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    files = {"stsb": d / "sts-test.csv", "dev": d / "dev.jsonl", "extra": d / "extra pairs.csv"}
    files["stsb"].write_text("".join(f"main-news\theadlines\t2012\t{i:04d}\t{g}\t{a}\t{b}\n"
                                     for i, (g, a, b) in enumerate(STSB_LINES)))
    files["dev"].write_text("".join(json.dumps({"s1": a, "s2": b, "gold": g}) + "\n" for a, b, g in DEV_ROWS))
    files["extra"].write_text('s1,s2,gold\n"The world is at peace, and we are glad.",We are glad of peace.,4.8\n'
                              "The law was passed by the Senate.,Farmers need better prices.,0.5\n"
                              "Education is the key to our future.,Our future depends on schools.,3.9\n")
    return files


def _no_ray(tmp_path: Path) -> dict:
    import os

    from run_support import without_ray

    return dict(os.environ, **without_ray(tmp_path))  # no Ray on the GPU machine


@pytest.mark.slow
def test_teacher_dry_run_scores_every_set_and_leaves_score_files_that_remake_it(tmp_path, speech_corpus):
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_teacher as gt

    files, out = _pair_files(tmp_path / "pairs"), tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny", "--device", "cpu",
                           "--teacher-minutes", "0.05", "--sections", "teacher", "--corpus", str(speech_corpus),
                           "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                           "--pairs", str(files["extra"]), "--teacher-pairs", "3", "--out", str(out),
                           "--teacher-sizes", "16,100,16/100"],
                          capture_output=True, text=True, timeout=600, env=_no_ray(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["failed"] == [], json.loads((out / "gpu.json").read_text())["errors"]
    assert last["teacher_target_tokens"] > 0
    teacher = last["teacher"]
    assert set(teacher) == {"stsb_test", "dev", "extra_pairs"}
    for name, by_size in teacher.items():
        assert set(by_size) == {"16", "100", "16/100"}, name
        for r in by_size.values():
            assert r["scored"] == r["pairs"] == 3
            for key in ("spearman", "tfidf", "diff"):
                assert -200 <= r[key] <= 200, (name, key, r)
            assert len(r["diff_ci"]) == 2 and r["diff_ci"][0] <= r["diff_ci"][1]
            assert abs(r["diff"] - (r["spearman"] - r["tfidf"])) < 1e-9
        assert by_size["16"]["contexts_per_pair"] <= by_size["100"]["contexts_per_pair"]
        # 16 chosen by Eq. 3 from 100 (contexts.rerank_shortlist) holds as many contexts as the first 16
        assert by_size["16/100"]["contexts_per_pair"] == by_size["16"]["contexts_per_pair"]
    # the score files are all a CPU needs to remake the numbers, and they hold what the sets hold
    assert sorted(p.name for p in out.glob("teacher-*.jsonl.gz")) == [
        "teacher-dev.jsonl.gz", "teacher-extra_pairs.jsonl.gz", "teacher-stsb_test.jsonl.gz"]
    assert gt.report(out) == teacher
    rows = gt.read_scores(out / "teacher-dev.jsonl.gz")
    assert [(r["s1"], r["s2"], r["gold"]) for r in rows] == [tuple(x) for x in DEV_ROWS[:3]]
    assert [r["tfidf"] for r in rows] == pytest.approx(list(gt.tfidf_cosine(DEV_ROWS[:3])))
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_teacher.py"), "report", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1]) == teacher
    assert "| stsb_test | 100 | 3/3 |" in (out / "gpu.md").read_text()
    assert "Teacher sets, 3 of 3 scored: stsb_test = " in (out / "gpu.md").read_text()
    assert "| stsb_test | 16/100 | 3/3 |" in (out / "gpu.md").read_text()
    runs = json.loads((out / "gpu.json").read_text())["sections"]["teacher"]["scoring"]
    by = {(r["set"], r["size"]): r["items"] for r in runs}
    assert by[("dev", "16/100")] > by[("dev", "16")]  # the shortlists' items besides Eq. 4's
    # STS-B test at every size before the other sets: out of time, the dev sample goes first
    assert [r["set"] for r in runs][:3] == ["stsb_test"] * 3
    # the scorer ran on the teacher's shape before training (its rate plans `fill`), and the training's row
    # is kept apart from the scoring's
    res = json.loads((out / "gpu.json").read_text())
    assert last["teacher_probe_items_per_s"] > 0
    assert res["teacher_train"]["target_tokens_total"] == last["teacher_target_tokens"]


def test_a_smaller_context_set_is_the_prefix_of_a_larger_one(tmp_path, speech_corpus):
    """Only the largest |C_s| is made; each smaller one is cut from it. That is what ContextStage selects at
    the smaller size, because selection is greedy in retrieval order."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_teacher as gt

    pairs = [(a, b, float(g)) for g, a, b in STSB_LINES] + list(DEV_ROWS)
    index = str(tmp_path / "index")
    gt.ensure_index(str(speech_corpus), index)
    for size in (4, 40):
        gt.make_contexts(str(speech_corpus), index, {"s": pairs}, size, tmp_path / "ctx")
    small = gt.read_units(tmp_path / "ctx" / "s-k4.jsonl.gz", 4)
    cut = gt.read_units(tmp_path / "ctx" / "s-k40.jsonl.gz", 4)
    assert cut == small
    assert any(len(cs["contexts"]) == 4 for u in small for cs in u["csets"].values())
    assert gt.pairs_of(cut) == pairs


def test_the_fast_bootstrap_is_bench_common_s():
    """All resamples at once, the same draws and statistic as bench/common.py's loops (ties and NaN too)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    import common
    import gpu_teacher as gt

    rng = np.random.default_rng(3)
    gold = np.round(rng.random(120) * 5, 1)
    a, b = np.round(gold + rng.random(120), 1), gold + rng.random(120)
    a[[5, 17]] = np.nan
    assert np.allclose(gt.bootstrap(a, gold, n=300), common.bootstrap(a, gold, n=300), atol=1e-9)
    ok = np.isfinite(a)
    assert np.allclose(gt.paired_bootstrap(a[ok], b[ok], gold[ok], n=300),
                       common.paired_bootstrap(a[ok], b[ok], gold[ok], n=300), atol=1e-9)


# The GPU command's arguments are checked before any section runs: on a lent GPU the session's 15 minutes are
# what runs out, so a mistake is one line and exit 2 before the first section, never a section lost after it.
def _gpu():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu

    return gpu


def _refusal(capsys, argv, out) -> str:
    """bench/gpu.py run on `argv` in this process: refused, in one line, before anything is made under --out."""
    assert _gpu().main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("bench/gpu.py: error: "), err
    assert not out.exists()  # nothing ran
    return err[len("bench/gpu.py: error: "):]


TEACHER = ["--tiny", "--device", "cpu", "--sections", "teacher", "--teacher-minutes", "0.05"]


@pytest.mark.parametrize("name, content, says", [
    ("nope.csv", None, "{path}: pairs file not found"),
    ("empty.csv", "", "{path}: no pairs"),
    ("wrong.csv", "a,b,c\nx,y,z\n", "{path}:1: header line names columns a, b, c;"),
    ("nogold.tsv", "s1\ts2\nThe cat sat.\tA cat sat down.\n",
     "{path}: no pair has a gold score, so there is nothing to correlate with"),
])
def test_a_pairs_file_the_teacher_cannot_score_is_refused_before_any_section(tmp_path, capsys, name, content, says):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    files = _pair_files(tmp_path / "sets")
    for fill in ("0.05", "fill"):  # `fill` (bench/gpu_run.sh's) read it only after minutes of training
        argv = [*TEACHER[:-1], fill, "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                "--pairs", str(files["extra"]), "--pairs", str(path)]
        assert _refusal(capsys, argv, tmp_path / "out").startswith(f"--pairs {says.format(path=path)}")
    # STS-B test and the dev sample given are read as strictly: they are what the run is for
    argv = [*TEACHER, "--stsb-test", str(path), "--dev-pairs", str(files["dev"])]
    assert _refusal(capsys, argv, tmp_path / "out").startswith(f"--stsb-test {says.format(path=path)}")


def test_mistakes_in_the_gpu_command_s_arguments_are_one_line_before_any_section(tmp_path, capsys):
    files = _pair_files(tmp_path / "sets")
    sets = ["--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"])]
    extra = str(files["extra"])
    again = str(tmp_path / "sets" / ".." / "sets" / "extra pairs.csv")
    cases = [
        ([*TEACHER, *sets, "--pairs", extra, "--pairs", again],
         f"--pairs {again}: the same file as --pairs {extra}; each file is scored once"),
        ([*TEACHER, *sets, "--pairs", str(files["dev"])],
         f"--pairs {files['dev']}: the same file as --dev-pairs {files['dev']}; each file is scored once"),
        # --pairs is scored by the teacher section alone: without it, the file would be dropped unsaid
        (["--tiny", "--device", "cpu", *sets, "--pairs", extra],
         f"--pairs {extra}: pairs files are scored by the teacher section, and it runs only with "
         "--teacher-minutes N (or `fill`)"),
        (["--tiny", "--device", "cpu", "--sections", "peak", "--teacher-minutes", "1", *sets, "--pairs", extra],
         f"--pairs {extra}: pairs files are scored by the teacher section, and --sections leaves it out"),
        ([*TEACHER[:4], "peak,teachr"], "--sections 'peak,teachr': unknown section(s) teachr; the sections are "
                                        "peak,host,train,score,teacher"),
        ([*TEACHER, *sets, "--teacher-sizes", "16,x"],
         "--teacher-sizes: |C_s| 'x': expected K or K/N (K chosen by Eq. 3 from N)"),
        ([*TEACHER, *sets, "--teacher-sizes", ","],
         "--teacher-sizes ',' names no |C_s|; give K or K/N, comma-separated (e.g. 16,100)"),
    ]
    for argv, line in cases:
        assert _refusal(capsys, argv, tmp_path / "out") == line, argv


def test_every_pairs_file_gets_a_set_name_of_its_own(tmp_path, capsys):
    """Files of one stem (pairs.csv, pairs.tsv ...) or one name in two folders are each scored under a name of
    their own, never a built-in set's, and the run says which file each name is."""
    gpu = _gpu()
    files = _pair_files(tmp_path / "sets")
    text = (tmp_path / "sets" / "extra pairs.csv").read_text()
    tsv = "s1\ts2\tgold\n" + "".join(f"{a}\t{b}\t{g}\n" for a, b, g in DEV_ROWS)
    given = {"pf/stsb.tsv": tsv, "pf/pairs.csv": text, "pf/pairs.tsv": tsv, "pf/pairs.jsonl": files["dev"].read_text(),
             "a/test.tsv": tsv, "b/test.tsv": tsv, "pf/dev.tsv": tsv, "pf/stsb_test.csv": text}
    for rel, content in given.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    pairs = [str(tmp_path / rel) for rel in given]
    a = gpu.parser().parse_args([*TEACHER, "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                                 *[x for p in pairs for x in ("--pairs", p)]])
    gpu.check_arguments(a)
    assert a.teacher_sets == {"stsb_test": str(files["stsb"]), "dev": str(files["dev"]), "stsb": pairs[0],
                              "pairs_csv": pairs[1], "pairs_tsv": pairs[2], "pairs_jsonl": pairs[3],
                              "a_test_tsv": pairs[4], "b_test_tsv": pairs[5], "dev_tsv": pairs[6],
                              "stsb_test_csv": pairs[7]}
    assert a.teacher_set_pairs["pairs_csv"] == 3 and a.teacher_set_pairs["dev"] == 4  # --tiny: the first 4
    err = capsys.readouterr().err
    assert f"teacher set pairs_tsv: {pairs[2]} (4 pair(s))" in err
    # a name depends on the files given, not on their order
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_teacher as gt

    names = dict(zip(pairs, gt.set_names(pairs)))
    assert dict(zip(pairs[::-1], gt.set_names(pairs[::-1]))) == names
    assert gt.set_names(["x/p.csv"]) == ["p"]


def test_a_size_named_twice_is_scored_once_with_a_note(tmp_path, capsys):
    gpu = _gpu()
    files = _pair_files(tmp_path / "sets")
    a = gpu.parser().parse_args([*TEACHER, "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                                 "--teacher-sizes", "100,16,016,16/100,16"])
    gpu.check_arguments(a)
    assert a.teacher_sizes == ["16", "16/100", "100"]
    assert "note: --teacher-sizes 100,16,016,16/100,16: 16 named more than once; each size is scored once" \
        in capsys.readouterr().err


def test_the_report_s_figures_and_failures_read_as_lines():
    """gpu.md: a CPU's peak of a fraction of a TFLOP/s is not rounded to 0, a run without the peak says it
    was not measured, and each failure is one line (its traceback is gpu.json's only)."""
    gpu = _gpu()
    res = {"device": "cpu", "torch": "2", "transformers": "5", "python": "3.12", "cpus": 2, "sections": {},
           "errors": {"peak": "RuntimeError: it broke\n  on two lines", "teacher x 100": "skipped: out of time"},
           "teacher_sets": {"stsb_test": "/d/sts-test.csv", "x": "/d/x.csv"}, "teacher": {}}
    md = gpu.table({**res, "peak_tflops": 0.354, "peak_dtype": "bfloat16"}).splitlines()
    assert md[0].endswith("peak 0.354 TFLOP/s (bfloat16 matmul, measured)")
    assert gpu.table({**res, "peak_tflops": 989.4}).splitlines()[0].endswith("peak 989 TFLOP/s (? matmul, measured)")
    md = gpu.table(res).splitlines()
    assert md[0].endswith("peak not measured (MFU needs the peak section)")
    assert "| peak | failed: RuntimeError: it broke on two lines | | |" in md
    assert "| teacher x 100 | skipped: out of time | | |" in md
    assert "Teacher sets, 0 of 2 scored: stsb_test = /d/sts-test.csv (not scored); x = /d/x.csv (not scored)" in md


@pytest.mark.slow
def test_a_set_that_fails_after_the_check_costs_that_set_alone(tmp_path, speech_corpus, capsys):
    """A pairs file that passed the check and is gone when the context sets are made (after it, in a process of
    its own): that set is not scored, and said to be, in one line; STS-B test, the dev sample and the other
    --pairs file are scored as ever, and the run ends 0."""
    gpu = _gpu()
    files, out = _pair_files(tmp_path / "sets"), tmp_path / "out"
    gone = tmp_path / "sets" / "gone.csv"
    gone.write_text(files["extra"].read_text())
    a = gpu.arguments([*TEACHER, "--corpus", str(speech_corpus), "--stsb-test", str(files["stsb"]),
                       "--dev-pairs", str(files["dev"]), "--pairs", str(files["extra"]), "--pairs", str(gone),
                       "--teacher-pairs", "3", "--teacher-sizes", "16", "--out", str(out)])
    gone.unlink()
    out.mkdir()
    (out / "teacher-gone.jsonl.gz").write_bytes(b"an earlier run's")  # never passed off as this run's
    assert gpu.run(a) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    why = f"not scored: context sets not made: UsageError: {gone}: pairs file not found"
    assert last["failed"] == ["teacher gone"] and last["teacher_not_scored"] == {"gone": why}
    assert set(last["teacher"]) == {"stsb_test", "dev", "extra_pairs"}
    assert all(r["16"]["scored"] == 3 for r in last["teacher"].values())
    res = json.loads((out / "gpu.json").read_text())
    assert res["sections"]["teacher"]["sets_scored"] == 3 and res["errors"] == {"teacher gone": why}
    assert sorted(p.name for p in out.glob("teacher-*")) == [
        "teacher-dev.jsonl.gz", "teacher-extra_pairs.jsonl.gz", "teacher-stsb_test.jsonl.gz"]
    md = (out / "gpu.md").read_text().splitlines()
    assert f"| teacher gone | {why} | | |" in md
    assert ("Teacher sets, 3 of 4 scored: stsb_test = {stsb}; dev = {dev}; extra_pairs = {extra}; gone = {gone} "
            "(not scored)").format(gone=gone, **files) in md
