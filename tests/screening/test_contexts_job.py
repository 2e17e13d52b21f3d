"""`sentsim contexts`: C_s per sentence as shards; diversity rules hold on every set; resumable."""

import gzip
import json

import pyarrow.dataset as ds
import pytest
from conftest import sentsim_cli
from harvest_support import build_index_for


@pytest.fixture(scope="module")
def index(speech_corpus, tmp_path_factory):
    return build_index_for(speech_corpus, tmp_path_factory.mktemp("ctxjob") / "index")


def test_context_sets_obey_diversity_rules(speech_corpus, index, tmp_path):
    from corpus.view import CorpusIndex

    out = tmp_path / "ctx"
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--out", out, "--executor", "inline",
                    "--set", "sample=40", "--set", "per_unit=16", "--set", "contexts.size=20",
                    "--set", "contexts.retrieve_chunks=200")
    assert r.returncode == 0, r.stderr
    ctx = ds.dataset(str(out / "contexts")).to_table().to_pandas()
    q = ds.dataset(str(out / "queries")).to_table().to_pandas()
    assert len(q) == 40 and (q.n_contexts > 0).mean() > 0.8
    # a sentence with no bigram in common with any chunk gets no context, and says so
    assert q[q.n_contexts < 20].shortfall.notna().all()
    corpus = CorpusIndex(str(speech_corpus))
    for sid, g in ctx.groupby("sentence_id"):
        assert list(g["rank"]) == list(range(len(g))) and len(g) <= 20
        assert g.chunk_id.is_unique  # at most one context per chunk
        lefts = [set((corpus.text(c - 1) or "").lower().split())
                 if corpus.text(c - 1) and (c - 1) >> 20 == c >> 20 else set()
                 for c in g.centre_id]
        for i in range(len(lefts)):
            for j in range(i):
                if lefts[i] and lefts[j]:
                    assert len(lefts[i] & lefts[j]) / len(lefts[i] | lefts[j]) < 0.5
    # a query taken from the corpus retrieves its own chunk among its contexts' chunks
    own = [((s >> 20), c >> 20) for s, c in zip(ctx.sentence_id, ctx.centre_id)]
    assert sum(a == b for a, b in own) > 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] and m["counts"]["sentences"] == 40
    # re-running is a no-op that changes nothing
    before = ds.dataset(str(out / "contexts")).to_table().sort_by([("sentence_id", "ascending"), ("rank", "ascending")])
    r2 = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--out", out, "--executor", "inline",
                     "--set", "sample=40", "--set", "per_unit=16", "--set", "contexts.size=20",
                     "--set", "contexts.retrieve_chunks=200")
    assert r2.returncode == 0
    after = ds.dataset(str(out / "contexts")).to_table().sort_by([("sentence_id", "ascending"), ("rank", "ascending")])
    assert after.equals(before)


def test_a_run_stopped_by_max_units_counts_only_its_done_units(speech_corpus, index, tmp_path):
    """The summary line under --max-units counted every planned sentence (the line after it says the counts are
    the done units'): it counts the sentences the run holds, and the resumed run all of them."""
    out = tmp_path / "ctx"
    args = ("contexts", "--corpus", speech_corpus, "--index", index, "--out", out, "--executor", "inline",
            "--set", "sample=40", "--set", "per_unit=16", "--set", "contexts.size=4")
    r = sentsim_cli(*args, "--max-units", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    held = ds.dataset(str(out / "queries")).to_table().num_rows
    assert held == 16 and f"contexts: {held} sentences screened" in r.stdout, r.stdout
    assert "stopped after --max-units 1: 1/3 units done (the counts above are theirs)" in r.stdout
    r = sentsim_cli(*args)
    assert r.returncode == 0 and "contexts: 40 sentences screened" in r.stdout, (r.stdout, r.stderr[-2000:])


def test_external_sentences_and_shortfalls(speech_corpus, index, tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("The Congress must act on the budget.\t!!!\nqqxz zzvq\t!!!\n")  # a pair on each line
    out = tmp_path / "ext"
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", out,
                    "--executor", "inline", "--set", "contexts.size=10")
    assert r.returncode == 0, r.stderr
    q = ds.dataset(str(out / "queries")).to_table().to_pandas().set_index("text")
    assert q.loc["The Congress must act on the budget."].n_contexts == 10
    assert q.loc["!!!"].n_contexts == 0 and q.loc["!!!"].shortfall
    assert q.loc["qqxz zzvq"].n_contexts == 0 and "no retrieved chunk" in q.loc["qqxz zzvq"].shortfall
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", tmp_path / "none.txt",
                    "--out", tmp_path / "o2", "--executor", "inline")
    assert r.returncode == 2 and "not found" in r.stderr


