"""Corpus ingestion on real text: schema, stable ids, chunks, every input format, bad input."""

import gzip
import json

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import sentsim_cli

from corpus.documents import CHUNK_SCHEMA, SENT_BITS, SENTENCE_SCHEMA
from sentsim.corpus_job import build_corpus
from sentsim.errors import InputError, UsageError


def read(run, table):
    return ds.dataset(str(run / table)).to_table().sort_by(f"{'sentence' if table == 'sentences' else 'chunk'}_id")


def test_sample_corpus_schema_and_order(speech_corpus, sample_path):
    sents = read(speech_corpus, "sentences")
    chunks = read(speech_corpus, "chunks")
    assert sents.schema.equals(SENTENCE_SCHEMA)
    assert chunks.schema.equals(CHUNK_SCHEMA)
    manifest = json.loads((speech_corpus / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["documents"] == 20
    assert manifest["counts"]["sentences"] == sents.num_rows > 3000
    assert manifest["inputs"][0]["sha256"] and manifest["inputs"][0]["bytes"] == sample_path.stat().st_size
    ids = sents.column("sentence_id").to_numpy()
    assert len(set(ids)) == len(ids)
    # Document order is kept: documents appear in input order, sentences in reading order.
    docs = [json.loads(line)["id"] for line in gzip.open(sample_path, "rt")]
    seen = list(dict.fromkeys(sents.column("doc_id").to_pylist()))
    assert seen == docs
    df = sents.to_pandas()
    for _, g in df.groupby("doc_id"):
        assert list(g.sent_idx) == list(range(len(g)))
        assert (g.sentence_id.diff().dropna() == 1).all()  # neighbours are id +/- 1
        assert g.para_idx.is_monotonic_increasing
    # The first sentences of the first speech, split by the sentence splitter.
    first = json.loads(gzip.open(sample_path, "rt").readline())["paragraphs"][0]
    assert first.startswith(df.text.iloc[0][:20])
    assert all("  " not in t and t == t.strip() for t in df.text)


def test_chunks_cover_every_sentence_once(speech_corpus):
    sents = read(speech_corpus, "sentences").to_pandas()
    chunks = read(speech_corpus, "chunks").to_pandas()
    assert chunks.n_sentences.max() == 8 and chunks.n_sentences.min() >= 1
    covered = [fid + k for fid, n in zip(chunks.first_sentence_id, chunks.n_sentences) for k in range(n)]
    assert sorted(covered) == sorted(sents.sentence_id)
    # a chunk never crosses a document boundary
    first = chunks.first_sentence_id.to_numpy()
    last = first + chunks.n_sentences.to_numpy() - 1
    assert ((first >> SENT_BITS) == (last >> SENT_BITS)).all()


def test_ids_stable_across_runs_and_unit_sizes(tmp_path, sample_path, speech_corpus):
    other = tmp_path / "again"
    build_corpus([str(sample_path)], str(other), overrides=["docs_per_unit=7"], executor="inline", quiet=True)
    assert read(other, "sentences").equals(read(speech_corpus, "sentences"))
    assert read(other, "chunks").equals(read(speech_corpus, "chunks"))


def test_chunk_size_and_stride(tmp_path, sample_path):
    out = tmp_path / "c"
    build_corpus([str(sample_path)], str(out), overrides=["chunk.size=4", "chunk.stride=2"], executor="inline",
                 quiet=True)
    ch = read(out, "chunks").to_pandas()
    assert ch.n_sentences.max() == 4
    d0 = ch[ch.doc_id == ch.doc_id.iloc[0]]
    assert list(d0.first_sentence_id.diff().dropna().unique()) == [2]


def test_text_and_parquet_inputs(tmp_path):
    txt = tmp_path / "essay.txt"
    txt.write_text("First line of a paragraph\nwrapped here. Second sentence!\n\n\nNew paragraph. Done.\n")
    pq_file = tmp_path / "docs.parquet"
    pq.write_table(
        pa.table({"body": ["One doc. Two sentences.", "Para one.\n\nPara two."], "key": ["a", "b"]}), pq_file
    )
    out = tmp_path / "mixed"
    build_corpus([str(txt), str(pq_file)], str(out), overrides=["text_column=body", "id_column=key"],
                 executor="inline", quiet=True)
    df = read(out, "sentences").to_pandas()
    essay = df[df.doc_id == "essay.txt:1"]
    assert list(essay.text) == ["First line of a paragraph wrapped here.", "Second sentence!", "New paragraph.",
                                "Done."]
    assert list(essay.para_idx) == [0, 0, 1, 1]
    assert list(df[df.doc_id == "b"].para_idx) == [0, 1]
    assert set(df.doc_id) == {"essay.txt:1", "a", "b"}


def test_truncation_is_capped_and_counted(tmp_path):
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"id": "x", "paragraphs": ["word " * 50 + "end.", "Short one."]}) + "\n")
    out = tmp_path / "o"
    m = build_corpus([str(src)], str(out), overrides=["max_sentence_tokens=10"], executor="inline", quiet=True)
    assert m["counts"]["truncated_sentences"] == 1
    df = read(out, "sentences").to_pandas()
    assert df.n_tokens.tolist() == [10, 2]


