"""The pool harvest's rank targets (harvest/pool_ranks.py): each sentence of the plan encoded once into a run of
its own, every unit's sentence rows and rank similarities taken from it; stopped and resumed, mended, rebuilt
alone for other rank settings, rebuilt by a rerun or relabel after it was deleted (and what reads it meanwhile),
and absent with rank targets off; report.json's rank target bytes by storage."""

import json
import shutil

import numpy as np
import pyarrow.dataset as ds
import pytest
from conftest import sentsim_cli
from run_support import before_manifest_checksums
from test_pool_harvest import inputs, pairs_of, pool_config  # noqa: F401  (inputs: a fixture)

from storage import RunReader, ShardStore

pytestmark = pytest.mark.slow


def cluster_config(inputs, out, **over):  # noqa: F811  (the fixture's value)
    """Every pair within TF-IDF clusters of 4 anchors: each sentence is in several units of 8 pairs."""
    return pool_config(inputs, out, partners={"cluster_size": 4}, anchors={"n": 12}, **over)


def ranks_of(run):
    """sentence id -> its stored targets (the ranks run's table) as a numpy row."""
    t = RunReader(str(run / "pool_ranks")).read_table("sentence_ranks")
    column = t.column_names[1]
    return {int(s): np.asarray(v) for s, v in zip(t.column("sentence_id").to_pylist(), t.column(column).to_pylist())}


def sentence_rows(run):
    return ds.dataset(str(run / "sentences")).to_table().to_pandas()


def anchors_of(run):
    return RunReader(str(run)).side_table("rank_anchors")


@pytest.fixture(scope="module")
def codes_run(inputs, tmp_path_factory):  # noqa: F811
    """A clustered pool harvest with rank codes, every rank target encoding counted (the inline executor runs
    the stages in this process)."""
    from sentsim.harvest.job import harvest
    from sentsim.rank.targets import RankTargets

    out = tmp_path_factory.mktemp("ranks") / "codes"
    cfg = cluster_config(inputs, out, rank={"storage": "codes"})
    encoded = []
    codes = RankTargets.codes
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RankTargets, "codes", lambda self, texts: encoded.extend(texts) or codes(self, texts))
        assert harvest(cfg, executor="inline", quiet=True)["complete"]
    return cfg, out, encoded


def test_each_sentence_is_encoded_once_and_every_unit_carries_its_targets(codes_run):
    from sentsim.rank import rank_similarity

    cfg, out, encoded = codes_run
    manifest = json.loads((out / "manifest.json").read_text())
    n = manifest["pool"]["sentences"]
    rows = sentence_rows(out)
    assert rows.sentence_id.nunique() == n and len(rows) > n  # a sentence is in more than one unit
    assert len(encoded) == n and len(set(encoded)) == n  # each sentence through E1 once, not once per unit
    ranks = ShardStore(str(out / "pool_ranks"))
    markers = ranks.markers().values()
    assert sum(m["extra"]["sentences"] for m in markers) == n
    assert ranks.read_manifest()["complete"]
    assert manifest["pool"]["ranks_fingerprint"] == ranks.read_manifest()["fingerprint"]
    stored = ranks_of(out)
    assert sorted(stored) == sorted(set(rows.sentence_id))
    for s, codes in zip(rows.sentence_id, rows.rank_codes):  # every unit's row of a sentence: its stored codes
        assert codes is not None and np.array_equal(np.asarray(codes), stored[int(s)])
    assert rows.base_vector.isna().all()
    pairs = pairs_of(out)
    want = rank_similarity(np.stack([stored[int(s)] for s in pairs.s1_id]),
                           np.stack([stored[int(s)] for s in pairs.s2_id]))
    assert np.array_equal(pairs.rank_sim.to_numpy(), want)


def test_the_report_names_the_rank_storage_and_its_bytes(codes_run):
    """report.json: codes of n_anchors ranks at rank.bits each; the key's first name holds the same value."""
    cfg, out, _ = codes_run
    report = json.loads((out / "report.json").read_text())
    want = cfg.rank.n_anchors * cfg.rank.bits // 8
    assert report["rank_storage"] == "codes"
    assert report["bytes_per_sentence_rank_targets"] == report["bytes_per_sentence_rank_codes"] == want


