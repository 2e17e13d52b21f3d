"""The discriminator's representation cache as a shard-store run (003 §3.3): it reads back with
pyarrow, equals the in-memory cache, resumes after a partial build, refuses other models and
corpora, and screening through it selects the same context sets as full-head scoring."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from conftest import sentsim_cli
from harvest_support import build_index_for
from run_support import save_untrained_discriminator

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def parts(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("repcache")
    return {"root": root, "disc": save_untrained_discriminator(speech_corpus, root / "disc"),
            "other_disc": save_untrained_discriminator(speech_corpus, root / "disc2", seed=1)}


@pytest.fixture(scope="module")
def built(speech_corpus, parts):
    """The cache built by the real command, in units of ~1000 sentences of whole documents; its process on
    3 torch threads, a count no Ray actor here has (the rows must not depend on it)."""
    out = parts["root"] / "cache"
    r = sentsim_cli("cache", "build", "--corpus", speech_corpus, "--discriminator", parts["disc"], "--out", out,
                    "--executor", "inline", "--set", "sentences_per_unit=1000", env={"OMP_NUM_THREADS": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("rep cache: ") and "-> " in r.stdout
    return out


def _tables(out):
    reps = ds.dataset(str(out / "reps")).to_table().sort_by("sentence_id")
    centres = ds.dataset(str(out / "centres")).to_table().sort_by("centre_id")
    return reps, centres


def test_store_cache_reads_back_and_equals_the_in_memory_build(speech_corpus, parts, built):
    from corpus.documents import doc_key_of
    from corpus.view import SentenceTable
    from sentsim.discriminator import Discriminator
    from sentsim.screening import ContextCache
    from storage import verify_store

    m = json.loads((built / "manifest.json").read_text())
    assert m["complete"] and m["stage"] == "rep_cache" and m["planned_units"] >= 3
    assert verify_store(str(built)) == []
    st = SentenceTable.load(speech_corpus)
    reps, centres = _tables(built)
    # plain pyarrow: fixed-size float32 lists, one row per corpus sentence / window centre
    assert reps.schema.field("unit_rep").type == pa.list_(pa.float32(), 32)
    assert centres.schema.field("core").type == pa.list_(pa.float32(), 33)
    assert np.array_equal(reps.column("sentence_id").to_numpy(), st.ids)
    # units hold whole documents: no document is split between two shards
    doc_units = {}
    for part in sorted((built / "reps").glob("part-*.parquet")):
        docs = set(doc_key_of(ds.dataset(str(part)).to_table().column("sentence_id").to_numpy()).tolist())
        for d in docs:
            assert d not in doc_units, f"document {d} in {doc_units.get(d)} and {part.name}"
            doc_units[d] = part.name

    disc = Discriminator.load(parts["disc"], corpus=speech_corpus)
    got = ContextCache.from_store(str(built), disc)
    want = ContextCache.build(disc, st)
    assert np.array_equal(got.sentence_ids, want.sentence_ids) and np.all(np.diff(got.sentence_ids) > 0)
    assert np.array_equal(got.centre_ids, want.centre_ids)
    np.testing.assert_allclose(got.unit_reps, want.unit_reps, atol=1e-5)
    np.testing.assert_allclose(got.core, want.core, atol=1e-5)
    np.testing.assert_allclose(got.side_norms, want.side_norms, atol=1e-5)
    assert got.window == 1 and got.meta["n_centres"] == len(want.centre_ids) == m["counts"]["centres"]


def test_partial_build_resumes_to_the_same_tables(speech_corpus, parts, built, tmp_path):
    from sentsim.errors import UsageError
    from sentsim.screening import ContextCache
    from sentsim.screening.cache_job import RepCacheConfig, build_rep_cache

    copy = tmp_path / "cache"
    shutil.copytree(built, copy)
    (copy / "_units" / "00001.json").unlink()  # as if killed before unit 1's marker
    shard = copy / "centres" / "part-00002.parquet"
    shard.write_bytes(shard.read_bytes()[:40])  # and a torn shard of unit 2
    (copy / "_COMPLETE").unlink()
    with pytest.raises(UsageError, match="incomplete"):
        ContextCache.from_store(str(copy))
    kept = json.loads((copy / "_units" / "00000.json").read_text())
    # resumed in a process of another thread count: the same run, and the same bits, since a unit is encoded
    # on one thread wherever it runs
    cfg = RepCacheConfig(corpus=str(speech_corpus), discriminator=str(parts["disc"]), out=str(copy),
                         sentences_per_unit=1000)
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        m = build_rep_cache(cfg, executor="inline", quiet=True)
        assert torch.get_num_threads() == 3  # the process's count is its own
    finally:  # give the tests after this one what they had
        torch.set_num_threads(before)
    assert m["complete"]
    assert json.loads((copy / "_units" / "00000.json").read_text()) == kept  # done units were not redone
    for a, b in zip(_tables(copy), _tables(built)):
        assert a.equals(b)


def test_cache_for_another_discriminator_or_corpus_is_refused(speech_corpus, parts, built, tmp_path):
    from sentsim.corpus_job import build_corpus
    from sentsim.discriminator import Discriminator
    from sentsim.errors import UsageError
    from sentsim.identity import cache_identity, corpus_fingerprint
    from sentsim.screening import ContextCache
    from sentsim.screening.cache_job import check_rep_cache

    # another discriminator into the same run directory: one line, exit 2, no traceback
    r = sentsim_cli("cache", "build", "--corpus", speech_corpus, "--discriminator", parts["other_disc"],
                    "--out", built, "--executor", "inline", "--set", "sentences_per_unit=1000")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "another corpus or discriminator" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    other = Discriminator.load(parts["other_disc"], corpus=speech_corpus)
    with pytest.raises(UsageError, match="another discriminator or corpus"):
        ContextCache.from_store(str(built), other)
    with pytest.raises(UsageError, match="another corpus or discriminator"):
        check_rep_cache(str(built), cache_identity(corpus_fingerprint(speech_corpus), str(parts["other_disc"])))
    check_rep_cache(str(built), cache_identity(corpus_fingerprint(speech_corpus), str(parts["disc"])))

    # another corpus: its discriminator cannot cache this corpus, nor read this corpus's cache
    src = tmp_path / "small.jsonl.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"d{i}", "paragraphs": [
                f"Document {i} starts here. It has a second sentence. "
                "A third one follows. And a fourth ends it."]}) + "\n")
    small = tmp_path / "small"
    build_corpus([str(src)], str(small), executor="inline", quiet=True)
    small_disc = save_untrained_discriminator(small, tmp_path / "small_disc")
    r = sentsim_cli("cache", "build", "--corpus", speech_corpus, "--discriminator", small_disc,
                    "--out", tmp_path / "c2", "--executor", "inline")
    assert r.returncode == 2 and "built for corpus" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(UsageError, match="another discriminator or corpus"):
        ContextCache.from_store(str(built), Discriminator.load(small_disc))


def test_ray_actor_pool_build_equals_inline(speech_corpus, parts, built, tmp_path, ray_local):
    """The same bits whatever the executor: `built` ran inline on torch's default threads (every core), a
    Ray actor has its one CPU's (OMP_NUM_THREADS=1); each unit is encoded on one thread in both."""
    from sentsim.screening.cache_job import RepCacheConfig, build_rep_cache

    cfg = RepCacheConfig(corpus=str(speech_corpus), discriminator=str(parts["disc"]), out=str(tmp_path / "c"),
                         sentences_per_unit=1000)
    m = build_rep_cache(cfg, executor="ray", quiet=True)
    assert m["complete"] and m["fingerprint"] == json.loads((built / "manifest.json").read_text())["fingerprint"]
    for a, b in zip(_tables(tmp_path / "c"), _tables(built)):
        assert a.equals(b)


