"""The Eq. 4 metric registry (sentsim/harvest/metrics/): each name spelt once, a new metric is one file.

A toy metric registered from its own file (tests/harvest/toy_metric.py) is taken by `sentsim harvest --set
metric=...` and `sentsim remix --metric ...` (run in this process, where the toy is registered), and
every score they write is the toy's value of the pair's vectors, recomputed here by hand.
"""

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
from harvest_support import build_index_for, tiny_context_bundle

from sentsim.harvest import metrics

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = ("cosine", "pearson", "spearman", "double-centred")


def test_the_built_in_metrics_in_order_and_what_remix_offers():
    assert metrics.names() == BUILT_IN
    assert metrics.remixable() == ("cosine", "pearson", "spearman")  # double-centred reads reference scores
    assert metrics.DEFAULT == "pearson"
    with pytest.raises(ValueError, match="unknown metric 'euclid'; choose one of cosine, pearson, spearman"):
        metrics.get("euclid")
    with pytest.raises(ValueError, match="already registered"):
        metrics.register(metrics.Metric("pearson", lambda a, b, e=None: 0.0))


def test_each_metric_name_is_spelt_once_in_the_code():
    """A metric's name is a quoted string in its own file only: configs, remix, the command, grouping
    and the stages take it from the registry."""
    places = list((ROOT / "sentsim" / "harvest").rglob("*.py")) + list((ROOT / "sentsim" / "commands").glob("*.py"))
    for name in metrics.names():
        quoted = re.compile(rf"""["']{re.escape(name)}["']""")
        hits = [p.relative_to(ROOT).as_posix() for p in places for _ in quoted.finditer(p.read_text())]
        assert hits == [f"sentsim/harvest/metrics/{name.replace('-', '_')}.py"], (name, hits)


