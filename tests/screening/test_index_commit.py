"""A rebuilt index is committed whole (issue 37): a build killed at any point leaves the index there
usable, the next build cleans up after it, and a job that searches a damaged index says so at its start
in one line (exit 2) instead of failing when its first unit searches."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, sentsim_cli

from sentsim.errors import UsageError
from sentsim.retrieval import IndexConfig, build_index, open_retriever
from sentsim.retrieval.base import check_index

QUERIES = ["the people of the United States", "We hold these truths to be self-evident", "the war in Europe"]

# The build in a child process, SIGKILLed at one point of the commit: `when` picks it.
KILLED_BUILD = """
import os, signal, sys
from sentsim.retrieval import IndexConfig, build_index
from sentsim.retrieval import index_store
from storage import fs as sfs
corpus, out, when = sys.argv[1:4]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
write = sfs.write_bytes_atomic
def patched(fs, path, data):
    if when == "mid-shards" and "shard-00001/" in path:
        die()
    if when == "before-manifest" and path.endswith("/index.json"):
        die()
    write(fs, path, data)
sfs.write_bytes_atomic = patched
if when == "before-cleanup":
    index_store.IndexWriter._remove_earlier_builds = lambda self: die()
build_index(corpus, out, IndexConfig(n_shards=3, ngrams="unigram+bigram"))
"""


def _search(index) -> np.ndarray:
    return open_retriever(index).search(QUERIES, 20)[0]


@pytest.fixture(scope="module")
def old_and_new(speech_corpus, tmp_path_factory):
    """The results of the index before (2 shards, bigrams) and after (3 shards, unigrams too) a rebuild."""
    root = tmp_path_factory.mktemp("index_commit")
    build_index(speech_corpus, root / "old", IndexConfig(n_shards=2))
    build_index(speech_corpus, root / "new", IndexConfig(n_shards=3, ngrams="unigram+bigram"))
    old, new = _search(root / "old"), _search(root / "new")
    assert not np.array_equal(old, new)  # the two are told apart by their hits
    return root / "old", old, new


@pytest.mark.parametrize("when", ["mid-shards", "before-manifest", "before-cleanup"])
def test_a_killed_rebuild_leaves_a_whole_index_and_the_next_build_cleans_up(speech_corpus, old_and_new, tmp_path,
                                                                             when):
    old_dir, old_hits, new_hits = old_and_new
    index = tmp_path / "index"
    shutil.copytree(old_dir, index)
    r = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(speech_corpus), str(index), when],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    builds = sorted(p.name for p in index.glob("build-*"))
    assert len(builds) == 2  # the old build's folder and the killed one's
    man = check_index(index, corpus=speech_corpus)  # every file index.json names is there, at its size
    committed = when == "before-cleanup"
    assert len(man["shards"]) == (3 if committed else 2)
    np.testing.assert_array_equal(_search(index), new_hits if committed else old_hits)
    # the same command again (a build of another config over a whole index is a --force-new one): built,
    # committed, and only its own build folder is left
    r = sentsim_cli("index", "build", "--corpus", speech_corpus, "--out", index, "--shards", "3",
                    "--set", "ngrams=unigram+bigram", "--force-new")
    assert r.returncode == 0, r.stderr[-2000:]
    man = json.loads((index / "index.json").read_text())
    left = sorted(p.name for p in index.iterdir())
    assert left == sorted(["index.json", man["vocab"].split("/")[0]]), left
    np.testing.assert_array_equal(_search(index), new_hits)


def as_written_before_build_folders(index: Path) -> None:
    """Rewrite an index into the layout of sentsim before build folders: its files at the top, index.json
    without file list (what an older sentsim wrote, and rewrote in place)."""
    man = json.loads((index / "index.json").read_text())
    build = man["vocab"].split("/")[0]
    for p in (index / build).iterdir():
        p.rename(index / p.name)
    (index / build).rmdir()
    for k in ("files", "vocab", "idf"):
        man.pop(k)
    for s in man["shards"]:
        s["path"] = s["path"].split("/")[-1]
    (index / "index.json").write_text(json.dumps(man))


def test_an_index_of_the_earlier_layout_is_read_and_replaced(speech_corpus, old_and_new, tmp_path):
    old_dir, old_hits, new_hits = old_and_new
    index = tmp_path / "index"
    shutil.copytree(old_dir, index)
    as_written_before_build_folders(index)
    assert {p.name for p in index.iterdir()} == {"index.json", "vocab.json", "idf.npy", "shard-00000", "shard-00001"}
    check_index(index, corpus=speech_corpus)
    np.testing.assert_array_equal(_search(index), old_hits)
    (index / "notes.txt").write_text("mine")  # not the build's: left alone
    build_index(speech_corpus, index, IndexConfig(n_shards=3, ngrams="unigram+bigram"))
    assert sorted(p.name for p in index.iterdir() if not p.name.startswith("build-")) == ["index.json", "notes.txt"]
    np.testing.assert_array_equal(_search(index), new_hits)


def test_a_damaged_index_is_named_when_a_job_starts(speech_corpus, old_and_new, tmp_path):
    """What a killed in-place build of an older sentsim left (index.json over deleted shards), a file of
    the new layout gone or cut short, an index of another corpus: `sentsim harvest` and `sentsim contexts`
    exit 2 with one line before they load a model or start Ray."""
    old_dir, _, _ = old_and_new
    legacy, current, short = tmp_path / "legacy", tmp_path / "current", tmp_path / "short"
    for d in (legacy, current, short):
        shutil.copytree(old_dir, d)
    as_written_before_build_folders(legacy)
    shutil.rmtree(legacy / "shard-00001")
    man = json.loads((current / "index.json").read_text())
    os.unlink(current / man["shards"][1]["path"] / "matrix.npz")
    with open(short / man["idf"], "r+b") as f:  # the copies keep the build folder's name
        f.truncate(10)
    other = tmp_path / "other_corpus"
    from sentsim.corpus_job import build_corpus

    src = tmp_path / "doc.jsonl"
    src.write_text(json.dumps({"id": "a", "paragraphs": ["The red fox ran far. The red fox slept."]}) + "\n")
    build_corpus([str(src)], str(other), executor="inline", quiet=True)
    cases = [(legacy, speech_corpus, "shard-00001/matrix.npz is missing"),
             (current, speech_corpus, "shard-00001/matrix.npz is missing"),
             (short, speech_corpus, "idf.npy has 10 bytes"),
             (old_dir, other, "was built for corpus")]
    for index, corpus, expected in cases:
        with pytest.raises(UsageError, match=expected.replace("(", r"\(")):
            check_index(index, corpus=corpus)
        for cmd in (("harvest", "--context-models", tmp_path / "no-model"),
                    ("contexts", "--set", "sample=4")):
            r = sentsim_cli(*cmd, "--corpus", corpus, "--index", index, "--out", tmp_path / "out", timeout=300)
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and expected in lines[0], lines
            if "damaged" in lines[0]:
                assert "rebuild it with `sentsim index build`" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything was written


def index_files(index: Path) -> dict:
    """relative path -> (mtime_ns, bytes) of every file of the index, index.json included."""
    return {str(f.relative_to(index)): (f.stat().st_mtime_ns, f.read_bytes()) for f in sorted(index.rglob("*"))
            if f.is_file()}


def test_a_rerun_is_a_noop_and_another_config_or_corpus_needs_force_new(speech_corpus, old_and_new, tmp_path):
    """`sentsim index build` into the index it built, with the same corpus and config: one line, and not a
    file rewritten. Another config (or corpus) is refused in one line, the index untouched, as every command
    refuses a run of other settings at its --out; with --force-new it builds and commits a new index there."""
    old_dir, old_hits, new_hits = old_and_new
    index = tmp_path / "index"
    shutil.copytree(old_dir, index)  # built with n_shards=2 and the default config
    before, fp = index_files(index), json.loads((index / "index.json").read_text())["fingerprint"]
    r = sentsim_cli("index", "build", "--corpus", speech_corpus, "--out", index, "--shards", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == [f"--out {index} already holds this finished index (fingerprint {fp}); "
                                             "nothing to do (another config or corpus needs --force-new)"], r.stdout
    assert index_files(index) == before
    argv = ("index", "build", "--corpus", speech_corpus, "--out", index, "--shards", "3",
            "--set", "ngrams=unigram+bigram")
    r = sentsim_cli(*argv)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"sentsim: error: --out {index} holds an index built for another config (index fingerprint {fp}); give another "
        "--out, or --force-new to replace it"), r.stderr[-2000:]
    assert index_files(index) == before
    r = sentsim_cli(*argv, "--force-new")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    man = json.loads((index / "index.json").read_text())
    assert summary["n_shards"] == 3 and man["fingerprint"] != fp and man["config"]["ngrams"] == "unigram+bigram"
    assert sorted(p.name for p in index.iterdir()) == sorted(["index.json", man["vocab"].split("/")[0]])
    np.testing.assert_array_equal(_search(index), new_hits)
    from sentsim.corpus_job import build_corpus

    src, other = tmp_path / "doc.jsonl", tmp_path / "other_corpus"
    src.write_text(json.dumps({"id": "a", "paragraphs": ["The red fox ran far. The red fox slept."]}) + "\n")
    build_corpus([str(src)], str(other), executor="inline", quiet=True)
    argv = ("index", "build", "--corpus", other, "--out", index, "--shards", "3", "--set", "ngrams=unigram+bigram")
    r = sentsim_cli(*argv)
    # named by corpus fingerprints, the ones a harvest's refusal of an index of another corpus names
    from sentsim.identity import corpus_fingerprint

    built_for = f"'{corpus_fingerprint(speech_corpus)}', not this corpus's '{corpus_fingerprint(other)}'"
    assert r.returncode == 2 and f"holds an index built for another corpus ({built_for})" in r.stderr, r.stderr[-2000:]
    r = sentsim_cli(*argv, "--force-new")
    assert r.returncode == 0 and "already holds" not in r.stdout, r.stderr[-2000:]
    check_index(index, corpus=other)


def test_a_damaged_index_is_built_again_by_the_same_command(speech_corpus, old_and_new, tmp_path):
    """The same corpus and config over an index with a file cut short is no rerun: it builds the index anew."""
    old_dir, old_hits, _ = old_and_new
    index = tmp_path / "index"
    shutil.copytree(old_dir, index)
    man = json.loads((index / "index.json").read_text())
    with open(index / man["idf"], "r+b") as f:
        f.truncate(10)
    r = sentsim_cli("index", "build", "--corpus", speech_corpus, "--out", index, "--shards", "2")
    assert r.returncode == 0 and "already holds" not in r.stdout, r.stderr[-2000:]
    rebuilt = check_index(index, corpus=speech_corpus)
    assert rebuilt["fingerprint"] == man["fingerprint"] and rebuilt["vocab"] != man["vocab"]
    np.testing.assert_array_equal(_search(index), old_hits)
