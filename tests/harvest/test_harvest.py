"""The harvest end to end on the sample corpus: rows, Eq. 4 against the scorer, resume, faults."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
from harvest_support import build_index_for, harvest_config, tiny_context_bundle
from run_support import as_fingerprinted, before_manifest_checksums, rewrite_manifest

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


def test_a_force_new_harvest_draws_its_anchors_before_the_old_run_goes_and_stores_the_same_set(inline_run, tmp_path):
    """Under --force-new the rank anchors are drawn from the corpus while the stages are built, before the old run
    (and its anchor table) is discarded, and stored with the new run once it goes ahead: the same seeded set, so
    the same rows as the run it replaces."""
    from sentsim.harvest.job import harvest

    cfg, out = inline_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    m = harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True, force_new=True)
    assert m["complete"] and m["this_run"]["units"] == m["planned_units"]
    side = "_side/rank_anchors.parquet"
    assert ds.dataset(str(copy / side)).to_table().equals(ds.dataset(str(out / side)).to_table())
    assert pairs_of(copy).equals(pairs_of(out))


def test_eq4_value_of_one_pair_matches_direct_computation(inline_run, inputs):
    """Recompute one pair's score from the scorer directly: Eq. 3 per (sentence, context), Eq. 4 over C_s1 + C_s2."""
    from corpus.view import CorpusIndex
    from sentsim.context.scorer import ContextItem, ContextScorer
    from sentsim.retrieval import open_retriever
    from sentsim.screening.contexts import ContextSource

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


def test_a_hand_edited_harvest_manifest_is_named_by_verify_and_refused_by_remix_and_resume(inline_run, tmp_path,
                                                                                          capsys):
    """The manifest holds the settings remix reads as the source's and a resume keeps: edited by hand, `store verify`
    names it and remix and the resume refuse it in one line naming it (exit 2), with nothing written. A manifest
    from before the checksum (none in it) still remixes and resumes."""
    from harvest_support import cli_in_process

    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    cfg, out = inline_run
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    m = json.loads((edited / "manifest.json").read_text())
    m["config"]["scoring"]["lambda_fwd"] = 0.5  # the weights a remix would take as the source's
    (edited / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True))
    (edited / "_units" / "00001.json").unlink()  # a unit the resume would redo
    line = f"{edited}/manifest.json does not match its own checksum (edited by hand, or corrupt)"

    r = cli_in_process(capsys, "store", "verify", edited)
    assert r.returncode == 1 and "BAD  manifest.json: does not match its own checksum" in r.stderr, r.stderr
    conf = config_file(cfg, tmp_path / "harvest.json")
    for args in (("remix", edited, "--out", tmp_path / "r"),
                 ("harvest", "--config", conf, "--out", edited, "--executor", "inline")):
        r = cli_in_process(capsys, *args)
        assert r.returncode == 2 and line in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "r").exists() and not (edited / "_units" / "00001.json").exists()

    old = tmp_path / "old"
    shutil.copytree(out, old)
    m = json.loads((old / "manifest.json").read_text())
    before_manifest_checksums(m)  # as every sentsim before the checksum wrote it
    (old / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True))
    assert remix(RemixConfig(source=str(old), out=str(tmp_path / "r_old")), quiet=True)["complete"]
    (old / "_units" / "00001.json").unlink()
    (old / "_COMPLETE").unlink()
    assert harvest(cfg.model_copy(update={"out": str(old)}), executor="inline", quiet=True)["complete"]
    assert pairs_of(old).equals(pairs_of(out))


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


def test_each_row_of_a_pairs_file_is_a_pair_of_its_own_repeats_included(inputs, tmp_path):
    """STS-B's test file lists two pairs twice: every row keeps an id of its own, across units and in either
    order, while a repeat lands in its first row's split and gets its score."""
    from corpus.documents import text_id
    from sentsim.harvest.job import harvest
    from sentsim.harvest.pairs import pair_id

    a, b, c = "The nation must remain strong.", "Our country has to stay powerful.", "Taxes were cut this year."
    f = tmp_path / "pairs.tsv"
    f.write_text(f"{a}\t{b}\t4.0\n{a}\t{c}\t1.0\n{a}\t{b}\t3.5\n{b}\t{a}\t4.5\n")
    out = tmp_path / "repeats"
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, pairs_file=str(f), pairs_per_unit=2,
                         rank={"enabled": False})
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    t = pairs_of(out).to_pandas()
    assert len(t) == 4 and t.pair_id.nunique() == 4
    same = t[t.s1_id.isin([text_id(a), text_id(b)]) & t.s2_id.isin([text_id(a), text_id(b)])]
    assert sorted(same.gold) == [3.5, 4.0, 4.5]
    assert same.split.nunique() == 1 and np.allclose(same.score, same.score.iloc[0])
    # the first row of a pair keeps the id it always had
    assert pair_id(text_id(a), text_id(b)) in set(same.pair_id)


def test_bad_config_and_refusals(inputs, tmp_path):
    from conftest import sentsim_cli

    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    r = sentsim_cli("harvest", "--corpus", inputs["corpus"], "--out", tmp_path / "o", "--context-models",
                    inputs["bundle"], "--set", "metric=euclid", "--executor", "inline")
    assert r.returncode == 2 and "metric" in r.stderr and "Traceback" not in r.stderr
    # GPU asks are checked against the Ray cluster's GPUs: here a local Ray with 1 logical GPU,
    # whatever devices this machine has
    import ray

    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "g",
                         resources={"scoring": {"num_gpus": 1, "min_actors": 2, "max_actors": 2}})
    ray.init(address="local", num_cpus=1, num_gpus=1, include_dashboard=False)
    try:
        with pytest.raises(UsageError, match="ask for 2 GPUs but the cluster has 1"):
            harvest(cfg, executor="ray", quiet=True)
    finally:
        ray.shutdown()


