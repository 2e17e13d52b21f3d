"""The harvest's math and identity, checked by hand on a fixture whose pair scores are spread out.

- Eq. 4 (003 §3.3) runs over C_s1 + C_s2: every stored score equals the centred cosine of the
  stored S over both context sets, at a tolerance far below the spread of the scores, and the same
  over C_s1 alone would miss by far more than that tolerance (the test says so, so it cannot pass
  on a fixture that cannot tell the two apart, as the ~3e-5 spread of an untrained model could not).
- `sentsim remix` applies each new λ to its own term: every remixed score is recomputed by hand from
  the source's stored terms, and a remix that kept the source's weight for any one term would miss.
- The fingerprint covers every config key that changes the rows: changing any one refuses the resume
  (naming the key), and changing an execution-only key, or one this mode of harvest never reads, resumes the
  finished run. Every key of the
  schema is listed here as one or the other, so a new key cannot be left out unnoticed.
"""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.dataset as ds
import pytest
from harvest_support import build_index_for, harvest_config, tiny_bert, tiny_context_bundle

pytestmark = pytest.mark.slow

TERMS = ("fwd", "left", "right")
# λ of the fixture harvest: the forward term dominates, the context terms still count
SOURCE_LAMBDA = {"disc": 0.0, "fwd": 1.0, "left": 0.02, "right": 0.02}
EQ4_TOL = 1e-5  # stored S is float32; Eq. 4 over it agrees with the harvest's float64 scores to ~5e-7
REMIX_TOL = 1e-9  # a remix computes from the very float32 terms read here


@pytest.fixture(scope="module")
def spread(speech_corpus, tmp_path_factory):
    """A grouped, rank-enabled harvest whose pair scores spread over most of [-1, 1]."""
    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("spread")
    index = build_index_for(speech_corpus, root / "index")
    bundle = tiny_context_bundle(speech_corpus, root / "ctx", weight_scale=10.0)
    cfg = harvest_config(speech_corpus, index, bundle, root / "run",
                         scoring={"batch_tokens": 2048, **{f"lambda_{t}": v for t, v in SOURCE_LAMBDA.items()}},
                         grouping={"enabled": True})
    m = harvest(cfg, executor="inline", quiet=True)
    assert m["complete"]
    return {"cfg": cfg, "run": root / "run", "corpus": speech_corpus, "index": index, "bundle": bundle, "root": root}


def tables(run):
    out = {t: ds.dataset(str(run / t)).to_table().to_pandas() for t in ("pairs", "sentences", "context_scores")}
    out["pairs"] = out["pairs"].sort_values("pair_id").reset_index(drop=True)
    return out


def centred_cosine(a, b) -> float:
    """Eq. 4 with the default metric (pearson), written out: entries scored for both, each vector centred."""
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok] - a[ok].mean(), b[ok] - b[ok].mean()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def eq3(terms: dict, lam: dict) -> np.ndarray:
    """Eq. 3 written out: S = sum of λ_t · term_t over the weighted terms an item has; NaN if it has none."""
    total = np.zeros(len(next(iter(terms.values()))))
    used = np.zeros(len(total), dtype=int)
    for t, v in terms.items():
        if lam.get(t, 0.0) != 0.0:
            ok = np.isfinite(v)
            total += np.where(ok, lam[t] * np.where(ok, v, 0.0), 0.0)
            used += ok
    return np.where(used > 0, total, np.nan)


def by_hand(t: dict, S: np.ndarray, union: bool = True) -> np.ndarray:
    """Every pair's Eq. 4 from S, over C_s1 + C_s2 (sentences.context_ids), or over C_s1 alone."""
    cs, own = t["context_scores"], dict(zip(t["sentences"].sentence_id, t["sentences"].context_ids))
    row = {(s, k): i for i, (s, k) in enumerate(zip(cs.sentence_id, cs.context_id))}
    out = []
    for a, b in zip(t["pairs"].s1_id, t["pairs"].s2_id):
        keys = list(own[a]) + (list(own[b]) if union else [])
        out.append(centred_cosine(S[[row[(a, k)] for k in keys]], S[[row[(b, k)] for k in keys]]))
    return np.array(out)


