"""The one reader of sentence-pair files: every format, headers, and a one-line error for bad input."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sentsim.errors import InputError, UsageError
from sentsim.pairs_file import read_pairs_file


@pytest.fixture(scope="module")
def tiny_models(speech_corpus, tmp_path_factory):
    """One untrained tiny context-model bundle for this file's harvests (they test what is read, not scores)."""
    from harvest_support import tiny_context_bundle

    return tiny_context_bundle(speech_corpus, tmp_path_factory.mktemp("pairs_file_models") / "ctx")


# four contexts a sentence instead of the default's many: the scores are not what these harvests test
SMALL_HARVEST = ("--executor", "inline", "--set", "contexts.mode=random", "--set", "rank.enabled=false",
                 "--set", "contexts.size=4")


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


SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"


@pytest.mark.parametrize("name", ["SICK_train.txt", "SICK_trial.txt"])
def test_sick_files_are_read_as_eval_sts_reads_them(shared_data, tmp_path, name):
    """SICK's header-less five-column files (pair_ID, sentence_A, sentence_B, relatedness_score,
    entailment_judgment) were refused as `expected s1 and s2 ..., found 5 column(s)`, though `eval sts` reads
    them: each is read as eval's SICK loader reads it, the same pairs in the same order with the relatedness
    score as gold; the release with its header line too."""
    from sentsim.evaluation.datasets import load_sick_file

    path = shared_data / "sts" / "SICK" / name
    st = load_sick_file(path)
    want = list(zip(st.s1, st.s2, map(float, st.gold)))
    assert len(want) == {"SICK_train.txt": 4500, "SICK_trial.txt": 500}[name]
    assert read_pairs_file(str(path)) == want
    released = tmp_path / name
    released.write_text(SICK_HEADER + path.read_text(encoding="utf-8"), encoding="utf-8")
    again = load_sick_file(released)
    assert read_pairs_file(str(released)) == want == list(zip(again.s1, again.s2, map(float, again.gold)))


@pytest.mark.parametrize("line", [
    "x4\tA cat sat.\tA dog sat.\t3.6\tNEUTRAL",  # an id that is no integer
    "4\tA cat sat.\tA dog sat.\t5.5\tNEUTRAL",  # a score outside [0, 5]
    "4\tA cat sat.\tA dog sat.\thigh\tNEUTRAL",
    "4\tA cat sat.\tA dog sat.\t3.6\tUNRELATED",  # no label of SICK's
])
def test_a_five_column_line_not_of_sicks_shape_is_refused_naming_the_layout(tmp_path, line):
    good = "24\tA person rides.\tA man rides.\t3.4\tentailment\n"  # a label in any case is SICK's
    assert read_pairs_file(write(tmp_path, "ok.tsv", good)) == [("A person rides.", "A man rides.", 3.4)]
    with pytest.raises(InputError) as err:
        read_pairs_file(write(tmp_path, "s.tsv", good + line + "\n"))
    assert str(err.value) == (f"{tmp_path / 's.tsv'}:2: expected s1 and s2 separated by TAB (or a header line naming "
                              "s1 and s2, or a SICK line: pair_ID, sentence_A, sentence_B, relatedness_score in 0-5, "
                              "ENTAILMENT/NEUTRAL/CONTRADICTION), found 5 column(s)")
    with pytest.raises(InputError, match=r"e.tsv:1: s1 is empty$"):
        read_pairs_file(write(tmp_path, "e.tsv", "4\t \tA dog sat.\t3.6\tNEUTRAL\n"))


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
    # json.loads raises RecursionError and ValueError on these; the third it reads, but no text holds it
    ("d.jsonl", '{"s1": "a", "s2": "b"}\n' + "[" * 100_000 + "]" * 100_000 + "\n", r"d.jsonl:2: .*nested too deeply"),
    ("n.jsonl", '{"s1": "a", "s2": "b", "gold": ' + "9" * 5001 + "}\n", r"n.jsonl:1: malformed JSON \(.*digits"),
    ("u.jsonl", '{"s1": "a \\ud800 b", "s2": "b"}\n', r"u.jsonl:1: s1 holds a lone surrogate escape \(\\ud800"),
    ("v.jsonl", '{"s1": "a", "s2": "\\udfff"}\n', r"v.jsonl:1: s2 holds a lone surrogate"),
    ("o.jsonl", '{"s1": "a", "s2": "b", "gold": ' + "9" * 400 + "}\n", r"o.jsonl:1: score '9{30}\.\.\.' is not finite"),
    ("t.tsv.gz", gzip.compress(b"a\tb\n" * 1000, mtime=0)[:30], r"t.tsv.gz: unreadable or truncated gzip stream"),
    ("z.jsonl.gz", b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"not deflate", r"z.jsonl.gz: unreadable or truncated gzip"),
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
    (tmp_path / "pairs.tsv").mkdir()
    with pytest.raises(UsageError, match="pairs.tsv: is a folder; --pairs takes one file"):
        read_pairs_file(str(tmp_path / "pairs.tsv"))


