"""Property-based bad input: random bytes, random JSON and random TSV/CSV lines fed to every reader
of user files. Each case either parses, or fails with exit 2 and ONE line naming the file (a
UsageError, never another exception); and nothing is marked complete after a failure.

The number of cases is printed at the end of the module (pytest -s) and asserted to be > 0.
"""

from __future__ import annotations

import json
import string

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sentsim.errors import UsageError

CASES = {}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

text_cell = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n\r"), max_size=20)
tsv_lines = st.lists(st.lists(text_cell, min_size=0, max_size=9).map("\t".join), max_size=8).map("\n".join)
csv_lines = st.lists(st.lists(st.text(alphabet=string.printable, max_size=12), max_size=5).map(",".join),
                     max_size=6).map("\n".join)
json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.sampled_from(["s1", "s2", "gold", "x"]), c, max_size=4),
                           max_leaves=8)
# what json.loads cannot read (RecursionError, ValueError) or reads into a string no UTF-8 text holds
unreadable_json = st.one_of(
    st.integers(5_000, 100_000).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(["s1", "s2", "gold", "id"]).flatmap(
        lambda k: st.integers(4_301, 6_000).map(lambda n: '{"%s": %s}' % (k, "7" * n))),
    st.tuples(st.sampled_from(["s1", "s2", "paragraphs", "id", "score"]), st.integers(0xD800, 0xDFFF)).map(
        lambda kv: '{"s1": "a", "s2": "b", "paragraphs": ["Fine."], "%s": %s}' % (
            kv[0], ('["x \\u%04x"]' if kv[0] == "paragraphs" else '"x \\u%04x"') % kv[1])),
)
jsonl_lines = st.lists(st.one_of(json_values.map(json.dumps), unreadable_json), max_size=5).map("\n".join)


def count(name: str) -> None:
    CASES[name] = CASES.get(name, 0) + 1


def one_line_or_ok(fn, path, name):
    """Parse `path`; a failure must be a UsageError whose message is one line naming the file."""
    count(name)
    try:
        return fn(str(path))
    except UsageError as exc:
        msg = str(exc)
        assert "\n" not in msg and path.name in msg, msg
        return None


@pytest.fixture(scope="module", autouse=True)
def report_cases():
    yield
    print(f"\nproperty cases run: {CASES}")
    assert sum(CASES.values()) > 0


@SETTINGS
@given(data=st.binary(max_size=400), ext=st.sampled_from([".tsv", ".csv", ".jsonl", ".parquet", ".txt"]))
def test_pairs_file_random_bytes(tmp_path_factory, data, ext):
    from sentsim.pairs_file import read_pairs_file

    p = tmp_path_factory.mktemp("b") / f"pairs{ext}"
    p.write_bytes(data)
    rows = one_line_or_ok(read_pairs_file, p, "pairs: bytes")
    if rows is not None:
        assert rows and all(isinstance(a, str) and isinstance(b, str) for a, b, _ in rows)


@SETTINGS
@given(text=st.one_of(tsv_lines, csv_lines), ext=st.sampled_from([".tsv", ".csv"]))
def test_pairs_file_random_delimited_lines(tmp_path_factory, text, ext):
    from sentsim.pairs_file import read_pairs_file

    p = tmp_path_factory.mktemp("d") / f"pairs{ext}"
    p.write_text(text, encoding="utf-8")
    rows = one_line_or_ok(read_pairs_file, p, "pairs: tsv/csv")
    if rows is not None:
        assert all(g is None or isinstance(g, float) for _, _, g in rows)
        assert not any(a.lower() in ("s1", "sentence1") and b.lower() in ("s2", "sentence2") for a, b, _ in rows), \
            "a header line was read as a pair"


@SETTINGS
@given(text=jsonl_lines)
def test_pairs_file_random_json(tmp_path_factory, text):
    from sentsim.pairs_file import read_pairs_file

    p = tmp_path_factory.mktemp("j") / "pairs.jsonl"
    p.write_text(text, encoding="utf-8")
    one_line_or_ok(read_pairs_file, p, "pairs: json")


@SETTINGS
@given(data=st.one_of(st.binary(max_size=300), tsv_lines.map(str.encode)),
       layout=st.sampled_from(["stsb", "sick", "year"]))