def test_a_refused_resume_names_the_model_that_changed(inline_run, inputs, tmp_path):
    """Paths are not fingerprinted, their contents are (model_hashes): a run resumed with another index
    (or context model, discriminator) is refused naming that input, not "a model they name changed"."""
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest
    from sentsim.retrieval import IndexConfig, build_index

    cfg, out = inline_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    other = tmp_path / "index2"
    build_index(str(inputs["corpus"]), str(other), IndexConfig(n_shards=2))
    with pytest.raises(UsageError) as refused:
        harvest(cfg.model_copy(update={"out": str(copy), "index": str(other)}), executor="inline", quiet=True)
    msg = str(refused.value)
    assert "input(s) changed: inputs.0.models.index (the content of index)" in msg, msg
    assert "a model or checkpoint" not in msg, msg
    # a run whose manifest recorded no models (from before they were recorded) is not said to have changed them
    m = json.loads((copy / "manifest.json").read_text())
    del m["inputs"][0]["models"]
    before_manifest_checksums(m)  # nor a checksum of the manifest
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UsageError) as refused:
        harvest(cfg.model_copy(update={"out": str(copy), "index": str(other)}), executor="inline", quiet=True)
    assert "models" not in str(refused.value) and "a model or checkpoint they name changed" in str(refused.value)


def test_discriminator_terms_match_direct_scoring(inputs):
    """With a discriminator, each candidate's log p(y=1|s,c) from the representation cache (head
    only) equals scoring that window directly with freshly encoded reps; a discriminator window
    wider than the context models' keeps only candidates whose whole window is in the document;
    the ranking is sentence-specific."""
    import torch

    from corpus.view import CorpusIndex
    from sentsim.discriminator import CoherenceModel, Discriminator, ModelConfig
    from sentsim.discriminator.vocab import Vocab
    from sentsim.harvest.config import ContextSetConfig
    from sentsim.retrieval import open_retriever
    from sentsim.screening.contexts import ContextSource

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


def test_reference_sentences_get_the_disc_term_in_every_context(inputs, tmp_path):
    """Under a metric that reads the context effect, ScoreStage scores the reference sentences in every context
    of a unit; with a discriminator, ContextStage gives each of those items its disc term, as every other item
    has (the effect is then a mean of the same S the pairs hold), and the harvest hands the stage the texts."""
    from run_support import save_untrained_discriminator

    from sentsim.harvest.job import HarvestRun
    from sentsim.harvest.stages import ContextStage
    from sentsim.harvest.work import work_of

    disc = save_untrained_discriminator(inputs["corpus"], tmp_path / "disc")
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "run", discriminator=str(disc),
                         metric="double-centred", reference_sentences=3, rank={"enabled": False})
    refs = HarvestRun(cfg, "inline", force_new=False, quiet=True).reference_texts()
    stage = ContextStage(cfg, window=1, reference_texts=refs)
    stage.setup()
    w = work_of(stage.process([{"unit": 0, "pairs": [("The nation must remain strong.", "Our army is strong.", None),
                                                    ("Taxes were cut.", "The budget is balanced.", None)]}])[0])
    keys = {c.key: c for cs in w.csets.values() for c in cs.contexts}
    assert len(refs) == 3 and len(keys) > 4
    for i, text in enumerate(refs):
        direct = stage.source.disc_scores(text, list(keys.values()))
        assert [w.disc[(("ref", i), k)] for k in keys] == pytest.approx(list(direct), abs=1e-6)
    plain = ContextStage(cfg.model_copy(update={"metric": "pearson"}), window=1, reference_texts=refs)
    plain.setup()  # no context effect read: no reference items, no disc terms for them
    w = work_of(plain.process([{"unit": 0, "pairs": [("Taxes were cut.", "The budget is balanced.", None)]}])[0])
    assert not any(isinstance(s, tuple) for s, _ in w.disc)


def _scores(run):
    return pairs_of(run).to_pandas().set_index("pair_id").score


def test_remix_with_the_source_weights_reproduces_every_score(inline_run, tmp_path):
    from sentsim.harvest.remix import RemixConfig, remix
    from storage import verify_store

    cfg, out = inline_run
    m = remix(RemixConfig(source=str(out), out=str(tmp_path / "same")), quiet=True)
    r = m["remix"]
    assert m["complete"] and r["approximate"] == 0 and r["rescored"] > 0
    a, b = _scores(out), _scores(tmp_path / "same")
    assert a.index.equals(b.index) and a.isna().equals(b.isna())
    # context_scores are float32 (issue 16): the remix starts from the terms rounded to float32, the
    # harvest from the scorer's own values, so they agree to float32 rounding (was atol 1e-12 with
    # float64 terms); tests/harvest/test_plan_scale.py checks the remix is exact to the stored values
    assert np.allclose(a.dropna(), b.dropna(), rtol=0, atol=1e-5)
    assert verify_store(str(tmp_path / "same")) == []
    # students read the rank anchors from the run: they travel with it
    assert (tmp_path / "same" / "_side" / "rank_anchors.parquet").is_file()


