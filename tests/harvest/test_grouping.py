"""Grouped scoring (sentsim/harvest/grouping.py): the three Eq. 4 variants, on their own and in real harvests."""

import numpy as np
import pyarrow.dataset as ds
import pytest
from harvest_support import build_index_for, harvest_config, tiny_context_bundle
from run_support import before_manifest_checksums

from sentsim.harvest.grouping import group_scores, needed, neighbour_groups
from sentsim.harvest.similarity import pair_similarity


def test_neighbour_groups_put_related_pairs_together():
    texts = [("The cat sat on the mat.", "A cat is sitting on a mat."),
             ("Stocks fell sharply today.", "Markets dropped on Monday."),
             ("A cat lies on the mat.", "The cat sleeps on a mat."),
             ("Stocks fell again today.", "Shares dropped sharply.")]
    g = neighbour_groups(texts, 2)
    assert g[0] == g[2] and g[1] == g[3] and g[0] != g[1]
    assert neighbour_groups(texts, 1) == [0, 1, 2, 3]
    assert neighbour_groups([("!!", "?"), ("...", "--")], 2) == [0, 0]  # no words: input order


def test_variants_against_direct_computation():
    rng = np.random.default_rng(0)
    own = {1: [10, 11], 2: [12, 13], 3: [14, 15]}
    pairs, group_of = [(1, 2), (1, 3)], [0, 0]
    table = {(s, k): float(rng.normal()) for s in own for k in range(10, 16)}
    assert set(needed(pairs, group_of, own)) == set(table)  # 3 sentences x the union of 6 contexts
    out = group_scores(pairs, group_of, own, lambda s, k: table[(s, k)], "pearson")
    keys = [10, 11, 12, 13, 14, 15]
    M = np.array([[table[(s, k)] for k in keys] for s in (1, 2, 3)])
    for (a, b), v in zip(pairs, out):
        pk = own[a] + own[b]
        paper = pair_similarity([table[(a, k)] for k in pk], [table[(b, k)] for k in pk], "pearson")
        assert v["paper"] == pytest.approx(paper)
        assert v["union"] == pytest.approx(np.corrcoef(M[a - 1], M[b - 1])[0, 1])
        e = M.mean(axis=0)
        x, y = M[a - 1] - M[a - 1].mean() - (e - e.mean()), M[b - 1] - M[b - 1].mean() - (e - e.mean())
        assert v["centred"] == pytest.approx(float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)))


def test_centring_removes_what_every_sentence_shares():
    """S = context predictability (shared) + a pair-specific part: (c) sees the pair, (a) and (b) the shared part."""
    rng = np.random.default_rng(1)
    keys = list(range(40))
    shared = rng.normal(0, 10, size=40)  # how predictable each context is, for every sentence
    topic = rng.normal(0, 1, size=40)
    part = {1: topic, 2: topic + rng.normal(0, 0.3, 40), 3: rng.normal(0, 1, 40), 4: rng.normal(0, 1, 40)}
    table = {(s, k): shared[k] + part[s][k] for s in part for k in keys}
    own = {s: keys[(s - 1) * 10:s * 10] for s in part}
    out = group_scores([(1, 2), (3, 4)], [0, 0], own, lambda s, k: table[(s, k)], "pearson")
    related, unrelated = out
    assert related["union"] > 0.9 and unrelated["union"] > 0.9  # both dominated by the shared part
    assert related["centred"] > 0.5 > unrelated["centred"]


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("grouping_inputs")
    return {"corpus": speech_corpus, "index": build_index_for(speech_corpus, root / "index"),
            "bundle": tiny_context_bundle(speech_corpus, root / "ctx")}


def _pairs(run):
    return ds.dataset(str(run / "pairs")).to_table().sort_by("pair_id").to_pandas()


@pytest.fixture(scope="module")
def runs(inputs, tmp_path_factory):
    """The same small corpus harvest, plain and grouped."""
    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("grouping_runs")
    over = dict(anchors={"n": 4, "per_unit": 2}, rank={"enabled": False})
    plain = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], root / "plain", **over)
    grouped = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], root / "grouped",
                             grouping={"enabled": True}, **over)
    m1 = harvest(plain, executor="inline", quiet=True)
    m2 = harvest(grouped, executor="inline", quiet=True)
    assert m1["complete"] and m2["complete"]
    return plain, grouped, root