BAD_LINES = {
    "malformed JSON": b'{"id": "ok", "paragraphs": ["Fine."]}\n{"id": "broken", "paragraphs": [\n',
    "not valid UTF-8": b'{"id": "ok", "paragraphs": ["Fine."]}\n{"id": "latin", "paragraphs": ["caf\xe9."]}\n',
    "empty document": b'{"id": "ok", "paragraphs": ["Fine."]}\n{"id": "empty", "paragraphs": ["   ", ""]}\n',
    "missing 'paragraphs'": b'{"id": "ok", "paragraphs": ["Fine."]}\n{"id": "nop", "text": "x"}\n',
    # lines json.loads refuses with RecursionError and ValueError, and one it reads but no UTF-8 file can hold
    "nested too deeply": b'{"id": "ok", "paragraphs": ["Fine."]}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "integer string conversion": b'{"id": "ok", "paragraphs": ["Fine."]}\n{"id": ' + b"7" * 5001
    + b', "paragraphs": ["Fine."]}\n',
    "lone surrogate": b'{"id": "ok", "paragraphs": ["Fine."]}\n{"id": "s", "paragraphs": ["Bad \\ud800 here."]}\n',
}


@pytest.mark.parametrize("reason", sorted(BAD_LINES))
def test_bad_jsonl_fails_with_one_line_naming_file_and_line(tmp_path, reason):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(BAD_LINES[reason])
    r = sentsim_cli("corpus", "build", src, "--out", tmp_path / "o", "--executor", "inline")
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("sentsim: error")]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "bad.jsonl:2" in lines[0] and reason in lines[0]
    if reason == "missing 'paragraphs'":  # JSONL from elsewhere: its text field named, and what to give instead
        assert "(this object's text fields: 'text'); a JSON line gives a document as {\"paragraphs\"" in lines[0]


def test_huge_paragraph_without_punctuation(tmp_path):
    src = tmp_path / "huge.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write(json.dumps({"id": "big", "paragraphs": ["word " * 210_000]}) + "\n")
    r = sentsim_cli("corpus", "build", src, "--out", tmp_path / "o", "--executor", "inline")
    assert r.returncode == 2 and "huge.jsonl.gz:1" in r.stderr and "max_paragraph_chars" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_parquet_column(tmp_path):
    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"content": ["a. b."]}), f)
    r = sentsim_cli("corpus", "build", f, "--out", tmp_path / "o", "--executor", "inline")
    assert r.returncode == 2 and "t.parquet" in r.stderr and "no column 'text'" in r.stderr
    assert "Traceback" not in r.stderr


