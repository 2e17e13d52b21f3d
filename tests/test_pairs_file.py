"""The one reader of sentence-pair files: every format, headers, and a one-line error for bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sentsim.errors import InputError, UsageError
from sentsim.pairs_file import read_pairs_file


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(p)


def test_stsb_lines_keep_quotes_and_extra_columns(tmp_path, shared_data):
    pairs = read_pairs_file(str(shared_data / "sts" / "stsbenchmark" / "sts-test.csv"))
    assert len(pairs) == 1379
    assert all(isinstance(g, float) and 0 <= g <= 5 for _, _, g in pairs)
    assert pairs[0] == ("A girl is styling her hair.", "A girl is brushing her hair.", 2.5)
    line = 'main-news\tf\t2012\t0001\t4.2\tHe said "yes, sir".\tShe said "no".\tsrc1\tsrc2\n'
    assert read_pairs_file(write(tmp_path, "a.csv", line)) == [('He said "yes, sir".', 'She said "no".', 4.2)]


def test_header_lines_name_the_columns(tmp_path):
    # a header is never scored as a pair, and gold is found by its name wherever it stands
    tsv = "s1\ts2\nA cat sat.\tA dog sat.\n"
    assert read_pairs_file(write(tmp_path, "p.tsv", tsv)) == [("A cat sat.", "A dog sat.", None)]
    tsv = "score\tsentence1\tsentence2\n3.5\tA cat sat.\tA dog sat.\n"
    assert read_pairs_file(write(tmp_path, "q.tsv", tsv)) == [("A cat sat.", "A dog sat.", 3.5)]
    csv = 'sentence_A,sentence_B,relatedness_score\n"Yes, a cat sat.","A dog, sat.",4\nx,y,\n'
    assert read_pairs_file(write(tmp_path, "r.csv", csv)) == [("Yes, a cat sat.", "A dog, sat.", 4.0), ("x", "y", None)]
    assert read_pairs_file(write(tmp_path, "s.csv", "one,two\n")) == [("one", "two", None)]
    assert read_pairs_file(write(tmp_path, "t.tsv", "a\tb\t1.5\n")) == [("a", "b", 1.5)]


def test_jsonl_and_parquet(tmp_path):
    rows = [{"s1": "a", "s2": "b", "gold": 2}, {"s1": "c", "s2": "d"}]
    assert read_pairs_file(write(tmp_path, "p.jsonl", "\n".join(map(json.dumps, rows)))) == [
        ("a", "b", 2.0), ("c", "d", None)]
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"s1": ["a"], "s2": ["b"], "gold": [1.0]}), p)
    assert read_pairs_file(str(p)) == [("a", "b", 1.0)]


@pytest.mark.parametrize("name,data,message", [
    ("h.tsv", "s1\ts2\n", "no pairs"),
    ("e.tsv", "", "no pairs"),
    ("l.tsv", "fine\tpair\ncaf\xe9\tbad\n".encode("latin-1"), r"l.tsv:2: not UTF-8"),
    ("c.parquet", b"PAR1 this is not parquet", "not a readable Parquet file"),
    ("x.tsv", "only one column\n", r"x.tsv:1: expected s1 and s2"),
    ("g.tsv", "s1\ts2\tgold\na\tb\thigh\n", r"g.tsv:2: score 'high' is not a number"),
    ("j.jsonl", '{"s1": "a"}\n', r"j.jsonl:1: expected a JSON object"),
    ("q.csv", 'a,"b\n', "not valid CSV|expected s1 and s2"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, name, data, message):
    path = write(tmp_path, name, data)
    with pytest.raises(InputError, match=message) as err:
        read_pairs_file(path)
    assert "\n" not in str(err.value) and name in str(err.value)


def test_empty_parquet_and_missing_file(tmp_path):
    p = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"s1": pa.array([], pa.string()), "s2": pa.array([], pa.string())}), p)
    with pytest.raises(InputError, match="no pairs"):
        read_pairs_file(str(p))
    with pytest.raises(UsageError, match="not found"):
        read_pairs_file(str(tmp_path / "nope.tsv"))
