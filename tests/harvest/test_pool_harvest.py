"""The pool harvest (contexts.mode=pool): every sentence scored once against one shared pool P, pairs labelled
from the stored vectors. Rows against a direct computation, the context effect over every sentence, clustered
pairs, kill and resume of either pass, remix from the vectors, refusals, and the command on a local Ray."""

import json
import shutil

import numpy as np
import pyarrow.dataset as ds
import pytest
from conftest import error_line, sentsim_cli
from harvest_support import build_index_for, cli_in_process, harvest_config, tiny_context_bundle
from run_support import before_manifest_checksums, rewrite_manifest

from storage import ShardStore
from storage.store import FORMAT_VERSION

pytestmark = pytest.mark.slow

POOL = 12


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("pool_inputs")
    return {"corpus": speech_corpus, "index": build_index_for(speech_corpus, root / "index"),
            # weights scaled so that scores react to the sentence (harvest_support.tiny_context_bundle)
            "bundle": tiny_context_bundle(speech_corpus, root / "ctx", weight_scale=10)}


def pool_config(inputs, out, **over):
    # fp32 scoring: the same scores on machines with and without bf16, and whatever the batching
    base = dict(contexts={"mode": "pool", "pool_size": POOL}, anchors={"n": 10, "per_unit": 4},
                sentences_per_unit=8, pairs_per_unit=8, scoring={"batch_tokens": 2048, "autocast": "off"})
    return harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, **{**base, **over})


def pairs_of(run):
    return ds.dataset(str(run / "pairs")).to_table().sort_by("pair_id").to_pandas()


def vectors_of(run):
    from sentsim.harvest.pool_vectors import StoredVectors

    return StoredVectors(str(run / "pool_vectors"))


@pytest.fixture(scope="module")
def partners_run(inputs, tmp_path_factory):
    """Anchors with their partners, as a per-pair harvest pairs them, labelled by pearson over the pool."""
    from sentsim.harvest.job import harvest

    out = tmp_path_factory.mktemp("pool") / "run"
    cfg = pool_config(inputs, out)
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    return cfg, out


@pytest.fixture(scope="module")
def cluster_run(inputs, tmp_path_factory):
    """Every pair within TF-IDF clusters of 4 anchors, labelled by double-centred. The reads of its vectors run are
    counted (CLUSTER_RUN_READS): test_the_driver_reads_the_vectors_once_for_the_effect_and_the_labels checks them."""
    from sentsim.harvest.job import harvest

    out = tmp_path_factory.mktemp("pool") / "clusters"
    cfg = pool_config(inputs, out, metric="double-centred", partners={"cluster_size": 4}, anchors={"n": 12})
    with pytest.MonkeyPatch.context() as mp:
        reads = _count_vector_reads(mp)
        assert harvest(cfg, executor="inline", quiet=True)["complete"]
    CLUSTER_RUN_READS[:] = reads
    return cfg, out


CLUSTER_RUN_READS: list = []  # the cluster_run fixture's reads of its vectors run (in-process, inline)


def test_a_pair_is_eq4_over_the_pool_scored_directly(partners_run, inputs):
    """Each sentence in every pool context with the scorer itself (the pool as the run stored it); a pair's
    score is pearson of the two vectors; the sentences table and report say what was scored."""
    from sentsim.context.scorer import ContextItem, ContextScorer
    from storage import RunReader

    cfg, out = partners_run
    pool = RunReader(str(out / "pool_vectors")).side_table("pool").to_pydict()
    assert len(pool["context_id"]) == POOL and pool["context_id"] == sorted(pool["context_id"])
    t = pairs_of(out)
    assert len(t) > 0 and t.score.notna().all() and set(t.kind) <= {"neighbour", "same-doc", "random"}
    row = t.iloc[0]
    scorer = ContextScorer([str(inputs["bundle"])], cfg.scoring.model_copy(update={"device": "cpu"}))

    def vector(text):
        return scorer.score([ContextItem(text, left, right) for left, right in zip(pool["left"], pool["right"])]).score

    v1, v2 = vector(row.s1), vector(row.s2)
    a, b = v1 - v1.mean(), v2 - v2.mean()
    assert row.score == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-4)
    assert (t.n_ctx_s1 <= POOL).all() and (t.n_ctx_s1 >= POOL - 1).all()  # less its own window, if pooled
    sentences = ds.dataset(str(out / "sentences")).to_table().to_pandas()
    assert sentences.context_ids.isna().all() and (sentences.n_contexts >= POOL - 1).all()
    v = vectors_of(out)
    assert set(t.s1_id) | set(t.s2_id) == set(v.ids.tolist())  # every sentence of a pair scored, and only those
    report = json.loads((out / "report.json").read_text())
    assert report["scored_items"] == len(v.ids) * POOL
    assert report["scored_items_per_pair"] == pytest.approx(len(v.ids) * POOL / len(t))
    manifest = json.loads((out / "manifest.json").read_text())
    vectors_fp = json.loads((out / "pool_vectors" / "manifest.json").read_text())["fingerprint"]
    ranks_fp = json.loads((out / "pool_ranks" / "manifest.json").read_text())["fingerprint"]
    assert manifest["pool"] == {"size": POOL, "pairs": len(t), "sentences": len(v.ids),
                                "scored_items": len(v.ids) * POOL, "vectors_fingerprint": vectors_fp,
                                "ranks_fingerprint": ranks_fp}


def test_the_pool_run_labels_the_same_pairs_as_a_per_pair_run(partners_run, inputs, tmp_path):
    """The pair plan is the per-pair harvest's (anchors, then partners, owned once): only the labels differ. Run
    as a relabel in the pool run's folder (--force-new), it keeps the pool's runs there, which its manifest lists as
    runs it does not read (store verify names them, and an unfinished one is no damage to it)."""
    from sentsim.harvest.job import harvest
    from storage.verify import verify_store

    cfg, out = partners_run
    per_pair = tmp_path / "per_pair"
    shutil.copytree(out, per_pair)
    (per_pair / "pool_vectors" / "_COMPLETE").unlink()
    m = harvest(cfg.model_copy(update={"out": str(per_pair), "contexts": cfg.contexts.model_copy(
        update={"mode": "screened", "size": 4})}), executor="inline", quiet=True, force_new=True)
    assert pairs_of(per_pair).pair_id.tolist() == pairs_of(out).pair_id.tolist()
    assert m["complete"] and m["unread_nested_runs"] == ["pool_vectors", "pool_ranks"]
    assert verify_store(str(per_pair)) == []


def test_double_centred_removes_the_mean_over_every_sentence(cluster_run):
    from sentsim.harvest.metrics.double_centred import double_centred
    from storage import RunReader

    cfg, out = cluster_run
    v = vectors_of(out)
    effect = RunReader(str(out)).side_table("context_effect").column("effect").to_numpy()
    assert np.allclose(effect, np.nanmean(v.S.astype(np.float64), axis=0))
    t = pairs_of(out)
    for _, row in t.head(5).iterrows():
        a, b = (v.S[v.rows([s])[0]].astype(np.float64) for s in (row.s1_id, row.s2_id))
        ok = np.isfinite(a) & np.isfinite(b)
        assert row.score == pytest.approx(double_centred(a[ok], b[ok], effect[ok]), abs=1e-6)
    # 12 anchors in 3 clusters of 4: 3 x 6 pairs, each once, all among anchors
    assert len(t) == 18 and (t.kind == "cluster").all() and t.pair_id.is_unique
    assert len(v.ids) == 12
    assert json.loads((out / "report.json").read_text())["scored_items_per_pair"] == pytest.approx(12 * POOL / 18)


def _count_vector_reads(monkeypatch) -> list:
    from sentsim.harvest.pool_vectors import StoredVectors

    reads, init = [], StoredVectors.__init__

    def counted(self, uri):
        ranks = ShardStore(str(uri).replace("pool_vectors", "pool_ranks")).read_manifest() or {}
        reads.append((uri, ranks.get("complete")))
        init(self, uri)

    monkeypatch.setattr(StoredVectors, "__init__", counted)
    return reads


def test_the_driver_reads_the_vectors_once_for_the_effect_and_the_labels(cluster_run, tmp_path, monkeypatch):
    """double-centred reads the whole vectors run for the context effect before the first unit, and the label
    stage reads the same run: the driver reads it once for both, after the ranks pass, in-process (the cluster_run
    fixture's own inline run, its reads counted as it ran) and on Ray (where the label actors map the copy the
    driver put in the object store), and the Ray run labels the rows the inline run did."""
    from sentsim.harvest.job import harvest

    cfg, out = cluster_run
    # once, and after the ranks pass: the driver does not hold the vectors all through that pass
    assert CLUSTER_RUN_READS == [(str(out / "pool_vectors"), True)], "inline"
    again = tmp_path / "ray"
    reads = _count_vector_reads(monkeypatch)
    assert harvest(cfg.model_copy(update={"out": str(again)}), executor="ray", quiet=True)["complete"]
    assert reads == [(str(again / "pool_vectors"), True)], "ray"
    assert pairs_of(again).equals(pairs_of(out)), "ray"