def test_the_stored_codes_are_the_sentences_rank_codes(codes_run):
    """What RankTargets gives for the sentences, encoded together. With the bundled E1 on CPU they are equal
    (each sentence encoded alone gives them too); the check allows what another machine's kernels may give:
    E1's float sums change with a batch's padding, which can swap two anchors whose cosines to a sentence are
    within ~1e-6, moving two ranks by one each, in a few places."""
    from sentsim.rank.targets import RankTargets, default_base_encoder

    cfg, out, _ = codes_run
    anchors = anchors_of(out)
    stored = ranks_of(out)
    ids = sorted(stored)
    texts = dict(zip(sentence_rows(out).sentence_id, sentence_rows(out).text))
    targets = RankTargets(cfg.rank.encoder or default_base_encoder(), anchors.column("sentence_id").to_numpy(),
                          anchors.column("text").to_pylist(), bits=cfg.rank.bits)
    want = targets.codes([texts[s] for s in ids]).astype(np.int64)
    got = np.stack([stored[s] for s in ids]).astype(np.int64)
    assert got.shape == want.shape == (len(ids), cfg.rank.n_anchors)
    diff = np.abs(got - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (diff.max(), (diff > 0).mean())
    assert all(sorted(row) == list(range(cfg.rank.n_anchors)) for row in got)  # each a permutation of the ranks


def test_vectors_storage_keeps_each_sentences_float16_vector(inputs, tmp_path):  # noqa: F811
    from sentsim.harvest.anchors import stored_anchor_vectors
    from sentsim.harvest.job import harvest
    from sentsim.rank.targets import BaseVectors, default_base_encoder
    from sentsim.rank.vectors import AnchorMatrix, spearman_of_ranks

    out = tmp_path / "vectors"
    cfg = cluster_config(inputs, out, rank={"storage": "vectors"})
    assert harvest(cfg, executor="inline", quiet=True)["complete"]
    stored = ranks_of(out)
    rows = sentence_rows(out)
    assert rows.rank_codes.isna().all()
    for s, v in zip(rows.sentence_id, rows.base_vector):
        assert np.array_equal(np.asarray(v, dtype=np.float16), stored[int(s)].astype(np.float16))
    ids = sorted(stored)
    texts = dict(zip(rows.sentence_id, rows.text))
    want = BaseVectors(cfg.rank.encoder or default_base_encoder()).vectors([texts[s] for s in ids])
    got = np.stack([stored[s] for s in ids]).astype(np.float16)
    assert got.dtype == want.dtype and np.allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-3)
    anchors = AnchorMatrix(stored_anchor_vectors(ShardStore(str(out)), json.loads(
        (out / "manifest.json").read_text())["fingerprint"]))
    pairs = pairs_of(out)
    ranks = anchors.ranks(np.stack([stored[int(s)] for s in pairs.s1_id]).astype(np.float16))
    others = anchors.ranks(np.stack([stored[int(s)] for s in pairs.s2_id]).astype(np.float16))
    assert np.allclose(pairs.rank_sim.to_numpy(), spearman_of_ranks(ranks, others), atol=1e-12)
    # report.json names the storage, and its bytes are the float16 vector's (under the key's first name too,
    # which says codes: kept for its readers)
    report = json.loads((out / "report.json").read_text())
    assert report["rank_storage"] == "vectors"
    assert report["bytes_per_sentence_rank_targets"] == report["bytes_per_sentence_rank_codes"] == 2 * got.shape[1]