def test_remix_without_fwd_equals_a_harvest_scored_without_it(inline_run, inputs, tmp_path, capsys):
    """Re-weighing stored terms gives what scoring again with those weights gives; resumable too. (The last
    refusal runs sentsim.cli.main in this process: no subprocess start-up.)"""
    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    cfg, _ = inline_run
    # in fp32: with bf16 (auto on a CPU that has it) the noise of batching items differently is bf16's,
    # which this barely trained fixture's weight effect (~1e-5) does not exceed a hundredfold
    cfg = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update={"autocast": "off"})})
    out = tmp_path / "source"
    harvest(cfg.model_copy(update={"out": str(out)}), executor="inline", quiet=True)
    fresh = tmp_path / "fresh"
    harvest(cfg.model_copy(update={"out": str(fresh), "scoring": cfg.scoring.model_copy(update={"lambda_fwd": 0.0})}),
            executor="inline", quiet=True)
    mixed = tmp_path / "mixed"
    remix(RemixConfig(source=str(out), out=str(mixed), lambda_fwd=0.0), quiet=True)
    a, b = _scores(fresh), _scores(mixed)
    assert a.isna().equals(b.isna())
    # scoring without fwd batches the other directions differently: float32 noise of ~1e-6 in
    # the log-probs, ~1e-8 in the scores; the weights themselves move scores far more than that
    off = (a - b).abs().max()
    assert off < 1e-6 and (b - _scores(out)).abs().max() > 100 * off
    # a remix stopped after some units resumes: done units are kept, the rest written
    (mixed / "_units" / "00002.json").unlink()
    (mixed / "_COMPLETE").unlink()
    before = (mixed / "pairs" / "part-00000.parquet").stat().st_mtime_ns
    m = remix(RemixConfig(source=str(out), out=str(mixed), lambda_fwd=0.0), quiet=True)
    assert m["complete"] and (mixed / "pairs" / "part-00000.parquet").stat().st_mtime_ns == before
    assert _scores(mixed).equals(b)
    # --max-units, as on the other sharded commands: stop after one unit, exit 0, the same command finishes
    from conftest import sentsim_cli

    cmd = ("remix", out, "--out", tmp_path / "split", "--lambda-fwd", "0", "--max-units", "1")
    r = sentsim_cli(*cmd)
    assert r.returncode == 0 and "stopped after --max-units 1: 1/4 units done" in r.stdout, r.stderr[-500:]
    assert not json.loads((tmp_path / "split" / "manifest.json").read_text())["complete"]
    r = sentsim_cli(*cmd[:-2])
    assert r.returncode == 0 and "stopped" not in r.stdout, r.stderr[-500:]
    assert json.loads((tmp_path / "split" / "manifest.json").read_text())["complete"]
    assert _scores(tmp_path / "split").equals(b)
    # the fresh harvest never scored fwd: weighing it in is refused
    from harvest_support import cli_in_process

    r = cli_in_process(capsys, "remix", fresh, "--out", tmp_path / "x", "--lambda-fwd", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the fwd term was not scored there (its λ was 0, or the ablation left it out)" in r.stderr


def test_the_discriminator_term_remixes_like_a_harvest_scored_with_that_weight(inputs, tmp_path):
    """Screened with a discriminator, a labelled --pairs harvest scored with λ_disc = 1 and remixed to
    λ_disc = 0 gives the harvest scored with λ_disc = 0 (the contexts are the discriminator's either
    way; only Eq. 3 changes), and bench/lambda_mix.py weighs the term on it and compares each mix with
    the first; on a harvest without a discriminator, a mix that weighs the term is refused in one line."""
    import subprocess
    import sys

    from run_support import save_untrained_discriminator

    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    disc = save_untrained_discriminator(inputs["corpus"], tmp_path / "disc")
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps({"s1": a, "s2": b, "gold": g}) + "\n" for a, b, g in [
        ("The nation must remain strong.", "Our country has to stay powerful.", 4.2),
        ("Taxes were cut this year.", "The government lowered taxes.", 3.8),
        ("We will defend our freedom.", "The weather was cold.", 0.4),
        ("Congress passed the bill.", "The law was approved by Congress.", 4.6),
        ("Our soldiers fought bravely.", "The budget must be balanced.", 0.2),
        ("Peace is our goal.", "We seek peace among nations.", 3.9)]))

    def run(name, lam, discriminator=str(disc)):
        out = tmp_path / name
        harvest(harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, pairs_file=str(f),
                               pairs_per_unit=3, rank={"enabled": False}, discriminator=discriminator,
                               scoring={"lambda_disc": lam}), executor="inline", quiet=True)
        return out

    with_disc, without = run("with", 1.0), run("without", 0.0)
    remix(RemixConfig(source=str(with_disc), out=str(tmp_path / "mixed"), lambda_disc=0.0), quiet=True)
    a, b = _scores(without), _scores(tmp_path / "mixed")
    assert a.notna().all() and a.index.equals(b.index)
    off = (a - b).abs().max()
    assert off < 1e-6 and (_scores(with_disc) - b).abs().max() > 100 * off

    def mix(run_dir, *mixes):
        return subprocess.run([sys.executable, "bench/lambda_mix.py", str(run_dir),
                               *(x for m in mixes for x in ("--mix", m))], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[2], timeout=300)

    r = mix(with_disc, "0,1,1,1", "1,1,1,1", "1,1,1")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in r.stdout.splitlines()
            if line.startswith("| ") and line[2].isdigit() or line.startswith("| kept")}
    assert set(rows) == {"0, 1, 1, 1", "1, 1, 1, 1", "kept, 1, 1, 1"}
    assert rows["0, 1, 1, 1"][1].strip() == ""  # the first mix is the one the others are compared with
    assert "[" in rows["1, 1, 1, 1"][1]
    assert float(rows["1, 1, 1, 1"][0]) == float(rows["kept, 1, 1, 1"][0])  # "kept" is the harvest's λ_disc = 1
    # screened with a discriminator, the term is stored whatever its λ (so a λ_disc = 0 harvest can be
    # remixed with it); a harvest without one has nothing to weigh
    r = mix(without, "0.5,1,1,1")
    assert r.returncode == 0 and "| 0.5, 1, 1, 1 |" in r.stdout, r.stderr[-2000:]
    r = mix(run("plain", 0.0, None), "1,1,1,1")
    assert r.returncode != 0 and "disc term was not scored" in r.stderr and "Traceback" not in r.stderr