def test_skip_mode_counts_every_bad_document(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(b"".join(BAD_LINES.values()))
    out = tmp_path / "o"
    m = build_corpus([str(src)], str(out), overrides=["on_error=skip"], executor="inline", quiet=True)
    sk = m["skipped_documents"]
    assert sk["count"] == len(BAD_LINES)
    assert sorted(x["line"] for x in sk["listed"]) == list(range(2, 2 * len(BAD_LINES) + 1, 2))
    assert m["counts"]["documents"] == len(BAD_LINES)  # the good "ok" documents survive
    assert read(out, "sentences").num_rows == len(BAD_LINES)


def test_lone_surrogate_in_an_id_is_refused_and_the_splitter_names_one(tmp_path):
    from corpus.splitter import split_sentences

    src = tmp_path / "ids.jsonl"
    src.write_bytes(b'{"id": "\\udc00", "paragraphs": ["Fine. Yes."]}\n')
    with pytest.raises(InputError, match="ids.jsonl:1: id holds a lone surrogate"):
        build_corpus([str(src)], str(tmp_path / "o"), executor="inline", quiet=True)
    with pytest.raises(ValueError, match="lone surrogate"):  # never blingfire's UnicodeEncodeError
        split_sentences("Bad \ud800 here.")


def test_parquet_text_that_is_not_utf8_names_the_row_or_is_skipped(tmp_path):
    # Arrow writes a string column's bytes unchecked; reading them back fails in to_pylist
    src = tmp_path / "raw.parquet"
    text = pa.array([b"Good one. Yes.", b"\xff bad bytes.", b"Also good."], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": text}), src)
    with pytest.raises(InputError, match="raw.parquet:2: text \\(or id\\) is not valid UTF-8"):
        build_corpus([str(src)], str(tmp_path / "o"), executor="inline", quiet=True)
    m = build_corpus([str(src)], str(tmp_path / "o2"), overrides=["on_error=skip"], executor="inline", quiet=True)
    assert m["skipped_documents"]["count"] == 1 and m["counts"]["documents"] == 2


def test_bad_paths_and_formats(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        build_corpus([str(tmp_path / "nope.jsonl")], str(tmp_path / "o"), executor="inline")
    (tmp_path / "docs").mkdir()
    with pytest.raises(InputError, match="docs: is a folder, not a file; pass the files inside it"):
        build_corpus([str(tmp_path / "docs")], str(tmp_path / "o1"), executor="inline")
    odd = tmp_path / "doc.pdf"
    odd.write_bytes(b"%PDF")
    with pytest.raises(InputError, match="unknown input type"):
        build_corpus([str(odd)], str(tmp_path / "o2"), executor="inline")
    with pytest.raises(UsageError, match="no input"):
        build_corpus([], str(tmp_path / "o3"), executor="inline")


def test_other_fingerprint_refused_unless_force_new(tmp_path, sample_path):
    out = tmp_path / "run"
    build_corpus([str(sample_path)], str(out), executor="inline", quiet=True)
    r = sentsim_cli("corpus", "build", sample_path, "--out", out, "--executor", "inline", "--chunk-size", "5")
    assert r.returncode == 2 and "fingerprint" in r.stderr and "--force-new" in r.stderr
    assert "chunk.size: 8 -> 5" in r.stderr, r.stderr
    extra = tmp_path / "extra.jsonl"  # a second input file: named as the input that changed
    extra.write_text('{"text": "A second file. It adds a document."}\n')
    r = sentsim_cli("corpus", "build", sample_path, extra, "--out", out, "--executor", "inline")
    assert r.returncode == 2 and "input(s) changed: inputs.1." in r.stderr, r.stderr
    r = sentsim_cli("corpus", "build", sample_path, "--out", out, "--executor", "inline", "--chunk-size", "5",
                    "--force-new")
    assert r.returncode == 0, r.stderr
    assert read(out, "chunks").column("n_sentences").to_numpy().max() == 5


def test_max_units_stops_early_and_the_same_command_finishes_the_run(tmp_path, sample_path, speech_corpus):
    """--max-units (every resumable command has it): a slice of the run now, the rest later."""
    out = tmp_path / "run"
    cmd = ["corpus", "build", sample_path, "--out", out, "--executor", "inline", "--set", "docs_per_unit=4"]
    r = sentsim_cli(*cmd, "--max-units", "2")
    assert r.returncode == 0, r.stderr
    # the summary printed above it counts the done units only, and the line says so
    assert r.stdout.strip().splitlines()[-1] == ("stopped after --max-units 2: 2/5 units done (the counts above are "
                                                 "theirs); run the same command again to continue")
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    # with --force-new, the same command would start over each time: the line says to drop it
    r = sentsim_cli(*cmd, "--max-units", "2", "--force-new")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].endswith(
        "run the same command again without --force-new (with it, the run starts over) to continue"), r.stdout
    assert len(read(out, "sentences")) < len(read(speech_corpus, "sentences"))
    r = sentsim_cli(*cmd, "--max-units", "0")
    assert r.returncode == 2 and "--max-units: expected a whole number of units, 1 or more" in r.stderr
    assert "Traceback" not in r.stderr
    r = sentsim_cli(*cmd)
    assert r.returncode == 0 and "stopped after" not in r.stdout, r.stderr
    assert read(out, "sentences").equals(read(speech_corpus, "sentences"))
    assert read(out, "chunks").equals(read(speech_corpus, "chunks"))


def test_every_subcommand_has_help(capsys):
    """Every command the CLI discovers (all of them, not a sample) prints its usage and exits 0; the
    console script itself too."""
    from sentsim.cli import _command_modules, main

    commands = [tuple(m.COMMAND) for m in _command_modules()]
    assert len(commands) == 13 and ("train", "context") in commands and ("harvest",) in commands
    for cmd in commands:
        with pytest.raises(SystemExit) as done:
            main([*cmd, "--help"])
        out = capsys.readouterr().out
        assert done.value.code == 0 and out.startswith(f"usage: sentsim {' '.join(cmd)}"), cmd
    r = sentsim_cli("--help")
    assert r.returncode == 0 and all(group in r.stdout for group in ("corpus", "train", "harvest", "eval"))


@pytest.mark.parametrize("content,extra,message", [
    (b"", [], "the inputs hold nothing to process"),
    (b'{"id": "a", "paragraphs": ["   "]}\n{"id": "b", "paragraphs": []}\n', ["--set", "on_error=skip"],
     "no document could be ingested"),
])
def test_empty_corpus_is_refused_and_never_complete(tmp_path, content, extra, message):
    """0 documents is a user's mistake: exit 2 with one line, and no run marked complete (an empty
    input is refused before anything is written)."""
    src = tmp_path / "docs.jsonl"
    src.write_bytes(content)
    out = tmp_path / "corpus"
    r = sentsim_cli("corpus", "build", src, "--out", out, "--executor", "inline", *extra)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if message in ln][0].startswith("sentsim: error: ")
    assert not (out / "_COMPLETE").exists()
    if not content:
        assert not out.exists()


def test_an_unfinished_corpus_is_refused_by_every_command_that_reads_one(tmp_path, sample_path):
    """A corpus stopped part-way (--max-units, a kill) records the whole corpus's fingerprint from the start, so an
    index, rep cache or model built from its first units passed, once it was finished, for one built from all of
    it: `index build` indexed 121 of the sample's 481 chunks and then matched the finished corpus. Each command
    refuses it in one line, writing nothing; the same build finishes it, and then they read it."""
    from conftest import error_line

    corpus = tmp_path / "corpus"
    build = ("corpus", "build", sample_path, "--out", corpus, "--set", "docs_per_unit=4", "--executor", "inline")
    assert sentsim_cli(*build, "--max-units", "1").returncode == 0
    model = tmp_path / "model"  # read only after the corpus: never reached
    model.mkdir()
    reads = [("index", "build", "--corpus", corpus, "--out", tmp_path / "index"),
             ("train", "discriminator", "--corpus", corpus, "--out", tmp_path / "disc"),
             ("cache", "build", "--corpus", corpus, "--discriminator", model, "--out", tmp_path / "cache"),
             ("train", "context", "--corpus", corpus, "--out", tmp_path / "ctx")]
    for args in reads:
        r = sentsim_cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        assert "is not complete (1/5 units written): finish the corpus first" in error_line(r.stderr), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "model"]  # no refused command wrote
    assert sentsim_cli(*build).returncode == 0
    r = sentsim_cli(*reads[0])
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["n_chunks"] == 481, r.stderr[-2000:]