def _reference_context_sets(corpus, retriever, disc, texts, size, chunks):
    """C_s as before the cache: every candidate window encoded afresh and scored by the full head."""
    from sentsim.screening import expand_candidates, select_diverse, word_set
    from sentsim.screening.candidates import Candidates

    ids, scores = retriever.search(texts, chunks)
    out = []
    for i, text in enumerate(texts):
        c = expand_candidates(ids[i], scores[i], corpus.chunks, corpus.ids, 1)
        # no window holding the query, as its own slot or beside it (exclude_query_centre, exclude_query_window)
        keep = ~np.array([any((t or "").strip() == text.strip() for t in corpus.texts([int(x) - 1, int(x), int(x) + 1]))
                          for x in c.centre_id], dtype=bool)
        c = Candidates(c.chunk_id[keep], c.slot[keep], c.centre_id[keep], c.left_ids[keep], c.right_ids[keep],
                       c.retrieval_score[keep])
        if not len(c):
            out.append(([], []))
            continue
        left = disc.encode(corpus.texts(c.left_ids[:, 0].tolist()))[:, None]
        right = disc.encode(corpus.texts(c.right_ids[:, 0].tolist()))[:, None]
        logits = disc.score(left, disc.encode([text])[0], right)
        log_p = -np.logaddexp(0.0, -logits.astype(np.float64))
        prev = [word_set(t) for t in corpus.texts(c.left_ids[:, 0].tolist())]
        sel = select_diverse(log_p, c.chunk_id, prev, size=size, max_jaccard=0.5, one_per_chunk=True,
                             tiebreak=c.retrieval_score)
        out.append((c.centre_id[sel].tolist(), log_p[sel].tolist()))
    return out