def test_remix_refusals_are_one_line(inline_run, tmp_path, capsys):
    """Each refusal is exit 2 in one line: the first through the real console script, the rest by sentsim.cli.main
    in this process (the same code from argument parsing to the line, without a subprocess start-up each)."""
    from conftest import sentsim_cli
    from harvest_support import cli_in_process

    cfg, out = inline_run
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    m = json.loads((partial / "manifest.json").read_text())
    m["complete"] = False
    rewrite_manifest(partial, m)
    centred = tmp_path / "centred"
    shutil.copytree(out, centred)
    m = json.loads((centred / "manifest.json").read_text())
    m["config"]["metric"] = "double-centred"
    rewrite_manifest(centred, m)
    cases = [
        ((centred, "--out", tmp_path / "o0"), "pass --metric pearson"),
        ((partial, "--out", tmp_path / "o1"), "not complete"),
        ((out, "--out", out), "is the input HARVEST"),
        ((out, "--out", out / "remix"), "lies inside the input HARVEST"),
        ((tmp_path / "nowhere", "--out", tmp_path / "o2"), "no such harvest"),
        ((out, "--out", tmp_path / "o3", "--lambda-left", "-1"), "lambda-left"),
        ((out, "--out", tmp_path / "o4", "--lambda-disc", "0", "--lambda-fwd", "0", "--lambda-left", "0",
          "--lambda-right", "0"), "every λ is 0"),
    ]
    for i, (args, expected) in enumerate(cases):
        r = sentsim_cli("remix", *args) if i == 0 else cli_in_process(capsys, "remix", *args)
        assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-500:])
        assert len(r.stderr.strip().splitlines()) == 1


def with_text_column(src, dst, table, column, units=None):
    """A copy of a harvest whose `column` of `table` holds text (the numbers as strings) in `units` (None: every
    unit), as a run edited or written by another tool would: every marker vouches for its shards."""
    import hashlib
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(src, dst)
    for marker in sorted((dst / "_units").glob("*.json")):
        rec = json.loads(marker.read_text())
        if units is not None and rec["unit"] not in units:
            continue
        f = rec["files"][table]
        t = pq.read_table(dst / f["path"])
        i = t.schema.get_field_index(column)
        t = t.set_column(i, column, pa.array([None if x is None else f"{x}" for x in t.column(i).to_pylist()],
                                             pa.string()))
        buf = io.BytesIO()
        pq.write_table(t, buf)
        (dst / f["path"]).write_bytes(buf.getvalue())
        f.update(bytes=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
        rec.pop("check", None)  # markers without their own checksum are read (as older sentsim wrote them)
        marker.write_text(json.dumps(rec))
    return dst


def test_remix_names_a_text_column_where_it_takes_numbers(inline_run, tmp_path, capsys):
    """`sentsim remix` reads scores, gold labels and Eq. 3 terms as numbers: a column of them held as text is one
    line, exit 2, naming the run, the table and the column, never a traceback, before any unit is remixed:
    RunReader's numeric check of the table's first file, then every unit's own schema, so that a later unit that
    differs from the first file leaves nothing written either (no --out, no progress line). The first case runs the
    real console script, the others sentsim.cli.main in this process (no subprocess start-up each)."""
    from conftest import error_line, sentsim_cli
    from harvest_support import cli_in_process

    cfg, out = inline_run
    cases = [
        (("pairs", "score", None), "column score of table pairs holds string, not numbers (its numeric columns: "),
        (("pairs", "gold", None), "column gold of table pairs holds string, not numbers (its numeric columns: "),
        (("context_scores", "fwd", None),
         "column fwd of table context_scores holds string, not numbers (its numeric columns: "),
        (("context_scores", "left", {1}), "unit 1's context_scores column left holds string, not numbers"),
    ]
    for i, ((table, column, units), expected) in enumerate(cases):
        src = with_text_column(out, tmp_path / f"src{i}", table, column, units)
        args = ("remix", src, "--out", tmp_path / f"o{i}")
        r = sentsim_cli(*args) if i == 0 else cli_in_process(capsys, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (table, column, r.stderr[-3000:])
        line = error_line(r.stderr)
        assert line.startswith(f"sentsim: error: {src}: ") and expected in line, line
        assert r.stderr.splitlines() == [line], r.stderr
        assert not (tmp_path / f"o{i}").exists()


def as_written_before_context_ids(src, dst):
    """A copy of a harvest as the code before sentences.context_ids wrote it: shards, markers and
    manifest all without the column, every checksum valid."""
    import hashlib
    import io

    import pyarrow.parquet as pq

    shutil.copytree(src, dst)
    for marker in sorted((dst / "_units").glob("*.json")):
        rec = json.loads(marker.read_text())
        f = rec["files"]["sentences"]
        buf = io.BytesIO()
        pq.write_table(pq.read_table(dst / f["path"]).drop_columns(["context_ids"]), buf)
        (dst / f["path"]).write_bytes(buf.getvalue())
        f.update(bytes=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
        rec.pop("check", None)  # that code wrote markers without their own checksum
        marker.write_text(json.dumps(rec))
    m = json.loads((dst / "manifest.json").read_text())
    m["tables"]["sentences"] = [c for c in m["tables"]["sentences"] if c[0] != "context_ids"]
    m["format_version"] = 1
    m.pop("check")  # nor had manifests a checksum of their own
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_remix_of_a_harvest_from_before_context_ids(inline_run, tmp_path):
    """Old harvests lack sentences.context_ids: their pairs are remixed over shared contexts and counted."""
    from sentsim.harvest.remix import RemixConfig, remix

    cfg, out = inline_run
    old = as_written_before_context_ids(out, tmp_path / "old")
    r = remix(RemixConfig(source=str(old), out=str(tmp_path / "re")), quiet=True)["remix"]
    assert r["approximate"] == r["rescored"] > 0
    # a remix is opened in its source's run format: it holds its source's schemas
    assert json.loads((tmp_path / "re" / "manifest.json").read_text())["format_version"] == 1
    a, b = _scores(out).dropna(), _scores(tmp_path / "re").reindex(_scores(out).dropna().index)
    assert np.corrcoef(a, b)[0, 1] > 0.9


def test_resuming_a_harvest_from_before_context_ids_keeps_its_schema(inline_run, tmp_path):
    """New code finishing an old run writes the old sentences schema, so its shards still read as one table."""
    from sentsim.harvest.job import harvest
    from storage import verify_store

    cfg, out = inline_run
    old = as_written_before_context_ids(out, tmp_path / "old")
    (old / "_units" / "00001.json").unlink()
    (old / "_COMPLETE").unlink()
    m = harvest(cfg.model_copy(update={"out": str(old)}), executor="inline", quiet=True)
    assert m["complete"] and verify_store(str(old)) == []
    sents = ds.dataset(str(old / "sentences")).to_table()
    assert "context_ids" not in sents.column_names and sents.num_rows == ds.dataset(str(out / "sentences")).count_rows()
    assert pairs_of(old).equals(pairs_of(out))


def test_remix_reads_harvests_with_the_removed_scorer_actor_settings():
    """Harvests written while ScorerConfig had actor_num_cpus/gpus keep them in their manifest."""
    from sentsim.harvest.remix import RemixConfig, resolve

    manifest = {"config": {"scoring": {"actor_num_cpus": 1.0, "actor_num_gpus": 0.0, "lambda_fwd": 0.5}}}
    lam, metric = resolve(RemixConfig(source="h", out="r"), manifest)
    # no discriminator there, so its term was never scored: λ_disc is 0, not the default 1 that weighed nothing
    assert lam == {"disc": 0.0, "fwd": 0.5, "left": 1.0, "right": 1.0} and metric == "pearson"
    with_disc = {"config": {**manifest["config"], "discriminator": "/d", "contexts": {"mode": "screened"}}}
    assert resolve(RemixConfig(source="h", out="r"), with_disc)[0]["disc"] == 1.0
    # only a run of format 1 (no format_version) can hold them: in a later run they are refused in one line
    from sentsim.errors import UsageError
    from storage.store import FORMAT_VERSION

    with pytest.raises(UsageError, match="scoring config is not valid .*actor_num_cpus.*; harvest again") as e:
        resolve(RemixConfig(source="h", out="r"), dict(manifest, format_version=FORMAT_VERSION))
    assert "\n" not in str(e.value)


def test_anchors_that_partner_each_other_give_each_pair_once(inputs, tmp_path):
    """A corpus of 2 short documents with every sentence an anchor: every partner is an anchor too,
    so each unordered pair is proposed by both of its anchors, often in different units. Each must
    be written exactly once (the smaller anchor owns it); a harvest that stopped calling
    `owned_pairs` would write most pairs twice."""
    from sentsim.corpus_job import build_corpus
    from sentsim.harvest.job import harvest

    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"id": f"d{d}", "paragraphs": [" ".join(
        f"Sentence number {i} of document {d} talks about topic {i % 3} today." for i in range(6))]})
        for d in range(2)) + "\n")
    corpus = tmp_path / "corpus"
    build_corpus([str(docs)], str(corpus), executor="inline", quiet=True)
    out = tmp_path / "run"
    from sentsim.harvest.config import HarvestConfig

    cfg = HarvestConfig.model_validate(dict(
        corpus=str(corpus), context_models=[str(inputs["bundle"])], out=str(out), seed=3,
        anchors={"n": 12, "per_unit": 3, "min_tokens": 1}, partners={"neighbours": 0, "same_doc": 3, "random": 3},
        contexts={"mode": "random", "size": 4}, rank={"enabled": False}, scoring={"batch_tokens": 2048}))
    m = harvest(cfg, executor="inline", quiet=True)
    assert m["complete"] and m["completed_units"] == 4
    t = pairs_of(out).to_pandas()
    anchors = set(t.s1_id) | set(t.s2_id)
    assert len(anchors) == 12  # every sentence is an anchor, and every pair joins two of them
    keys = [tuple(sorted(p)) for p in zip(t.s1_id, t.s2_id)]
    assert len(keys) == len(set(keys)) and len(t) == t.pair_id.nunique()
    assert len(keys) > 12  # many pairs, each proposed from both ends