def test_eq4_is_over_both_context_sets_by_hand(spread):
    t = tables(spread["run"])
    cs, score = t["context_scores"], t["pairs"].score.to_numpy(np.float64)
    assert np.isfinite(score).all()
    # Eq. 3 by hand: the stored S is the weighted sum of the stored terms (float32 rounding)
    S = cs.S.to_numpy(np.float64)
    manual_S = eq3({x: cs[x].to_numpy(np.float64) for x in TERMS}, SOURCE_LAMBDA)
    np.testing.assert_allclose(S, manual_S, rtol=1e-6)
    union, alone = by_hand(t, S), by_hand(t, S, union=False)
    assert score.std() > 0.1 and score.max() - score.min() > 0.5, "the fixture's scores must be spread out"
    np.testing.assert_allclose(score, union, rtol=0, atol=EQ4_TOL)
    # the tolerance tells the two apart: over C_s1 alone most pairs miss by far more than it
    miss = np.abs(alone - score)
    assert np.median(miss) > 100 * EQ4_TOL and miss.max() > 0.1


@pytest.mark.parametrize("new", [
    {"fwd": 0.3, "left": 1.0, "right": 0.0},
    {"fwd": 1.0, "left": 0.0, "right": 0.05},
    {"fwd": 0.2, "left": 0.0, "right": 1.0},  # (a weight alone would not show: Eq. 4 ignores scale)
])
def test_remix_weighs_each_term_with_its_new_lambda(spread, tmp_path, new):
    from sentsim.harvest.remix import RemixConfig, remix

    m = remix(RemixConfig(source=str(spread["run"]), out=str(tmp_path / "mix"),
                          **{f"lambda_{x}": v for x, v in new.items()}), quiet=True)
    assert m["complete"] and m["remix"]["weights"] == {"disc": 0.0, **new}
    src, got = tables(spread["run"]), tables(tmp_path / "mix")
    assert got["pairs"].pair_id.tolist() == src["pairs"].pair_id.tolist()
    terms = {x: src["context_scores"][x].to_numpy(np.float64) for x in TERMS}
    lam = {"disc": 0.0, **new}
    expected = by_hand(src, eq3(terms, lam))
    score = got["pairs"].score.to_numpy(np.float64)
    np.testing.assert_allclose(score, expected, rtol=0, atol=REMIX_TOL)
    np.testing.assert_allclose(got["context_scores"].S.to_numpy(np.float64), eq3(terms, lam), rtol=1e-6)
    # each term's weight shows: had any one term kept the source's λ, the scores would be off by far more
    for x in TERMS:
        if new[x] != SOURCE_LAMBDA[x]:
            wrong = by_hand(src, eq3(terms, dict(lam, **{x: SOURCE_LAMBDA[x]})))
            assert np.nanmax(np.abs(wrong - score)) > 1e3 * REMIX_TOL, f"the fixture cannot see λ_{x}"


def test_remix_command_takes_unset_lambdas_from_the_source(spread, tmp_path):
    """`sentsim remix` as a user types it: --lambda-left alone; fwd and right keep the source's weights."""
    from conftest import sentsim_cli

    r = sentsim_cli("remix", spread["run"], "--out", tmp_path / "mix", "--lambda-left", "0.5")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    src, got = tables(spread["run"]), tables(tmp_path / "mix")
    lam = dict(SOURCE_LAMBDA, left=0.5)
    expected = by_hand(src, eq3({x: src["context_scores"][x].to_numpy(np.float64) for x in TERMS}, lam))
    np.testing.assert_allclose(got["pairs"].score.to_numpy(np.float64), expected, rtol=0, atol=REMIX_TOL)
    for flag in ("inf", "nan", "-1"):  # and a weight that is not a finite number of 0 or more: one line, exit 2
        r = sentsim_cli("remix", spread["run"], "--out", tmp_path / f"bad{flag}", "--lambda-fwd", flag)
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert "--lambda-fwd" in r.stderr and not (tmp_path / f"bad{flag}").exists()