def test_stopped_in_the_ranks_pass_a_rerun_finishes_it(codes_run, tmp_path, capsys):
    """A pool harvest part-labelled without a ranks run (as one begun before them): --max-units stops in the rank
    targets (the vectors done) and labels nothing; reruns finish them, redoing a lost unit and a cut shard, keep
    the labelled unit as it was and label the rest from the stored targets, to the same rows."""
    from sentsim.harvest.job import harvest

    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "pool_ranks")
    for p in sorted((copy / "_units").glob("*.json"))[1:]:
        p.unlink()
    (copy / "_COMPLETE").unlink()
    kept = {p: p.stat().st_mtime_ns for table in ("pairs", "sentences") for p in (copy / table).glob("part-00000*")}
    assert kept
    run_cfg = cfg.model_copy(update={"out": str(copy)})
    stopped = harvest(run_cfg, executor="inline", quiet=False, max_units=1)
    err = capsys.readouterr().err
    units = ShardStore(str(copy / "pool_ranks")).read_manifest()["planned_units"]
    assert not stopped["complete"] and stopped["completed_units"] == 1 and units > 1
    assert f"[harvest] the pool's rank targets ({copy}/pool_ranks) stopped at --max-units 1, 1/{units} " \
           "units done; no pair is labelled until they are all done" in err, err
    (copy / "pool_ranks" / "_units" / "00000.json").unlink()
    assert harvest(run_cfg, executor="inline", quiet=True, max_units=1)["completed_units"] == 1
    shard = sorted((copy / "pool_ranks" / "sentence_ranks").glob("*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:60])
    assert harvest(run_cfg, executor="inline", quiet=True)["complete"]
    assert ranks_of(copy).keys() == ranks_of(out).keys()
    assert all(np.array_equal(v, ranks_of(out)[s]) for s, v in ranks_of(copy).items())
    assert pairs_of(copy).equals(pairs_of(out))
    assert {p: p.stat().st_mtime_ns for p in kept} == kept


def test_a_finished_harvests_damaged_ranks_are_named_by_verify_and_mended_by_a_rerun(codes_run, tmp_path):
    from sentsim.harvest.job import harvest
    from storage.verify import verify_store

    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shard = sorted((copy / "pool_ranks" / "sentence_ranks").glob("*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:200])
    problems = verify_store(str(copy))
    assert problems and all(p.startswith("pool_ranks/sentence_ranks/") for p in problems), problems
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode != 0 and "pool_ranks/sentence_ranks/" in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True)["complete"]
    assert verify_store(str(copy)) == []
    assert pairs_of(copy).equals(pairs_of(out))


def _shards(run, *tables):
    """Every shard and marker of these tables of `run`, by path, with its bytes: what a rerun must not touch."""
    return {str(p.relative_to(run)): p.read_bytes() for t in tables for p in sorted((run / t).rglob("*"))
            if p.is_file()}


def test_a_finished_harvests_deleted_ranks_are_rebuilt_by_the_same_command(codes_run, tmp_path):
    """pool_ranks/ deleted from a finished harvest (to save space, say): `store verify` says so and names the
    command that rebuilds it; that command, the same harvest run again, encodes it again, to the same targets
    (the same rows, and the fingerprint the manifest recorded) and says they are the ones the labels hold,
    without touching a labelled row."""
    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "pool_ranks")
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert (f"{copy}/pool_ranks: not there (deleted?); this harvest's rows are whole without it, but a relabel "
            "reads it, and the same harvest command rebuilds it") in r.stdout, r.stdout
    labelled = _shards(copy, "pairs", "sentences", "_units")
    r = sentsim_cli("harvest", "--config", _config_file(cfg, copy, tmp_path), "--executor", "inline")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    n = json.loads((out / "manifest.json").read_text())["pool"]["sentences"]
    assert (f"[harvest] {copy}/pool_ranks was not there and is rebuilt: the same rank targets as the {n:,} "
            "labelled sentences were computed from") in r.stderr, r.stderr[-3000:]
    assert "[harvest] unit" not in r.stderr, r.stderr[-3000:]  # nothing relabelled
    assert RunReader(str(copy / "pool_ranks")).read_table("sentence_ranks").sort_by("sentence_id").equals(
        RunReader(str(out / "pool_ranks")).read_table("sentence_ranks").sort_by("sentence_id"))
    fp = ShardStore(str(out / "pool_ranks")).read_manifest()["fingerprint"]
    assert ShardStore(str(copy / "pool_ranks")).read_manifest()["fingerprint"] == fp
    assert json.loads((copy / "manifest.json").read_text())["pool"]["ranks_fingerprint"] == fp
    assert _shards(copy, "pairs", "sentences", "_units") == labelled
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode == 0 and r.stdout.strip() == f"{copy}: OK", r.stdout + r.stderr[-2000:]


def test_a_rerun_stopped_before_the_ranks_keeps_the_record_of_the_deleted_runs(codes_run, tmp_path):
    """--max-units 1 on a finished harvest whose pool_vectors/ and pool_ranks/ were deleted rebuilds one unit of
    the vectors and stops; its manifest still names the runs the labels were read from (not none for the ranks
    run it has not begun), so that the next rerun rebuilds both, to those fingerprints."""
    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    for inner in ("pool_ranks", "pool_vectors"):
        shutil.rmtree(copy / inner)
    pool = json.loads((out / "manifest.json").read_text())["pool"]
    config = _config_file(cfg, copy, tmp_path)
    r = sentsim_cli("harvest", "--config", config, "--executor", "inline", "--max-units", "1")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"the pool's sentence vectors ({copy}/pool_vectors) stopped at --max-units 1" in r.stderr, r.stderr[-3000:]
    assert not (copy / "pool_ranks").exists()
    assert json.loads((copy / "manifest.json").read_text())["pool"] == pool
    r = sentsim_cli("harvest", "--config", config, "--executor", "inline")
    assert r.returncode == 0, r.stderr[-3000:]
    # the vectors begun by the stopped rerun are finished by this one, and compared with the labels all the same
    for inner in ("pool_vectors", "pool_ranks"):
        assert f"[harvest] {copy}/{inner} was not there and is rebuilt: the same" in r.stderr, r.stderr[-3000:]
    assert ShardStore(str(copy / "pool_ranks")).read_manifest()["fingerprint"] == pool["ranks_fingerprint"]
    assert ShardStore(str(copy / "pool_vectors")).read_manifest()["fingerprint"] == pool["vectors_fingerprint"]
    report, first = (json.loads((run / "report.json").read_text()) for run in (copy, out))
    assert {k: report[k] for k in ("scored_items", "scored_items_per_pair", "vectors_units")} == \
        {k: first[k] for k in ("scored_items", "scored_items_per_pair", "vectors_units")}


def test_a_rankencoder_student_trains_on_a_harvest_whose_inner_runs_were_deleted(codes_run, tmp_path):
    """`train student --objective rankencoder` reads each sentence's targets from the harvest's `sentences` rows
    and its anchors from the side table, never pool_ranks/ or pool_vectors/: with both deleted it trains on every
    sentence, as `store verify`'s note on them says nothing but a relabel and remix need them."""
    from harvest_support import tiny_bert

    _, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    for inner in ("pool_ranks", "pool_vectors"):
        shutil.rmtree(copy / inner)
    r = sentsim_cli("train", "student", "--objective", "rankencoder", "--data", copy, "--out", tmp_path / "st",
                    "--backbone", tiny_bert(tmp_path / "bert"), "--executor", "inline", "--max-steps", "1",
                    "--set", "batch_size=8", "--set", "max_seq_length=32")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    n = json.loads((out / "manifest.json").read_text())["pool"]["sentences"]
    assert json.loads((tmp_path / "st" / "summary.json").read_text())["rows"] == n


def test_a_relabel_of_a_harvest_whose_ranks_were_deleted_encodes_them_again(codes_run, tmp_path):
    """A relabel (another metric, the same --out, --force-new) is what reads pool_ranks/: with it deleted, the
    relabel encodes it again, to the same targets and so the same rank similarities, and labels nothing twice."""
    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "pool_ranks")
    relabel = cfg.model_copy(update={"metric": "double-centred"})
    r = sentsim_cli("harvest", "--config", _config_file(relabel, copy, tmp_path), "--executor", "inline",
                    "--force-new")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "was not there and is rebuilt" not in r.stderr  # nothing labelled under the new run to compare with
    assert RunReader(str(copy / "pool_ranks")).read_table("sentence_ranks").sort_by("sentence_id").equals(
        RunReader(str(out / "pool_ranks")).read_table("sentence_ranks").sort_by("sentence_id"))
    assert pairs_of(copy).rank_sim.equals(pairs_of(out).rank_sim)
    assert not pairs_of(copy).score.equals(pairs_of(out).score)


def test_rebuilt_ranks_unlike_the_labelled_ones_are_counted(codes_run, tmp_path, capsys):
    """Where rebuilt targets are not those the labelled sentences hold (here: another harvest's, of other
    anchors), the rebuild's line counts them rather than calling them the same."""
    from sentsim.harvest.pool_ranks import ranks_unlike_labels
    from sentsim.harvest.pool_vectors import rebuilt_note

    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    n = json.loads((out / "manifest.json").read_text())["pool"]["sentences"]
    assert ranks_unlike_labels(str(copy), "codes") == (0, n)
    t = RunReader(str(copy / "pool_ranks")).read_table("sentence_ranks")
    # each sentence's codes in reverse: still a permutation of the ranks, no longer the labelled one
    reversed_codes = [list(reversed(c)) for c in t.column("rank_codes").to_pylist()]
    shutil.rmtree(copy / "pool_ranks")
    store = ShardStore(str(copy / "pool_ranks"))
    store.open_run("harvest-pool-ranks", "other", {}, [], {"sentence_ranks": t.schema}, planned_units=1)
    store.write_unit(0, {"sentence_ranks": t.set_column(1, "rank_codes", [reversed_codes])}, "other", {})
    store.finalize(1, {})
    assert ranks_unlike_labels(str(copy), "codes") == (n, n)
    rebuilt_note(str(copy / "pool_ranks"), (n, n), "rank targets", quiet=True)  # said even when quiet
    assert capsys.readouterr().err == (
        f"[harvest] note: {copy}/pool_ranks was not there and is rebuilt, but not exactly: {n:,} of the {n:,} "
        "labelled sentences differ from what these rank targets give (scored or encoded on other hardware, or in "
        "other batches); the labelled rows are kept as they were, and a remix or relabel reads the rebuilt ones\n")


def test_a_finished_harvest_labelled_without_a_ranks_run_is_not_given_one(codes_run, tmp_path):
    """A pool harvest finished before its rank targets had a run of their own (its manifest names no ranks run): a
    rerun does nothing, and does not encode every sentence into a ranks run nothing would read."""
    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "pool_ranks")
    m = json.loads((copy / "manifest.json").read_text())
    del m["pool"]["ranks_fingerprint"]  # as such a harvest's summary wrote it
    before_manifest_checksums(m)  # that sentsim wrote no checksum of the manifest either
    (copy / "manifest.json").write_text(json.dumps(m))
    before = {p.name: p.read_bytes() for p in (copy / "_units").glob("*.json")}
    r = sentsim_cli("harvest", "--config", _config_file(cfg, copy, tmp_path), "--executor", "inline")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "[harvest-pool-ranks]" not in r.stderr and "[harvest] unit" not in r.stderr, r.stderr[-3000:]
    assert not (copy / "pool_ranks").exists()
    assert {p.name: p.read_bytes() for p in (copy / "_units").glob("*.json")} == before
    assert pairs_of(copy).equals(pairs_of(out))