def test_a_run_of_another_stage_given_as_a_corpus_or_harvest_is_named(speech_corpus, index, shared_data, tmp_path):
    """A contexts run (a sharded run, but no corpus) as --corpus, and a corpus as a trainer's --data: one
    line naming the stage that was given, before anything runs or is written."""
    f = tmp_path / "s.txt"
    f.write_text("The Congress must act on the budget.\n")
    run, models = tmp_path / "ctx", tmp_path / "models"
    models.mkdir()
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", run,
                    "--executor", "inline", "--set", "contexts.size=4")
    assert r.returncode == 0, r.stderr
    cases = [(("index", "build", "--corpus", run, "--out", tmp_path / "i"), f"{run}: not a corpus directory but a "
              "'contexts' run; give the --out of `sentsim corpus build`"),
             (("harvest", "--corpus", run, "--index", index, "--context-models", models, "--out", tmp_path / "h",
               "--executor", "inline"), "not a corpus directory but a 'contexts' run"),
             (("train", "surrogate", "--data", speech_corpus, "--out", tmp_path / "s"),
              "not a harvest run but a 'corpus' run; give the --out of `sentsim harvest` (or `sentsim remix`)"),
             (("train", "student", "--data", speech_corpus, "--out", tmp_path / "st"),
              "not a harvest run but a 'corpus' run"),
             # remix said "no manifest.json of stage 'harvest'", eval sts "a run, but it has no completed pairs/"
             (("remix", run, "--out", tmp_path / "r"), f"{run}: not a harvest run but a 'contexts' run; give the "
              "--out of `sentsim harvest` (or `sentsim remix`)"),
             (("eval", "sts", "--scores", run, "--data", shared_data / "sts", "--tasks", "STSb"),
              f"--scores {run}: not a harvest run but a "
              "'contexts' run")]
    for args, words in cases:
        r = sentsim_cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], (args, r.stderr[-1500:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx", "models", "s.txt"]


def test_a_pairs_files_header_names_its_sentence_columns_and_is_no_sentence(speech_corpus, index, tmp_path):
    """--sentences given a pairs file with a header: the header's s1 and s2 columns are the sentences, the
    header itself is none; a header naming other columns is refused in one line before anything runs."""
    f = tmp_path / "pairs.tsv"
    f.write_text("gold\ts1\ts2\n4.0\tThe Congress must act on the budget.\tWe cut taxes.\n")
    out = tmp_path / "hdr"
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", out,
                    "--executor", "inline", "--set", "contexts.size=4")
    assert r.returncode == 0, r.stderr
    texts = ds.dataset(str(out / "queries")).to_table().column("text").to_pylist()
    assert sorted(texts) == ["The Congress must act on the budget.", "We cut taxes."]
    f.write_text("premise\thypothesis\tlabel\nThe Congress must act on the budget.\tWe cut taxes.\tneutral\n")
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out",
                    tmp_path / "hdr2", "--executor", "inline")
    assert r.returncode == 2 and "header line names columns premise, hypothesis, label" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "hdr2").exists()