def test_screening_through_the_store_cache_selects_the_same_context_sets(speech_corpus, parts, built, tmp_path):
    from corpus.view import CorpusIndex
    from sentsim.discriminator import Discriminator
    from sentsim.retrieval import open_retriever

    index = build_index_for(speech_corpus, tmp_path / "index")
    common = ["--corpus", speech_corpus, "--index", index, "--discriminator", parts["disc"], "--executor", "inline",
              "--set", "sample=12", "--set", "per_unit=6", "--set", "contexts.size=8",
              "--set", "contexts.retrieve_chunks=60"]
    # the job's own cache, built under <out>/rep_cache before screening
    own = tmp_path / "own"
    r = sentsim_cli("contexts", *common, "--out", own)
    assert r.returncode == 0, r.stderr
    assert json.loads((own / "rep_cache" / "manifest.json").read_text())["complete"]
    # a given cache (contexts.rep_cache): same rows, and nothing built under --out
    given = tmp_path / "given"
    r = sentsim_cli("contexts", *common, "--out", given, "--set", f"contexts.rep_cache={built}")
    assert r.returncode == 0, r.stderr
    assert not (given / "rep_cache").exists()
    key = [("sentence_id", "ascending"), ("rank", "ascending")]
    a = ds.dataset(str(own / "contexts")).to_table().sort_by(key)
    b = ds.dataset(str(given / "contexts")).to_table().sort_by(key)
    assert a.num_rows > 0 and a.equals(b)
    assert json.loads((own / "manifest.json").read_text())["fingerprint"] == \
        json.loads((given / "manifest.json").read_text())["fingerprint"]

    # the same sets as full-head scoring of freshly encoded windows (the pre-cache code path)
    corpus = CorpusIndex(str(speech_corpus))
    disc = Discriminator.load(parts["disc"], corpus=speech_corpus)
    q = ds.dataset(str(own / "queries")).to_table().sort_by("sentence_id").to_pandas()
    ref = _reference_context_sets(corpus, open_retriever(str(index)), disc, q.text.tolist(), 8, 60)
    df = a.to_pandas()
    for sid, (centres, log_p) in zip(q.sentence_id, ref):
        g = df[df.sentence_id == sid]
        assert g.centre_id.tolist() == centres
        np.testing.assert_allclose(g.log_p_disc.to_numpy(), log_p, atol=1e-4)

    # a given cache made with another discriminator, or no cache at all, is refused in one line before the run
    # folder is made (a manifest left there would refuse the next attempt as "another run")
    r = sentsim_cli("contexts", *common[:4], "--discriminator", parts["other_disc"], *common[6:],
                    "--out", tmp_path / "bad", "--set", f"contexts.rep_cache={built}")
    assert r.returncode == 2 and "another corpus or discriminator" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad").exists()
    (tmp_path / "not_a_cache").mkdir()
    r = sentsim_cli("contexts", *common, "--out", tmp_path / "bad", "--set",
                    f"contexts.rep_cache={tmp_path / 'not_a_cache'}")
    assert r.returncode == 2 and "not a representation cache" in r.stderr and not (tmp_path / "bad").exists()