def test_killed_in_either_pass_resumes_to_the_same_rows(partners_run, tmp_path, capsys):
    from sentsim.harvest.job import harvest

    cfg, out = partners_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    # a vectors unit lost and another's shard corrupt, a labelling unit lost and the run not finished
    (copy / "pool_vectors" / "_units" / "00001.json").unlink()
    shard = copy / "pool_vectors" / "sentence_vectors" / "part-00002.parquet"
    shard.write_bytes(shard.read_bytes()[:60])
    (copy / "pool_vectors" / "_COMPLETE").unlink()
    (copy / "_units" / "00000.json").unlink()
    (copy / "_COMPLETE").unlink()
    m = harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True)
    assert m["complete"]
    assert pairs_of(copy).drop(columns=["rank_sim"]).equals(pairs_of(out).drop(columns=["rank_sim"]))
    assert np.allclose(pairs_of(copy).rank_sim, pairs_of(out).rank_sim, atol=1e-6)
    # run one unit at a time (--max-units 1 bounds the vectors pass too, the costly one), then resumed to the
    # end: the same rows, each once
    part = tmp_path / "part"
    stopped = harvest(cfg.model_copy(update={"out": str(part)}), executor="inline", quiet=False, max_units=1)
    err = capsys.readouterr().err
    vec_units = ShardStore(str(part / "pool_vectors")).read_manifest()["planned_units"]
    assert not stopped["complete"] and stopped["completed_units"] == 0 and vec_units > 1
    assert len(list((part / "pool_vectors" / "_units").glob("*.json"))) == 1
    assert f"[harvest] the pool's sentence vectors ({part}/pool_vectors) stopped at --max-units 1, 1/{vec_units} " \
           "units done; no pair is labelled until they are all done" in err, err
    runs, part_cfg = 1, cfg.model_copy(update={"out": str(part)})
    while True:
        runs += 1
        if harvest(part_cfg, executor="inline", quiet=True, max_units=1)["complete"]:
            break
        assert runs < 50
    # one unit a run: the run that finishes the vectors also encodes the first unit of rank targets (a run of
    # as many units, pool_ranks.py), and the one that finishes those labels its first unit
    rank_units = ShardStore(str(part / "pool_ranks")).read_manifest()["planned_units"]
    assert rank_units == vec_units
    assert runs == vec_units + rank_units + stopped["planned_units"] - 2
    assert pairs_of(part).pair_id.tolist() == pairs_of(out).pair_id.tolist()
    assert np.allclose(pairs_of(part).score, pairs_of(out).score)


def test_another_metric_labels_from_the_same_vectors(partners_run, tmp_path):
    """Only labelling reads the metric: a harvest that differs in it reuses the vectors run (not rescored)."""
    from sentsim.harvest.job import harvest

    cfg, out = partners_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    before = {p.name: p.stat().st_mtime_ns for p in (copy / "pool_vectors" / "sentence_vectors").iterdir()}
    m = harvest(cfg.model_copy(update={"out": str(copy), "metric": "cosine"}), executor="inline", quiet=True,
                force_new=True)
    assert m["complete"] and m["config"]["metric"] == "cosine"
    after = {p.name: p.stat().st_mtime_ns for p in (copy / "pool_vectors" / "sentence_vectors").iterdir()}
    assert after == before
    assert not np.allclose(pairs_of(copy).score, pairs_of(out).score)


def test_remix_recomputes_a_pool_harvest_from_its_vectors(cluster_run, partners_run, tmp_path):
    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    cfg, out = cluster_run
    same = remix(RemixConfig(source=str(out), out=str(tmp_path / "same")), quiet=True)
    assert same["complete"] and same["remix"]["metric"] == "double-centred"
    # the source's λ_disc weighed nothing (a pool harvest scores no disc term): the remix says 0, not the default
    assert same["remix"]["weights"]["disc"] == 0.0 and same["remix"]["weights"]["fwd"] > 0
    assert np.allclose(pairs_of(tmp_path / "same").score, pairs_of(out).score, atol=1e-4)
    # new λ: the rows of a harvest scored with them (its vectors rescored from nothing)
    remix(RemixConfig(source=str(out), out=str(tmp_path / "nofwd"), lambda_fwd=0.0), quiet=True)
    direct = tmp_path / "direct"
    harvest(cfg.model_copy(update={"out": str(direct), "scoring": cfg.scoring.model_copy(
        update={"lambda_fwd": 0.0})}), executor="inline", quiet=True)
    assert np.allclose(pairs_of(tmp_path / "nofwd").score, pairs_of(direct).score, atol=1e-5)
    assert not np.allclose(pairs_of(tmp_path / "nofwd").score, pairs_of(out).score, atol=1e-2)
    # a remix of a remix reads the first harvest's vectors; students read a remix as any harvest
    again = remix(RemixConfig(source=str(tmp_path / "nofwd"), out=str(tmp_path / "again"), metric="pearson"),
                  quiet=True)
    assert again["complete"] and again["remix"]["pool_vectors"] == str(out / "pool_vectors")
    from sentsim.surrogate.data import inspect_harvest

    assert inspect_harvest(str(tmp_path / "again")).scored["train"] > 0
    r = sentsim_cli("remix", str(partners_run[1]), "--out", tmp_path / "dc", "--metric", "double-centred",
                    "--lambda-disc", "1")
    assert r.returncode == 2 and "disc term was not scored" in r.stderr and "Traceback" not in r.stderr


def test_remix_s_and_effect_by_blocks_of_rows_are_the_whole_runs_to_the_bit(cluster_run):
    """A pool remix computes S and the context effect a block of rows at a time (remix.pool_scores). On the
    harvest's stored vectors they are, to the bit, what combine_terms and pool_context_effect give over the whole
    run's float64 copies: blocks that divide the sentences and blocks that do not, one row, more rows than the run,
    λ of the source and others (a λ on disc, which a pool harvest never scores), and the stored terms with NaN
    entries, a row and a context unscored throughout."""
    from sentsim.context.scorer import TERMS, combine_terms
    from sentsim.harvest.pool_vectors import pool_context_effect
    from sentsim.harvest.remix import pool_remix_inputs, pool_scores

    cfg, out = cluster_run
    v = vectors_of(out)
    n, width = v.S.shape
    assert n == 12 and width == POOL

    def whole(terms, lam):  # the float64 copies of every term, combined at once, as remix did before blocks
        values = {t: terms[t].ravel().astype(np.float64) if t in terms else np.full(n * width, np.nan)
                  for t in TERMS}
        S = combine_terms(values, dict.fromkeys(TERMS, True), lam)[0].reshape(n, width)
        return S, pool_context_effect(S)

    stored = dict(v.terms)
    holed = {t: m.copy() for t, m in stored.items()}
    rng = np.random.default_rng(0)
    for t, m in holed.items():
        m[rng.random(m.shape) < 0.2] = np.nan
    holed["fwd"][3] = np.nan  # fwd unscored for a whole sentence: the other terms still sum there
    for m in holed.values():
        m[7] = np.nan  # a sentence no term was scored for: S is NaN
        m[:, 5] = np.nan  # a context no sentence was scored in: its effect is NaN
    source = {"disc": 0.0, "fwd": 1.0, "left": 1.0, "right": 1.0}
    for terms in (stored, holed):
        v.terms = terms
        for lam in (source, {"disc": 0.0, "fwd": 0.7, "left": 0.0, "right": 2.5}, dict(source, disc=1.0)):
            S0, effect0 = whole(terms, lam)
            for rows in (5, 4, 1, n, n + 3, None):  # 5 does not divide the 12 sentences
                S, effect = pool_scores(v, lam, "double-centred", block_rows=rows)
                assert S.dtype == np.float64 and S.tobytes() == S0.tobytes(), (rows, lam)
                assert effect.tobytes() == effect0.tobytes(), (rows, lam)
            assert pool_scores(v, lam, "pearson", block_rows=5)[1] is None
    assert np.isnan(S0[7]).all() and np.isnan(effect0[5]) and np.isfinite(S0[3]).sum() > 0
    # the stored S (the source's λ combined) is not held beside the new one, nor shared with the terms
    stored_run, S, effect = pool_remix_inputs(str(out / "pool_vectors"), source, "double-centred")
    assert stored_run.S is None and S.tobytes() == whole(stored, source)[0].tobytes()