def test_a_run_resumes_under_another_spelling_of_its_input_paths(inline_run, tmp_path, monkeypatch):
    """Input paths are fingerprinted by what they hold, so a run resumes with its corpus, index and context
    models named relative to another folder; a run written while paths were fingerprinted as given resumes
    under its own fingerprint; a changed setting is still refused."""
    import os

    from corpus.view import CorpusIndex
    from sentsim.harvest.job import STAGE, harvest, model_hashes, plan
    from sentsim.identity import fingerprint
    from storage import StoreError
    from storage.store import FORMAT_VERSION

    cfg, out = inline_run
    corpus = CorpusIndex(cfg.corpus)
    before = fingerprint(STAGE, cfg.semantic(with_paths=True), corpus.fingerprint, plan(cfg, corpus)[1],
                         model_hashes(cfg))  # how a run was fingerprinted until 2026-11-24
    now = json.loads((out / "manifest.json").read_text())["fingerprint"]
    assert before != now
    monkeypatch.chdir(tmp_path)
    respelt = {"corpus": os.path.relpath(cfg.corpus), "index": os.path.relpath(cfg.index),
               "context_models": [os.path.relpath(p) for p in cfg.context_models]}
    assert respelt["corpus"] != cfg.corpus
    for name, fp in (("current", now), ("earlier", before)):
        run = tmp_path / name
        shutil.copytree(out, run)
        as_fingerprinted(run, fp)
        (run / "_units" / "00001.json").unlink()  # as if stopped before unit 1's marker
        m = harvest(cfg.model_copy(update={**respelt, "out": str(run)}), executor="inline", quiet=True)
        assert m["complete"] and m["fingerprint"] == fp and m["this_run"]["units"] == 1, name
        assert pairs_of(run).equals(pairs_of(out)), name
    # only a run of format 1 can hold such a fingerprint: a later run holding one is another run, refused
    later = as_fingerprinted(shutil.copytree(out, tmp_path / "later"), before, run_format=FORMAT_VERSION)
    with pytest.raises(StoreError, match=f"written with fingerprint {before}"):
        harvest(cfg.model_copy(update={**respelt, "out": str(later)}), executor="inline", quiet=True)
    with pytest.raises(StoreError, match="fingerprint") as refused:
        harvest(cfg.model_copy(update={**respelt, "out": str(tmp_path / "earlier"), "seed": 1}), executor="inline",
                quiet=True)
    # it names the setting that changed, not the paths or the --out that differ too but are not fingerprinted
    why = str(refused.value).split("(", 1)[1]
    assert f"seed: {cfg.seed} -> 1" in why and "corpus" not in why and "out:" not in why and "context_models" not in why


