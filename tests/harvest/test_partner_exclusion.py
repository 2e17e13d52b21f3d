"""A sentence is not compared in a partner's context whose window holds it (contexts.exclude_in_partner_contexts):
its own C_s leaves such windows out (exclude_query_centre, exclude_query_window), and Eq. 4 scores it in C_s2 too,
where the context models would copy it into one outlier of S(s1, .) that s2 does not share."""

import numpy as np
import pyarrow.dataset as ds
import pytest
from conftest import error_line, sentsim_cli
from harvest_support import harvest_config, harvest_inputs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    return harvest_inputs(speech_corpus, tmp_path_factory.mktemp("partner_excl"))


def _config(inputs, out, **contexts):
    # neighbour partners share windows most often; fp32 scoring gives the same scores on every machine
    return harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, anchors={"n": 24, "per_unit": 8},
                          partners={"neighbours": 2, "same_doc": 1, "random": 1, "neighbour_chunks": 8},
                          contexts={"size": 12, "retrieve_chunks": 200, **contexts}, rank={"enabled": False},
                          scoring={"batch_tokens": 2048, "autocast": "off"})


def _tables(out):
    return {t: ds.dataset(str(out / t)).to_table().to_pandas() for t in ("pairs", "sentences", "context_scores")}


def _holds(corpus, centre: int, text: str, w: int) -> bool:
    from corpus.documents import doc_key_of

    return any(doc_key_of(centre + d) == doc_key_of(centre) and (corpus.text(centre + d) or "").strip() == text.strip()
               for d in range(-w, w + 1))


def test_eq4_leaves_out_a_sentence_in_a_partners_context_that_holds_it(inputs, tmp_path):
    from corpus.view import CorpusIndex
    from sentsim.harvest.job import HarvestRun, harvest
    from sentsim.harvest.similarity import pair_similarity

    runs = {}
    for on in (True, False):
        cfg = _config(inputs, tmp_path / str(on), exclude_in_partner_contexts=on)
        assert harvest(cfg, executor="inline", quiet=True)["complete"]
        runs[on] = _tables(tmp_path / str(on))
    corpus = CorpusIndex(str(inputs["corpus"]))
    w = HarvestRun.context_window(type("R", (), {"cfg": cfg})())
    t = runs[True]
    text = dict(zip(t["sentences"].sentence_id, t["sentences"].text))
    own = dict(zip(t["sentences"].sentence_id, t["sentences"].context_ids))
    cs = t["context_scores"].set_index(["sentence_id", "context_id"])
    cs = cs[~cs.index.duplicated()]  # a sentence in pairs of two units is scored in each
    held = 0
    for p in t["pairs"].itertuples():
        keys = [int(k) for k in (*own[p.s1_id], *own[p.s2_id])]
        for s in (p.s1_id, p.s2_id):
            for k in keys:
                gone = _holds(corpus, k, text[s], w)
                assert np.isnan(cs.loc[(s, k), "S"]) == gone, (s, k)
                held += gone
        # the pair's score is Eq. 4 over the contexts left, as a direct computation gives it
        v1, v2 = (np.array([cs.loc[(s, k), "S"] for k in keys], dtype=np.float64) for s in (p.s1_id, p.s2_id))
        want = pair_similarity(v1, v2, "pearson")
        assert (p.score is None or np.isnan(p.score)) if not np.isfinite(want) else p.score == pytest.approx(want,
                                                                                                           abs=1e-5)
    assert held > 0  # some partner's C_s held its sentence: the case is exercised
    # off, as runs made before the key: those items are scored and compared, and only they differ
    off = runs[False]["context_scores"].set_index(["sentence_id", "context_id"])
    off = off[~off.index.duplicated()]
    assert off.S.notna().all()
    same = cs.S.notna()
    assert np.allclose(cs.S[same], off.S.loc[cs.index[same]], atol=1e-6)
    # an item left out is never scored: each unit scores as many fewer items as it keeps null rows for
    from storage import ShardStore

    def scored(on):
        return {u: m["extra"]["scored_items"] for u, m in ShardStore(str(tmp_path / str(on))).markers().items()}

    rows = runs[True]["context_scores"]
    null_rows = int(rows.S.isna().sum())
    assert null_rows > 0 and sum(scored(True).values()) == sum(scored(False).values()) - null_rows
    assert rows[rows.S.isna()][["fwd", "left", "right"]].isna().all().all()


def test_a_harvest_from_before_the_partner_exclusion_is_refused_by_name_and_resumes_with_it(inputs, tmp_path):
    c = _config(inputs, tmp_path / "x")
    args = ["harvest", "--corpus", c.corpus, "--index", c.index, "--context-models", c.context_models[0],
            "--out", tmp_path / "run", "--executor", "inline", "--set", "anchors.n=16", "--set", "anchors.per_unit=8",
            "--set", "contexts.size=6", "--set", "contexts.retrieve_chunks=40", "--set", "rank.enabled=false"]
    old = ["--set", "contexts.exclude_in_partner_contexts=false"]
    r = sentsim_cli(*args, *old, "--max-units", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    r = sentsim_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "(contexts.exclude_in_partner_contexts: False -> True)" in error_line(r.stderr), r.stderr[-2000:]
    r = sentsim_cli(*args, *old)
    assert r.returncode == 0 and "2/2 units" in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