def test_parquet_sentences_that_are_not_utf8_name_the_row(tmp_path):
    # Arrow writes a string column's bytes unchecked; reading them back must not be a UnicodeDecodeError
    p = tmp_path / "p.parquet"
    raw = pa.array([b"fine", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"s1": ["a", "c"], "s2": raw}), p)
    with pytest.raises(InputError, match=r"p.parquet: row 1: s2 is not UTF-8 text"):
        read_pairs_file(str(p))


def test_repeated_rows_are_each_their_own_pair(tmp_path):
    """STS-B's own test file repeats two pairs (one with two gold scores): each row stays a pair, in order."""
    tsv = "a\tb\t1\nc\td\t2\na\tb\t3\nb\ta\t4\n"
    assert read_pairs_file(write(tmp_path, "r.tsv", tsv)) == [("a", "b", 1.0), ("c", "d", 2.0), ("a", "b", 3.0),
                                                               ("b", "a", 4.0)]


@pytest.mark.parametrize("name, data", [
    ("h.tsv", "s1\ts2\tgold\na\tb\tnan\n"),
    ("i.tsv", "s1\ts2\tgold\na\tb\tinf\n"),
    ("m.tsv", "s1\ts2\tgold\na\tb\t-Infinity\n"),
    ("n.tsv", "a\tb\tNaN\n"),  # header-less s1, s2, gold
    ("s.csv", "main-news\tf\t2012\t0001\tnan\tA cat.\tA dog.\n"),  # an STS-B line
    ("c.csv", "sentence1,sentence2,score\na,b,inf\n"),
    ("j.jsonl", '{"s1": "a", "s2": "b", "gold": NaN}\n'),  # the json module writes and reads these tokens
    ("k.jsonl", '{"s1": "a", "s2": "b", "gold": -Infinity}\n'),
])
def test_a_non_finite_gold_is_refused_in_every_text_format(tmp_path, name, data):
    """A NaN or infinite gold score is refused, naming file and line, never stored as if it were one."""
    with pytest.raises(InputError, match=rf"{name}:\d+: score .* is not finite") as err:
        read_pairs_file(write(tmp_path, name, data))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("gold, message", [
    (pa.array([1.0, float("nan")]), r"row 1: gold nan is not finite"),
    (pa.array([float("-inf"), 1.0]), r"row 0: gold -inf is not finite"),
    (pa.array(["3.5", "4"]), r"column gold has type string"),
    (pa.array([True, False]), r"column gold has type bool"),
    (pa.array([[1.0], [2.0]]), r"column gold has type list"),
])
def test_a_parquet_gold_that_is_not_a_finite_number_is_refused(tmp_path, gold, message):
    """Checked when the file is read, before any scoring: a string gold once crashed after scoring."""
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"s1": ["a", "c"], "s2": ["b", "d"], "gold": gold}), p)
    with pytest.raises(InputError, match=message) as err:
        read_pairs_file(str(p))
    assert "p.parquet" in str(err.value) and "\n" not in str(err.value)