def test_sts_readers(tmp_path_factory, data, layout):
    from sentsim.evaluation.datasets import load_task

    root = tmp_path_factory.mktemp("sts")
    if layout == "stsb":
        (root / "stsbenchmark").mkdir()
        target, task = root / "stsbenchmark" / "sts-test.csv", "STSb"
    elif layout == "sick":
        (root / "SICK").mkdir()
        target, task = root / "SICK" / "SICK_trial.txt", "SICK-R"
    else:
        (root / "STS2012-en-test").mkdir()
        target, task = root / "STS2012-en-test" / "STS.input.x.txt", "STS12"
        (root / "STS2012-en-test" / "STS.gs.x.txt").write_bytes(data.replace(b"\t", b" "))
    target.write_bytes(data)
    count(f"sts: {layout}")
    try:
        t = load_task(root, task)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert t.n_pairs > 0 or layout == "year"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=300), jsonl_lines.map(str.encode)),
       ext=st.sampled_from([".jsonl", ".txt", ".parquet"]), skip=st.booleans())
def test_corpus_build_random_input(tmp_path_factory, data, ext, skip):
    """Random bytes or JSON lines as a corpus input: a corpus, or exit 2 with one line; and never a
    `_COMPLETE` run after a failure."""
    corpus_or_one_line(tmp_path_factory.mktemp("corpus"), f"docs{ext}", data, skip, "corpus build")


def corpus_or_one_line(tmp, name: str, data: bytes, skip: bool, case: str) -> None:
    """`data` as the corpus input `name`: a complete corpus, or one line naming the input (or saying
    that it holds nothing) and no `_COMPLETE`."""
    from sentsim.corpus_job import build_corpus

    src = tmp / name
    src.write_bytes(data)
    out = tmp / "out"
    count(case)
    try:
        m = build_corpus([str(src)], str(out), overrides=["on_error=skip"] if skip else [], executor="inline",
                         quiet=True)
    except UsageError as exc:
        assert "\n" not in str(exc) and (name in str(exc) or "nothing to process" in str(exc)), str(exc)
        assert not (out / "_COMPLETE").exists()
        return
    assert m["complete"] and m["counts"]["documents"] > 0 and (out / "_COMPLETE").exists()


# ---- Parquet inputs: wrong types, NaN and infinity, no rows, truncated files

_floats = st.floats(allow_nan=True, allow_infinity=True)
# the values of a column of each Arrow type (None: a null); _arrow_type names the type
_COLUMN_KINDS = {
    "string": st.one_of(st.none(), st.text(max_size=30)),
    "int": st.one_of(st.none(), st.integers(-10, 10)),
    "float": st.one_of(st.none(), _floats),
    "bool": st.one_of(st.none(), st.booleans()),
    "binary": st.one_of(st.none(), st.binary(max_size=12)),
    "list<string>": st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=3)),
    "list<float>": st.one_of(st.none(), st.lists(_floats, max_size=3)),
    "null": st.none(),
}


def _arrow_type(kind):
    import pyarrow as pa

    return {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
            "binary": pa.binary(), "list<string>": pa.list_(pa.string()), "list<float>": pa.list_(pa.float64()),
            "null": pa.null()}[kind]