# Every config key of the harvest (HarvestConfig, flattened), with a value it can take instead of the
# fixture's; those that change the rows refuse the resume, the others resume the finished run.
SEMANTIC = {
    "seed": 4, "metric": "spearman", "reference_sentences": 4, "splits": [0.9, 0.05, 0.05],
    "keep_context_scores": "none",
    "anchors.n": 10, "anchors.per_unit": 4, "anchors.min_tokens": 5,
    "partners.neighbours": 2, "partners.same_doc": 0, "partners.random": 2, "partners.neighbour_chunks": 4,
    "contexts.size": 5, "contexts.retrieve_chunks": 30, "contexts.jaccard": 0.4, "contexts.one_per_chunk": False,
    "contexts.exclude_query_centre": False, "contexts.exclude_query_window": False, "contexts.mode": "random",
    "contexts.exclude_in_partner_contexts": False,
    "contexts.rerank_shortlist": 12,
    "scoring.lambda_disc": 0.5, "scoring.lambda_fwd": 0.9, "scoring.lambda_left": 0.1, "scoring.lambda_right": 0.1,
    "scoring.ablation": "no_left", "scoring.use_fwd": False, "scoring.skip_disabled": False, "scoring.autocast": "bf16",
    "rank.enabled": False, "rank.n_anchors": 32, "rank.bits": 8, "rank.storage": "vectors",
    "grouping.enabled": False, "grouping.score": "centred",
}
# keys a corpus harvest never reads (HarvestConfig.unread_keys): its units are anchors.per_unit anchors and a
# group is an anchor and its partners, so they change no row and resume the finished run (an explicit --pairs
# harvest reads them and not the anchors.* and partners.* ones: tests/harvest/test_harvest.py)
UNREAD = {"pairs_per_unit": 32, "grouping.pairs_per_group": 2}
# a pool harvest (contexts.mode=pool) of each kind: the keys it never reads (HarvestConfig.unread_keys), which
# leave its fingerprint alone, and keys it reads beside them, which move it. A corpus harvest labels units of
# pairs_per_unit planned pairs and scores units of sentences_per_unit sentences, never anchors.per_unit anchors;
# a clustered one pairs within clusters, not with partners; a --pairs one pairs the file's rows (the real runs:
# tests/harvest/test_pool_harvest.py::test_a_pool_run_resumes_whatever_the_keys_it_never_reads_say)
POOL_KINDS = {"corpus": {}, "clustered": {"partners": {"cluster_size": 4}}, "pairs": {"pairs_file": "pairs.tsv"}}
PARTNERS = {"partners.neighbours": 2, "partners.same_doc": 0, "partners.random": 2, "partners.neighbour_chunks": 4}
POOL_UNREAD = {"corpus": {"anchors.per_unit": 4}, "clustered": {"anchors.per_unit": 4, **PARTNERS},
               "pairs": {"anchors.n": 10, "anchors.per_unit": 4, "anchors.min_tokens": 5, **PARTNERS}}
POOL_READ = {"corpus": {"pairs_per_unit": 32, "sentences_per_unit": 16, "anchors.n": 10, "anchors.min_tokens": 5,
                        "partners.cluster_size": 4, **PARTNERS},
             "clustered": {"pairs_per_unit": 32, "sentences_per_unit": 16, "anchors.n": 10, "anchors.min_tokens": 5,
                           "partners.cluster_size": 3, "partners.cluster_levels": 2},
             "pairs": {"pairs_per_unit": 32, "sentences_per_unit": 16}}
EXECUTION = {
    "scoring.device": "cpu", "scoring.torch_threads": 1, "scoring.batch_tokens": 1024, "scoring.compile": True,
    # the pool mode's own keys leave a per-pair harvest's rows alone (in pool mode they are semantic:
    # tests/harvest/test_pool_harvest.py)
    "contexts.pool_size": 64, "contexts.pool_draw": "clusters", "sentences_per_unit": 16,
    "contexts.random_full_windows": False,  # contexts.mode=random's own (tests/screening/test_random_contexts.py)
    **{f"resources.{stage}.{k}": v for stage in ("contexts", "scoring", "rank", "label")
       for k, v in (("num_cpus", 2.0), ("num_gpus", 1.0), ("memory_gb", 1.5), ("min_actors", 2), ("max_actors", 3),
                    ("units_per_call", 4))},
}
# keys that cannot change alone: the other keys that change with them
ALONG = {f"resources.{stage}.min_actors": {f"resources.{stage}.max_actors": 2}
         for stage in ("contexts", "scoring", "rank", "label")}
# keys refused outside contexts.mode=pool, so they cannot change alone here (tests/harvest/test_pool_harvest.py)
POOL_ONLY = ("partners.cluster_size", "partners.cluster_levels")
# keys refused without a discriminator in use, which the fixture has none of (the rep cache: read only with one,
# and then fingerprinted by its identity, not its path: sentsim/harvest/job.py, model_hashes)
DISCRIMINATOR_ONLY = ("contexts.rep_cache",)
# input paths: what they hold is fingerprinted, not how they are spelt (a copy resumes; see the test)
INPUTS = ("corpus", "out", "index", "discriminator", "context_models", "pairs_file", "rank.encoder")