def test_parquet_columns_take_the_names_a_header_line_may_give_them(tmp_path):
    """sentence1/sentence2/score (the names of a CSV header the reader takes) are read from Parquet too; columns
    of no such name are refused naming those it has and the names it reads."""
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [7], "Sentence1": ["a cat"], "sentence2": ["a dog"], "score": [3.5]}), p)
    assert read_pairs_file(str(p)) == [("a cat", "a dog", 3.5)]
    pq.write_table(pa.table({"sentence1": ["a cat"], "sentence2": ["a dog"], "score": ["high"]}), p)
    with pytest.raises(InputError, match="column score has type string"):
        read_pairs_file(str(p))
    # the plain names are read by them alone, as before the others were taken: no other column is gold
    pq.write_table(pa.table({"sentence1": ["x"], "sentence2": ["y"], "s1": ["a"], "s2": ["b"], "label": [2]}), p)
    assert read_pairs_file(str(p)) == [("a", "b", None)]
    pq.write_table(pa.table({"Sentence1": ["x"], "sentence1": ["a"], "sentence2": ["b"]}), p)
    with pytest.raises(InputError, match="two columns have one name, in other cases"):
        read_pairs_file(str(p))
    pq.write_table(pa.table({"left": ["a"], "right": ["b"]}), p)
    with pytest.raises(InputError, match=r"needs columns s1 and s2 \(or sentence1/sentence2, .*; has left, right\)"):
        read_pairs_file(str(p))


def test_parquet_gold_of_integers_decimals_or_nulls_is_read(tmp_path):
    from decimal import Decimal

    for gold, want in ((pa.array([3, None], pa.int32()), [3.0, None]),
                       (pa.array([Decimal("2.5"), None], pa.decimal128(4, 2)), [2.5, None]),
                       (pa.array([None, None], pa.null()), [None, None])):
        p = tmp_path / "p.parquet"
        pq.write_table(pa.table({"s1": ["a", "c"], "s2": ["b", "d"], "gold": gold}), p)
        assert [g for _, _, g in read_pairs_file(str(p))] == want


def test_a_byte_order_mark_does_not_turn_the_header_into_a_pair(tmp_path):
    bom = "\ufeff"
    assert read_pairs_file(write(tmp_path, "b.tsv", bom + "s1\ts2\tgold\nA cat.\tA dog.\t2\n")) == [
        ("A cat.", "A dog.", 2.0)]
    assert read_pairs_file(write(tmp_path, "b.csv", bom + "sentence1,sentence2\nA cat.,A dog.\n")) == [
        ("A cat.", "A dog.", None)]
    assert read_pairs_file(write(tmp_path, "b.jsonl", bom + '{"s1": "a", "s2": "b"}\n')) == [("a", "b", None)]
    # a bad byte after the mark is still named at its own line
    with pytest.raises(InputError, match=r"l.tsv:2: not UTF-8 text \(byte 0xe9\)"):
        read_pairs_file(write(tmp_path, "l.tsv", b"\xef\xbb\xbfa\tb\ncaf\xe9\tx\n"))