def test_a_relabel_with_rank_targets_off_keeps_the_ranks_run_as_one_it_does_not_read(codes_run, tmp_path):
    """The ranks run of a harvest stopped in its ranks pass, then relabelled with rank targets off (--force-new),
    stays in the folder for a relabel that turns them on again. It is no part of the relabelled run: the manifest
    says it is not read, and `store verify` says so and does not call the finished run damaged for it being
    unfinished (a rerun would never finish it). Turned on again, it is resumed and read."""
    from sentsim.harvest.job import harvest
    from storage.verify import verify_store

    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    marker = copy / "pool_ranks" / "_units" / "00000.json"
    for f in json.loads(marker.read_text())["files"].values():
        (copy / "pool_ranks" / f["path"]).unlink()
    marker.unlink()
    (copy / "pool_ranks" / "_COMPLETE").unlink()
    off = cfg.model_copy(update={"out": str(copy), "rank": cfg.rank.model_copy(update={"enabled": False})})
    m = harvest(off, executor="inline", quiet=True, force_new=True)
    assert m["complete"] and m["pool"]["ranks_fingerprint"] is None
    assert pairs_of(copy).rank_sim.isna().all()
    assert verify_store(str(copy)) == []
    assert m["unread_nested_runs"] == ["pool_ranks"]
    r = sentsim_cli("store", "verify", copy)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"{copy}/pool_ranks: not read by this run" in r.stdout, r.stdout
    m = harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True, force_new=True)
    assert m["complete"] and m["unread_nested_runs"] == []
    assert m["pool"]["ranks_fingerprint"] == ShardStore(str(copy / "pool_ranks")).read_manifest()["fingerprint"]
    assert verify_store(str(copy)) == [] and pairs_of(copy).equals(pairs_of(out))