@st.composite
def parquet_tables(draw, names, usual):
    """A Parquet file's bytes: some of `names` as columns of random types and values (0-5 rows), and
    sometimes only the first part of those bytes (a truncated file) or none at all. `usual`: a column's
    expected type, drawn three times in four (and then half the time without nulls), so that files good
    enough to reach the checks of types and values behind the first ones are common."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    n = draw(st.integers(0, 5))
    cols = {}
    mostly = st.sampled_from([True, True, True, False])  # (hypothesis leans to the first choice)
    for name in names:
        if not draw(mostly):  # a quarter of the time the file lacks the column
            continue
        kind = usual[name] if name in usual and draw(mostly) else draw(st.sampled_from(sorted(_COLUMN_KINDS)))
        strategy = _COLUMN_KINDS[kind]
        if kind == usual.get(name) and draw(st.sampled_from([True, False])):
            strategy = strategy.filter(lambda v: v is not None)
        values = draw(st.lists(strategy, min_size=n, max_size=n))
        cols[name] = pa.array(values, _arrow_type(kind))
    buf = io.BytesIO()
    pq.write_table(pa.table(cols) if cols else pa.table({"_": pa.array([], pa.int8())}), buf)
    data = buf.getvalue()
    cut = draw(st.sampled_from(["whole", "whole", "whole", "truncated", "empty"]))
    if cut == "truncated":
        data = data[:draw(st.integers(1, max(1, len(data) - 1)))]
    elif cut == "empty":
        data = b""
    return data


@SETTINGS
@given(data=parquet_tables(["s1", "s2", "gold", "x"], {"s1": "string", "s2": "string", "gold": "float"}))
def test_pairs_file_random_parquet(tmp_path_factory, data):
    """Any Parquet file as a pairs file: pairs of two strings and a finite gold (or none), or one line."""
    import math

    from sentsim.pairs_file import read_pairs_file

    p = tmp_path_factory.mktemp("pq") / "pairs.parquet"
    p.write_bytes(data)
    rows = one_line_or_ok(read_pairs_file, p, "pairs: parquet")
    if rows is not None:
        assert rows and all(isinstance(a, str) and isinstance(b, str) for a, b, _ in rows)
        assert all(g is None or (isinstance(g, float) and math.isfinite(g)) for _, _, g in rows)


def _parquet_bytes(**cols) -> bytes:
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    return buf.getvalue()


@SETTINGS
@given(data=parquet_tables(["s1", "s2", "score", "x"], {"s1": "string", "s2": "string", "score": "float"}))
# the file hypothesis once found: s1 of bytes that are not UTF-8 (pandas' astype(str) decoded them)
@example(data=_parquet_bytes(s1=pa.array([b"\x80"]), s2=["a"], score=[0.5]))
@example(data=_parquet_bytes(s1=pa.array([b"\x80"]).view(pa.string()), s2=["a"], score=[0.5]))
def test_scores_file_random_parquet(tmp_path_factory, data):
    """Any Parquet file as `eval sts --scores`: finite scores for some pairs, or one line."""
    import numpy as np

    from sentsim.evaluation import PairFileScorer

    p = tmp_path_factory.mktemp("sc") / "scores.parquet"
    p.write_bytes(data)
    scorer = one_line_or_ok(PairFileScorer, p, "scores: parquet")
    if scorer is not None:
        assert scorer.table and all(np.isfinite(v) for v in scorer.table.values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=parquet_tables(["text", "id", "x"], {"text": "string", "id": "int"}), skip=st.booleans())
def test_corpus_build_random_parquet(tmp_path_factory, data, skip):
    """Any Parquet file as a corpus input: a corpus, or exit 2 with one line and never `_COMPLETE`."""
    corpus_or_one_line(tmp_path_factory.mktemp("pqcorpus"), "docs.parquet", data, skip, "corpus build: parquet")


# ---- YAML configs: keys named twice (at the top or nested), booleans where numbers go

_yaml_scalars = st.one_of(st.booleans().map(str).map(str.lower), st.integers(-3, 50).map(str),
                          st.sampled_from(["skip", "fail", "null", "1.5", "'x'", "7" * 5001]))


@st.composite
def corpus_yaml(draw):
    """(a corpus config's YAML text, whether it names a key twice in one mapping)."""
    top = draw(st.lists(st.sampled_from(["on_error", "docs_per_unit", "unit_bytes", "max_sentence_tokens", "chunk"]),
                        min_size=1, max_size=5))
    lines, twice = [], len(set(top)) < len(top)
    for key in top:
        if key == "chunk":
            inner = draw(st.lists(st.sampled_from(["size", "stride"]), min_size=1, max_size=3))
            twice = twice or len(set(inner)) < len(inner)
            lines.append("chunk:")
            lines += [f"  {k}: {draw(_yaml_scalars)}" for k in inner]
        else:
            lines.append(f"{key}: {draw(_yaml_scalars)}")
    return "\n".join(lines) + "\n", twice


@SETTINGS
@given(drawn=corpus_yaml())
def test_config_random_yaml(tmp_path_factory, drawn):
    """A config file: read as written, or one line naming the file; a key named twice or a boolean for a
    number is never read (YAML's silent last-wins, pydantic's true as 1)."""
    import yaml

    from corpus.config import CorpusConfig
    from sentsim.config import load_config

    text, twice = drawn
    p = tmp_path_factory.mktemp("yaml") / "c.yaml"
    p.write_text(text)
    count("config: yaml")
    try:
        cfg = load_config(CorpusConfig, str(p))
    except UsageError as exc:
        assert "\n" not in str(exc) and ("c.yaml" in str(exc) or str(exc).startswith("invalid config"))
        return  # (a file with two faults is refused for the first one YAML builds)
    assert not twice, text
    plain = yaml.safe_load(text)  # what the file says, key by key
    for key, value in plain.items():
        if isinstance(value, dict):
            for k, v in value.items():
                assert not isinstance(v, bool) and getattr(cfg.chunk, k) == v
        elif key != "on_error":
            assert not isinstance(value, bool) and getattr(cfg, key) == value