@pytest.mark.slow
def test_grouped_corpus_harvest_keeps_the_papers_score_and_adds_two(runs):
    plain, _, root = runs
    assert "grouping" not in plain.semantic()  # ungrouped runs keep the fingerprint they had before grouping
    a, b = _pairs(root / "plain"), _pairs(root / "grouped")
    assert len(a) == len(b) > 4
    assert list(a.pair_id) == list(b.pair_id)
    # (a) is the paper's Eq. 4, unchanged; the same items scored in other batches differ in the last bits
    np.testing.assert_allclose(b.score_paper, a.score, rtol=1e-6)
    np.testing.assert_allclose(b.score, b.score_paper)  # grouping.score=paper by default
    assert (b.group_id == b.s1_id).all()  # a corpus harvest's group is the anchor and its partners
    assert b.score_union.notna().all() and b.score_centred.notna().all()
    assert np.abs(b.score_union - b.score_paper).max() > 1e-7  # another vector, not a copy of (a)
    # the untrained model's pearson scores all sit within 1e-4 of 1; centring spreads them out
    assert b.score_paper.std() < 1e-4 < 0.05 < b.score_centred.std()
    n_plain = ds.dataset(str(root / "plain" / "context_scores")).count_rows()
    n_grouped = ds.dataset(str(root / "grouped" / "context_scores")).count_rows()
    assert n_grouped > n_plain  # the cross items of each group's union were scored and kept


@pytest.mark.slow
def test_remix_recomputes_the_three_variants_and_picks_one(runs, tmp_path):
    from conftest import sentsim_cli

    from sentsim.errors import UsageError
    from sentsim.harvest.remix import RemixConfig, remix

    _, _, root = runs
    src = _pairs(root / "grouped")
    r = sentsim_cli("remix", str(root / "grouped"), "--out", str(tmp_path / "c"), "--variant", "centred")
    assert r.returncode == 0 and "Eq. 4 variant centred" in r.stdout, r.stderr
    out = _pairs(tmp_path / "c")
    # from the stored (float32) terms: equal to the harvest's float64 values to that precision. The
    # untrained model's centred residuals are ~1e-5 nats, where float32's ~5e-7 rounding shows at 1e-3;
    # a trained model's per-context spread across sentences is 0.1-1 nats
    for v, tol in (("paper", 1e-5), ("union", 1e-5), ("centred", 1e-2)):
        np.testing.assert_allclose(out[f"score_{v}"], src[f"score_{v}"], atol=tol)
    assert np.corrcoef(out.score_centred, src.score_centred)[0, 1] > 0.999
    np.testing.assert_allclose(out.score, out.score_centred)
    with pytest.raises(UsageError, match="needs a grouped harvest"):
        remix(RemixConfig(source=str(root / "plain"), out=str(tmp_path / "x"), variant="union"), quiet=True)


@pytest.mark.slow
def test_grouped_pairs_run_groups_neighbours_and_scores_the_chosen_variant(inputs, tmp_path):
    from sentsim.harvest.job import harvest

    f = tmp_path / "pairs.tsv"
    f.write_text("s1\ts2\n"
                 "The nation must remain strong.\tOur country has to stay powerful.\n"
                 "Taxes were cut this year.\tThe government lowered taxes.\n"
                 "Our nation must stay strong.\tThe country must remain powerful.\n"
                 "Taxes were lowered this year.\tThe government cut taxes again.\n")
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "run", pairs_file=str(f),
                         pairs_per_unit=4, rank={"enabled": False},
                         grouping={"enabled": True, "pairs_per_group": 2, "score": "centred"})
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    t = _pairs(tmp_path / "run").set_index("s1")
    assert t.group_id.nunique() == 2
    assert t.loc["The nation must remain strong."].group_id == t.loc["Our nation must stay strong."].group_id
    assert t.loc["Taxes were cut this year."].group_id == t.loc["Taxes were lowered this year."].group_id
    np.testing.assert_allclose(t.score, t.score_centred)