def test_a_remix_of_a_remix_follows_its_harvest_when_it_moves(partners_run, tmp_path, capsys, monkeypatch):
    """A remix of a pool harvest reads the harvest's vectors, and so does a remix of that remix. Moved together
    with the harvest, the remixes still find them; with the harvest moved alone, rerunning the first remix from
    its new place points the remixes of it there too. Vectors that are really gone get one line. (The refusals
    and the rerun with nothing to do run sentsim.cli.main in this process, in tmp_path: no subprocess start-up.)"""
    from conftest import error_line

    from sentsim.harvest.remix import RemixConfig, remix

    def cli(*args):  # the paths a user types, relative to where they run the command
        return sentsim_cli("remix", *args, cwd=tmp_path)

    def in_process(*args):  # the same, by sentsim.cli.main in this process
        with monkeypatch.context() as mp:
            mp.chdir(tmp_path)
            return cli_in_process(capsys, "remix", *args)

    shutil.copytree(partners_run[1], tmp_path / "a" / "H")
    remix(RemixConfig(source=str(tmp_path / "a" / "H"), out=str(tmp_path / "a" / "R1"), lambda_fwd=0.0), quiet=True)
    remix(RemixConfig(source=str(tmp_path / "a" / "R1"), out=str(tmp_path / "a" / "R2"), metric="cosine"), quiet=True)
    # a remix written before the relative records, which named the vectors by absolute path only, still reads
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "a" / "R2", old)
    m = json.loads((old / "manifest.json").read_text())
    for rec in (m["remix"], m["config"]["remix"]):
        del rec["pool_vectors_relative"], rec["source_relative"]
    before_manifest_checksums(m)  # that sentsim wrote no checksum of the manifest either
    (old / "manifest.json").write_text(json.dumps(m))
    r = cli("old", "--out", "old_again")
    assert r.returncode == 0, r.stderr[-3000:]

    (tmp_path / "a").rename(tmp_path / "b")
    r = cli("b/R2", "--out", "b/R3", "--metric", "pearson")  # R1's λ and metric again
    assert r.returncode == 0, r.stderr[-3000:]
    assert np.allclose(pairs_of(tmp_path / "b" / "R3").score, pairs_of(tmp_path / "b" / "R1").score, atol=1e-6)
    assert not np.allclose(pairs_of(tmp_path / "b" / "R3").score, pairs_of(partners_run[1]).score, atol=1e-2)

    (tmp_path / "c").mkdir()
    (tmp_path / "b" / "H").rename(tmp_path / "c" / "H")
    r = in_process("b/R2", "--out", "b/R4")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = error_line(r.stderr)
    assert "b/R2: the pool harvest's sentence vectors it was remixed from are missing" in line, line
    r = in_process("c/H", "--out", "b/R1", "--lambda-fwd", "0")  # the same remix, resumed: nothing to redo
    assert r.returncode == 0 and "0 to do" in r.stderr, r.stderr[-3000:]
    r = cli("b/R2", "--out", "b/R4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "b" / "R4" / "manifest.json").read_text())["remix"]["pool_vectors"] == \
        str((tmp_path / "c" / "H" / "pool_vectors").resolve())
    assert np.allclose(pairs_of(tmp_path / "b" / "R4").score, pairs_of(tmp_path / "b" / "R2").score, atol=1e-6)

    shutil.rmtree(tmp_path / "c" / "H" / "pool_vectors")
    r = in_process("b/R4", "--out", "b/R5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "sentence vectors it was remixed from are missing or incomplete at" in error_line(r.stderr)


def test_a_remix_rerun_from_its_sources_new_place_records_that_place(partners_run, tmp_path, capsys, monkeypatch):
    """Rerunning a remix from the place its source was moved to resumes it (same fingerprint, nothing redone) and
    rewrites its whole record to that place, config.remix and inputs as well as the top-level remix record, so
    a remix of it reads the vectors there once the old place is gone. A remix recorded before the relative
    paths gains them; a refused resume does not blame the moved paths (that refusal by sentsim.cli.main in this
    process, in tmp_path: no subprocess start-up)."""
    from conftest import error_line

    def cli(*args):  # the paths a user types, relative to where they run the command
        return sentsim_cli("remix", *args, cwd=tmp_path)

    def manifest(run):
        return json.loads((tmp_path / run / "manifest.json").read_text())

    shutil.copytree(partners_run[1], tmp_path / "a" / "H")
    r = cli("a/H", "--out", "R1", "--lambda-fwd", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    first = manifest("R1")
    assert first["config"]["remix"]["source"] == first["inputs"][0]["harvest"] == "a/H"
    m = dict(first)  # as a remix written before the relative records: the absolute ones only
    for rec in (m["remix"], m["config"]["remix"]):
        del rec["pool_vectors_relative"], rec["source_relative"]
    before_manifest_checksums(m)  # that sentsim wrote no checksum of the manifest either
    (tmp_path / "R1" / "manifest.json").write_text(json.dumps(m))

    (tmp_path / "c").mkdir()
    (tmp_path / "a" / "H").rename(tmp_path / "c" / "H")
    (tmp_path / "a").rmdir()
    with monkeypatch.context() as mp:  # another λ: another run, refused for that alone
        mp.chdir(tmp_path)  # the paths as cli's cwd gives them
        r = cli_in_process(capsys, "remix", "c/H", "--out", "R1", "--lambda-fwd", "0.5")
    assert r.returncode == 2
    line = error_line(r.stderr)
    assert "weights.fwd" in line and "remix.source" not in line and "inputs.0.harvest" not in line, line
    r = cli("c/H", "--out", "R1", "--lambda-fwd", "0")
    assert r.returncode == 0 and "0 to do" in r.stderr, r.stderr[-3000:]
    now = manifest("R1")
    assert now["fingerprint"] == first["fingerprint"]
    vectors = str((tmp_path / "c" / "H" / "pool_vectors").resolve())
    assert now["inputs"] == [{"harvest": "c/H", "fingerprint": first["inputs"][0]["fingerprint"]}]
    assert {k: v for k, v in now["remix"].items() if k in now["config"]["remix"]} == now["config"]["remix"]
    assert now["config"]["remix"]["source"] == "c/H" and now["config"]["remix"]["pool_vectors"] == vectors
    assert now["config"]["remix"]["source_relative"] == "../c/H"
    assert now["config"]["remix"]["pool_vectors_relative"] == "../c/H/pool_vectors"
    assert {k: v for k, v in now["config"].items() if k != "remix"} == \
        {k: v for k, v in first["config"].items() if k != "remix"}

    r = cli("R1", "--out", "R2", "--metric", "cosine")
    assert r.returncode == 0, r.stderr[-3000:]
    assert manifest("R2")["config"]["remix"]["pool_vectors"] == vectors
    assert manifest("R2")["inputs"][0]["harvest"] == "R1"


def test_a_remix_chain_names_an_edited_manifest_on_its_way_to_the_vectors(partners_run, tmp_path, capsys):
    """A remix of a remix finds its harvest's vectors through its source's records once the harvest has moved (the
    source rerun from the new place). With that source's manifest edited, its records are not followed: the remix
    is refused in one line naming the edited manifest, not by calling the vectors missing; put back, it remixes.
    (By sentsim.cli.main in this process: no subprocess start-up.)"""
    from sentsim.harvest.remix import RemixConfig, remix
    from storage.store import edited_manifest, manifest_seal_broken

    harvest, r1, r2 = tmp_path / "a" / "H", tmp_path / "R1", tmp_path / "R2"
    shutil.copytree(partners_run[1], harvest)
    remix(RemixConfig(source=str(harvest), out=str(r1), lambda_fwd=0.0), quiet=True)
    remix(RemixConfig(source=str(r1), out=str(r2), metric="cosine"), quiet=True)
    (tmp_path / "c").mkdir()
    harvest = harvest.rename(tmp_path / "c" / "H")  # R2's records of it now lead nowhere; R1, rerun, points here
    remix(RemixConfig(source=str(harvest), out=str(r1), lambda_fwd=0.0), quiet=True)

    written = (r1 / "manifest.json").read_text()
    m = json.loads(written)
    m["config"]["remix"]["source"] = "elsewhere"  # an edit by hand: the checksum no longer matches
    (r1 / "manifest.json").write_text(json.dumps(m))
    r = cli_in_process(capsys, "remix", r2, "--out", tmp_path / "R3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert error_line(r.stderr) == f"sentsim: error: {edited_manifest(str(r1), manifest_seal_broken(m))}"
    assert not (tmp_path / "R3").exists()

    (r1 / "manifest.json").write_text(written)
    r = cli_in_process(capsys, "remix", r2, "--out", tmp_path / "R3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "R3" / "manifest.json").read_text())["remix"]["pool_vectors"] == \
        str(harvest / "pool_vectors")


def test_a_broken_vectors_run_is_named_and_the_harvest_mends_it(partners_run, tmp_path):
    """Remix refuses vectors that lost a unit, are not the ones the labels came from, or lost their manifest, and a
    rerun of the finished harvest refuses the last; --force-new on the harvest rebuilds an unreadable vectors run,
    to the same vectors and rows."""
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix

    cfg, out = partners_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    (copy / "pool_vectors" / "_units" / "00000.json").unlink()
    with pytest.raises(UsageError, match="sentence vectors are missing or incomplete"):
        remix(RemixConfig(source=str(copy), out=str(tmp_path / "r1")), quiet=True)
    manifest = json.loads((copy / "pool_vectors" / "manifest.json").read_text())
    shutil.rmtree(copy / "pool_vectors")
    shutil.copytree(out / "pool_vectors", copy / "pool_vectors")
    m = json.loads((copy / "manifest.json").read_text())
    m["pool"]["vectors_fingerprint"] = "0" * 16  # as if the harvest's vectors had been remade with other settings
    rewrite_manifest(copy, m)
    with pytest.raises(UsageError, match="not the ones .* labels were computed from"):
        remix(RemixConfig(source=str(copy), out=str(tmp_path / "r2")), quiet=True)
    (copy / "pool_vectors" / "manifest.json").unlink()
    (copy / "_COMPLETE").unlink()
    # every labelling unit is done, but a rerun checks the vectors remix reads: without a manifest they cannot be
    # resumed, and the rerun says so (the vectors alone are rebuilt with --force-new, below); remix says so too
    from storage import StoreError

    with pytest.raises(StoreError, match="pool_vectors already holds Parquet shards but no manifest.json"):
        harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True)
    with pytest.raises(UsageError, match="sentence vectors are missing or incomplete"):
        remix(RemixConfig(source=str(copy), out=str(tmp_path / "r3")), quiet=True)
    (copy / "pool_vectors" / "manifest.json").write_text("{not json")
    assert harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True, force_new=True)["complete"]
    assert json.loads((copy / "pool_vectors" / "manifest.json").read_text())["fingerprint"] == manifest["fingerprint"]
    assert np.allclose(pairs_of(copy).score, pairs_of(out).score)


@pytest.mark.parametrize("damage", ["truncated", "edited"])
def test_a_finished_pool_harvests_damaged_vectors_are_named_by_verify_and_mended_by_a_rerun(partners_run, tmp_path,
                                                                                         damage):
    """The vectors are a run of their own inside the harvest, which remix reads after the labels are done: `store
    verify` of the harvest checks them too, and rerunning the finished harvest redoes their damaged unit (a
    shard cut short, or changed in place at the same size) instead of reporting nothing to do."""
    from sentsim.harvest.job import harvest
    from sentsim.harvest.remix import RemixConfig, remix
    from storage.verify import verify_store

    cfg, out = partners_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shard = sorted((copy / "pool_vectors" / "sentence_vectors").glob("*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    if damage == "truncated":
        shard.write_bytes(bytes(data[:500]))
    else:  # a byte inside the first page: the file still reads, its sha256 does not match
        data[200] ^= 0xFF
        shard.write_bytes(bytes(data))
    problems = verify_store(str(copy))
    assert problems and all(p.startswith("pool_vectors/sentence_vectors/") for p in problems), problems
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode != 0 and "pool_vectors/sentence_vectors/" in r.stdout + r.stderr, (r.stdout, r.stderr)
    again = harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True)
    assert again["complete"] and verify_store(str(copy)) == []
    assert pairs_of(copy).equals(pairs_of(out))
    remix(RemixConfig(source=str(copy), out=str(tmp_path / "re")), quiet=True)
    assert np.allclose(pairs_of(tmp_path / "re").score, pairs_of(out).score, atol=1e-5)


def test_a_pairs_file_is_labelled_from_its_sentences_vectors(inputs, tmp_path):
    from corpus.documents import text_id
    from sentsim.harvest.job import harvest

    a, b, c = "The nation must remain strong.", "Our country has to stay powerful.", "Taxes were cut this year."
    f = tmp_path / "pairs.tsv"
    f.write_text(f"{a}\t{b}\t4.0\n{a}\t{c}\t1.0\n{b}\t{a}\t4.5\n")
    out = tmp_path / "explicit"
    assert harvest(pool_config(inputs, out, pairs_file=str(f), pairs_per_unit=2, rank={"enabled": False}),
                   executor="inline", quiet=True)["complete"]
    t = pairs_of(out)
    assert len(t) == 3 and t.pair_id.is_unique and sorted(t.gold) == [1.0, 4.0, 4.5]
    assert sorted(vectors_of(out).ids.tolist()) == sorted({text_id(a), text_id(b), text_id(c)})
    same = t[t.s1_id.isin([text_id(a), text_id(b)]) & t.s2_id.isin([text_id(a), text_id(b)])]
    assert np.allclose(same.score, same.score.iloc[0])  # the same two vectors, in either order


def test_remix_gives_spearman_vs_gold_only_where_it_has_a_value(inputs, tmp_path):
    """Remixing a labelled harvest gives the source's and the remix's Spearman against the gold scores; where every
    score is the same (one pair of sentences, labelled three times) it has no value, and the summary says why
    rather than giving nan or nothing."""
    import re

    from sentsim.harvest.job import harvest

    a, b, c = "The nation must remain strong.", "Our country has to stay powerful.", "Taxes were cut this year."
    for name, rows in (("varied", [(a, b, 4.0), (a, c, 1.0), (b, c, 2.0)]),
                       ("same", [(a, b, 4.0), (a, b, 1.0), (a, b, 2.5)])):
        f = tmp_path / f"{name}.tsv"
        f.write_text("".join(f"{s1}\t{s2}\t{g}\n" for s1, s2, g in rows))
        assert harvest(pool_config(inputs, tmp_path / name, pairs_file=str(f), pairs_per_unit=2,
                                   rank={"enabled": False}), executor="inline", quiet=True)["complete"]
    r = sentsim_cli("remix", tmp_path / "varied", "--out", tmp_path / "varied_remix", "--lambda-fwd", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"Spearman x 100 vs gold on 3 pairs: source -?\d+\.\d\d, remix -?\d+\.\d\d$", r.stdout, re.M), \
        r.stdout
    # a remix stopped after its first unit: each run's figure on its own pairs
    r = sentsim_cli("remix", tmp_path / "varied", "--out", tmp_path / "part", "--lambda-fwd", "0", "--max-units", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"Spearman x 100 vs gold: source -?\d+\.\d\d on 3 pairs, remix -?\d+\.\d\d on 2 pairs$",
                     r.stdout, re.M), r.stdout
    r = sentsim_cli("remix", tmp_path / "same", "--out", tmp_path / "same_remix", "--lambda-fwd", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Spearman x 100" not in r.stdout and "nan" not in r.stdout and "Warning" not in r.stderr, (r.stdout,
                                                                                                   r.stderr)
    assert "\n  no Spearman vs gold: the scores are the same for every pair\n" in r.stdout, r.stdout


def test_bad_pool_settings_get_one_line(inputs, tmp_path, capsys):
    """Each bad setting is exit 2 in one line: the first through the real console script, the rest by
    sentsim.cli.main in this process (the same code from argument parsing to the line, without a subprocess
    start-up each)."""
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    with pytest.raises(UsageError, match="pool_size=999999 is more than the corpus's"):
        harvest(pool_config(inputs, tmp_path / "big", contexts={"mode": "pool", "pool_size": 999_999}),
                executor="inline", quiet=True)
    assert not (tmp_path / "big").exists()
    base = ["harvest", "--corpus", inputs["corpus"], "--context-models", inputs["bundle"], "--executor", "inline"]
    cases = [
        (["--set", "contexts.mode=pool", "--set", "contexts.pool_size=1"], "pool_size"),
        (["--set", "contexts.mode=pool", "--set", "grouping.enabled=true"], "turn grouping off"),
        (["--set", "contexts.mode=pool", "--set", "partners.cluster_size=1"], "gives no pair"),
        (["--set", "contexts.mode=random", "--set", "partners.cluster_size=8"], "needs contexts.mode=pool"),
        (["--set", "contexts.mode=pool", "--set", "partners.cluster_levels=2"], "needs partners.cluster_size"),
        (["--set", "contexts.mode=random", "--set", "partners.cluster_levels=2"], "needs partners.cluster_size"),
        (["--set", "contexts.mode=pool", "--set", "partners.cluster_size=8", "--set", "partners.cluster_levels=3"],
         "cluster_levels"),
        (["--set", "contexts.mode=pool", "--set", "contexts.pool_size=999999"], "more than the corpus"),
        # a discriminator would be fingerprinted and used for nothing (it screens only retrieved contexts)
        (["--set", "contexts.mode=pool", "--discriminator", inputs["bundle"]], "contexts.mode=pool uses none"),
        (["--set", "contexts.mode=random", "--discriminator", inputs["bundle"]], "contexts.mode=random uses none"),
    ]
    for i, (args, expected) in enumerate(cases):
        full = (*base, "--out", tmp_path / f"o{i}", *args)
        r = sentsim_cli(*full) if i == 0 else cli_in_process(capsys, *full)
        assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-800:])
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli_in_process(capsys, "contexts", "--corpus", inputs["corpus"], "--index", inputs["index"], "--out",
                       tmp_path / "c", "--set", "contexts.mode=pool", "--executor", "inline")
    assert r.returncode == 2 and "a harvest's shared pool" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli_in_process(capsys, "contexts", "--corpus", inputs["corpus"], "--index", inputs["index"], "--out",
                       tmp_path / "c", "--set", "contexts.mode=random", "--discriminator", inputs["bundle"],
                       "--executor", "inline")
    assert r.returncode == 2 and "contexts.mode=random uses none" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "c").exists()


def test_a_pool_runs_inner_run_given_as_a_harvest_names_the_harvest(partners_run, shared_data, tmp_path, capsys):
    """`--data RUN/pool_vectors` (or pool_ranks) to a trainer, as remix's HARVEST or eval's --scores: those runs
    are a pool harvest's own parts, not harvests; one line names the harvest that holds them, before anything is
    written. Each command's first refusal runs the real console script, the other by sentsim.cli.main in this
    process (no subprocess start-up each)."""
    _, run = partners_run
    for inner in ("pool_vectors", "pool_ranks"):
        cases = [(("train", "surrogate", "--data", run / inner, "--out", tmp_path / "s", "--max-steps", "1"),
                  f"--data {run / inner}: not a harvest run but a part of the harvest {run}; give --data {run}"),
                 (("train", "student", "--data", run / inner, "--out", tmp_path / "st", "--max-steps", "1"),
                  f"--data {run / inner}: not a harvest run but a part of the harvest {run}; give --data {run}"),
                 (("remix", run / inner, "--out", tmp_path / "r"),
                  f"{run / inner}: not a harvest run but a part of the harvest {run}; give {run}"),
                 (("eval", "sts", "--scores", run / inner, "--data", shared_data / "sts", "--tasks", "STSb"),
                  f"--scores {run / inner}: not a harvest run but a part of the harvest {run}; give --scores {run}")]
        for args, words in cases:
            r = sentsim_cli(*args) if inner == "pool_vectors" else cli_in_process(capsys, *args)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and words in lines[0], (args, r.stderr[-1500:])
    assert list(tmp_path.iterdir()) == []


def test_no_run_is_started_in_a_pool_harvests_inner_run(partners_run, inputs, tmp_path, capsys):
    """`--out RUN/pool_vectors` for another harvest is refused in one line, --force-new too (it would delete the
    vectors the pool harvest holds), and those vectors are left as they were. The first refusal runs the real
    console script, the others sentsim.cli.main in this process (no subprocess start-up each)."""
    _, run = partners_run
    before = vectors_of(run).S.copy()
    base = ["harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models",
            inputs["bundle"], "--executor", "inline", "--set", "anchors.n=4", "--set", "rank.enabled=false"]
    for inner in ("pool_vectors", "pool_ranks"):
        for extra in ((), ("--force-new",)):
            first = inner == "pool_vectors" and not extra
            full = (*base, "--out", run / inner, *extra)
            r = sentsim_cli(*full) if first else cli_in_process(capsys, *full)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
            assert lines[-1].endswith(f"{run / inner} holds the {inner} run of the 'harvest' run {run}, so nothing "
                                      "else is written there; choose another --out"), r.stderr[-2000:]
    np.testing.assert_array_equal(vectors_of(run).S, before)
    r = sentsim_cli("store", "verify", run)
    assert r.returncode == 0 and r.stdout.strip() == f"{run}: OK", r.stdout + r.stderr[-1500:]


def test_a_changed_clustered_harvest_is_refused_before_it_clusters(cluster_run, inputs):
    """Rerun with another metric, a clustered pool harvest is refused in one line naming what changed, before
    the anchors are clustered or the pool drawn (minutes at a few 100K anchors), and it is left as it was."""
    _, run = cluster_run
    before = pairs_of(run)
    sets = [f"contexts.pool_size={POOL}", "anchors.n=12", "anchors.per_unit=4", "sentences_per_unit=8",
            "pairs_per_unit=8", "scoring.batch_tokens=2048", "scoring.autocast=off", "partners.cluster_size=4",
            "contexts.mode=pool", "metric=spearman"]
    r = sentsim_cli("harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models",
                    inputs["bundle"], "--out", run, "--executor", "inline", *(a for x in sets for a in ("--set", x)))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "was written with fingerprint" in last and "metric" in last, r.stderr[-2000:]
    assert "clustering" not in r.stderr, r.stderr[-2000:]
    assert pairs_of(run).equals(before)


def test_verify_notes_a_finished_pool_harvests_deleted_runs(partners_run, tmp_path):
    """A finished pool harvest whose pool_vectors/ and pool_ranks/ were deleted (to save space, say) is still
    OK, its rows being whole, but verify says each is gone and what needs it; the whole run has no such note."""
    cfg, run = partners_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for inner in ("pool_vectors", "pool_ranks"):
        shutil.rmtree(copy / inner)
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == f"{copy}: OK", r.stdout + r.stderr[-1500:]
    assert (f"{copy}/pool_vectors: not there (deleted?); this harvest's rows are whole without it, but "
            "`sentsim remix` reads it, and the same harvest command rebuilds it") in r.stdout, r.stdout
    assert (f"{copy}/pool_ranks: not there (deleted?); this harvest's rows are whole without it, but a relabel "
            "reads it, and the same harvest command rebuilds it") in r.stdout, r.stdout
    r = sentsim_cli("store", "verify", run)
    assert r.stdout.strip() == f"{run}: OK", r.stdout


def labelled_files(run) -> dict:
    """Every shard and marker of the labelled units and of the rank targets, by path, with its bytes: what a rerun
    that rebuilds the vectors must not touch (the manifests it finalizes again are left out)."""
    return {str(p.relative_to(run)): p.read_bytes()
            for t in ("pairs", "sentences", "_units", "pool_ranks/sentence_ranks", "pool_ranks/_units")
            for p in sorted((run / t).rglob("*")) if p.is_file()}


def test_a_finished_pool_harvests_deleted_vectors_are_rebuilt_by_the_same_command(partners_run, tmp_path):
    """pool_vectors/ deleted from a finished harvest: remix, which reads it, refuses in one line; the same
    harvest command scores it again, to the same vectors (rows, pool and fingerprint), checks the labelled
    scores against them and says so in a line, without touching a labelled row; remix then reads them."""
    import yaml

    from storage import RunReader

    cfg, out = partners_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "pool_vectors")
    r = sentsim_cli("remix", copy, "--out", tmp_path / "r1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr) == (f"sentsim: error: {copy}/pool_vectors: this pool harvest's sentence vectors "
                                    "are missing or incomplete (no finished run there); run the harvest's command "
                                    "again, which rebuilds them, then remix")
    labelled = labelled_files(copy)
    config = tmp_path / "harvest.yaml"
    config.write_text(yaml.safe_dump(json.loads(cfg.model_copy(update={"out": str(copy)}).model_dump_json())))
    r = sentsim_cli("harvest", "--config", config, "--executor", "inline")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    n = len(pairs_of(out))
    assert (f"[harvest] {copy}/pool_vectors was not there and is rebuilt: the same sentence vectors as the {n:,} "
            "labelled pairs' scores were computed from") in r.stderr, r.stderr[-3000:]
    assert "[harvest] unit" not in r.stderr, r.stderr[-3000:]  # nothing relabelled
    for table in ("sentence_vectors", "_side/pool"):
        def read(run):
            reader = RunReader(str(run / "pool_vectors"))
            t = reader.side_table("pool") if table.startswith("_side") else reader.read_table(table)
            return t.sort_by(t.column_names[0])
        assert read(copy).equals(read(out)), table
    fp = ShardStore(str(out / "pool_vectors")).read_manifest()["fingerprint"]
    assert ShardStore(str(copy / "pool_vectors")).read_manifest()["fingerprint"] == fp
    assert json.loads((copy / "manifest.json").read_text())["pool"]["vectors_fingerprint"] == fp
    assert labelled_files(copy) == labelled
    report = json.loads((copy / "report.json").read_text())
    assert report["vectors_units"] == json.loads((out / "report.json").read_text())["vectors_units"]
    r = sentsim_cli("remix", copy, "--out", tmp_path / "r2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert np.allclose(pairs_of(tmp_path / "r2").score, pairs_of(out).score, atol=1e-5)


def test_rebuilt_vectors_unlike_the_labelled_ones_are_counted(cluster_run, tmp_path):
    """The check of rebuilt vectors against the labels counts the pairs whose score they do not give: none under
    the harvest's own metric, nearly all where the pairs' double-centred scores are compared with pearson's."""
    from sentsim.harvest.pool_vectors import scores_unlike_labels

    cfg, out = cluster_run
    n = len(pairs_of(out))
    assert scores_unlike_labels(str(out), cfg.metric) == (0, n)
    assert scores_unlike_labels(str(out), "pearson")[0] > 0.9 * n


def test_store_compact_compacts_the_runs_inside_a_pool_harvest(partners_run, tmp_path):
    """`store compact RUN` on a pool harvest compacts its pool_vectors/ and pool_ranks/ too (runs of their own
    inside it, which `store verify RUN` verifies): the harvest and a remix read the same rows afterwards."""
    _, run = partners_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    inner = {"pool_vectors": "sentence_vectors", "pool_ranks": "sentence_ranks"}
    assert all(len(list((copy / d / t).glob("part-*.parquet"))) > 1 for d, t in inner.items())
    r = sentsim_cli("store", "compact", copy)
    assert r.returncode == 0, r.stderr[-1500:]
    for d, t in inner.items():
        assert f"{copy}/{d}: compacted ({t} 1 file(s)" in r.stdout, r.stdout
        assert [p.name for p in (copy / d / t).iterdir()] == ["compact-001-00000.parquet"]
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode == 0 and r.stdout.strip() == f"{copy}: OK", r.stdout + r.stderr[-1500:]
    again = sentsim_cli("store", "compact", copy)
    assert again.returncode == 0 and again.stdout.count("already compacted") == 3, again.stdout
    np.testing.assert_array_equal(vectors_of(copy).S, vectors_of(run).S)
    r = sentsim_cli("remix", copy, "--out", tmp_path / "remix", "--metric", "spearman")
    assert r.returncode == 0, r.stderr[-1500:]
    r = sentsim_cli("remix", run, "--out", tmp_path / "remix0", "--metric", "spearman")
    assert r.returncode == 0, r.stderr[-1500:]
    assert pairs_of(tmp_path / "remix").score.tolist() == pairs_of(tmp_path / "remix0").score.tolist()


def test_a_clustered_draw_takes_one_context_from_each_tfidf_cluster(inputs):
    from corpus.view import CorpusIndex
    from sentsim.harvest.clusters import balanced_clusters
    from sentsim.harvest.pool import POOL_DRAW_OVERSAMPLE, POOL_SEED_OFFSET, draw_pool
    from sentsim.screening.candidates import full_windows

    corpus = CorpusIndex(str(inputs["corpus"]))
    random_pool, pool = (draw_pool(corpus, POOL, 1, 0, draw) for draw in ("random", "clusters"))
    again = draw_pool(corpus, POOL, 1, 0, "clusters")
    assert len(set(pool.ids.tolist())) == POOL and np.array_equal(pool.ids, again.ids)  # seeded
    assert not np.array_equal(pool.ids, random_pool.ids)
    # the draw's own candidates and clusters: every cluster gives exactly one pool context
    rng = np.random.default_rng(POOL_SEED_OFFSET)
    eligible = corpus.ids[full_windows(corpus.ids, corpus.ids, 1)]
    candidates = rng.choice(eligible, size=POOL * POOL_DRAW_OVERSAMPLE, replace=False)
    labels = balanced_clusters([t or "" for t in corpus.texts(candidates)], POOL_DRAW_OVERSAMPLE, 0)
    assert sorted(labels[np.isin(candidates, pool.ids)].tolist()) == list(range(POOL))
    kept = draw_pool(corpus, POOL, 1, 0, "clusters", kept=random_pool.ids)  # a resumed run's stored ids win
    assert np.array_equal(kept.ids, random_pool.ids)


def test_a_pool_is_drawn_from_sentences_with_a_full_window(inputs):
    """A window cut short by its document's edge would drop an Eq. 3 term in that context and raise S there
    for every sentence alike: neither draw takes one, even where the edges are most of the corpus."""
    from corpus.view import CorpusIndex
    from sentsim.errors import UsageError
    from sentsim.harvest.pool import draw_pool
    from sentsim.screening.candidates import full_windows

    corpus = CorpusIndex(str(inputs["corpus"]))
    for w in (1, 3):
        eligible = full_windows(corpus.ids, corpus.ids, w)
        assert 0 < eligible.sum() < len(corpus.ids)  # each speech has edges
        for draw in ("random", "clusters"):
            pool = draw_pool(corpus, 64, w, 0, draw)
            assert np.isin(pool.ids, corpus.ids[eligible]).all()
            assert all(len(left) == len(right) == w for left, right in zip(pool.left, pool.right))
    n = int(full_windows(corpus.ids, corpus.ids, 3).sum())
    with pytest.raises(UsageError, match=f"pool_size={n + 1} is more than the corpus's {n:,} sentences with 3"):
        draw_pool(corpus, n + 1, 3, 0)


def test_a_clustered_pool_is_kept_with_the_run_and_resumed_from_it(inputs, tmp_path):
    from sentsim.harvest.job import harvest
    from sentsim.harvest.pool import POOL_IDS_TABLE, POOL_TABLE
    from storage import ShardStore

    out = tmp_path / "diverse"
    cfg = pool_config(inputs, out, contexts={"mode": "pool", "pool_size": POOL, "pool_draw": "clusters"},
                      anchors={"n": 6, "per_unit": 3})
    assert cfg.semantic()["contexts"]["pool_draw"] == "clusters"
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    kept = ShardStore(str(out)).read_side_table(POOL_IDS_TABLE).column("sentence_id").to_pylist()
    scored = ShardStore(str(out / "pool_vectors")).read_side_table(POOL_TABLE).column("context_id").to_pylist()
    assert len(kept) == POOL and kept == scored
    before = pairs_of(out)
    assert before.score.notna().all()
    again = harvest(cfg, executor="inline", quiet=True)  # a rerun reads its pool back and redoes nothing
    assert again["complete"] and pairs_of(out).equals(before)


def test_clustering_says_what_it_does_unless_quiet(inputs, tmp_path, capsys):
    """Clustering grows about as n^2 / size and prints nothing else meanwhile: a harvest names it before and
    times it after, for the pairs and for a clustered pool draw alike; `quiet` silences both."""
    from sentsim.harvest.job import harvest

    def run(out, quiet):
        cfg = pool_config(inputs, out, contexts={"mode": "pool", "pool_size": POOL, "pool_draw": "clusters"},
                          partners={"cluster_size": 4}, anchors={"n": 12})
        assert harvest(cfg, executor="inline", quiet=quiet)["complete"]
        return capsys.readouterr().err

    err = run(tmp_path / "loud", quiet=False)
    assert "[harvest] clustering 12 sentences into 3 TF-IDF clusters of 4" in err
    assert err.count("[harvest] clustering ") == 2 and err.count("[harvest] clustered ") == 2  # pool and pairs
    assert "clustering" not in run(tmp_path / "quiet", quiet=True)
    cfg = pool_config(inputs, tmp_path / "one", partners={"cluster_size": 16}, anchors={"n": 12})
    assert harvest(cfg, executor="inline", quiet=False)["complete"]
    err = capsys.readouterr().err
    assert ("[harvest] partners.cluster_size=16 holds all 12 anchors: one cluster, every pair among them labelled "
            "(66 pairs)") in err and "clustering" not in err


def test_two_level_clusters_through_the_command_label_every_pair_within_them(inputs, tmp_path):
    """partners.cluster_levels=2: the pairs are exactly those within the two-level clusters of the run's anchors
    (20 anchors in clusters of 4: groups of 12 and 8), and the harvest says what each level did."""
    from corpus.view import CorpusIndex
    from sentsim.config import load_config
    from sentsim.harvest.clusters import balanced_clusters, cluster_pairs
    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.job import plan_anchors

    out = tmp_path / "two"
    sets = ["contexts.mode=pool", f"contexts.pool_size={POOL}", "anchors.n=20", "anchors.per_unit=8",
            "partners.cluster_size=4", "partners.cluster_levels=2", "sentences_per_unit=8", "pairs_per_unit=16",
            "scoring.autocast=off", "rank.enabled=false"]
    r = sentsim_cli("harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models",
                    inputs["bundle"], "--out", out, "--executor", "inline", *(a for x in sets for a in ("--set", x)))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "[harvest] clustering 20 sentences into 5 TF-IDF clusters of 4 in two levels: 2 groups of 12" in r.stderr
    assert "[harvest] level 1: " in r.stderr and "[harvest] level 2: 2 groups into 5 clusters of 4" in r.stderr
    cfg = load_config(HarvestConfig, None, sets, corpus=str(inputs["corpus"]), index=str(inputs["index"]),
                      context_models=[str(inputs["bundle"])], out=str(out))
    assert cfg.semantic()["partners"]["cluster_levels"] == 2
    corpus = CorpusIndex(str(inputs["corpus"]))
    anchors = plan_anchors(cfg, corpus)
    clusters = balanced_clusters([t or "" for t in corpus.texts(anchors)], 4, cfg.seed, progress=None, levels=2)
    t = pairs_of(out)
    assert len(t) == 5 * 6 and (t.kind == "cluster").all() and t.score.notna().all()
    assert sorted(zip(t.s1_id, t.s2_id)) == sorted(map(tuple, cluster_pairs(anchors, clusters).tolist()))


def test_cluster_levels_at_its_default_keeps_the_fingerprint(cluster_run, tmp_path):
    """A clustered run made before partners.cluster_levels (the key unset) resumes with it set to 1, redoing
    nothing; 2 is another run, refused naming the key. Set or not, 1 leaves the semantic part as it was."""
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    cfg, out = cluster_run
    copy = shutil.copytree(out, tmp_path / "run")
    before = ShardStore(str(copy)).read_manifest()["fingerprint"]

    def levels(n):
        return cfg.model_copy(update={"out": str(copy), "partners": cfg.partners.model_copy(
            update={"cluster_levels": n})})

    sem = levels(1).semantic()  # the partners it does not draw are not fingerprinted (HarvestConfig.unread_keys)
    assert sem == cfg.semantic() and set(sem["partners"]) == {"cluster_size"}
    assert set(levels(1).semantic(keep_unread=True)["partners"]) == {"neighbours", "same_doc", "random",
                                                                     "neighbour_chunks", "cluster_size"}
    m = harvest(levels(1), executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == before and m["this_run"]["units"] == 0
    with pytest.raises(UsageError, match="partners.cluster_levels:"):
        harvest(levels(2), executor="inline", quiet=True)


def test_no_sentence_is_scored_in_a_pool_context_whose_window_holds_it(partners_run):
    """As C_s leaves out the windows that hold the sentence (exclude_query_window), a pool sentence's S is NaN
    at every pool context centred on it or holding it as c< or c>, where the context models would copy it."""
    from sentsim.harvest.pool import Pool
    from sentsim.harvest.pool_vectors import windows_holding

    pool = Pool(np.array([7, 8, 9]), [["a"], ["b"], ["c"]], [["b"], ["c"], ["d"]], ["x", "a", "b"])
    assert windows_holding(pool, True, True) == {"x": [0], "a": [0, 1], "b": [0, 1, 2], "c": [1, 2], "d": [2]}
    assert windows_holding(pool, True, False) == {"x": [0], "a": [1], "b": [2]}
    assert windows_holding(pool, False, False) == {}
    cfg, out = partners_run
    v = vectors_of(out)
    pool_t = ds.dataset(str(out / "pool_vectors" / "_side" / "pool.parquet")).to_table()
    texts = {t.strip() for t in v.texts}
    for j, (left, right) in enumerate(zip(pool_t.column("left").to_pylist(), pool_t.column("right").to_pylist())):
        for t in {x.strip() for x in (*left, *right)} & texts:
            assert np.isnan(v.S[[i for i, s in enumerate(v.texts) if s.strip() == t], j]).all()


def test_runs_from_before_the_pool_mode_keep_their_fingerprints(inputs, tmp_path):
    """The new keys stay out of every fingerprint unless they are in use."""
    from sentsim.screening.contexts_job import ScreenConfig

    sem = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "o").semantic()
    assert "pool_size" not in sem["contexts"] and "cluster_size" not in sem["partners"]
    assert "sentences_per_unit" not in sem
    pooled = pool_config(inputs, tmp_path / "p", partners={"cluster_size": 4}).semantic()
    assert pooled["contexts"]["pool_size"] == POOL and pooled["partners"]["cluster_size"] == 4
    assert "pool_draw" not in pooled["contexts"]  # a random pool's runs keep the fingerprint they had
    screen = ScreenConfig(corpus="c", index="i", out="o")
    assert "pool_size" not in screen.contexts.semantic() and "rep_cache" not in screen.contexts.semantic()
    # exclude_query_window changes the context sets: on (the default) it is fingerprinted, so a run made
    # before it is refused naming it; off, such a run resumes as it was
    assert sem["contexts"]["exclude_query_window"] is True
    before = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "b",
                            contexts={"exclude_query_window": False}).semantic()
    assert "exclude_query_window" not in before["contexts"]
    # random_full_windows only in random mode, where it changes the draw (a pool run keeps its drawn pool)
    assert "random_full_windows" not in sem["contexts"] and "random_full_windows" not in pooled["contexts"]