@pytest.mark.parametrize("name, data, s1, s2", [
    ("nli.tsv", "premise\thypothesis\nA cat sat.\tA dog sat.\n", "premise", "hypothesis"),
    ("qqp.csv", "question1,question2\nWhy?,How?\n", "question1", "question2"),
    ("sa.tsv", "sentA\tsentB\nA cat sat.\tA dog sat.\n", "sentA", "sentB"),
    ("spaced.tsv", "Sentence A\tSentence B\ncat\tdog\n", "Sentence A", "Sentence B"),
    ("half.tsv", "s1\ttext\nA cat sat.\tA dog sat.\n", "s1", "text"),
    ("qa.tsv", "question\tanswer\ncat\tdog\nWhat sat?\tA cat sat.\n", "question", "answer"),
    ("number.tsv", "question\tanswer\nHow many?\t42\nWho sat?\tA cat.\n", "question", "answer"),
    ("trailing.tsv", "question\tanswer\nWhat sat?\tA cat sat.\t\n", "question", "answer"),
])
def test_two_column_names_above_sentences_are_the_header_and_the_note_names_it(tmp_path, capsys, name, data, s1,
                                                                               s2):
    """A first line of two column names (not s1/s2) above rows of two sentences was refused, asking for `s1<TAB>s2`
    above it: a user's header is most likely a header, and with two columns there is no doubt which holds which
    sentence. It is read as the header, s1 then s2, and a note names it in case it was a pair after all."""
    delimiter = "\t" if name.endswith(".tsv") else ","
    rows = [ln.split(delimiter) for ln in data.splitlines()[1:]]
    assert read_pairs_file(write(tmp_path, name, data)) == [(r[0], r[1], None) for r in rows]
    sep = "<TAB>" if delimiter == "\t" else ","
    assert capsys.readouterr().err == (f"note: {tmp_path / name}:1: {s1}{sep}{s2} read as the header line, its "
                                       f"columns s1 and s2 in that order; if it is a pair, put the line s1{sep}s2 "
                                       "above it\n")
    # as the note says: the same line under s1<TAB>s2 is a pair, and no note is given
    assert read_pairs_file(write(tmp_path, name, f"s1{delimiter}s2\n{data}"))[0] == (s1, s2, None)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name, data, found", [
    ("score.csv", "sentA,sentB,score\nA cat sat.,A dog sat.,3.5\n", "sentA, sentB, score"),
    ("four.tsv", "id\tleft\tright\tlabel\n1\tA cat sat.\tA dog sat.\t3\n", "id, left, right, label"),
    # two names: one of a gold column, one above a column of numbers (a score), one above rows of three fields
    # or above no row at all
    ("label.tsv", "text\tlabel\nA good film.\tpositive\n", "text, label"),
    ("rating.tsv", "sentence\trating\nA cat sat.\t4\nA dog sat.\t2.5\n", "sentence, rating"),
    ("three.tsv", "question\tanswer\nWhat sat?\tA cat sat.\t4\n", "question, answer"),
    ("alone.csv", "premise,hypothesis\n", "premise, hypothesis"),
])
def test_a_header_of_unread_column_names_is_refused_not_read_as_a_pair(tmp_path, name, data, found):
    """A header line naming other columns is never scored as a pair (nor its score column read as a score):
    one line names what it found and the columns read."""
    with pytest.raises(InputError) as err:
        read_pairs_file(write(tmp_path, name, data))
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / name}:1: header line names columns {found};"), msg
    assert "s1 and s2 (or sentence1/sentence2" in msg and "optionally gold (or score" in msg and "\n" not in msg
    assert ("if it is a pair, put the line s1" in msg) == (found.count(",") == 1)  # two columns: maybe a pair
    assert ("if it is a pair, its third field (gold)" in msg) == (found.count(",") >= 2)  # a gold that is no number


@pytest.mark.parametrize("name, data, line, fields, named, sep", [
    ("tab.tsv", "s1\ts2\nA cat sat.\tA dog sat.\nHello\tworld.\tHi there.\n", 3, 3, 2, "a TAB"),
    ("gold.tsv", "s1\ts2\tgold\nA cat\tsat.\tA dog sat.\t3\n", 2, 4, 3, "a TAB"),
    ("comma.csv", "sentence1,sentence2\nYes, a cat sat.,A dog sat.\n", 2, 3, 2, "an unquoted comma"),
])
def test_a_row_with_more_fields_than_its_header_is_refused_naming_its_line(tmp_path, name, data, line, fields,
                                                                          named, sep):
    """Under a header, the named columns alone were read and a row's further fields dropped without a word: a
    TAB inside a sentence lost the text after it. Such a row is refused, naming its line; an empty field after
    the named ones (a trailing TAB) is no text and is read."""
    with pytest.raises(InputError) as err:
        read_pairs_file(write(tmp_path, name, data))
    assert str(err.value).startswith(f"{tmp_path / name}:{line}: {fields} fields where the header names {named} "
                                     f"columns; {sep} inside a sentence"), str(err.value)
    assert read_pairs_file(write(tmp_path, "trailing.tsv", "s1\ts2\nA cat sat.\tA dog sat.\t\n")) == [
        ("A cat sat.", "A dog sat.", None)]