def test_a_resumed_run_keeps_the_format_it_began_in(inputs, tmp_path, monkeypatch, capsys):
    """`scoring.autocast: auto` resolves when a run starts and the manifest keeps it: resumed where bf16 is
    not native, the run's remaining units still score in bf16, so no run mixes bf16 and fp32 scores."""
    from sentsim.harvest.job import harvest

    def run(out, native, **kw):
        monkeypatch.setenv("SENTSIM_CPU_BF16", native)
        cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, scoring={"device": "cpu"})
        return harvest(cfg, executor="inline", **kw)

    whole = tmp_path / "bf16"
    run(whole, "1", quiet=True)
    moved = tmp_path / "moved"
    run(moved, "1", quiet=True, max_units=2)
    assert json.loads((moved / "manifest.json").read_text())["scoring_precision"] == "bf16"
    capsys.readouterr()
    m = run(moved, "0", quiet=False)  # resumed on a CPU without native bf16
    assert "scoring in bf16, the format this run began in" in capsys.readouterr().err
    assert m["complete"] and m["scoring_precision"] == "bf16"
    assert pairs_of(moved).equals(pairs_of(whole))
    assert json.loads((moved / "report.json").read_text())["scoring_precision"] == {"bf16": 4}
    # a new run there resolves auto afresh: fp32 on this "CPU", and its scores are not the bf16 ones
    m = run(moved, "0", quiet=True, force_new=True)
    assert m["scoring_precision"] == "off"
    assert json.loads((moved / "report.json").read_text())["scoring_precision"] == {"off": 4}
    assert not pairs_of(moved).column("score").equals(pairs_of(whole).column("score"))


def test_units_scored_together_give_the_rows_of_units_scored_alone(inline_run, tmp_path):
    """resources.scoring.units_per_call hands several units to one scoring call (one scorer pass over all
    their items, to fill a GPU): every unit's rows are those it gets alone, inline as on Ray."""
    from sentsim.harvest.job import harvest

    cfg, out = inline_run
    cfg = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update={"autocast": "off"})})
    alone, together = tmp_path / "alone", tmp_path / "together"
    harvest(cfg.model_copy(update={"out": str(alone)}), executor="inline", quiet=True)
    res = cfg.resources.model_copy(update={"scoring": cfg.resources.scoring.model_copy(update={"units_per_call": 3})})
    harvest(cfg.model_copy(update={"out": str(together), "resources": res}), executor="inline", quiet=True)
    a, b = pairs_of(alone).to_pandas(), pairs_of(together).to_pandas()
    assert len(a) == len(b) > 0 and a.pair_id.equals(b.pair_id)
    assert np.allclose(a.score.astype(float), b.score.astype(float), rtol=0, atol=1e-6, equal_nan=True)


def test_the_harvest_is_four_stages_each_built_from_named_arguments(inline_run):
    """harvest() reads as its pipeline: HarvestRun.stages lists the four stages in order, the writer
    last, each a class and the keyword arguments its actors build it with (no closure, no partial)."""
    import inspect

    from sentsim.executor import RunContext
    from sentsim.harvest.job import HarvestRun
    from sentsim.harvest.stages import ContextStage, RankStage, ScoreStage, WriteStage
    from storage import ShardStore

    cfg, out = inline_run
    run = HarvestRun(cfg, "inline", force_new=False, quiet=True)
    store = ShardStore(str(out))
    manifest = store.read_manifest()
    assert run.fp == manifest["fingerprint"]  # the resolved run is the stored one: it would resume, not restart
    ctx = RunContext(run, run.fp, store, manifest, "inline", None, False, True)
    specs = run.stages(ctx)
    assert [s.stage for s in specs] == [ContextStage, ScoreStage, RankStage, WriteStage]
    assert [s.name for s in specs] == ["contexts", "scoring", "rank", "write"]
    for spec in specs:
        inspect.signature(spec.stage).bind(**spec.args)  # every argument named, none missing
        assert isinstance(spec.build(), spec.stage)


