"""bench/surrogate_curve.py's cost record: the scoring budget two harvests are compared at.

A pool harvest and a per-pair one meet at equal scored items (issue 47), so the record of a harvest must
carry its report's scored items once the run is complete, and nothing from a run that was stopped.
"""

from __future__ import annotations

import json

from conftest import load_bench


def test_cost_record_takes_scored_items_only_from_a_finished_harvest(tmp_path):
    bench = load_bench("surrogate_curve")
    run = tmp_path / "pp16"
    run.mkdir()
    cost = {"wall_s": 12.0, "pairs": 40, "sets": [], "anchors": 8}
    (run / "report.json").write_text(json.dumps({"scored_items": 1880, "pairs": 40}))
    assert bench.with_budget(run, cost) == cost  # not complete: a report would not count every unit
    (run / "_COMPLETE").write_text("")
    assert bench.with_budget(run, cost) == dict(cost, scored_items=1880, labelled_pairs=40)
    (run / "report.json").unlink()
    assert bench.with_budget(run, cost) == cost


def test_compare_pairs_two_models_of_the_last_report_and_names_an_unknown_one(tmp_path, monkeypatch, capsys):
    import numpy as np

    bench = load_bench("surrogate_curve")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    gold = np.arange(30, dtype=float)
    teacher = [None if i == 4 else float(i) for i in range(30)]  # a pair the teacher did not score is left out
    (tmp_path / "surrogate_curve_scores.json").write_text(json.dumps(
        {"gold": gold.tolist(), "models": {"Origin teacher": teacher, "pp16-scratch": (-gold).tolist()}}))
    assert bench.main(["compare", "Origin teacher", "pp16-scratch"]) == 0
    out = capsys.readouterr().out
    assert "on 29 pairs both scored: +200.00" in out
    assert bench.main(["compare", "Origin teacher", "nope"]) == 2
    assert "no model 'nope' in the last report" in capsys.readouterr().err
