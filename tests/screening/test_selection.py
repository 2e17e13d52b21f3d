"""Candidate expansion, head-only scoring and the greedy diverse selection of C_s (paper 003 §3.3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from corpus.documents import doc_key_of
from corpus.view import ChunkTable, SentenceTable
from sentsim.errors import UsageError
from sentsim.screening import (
    ContextCache,
    ContextSetConfig,
    expand_candidates,
    jaccard,
    score_candidates,
    select_diverse,
    word_set,
)


@pytest.fixture(scope="module")
def tables(speech_corpus):
    return SentenceTable.load(speech_corpus), ChunkTable.load(speech_corpus)


def check_selection(sel, scores, chunk_ids, prev_tokens, size, max_jaccard, tiebreak=None):
    """Independent check of every rule: size, one context per chunk, pairwise Jaccard of the
    (i-1)-th sentences below the threshold, best-first order, and greedy maximality."""
    sel = list(sel)
    assert len(sel) <= size and len(set(sel)) == len(sel)
    chosen_chunks = [chunk_ids[i] for i in sel]
    assert len(set(chosen_chunks)) == len(chosen_chunks), "a chunk contributed two contexts"
    for a, b in itertools.combinations(sel, 2):
        assert jaccard(prev_tokens[a], prev_tokens[b]) < max_jaccard
    s = np.asarray(scores)[sel]
    assert np.all(np.diff(s) <= 0), "not best-first"
    # maximality: anything better than the last chosen and not chosen broke a rule
    if len(sel) == size:
        return
    chosen = set(sel)
    for i in range(len(scores)):
        if i in chosen or np.isnan(scores[i]):
            continue
        earlier = [j for j in sel if (scores[j], 0 if tiebreak is None else tiebreak[j])
                   >= (scores[i], 0 if tiebreak is None else tiebreak[i])]
        broke = any(chunk_ids[j] == chunk_ids[i] for j in earlier) or any(
            jaccard(prev_tokens[j], prev_tokens[i]) >= max_jaccard for j in earlier)
        assert broke, f"candidate {i} was skipped without a reason"


def test_diversity_rules_hold_on_every_selected_set(tables):
    st, ch = tables
    cands = expand_candidates(ch.chunk_ids, np.ones(len(ch), np.float32), ch, st.ids, window=1)
    prev = [word_set(st.texts[p]) for p in st.positions(cands.prev_id)]
    rng = np.random.default_rng(0)
    for trial in range(6):
        m = int(rng.integers(50, len(cands)))
        idx = rng.choice(len(cands), m, replace=False)
        scores = rng.normal(size=m)
        size = int(rng.choice([5, 40, 500]))
        thr = float(rng.choice([0.2, 0.5]))
        sel = select_diverse(scores, cands.chunk_id[idx], [prev[i] for i in idx], size=size, max_jaccard=thr)
        check_selection(sel, scores, cands.chunk_id[idx], [prev[i] for i in idx], size, thr)
        assert len(sel) > 0


def test_near_duplicate_previous_sentences_are_rejected():
    base = "the congress must act now on the budget".split()
    prev = [frozenset(base), frozenset(base[:-1] + ["deficit"]), frozenset(base), frozenset(["peace", "and", "war"]),
            frozenset(), frozenset(), frozenset(["the", "congress"])]
    chunk = np.array([1, 2, 3, 4, 5, 6, 1])
    scores = np.array([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 10.0])
    sel = select_diverse(scores, chunk, prev, size=10, max_jaccard=0.5)
    # 6 (best, chunk 1) blocks 0 (same chunk); 1 vs 6: 2/9 < .5 -> kept;
    # 2 duplicates 1? J(base, base-1+1)=7/9 -> rejected;
    # 3 kept; 4 (empty) kept once, 5 (empty again, J=1) rejected
    assert sel.tolist() == [6, 1, 3, 4]
    check_selection(sel, scores, chunk, prev, 10, 0.5)
    # without the per-chunk rule, the chunk-1 candidate 0 competes on Jaccard only (J(base, {the, congress}) = 2/8)
    sel2 = select_diverse(scores, chunk, prev, size=10, max_jaccard=0.5, one_per_chunk=False)
    assert sel2.tolist()[:2] == [6, 0]
    # size, NaN scores and tiebreak
    assert select_diverse(scores, chunk, prev, size=2).tolist() == [6, 1]
    assert select_diverse(np.array([np.nan, 1.0]), np.array([1, 2]), [{"a"}, {"b"}]).tolist() == [1]
    assert select_diverse(np.array([1.0, 1.0]), np.array([1, 2]), [{"a"}, {"b"}],
                          tiebreak=np.array([0.1, 0.9])).tolist() == [1, 0]
    assert select_diverse(np.array([]), np.array([]), [], size=5).tolist() == []


def test_selection_rejects_inconsistent_inputs():
    with pytest.raises(UsageError):
        select_diverse(np.ones(3), np.arange(2), [set()] * 3)
    with pytest.raises(UsageError):
        select_diverse(np.ones(1), np.arange(1), [set()], max_jaccard=0.0)


def test_candidate_expansion_edges(tables):
    st, ch = tables
    doc0 = st.ids[doc_key_of(st.ids) == doc_key_of(st.ids[0])]
    first_chunk = int(ch.chunk_ids[0])
    c = expand_candidates([first_chunk, -1, -1], [0.7, 0.0, 0.0], ch, st.ids, window=1)
    # slot 0 is the first sentence of the document: no left context, dropped
    assert c.slot.tolist() == list(range(1, int(ch.n[0])))
    assert c.dropped["edge_slots"] == 1
    assert np.all(c.left_ids[:, 0] == c.centre_id - 1) and np.all(c.right_ids[:, 0] == c.centre_id + 1)
    assert np.all(c.retrieval_score == np.float32(0.7))
    # the last chunk of the document loses its last slot
    last_row = int(np.flatnonzero(ch.first + ch.n - 1 == doc0[-1])[0])
    c = expand_candidates([ch.chunk_ids[last_row]], [1.0], ch, st.ids, window=2)
    assert c.dropped["edge_slots"] == 2 and np.all(c.right_ids[:, -1] <= doc0[-1])
    assert c.left_ids.shape[1] == 2
    # a one-sentence chunk in the middle of a document still yields its context (from the document)
    mid = int(doc0[len(doc0) // 2])
    tiny = ChunkTable(np.array([99]), np.array([mid]), np.array([1]))
    c = expand_candidates([99], [1.0], tiny, st.ids, window=2)
    assert c.centre_id.tolist() == [mid] and c.left_ids.tolist() == [[mid - 2, mid - 1]]
    # a document shorter than the window gives nothing, with the shortfall counted; unknown chunks are counted
    short = ChunkTable(np.array([5]), np.array([doc0[0]]), np.array([2]))
    c = expand_candidates([5, 6], [1.0, 1.0], short, doc0[:2], window=1)
    assert len(c) == 0 and c.dropped == {"edge_slots": 2, "unknown_chunks": 1}


@pytest.fixture(scope="module")
def screening_parts(speech_corpus, tmp_path_factory):
    """An untrained (seeded) discriminator, its rep cache built and read back as the jobs do (`sentsim cache
    build` into the shard store, ContextCache.from_store), and the corpus's index."""
    from run_support import save_untrained_discriminator

    from sentsim.discriminator import Discriminator
    from sentsim.retrieval import build_index
    from sentsim.screening.cache_job import RepCacheConfig, build_rep_cache

    tmp = tmp_path_factory.mktemp("screening")
    disc_dir = save_untrained_discriminator(speech_corpus, tmp / "disc")
    build_rep_cache(RepCacheConfig(corpus=str(speech_corpus), discriminator=str(disc_dir), out=str(tmp / "cache")),
                    executor="inline", quiet=True)
    build_index(speech_corpus, tmp / "idx")
    disc = Discriminator.load(disc_dir, corpus=speech_corpus)
    return disc, ContextCache.from_store(str(tmp / "cache"), disc), tmp / "idx"