@pytest.mark.parametrize("name, data", [
    # a CSV header line is no sentence, whatever the file's name
    ("pairs.txt", "sentence1,sentence2,score\nThe Congress must act on the budget.,We cut taxes.,4\n"
                  "We cut taxes.,\"Taxes, they said, were cut.\",\n"),
    # JSON lines named .json, gzip-compressed: each object's s1 and s2, never the lines themselves
    ("pairs.json.gz", gzip.compress(b'{"s1": "The Congress must act on the budget.", "s2": "We cut taxes.", '
                                    b'"gold": 4}\n{"s1": "We cut taxes.", "s2": "Taxes, they said, were cut."}\n',
                                    mtime=0)),
], ids=["csv", "json-gz"])
def test_a_pairs_file_in_any_format_gives_both_sentences_of_each_pair(speech_corpus, index, tmp_path, name, data):
    """--sentences reads a pairs file as `harvest --pairs` does: both sentences of each pair, each once."""
    f = tmp_path / name
    f.write_bytes(data if isinstance(data, bytes) else data.encode())
    out = tmp_path / "run"
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", out,
                    "--executor", "inline", "--set", "contexts.size=2", "--set", "contexts.retrieve_chunks=20")
    assert r.returncode == 0, r.stderr
    texts = ds.dataset(str(out / "queries")).to_table().column("text").to_pylist()
    assert sorted(texts) == ["Taxes, they said, were cut.", "The Congress must act on the budget.", "We cut taxes."]


@pytest.mark.parametrize("name, data, error", [
    ("mixed.txt", "We cut taxes.\nThe budget.\tA plan.\n", "mixed.txt:2: a TAB in a file of one sentence a line"),
    ("mixed.tsv", "The budget.\tA plan.\nWe cut taxes.\n", "mixed.tsv:2: expected s1 and s2 separated by TAB"),
    ("empty.tsv", "The budget.\tA plan.\n\tWe cut taxes.\n", "empty.tsv:2: s1 is empty"),
    ("array.json", '[{"s1": "The budget.", "s2": "A plan."}]\n', "array.json:1: one JSON document, not JSON lines"),
])
def test_a_sentence_file_that_is_neither_sentences_nor_pairs_is_one_line(speech_corpus, index, tmp_path, name,
                                                                        data, error):
    """Refused before anything runs, naming file and line, never screened as sentences such as `\tWe cut taxes.`"""
    f = tmp_path / name
    f.write_text(data)
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out",
                    tmp_path / "run", "--executor", "inline")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"sentsim: error: {tmp_path / error}"), lines
    assert not (tmp_path / "run").exists()


def test_one_sentence_a_line_is_read_as_such_commas_and_gzip_included(speech_corpus, index, tmp_path):
    f = tmp_path / "s.txt.gz"
    f.write_bytes(gzip.compress(b"We cut taxes, they said.\n\nThe Congress must act on the budget.\n", mtime=0))
    out = tmp_path / "run"
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", out,
                    "--executor", "inline", "--set", "contexts.size=2", "--set", "contexts.retrieve_chunks=20")
    assert r.returncode == 0, r.stderr
    texts = ds.dataset(str(out / "queries")).to_table().column("text").to_pylist()
    assert sorted(texts) == ["The Congress must act on the budget.", "We cut taxes, they said."]


