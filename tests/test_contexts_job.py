"""`sentsim contexts`: C_s per sentence as shards; diversity rules hold on every set; resumable."""

import json

import pyarrow.dataset as ds
import pytest
from conftest import sentsim_cli
from harvest_support import build_index_for


@pytest.fixture(scope="module")
def index(speech_corpus, tmp_path_factory):
    return build_index_for(speech_corpus, tmp_path_factory.mktemp("ctxjob") / "index")


def test_context_sets_obey_diversity_rules(speech_corpus, index, tmp_path):
    from sentsim.harvest.corpus_index import CorpusIndex

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


def test_external_sentences_and_shortfalls(speech_corpus, index, tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("The Congress must act on the budget.\t!!!\nqqxz zzvq\n")
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