@pytest.mark.parametrize("data, pair", [
    ("one\ttwo\n", ("one", "two", None)),  # one-word sentences that are no column names
    ("A cat sat.\tA dog sat.\n", ("A cat sat.", "A dog sat.", None)),
    ("text\tA cat sat on the mat.\n", ("text", "A cat sat on the mat.", None)),  # a sentence is no column name
    ("s1\ts2\nquestion\tanswer\n", ("question", "answer", None)),  # a header line makes any pair a pair
    ("a cat\ta dog\t2\n", ("a cat", "a dog", 2.0)),
])
def test_pairs_that_look_like_names_are_still_pairs(tmp_path, data, pair):
    assert read_pairs_file(write(tmp_path, "p.tsv", data)) == [pair]


@pytest.mark.parametrize("name, data, pairs", [
    ("w.tsv", "question\tanswer\ncat\tdog\ncar\tautomobile\n",
     [("question", "answer", None), ("cat", "dog", None), ("car", "automobile", None)]),
    ("w.csv", "source,target\nbank,river\n", [("source", "target", None), ("bank", "river", None)]),
])
def test_two_words_above_pairs_of_words_are_a_pair_and_the_note_names_the_line(tmp_path, capsys, name, data, pairs):
    """A first line of two column-like words was refused as a header whatever lay under it, so a file of word
    pairs needed a header added. Above rows that are word pairs too it is no different from them: read as a pair,
    with a note naming it, in case it was a header."""
    assert read_pairs_file(write(tmp_path, name, data)) == pairs
    sep = "<TAB>" if name.endswith(".tsv") else ","
    a, b = pairs[0][:2]
    assert capsys.readouterr().err == (f"note: {tmp_path / name}:1: {a}{sep}{b} read as a pair, as every line under "
                                       f"it is a pair of words; if it names the columns, write s1{sep}s2 there "
                                       "instead\n")
    # above a sentence, alone, above scored rows, or naming a gold column, the same line is still a header of
    # unread names: refused, never scored
    # alone, above scored rows, or naming a gold column, the same line is still a header of unread names: refused,
    # never scored
    for other in ("question\tanswer\n", "source\ttarget\ncat\tdog\t0.8\n",
                  "question\tanswer\ncat\tdog\ncar\tautomobile\t3.5\n", "text\tlabel\ngood\tpositive\nbad\tnegative\n"):
        with pytest.raises(InputError, match=":1: header line names columns "):
            read_pairs_file(write(tmp_path, "h.tsv", other))
    assert capsys.readouterr().err == ""


def test_harvest_reads_a_first_pair_of_words_or_a_header_above_sentences_saying_which(speech_corpus, tiny_models,
                                                                                     tmp_path, capsys):
    """Through `sentsim harvest --pairs`: the word-pair file is harvested whole, its first line included and
    named in a note; the same first line above sentences is the header, named in a note and never scored; a
    rerun of either reads the pairs it read and does nothing. The first harvest runs the console script; the
    others run sentsim.cli.main in this process (the same code without a second start-up of torch)."""
    import pyarrow.dataset as ds
    from conftest import sentsim_cli
    from harvest_support import cli_in_process

    harvest = ("harvest", "--corpus", speech_corpus, "--context-models", tiny_models, *SMALL_HARVEST)
    runs = 0
    for name, data, note, want in [
            ("words.tsv", "question\tanswer\nnation\tcountry\ntaxes\tyear\n",
             "read as a pair, as every line under it is a pair of words; if it names the columns, write s1<TAB>s2 "
             "there instead", [("nation", "country"), ("question", "answer"), ("taxes", "year")]),
            ("qa.tsv", "question\tanswer\nWhat must the nation do?\tRemain strong.\n",
             "read as the header line, its columns s1 and s2 in that order; if it is a pair, put the line s1<TAB>s2 "
             "above it", [("What must the nation do?", "Remain strong.")])]:
        pairs, out = write(tmp_path, name, data), tmp_path / name.replace(".", "_")
        for attempt in ("first", "rerun"):
            args = (*harvest, "--pairs", pairs, "--out", out)
            r = sentsim_cli(*args) if runs == 0 else cli_in_process(capsys, *args)
            runs += 1
            assert r.returncode == 0, (attempt, r.stderr[-3000:])
            assert f"note: {pairs}:1: question<TAB>answer {note}" in r.stderr.splitlines(), r.stderr[-3000:]
            got = ds.dataset(str(out / "pairs")).to_table(columns=["s1", "s2"]).to_pylist()
            assert sorted((p["s1"], p["s2"]) for p in got) == want, attempt