def test_a_run_resumes_under_another_spelling_of_its_paths_but_not_with_other_sentences(speech_corpus, index,
                                                                                        tmp_path):
    """The sentence file, corpus and index are fingerprinted by what they hold: named relative to another folder
    the run resumes (nothing redone); the same file with other sentences in it is another run."""
    import os

    f = tmp_path / "s.txt"
    f.write_text("The Congress must act on the budget.\nWe will defend our nation.\n")
    out = tmp_path / "run"
    args = ["--set", "contexts.size=4", "--set", "per_unit=1", "--executor", "inline"]
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", out, *args)
    assert r.returncode == 0, r.stderr
    before = ds.dataset(str(out / "contexts")).to_table().sort_by([("sentence_id", "ascending"), ("rank", "ascending")])
    (out / "_units" / "00001.json").unlink()  # as if stopped before unit 1's marker
    (out / "_COMPLETE").unlink()
    rel = lambda p: os.path.relpath(p, tmp_path)  # noqa: E731
    r = sentsim_cli("contexts", "--corpus", rel(speech_corpus), "--index", rel(index), "--sentences", "s.txt",
                    "--out", "run", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    after = ds.dataset(str(out / "contexts")).to_table().sort_by([("sentence_id", "ascending"), ("rank", "ascending")])
    assert after.equals(before) and json.loads((out / "manifest.json").read_text())["complete"]
    f.write_text("The Congress must act on the budget.\nTaxes were cut this year.\n")
    r = sentsim_cli("contexts", "--corpus", speech_corpus, "--index", index, "--sentences", f, "--out", out, *args)
    assert r.returncode == 2 and "fingerprint" in r.stderr and "Traceback" not in r.stderr


def test_a_run_of_format_1_resumes_under_the_fingerprint_it_holds(speech_corpus, index, tmp_path, monkeypatch):
    """Runs of format 1 were fingerprinted with their input paths as spelt and the number of sentences, not the
    sentences: such a run resumes under that fingerprint with its paths spelt otherwise; a later run holding
    it is another run, refused."""
    import os
    import shutil

    from run_support import as_fingerprinted

    from sentsim.config import load_config
    from sentsim.identity import fingerprint
    from sentsim.screening.contexts_job import STAGE, ContextsRun, ScreenConfig, screen_contexts
    from storage import StoreError
    from storage.store import FORMAT_VERSION

    f = tmp_path / "s.txt"
    f.write_text("The Congress must act on the budget.\nWe will defend our nation.\n")
    cfg = load_config(ScreenConfig, None, ["contexts.size=4", "per_unit=1"], corpus=str(speech_corpus),
                      index=str(index), sentences=str(f), out=str(tmp_path / "run"))
    screen_contexts(cfg, executor="inline", quiet=True)
    run = ContextsRun(cfg)
    # a format 1 run's fingerprint, as that sentsim computed it (keys added since, such as contexts.pool_size, are
    # left out of the config's semantic part unless in use, so they were never in it)
    sem = cfg.model_dump(exclude={"out": True, "resources": True,
                                  "contexts": {"rep_cache", "pool_size", "pool_draw", "rerank_shortlist",
                                               "random_full_windows", "exclude_in_partner_contexts"}})
    before = fingerprint(STAGE, sem, run.corpus.fingerprint, run.models, len(run.ids))
    assert before != run.fp

    def as_format(src, name, version):  # as stopped before unit 1's marker
        dst = as_fingerprinted(shutil.copytree(src, tmp_path / name), before, run_format=version)
        (dst / "_units" / "00001.json").unlink()
        return dst

    old, later = as_format(tmp_path / "run", "old", 1), as_format(tmp_path / "run", "later", FORMAT_VERSION)
    monkeypatch.chdir(tmp_path)
    respelt = dict(corpus=os.path.relpath(speech_corpus), index=os.path.relpath(index), sentences="s.txt")
    m = screen_contexts(cfg.model_copy(update=dict(respelt, out="old")), executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == before and m["this_run"]["units"] == 1
    key = [("sentence_id", "ascending"), ("rank", "ascending")]
    assert ds.dataset(str(old / "contexts")).to_table().sort_by(key).equals(
        ds.dataset(str(tmp_path / "run" / "contexts")).to_table().sort_by(key))
    with pytest.raises(StoreError, match=f"written with fingerprint {before}"):
        screen_contexts(cfg.model_copy(update=dict(respelt, out=str(later))), executor="inline", quiet=True)
