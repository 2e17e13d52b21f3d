"""bench/teacher_curve.py end to end on a tiny teacher: the points it records, a resumed run, --compare.

The bench's figures stand in BENCHMARKS.md, so the code that turns a harvest into a row (items and
CPU charged to each Eq. 4 variant, the per-pair scores kept for later comparisons) is checked here
on a real inline harvest of six STS-B dev pairs, not on hand-made tables.
"""

from __future__ import annotations

import json
import math
import multiprocessing

import numpy as np
import pytest
from conftest import load_bench
from harvest_support import build_index_for, tiny_context_bundle


def test_bootstrap_leaves_out_unscored_pairs_and_pairs_the_resamples():
    common = load_bench("common")
    gold = np.arange(40, dtype=float)
    pred = gold.copy()
    pred[[3, 7]] = np.nan  # pairs without a score are left out, and counted as such
    rho, lo, hi, used = common.bootstrap(pred, gold, n=200)
    assert (rho, used) == (pytest.approx(100.0), 38)
    assert lo == pytest.approx(100.0) and hi == pytest.approx(100.0)
    reverse = -gold
    d, lo, hi = common.paired_bootstrap(gold, reverse, gold, n=200)
    assert d == pytest.approx(200.0) and lo == pytest.approx(200.0)
    noisy = gold + np.random.default_rng(0).normal(0, 10, 40)
    d, lo, hi = common.paired_bootstrap(noisy, noisy, gold, n=200)
    assert (d, lo, hi) == (0.0, 0.0, 0.0)  # the same resamples for both sides