def test_a_harvest_of_sick_lines_and_eval_sts_of_it_agree_on_pairs_and_gold(speech_corpus, tiny_models, shared_data,
                                                                             tmp_path, capsys):
    """`harvest --pairs` on the first lines of the real SICK_trial.txt (header-less, five columns) finishes with
    a row for each line, SICK's relatedness score as its gold, and `eval sts --scores` of the run against the same
    file as SICK-R finds every scored pair (the release with its header line is read alike: the test above)."""
    import pyarrow.dataset as ds
    from conftest import sentsim_cli
    from harvest_support import cli_in_process

    from sentsim.evaluation.datasets import load_sick_file

    n = 12
    lines = (shared_data / "sts" / "SICK" / "SICK_trial.txt").read_text(encoding="utf-8").splitlines(True)[:n]
    (tmp_path / "sick").mkdir()
    trial = tmp_path / "sick" / "SICK_trial.txt"  # the name `eval sts` finds SICK-R by
    trial.write_text("".join(lines), encoding="utf-8")
    st = load_sick_file(trial)
    want = sorted(zip(st.s1, st.s2, map(float, st.gold)))
    assert len(want) == n and want == sorted((c[1], c[2], float(c[3])) for c in (ln.split("\t") for ln in lines))
    harvest = ("harvest", "--corpus", speech_corpus, "--context-models", tiny_models, *SMALL_HARVEST,
               "--set", "pairs_per_unit=5")
    r = sentsim_cli(*harvest, "--pairs", trial, "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = ds.dataset(str(tmp_path / "run" / "pairs")).to_table(columns=["s1", "s2", "gold", "score"]).to_pylist()
    assert sorted((p["s1"], p["s2"], p["gold"]) for p in rows) == want
    scored = sum(p["score"] is not None for p in rows)
    assert scored > 0
    r = cli_in_process(capsys, "eval", "sts", "--scores", tmp_path / "run", "--data", tmp_path / "sick",
                       "--tasks", "SICK-R")
    assert r.returncode == 0, r.stderr
    assert [ln.split()[:3] for ln in r.stdout.splitlines() if ln.startswith("SICK-R")] == [
        ["SICK-R", str(n), str(scored)]], r.stdout


def test_harvest_refuses_a_header_of_unread_names_before_any_work(speech_corpus, tmp_path):
    from conftest import sentsim_cli

    from sentsim.context.bundle_meta import FORMAT

    models = tmp_path / "ctx"  # a bundle's context.json is all the harvest reads before the pairs file
    models.mkdir()
    (models / "context.json").write_text(json.dumps({"format": FORMAT, "directions": {"fwd": "shared"}}))
    pairs = write(tmp_path, "nli.tsv", "premise\thypothesis\nA cat sat.\tA dog sat.\tentailment\n")
    r = sentsim_cli("harvest", "--corpus", speech_corpus, "--context-models", models, "--pairs", pairs,
                    "--out", tmp_path / "run", "--executor", "inline", "--set", "contexts.mode=random",
                    "--set", "rank.enabled=false")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        next(ln for ln in r.stderr.splitlines() if ln.startswith("sentsim: error:"))], r.stderr
    assert f"{pairs}:1: header line names columns premise, hypothesis;" in r.stderr
    assert not (tmp_path / "run").exists()
    # a row whose sentence holds a TAB, under a header: the command refuses it too, naming the line
    pairs = write(tmp_path, "tab.tsv", "s1\ts2\tgold\nA cat sat.\tA dog sat.\t4\nA cat\tsat.\tA dog.\t3\n")
    r = sentsim_cli("harvest", "--corpus", speech_corpus, "--context-models", models, "--pairs", pairs,
                    "--out", tmp_path / "run", "--executor", "inline", "--set", "contexts.mode=random",
                    "--set", "rank.enabled=false")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"{pairs}:3: 4 fields where the header names 3 columns; a TAB inside a sentence" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


