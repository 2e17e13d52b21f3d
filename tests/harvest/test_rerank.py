"""C_s chosen by Eq. 3 from the screening's shortlist (contexts.rerank_shortlist; 003 §3.3, harvest/rerank.py)."""

import json

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from harvest_support import build_index_for, harvest_config, tiny_context_bundle

pytestmark = pytest.mark.slow

SIZE, SHORTLIST = 5, 12


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    from run_support import save_untrained_discriminator

    root = tmp_path_factory.mktemp("rerank_inputs")
    return {"corpus": speech_corpus, "index": build_index_for(speech_corpus, root / "index"),
            # weights scaled so that S moves with the sentence (harvest_support.tiny_context_bundle)
            "bundle": tiny_context_bundle(speech_corpus, root / "ctx", weight_scale=10.0),
            "disc": save_untrained_discriminator(speech_corpus, root / "disc")}


def _config(inputs, out, **contexts):
    return harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out,
                          contexts=contexts, scoring={"autocast": "off"}, rank={"enabled": False})


@pytest.fixture(scope="module")
def runs(inputs, tmp_path_factory):
    """The same anchors harvested twice: with |C_s| = SHORTLIST and no re-rank (every shortlist context's S, as
    context_scores), and with |C_s| = SIZE re-ranked from a SHORTLIST-context shortlist."""
    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("rerank")
    wide, reranked = root / "wide", root / "reranked"
    harvest(_config(inputs, wide, size=SHORTLIST), executor="inline", quiet=True)
    m = harvest(_config(inputs, reranked, size=SIZE, rerank_shortlist=SHORTLIST), executor="inline", quiet=True)
    return wide, reranked, m


def _table(run, name):
    return ds.dataset(str(run / name)).to_table().to_pandas()


def test_c_s_is_the_shortlists_eq3_top(runs):
    """Each sentence's C_s is the top |C_s| of its screened shortlist by its own S (Eq. 3), best first; a
    sentence whose shortlist holds no more than |C_s| keeps it in the screening's order."""
    wide, reranked, _ = runs
    w_sent = _table(wide, "sentences").set_index("sentence_id")
    r_sent = _table(reranked, "sentences").set_index("sentence_id")
    w_cs = _table(wide, "context_scores").set_index(["sentence_id", "context_id"]).S
    assert set(r_sent.index) == set(w_sent.index)
    cut = kept_whole = 0
    for s, row in r_sent.iterrows():
        shortlist = list(w_sent.context_ids[s])
        if len(shortlist) <= SIZE:
            assert list(row.context_ids) == shortlist
            kept_whole += 1
            continue
        S = np.array([w_cs[(s, c)] for c in shortlist])
        chosen = list(row.context_ids)
        assert len(chosen) == SIZE and set(chosen) <= set(shortlist)
        by_S = [shortlist[i] for i in np.argsort(-S, kind="stable")]
        assert chosen == by_S[:SIZE], (s, S)
        assert pd.isna(row.shortfall)  # the shortfall is against |C_s|, not the shortlist
        cut += 1
    assert cut >= 10  # the fixture re-ranks for real


def test_reused_items_keep_their_scores_and_eq4_reads_the_reranked_sets(runs, tmp_path):
    """The items the re-rank scored are the ones Eq. 4 reads (each kept context scored once, its values those of
    a plain scoring), every pair compares C_s1 + C_s2 of the re-ranked sets, and a remix with the source's weights
    reproduces every score from the stored terms."""
    from sentsim.harvest.remix import RemixConfig, remix

    wide, reranked, m = runs
    w_cs = _table(wide, "context_scores").set_index(["sentence_id", "context_id"])
    r_cs = _table(reranked, "context_scores").set_index(["sentence_id", "context_id"])
    assert not r_cs.index.duplicated().any()
    common = r_cs.index.intersection(w_cs.index)
    assert len(common) > 0.5 * len(r_cs)
    for col in ("S", "fwd", "left", "right"):
        assert np.allclose(r_cs.loc[common, col], w_cs.loc[common, col], rtol=0, atol=1e-5, equal_nan=True)
    own = _table(reranked, "sentences").set_index("sentence_id").context_ids
    pairs = _table(reranked, "pairs")
    for p in pairs.itertuples():
        assert p.n_ctx_s1 == len(own[p.s1_id]) and p.n_ctx_s2 == len(own[p.s2_id])
        for s in (p.s1_id, p.s2_id):  # every (sentence, context) of the pair's C_s1 + C_s2 was scored
            assert all((s, c) in r_cs.index for c in [*own[p.s1_id], *own[p.s2_id]])
    out = remix(RemixConfig(source=str(reranked), out=str(tmp_path / "same")), quiet=True)
    assert "c_s_chosen_under_source_weights" not in out["remix"]
    again = _table(tmp_path / "same", "pairs").set_index("pair_id").score
    assert np.allclose(again.astype(float), pairs.set_index("pair_id").score.astype(float), atol=1e-6,
                       equal_nan=True)
    # the items each unit scored: its shortlists' and those of Eq. 4 that the re-rank had not scored, less those
    # Eq. 4 leaves out in a partner's window that holds the sentence (kept as null rows, never scored)
    from storage import ShardStore

    shortlist = _table(wide, "sentences").set_index("sentence_id").context_ids
    reranked_ids = {s for s, c in shortlist.items() if len(c) > SIZE}
    per_sentence = sum(len(shortlist[s]) for s in _table(reranked, "sentences").sentence_id if s in reranked_ids)
    reused = sum(s in reranked_ids and c in set(shortlist[s]) for s, c in r_cs.index)  # own or a cross term
    markers = ShardStore(str(reranked)).markers().values()
    scored = sum(mk["extra"]["scored_items"] for mk in markers)
    held = int(r_cs.fwd.isna().sum())
    assert scored == per_sentence + len(r_cs) - reused - held
    assert sum(mk["extra"]["rerank_items"] for mk in markers) == per_sentence
    report = json.loads((reranked / "report.json").read_text())
    assert report["scored_items"] == scored and report["rerank_items"] == per_sentence
    assert "rerank_items" not in json.loads((wide / "report.json").read_text())