@pytest.mark.slow
def test_remix_keeps_a_pair_without_contexts_in_its_group(inputs, tmp_path, capsys):
    """A grouped --pairs harvest in which one pair's sentences get no context (no word of theirs is in
    the corpus): the pair has no score, but its sentences still belong to its group, and the centred
    variant averages over all of the group's sentences. A remix with the source's weights gives every
    pair's three variants as the harvest did (to float32 rounding of the terms), that pair's included,
    and keeps its null score and reason. The command's summary says why the pair has no score."""
    from harvest_support import cli_in_process

    from sentsim.harvest.eq4_rows import NO_CONTEXTS
    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    f = tmp_path / "pairs.tsv"
    f.write_text("s1\ts2\n"
                 "The nation must remain strong.\tOur country has to stay powerful.\n"
                 "Taxes were cut this year.\tThe government lowered taxes.\n"
                 "zzqx qqzx\txqzz zqxq\n"
                 "We will defend our freedom.\tThe weather was cold.\n")
    run = tmp_path / "run"
    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], run, pairs_file=str(f),
                         pairs_per_unit=4, rank={"enabled": False},
                         grouping={"enabled": True, "pairs_per_group": 2, "score": "centred"})
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    src = _pairs(run)
    lonely = src.null_reason.fillna("").str.startswith(NO_CONTEXTS)
    assert lonely.sum() == 1 and src[lonely].score.isna().all()
    group = src[src.group_id == src[lonely].group_id.iloc[0]]
    assert len(group) == 2 and group.score_centred.notna().all()  # its partner pair's contexts are the union
    (tmp_path / "run.yaml").write_text(cfg.model_dump_json())  # YAML reads JSON: the finished run, summarised
    r = cli_in_process(capsys, "harvest", "--config", tmp_path / "run.yaml", "--executor", "inline")
    assert r.returncode == 0 and f"  null scores: 1 {NO_CONTEXTS}\n" in r.stdout, r.stdout + r.stderr

    remix(RemixConfig(source=str(run), out=str(tmp_path / "same")), quiet=True)
    out = _pairs(tmp_path / "same")
    assert list(out.pair_id) == list(src.pair_id)
    for v, tol in (("paper", 1e-5), ("union", 1e-5), ("centred", 1e-2)):  # tolerances as in the remix test above
        np.testing.assert_allclose(out[f"score_{v}"], src[f"score_{v}"], atol=tol)
    assert out.score.isna().tolist() == src.score.isna().tolist()
    assert out.null_reason.tolist() == src.null_reason.tolist()
    assert (out.n_ctx_s1 == src.n_ctx_s1).all() and (out.n_ctx_s2 == src.n_ctx_s2).all()


@pytest.mark.slow
@pytest.mark.parametrize("pairs_file", [False, True], ids=["corpus", "pairs"])
def test_every_grouped_item_holds_the_discriminator_term(inputs, tmp_path, pairs_file):
    """Screened by a discriminator, a grouped harvest scores each sentence over its group's whole union, and
    every one of those items holds Eq. 3's disc term, not only a sentence's own and its partner's contexts:
    S is the sum of its four terms throughout (λ all 1), so the union and centred variants compare like with like."""
    import json

    from run_support import save_untrained_discriminator

    from sentsim.harvest.job import harvest

    disc = save_untrained_discriminator(inputs["corpus"], tmp_path / "disc")
    over = dict(discriminator=str(disc), grouping={"enabled": True, "pairs_per_group": 3}, rank={"enabled": False})
    if pairs_file:
        f = tmp_path / "pairs.jsonl"
        f.write_text("".join(json.dumps({"s1": a, "s2": b}) + "\n" for a, b in [
            ("The nation must remain strong.", "Our country has to stay powerful."),
            ("Our nation is strong and free.", "We will defend our freedom."),
            ("Taxes were cut this year.", "The government lowered taxes."),
            ("Congress passed the bill.", "The law was approved by Congress.")]))
        over.update(pairs_file=str(f), pairs_per_unit=4)
    harvest(harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "run", **over),
            executor="inline", quiet=True)
    cs = ds.dataset(str(tmp_path / "run" / "context_scores")).to_table().to_pandas()
    # an item whose context's window holds its sentence is left out, null throughout
    # (contexts.exclude_in_partner_contexts); every other holds every term
    left_out = cs.S.isna()
    assert cs[left_out][["disc", "fwd", "left", "right"]].isna().all().all()
    cs = cs[~left_out]
    own = ds.dataset(str(tmp_path / "run" / "sentences")).to_table().to_pandas()
    own = {(s, c) for s, ids in zip(own.sentence_id, own.context_ids) for c in ids}
    beyond = [(s, c) not in own for s, c in zip(cs.sentence_id, cs.context_id)]
    assert sum(beyond) > 0 and cs.disc.notna().all(), int(cs.disc.isna().sum())
    assert np.allclose(cs.S, cs[["disc", "fwd", "left", "right"]].sum(axis=1), atol=1e-5)


