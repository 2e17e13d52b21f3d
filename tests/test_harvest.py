"""The harvest end to end on the sample corpus: rows, Eq. 4 against the scorer, resume, faults."""

import json
import shutil

import numpy as np
import pyarrow.dataset as ds
import pytest

from harvest_support import build_index_for, harvest_config, tiny_context_bundle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("harvest_inputs")
    return {
        "corpus": speech_corpus,
        "index": build_index_for(speech_corpus, root / "index"),
        "bundle": tiny_context_bundle(speech_corpus, root / "ctx"),
    }


def pairs_of(run):
    return ds.dataset(str(run / "pairs")).to_table().sort_by("pair_id")


@pytest.fixture(scope="module")
def inline_run(inputs, tmp_path_factory):
    from sentsim.harvest.job import harvest

    out = tmp_path_factory.mktemp("h") / "run"
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out)
    harvest(cfg, executor="inline", quiet=True)
    return cfg, out


def test_inline_harvest_rows(inline_run):
    cfg, out = inline_run
    t = pairs_of(out).to_pandas()
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] and m["completed_units"] == 4
    assert len(t) >= 8 and t.pair_id.is_unique
    assert set(t.kind) <= {"neighbour", "same-doc", "random"} and "random" in set(t.kind)
    assert set(t.split) <= {"train", "dev", "test"}
    scored = t[t.score.notna()]
    assert len(scored) > 0.8 * len(t)
    assert scored.score.between(-1, 1).all() and scored.score.std() > 0
    assert t.rank_sim.notna().all() and t.rank_sim.between(-1, 1).all()
    assert (t.n_ctx_s1 <= 6).all() and (t.n_ctx_s1 > 0).any()
    sents = ds.dataset(str(out / "sentences")).to_table().to_pandas()
    assert set(t.s1_id) | set(t.s2_id) <= set(sents.sentence_id)
    assert all(len(c) == 64 for c in sents.rank_codes)
    rep = json.loads((out / "report.json").read_text())
    assert rep["pairs"] == len(t) and (out / "report.png").stat().st_size > 10_000
    from storage import verify_store

    assert verify_store(str(out)) == []


def test_rank_anchors_are_stored_with_the_run(inline_run, tmp_path):
    """The anchor set behind the rank vectors travels with the run: students read it back even
    when the corpus is gone, and a corrupt anchor table is named by `store verify`."""
    from sentsim.errors import UsageError
    from sentsim.rank.targets import sample_anchors
    from sentsim.students.data import recover_anchors
    from storage import verify_store

    cfg, out = inline_run
    ids, texts = sample_anchors(cfg.corpus, cfg.rank.n_anchors, seed=cfg.seed + 1)
    stored = ds.dataset(str(out / "_side" / "rank_anchors.parquet")).to_table()
    assert stored.column("sentence_id").to_pylist() == ids.tolist() and stored.column("text").to_pylist() == texts
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["config"]["corpus"] = str(tmp_path / "moved-away")
    got_ids, got_texts = recover_anchors(m, copy)
    assert got_ids.tolist() == ids.tolist() and got_texts == texts
    side = copy / "_side" / "rank_anchors.parquet"
    side.write_bytes(side.read_bytes()[:-20] + b"x" * 20)
    assert verify_store(str(copy)) == ["_side/rank_anchors.parquet: checksum mismatch (edited or corrupt)"]
    with pytest.raises(UsageError, match="rank_anchors.parquet: checksum mismatch"):
        recover_anchors(m, copy)


def test_eq4_value_of_one_pair_matches_direct_computation(inline_run, inputs):
    """Recompute one pair's score from the scorer directly: Eq. 3 per (sentence, context), Eq. 4 over C_s1 + C_s2."""
    from sentsim.context.scorer import ContextItem, ContextScorer
    from sentsim.harvest.contexts import ContextSource
    from sentsim.harvest.corpus_index import CorpusIndex
    from sentsim.retrieval import open_retriever

    cfg, out = inline_run
    t = pairs_of(out).to_pandas()
    row = t[t.score.notna()].iloc[0]
    corpus = CorpusIndex(str(inputs["corpus"]))
    src = ContextSource(corpus, cfg.contexts, 1, cfg.seed, open_retriever(str(inputs["index"])), None)
    c1, c2 = src.context_sets([row.s1, row.s2])
    ctxs = c1.contexts + c2.contexts
    scorer = ContextScorer([str(inputs["bundle"])], cfg.scoring.model_copy(update={"device": "cpu"}))
    v1 = np.array([scorer.score([ContextItem(row.s1, c.left, c.right)]).score[0] for c in ctxs])
    v2 = np.array([scorer.score([ContextItem(row.s2, c.left, c.right)]).score[0] for c in ctxs])
    a, b = v1 - v1.mean(), v2 - v2.mean()
    assert row.score == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-4)