def test_remix_under_other_weights_says_c_s_was_kept(runs, tmp_path):
    from conftest import sentsim_cli

    _, reranked, _ = runs
    r = sentsim_cli("remix", reranked, "--out", tmp_path / "other", "--lambda-left", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f"C_s kept as the harvest chose it: Eq. 3 under λ disc 0, fwd 1, left 1, right 1 re-ranked its "
            f"{SHORTLIST}-context shortlists") in r.stdout


def test_a_shortlist_needs_screening_and_more_than_size(inputs, tmp_path):
    """Refusals are one line (exit 2) at the command; a harvest without the key keeps its fingerprint."""
    from conftest import error_line, sentsim_cli

    from sentsim.harvest.config import HarvestConfig

    base = ["harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models",
            inputs["bundle"], "--executor", "inline"]
    r = sentsim_cli(*base, "--out", tmp_path / "a", "--set", "contexts.size=8", "--set",
                    "contexts.rerank_shortlist=8")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert error_line(r.stderr).startswith("sentsim: error: invalid config: contexts: rerank_shortlist=8 must be "
                                           "above size=8")
    r = sentsim_cli(*base, "--out", tmp_path / "b", "--set", "contexts.mode=random", "--set",
                    "contexts.rerank_shortlist=600")
    assert r.returncode == 2 and "contexts: rerank_shortlist: mode=random screens no shortlist" in error_line(r.stderr)
    r = sentsim_cli(*base, "--out", tmp_path / "e", "--set", "contexts.size=4", "--set", "contexts.rerank_shortlist=8",
                    "--discriminator", inputs["disc"],
                    *(f"--set=scoring.lambda_{t}=0" for t in ("fwd", "left", "right")))
    assert r.returncode == 2 and "Eq. 3 weighs only the disc term" in error_line(r.stderr)
    r = sentsim_cli("contexts", "--corpus", inputs["corpus"], "--index", inputs["index"], "--out", tmp_path / "c",
                    "--set", "contexts.size=4", "--set", "contexts.rerank_shortlist=9")
    assert r.returncode == 2 and "`sentsim contexts` does not load" in error_line(r.stderr)
    assert not any((tmp_path / d).exists() for d in "abce")
    r = sentsim_cli(*base, "--out", tmp_path / "ok", *(f"--set={kv}" for kv in (
        "contexts.size=4", "contexts.rerank_shortlist=8", "contexts.retrieve_chunks=40", "anchors.n=4",
        "anchors.per_unit=2", "rank.enabled=false", "partners.neighbour_chunks=8")))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert 0 < report["rerank_items"] < report["scored_items"]
    assert (f"  C_s: Eq. 3's top 4 of 8-context shortlists; {report['rerank_items']:,} of the "
            f"{report['scored_items']:,} items scored chose them") in r.stdout
    plain = HarvestConfig(corpus="c", out="o", index="i", context_models=["m"])
    assert "rerank_shortlist" not in plain.semantic()["contexts"]
    on = plain.model_copy(update={"contexts": plain.contexts.model_copy(update={"rerank_shortlist": 900})})
    assert on.semantic()["contexts"]["rerank_shortlist"] == 900


