"""The harvest plan is O(units): each unit carries its own anchors only, pair ownership is one sorted
array per actor, and units are built from their number inside the pipeline (streamed to Ray)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from run_support import toy_job


def _corpus(n):
    return SimpleNamespace(ids=np.arange(n, dtype=np.int64) * 3 + 7, n_tokens=np.full(n, 10))


def _cfg(n, per_unit=16, seed=0):
    from sentsim.harvest.config import HarvestConfig

    return HarvestConfig.model_validate(dict(corpus="c", out="o", context_models=["m"], seed=seed,
                                             contexts={"mode": "random"}, anchors={"n": n, "per_unit": per_unit}))


def test_units_carry_their_own_anchors_and_stay_small():
    from sentsim.harvest.job import plan

    sizes = {}
    for n in (1_000, 100_000):
        units, info = plan(_cfg(n), _corpus(2 * n))
        assert info == {"anchors": n} and len(units) == -(-n // 16)
        first = units[0]
        assert set(first) == {"unit", "anchors", "pairs"} and len(first["anchors"]) == 16
        sizes[n] = len(pickle.dumps(units[len(units) // 2], protocol=5))
        # the concatenated units are the sorted anchor sample of the old plan (same seed, same draw)
        rng = np.random.default_rng(0)
        ok = _corpus(2 * n).ids
        expect = np.sort(rng.choice(ok, size=n, replace=False)).tolist()
        assert [a for u in units for a in u["anchors"]] == expect
    # flat per unit: 16 ids of at most 9 pickled bytes each, plus the dict (the old plan: + all ids)
    assert max(sizes.values()) <= 16 * 9 + 64


def test_owned_pairs_by_binary_search_equals_the_set_rule():
    from sentsim.harvest.pairs import is_anchor, owned_pairs

    rng = np.random.default_rng(1)
    anchors = np.unique(rng.integers(0, 5_000, 800))
    as_set = set(anchors.tolist())
    for a in rng.choice(anchors, 50):
        partners = [(int(p), "random") for p in rng.integers(0, 5_000, 12)]
        expect = [(p, k) for p, k in partners if not (p in as_set and p < a)]
        assert owned_pairs(int(a), partners, anchors) == expect == owned_pairs(int(a), partners, as_set)
    assert is_anchor(anchors, [anchors[0], anchors[-1], 5_001, -1]).tolist() == [True, True, False, False]
    assert is_anchor(np.zeros(0, np.int64), [1, 2]).tolist() == [False, False]


def test_a_unit_plan_resumes_by_number(tmp_path, capsys):
    from sentsim.executor import execute
    from sentsim.pipeline import UnitPlan

    made = []

    class Make:
        def __call__(self, u):
            made.append(u)
            return {"unit": u, "x": u * u}

    plan = UnitPlan(6, Make())
    m = execute(toy_job(tmp_path / "r", plan), executor="inline", max_units=2)
    assert (m["completed_units"], m["planned_units"], m["complete"]) == (2, 6, False) and made == [0, 1]
    made.clear()
    m = execute(toy_job(tmp_path / "r", plan), executor="inline")
    assert m["complete"] and m["this_run"]["units"] == 4 and made == [2, 3, 4, 5]  # done units never built
    assert "2 already complete, 4 to do" in capsys.readouterr().err


class _Square:
    def __call__(self, u):
        return {"unit": u, "x": u * u}


def test_a_unit_plan_streams_through_ray(ray_local, tmp_path):
    import sys

    import ray.cloudpickle as cp

    from sentsim.executor import execute
    from sentsim.pipeline import UnitPlan
    from storage import RunReader

    for name in (__name__, "run_support"):  # Ray's workers cannot import test modules
        cp.register_pickle_by_value(sys.modules[name])
    plan = UnitPlan(9, _Square())
    (tmp_path / "r").mkdir()
    m = execute(toy_job(tmp_path / "r", plan.subset([0, 1, 2])), executor="ray", quiet=True)
    assert m["completed_units"] == 3
    m = execute(toy_job(tmp_path / "r", plan), executor="ray", quiet=True)
    assert m["complete"] and m["this_run"]["units"] == 6
    t = RunReader(str(tmp_path / "r")).read_table("t").sort_by("unit")
    assert t.column("x").to_pylist() == [u * u for u in range(9)]


@pytest.mark.slow
def test_harvest_plan_matches_the_unit_it_runs(speech_corpus):
    """On the real sample corpus: the sorted anchors the ContextStage gets are the units' anchors."""
    from corpus.view import CorpusIndex
    from sentsim.harvest.job import AnchorUnits, plan

    cfg = _cfg(50, per_unit=7).model_copy(update={"corpus": str(speech_corpus)})
    units, _ = plan(cfg, CorpusIndex(str(speech_corpus)))
    assert isinstance(units.make, AnchorUnits) and len(units) == 8
    flat = [a for u in units for a in u["anchors"]]
    assert flat == units.make.anchors.tolist() and flat == sorted(flat) and len(units[7]["anchors"]) == 1