def test_listing_the_metrics_imports_no_numpy():
    """`sentsim --help` (every command's parser) lists remix's --metric choices from the registry: that
    imports the metric files, which leave numpy to the call."""
    import subprocess
    import sys

    code = ("import sys; import sentsim.cli; sentsim.cli.build_parser(); "
            "assert 'numpy' not in sys.modules, 'building the parser imported numpy'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_configs_and_the_remix_command_take_their_choices_from_the_registry(toy):
    from pydantic import ValidationError

    from sentsim.cli import build_parser
    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.remix import RemixConfig

    base = dict(corpus="c", out="o", context_models=["m"], index="i")
    assert HarvestConfig(**base, metric=toy.NAME).metric == toy.NAME
    assert RemixConfig(source="s", out="o", metric=toy.NAME).metric == toy.NAME
    with pytest.raises(ValidationError, match=f"Input should be 'cosine', 'pearson', 'spearman', 'double-centred' "
                                              f"or '{toy.NAME}'"):
        HarvestConfig(**base, metric="euclid")
    # remix takes every metric: double-centred is refused later, for a harvest that kept no context effect
    # (a per-pair one; a pool harvest has its vectors: tests/harvest/test_pool_harvest.py)
    with pytest.raises(ValidationError, match=f"Input should be 'cosine', 'pearson', 'spearman', 'double-centred' "
                                              f"or '{toy.NAME}'"):
        RemixConfig(source="s", out="o", metric="euclid")
    parser = build_parser()
    args = parser.parse_args(["remix", "h", "--out", "o", "--metric", toy.NAME])
    assert args.metric == toy.NAME
    assert parser.parse_args(["remix", "h", "--out", "o", "--metric", "double-centred"]).metric == "double-centred"
    with pytest.raises(SystemExit):
        parser.parse_args(["remix", "h", "--out", "o", "--metric", "euclid"])


def test_a_withdrawn_metric_is_refused_again(toy):
    from pydantic import ValidationError

    from sentsim.harvest.remix import RemixConfig

    metrics.unregister(toy.NAME)
    with pytest.raises(ValidationError, match="Input should be 'cosine', 'pearson', 'spearman' or 'double-centred'"):
        RemixConfig(source="s", out="o", metric=toy.NAME)
    metrics.register(toy.METRIC)


@pytest.fixture
def toy():
    """The toy metric, registered by importing its file, and withdrawn after the test (the registry is
    the process's: later tests, the docs check among them, see the built-in metrics only)."""
    import toy_metric

    metrics.register(toy_metric.METRIC)  # again, if an earlier test withdrew it (same object: no error)
    yield toy_metric
    metrics.unregister(toy_metric.NAME)
    assert metrics.names() == BUILT_IN


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_metric_inputs")
    return {"corpus": speech_corpus, "index": build_index_for(speech_corpus, root / "index"),
            # weights scaled so that the scores react to the sentence (harvest_support.tiny_context_bundle)
            "bundle": tiny_context_bundle(speech_corpus, root / "ctx", weight_scale=10.0)}


def _tables(run: Path) -> dict:
    return {t: ds.dataset(str(run / t)).to_table().to_pandas() for t in ("pairs", "sentences", "context_scores")}


def _toy_by_hand(toy, tables: dict, column: str = "S") -> dict:
    """pair_id -> the toy metric over C_s1 + C_s2 of `column`, entries finite in both vectors."""
    cs = tables["context_scores"].set_index(["sentence_id", "context_id"])[column].astype(np.float64)
    own = dict(zip(tables["sentences"].sentence_id, tables["sentences"].context_ids))
    out = {}
    for p in tables["pairs"].itertuples():
        keys = list(own[p.s1_id]) + list(own[p.s2_id])
        v1 = np.array([cs[(p.s1_id, k)] for k in keys])
        v2 = np.array([cs[(p.s2_id, k)] for k in keys])
        ok = np.isfinite(v1) & np.isfinite(v2)
        out[p.pair_id] = toy.toy_l1(v1[ok], v2[ok]) if ok.sum() >= 2 else np.nan
    return out


@pytest.mark.slow
def test_a_toy_metric_in_one_file_is_used_by_the_harvest_and_remix_commands(toy, inputs, tmp_path, capsys):
    from sentsim.cli import main

    run = tmp_path / "toy"
    rc = main(["harvest", "--corpus", str(inputs["corpus"]), "--index", str(inputs["index"]), "--context-models",
               str(inputs["bundle"]), "--out", str(run), "--executor", "inline", "--set", f"metric={toy.NAME}",
               "--set", "anchors.n=4", "--set", "anchors.per_unit=2", "--set", "rank.enabled=false",
               "--set", "contexts.size=4", "--set", "contexts.retrieve_chunks=20"])
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["complete"] and manifest["config"]["metric"] == toy.NAME
    got = _tables(run)
    pairs = got["pairs"].set_index("pair_id")
    assert pairs.score.notna().sum() >= 4
    assert (pairs.score.dropna() <= 0).all()  # minus a mean distance, where a correlation would be near 1
    # the harvest computed from float64 S; the table keeps S in float32 (issue 16)
    want = _toy_by_hand(toy, got)
    np.testing.assert_allclose(pairs.score, [want[i] for i in pairs.index], rtol=1e-5, atol=1e-5)
    want_fwd = _toy_by_hand(toy, got, "fwd")
    np.testing.assert_allclose(pairs.sim_fwd, [want_fwd[i] for i in pairs.index], rtol=1e-5, atol=1e-5)

    # remix under new λ, the metric the source's (the toy): exact to the stored float32 terms
    mixed = tmp_path / "mixed"
    assert main(["remix", str(run), "--out", str(mixed), "--lambda-left", "0.5"]) == 0
    assert f"metric {toy.NAME}" in capsys.readouterr().out
    re_t = _tables(mixed)
    terms = got["context_scores"]
    expect_S = (terms.fwd.astype(np.float64) + 0.5 * terms.left.astype(np.float64)) + terms.right.astype(np.float64)
    np.testing.assert_allclose(re_t["context_scores"].S, expect_S.astype(np.float32))
    want = _toy_by_hand(toy, dict(got, context_scores=terms.assign(S=expect_S)))
    re_pairs = re_t["pairs"].set_index("pair_id")
    np.testing.assert_allclose(re_pairs.score, [want[i] for i in re_pairs.index], rtol=1e-12, atol=1e-12)
    assert not np.allclose(re_pairs.score, pairs.score.loc[re_pairs.index])  # λ_left changed every score

    # the `sentsim` command in a process of its own, where the toy is not registered: the toy harvest
    # remixes to a built-in metric, and without --metric is refused in one line
    from conftest import sentsim_cli

    r = sentsim_cli("remix", run, "--out", tmp_path / "unknown")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert f"its Eq. 4 metric '{toy.NAME}' is not one this sentsim has" in r.stderr, r.stderr
    r = sentsim_cli("remix", run, "--out", tmp_path / "pearson", "--metric", "pearson")
    assert r.returncode == 0, r.stderr
    back = _tables(tmp_path / "pearson")["pairs"]
    assert back.score.dropna().between(-1, 1).all() and (back.score.dropna() > 0).any()