def test_resume_after_losing_units_gives_same_rows(inline_run, inputs, tmp_path):
    from sentsim.harvest.job import harvest

    cfg, out = inline_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    (copy / "_units" / "00001.json").unlink()  # as if killed before unit 1's marker
    shard = copy / "pairs" / "part-00002.parquet"
    shard.write_bytes(shard.read_bytes()[:50])  # and a corrupt shard
    (copy / "_COMPLETE").unlink()
    m = harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True)
    assert m["complete"]
    assert pairs_of(copy).equals(pairs_of(out))


def test_explicit_pairs_mode_and_null_reason(inputs, tmp_path):
    from sentsim.harvest.job import harvest

    f = tmp_path / "pairs.tsv"
    f.write_text("The nation must remain strong.\tOur country has to stay powerful.\n"
                 "Taxes were cut this year.\tzzqx qqzx\n")
    out = tmp_path / "explicit"
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, pairs_file=str(f), pairs_per_unit=1,
                         rank={"enabled": False})
    m = harvest(cfg, executor="inline", quiet=True)
    t = pairs_of(out).to_pandas().set_index("s2")
    assert m["complete"] and len(t) == 2
    assert np.isfinite(t.loc["Our country has to stay powerful."].score)
    # 'zzqx qqzx' retrieves nothing, but its partner's contexts still give a score; both counts recorded
    assert t.loc["zzqx qqzx"].n_ctx_s2 == 0


def test_bad_config_and_refusals(inputs, tmp_path):
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest
    from conftest import sentsim_cli

    r = sentsim_cli("harvest", "--corpus", inputs["corpus"], "--out", tmp_path / "o", "--context-models",
                    inputs["bundle"], "--set", "metric=euclid", "--executor", "inline")
    assert r.returncode == 2 and "metric" in r.stderr and "Traceback" not in r.stderr
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "g",
                         resources={"scoring": {"num_gpus": 1}})
    with pytest.raises(UsageError, match="GPUs"):
        harvest(cfg, executor="inline", quiet=True)


def test_discriminator_terms_match_direct_scoring(inputs):
    """With a discriminator, each candidate's log p(y=1|s,c) from the representation cache (head
    only) equals scoring that window directly with freshly encoded reps; a discriminator window
    wider than the context models' keeps only candidates whose whole window is in the document;
    the ranking is sentence-specific."""
    import torch

    from sentsim.discriminator import CoherenceModel, Discriminator, ModelConfig
    from sentsim.discriminator.vocab import Vocab
    from sentsim.harvest.config import ContextSetConfig
    from sentsim.harvest.contexts import ContextSource
    from sentsim.harvest.corpus_index import CorpusIndex
    from sentsim.retrieval import open_retriever

    corpus = CorpusIndex(str(inputs["corpus"]))
    torch.manual_seed(0)
    mc = ModelConfig(window=2, embed_dim=16, hidden=16, head_dim=16, embed_init="random")
    vocab = Vocab.build(corpus.sentences.texts, 2000, 1)
    disc = Discriminator(CoherenceModel(len(vocab), mc), vocab, {})
    src = ContextSource(corpus, ContextSetConfig(size=5, retrieve_chunks=30), 1, 0,
                        open_retriever(str(inputs["index"])), disc)
    query = "The budget must be balanced this year."
    ids, scores = src.retriever.search([query], 30)
    cands = src._expand(ids[0], scores[0])
    assert cands and all(len(c.left) == 1 and len(c.right) == 1 for c in cands)  # the context models' window
    fast = src.disc_scores(query, cands)
    q = disc.encode([query])[0]
    for c, v in list(zip(cands, fast))[:: max(1, len(cands) // 25)]:
        window = [c.centre_id + k for k in (-2, -1, 1, 2)]
        assert all(corpus.text(i) is not None and (i >> 20) == (c.centre_id >> 20) for i in window)
        reps = disc.encode(corpus.texts(window))
        direct = disc.score(reps[None, :2], q, reps[None, 2:])[0]
        assert v == pytest.approx(-np.logaddexp(0.0, -direct), abs=1e-5)
    other = src.disc_scores("Our soldiers fought bravely overseas.", cands)
    assert not np.array_equal(np.argsort(fast), np.argsort(other))
    sets = src.context_sets([query])
    assert 0 < len(sets[0].contexts) <= 5 and all(c.log_p_disc is not None for c in sets[0].contexts)
    by_centre = dict(zip((c.centre_id for c in cands), fast))
    for c in sets[0].contexts:  # the batched query encoding of context_sets gives the same terms
        assert c.log_p_disc == pytest.approx(by_centre[c.centre_id], abs=1e-5)