# ---- the pool harvest's pair plan: numpy columns, sliced per unit ---------------------------------


def _planned_pairs(n, seed=0, gold=False):
    from sentsim.harvest.work import Pair

    rng = np.random.default_rng(seed)
    kinds = ["neighbour", "same-doc", "random", "cluster"]
    a, b, k = rng.integers(0, 1 << 62, n), rng.integers(0, 1 << 62, n), rng.integers(0, 4, n)
    g = [None if x < 0.3 else round(float(x) * 5, 3) for x in rng.random(n)] if gold else [None] * n
    r = rng.integers(0, 3, n) if gold else np.zeros(n, np.int64)
    return [Pair(int(x), int(y), kinds[int(z)], v, int(w)) for x, y, z, v, w in zip(a, b, k, g, r)]


def _old_plan_table(pairs):
    """The pool_pairs side table as the Pair-list plan wrote it."""
    import pyarrow as pa

    from sentsim.harvest.pool import PAIRS_SCHEMA

    return pa.table({"s1_id": [x.s1_id for x in pairs], "s2_id": [x.s2_id for x in pairs],
                     "kind": [x.kind for x in pairs], "gold": [x.gold for x in pairs],
                     "repeat": [x.repeat for x in pairs]}, schema=PAIRS_SCHEMA)