def test_units_reranked_in_one_call_give_the_rows_of_units_reranked_alone(runs, inputs, tmp_path):
    """With resources.scoring.units_per_call, one re-rank pass serves several units: each keeps its own C_s and
    rows."""
    from sentsim.harvest.job import harvest

    _, reranked, _ = runs
    cfg = _config(inputs, tmp_path / "together", size=SIZE, rerank_shortlist=SHORTLIST)
    cfg = cfg.model_copy(update={"resources": cfg.resources.model_copy(update={
        "scoring": cfg.resources.scoring.model_copy(update={"units_per_call": 3})})})
    harvest(cfg, executor="inline", quiet=True)
    a, b = _table(reranked, "pairs").sort_values("pair_id"), _table(tmp_path / "together", "pairs").sort_values(
        "pair_id")
    assert len(a) == len(b) > 0 and list(a.pair_id) == list(b.pair_id)
    assert np.allclose(a.score.astype(float), b.score.astype(float), rtol=0, atol=1e-6, equal_nan=True)
    key = ["sentence_id", "text"]
    sa, sb = (_table(r, "sentences").sort_values(key) for r in (reranked, tmp_path / "together"))
    assert [list(c) for c in sa.context_ids] == [list(c) for c in sb.context_ids]


def test_with_a_discriminator_s_holds_its_term_and_the_order_is_eq3s_not_the_screenings(inputs, tmp_path):
    """Screened by a discriminator (a --pairs harvest), the re-rank's S is Eq. 3 with the disc term in it, and
    C_s is its top |C_s|, which is not the discriminator's own top |C_s|."""
    from sentsim.harvest.job import harvest

    disc = inputs["disc"]
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps({"s1": a, "s2": b}) + "\n" for a, b in [
        ("The nation must remain strong.", "Our country has to stay powerful."),
        ("Taxes were cut this year.", "The government lowered taxes."),
        ("We will defend our freedom.", "Congress passed the bill.")]))

    def run(name, **contexts):
        cfg = _config(inputs, tmp_path / name, **contexts).model_copy(update={"pairs_file": str(f),
                                                                            "discriminator": str(disc)})
        harvest(cfg.model_validate(cfg.model_dump()), executor="inline", quiet=True)
        return tmp_path / name

    wide, reranked = run("wide", size=SHORTLIST), run("reranked", size=SIZE, rerank_shortlist=SHORTLIST)
    w_sent = _table(wide, "sentences").set_index("sentence_id")
    w_cs = _table(wide, "context_scores").set_index(["sentence_id", "context_id"])
    assert w_cs.disc.notna().all()
    # the S the re-rank scored and Eq. 4 read is Eq. 3 with the disc term (λ all 1), as a plain scoring's
    r_cs = _table(reranked, "context_scores").set_index(["sentence_id", "context_id"])
    common = r_cs.index.intersection(w_cs.index)
    assert len(common) == len(r_cs)
    scored = r_cs[r_cs.S.notna()]  # not those left out in a partner's window that holds the sentence
    assert np.allclose(scored.S, scored[["disc", "fwd", "left", "right"]].sum(axis=1), atol=1e-5)
    assert np.allclose(r_cs.loc[common, "S"], w_cs.loc[common, "S"], rtol=0, atol=1e-5, equal_nan=True)
    differs = 0
    for s, row in _table(reranked, "sentences").set_index("sentence_id").iterrows():
        shortlist = list(w_sent.context_ids[s])
        S = np.array([w_cs.S[(s, c)] for c in shortlist])
        by_S = [shortlist[i] for i in np.argsort(-S, kind="stable")][:SIZE] if len(shortlist) > SIZE else shortlist
        assert list(row.context_ids) == by_S
        differs += list(row.context_ids) != shortlist[:SIZE]  # the shortlist is in the discriminator's order
    assert differs >= 2