def _config_file(cfg, out, tmp_path):
    """cfg, at `out`, as a YAML file the command reads."""
    import yaml

    path = tmp_path / "harvest.yaml"
    path.write_text(yaml.safe_dump(json.loads(cfg.model_copy(update={"out": str(out)}).model_dump_json())))
    return path


def test_a_force_new_pool_harvest_builds_its_ranks_job_once(codes_run, tmp_path):
    """Under --force-new the ranks run is checked before the old run is discarded (runs_first) and built after
    (prepare): one job for both, so its sentences are planned and fingerprinted once. It is the run the
    harvest had: confirmed, not encoded again."""
    from sentsim.harvest.job import harvest
    from sentsim.harvest.pool_ranks import PoolRanksRun

    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    markers = {p.name: p.read_bytes() for p in (copy / "pool_ranks" / "_units").glob("*.json")}
    built = []
    init = PoolRanksRun.__init__
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PoolRanksRun, "__init__", lambda self, *a, **k: built.append(self) or init(self, *a, **k))
        m = harvest(cfg.model_copy(update={"out": str(copy)}), executor="inline", quiet=True, force_new=True)
    assert m["complete"] and m["this_run"]["units"] == m["planned_units"]
    assert len(built) == 1
    assert m["pool"]["ranks_fingerprint"] == built[0].fp == \
        ShardStore(str(out / "pool_ranks")).read_manifest()["fingerprint"]
    assert {p.name: p.read_bytes() for p in (copy / "pool_ranks" / "_units").glob("*.json")} == markers
    assert pairs_of(copy).equals(pairs_of(out))


