"""Property-based bad input: random bytes, random JSON and random TSV/CSV lines fed to every reader
of user files. Each case either parses, or fails with exit 2 and ONE line naming the file (a
UsageError, never another exception); and nothing is marked complete after a failure.

The number of cases is printed at the end of the module (pytest -s) and asserted to be > 0.
"""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
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
jsonl_lines = st.lists(json_values.map(json.dumps), max_size=5).map("\n".join)


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
    from sentsim.corpus_job import build_corpus

    tmp = tmp_path_factory.mktemp("corpus")
    src = tmp / f"docs{ext}"
    src.write_bytes(data)
    out = tmp / "out"
    count("corpus build")
    try:
        m = build_corpus([str(src)], str(out), overrides=["on_error=skip"] if skip else [], executor="inline",
                         quiet=True)
    except UsageError as exc:
        assert "\n" not in str(exc)
        assert not (out / "_COMPLETE").exists()
        return
    assert m["complete"] and m["counts"]["documents"] > 0 and (out / "_COMPLETE").exists()
