"""report.py reads the pairs as numpy columns (strings as codes), not a Python object per pair: the values it
computes from them are those of the old per-row reading, copied here as the reference; its scatter draws a
fixed-seed sample above SCATTER_MAX pairs and says so in its title; a rank target's bytes come with its storage,
as bytes_per_sentence_rank_targets and, for its readers, under the old bytes_per_sentence_rank_codes."""

import numpy as np
import pyarrow as pa

from sentsim.harvest import report
from sentsim.harvest.report import Labels, _floats, rank_target_bytes, scatter_points


def _table():
    rng = np.random.default_rng(3)
    chunks = []
    for n in (0, 700, 1, 1300):  # several chunks, one empty, as pa.concat_tables leaves them
        score = rng.normal(size=n)
        score[rng.random(n) < 0.1] = np.nan
        nulls = rng.random(n) < 0.1
        reasons = rng.choice(["no contexts for either sentence: a; b", "no contexts for either sentence: c",
                              "score vectors degenerate", "fewer than 3", ""], size=n).tolist()
        chunks.append(pa.table({
            "score": pa.array(score, mask=nulls),
            "rank_sim": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.2),
            "split": pa.array(rng.choice(["train", "dev", "test"], size=n).tolist(), pa.string(),
                              mask=rng.random(n) < 0.05),
            "null_reason": pa.array(reasons, pa.string(), mask=rng.random(n) < 0.5),
            "kind": pa.array(rng.choice(["neighbour", "random", "cluster"], size=n).tolist(), pa.string()),
        }))
    return pa.concat_tables(chunks)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_the_columns_give_what_the_per_row_reading_gave():
    t = _table()
    assert t.column("score").num_chunks > 1
    old_score = np.array([np.nan if v is None else v for v in t.column("score").to_pylist()], dtype=float)
    old_rank = np.array([np.nan if v is None else v for v in t.column("rank_sim").to_pylist()], dtype=float)
    old_split = np.array(t.column("split").to_pylist(), dtype=object)
    old_kind = np.array(t.column("kind").to_pylist(), dtype=object)
    old_reasons = {}
    for r in t.column("null_reason").to_pylist():
        if r:
            key = r.split(":")[0]
            old_reasons[key] = old_reasons.get(key, 0) + 1

    assert _same(_floats(t.column("score")), old_score) and _same(_floats(t.column("rank_sim")), old_rank)
    split, kind, reasons = Labels(t.column("split")), Labels(t.column("kind")), Labels(t.column("null_reason"))
    for s in ("train", "dev", "test", "nowhere", None):
        assert (split.mask(s) == (old_split == s)).all()
    assert set(kind.values) == set(old_kind.tolist())
    for k in kind.values:
        assert (kind.mask(k) == (old_kind == k)).all()
    new_reasons = {}
    for r, n in zip(reasons.values, reasons.counts().tolist()):
        if r:
            new_reasons[r.split(":")[0]] = new_reasons.get(r.split(":")[0], 0) + n
    assert list(new_reasons.items()) == list(old_reasons.items())  # the same counts, in the same order
    assert all(type(n) is int for n in new_reasons.values())  # report.json writes them


def test_an_empty_table_reads_as_empty_columns():
    t = pa.table({"score": pa.array([], pa.float64()), "split": pa.array([], pa.string())})
    assert len(_floats(t.column("score"))) == 0
    split = Labels(t.column("split"))
    assert split.values == [] and not split.mask("train").any() and len(split.counts()) == 0
    everything_null = Labels(pa.chunked_array([pa.array([None, None], pa.string())]))
    assert everything_null.values == [None] and everything_null.mask(None).all()


def test_the_scatter_draws_every_pair_up_to_its_limit_then_a_fixed_sample(monkeypatch):
    monkeypatch.setattr(report, "SCATTER_MAX", 100)
    rng = np.random.default_rng(0)
    score, rank = rng.normal(size=250), rng.normal(size=250)
    score[:20] = np.nan
    few, title = scatter_points(score[:90], rank[:90])
    assert (few == np.arange(20, 90)).all() and title == "score vs rank similarity"
    sample, title = scatter_points(score, rank)
    assert title == "score vs rank similarity (100 of 230 pairs, sampled)"
    assert len(sample) == 100 and (np.diff(sample) > 0).all() and np.isfinite(score[sample]).all()
    assert (scatter_points(score, rank)[0] == sample).all()  # the same sample on a rerun


def test_the_rank_target_bytes_are_named_by_their_storage_and_kept_under_the_first_name():
    """bytes_per_sentence_rank_codes held the base vector's bytes under rank.storage=vectors: the report names the
    storage and gives the bytes as bytes_per_sentence_rank_targets, keeping the old key, same value, for its
    readers. A marker from before rank_storage gives its bytes, storage None; a run with no unit gives None."""
    def marker(**extra):
        return {"extra": extra}

    assert rank_target_bytes({0: marker(bytes_per_sentence=768, rank_storage="vectors")}) == {
        "rank_storage": "vectors", "bytes_per_sentence_rank_targets": 768, "bytes_per_sentence_rank_codes": 768}
    assert rank_target_bytes({0: marker(bytes_per_sentence=128, rank_storage="codes")}) == {
        "rank_storage": "codes", "bytes_per_sentence_rank_targets": 128, "bytes_per_sentence_rank_codes": 128}
    assert rank_target_bytes({0: marker(bytes_per_sentence=0, rank_storage=None)})["rank_storage"] is None
    assert rank_target_bytes({3: marker(bytes_per_sentence=128)}) == {
        "rank_storage": None, "bytes_per_sentence_rank_targets": 128, "bytes_per_sentence_rank_codes": 128}
    assert rank_target_bytes({}) == {"rank_storage": None, "bytes_per_sentence_rank_targets": None,
                                     "bytes_per_sentence_rank_codes": None}