def test_other_rank_bits_rebuild_the_ranks_and_reuse_the_vectors(codes_run, tmp_path):
    """Only labelling reads rank.bits: a harvest relabelled with other bits (the same --out, --force-new) keeps
    the vectors run as it is and encodes the rank targets again, into a run of their own identity."""
    from sentsim.harvest.job import harvest

    cfg, out, _ = codes_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)

    def files(sub, table):
        return {p.name: p.stat().st_mtime_ns for p in (copy / sub / table).iterdir()}

    vectors, ranks = files("pool_vectors", "sentence_vectors"), files("pool_ranks", "sentence_ranks")
    before = ShardStore(str(copy / "pool_ranks")).read_manifest()
    m = harvest(cfg.model_copy(update={"out": str(copy), "rank": cfg.rank.model_copy(update={"bits": 8})}),
                executor="inline", quiet=True, force_new=True)
    assert m["complete"] and m["config"]["rank"]["bits"] == 8
    assert files("pool_vectors", "sentence_vectors") == vectors
    after = ShardStore(str(copy / "pool_ranks")).read_manifest()
    assert after["fingerprint"] != before["fingerprint"] and after["config"]["identity"]["bits"] == 8
    assert after["complete"] and files("pool_ranks", "sentence_ranks").keys() == ranks.keys()
    assert all(files("pool_ranks", "sentence_ranks")[k] != t for k, t in ranks.items())
    assert m["pool"]["ranks_fingerprint"] == after["fingerprint"]
    # 64 anchors fit in 8 bits: the same ranks, so the same rank similarities
    assert np.allclose(pairs_of(copy).rank_sim, pairs_of(out).rank_sim)


def test_rank_targets_off_build_no_ranks_run(inputs, tmp_path):  # noqa: F811
    from sentsim.harvest.job import harvest

    out = tmp_path / "off"
    m = harvest(pool_config(inputs, out, rank={"enabled": False}), executor="inline", quiet=True)
    assert m["complete"] and not (out / "pool_ranks").exists()
    assert m["pool"]["ranks_fingerprint"] is None
    assert pairs_of(out).rank_sim.isna().all()
    report = json.loads((out / "report.json").read_text())
    assert report["rank_storage"] is None
    assert report["bytes_per_sentence_rank_targets"] == report["bytes_per_sentence_rank_codes"] == 0