def test_the_command_runs_a_pool_harvest_on_a_local_ray(inputs, tmp_path):
    out = tmp_path / "ray"
    args = ["harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models", inputs["bundle"],
            "--out", out, "--set", "contexts.mode=pool", "--set", f"contexts.pool_size={POOL}",
            "--set", "anchors.n=8", "--set", "anchors.per_unit=4", "--set", "partners.cluster_size=4",
            "--set", "sentences_per_unit=4", "--set", "rank.n_anchors=32", "--set", "resources.scoring.num_cpus=0.5",
            "--set", "resources.label.num_cpus=0.25"]
    r = sentsim_cli(*args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "[harvest-pool-vectors]" in r.stderr and "[harvest] unit" in r.stderr
    assert "[harvest-pool-ranks] unit" in r.stderr  # the rank targets encoded by Ray actors, once per sentence
    t = pairs_of(out)
    assert len(t) == 12 and t.score.notna().all()
    # the summary gives each split's spread, and says when the train scores sit in a band too narrow for L2
    train = t.score[t.split == "train"].to_numpy()
    assert f"train n={len(train)} mean={train.mean():.3f} sd={train.std():.4f}" in r.stdout, r.stdout
    assert ("warning: the train scores sit in a narrow band" in r.stdout) == (train.std() < 0.05), r.stdout
    r = sentsim_cli(*args)  # a rerun redoes nothing
    assert r.returncode == 0 and "[harvest] unit" not in r.stderr and "[harvest-pool-vectors] unit" not in r.stderr
    assert "[harvest-pool-ranks] unit" not in r.stderr
    assert pairs_of(out).equals(t)


def test_the_summary_says_what_is_labelled_and_prints_no_nan(inputs, tmp_path):
    """Stopped inside its vectors run, a pool harvest has labelled no pair: the summary says how far the vectors
    got, with no score line of NaN means and no warning from plotting nothing. Finished with rank targets off,
    it gives no spearman(score, rank_sim), which has no value then, and no mean for a split with no pair."""
    out = tmp_path / "run"
    args = ["harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models", inputs["bundle"],
            "--out", out, "--executor", "inline", "--set", "contexts.mode=pool", "--set", f"contexts.pool_size={POOL}",
            "--set", "anchors.n=10", "--set", "anchors.per_unit=4", "--set", "sentences_per_unit=8",
            "--set", "pairs_per_unit=8", "--set", "scoring.autocast=off", "--set", "rank.enabled=false"]
    r = sentsim_cli(*args, "--max-units", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    m = ShardStore(str(out)).read_manifest()
    vec_units = ShardStore(str(out / "pool_vectors")).read_manifest()["planned_units"]
    assert (f"no pairs labelled yet: the pool's sentence vectors are 1 of {vec_units} units done, and labelling "
            f"(0 of {m['planned_units']} units done) waits for all of them") in r.stdout, r.stdout
    assert "score by split" not in r.stdout and "nan" not in r.stdout and "Warning" not in r.stderr, (r.stdout,
                                                                                                       r.stderr)
    r = sentsim_cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    splits = pairs_of(out).split.value_counts()
    assert min(splits.get(s, 0) for s in ("train", "dev", "test")) == 0  # a split with no pair is printed
    assert "score by split: train n=" in r.stdout and "nan" not in r.stdout, r.stdout
    assert all(f"{s} n={splits.get(s, 0)}" in r.stdout for s in ("train", "dev", "test")), (splits, r.stdout)
    assert "spearman" not in r.stdout and "None" not in r.stdout, r.stdout
    assert json.loads((out / "report.json").read_text())["spearman_score_vs_rank_sim"] is None
    # with rank targets off the labels go straight to the writer: no rank stage is placed, or listed
    assert f"  units per node: label: local x{m['planned_units']}; write: local x{m['planned_units']}\n" in r.stdout, \
        r.stdout


def test_the_item_tokens_bench_counts_every_item_of_both_runs(partners_run, inputs, tmp_path, monkeypatch):
    """bench/item_tokens.py explains a pool item's cost by its tokens: it must read every item a per-pair run
    scored and the pool a pool run scored in, with the context model's own tokenizer."""
    from conftest import load_bench

    from sentsim.context.tokenizer import ContextTokenizer
    from sentsim.harvest.job import harvest

    cfg, out = partners_run
    per_pair = tmp_path / "per_pair"
    harvest(cfg.model_copy(update={"out": str(per_pair), "contexts": cfg.contexts.model_copy(
        update={"mode": "screened", "size": 4})}), executor="inline", quiet=True)
    bench = load_bench("item_tokens")
    monkeypatch.setattr(bench, "ROOT", tmp_path)  # results/ under the test's folder, not the checkout
    assert bench.main(["--per-pair", str(per_pair), "--pool", str(out), "--sample", "50"]) == 0
    got = json.loads((tmp_path / "bench" / "results" / "item_tokens.json").read_text())
    assert got["per_pair"]["items"] == json.loads((per_pair / "report.json").read_text())["scored_items"]
    assert got["pool"]["contexts"] == POOL and got["window"] >= 1
    tok = ContextTokenizer.load(inputs["bundle"])
    want = np.mean([len(ids) for ids in tok.encode(list(vectors_of(out).texts))])
    assert got["pool"]["sentence_tokens"] == pytest.approx(want)
    for row in ("per_pair", "pool", "random_windows"):
        assert got[row]["context_tokens"] > 0 and got[row]["sentence_tokens"] > 0


def test_neighbour_partners_without_an_index_are_named_not_dropped_silently(inputs, tmp_path):
    """partners.neighbours draws TF-IDF neighbours from the index: a harvest given none says that its anchors get
    only their other partners, where it used to drop them without a word (pool and per-pair alike)."""
    for mode in ("pool", "random"):
        r = sentsim_cli("harvest", "--corpus", inputs["corpus"], "--context-models", inputs["bundle"],
                        "--out", tmp_path / mode, "--executor", "inline", "--set", f"contexts.mode={mode}",
                        "--set", f"contexts.pool_size={POOL}", "--set", "contexts.size=4", "--set", "anchors.n=4",
                        "--set", "anchors.per_unit=4", "--set", "rank.enabled=false", "--set", "sentences_per_unit=8")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "partners.neighbours=" in r.stderr and "none is given" in r.stderr, r.stderr[-2000:]
        kinds = set(ds.dataset(str(tmp_path / mode / "pairs")).to_table().column("kind").to_pylist())
        assert "neighbour" not in kinds and kinds


def test_what_only_screening_reads_is_not_a_pool_runs_identity(partners_run, tmp_path):
    """A pool run never reads |C_s|, retrieval, the screening cuts or context_scores: a rerun with them changed
    is the same finished run (nothing rescored), where it used to be another run that scored every vector anew."""
    from sentsim.harvest.job import harvest

    cfg, out = partners_run
    copy = shutil.copytree(out, tmp_path / "run")
    before = ShardStore(str(copy)).read_manifest()["fingerprint"]
    markers = {p: p.stat().st_mtime_ns for p in (copy / "pool_vectors" / "_units").glob("*.json")}
    changed = pool_config({"corpus": cfg.corpus, "index": cfg.index, "bundle": cfg.context_models[0]}, copy,
                          contexts={"mode": "pool", "pool_size": POOL, "size": 7, "retrieve_chunks": 50,
                                    "jaccard": 0.9, "one_per_chunk": False},
                          keep_context_scores="none")
    m = harvest(changed, executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == before and m["this_run"]["units"] == 0
    assert {p: p.stat().st_mtime_ns for p in (copy / "pool_vectors" / "_units").glob("*.json")} == markers
    assert pairs_of(copy).equals(pairs_of(out))


def test_a_pool_run_of_format_2_resumes_under_the_fingerprints_it_holds(partners_run, tmp_path):
    """Run format 2 fingerprinted a pool harvest and its vectors with the screened-only keys: such a run, cut
    short in both passes, resumes as itself (its pool, its pairs, its vectors' precision), to the same rows,
    whatever those keys are set to now; --force-new labels it anew from the same vectors."""
    from run_support import as_fingerprinted

    from sentsim.harvest.job import HarvestRun, harvest, without_paths
    from sentsim.harvest.pool_vectors import PoolVectorsRun
    from sentsim.identity import fingerprint

    cfg, out = partners_run
    copy = shutil.copytree(out, tmp_path / "run")
    run = HarvestRun(cfg.model_copy(update={"out": str(copy)}), "inline", False, True)
    vectors = PoolVectorsRun(run.cfg, run.pool_plan.texts, run.pool, run.vector_identity(), "fp32")
    # what a format 2 sentsim stored: the whole config, and the vectors' identity with the screened-only keys
    held = dict(run.vector_identity(), contexts=cfg.contexts.semantic(keep_screened=True))
    # the fingerprints a format 2 sentsim gave them, made here as it made them (not by the code under test)
    old_fp = fingerprint("harvest", cfg.semantic(keep_screened=True, keep_unread=True), run.corpus.fingerprint,
                         without_paths(run.plan_info), run.hashes)
    old_vectors_fp = fingerprint(*vectors.fingerprint_parts(held))
    assert old_fp != run.fp and old_vectors_fp != vectors.fp
    assert run.fingerprint_in_format(2, {"config": cfg.model_dump()}) == old_fp
    assert vectors.fingerprint_in_format(2, {"config": {"identity": held}}) == old_vectors_fp
    vm_path = copy / "pool_vectors" / "manifest.json"
    vm = json.loads(vm_path.read_text())
    vm_path.write_text(json.dumps(dict(vm, config=dict(vm["config"], identity=held))))
    as_fingerprinted(copy, old_fp, run_format=2)
    as_fingerprinted(copy / "pool_vectors", old_vectors_fp, run_format=2)
    (copy / "pool_vectors" / "_units" / "00001.json").unlink()
    (copy / "_units" / "00000.json").unlink()
    # a key only screening reads, changed since: the run is still this one (format 2 held it as it was)
    changed = run.cfg.model_copy(update={"contexts": cfg.contexts.model_copy(update={"size": cfg.contexts.size + 1})})
    m = harvest(changed, executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == old_fp and m["format_version"] == 2
    vm = ShardStore(str(copy / "pool_vectors")).read_manifest()
    assert vm["fingerprint"] == old_vectors_fp and vm["complete"] and m["pool"]["vectors_fingerprint"] == old_vectors_fp
    assert pairs_of(copy).drop(columns=["rank_sim"]).equals(pairs_of(out).drop(columns=["rank_sim"]))

    def vector_markers():
        return {p: p.stat().st_mtime_ns for p in (copy / "pool_vectors" / "_units").glob("*.json")}

    # --force-new labels anew under today's fingerprint, from the same vectors (not rescored: they are these),
    # and a rerun with that key changed again reads them still
    before = vector_markers()
    m = harvest(run.cfg, executor="inline", quiet=True, force_new=True)
    assert m["complete"] and m["fingerprint"] == run.fp and m["format_version"] == FORMAT_VERSION
    assert m["pool"]["vectors_fingerprint"] == old_vectors_fp
    m = harvest(changed, executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == run.fp and m["this_run"]["units"] == 0
    assert vector_markers() == before


def test_a_pool_run_resumes_whatever_the_keys_it_never_reads_say(partners_run, cluster_run, inputs, tmp_path):
    """A pool corpus harvest labels units of pairs_per_unit planned pairs: anchors.per_unit, which it never reads, is
    not fingerprinted, so the finished run reruns as itself, doing nothing, and one cut short resumes to the same
    rows under another value. A run of format 4, whose fingerprint held it, resumes under the fingerprint it holds
    whatever it is set to now, and a key it reads is still refused, named alone. A clustered harvest's fingerprint
    leaves out the partners it does not draw, a --pairs one's the anchors and the partners."""
    from run_support import as_fingerprinted

    from sentsim.errors import UsageError
    from sentsim.harvest.job import STAGE, HarvestRun, harvest, without_paths
    from sentsim.identity import fingerprint

    cfg, out = partners_run
    fp = ShardStore(str(out)).read_manifest()["fingerprint"]

    def per_unit(n, at):
        return cfg.model_copy(update={"out": str(at), "anchors": cfg.anchors.model_copy(update={"per_unit": n})})

    def same_rows(run):
        assert pairs_of(run).drop(columns=["rank_sim"]).equals(pairs_of(out).drop(columns=["rank_sim"]))
        assert np.allclose(pairs_of(run).rank_sim, pairs_of(out).rank_sim, atol=1e-6)

    copy = shutil.copytree(out, tmp_path / "run")
    m = harvest(per_unit(1, copy), executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == fp and m["this_run"]["units"] == 0
    (copy / "_units" / "00000.json").unlink()  # cut short before unit 0's marker
    (copy / "_COMPLETE").unlink()
    m = harvest(per_unit(3, copy), executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == fp and m["this_run"]["units"] == 1
    assert m["config"]["anchors"]["per_unit"] == 4  # the run keeps the config it was opened with
    same_rows(copy)

    # the fingerprint a format 4 sentsim gave it, made here as it made it (not by the code under test)
    run = HarvestRun(cfg, "inline", False, True)
    old_fp = fingerprint(STAGE, cfg.semantic(keep_unread=True), run.corpus.fingerprint,
                         without_paths(run.plan_info), run.hashes)
    assert old_fp != fp == run.fp
    old = as_fingerprinted(shutil.copytree(out, tmp_path / "format4"), old_fp, run_format=4)
    (old / "_units" / "00000.json").unlink()
    with pytest.raises(UsageError, match="pairs_per_unit: 8 -> 4") as err:
        harvest(per_unit(1, old).model_copy(update={"pairs_per_unit": 4}), executor="inline", quiet=True)
    assert "per_unit: 4 -> 1" not in str(err.value)
    m = harvest(per_unit(1, old), executor="inline", quiet=True)
    assert m["complete"] and m["fingerprint"] == old_fp and m["format_version"] == 4 and m["this_run"]["units"] == 1
    same_rows(old)
    # its unread keys as it held them, not as they are set now
    assert HarvestRun(per_unit(1, old), "inline", False, True).fingerprint_in_format(4, m) == old_fp

    # the other kinds, fingerprinted without running them: a clustered harvest (its finished run here, so the
    # changed config is resolved as that run), then a --pairs one
    ccfg, cout = cluster_run
    partners = {"neighbours": 0, "same_doc": 3, "random": 0, "neighbour_chunks": 2}
    clustered = ccfg.model_copy(update={"anchors": ccfg.anchors.model_copy(update={"per_unit": 5}),
                                        "partners": ccfg.partners.model_copy(update=partners)})
    assert HarvestRun(clustered, "inline", False, True).fp == ShardStore(str(cout)).read_manifest()["fingerprint"]
    f = tmp_path / "pairs.tsv"
    f.write_text("The nation must remain strong.\tOur country has to stay powerful.\n")
    explicit = pool_config(inputs, tmp_path / "explicit", pairs_file=str(f), rank={"enabled": False})
    moved = explicit.model_copy(update={"anchors": explicit.anchors.model_copy(update={"n": 3, "min_tokens": 9}),
                                        "partners": explicit.partners.model_copy(update=partners)})
    assert HarvestRun(moved, "inline", False, True).fp == HarvestRun(explicit, "inline", False, True).fp
    assert moved.semantic(keep_unread=True) != explicit.semantic(keep_unread=True)


# ---------------------------------------------------------------- one writer, from before the pool's setup


def clustered_args(inputs, out) -> list:
    """`sentsim harvest` of a pool drawn by clusters and of pairs within clusters: the setup before the run opens
    clusters twice (minutes each at 1M anchors)."""
    sets = [f"contexts.pool_size={POOL}", "contexts.pool_draw=clusters", "anchors.n=12", "anchors.per_unit=4",
            "sentences_per_unit=8", "pairs_per_unit=8", "scoring.batch_tokens=2048", "scoring.autocast=off",
            "partners.cluster_size=4", "contexts.mode=pool", "rank.n_anchors=32"]
    return ["harvest", "--corpus", inputs["corpus"], "--index", inputs["index"], "--context-models", inputs["bundle"],
            "--out", out, "--executor", "inline", *(a for x in sets for a in ("--set", x))]


def signalled_in_setup(args, signame: str):
    """The real command (sentsim.cli.main) in a process that sends itself `signame` where its pool harvest is
    about to draw the pool: after the run's lease is taken, before the pool is drawn or anything clustered. The
    signal is the only thing added to the command, and no timing decides where it lands."""
    import subprocess
    import sys

    from conftest import ROOT

    # Ctrl-C at a terminal: a process started in the background by a non-interactive shell (a CI runner's
    # `cmd &`) inherits SIGINT ignored, and Python then leaves it ignored; a user's terminal gives it Python's own
    code = ("import os, signal, sys\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "import sentsim.harvest.pool as pool\n"
            "draw = pool.draw_pool\n"
            "def in_setup(*a, **kw):\n"
            f"    os.kill(os.getpid(), signal.{signame})\n"
            "    return draw(*a, **kw)\n"
            "pool.draw_pool = in_setup\n"
            "from sentsim.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_a_second_writer_is_refused_before_the_pool_is_drawn_or_the_anchors_clustered(inputs, tmp_path, capsys,
                                                                                        monkeypatch):
    """A pool harvest holds its run from before its setup (the pool draw and the clustering, minutes at scale): a
    second `sentsim harvest` into the same --out, --force-new too, exits 2 in the lease's one line naming the
    holder, without drawing or clustering anything, and leaves the run alone; the holder then finishes, and the
    run is free again. The second writer is the real console script, its --force-new one sentsim.cli.main in this
    process (no subprocess start-up)."""
    import signal
    import time

    import psutil

    from storage.lease import LEASE

    out = tmp_path / "run"
    args = clustered_args(inputs, out)
    first = signalled_in_setup(args, "SIGSTOP")  # stops itself holding the lease, before its pool draw
    try:
        proc, deadline = psutil.Process(first.pid), time.time() + 600  # a guard against a hang, no assert on speed
        while proc.status() != psutil.STATUS_STOPPED:
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.1)
        assert json.loads((out / LEASE).read_text())["pid"] == first.pid
        assert [p.name for p in out.iterdir()] == [LEASE]
        # the holder beats no heartbeat while stopped: judged live however slow this machine is
        monkeypatch.setenv("SENTSIM_LEASE_STALE_SECONDS", "3600")
        for extra in ((), ("--force-new",)):
            r = sentsim_cli(*args) if not extra else cli_in_process(capsys, *args, *extra)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
            assert f"{out} is being written by pid {first.pid} on host" in lines[0], lines
            assert "one writer per run" in lines[0] and "[harvest" not in r.stderr, lines
            assert [p.name for p in out.iterdir()] == [LEASE]  # nothing written, nothing deleted
            assert json.loads((out / LEASE).read_text())["pid"] == first.pid
        monkeypatch.delenv("SENTSIM_LEASE_STALE_SECONDS")
        first.send_signal(signal.SIGCONT)
        _, stderr = first.communicate(timeout=900)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr[-3000:]
    # the holder drew its pool and clustered its anchors, with its pool runs nested under its lease, and labelled
    assert stderr.count("[harvest] clustering ") == 2 and "[harvest] unit" in stderr, stderr[-3000:]
    assert "[harvest-pool-vectors] unit" in stderr and "[harvest-pool-ranks] unit" in stderr, stderr[-3000:]
    assert not (out / LEASE).exists() and (out / "_COMPLETE").is_file()
    done = pairs_of(out)
    r = sentsim_cli("store", "verify", out)
    assert r.returncode == 0 and r.stdout.strip() == f"{out}: OK", r.stdout + r.stderr[-1500:]
    r = sentsim_cli(*args)  # free again: resumed, with nothing left to do
    assert r.returncode == 0 and "[harvest] unit" not in r.stderr and "took over" not in r.stderr, r.stderr[-2000:]
    assert pairs_of(out).equals(done)


@pytest.mark.parametrize("how", ["refused", "SIGINT", "SIGTERM"])
def test_a_setup_refused_or_stopped_after_taking_the_lease_leaves_no_lease_behind(inputs, tmp_path, how):
    """A pool harvest whose setup fails (a pool larger than the corpus allows), is stopped by Ctrl-C (SIGINT) or
    by SIGTERM, after it took the run's lease: no lease is left, nor a folder it made for a new run; a run that
    was there keeps its files; the same command then runs, with no lease to take over, and leaves none (to the end
    after SIGTERM; one unit, --max-units 1, in the other cases, where taking the lease and running is what is shown)."""
    import signal

    from storage.lease import LEASE

    out = tmp_path / "new" / "run"
    args = clustered_args(inputs, out)
    if how == "refused":
        r = sentsim_cli(*args, "--set", "contexts.pool_size=999999")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "is more than the corpus's" in lines[0], r.stderr[-2000:]
        assert not (tmp_path / "new").exists()
    else:
        p = signalled_in_setup(args, how)
        _, stderr = p.communicate(timeout=900)
        if how == "SIGINT":
            assert p.returncode == 130 and "interrupted; run the same command again" in stderr, stderr[-2000:]
        else:  # ended by the signal, as before, once its lease is released
            assert p.returncode == -signal.SIGTERM, stderr[-2000:]
        assert not (tmp_path / "new").exists()  # neither the lease nor the folders it made
        # a run already there, stopped in the setup of its resume: its files stay, its lease does not
        r = sentsim_cli(*args, "--max-units", "1")
        assert r.returncode == 0 and "stopped after --max-units 1" in r.stdout, r.stderr[-2000:]
        before = {q.relative_to(out): q.read_bytes() for q in out.rglob("*") if q.is_file()}
        p = signalled_in_setup(args, how)
        p.communicate(timeout=900)
        assert p.returncode == (130 if how == "SIGINT" else -signal.SIGTERM)
        assert {q.relative_to(out): q.read_bytes() for q in out.rglob("*") if q.is_file()} == before
        assert LEASE not in {q.name for q in out.iterdir()}
    # the same command runs, with no lease to take over: to the end once (after SIGTERM), a unit in the other cases
    r = sentsim_cli(*args) if how == "SIGTERM" else sentsim_cli(*args, "--max-units", "1")
    assert r.returncode == 0 and "took over the lease" not in r.stderr, r.stderr[-3000:]
    if how == "SIGTERM":
        assert (out / "_COMPLETE").is_file(), (r.stdout, r.stderr[-3000:])
    else:
        assert "[harvest-pool-vectors] unit" in r.stderr and "stopped" in r.stdout, (r.stdout, r.stderr[-3000:])
    assert (out / "manifest.json").is_file() and not (out / LEASE).exists()