JSON_LINES = ('{"s1": "A man plays guitar.", "s2": "A man plays a guitar.", "gold": 4.2}\n'
              '{"s1": "A cat.", "s2": "A dog."}\n')


@pytest.mark.parametrize("name", ["x.json", "x.ndjson", "x.txt", "x.csv", "x.tsv", "x"])
def test_json_lines_are_read_whatever_the_files_name(tmp_path, name):
    """A first line that is a JSON object makes the file JSON lines, never CSV cells such as `{"s1": "A cat."`."""
    assert read_pairs_file(write(tmp_path, name, JSON_LINES)) == [
        ("A man plays guitar.", "A man plays a guitar.", 4.2), ("A cat.", "A dog.", None)]


@pytest.mark.parametrize("name, data", [
    ("a.json", '[{"s1": "a", "s2": "b"}, {"s1": "c", "s2": "d"}]\n'),
    ("b.json", '\n[\n  {"s1": "a", "s2": "b"}\n]\n'),
    ("c.jsonl", '{\n  "s1": "a",\n  "s2": "b"\n}\n'),
])
def test_a_json_file_that_is_one_document_is_refused_asking_for_json_lines(tmp_path, name, data):
    with pytest.raises(InputError) as err:
        read_pairs_file(write(tmp_path, name, data))
    line = 2 if name == "b.json" else 1  # the first line that is not blank
    assert str(err.value) == (f"{tmp_path / name}:{line}: one JSON document, not JSON lines; give one object with "
                              "s1, s2 (and optionally gold) on each line")


@pytest.mark.parametrize("name, data", [
    ("e.tsv", "A cat.\tA dog.\t\nA man.\tA woman.\t3\n"),  # header-less
    ("w.tsv", "A cat.\tA dog.\t \nA man.\tA woman.\t3\n"),
    ("h.tsv", "s1\ts2\tgold\nA cat.\tA dog.\t\nA man.\tA woman.\t3\n"),
    ("e.csv", "A cat.,A dog.,\nA man.,A woman.,3\n"),
])
def test_an_empty_gold_cell_is_no_gold_with_or_without_a_header(tmp_path, name, data):
    assert read_pairs_file(write(tmp_path, name, data)) == [("A cat.", "A dog.", None), ("A man.", "A woman.", 3.0)]


def z(text):
    return gzip.compress(text.encode(), mtime=0)  # the same bytes, and test ids, each run


def test_gzip_pairs_files_are_read_in_the_format_of_the_name_inside(tmp_path):
    want = [("A cat.", "A dog.", 2.0)]
    assert read_pairs_file(write(tmp_path, "p.tsv.gz", z("A cat.\tA dog.\t2\n"))) == want
    assert read_pairs_file(write(tmp_path, "p.csv.gz", z("sentence1,sentence2,score\nA cat.,A dog.,2\n"))) == want
    assert read_pairs_file(write(tmp_path, "p.jsonl.gz", z('{"s1": "A cat.", "s2": "A dog.", "gold": 2}\n'))) == want
    pq.write_table(pa.table({"s1": ["A cat."], "s2": ["A dog."], "gold": [2.0]}), tmp_path / "t.parquet")
    packed = gzip.compress((tmp_path / "t.parquet").read_bytes(), mtime=0)
    assert read_pairs_file(write(tmp_path, "p.parquet.gz", packed)) == want
    # gzip is told by its first bytes: a gzip file without .gz is read, a plain file named .gz read as it is
    assert read_pairs_file(write(tmp_path, "q.tsv", z("A cat.\tA dog.\t2\n"))) == want
    assert read_pairs_file(write(tmp_path, "r.tsv.gz", "A cat.\tA dog.\t2\n")) == want
    # lines are counted in the text inside
    with pytest.raises(InputError, match=r"s.tsv.gz:2: score 'high' is not a number"):
        read_pairs_file(write(tmp_path, "s.tsv.gz", z("A cat.\tA dog.\t2\nA man.\tA woman.\thigh\n")))