def test_a_text_score_is_named_in_one_line_by_the_harvest_summary(inline_run, tmp_path):
    """The summary a harvest writes at its end reads score and rank_sim as numbers, with RunReader's check: a
    run whose score column holds text (resealed, so its markers vouch for it, as another writer could have left
    it) is refused in one line naming the column, where numeric text was cast unseen and other text failed in
    numpy with a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import error_line, sentsim_cli
    from harvest_support import reseal

    cfg, out = inline_run
    run = shutil.copytree(out, tmp_path / "run")
    for shard in (run / "pairs").glob("*.parquet"):
        t = pq.read_table(shard)
        pq.write_table(t.set_column(t.schema.get_field_index("score"), "score", t["score"].cast(pa.string())), shard)
    reseal(run)
    config = tmp_path / "harvest.json"
    config.write_text(json.dumps(cfg.model_copy(update={"out": str(run)}).model_dump()))  # JSON is YAML
    r = sentsim_cli("harvest", "--config", config, "--executor", "inline")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr).startswith(f"sentsim: error: {run}: column score of table pairs holds string, "
                                           "not numbers (its numeric columns: pair_id, s1_id, s2_id,"), r.stderr
    assert "harvest:" not in r.stdout, r.stdout  # no summary of a run it could not read


def test_without_rank_targets_the_harvest_has_no_rank_stage(inline_run, tmp_path):
    """rank.enabled=false leaves RankStage out of the pipeline, where it only handed the rows on, so the summary's
    placement names no rank stage. The rows are those the idle stage handed on: the rank-target run's, with
    rank_sim and the rank targets null, in the same columns."""
    from conftest import sentsim_cli

    from sentsim.executor import RunContext
    from sentsim.harvest.job import HarvestRun
    from sentsim.harvest.stages import ContextStage, ScoreStage, WriteStage
    from storage import ShardStore, verify_store

    cfg, out = inline_run
    run = tmp_path / "run"
    data = cfg.model_dump()
    data["out"], data["rank"]["enabled"] = str(run), False
    config = tmp_path / "harvest.json"
    config.write_text(json.dumps(data))  # JSON is YAML
    r = sentsim_cli("harvest", "--config", config, "--executor", "inline")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "  units per node: contexts: local x4; scoring: local x4; write: local x4\n" in r.stdout, r.stdout
    assert verify_store(str(run)) == []
    store = ShardStore(str(run))
    job = HarvestRun(cfg.model_validate(data), "inline", force_new=False, quiet=True)
    specs = job.stages(RunContext(job, job.fp, store, store.read_manifest(), "inline", None, False, True))
    assert [s.stage for s in specs] == [ContextStage, ScoreStage, WriteStage]
    for table, key, nulled in (("pairs", "pair_id", ["rank_sim"]), ("sentences", "sentence_id", ["rank_codes"]),
                               ("context_scores", [("sentence_id", "ascending"), ("context_id", "ascending")], [])):
        want = ds.dataset(str(out / table)).to_table().sort_by(key)
        got = ds.dataset(str(run / table)).to_table().sort_by(key)
        assert got.schema.equals(want.schema) and got.num_rows == want.num_rows, table
        assert all(got[c].null_count == got.num_rows and want[c].null_count == 0 for c in nulled), table
        assert got.drop_columns(nulled).equals(want.drop_columns(nulled)), table
    # the same rows resumed: a unit lost is redone to the same shards, under the same fingerprint
    pairs = ds.dataset(str(run / "pairs")).to_table().sort_by("pair_id")
    (run / "_units" / "00002.json").unlink()
    r = sentsim_cli("harvest", "--config", config, "--executor", "inline")
    assert r.returncode == 0 and "[harvest] unit 00002" in r.stderr, r.stderr[-3000:]
    assert ds.dataset(str(run / "pairs")).to_table().sort_by("pair_id").equals(pairs)
    assert store.read_manifest()["fingerprint"] == job.fp


def test_a_finished_harvest_with_no_pair_says_so_and_why(inputs, tmp_path, capsys):
    """Anchors whose only partners are TF-IDF neighbours, with no --index to draw them from, get no pair: the
    harvest finishes with none and fails (exit 2, a cause in the config) in one line saying it finished so and
    why, not "no pairs labelled yet", which reads as a run still to be resumed. The run stays complete: a rerun
    does no unit and says the same (that rerun by sentsim.cli.main in this process: no subprocess start-up)."""
    from conftest import error_line, sentsim_cli
    from harvest_support import cli_in_process

    out = tmp_path / "run"
    args = ["harvest", "--corpus", inputs["corpus"], "--context-models", inputs["bundle"], "--out", out,
            "--executor", "inline", "--set", "contexts.mode=random", "--set", "contexts.size=4",
            "--set", "anchors.n=4", "--set", "anchors.per_unit=2", "--set", "partners.neighbours=1",
            "--set", "partners.same_doc=0", "--set", "partners.random=0", "--set", "rank.enabled=false"]
    why = (f"sentsim: error: --out {out}: the harvest finished with no pairs labelled (2 of 2 units done): none of "
           "the 4 anchors got a partner (partners.neighbours=1, same_doc=0, random=0; neighbours are drawn from "
           "--index, and none was given); change the inputs or the partners.* settings and run again with "
           "--force-new (or another --out)")
    r = sentsim_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr) == why
    assert json.loads((out / "manifest.json").read_text())["complete"]
    assert r.stdout.splitlines()[-1] == f"harvest: 0 pairs (0 null) in 2/2 units -> {out}", r.stdout
    assert "yet" not in r.stdout + r.stderr
    markers = sorted((p.name, p.stat().st_mtime_ns) for p in (out / "_units").iterdir())
    r = cli_in_process(capsys, *args)  # complete: nothing redone, the same failure
    assert r.returncode == 2 and error_line(r.stderr) == why, r.stderr[-3000:]
    assert "[harvest] unit" not in r.stderr, r.stderr[-3000:]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (out / "_units").iterdir()) == markers
    r = sentsim_cli(*args, "--max-units", "1", "--force-new")  # stopped part-way: still to come
    assert r.returncode == 0, r.stderr[-3000:]
    assert "  no pairs labelled yet: 1 of 2 units done\n" in r.stdout, r.stdout


def config_file(cfg, path: Path) -> Path:
    """`cfg` as a `sentsim harvest --config` file; its --out is given by the flag."""
    data = cfg.model_dump()
    data.pop("out")
    path.write_text(json.dumps(data))
    return path


def harvest_cli(conf: Path, out: Path, *args, env=None, capsys=None):
    """The real `sentsim harvest --config conf --out out`, inline, with `args` (each `key=value` a --set). Given
    `capsys`: by sentsim.cli.main in this process (for a refusal or a rerun with nothing to do, where a
    subprocess's start-up would cost more than the check)."""
    from conftest import sentsim_cli
    from harvest_support import cli_in_process

    flags = [a for x in args for a in (("--set", x) if "=" in x and not x.startswith("-") else (x,))]
    full = ("harvest", "--config", conf, "--out", out, "--executor", "inline", *flags)
    if capsys is not None:
        assert env is None
        return cli_in_process(capsys, *full)
    return sentsim_cli(*full, env=env)


def markers_of(run: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in (run / "_units").glob("*.json")}


def format_3_fingerprint(cfg) -> str:
    """The fingerprint a format 3 sentsim gave a run of `cfg`: with the keys its mode does not read."""
    from corpus.view import CorpusIndex
    from sentsim.harvest.job import STAGE, model_hashes, plan, without_paths
    from sentsim.identity import fingerprint

    corpus = CorpusIndex(cfg.corpus)
    return fingerprint(STAGE, cfg.semantic(keep_unread=True), corpus.fingerprint,
                       without_paths(plan(cfg, corpus)[1]), model_hashes(cfg))


def test_a_corpus_harvest_resumes_whatever_pairs_per_unit_says(inline_run, tmp_path, capsys):
    """A corpus harvest's units are anchors.per_unit anchors: pairs_per_unit, which it never reads, is not
    fingerprinted, so a harvest stopped part-way resumes under another value to the rows of an uninterrupted
    run. A run of format 3, whose fingerprint held it, resumes under the fingerprint it holds whatever it is set
    to now, a rerun of it finished does no unit, and a key it reads is still refused, named alone."""
    from conftest import error_line

    cfg, out = inline_run
    conf = config_file(cfg, tmp_path / "harvest.json")
    fp = json.loads((out / "manifest.json").read_text())["fingerprint"]
    stopped = tmp_path / "stopped"
    r = harvest_cli(conf, stopped, "pairs_per_unit=64", "--max-units", "1")
    assert r.returncode == 0 and "stopped after --max-units 1" in r.stdout, r.stderr[-3000:]
    r = harvest_cli(conf, stopped, "pairs_per_unit=5")
    assert r.returncode == 0 and "resuming" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    m = json.loads((stopped / "manifest.json").read_text())
    assert m["complete"] and m["fingerprint"] == fp and m["config"]["pairs_per_unit"] == 64
    assert pairs_of(stopped).equals(pairs_of(out))

    old_fp = format_3_fingerprint(cfg)
    assert old_fp != fp
    old = as_fingerprinted(shutil.copytree(out, tmp_path / "format3"), old_fp, run_format=3)
    (old / "_units" / "00001.json").unlink()  # as if stopped before unit 1's marker
    r = harvest_cli(conf, old, "pairs_per_unit=7")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    m = json.loads((old / "manifest.json").read_text())
    assert m["complete"] and m["fingerprint"] == old_fp and m["format_version"] == 3
    assert pairs_of(old).equals(pairs_of(out))
    done = markers_of(old)
    r = harvest_cli(conf, old, "pairs_per_unit=9", capsys=capsys)  # finished: nothing redone (in this process)
    assert r.returncode == 0 and "[harvest] unit" not in r.stderr and markers_of(old) == done, r.stderr[-3000:]
    r = harvest_cli(conf, old, "pairs_per_unit=9", "seed=1", capsys=capsys)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    assert "seed: 3 -> 1" in line and "pairs_per_unit" not in line, line
    # resumed under the fingerprint it holds, it keeps the format its units were scored in, as any run does
    bf16 = as_fingerprinted(shutil.copytree(out, tmp_path / "format3_bf16"), old_fp, run_format=3)
    (bf16 / "_units" / "00001.json").unlink()
    m = json.loads((bf16 / "manifest.json").read_text())
    (bf16 / "manifest.json").write_text(json.dumps(dict(m, scoring_precision="bf16")))
    r = harvest_cli(conf, bf16, "pairs_per_unit=7", "scoring.device=cpu", env={"SENTSIM_CPU_BF16": "0"})
    assert r.returncode == 0 and "scoring in bf16, the format this run began in" in r.stderr, r.stderr[-3000:]
    marker = json.loads((bf16 / "_units" / "00001.json").read_text())
    assert marker["extra"]["scoring_precision"] == "bf16", marker


def test_an_explicit_harvest_reads_pairs_per_unit_and_not_the_anchors(inputs, tmp_path, capsys):
    """An explicit (--pairs) harvest's units are pairs_per_unit rows of the file: another value is another run
    (refused, named), while the anchors.* and partners.* keys, which it never reads, resume the finished run;
    a run of format 2 or 3, whose fingerprint held them, resumes under its own whatever they are set to now."""
    from conftest import error_line

    f = tmp_path / "pairs.tsv"
    f.write_text("The nation must remain strong.\tOur country has to stay powerful.\n"
                 "Taxes were cut this year.\tThe budget was balanced.\n"
                 "We will build new roads.\tThe schools need more teachers.\n")
    out = tmp_path / "explicit"
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, pairs_file=str(f), pairs_per_unit=2,
                         rank={"enabled": False})
    conf = config_file(cfg, tmp_path / "harvest.json")
    r = harvest_cli(conf, out)
    assert r.returncode == 0, r.stderr[-3000:]
    fp = json.loads((out / "manifest.json").read_text())["fingerprint"]
    done = markers_of(out)
    unread = ("anchors.n=3", "anchors.per_unit=1", "anchors.min_tokens=9", "partners.random=0",
              "partners.same_doc=0", "partners.neighbours=0", "partners.neighbour_chunks=2")
    r = harvest_cli(conf, out, *unread, capsys=capsys)  # nothing to do: in this process
    assert r.returncode == 0 and "[harvest] unit" not in r.stderr, r.stderr[-3000:]
    assert markers_of(out) == done and json.loads((out / "manifest.json").read_text())["fingerprint"] == fp
    r = harvest_cli(conf, out, "pairs_per_unit=1", capsys=capsys)  # three units of one pair: another run
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    assert "pairs_per_unit: 2 -> 1" in line and "anchors" not in line, line

    old_fp = format_3_fingerprint(cfg)  # formats 2 and 3 fingerprinted a per-pair harvest alike
    assert old_fp != fp
    for version in (2, 3):
        old = as_fingerprinted(shutil.copytree(out, tmp_path / f"format{version}"), old_fp, run_format=version)
        (old / "_units" / "00001.json").unlink()
        r = harvest_cli(conf, old, *unread)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        m = json.loads((old / "manifest.json").read_text())
        assert m["complete"] and m["fingerprint"] == old_fp and m["format_version"] == version
        assert pairs_of(old).equals(pairs_of(out))