def test_inputs_of_one_file_name_in_two_folders_are_named_by_their_folders(tmp_path, capsys):
    """A document without an id is `<input>:<line>`. Two inputs of one file name (`a/part.jsonl`, `b/part.jsonl`)
    gave two documents one doc_id and a bad record's message could not say which file it was in: each is named
    by the end of its path that tells it apart, in doc_ids, skips and errors. An input whose file name is its
    own keeps it, so a corpus of such inputs keeps its ids and its fingerprint."""
    from conftest import error_line
    from harvest_support import cli_in_process

    for folder, x, part in [("a", "Alpha one. Alpha two.", '{"paragraphs": ["A part."]}\n{"id": "own", '
                             '"paragraphs": ["Own id."]}\n'),
                            ("b", "Beta one.", '{"paragraphs": ["B part."]}\n{"paragraphs": [\n')]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.txt").write_text(x)
        (tmp_path / folder / "part.jsonl").write_text(part)
    (tmp_path / "solo.txt").write_text("Solo.")
    inputs = ["a/x.txt", "b/x.txt", "a/part.jsonl", "b/part.jsonl", "solo.txt"]
    build = ("corpus", "build", *inputs, "--executor", "inline")
    r = sentsim_cli(*build, "--out", tmp_path / "o", "--on-error", "skip", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert set(read(tmp_path / "o", "sentences").column("doc_id").to_pylist()) == {
        "a/x.txt:1", "b/x.txt:1", "a/part.jsonl:1", "own", "b/part.jsonl:1", "solo.txt:1"}
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == inputs
    assert [(s["file"], s["line"]) for s in manifest["skipped_documents"]["listed"]] == [("b/part.jsonl", 2)]
    r = sentsim_cli(*build, "--out", tmp_path / "fail", cwd=tmp_path)
    assert r.returncode == 2 and error_line(r.stderr).startswith("sentsim: error: b/part.jsonl:2: malformed JSON")

    # the names are fingerprinted: the same bytes under another folder's name are another corpus, so a corpus
    # whose documents were named otherwise (by file name alone, before) is never resumed into mixed names
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.txt").write_text("Beta one.")
    r = cli_in_process(capsys, "corpus", "build", tmp_path / "a" / "x.txt", tmp_path / "c" / "x.txt",
                       "--out", tmp_path / "o2", "--executor", "inline")
    assert r.returncode == 0, r.stderr
    r = cli_in_process(capsys, "corpus", "build", tmp_path / "a" / "x.txt", tmp_path / "b" / "x.txt",
                       "--out", tmp_path / "o2", "--executor", "inline")
    assert r.returncode == 2 and "inputs.1.name" in error_line(r.stderr), r.stderr

    # a file name no other input has is the name, as it always was
    m = build_corpus([str(tmp_path / "a" / "x.txt"), str(tmp_path / "solo.txt")], str(tmp_path / "o3"),
                     executor="inline", quiet=True)
    assert [i["name"] for i in m["inputs"]] == ["x.txt", "solo.txt"]
    assert set(read(tmp_path / "o3", "sentences").column("doc_id").to_pylist()) == {"x.txt:1", "solo.txt:1"}


def test_a_file_given_twice_is_refused(tmp_path, capsys):
    """The same file twice (as typed again, or by another path to it) would ingest its documents twice: refused
    in one line, before anything is written."""
    from conftest import error_line
    from harvest_support import cli_in_process

    src = tmp_path / "docs.jsonl"
    src.write_text('{"paragraphs": ["One."]}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(src)
    for second, said in [(src, f"{src}: given twice (inputs 1 and 2)"),
                         (link, f"{link}: the same file as {src} (inputs 1 and 2)")]:
        r = cli_in_process(capsys, "corpus", "build", src, second, "--out", tmp_path / "o", "--executor", "inline")
        assert r.returncode == 2 and error_line(r.stderr) == (f"sentsim: error: {said}; pass each file once, or its "
                                                              "documents are ingested twice"), r.stderr
        assert not (tmp_path / "o").exists()