def test_runs_side_by_side_keep_each_others_points(tmp_path):
    """The curve is measured two runs at a time (one thread each); both add their rows to the same
    json files. Eight writers adding forty points each: none may be dropped by another's rewrite."""
    curve = load_bench("teacher_curve")

    def writer(i: int) -> None:
        for k in range(40):
            point = {"label": f"run{i}", "size": k, "group": 1, "variant": "paper"}
            curve.add_points(tmp_path, f"run{i}", k, 1, [point], {f"run{i}:{k}:1:paper": [float(k)]})

    procs = [multiprocessing.get_context("fork").Process(target=writer, args=(i,)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0] * 8
    points = json.loads((tmp_path / "teacher_curve.json").read_text())
    expected = sorted((f"run{i}", k) for i in range(8) for k in range(40))
    assert sorted((p["label"], p["size"]) for p in points) == expected
    assert len(curve.load_scores(tmp_path)) == 8 * 40
    # a label run again replaces its own point at that size and nobody else's
    curve.add_points(tmp_path, "run0", 3, 1, [{"label": "run0", "size": 3, "group": 1, "variant": "paper",
                                               "again": True}], {})
    points = json.loads((tmp_path / "teacher_curve.json").read_text())
    assert len(points) == 8 * 40 and [p for p in points if p.get("again")] == [points[-1]]


@pytest.fixture(scope="module")
def tiny_teacher(speech_corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny_teacher")
    return (speech_corpus, build_index_for(speech_corpus, tmp / "index"),
            tiny_context_bundle(speech_corpus, tmp / "bundle"))


def test_grouped_point_records_three_variants_and_resumes_without_recharging(
        tiny_teacher, shared_data, tmp_path, capsys, one_torch_thread):
    curve = load_bench("teacher_curve")
    corpus, index, bundle = tiny_teacher
    work, results = tmp_path / "work", tmp_path / "results"
    argv = ["--label", "tiny", "--bundle", str(bundle), "--sizes", "2", "--group", "2", "--pairs", "6",
            "--work", str(work), "--results", str(results),
            "--set", f"corpus={corpus}", "--set", f"index={index}", "--set", "contexts.retrieve_chunks=40",
            "--set", "pairs_per_unit=4"]
    # a point split across runs: --max-units 1 scores the first unit (4 pairs) and reports it; the
    # next run continues the same harvest and is charged only for the units it scored itself
    assert curve.main(argv + ["--max-units", "1"]) == 0
    first = json.loads((work / "tiny-n6-k2-g2.cpu").read_text())
    assert first["pairs"] == 4 and first["cpu_s"] > 0
    part = json.loads((results / "teacher_curve.json").read_text())
    assert {p["variant"] for p in part} == {"paper", "union", "centred"}
    assert all(p["pairs"] <= 4 and p["of"] == 4 for p in part)  # over the committed pairs
    assert curve.main(argv) == 0
    cost = json.loads((work / "tiny-n6-k2-g2.cpu").read_text())
    assert cost["pairs"] == 6 and cost["cpu_s"] > first["cpu_s"]

    points = json.loads((results / "teacher_curve.json").read_text())
    by_variant = {p["variant"]: p for p in points}
    assert sorted(by_variant) == ["centred", "paper", "union"]
    assert all(p["label"] == "tiny" and p["size"] == 2 and p["of"] == 6 for p in points)
    paper, union = by_variant["paper"], by_variant["union"]
    assert paper["group"] == 1 and union["group"] == 2
    # the paper's row is charged only its share of the grouped run's items and CPU
    assert 0 < paper["items_per_pair"] < union["items_per_pair"]
    assert 0 < paper["cpu_s_per_pair"] < union["cpu_s_per_pair"]
    assert paper["contexts_per_pair"] <= union["contexts_per_pair"] <= 2 * 2 * 2
    assert all(0 < p["pairs"] <= 6 for p in points) and max(p["pairs"] for p in points) > 4  # both runs' units

    table = (results / "teacher_curve.md").read_text()
    assert "Baseline, TF-IDF cosine on the same pairs" in table
    assert table.count("| tiny | 2 |") == 3
    scores = json.loads((results / "teacher_curve_scores.json").read_text())
    assert set(scores) == {"tiny:2:2:paper", "tiny:2:2:union", "tiny:2:2:centred"}
    assert len(scores["tiny:2:2:paper"]) == paper["pairs"]
    assert all(math.isfinite(s) for _, s, _ in scores["tiny:2:2:union"])

    # a finished harvest is not run again, and its cost per pair stays what its runs measured
    capsys.readouterr()
    assert curve.main(argv) == 0
    assert "$ sentsim.cli harvest" not in capsys.readouterr().out
    assert json.loads((results / "teacher_curve.json").read_text()) == points
    assert json.loads((work / "tiny-n6-k2-g2.cpu").read_text()) == cost

    # --compare pairs two variants of the same pairs; with the harvest gone it reads the kept scores
    assert curve.main(["--compare", "tiny:2:2:union", "tiny:2:2:paper", "--pairs", "6",
                       "--work", str(work), "--results", str(results)]) == 0
    from_run = capsys.readouterr().out
    assert "tiny:2:2:union - tiny:2:2:paper on" in from_run
    # and their agreement, pair by pair, is the Spearman of the two kept score lists
    from scipy.stats import spearmanr
    union = {pid: s for pid, s, _ in scores["tiny:2:2:union"]}
    paired = [(union[pid], s) for pid, s, _ in scores["tiny:2:2:paper"] if pid in union]
    rho = spearmanr(*zip(*paired)).statistic
    assert f"agreement of the two points' pair scores: Spearman {rho:.4f}," in from_run
    assert curve.main(["--compare", "tiny:2:2:union", "tiny:2:2:paper", "--pairs", "6",
                       "--work", str(tmp_path / "elsewhere"), "--results", str(results)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == from_run.splitlines()[-1]
    with pytest.raises(SystemExit, match="expected LABEL:K:G"):
        curve.main(["--compare", "tiny:2", "tiny:2:2", "--pairs", "6", "--work", str(work),
                    "--results", str(results)])


def test_ensemble_averages_standardised_scores_and_pairs_it_against_its_members(tmp_path, capsys):
    """--ensemble: two teachers' pair scores from the kept results, each standardised before the mean (a
    teacher whose Eq. 4 scores sit in another band weighs the same), on the pairs both scored."""
    from scipy.stats import spearmanr

    curve = load_bench("teacher_curve")
    rng = np.random.default_rng(0)
    gold = np.arange(60, dtype=float)
    a, b = gold + rng.normal(0, 25, 60), gold + rng.normal(0, 25, 60)
    b_scaled = 1000 * b + 5  # the same ordering and spread relative to its own band
    rows = {"a:16:1:paper": [[i, float(a[i]), float(gold[i])] for i in range(60)],
            "b:16:1:paper": [[i, float(b_scaled[i]), float(gold[i])] for i in range(1, 60)],  # pair 0 unscored
            "c:32:1:paper": [[i, float(gold[i]), float(gold[i])] for i in range(60)]}
    curve.add_points(tmp_path, "x", 0, 1, [], rows)
    argv = ["--pairs", "6", "--work", str(tmp_path / "work"), "--results", str(tmp_path)]
    assert curve.main(["--ensemble", "a:16:1", "b:16:1", "--against", "c:32:1", *argv]) == 0
    out = capsys.readouterr().out
    za, zb = ((x[1:] - x[1:].mean()) / x[1:].std(ddof=1) for x in (a, b))
    rho = spearmanr((za + zb) / 2, gold[1:]).statistic * 100
    assert f"ensemble of a:16:1 + b:16:1 on 59 pairs all scored: {rho:.2f} [" in out
    # independent noise averages out: the ensemble is ahead of both members on these pairs
    assert all(rho > spearmanr(x[1:], gold[1:]).statistic * 100 for x in (a, b))
    assert "ensemble - a:16:1: +" in out and "ensemble - b:16:1: +" in out
    assert "ensemble - c:32:1: -" in out  # c is gold itself
    with pytest.raises(SystemExit, match="two points or more"):
        curve.main(["--ensemble", "a:16:1", *argv])
    with pytest.raises(SystemExit, match="no scores for nobody:16:1:paper"):
        curve.main(["--ensemble", "a:16:1", "nobody:16:1", *argv])


def test_pool_point_gives_a_row_per_metric_from_one_scoring(tiny_teacher, shared_data, tmp_path, capsys,
                                                            one_torch_thread):
    """--pool: the sample's sentences scored once against a shared pool; pearson from the harvest,
    double-centred from `sentsim remix` of its vectors (no second scoring), both charged the harvest's
    items and CPU; a rerun scores nothing, and --compare pairs the two metrics."""
    curve = load_bench("teacher_curve")
    corpus, index, bundle = tiny_teacher
    work, results = tmp_path / "work", tmp_path / "results"
    argv = ["--label", "tinypool", "--bundle", str(bundle), "--pool", "--sizes", "4", "--pairs", "6",
            "--work", str(work), "--results", str(results), "--set", f"corpus={corpus}", "--set", f"index={index}"]
    assert curve.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("$ sentsim.cli harvest") == 1 and out.count("$ sentsim.cli remix") == 1
    points = {p["variant"]: p for p in json.loads((results / "teacher_curve.json").read_text())}
    assert sorted(points) == ["pool-double-centred", "pool-pearson"]
    pearson, centred = points["pool-pearson"], points["pool-double-centred"]
    # each of the (at most 12) sample sentences is scored against the 4 pool contexts once, for both rows
    assert pearson["items_per_pair"] == centred["items_per_pair"] <= 12 * 4 / 6
    assert pearson["cpu_s_per_pair"] == centred["cpu_s_per_pair"] > 0
    assert pearson["contexts_per_pair"] == 4 and pearson["of"] == 6 and pearson["group"] == 1
    scores = json.loads((results / "teacher_curve_scores.json").read_text())
    assert set(scores) == {"tinypool:4:1:pool-pearson", "tinypool:4:1:pool-double-centred"}
    assert scores["tinypool:4:1:pool-pearson"] != scores["tinypool:4:1:pool-double-centred"]
    assert "| tinypool | 4 | pool, double-centred |" in (results / "teacher_curve.md").read_text()

    assert curve.main(argv) == 0  # finished: nothing is scored or remixed again
    out = capsys.readouterr().out
    assert "$ sentsim.cli" not in out
    assert curve.main(["--compare", "tinypool:4:1:pool-double-centred", "tinypool:4:1:pool-pearson", "--pairs", "6",
                       "--work", str(work), "--results", str(results)]) == 0
    assert "tinypool:4:1:pool-double-centred - tinypool:4:1:pool-pearson on" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        curve.main(argv + ["--group", "2"])