def test_screening_scores_and_selects_per_sentence(speech_corpus, tables, screening_parts):
    st, ch = tables
    disc, cache, idx = screening_parts
    # head-only scores for the same candidates differ between sentences, and so do their rankings
    cands = expand_candidates(ch.chunk_ids[:60], np.ones(60, np.float32), ch, cache.sentence_ids, disc.window)
    feats = disc.project_sentences(disc.encode([st.texts[10], "Our farmers need water and fair prices."]))
    a = score_candidates(disc, cache, feats[0:1], cands)
    b = score_candidates(disc, cache, feats[1:2], cands)
    assert a.shape == (len(cands),) and not np.allclose(a, b)
    assert not np.array_equal(np.argsort(-a)[:20], np.argsort(-b)[:20])
    # head-only scoring from the cache equals the full model on the same windows
    left = disc.encode([st.texts[p] for p in st.positions(cands.left_ids[:5, 0])])[:, None, :]
    right = disc.encode([st.texts[p] for p in st.positions(cands.right_ids[:5, 0])])[:, None, :]
    full = disc.score(left, disc.encode([st.texts[10]])[0], right)
    np.testing.assert_allclose(full, a[:5], rtol=1e-4, atol=1e-4)
    # and the fast decomposed path equals the head applied to materialised features
    ctx = cache.context_features(cands.centre_id, cands.left_ids, cands.right_ids)
    np.testing.assert_allclose(disc.score_projected(ctx, feats[0:1]), a, rtol=1e-4, atol=1e-4)

    # the shipped screening (the harvest's and `sentsim contexts`' ContextSource) on real queries
    source = _source(speech_corpus, idx, disc, cache, ContextSetConfig(size=30, retrieve_chunks=300))
    queries = [st.texts[200], st.texts[1500], "", "?!", "zzqx blorp"]
    results = source.context_sets(queries)
    for q, res in zip(queries[:2], results[:2]):
        centres = [c.centre_id for c in res.contexts]
        assert len(centres) == 30 and res.shortfall_reason is None
        assert len({c.chunk_id for c in res.contexts}) == 30
        prev = [word_set(st.text(int(i) - 1)) for i in centres]
        for x, y in itertools.combinations(prev, 2):
            assert jaccard(x, y) < 0.5
        assert np.all(np.diff([c.log_p_disc for c in res.contexts]) <= 0)
        assert q not in [st.text(int(i)) for i in centres]  # its own slot is excluded
    assert [c.chunk_id for c in results[0].contexts] != [c.chunk_id for c in results[1].contexts]
    for res, note in zip(results[2:], ["empty sentence", "empty sentence", "no retrieved chunk"]):
        assert res.contexts == [] and res.shortfall_reason.startswith(note)