@pytest.mark.parametrize("name, data, message", [
    ("a.tsv", "A cat.\tA dog.\n\tOnly the second sentence.\n", "a.tsv:2: s1 is empty"),
    ("b.tsv", "A cat.\t  \t2\n", "b.tsv:1: s2 is empty"),
    ("c.tsv", "s1\ts2\tgold\n\nA cat.\t\t1\n", "c.tsv:3: s2 is empty"),
    ("d.csv", 'sentence1,sentence2\n"",A dog.\n', "d.csv:2: s1 is empty"),
    ("e.csv", "main-news\tf\t2012\t0001\t4.2\t\tA dog.\n", "e.csv:1: s1 is empty"),  # an STS-B line
    ("f.jsonl", '{"s1": "A cat.", "s2": " "}\n', "f.jsonl:1: s2 is empty"),
])
def test_a_pair_with_an_empty_sentence_is_refused_naming_its_line(tmp_path, name, data, message):
    with pytest.raises(InputError) as err:
        read_pairs_file(write(tmp_path, name, data))
    assert str(err.value) == f"{tmp_path / message}"


def test_a_parquet_pair_with_an_empty_sentence_names_its_row_and_blank_lines_are_skipped(tmp_path):
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"s1": ["A cat.", ""], "s2": ["A dog.", "A man."]}), p)
    with pytest.raises(InputError, match=r"p.parquet: row 1: s1 is empty"):
        read_pairs_file(str(p))
    # a wholly blank line (white space or TABs only) is no row
    assert read_pairs_file(write(tmp_path, "b.tsv", "\nA cat.\tA dog.\n\t\n  \n")) == [("A cat.", "A dog.", None)]


@pytest.mark.parametrize("name, data, needle", [
    # each refusal at line 2 says line 1 was read as meant
    ("x.json", JSON_LINES.splitlines()[0] + '\n{"s1": "", "s2": "A dog."}\n', "x.json:2: s1 is empty"),
    ("a.json", '[{"s1": "A cat.", "s2": "A dog."}]\n', "a.json:1: one JSON document, not JSON lines"),
    ("e.tsv", "A cat.\tA dog.\t\n\tOnly the second sentence.\n", "e.tsv:2: s1 is empty"),
    ("p.tsv.gz", z("A cat.\tA dog.\t2\nA man.\tA woman.\thigh\n"), "p.tsv.gz:2: score 'high' is not a number"),
    ("t.tsv.gz", z("A cat.\tA dog.\t2\n" * 100)[:30], "t.tsv.gz: unreadable or truncated gzip stream"),
    ("SICK_trial.txt", "4\tA cat.\tA dog.\t3.6\tNEUTRAL\n24\tA man.\tA woman.\t6\tNEUTRAL\n",
     "SICK_trial.txt:2: expected s1 and s2 separated by TAB (or a header line naming s1 and s2, or a SICK line"),
    ("rating.tsv", "sentence\trating\nA cat.\t4\n", "rating.tsv:1: header line names columns sentence, rating;"),
], ids=["x.json", "a.json", "e.tsv", "p.tsv.gz", "t.tsv.gz", "sick", "rating"])
def test_harvest_reads_json_lines_gzip_and_empty_gold_and_refuses_empty_sentences(tmp_path, speech_corpus, name,
                                                                                 data, needle):
    """Through `sentsim harvest --pairs`: one line naming file and line, before the run folder exists."""
    from conftest import sentsim_cli

    from sentsim.context.bundle_meta import FORMAT

    models = tmp_path / "ctx"  # a bundle's context.json is all the harvest reads before the pairs file
    models.mkdir()
    (models / "context.json").write_text(json.dumps({"format": FORMAT, "directions": {"fwd": "shared"}}))
    pairs = write(tmp_path, name, data)
    r = sentsim_cli("harvest", "--corpus", speech_corpus, "--context-models", models, "--pairs", pairs,
                    "--out", tmp_path / "run", "--executor", "inline", "--set", "contexts.mode=random",
                    "--set", "rank.enabled=false")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sentsim: error: {tmp_path / needle}"), r.stderr
    assert not (tmp_path / "run").exists()