def test_harvest_builds_the_cache_first_and_scores_from_it(speech_corpus, parts, built, tmp_path):
    """A harvest with a discriminator builds <out>/rep_cache before its pipeline; the cache's
    identity is in its fingerprint; every stored disc term (own and cross) equals log p(y=1|s,c)
    of the full head on freshly encoded reps."""
    from harvest_support import harvest_config, tiny_context_bundle

    from corpus.view import CorpusIndex
    from sentsim.discriminator import Discriminator
    from sentsim.harvest.job import harvest, model_hashes
    from sentsim.identity import cache_identity, corpus_fingerprint

    index = build_index_for(speech_corpus, tmp_path / "index")
    bundle = tiny_context_bundle(speech_corpus, tmp_path / "ctx")
    out = tmp_path / "h"
    cfg = harvest_config(speech_corpus, index, bundle, out, discriminator=str(parts["disc"]),
                         anchors={"n": 4, "per_unit": 2}, rank={"enabled": False})
    h = model_hashes(cfg)
    assert h["rep_cache"] == cache_identity(corpus_fingerprint(speech_corpus), str(parts["disc"]))
    assert (model_hashes(cfg.model_copy(update={"discriminator": str(parts["other_disc"])}))["rep_cache"]
            != h["rep_cache"])
    m = harvest(cfg, executor="inline", quiet=True)
    assert m["complete"]
    cache_m = json.loads((out / "rep_cache" / "manifest.json").read_text())
    assert cache_m["complete"] and cache_m["identity"] == h["rep_cache"]

    cs = ds.dataset(str(out / "context_scores")).to_table().to_pandas()
    sents = ds.dataset(str(out / "sentences")).to_table().to_pandas().set_index("sentence_id")
    assert cs.disc.notna().all() and len(cs) > 0
    corpus = CorpusIndex(str(speech_corpus))
    disc = Discriminator.load(parts["disc"], corpus=speech_corpus)
    rows = cs.iloc[:: max(1, len(cs) // 40)]
    text = sents.loc[rows.sentence_id, "text"].tolist()
    c = rows.context_id.to_numpy()
    left = disc.encode(corpus.texts((c - 1).tolist()))[:, None]
    right = disc.encode(corpus.texts((c + 1).tolist()))[:, None]
    logits = disc.score_projected(disc.project_contexts(left, right), disc.project_sentences(disc.encode(text)))
    np.testing.assert_allclose(rows.disc.to_numpy(), -np.logaddexp(0.0, -logits.astype(np.float64)), atol=1e-4)

    # a given cache gives the same harvest (same fingerprint: the path is not semantic)
    given = harvest(cfg.model_copy(update={"out": str(tmp_path / "h2"),
                                           "contexts": cfg.contexts.model_copy(update={"rep_cache": str(built)})}),
                    executor="inline", quiet=True)
    assert given["fingerprint"] == m["fingerprint"] and not (tmp_path / "h2" / "rep_cache").exists()
    key = [("pair_id", "ascending")]
    assert ds.dataset(str(tmp_path / "h2" / "pairs")).to_table().sort_by(key).equals(
        ds.dataset(str(out / "pairs")).to_table().sort_by(key))
    # the harvest's own cache with an unreadable manifest: --force-new rebuilds it (it names no identity to keep)
    (out / "rep_cache" / "manifest.json").write_text("{not json")
    again = harvest(cfg, executor="inline", quiet=True, force_new=True)
    assert again["complete"] and again["fingerprint"] == m["fingerprint"]
    assert json.loads((out / "rep_cache" / "manifest.json").read_text())["identity"] == h["rep_cache"]
    assert ds.dataset(str(out / "pairs")).to_table().sort_by(key).equals(
        ds.dataset(str(tmp_path / "h2" / "pairs")).to_table().sort_by(key))


def test_torch_threads_other_than_0_is_refused_in_one_line(tmp_path):
    """`torch_threads` never had an effect on a cache build (each unit is encoded on one thread, so that the cache
    is the same bits on every executor), so a value for it is refused in one line naming the key, before any
    input is read; a config that names it with 0 still loads."""
    from conftest import error_line

    from sentsim.config import load_config
    from sentsim.screening.cache_job import RepCacheConfig

    r = sentsim_cli("cache", "build", "--corpus", tmp_path / "c", "--discriminator", tmp_path / "d",
                    "--out", tmp_path / "o", "--executor", "inline", "--set", "torch_threads=2")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    line = error_line(r.stderr)
    assert "torch_threads: 2 would do nothing" in line and "one torch thread" in line, line
    assert not (tmp_path / "o").exists()
    old = tmp_path / "old.yaml"
    old.write_text("sentences_per_unit: 1000\ntorch_threads: 0\n")
    cfg = load_config(RepCacheConfig, str(old), [], corpus="c", discriminator="d", out="o")
    assert (cfg.torch_threads, cfg.sentences_per_unit) == (0, 1000)