def test_query_centre_exclusion_is_a_setting(speech_corpus, tables, screening_parts):
    """With exclude_query_centre off, a corpus sentence may be offered its own slot; on (the
    default), never: the same retrieval, the same scores, one candidate fewer. exclude_query_window (the
    default) drops the slots beside it too, whose windows hold it."""
    st, _ = tables
    disc, cache, idx = screening_parts
    q = st.texts[200]
    on = _source(speech_corpus, idx, disc, cache, ContextSetConfig(size=500, retrieve_chunks=300))
    off = _source(speech_corpus, idx, disc, cache,
                  ContextSetConfig(size=500, retrieve_chunks=300, exclude_query_centre=False,
                                   exclude_query_window=False))
    only_centre = _source(speech_corpus, idx, disc, cache, ContextSetConfig(size=500, retrieve_chunks=300,
                                                                           exclude_query_window=False))
    a, b = only_centre.context_sets([q])[0], off.context_sets([q])[0]
    # the query's chunk is retrieved, so its own slot is a candidate unless excluded (one slot)
    assert b.candidates - a.candidates == 1
    assert all(st.text(c.centre_id).strip() != q.strip() for c in a.contexts)
    # and with exclude_query_window (the default) nor the slots whose window holds it, which the
    # discriminator's coherence terms rank first: in no context of C_s is the query c< or c>
    held = [c for c in a.contexts if q.strip() in [t.strip() for t in (*c.left, *c.right)]]
    assert held, "the case this guards against: without the rule a window holding the query is chosen"
    w = on.context_sets([q])[0]
    w_disc = on.expand_window
    assert a.candidates - w.candidates == 2 * w_disc  # the slots beside it, w a side
    assert all(q.strip() not in [t.strip() for t in (*c.left, *c.right)] and st.text(c.centre_id).strip() != q.strip()
               for c in w.contexts)