def flat_keys(d: dict, prefix: str = "") -> set:
    out = set()
    for k, v in d.items():
        key = prefix + k
        out |= flat_keys(v, key + ".") if isinstance(v, dict) else {key}
    return out


def changed(cfg, key: str, value):
    """`cfg` with `key` set to `value` (and the keys ALONG it), validated as a config file would be."""
    from sentsim.harvest.config import HarvestConfig

    data = cfg.model_dump()
    for k, v in {key: value, **ALONG.get(key, {})}.items():
        node = data
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        assert node[last] != v or k != key, f"{key}: {value!r} is the fixture's own value"
        node[last] = v
    return HarvestConfig.model_validate(data)


def test_every_config_key_is_classified(spread):
    keys = flat_keys(spread["cfg"].model_dump())
    known = set(SEMANTIC) | set(UNREAD) | set(EXECUTION) | set(INPUTS) | set(POOL_ONLY) | set(DISCRIMINATOR_ONLY)
    assert keys == known, f"unclassified: {sorted(keys - known)}; gone: {sorted(known - keys)}"


@pytest.mark.parametrize("kind", sorted(POOL_KINDS))
def test_a_pool_runs_fingerprint_leaves_out_only_the_keys_it_never_reads(kind, tmp_path):
    """Config only (no run): a pool harvest's semantic config does not move with a key it never reads, and moves
    with each key it reads beside them; one of run format 4 or before (keep_unread) held them all."""
    cfg = harvest_config(tmp_path / "c", tmp_path / "i", tmp_path / "b", tmp_path / "o",
                         contexts={"mode": "pool", "pool_size": 8}, **POOL_KINDS[kind])
    sem, held = cfg.semantic(), cfg.semantic(keep_unread=True)
    assert {k.split(".")[0] if kind == "pairs" else k for k in POOL_UNREAD[kind]} == set(cfg.unread_keys())
    for key, value in POOL_UNREAD[kind].items():
        other = changed(cfg, key, value)
        assert other.semantic() == sem and other.semantic(keep_unread=True) != held, key
    for key, value in POOL_READ[kind].items():
        assert changed(cfg, key, value).semantic() != sem, key


def test_fingerprint_changes_with_each_semantic_key(spread):
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    refused = {}
    for key, value in SEMANTIC.items():
        with pytest.raises(UsageError, match="fingerprint") as err:
            harvest(changed(spread["cfg"], key, value), executor="inline", quiet=True)
        refused[key] = str(err.value)
    # and the refusal names the key that changed
    unnamed = [k for k, msg in refused.items() if f"{k}:" not in msg]
    assert not unnamed, unnamed


def test_execution_and_unread_keys_and_input_spellings_keep_the_fingerprint(spread, tmp_path):
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    cfg = spread["cfg"]
    fp = harvest(cfg, executor="inline", quiet=True)["fingerprint"]
    for key, value in {**EXECUTION, **UNREAD}.items():
        m = harvest(changed(cfg, key, value), executor="inline", quiet=True)
        assert m["complete"] and m["fingerprint"] == fp and m["this_run"]["units"] == 0, key
    # inputs are fingerprinted by what they hold: copies elsewhere resume, another model does not
    corpus, bundle = tmp_path / "corpus", tmp_path / "ctx"
    shutil.copytree(spread["corpus"], corpus)
    shutil.copytree(spread["bundle"], bundle)
    moved = cfg.model_copy(update={"corpus": str(corpus), "context_models": [str(bundle)]})
    m = harvest(moved, executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == fp and m["this_run"]["units"] == 0
    other = tiny_context_bundle(spread["corpus"], tmp_path / "other", seed=1, weight_scale=10.0)
    with pytest.raises(UsageError, match="fingerprint"):
        harvest(cfg.model_copy(update={"context_models": [str(other)]}), executor="inline", quiet=True)
    encoder = tiny_bert(tmp_path / "bert")
    with pytest.raises(UsageError, match="fingerprint"):
        harvest(changed(cfg, "rank.encoder", str(encoder)), executor="inline", quiet=True)