@pytest.mark.parametrize("gold", [False, True])
def test_pool_units_slice_the_planned_pairs_as_the_pair_list_did(gold):
    """The columns give each unit exactly the Pairs the list plan gave it (ids, kind, gold or None, repeat, as
    Python values), write the same side table, and read a stored one (an old run's) back to the same Pairs."""
    import pyarrow as pa

    from sentsim.harvest.pool import PairColumns, PoolPairUnits

    pairs = _planned_pairs(1_001, gold=gold)
    cols = PairColumns.of_pairs(pairs)
    assert (cols.gold is None) == (not gold)
    units = PoolPairUnits(cols, 64)
    got = [units(u)["pairs"] for u in range(-(-len(pairs) // 64))]
    assert got == [pairs[u * 64:(u + 1) * 64] for u in range(len(got))] and units(99)["pairs"] == []
    assert all(type(p.s1_id) is int and type(p.repeat) is int and (p.gold is None or type(p.gold) is float)
               for u in got for p in u)
    old = _old_plan_table(pairs)
    assert cols.table().equals(old)
    back = PairColumns.of_table(old)
    assert back.pairs() == pairs and back.table().equals(old)
    split = PairColumns.of_table(pa.concat_tables([old.slice(0, 500), old.slice(500)]))
    assert split.pairs() == pairs  # a table of several chunks (row groups) too
    assert PairColumns.of_pairs([]).pairs() == [] and len(PairColumns.of_table(old.slice(0, 0))) == 0


def test_the_pool_plan_read_tasks_get_is_numpy_buffers():
    """What pipeline._unit_dataset ray.puts for a pool harvest pickles as numpy buffers (out of band, which Ray
    maps zero-copy into each read task) and a few hundred bytes in band, whatever the number of pairs: not a
    Python object a pair (1.39M pairs once cost each read task 2.5 s and ~600 MiB to unpickle)."""
    import pickle

    from sentsim.harvest.pool import PairColumns, PoolPairUnits

    inband, outband = {}, {}
    for n in (1_000, 100_000):
        buffers = []
        make = PoolPairUnits(PairColumns.of_pairs(_planned_pairs(n, gold=True)), 64)
        inband[n] = len(pickle.dumps(make, protocol=5, buffer_callback=buffers.append))
        outband[n] = sum(b.raw().nbytes for b in buffers)
        again = pickle.loads(pickle.dumps(make, protocol=5))
        assert again(3) == make(3)
    assert max(inband.values()) < 1024  # the kinds, the dataclass, the arrays' shapes: not the pairs
    assert outband[100_000] == 100 * outband[1_000] <= 30 * 100_000  # s1, s2, gold: 8 B; repeat 4; kind 1


def test_the_vectors_run_ships_its_texts_packed():
    """SentenceUnits hands each unit its ids and texts as before (any str: accents, an emoji, a lone surrogate,
    an empty one), from numpy buffers rather than a list of str that each read task unpickles whole."""
    import pickle

    from sentsim.harvest.pool_vectors import SentenceUnits

    texts = ["Plain.", "Café au lait — “quoted”.", "", "🙂 emoji", "lone \ud800 surrogate",
             *[f"s{i}" for i in range(95)]]
    ids = np.arange(len(texts), dtype=np.int64) * 5
    units = SentenceUnits(ids, texts, 8)
    n = -(-len(texts) // 8)
    assert [units(u) for u in range(n)] == [{"unit": u, "ids": ids[u * 8:(u + 1) * 8].tolist(),
                                             "texts": texts[u * 8:(u + 1) * 8]} for u in range(n)]
    buffers = []
    inband = pickle.dumps(units, protocol=5, buffer_callback=buffers.append)
    assert len(inband) < 1024 and sum(b.raw().nbytes for b in buffers) >= sum(len(t) for t in texts)
    assert pickle.loads(pickle.dumps(units, protocol=5))(0) == units(0)
    assert SentenceUnits(ids[:0], [], 8)(0) == {"unit": 0, "ids": [], "texts": []}


# ---- context_scores: float32, or none at all (issue 16) ------------------------------------------

from test_harvest import _scores, inline_run, inputs, pairs_of  # noqa: E402,F401  (module fixtures)


def test_keep_context_scores_default_leaves_the_fingerprint_alone():
    cfg = _cfg(10)
    assert "keep_context_scores" not in cfg.semantic()
    assert cfg.model_copy(update={"keep_context_scores": "none"}).semantic()["keep_context_scores"] == "none"


def test_how_scoring_runs_leaves_the_fingerprint_alone():
    """scoring.compile, device, threads and batch size change how fast, not what: a harvest resumes with any."""
    cfg = _cfg(10)
    fast = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update={
        "compile": True, "device": "cuda", "torch_threads": 3, "batch_tokens": 65536})})
    assert fast.semantic() == cfg.semantic()
    assert fast.model_copy(update={"scoring": fast.scoring.model_copy(update={"lambda_fwd": 0.5})}).semantic() \
        != cfg.semantic()


@pytest.mark.slow
def test_context_scores_are_float32_and_remix_is_exact_to_them(inline_run, tmp_path):  # noqa: F811
    """The remix recomputes every score from the stored float32 terms: exactly (1e-12) what numpy gives
    from those stored values, and the stored S is the float32 of the harvest's S."""
    import pyarrow as pa

    from sentsim.context.scorer import TERMS
    from sentsim.harvest.remix import RemixConfig, remix, resolve
    from storage import RunReader

    cfg, out = inline_run
    src = RunReader(str(out))
    cs = src.read_table("context_scores")
    assert all(cs.schema.field(t).type == pa.float32() for t in (*TERMS, "S"))
    lam, _ = resolve(RemixConfig(source=str(out), out="x"), src.manifest)
    terms = {t: cs.column(t).to_numpy(zero_copy_only=False).astype(np.float64) for t in TERMS}
    S = np.nansum([lam[t] * terms[t] for t in TERMS], axis=0)
    stored = cs.column("S").to_numpy(zero_copy_only=False)
    left_out = np.isnan(stored)  # in a partner's context whose window holds the sentence: every term null
    assert all(np.isnan(terms[t][left_out]).all() for t in TERMS)
    assert np.allclose(stored[~left_out], S[~left_out], rtol=2 ** -22, atol=0)  # float32 rounding only
    S[left_out] = np.nan  # dropped pairwise by Eq. 4
    row = {k: i for i, k in enumerate(zip(cs.column("sentence_id").to_pylist(), cs.column("context_id").to_pylist()))}
    sents = src.read_table("sentences")
    own = dict(zip(sents.column("sentence_id").to_pylist(), sents.column("context_ids").to_pylist()))
    remix(RemixConfig(source=str(out), out=str(tmp_path / "re")), quiet=True)
    got = _scores(tmp_path / "re").dropna()
    pairs = pairs_of(out).to_pandas().set_index("pair_id")
    for pid, score in got.items():
        a, b = pairs.loc[pid, "s1_id"], pairs.loc[pid, "s2_id"]
        keys = own[a] + own[b]
        v1, v2 = S[[row[(a, k)] for k in keys]], S[[row[(b, k)] for k in keys]]
        ok = np.isfinite(v1) & np.isfinite(v2)
        assert score == pytest.approx(np.corrcoef(v1[ok], v2[ok])[0, 1], abs=1e-12)
    off = (got - _scores(out).reindex(got.index)).abs().max()
    assert off < 1e-5  # against the harvest's float64 scores: float32 rounding of the terms only


@pytest.mark.slow
def test_a_harvest_can_keep_no_context_scores(inputs, tmp_path):  # noqa: F811
    from conftest import sentsim_cli
    from harvest_support import harvest_config

    from sentsim.harvest.job import harvest

    runs = {}
    for keep in ("all", "none"):
        cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / keep,
                             anchors={"n": 4, "per_unit": 2}, rank={"enabled": False}, keep_context_scores=keep)
        runs[keep] = harvest(cfg, executor="inline", quiet=True)
    m = runs["none"]
    assert m["complete"] and "context_scores" not in m["tables"] and not (tmp_path / "none" / "context_scores").exists()
    assert m["fingerprint"] != runs["all"]["fingerprint"]
    assert pairs_of(tmp_path / "none").equals(pairs_of(tmp_path / "all"))  # the same pairs and scores
    r = sentsim_cli("remix", tmp_path / "none", "--out", tmp_path / "re")
    assert r.returncode == 2 and "kept no context scores" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def as_written_with_float64_context_scores(src, dst):
    """A copy of a harvest as the code before float32 context scores wrote it (every checksum valid)."""
    import hashlib
    import io
    import json
    import shutil

    import pyarrow.parquet as pq

    from sentsim.harvest.stages import LEGACY_CONTEXT_SCORE_SCHEMA
    from storage.store import schema_signature

    shutil.copytree(src, dst)
    for marker in sorted((dst / "_units").glob("*.json")):
        rec = json.loads(marker.read_text())
        f = rec["files"]["context_scores"]
        buf = io.BytesIO()
        pq.write_table(pq.read_table(dst / f["path"]).cast(LEGACY_CONTEXT_SCORE_SCHEMA), buf, compression="zstd")
        (dst / f["path"]).write_bytes(buf.getvalue())
        f.update(bytes=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
        rec.pop("check", None)  # that code wrote markers without their own checksum
        marker.write_text(json.dumps(rec))
    m = json.loads((dst / "manifest.json").read_text())
    m["tables"]["context_scores"] = schema_signature(LEGACY_CONTEXT_SCORE_SCHEMA)
    m["format_version"] = 1  # the format of every run before format versions were read
    m.pop("check")  # nor had manifests a checksum of their own
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


@pytest.mark.slow
def test_resuming_a_float64_harvest_keeps_its_schema(inline_run, tmp_path):  # noqa: F811
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix
    from storage import verify_store

    cfg, out = inline_run
    old = as_written_with_float64_context_scores(out, tmp_path / "old")
    (old / "_units" / "00001.json").unlink()
    (old / "_COMPLETE").unlink()
    m = harvest(cfg.model_copy(update={"out": str(old)}), executor="inline", quiet=True)
    assert m["complete"] and m["this_run"]["units"] == 1 and verify_store(str(old)) == []
    for f in sorted((old / "context_scores").glob("*.parquet")):
        assert pq.read_schema(f).field("S").type == pa.float64(), f
    assert pairs_of(old).equals(pairs_of(out))
    r = remix(RemixConfig(source=str(old), out=str(tmp_path / "re")), quiet=True)
    assert r["complete"] and pq.read_schema(next((tmp_path / "re" / "context_scores").glob("*"))).field(
        "S").type == pa.float64()