SETTINGS = {"ungrouped": {}, "grouped": {"grouping": {"enabled": True, "pairs_per_group": 2}},
            "double-centred": {"metric": "double-centred", "reference_sentences": 2},
            "no context_scores": {"keep_context_scores": "none"}}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_reranked_call_equals_a_plain_one_over_the_eq3_top(inputs, tmp_path, setting):
    """ScoreStage with a shortlist gives, unit for unit, what a plain ScoreStage gives on the same units with each
    C_s cut to its Eq. 3 top beforehand: the rows, the context_scores and the sentences' C_s. Three units go to one
    call, one of them with a sentence left in no pair (it keeps a C_s; its shortlist's items are counted)."""
    from dataclasses import replace

    from sentsim.context.scorer import ContextItem
    from sentsim.harvest.stages import ContextStage, ScoreStage
    from sentsim.harvest.work import envelope, work_of

    texts = ds.dataset(str(inputs["corpus"] / "sentences")).to_table(columns=["text"]).column("text").to_pylist()
    texts = [t for t in texts if len(t.split()) >= 6][:40:3]
    units = [{"unit": u, "pairs": [(texts[4 * u], texts[4 * u + 1], None), (texts[4 * u], texts[4 * u + 2], None),
                                   (texts[4 * u + 3], texts[4 * u + 1], None)]} for u in range(3)]
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "unused", pairs_file="x",
                         scoring={"autocast": "off"}, rank={"enabled": False},
                         contexts={"size": SIZE, "rerank_shortlist": SHORTLIST}, **SETTINGS[setting])
    plain_cfg = cfg.model_copy(update={"contexts": cfg.contexts.model_copy(update={"rerank_shortlist": 0})})
    context = ContextStage(cfg, window=1)
    context.setup()
    refs = texts[-2:] if cfg.metric == "double-centred" else []
    with_contexts = [work_of(x) for x in context.process(units)]
    with_contexts[2] = replace(with_contexts[2], pairs=with_contexts[2].pairs[:2])  # texts[11] is in no pair now
    reranking, plain = ScoreStage(cfg, refs), ScoreStage(plain_cfg, refs)
    reranking.setup()
    plain.setup()
    got = [work_of(x) for x in reranking.process([envelope(w) for w in with_contexts])]

    cut, shortlist_items = [], 0
    for w in with_contexts:  # each C_s cut to its top |C_s| by S, scored here one sentence at a time
        csets = {}
        for s, cs in w.csets.items():
            if len(cs.contexts) > SIZE:
                S = plain.scorer.score([ContextItem(w.texts[s], c.left, c.right, w.disc.get((s, c.key)))
                                        for c in cs.contexts]).score
                csets[s] = replace(cs, contexts=[cs.contexts[i] for i in np.argsort(-S, kind="stable")[:SIZE]])
                shortlist_items += len(cs.contexts)
            else:
                csets[s] = cs
        cut.append(replace(w, csets=csets))
    assert shortlist_items > 0
    want = [work_of(x) for x in plain.process([envelope(w) for w in cut])]
    for g, e in zip(got, want):
        assert g.sentences == e.sentences
        assert [r.pair for r in g.rows] == [r.pair for r in e.rows] and [r.group_id for r in g.rows] == [
            r.group_id for r in e.rows]
        for rg, re_ in zip(g.rows, e.rows):
            assert rg.eq4.keys() == re_.eq4.keys()
            for k, v in rg.eq4.items():
                assert (v == re_.eq4[k]) if not isinstance(v, float) else v == pytest.approx(re_.eq4[k], abs=1e-6)
        assert [x[:2] for x in g.context_scores] == [x[:2] for x in e.context_scores]
        assert np.allclose(np.array([x.S for x in g.context_scores], dtype=float),
                           np.array([x.S for x in e.context_scores], dtype=float), atol=1e-5, equal_nan=True)
    assert (cfg.keep_context_scores == "none") == (not any(g.context_scores for g in got))
    in_no_pair = {s for s in with_contexts[2].csets} - {s for p in with_contexts[2].pairs for s in (p.s1_id, p.s2_id)}
    assert in_no_pair and all(len(got[2].sentences[s].context_ids) <= SIZE for s in in_no_pair)
    # every item scored once: the shortlists', and those of Eq. 4 they do not hold
    assert sum(g.n_scored for g in got) <= shortlist_items + sum(e.n_scored for e in want)
    assert sum(g.n_scored for g in got) >= shortlist_items


def test_a_remix_compares_with_the_weights_c_s_was_chosen_under(runs, inputs, tmp_path):
    """The note is about the harvest's λ, through remixes of remixes; a double-centred re-ranked harvest
    remixes under --metric pearson like any other."""
    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    _, reranked, _ = runs

    def kept(source, out, **lam):
        m = remix(RemixConfig(source=str(source), out=str(tmp_path / out), **lam), quiet=True)
        return m["remix"].get("c_s_chosen_under_source_weights")

    assert kept(reranked, "a", lambda_left=0.0) == SHORTLIST
    assert kept(tmp_path / "a", "b") == SHORTLIST  # a's own λ are not those C_s was chosen under
    assert kept(tmp_path / "a", "c", lambda_left=1.0) is None  # the harvest's λ again
    centred = tmp_path / "centred"
    harvest(_config(inputs, centred, size=SIZE, rerank_shortlist=SHORTLIST).model_copy(update={
        "metric": "double-centred", "reference_sentences": 2}), executor="inline", quiet=True)
    assert kept(centred, "d", metric="pearson", lambda_left=0.0) == SHORTLIST