def test_an_unfinished_harvest_of_an_earlier_scoring_revision_is_refused_on_resume(inputs, tmp_path):
    """A grouped harvest with a discriminator, begun by a sentsim that left the disc term out of group-mates'
    items (scoring revision 1, sentsim/run_formats.py), is refused by the command in one line with exit 2 rather
    than finished with units of two kinds; --force-new scores it again. Finished, the same run reruns as a no-op,
    and a revision-1 harvest the fix did not touch (no grouping) resumes."""
    import json

    from conftest import error_line, sentsim_cli
    from run_support import save_untrained_discriminator

    from sentsim.harvest.job import harvest

    disc = save_untrained_discriminator(inputs["corpus"], tmp_path / "disc")
    over = dict(discriminator=str(disc), anchors={"n": 4, "per_unit": 2}, rank={"enabled": False})

    def begun_by_an_earlier_sentsim(name, **more):
        cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / name, **over, **more)
        stopped = harvest(cfg, executor="inline", quiet=True, max_units=1)
        assert not stopped["complete"]
        manifest = tmp_path / name / "manifest.json"
        m = json.loads(manifest.read_text())
        assert m.pop("scoring_revision") == 2  # what this sentsim records; an earlier one recorded none
        before_manifest_checksums(m)  # nor a checksum of the manifest
        manifest.write_text(json.dumps(m))
        config = tmp_path / f"{name}.yaml"
        config.write_text(json.dumps(cfg.model_dump()))  # JSON is YAML
        return lambda *extra: sentsim_cli("harvest", "--config", config, "--executor", "inline", *extra)

    grouped = begun_by_an_earlier_sentsim("grouped", grouping={"enabled": True})
    r = grouped()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert "earlier sentsim (scoring revision 1)" in line and "group-mates' contexts" in line
    assert "--force-new" in line
    assert len(list((tmp_path / "grouped" / "_units").glob("*.json"))) == 1  # nothing scored, nothing removed

    r = grouped("--force-new")
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((tmp_path / "grouped" / "manifest.json").read_text())
    assert m["complete"] and m["scoring_revision"] == 2
    # a finished run of revision 1 holds one kind of score: rerunning it is the usual no-op
    m.pop("scoring_revision")
    before_manifest_checksums(m)  # that sentsim wrote no checksum of the manifest either
    (tmp_path / "grouped" / "manifest.json").write_text(json.dumps(m))
    r = grouped()
    assert r.returncode == 0, r.stderr[-2000:]

    plain = begun_by_an_earlier_sentsim("plain")
    r = plain()
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert m["complete"] and "scoring_revision" not in m  # a resumed run keeps what it began with


def test_revision_changes_name_what_the_disc_fix_changed():
    from sentsim.run_formats import revision_changes

    assert revision_changes(1, disc=True, grouped=False, context_effect=True) == [
        "the discriminator term of the reference sentences' items (the context effect)"]
    assert revision_changes(1, disc=False, grouped=True, context_effect=True) == []  # nothing was missing
    assert revision_changes(2, disc=True, grouped=True, context_effect=True) == []