def test_screened_sets_equal_the_eager_selection(speech_corpus, tables, screening_parts):
    """ContextSource builds a candidate's Context and word set only when the greedy selection looks at
    it; the sets must be those of building every candidate first, with and without a discriminator."""
    st, ch = tables
    disc, cache, idx = screening_parts
    cfg = ContextSetConfig(size=12, retrieve_chunks=300, jaccard=0.1)  # strict: the word sets decide often
    queries = [st.texts[200], st.texts[1500], "Our farmers need water and fair prices."]
    for d, c in ((disc, cache), (None, None)):
        source = _source(speech_corpus, idx, d, c, cfg)
        ids, scores = source.retriever.search(queries, cfg.retrieve_chunks)
        feats = d.project_sentences(d.encode(queries)) if d is not None else None
        for i, (q, got) in enumerate(zip(queries, source.context_sets(queries))):
            cands = expand_candidates(ids[i], scores[i], ch, cache.sentence_ids, disc.window if d else 1)
            w = disc.window if d else 1  # no candidate whose window (its centre, w a side) holds the query
            keep = [j for j in range(len(cands))
                    if all(st.text(int(cands.centre_id[j]) + k).strip() != q.strip() for k in range(-w, w + 1))]
            primary = (source._log_p(feats[i:i + 1], cands.centre_id[keep]) if d is not None
                       else cands.retrieval_score[keep])
            prev = [word_set(st.text(int(cands.left_ids[j, -1]))) for j in keep]
            picked = select_diverse(primary, cands.chunk_id[keep], prev, size=cfg.size, max_jaccard=cfg.jaccard,
                                    tiebreak=cands.retrieval_score[keep])
            want = [int(cands.centre_id[keep[j]]) for j in picked]
            assert [x.centre_id for x in got.contexts] == want and got.candidates == len(keep) > len(want) > 0
            for x in got.contexts:  # the context models' one sentence on each side of the slot
                assert (x.left, x.right) == ([st.text(x.centre_id - 1)], [st.text(x.centre_id + 1)])
            if d is not None:
                np.testing.assert_allclose([x.log_p_disc for x in got.contexts], primary[picked])
            else:
                assert all(x.log_p_disc is None for x in got.contexts)


def _source(corpus, idx, disc, cache, cfg):
    from corpus.view import CorpusIndex
    from sentsim.retrieval import open_retriever
    from sentsim.screening.contexts import ContextSource

    return ContextSource(CorpusIndex(str(corpus)), cfg, window=1, seed=0, retriever=open_retriever(idx),
                         discriminator=disc, cache=cache)


def test_screening_refuses_mixed_corpora(speech_corpus, screening_parts):
    from corpus.view import CorpusIndex
    from sentsim.retrieval import open_retriever
    from sentsim.screening.contexts import ContextSource

    disc, cache, idx = screening_parts
    r = open_retriever(idx)
    r.corpus_fingerprint = "someone-else"
    with pytest.raises(UsageError, match="index was made for another corpus"):
        ContextSource(CorpusIndex(str(speech_corpus)), ContextSetConfig(), window=1, seed=0, retriever=r,
                      discriminator=disc, cache=cache)
