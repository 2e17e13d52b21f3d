"""rank.storage=vectors (issue 16): each sentence keeps E1's float16 vector, the run keeps the anchor
matrix once (side table rank_anchors), and ranks are computed where they are used (sentsim.rank.AnchorMatrix):
the storage round-trips through Parquet and ray.data, the ranks equal the codes' where those are lossless, a
real harvest with vectors trains a RankEncoder student, and a bad anchor table is one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from harvest_support import build_index_for, harvest_config, tiny_bert, tiny_context_bundle
from scipy.stats import spearmanr

from sentsim.rank import (
    AnchorMatrix,
    RankCodec,
    g_normalise,
    rank_similarity,
    ranks_from_similarities,
    resolve_storage,
    spearman_of_ranks,
    vector_bytes,
)

# ----------------------------------------------------------------------------- no harvest


def test_ranks_from_vectors_equal_ranks_from_codes_where_codes_are_lossless():
    """Identity anchors make every similarity exact (v . e_i = v_i) and float16-exact values make the
    stored vector exact, so the torch ranks must equal the 16-bit codes (lossless at 64 anchors) exactly."""
    rng = np.random.default_rng(0)
    n = 64
    anchors = np.eye(n, dtype=np.float16)
    v = np.stack([(rng.permutation(n) - n // 2) / 8.0 for _ in range(6)]).astype(np.float16)  # distinct, exact
    codec = RankCodec(n, 16)
    assert codec.step == 1  # lossless
    codes = codec.encode(ranks_from_similarities(v.astype(np.float64) @ anchors.astype(np.float64).T))
    am = AnchorMatrix(anchors)
    ranks = am.ranks(v).numpy()
    assert np.array_equal(ranks, codec.decode(codes).astype(np.int64))
    assert np.allclose(am.targets(v).numpy(), g_normalise(codec.decode(codes)), atol=1e-6)
    exact = rank_similarity(codec.decode(codes[[0, 2, 4]]), codec.decode(codes[[1, 3, 5]]))
    assert np.allclose(am.rank_similarity(v[[0, 2, 4]], v[[1, 3, 5]]), exact, atol=1e-9)
    assert np.allclose(spearman_of_ranks(am.ranks(v[[0]]), am.ranks(v[[1]])),
                       [spearmanr(v[0].astype(float), v[1].astype(float)).statistic], atol=1e-12)


def test_storage_choice_and_default_fingerprint():
    """auto: the smaller per sentence (codes up to 384 anchors with a 384-d E1 at 16 bits); auto is not in
    the fingerprint, so default-config harvests keep theirs; a run opened before base_vector keeps codes."""
    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.stages import LEGACY_SENTENCE_SCHEMA, SENTENCE_SCHEMA, rank_storage_of, sentence_schema_of
    from storage.store import schema_signature

    assert resolve_storage("auto", 384, 16, 384) == "codes" and resolve_storage("auto", 385, 16, 384) == "vectors"
    assert resolve_storage("auto", 100_000, 16, 384) == "vectors" and resolve_storage("codes", 10**6, 16, 8) == "codes"
    assert vector_bytes(384) == 768 and RankCodec(100_000, 16).bytes_per_sentence == 200_000
    base = {"corpus": "c", "out": "o", "context_models": ["m"], "contexts": {"mode": "random"}}
    cfg = HarvestConfig.model_validate(base)
    assert cfg.rank.storage == "auto" and "storage" not in cfg.semantic()["rank"]
    vec = HarvestConfig.model_validate({**base, "rank": {"storage": "vectors"}})
    assert vec.semantic()["rank"]["storage"] == "vectors"
    pre_vectors = {"tables": {"sentences": schema_signature(SENTENCE_SCHEMA.remove(
        SENTENCE_SCHEMA.get_field_index("base_vector")))}}
    schema = sentence_schema_of(pre_vectors)
    assert "base_vector" not in schema.names and "context_ids" in schema.names
    assert rank_storage_of(vec, schema) == "codes"  # a resumed codes run keeps writing codes
    assert sentence_schema_of({"tables": {"sentences": schema_signature(LEGACY_SENTENCE_SCHEMA)}}) == \
        LEGACY_SENTENCE_SCHEMA
    assert sentence_schema_of({}) == SENTENCE_SCHEMA
    assert rank_storage_of(vec, SENTENCE_SCHEMA) == "vectors"


# ----------------------------------------------------------------------------- a real harvest


slow = pytest.mark.slow


@pytest.fixture(scope="module")
def vectors_run(speech_corpus, tmp_path_factory):
    """A real harvest with rank.storage=vectors: 8 anchors, partners, tiny context model, 64 rank anchors."""
    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("vectors_harvest")
    cfg = harvest_config(speech_corpus, build_index_for(speech_corpus, root / "index"),
                         tiny_context_bundle(speech_corpus, root / "ctx"), root / "run",
                         anchors={"n": 8, "per_unit": 4}, rank={"n_anchors": 64, "storage": "vectors"})
    harvest(cfg, executor="inline", quiet=True)
    return cfg, root / "run"


@slow
def test_vectors_round_trip_parquet_and_ray_data(vectors_run, ray_local):
    from sentsim.harvest.anchors import stored_anchor_vectors
    from storage import ShardStore, verify_store
    from storage.reader import open_run

    cfg, run = vectors_run
    assert verify_store(str(run)) == []
    t = ds.dataset(str(run / "sentences")).to_table()
    assert t.schema.field("base_vector").type == pa.list_(pa.float16())
    assert t["base_vector"].null_count == 0 and t["rank_codes"].null_count == t.num_rows
    stored = np.asarray(t["base_vector"].to_pylist(), dtype=np.float16)
    assert stored.shape == (t.num_rows, 384)
    assert np.allclose(np.linalg.norm(stored.astype(np.float32), axis=1), 1.0, atol=2e-3)
    marker = json.loads((run / "_units" / "00000.json").read_text())["extra"]
    assert marker["rank_storage"] == "vectors" and marker["bytes_per_sentence"] == 768
    # ray.data reads the same float16 values back (an object column of float16 arrays per row)
    r = open_run(str(run))
    got = {}
    for b in r.ray_dataset("sentences", ["sentence_id", "base_vector"]).iter_batches(batch_format="numpy",
                                                                                   batch_size=64):
        for sid, vec in zip(b["sentence_id"], b["base_vector"]):
            got[int(sid)] = np.asarray(vec)
    by_id = dict(zip(t["sentence_id"].to_pylist(), stored))
    assert set(got) == set(by_id) and all(v.dtype == np.float16 and np.array_equal(v, by_id[k])
                                          for k, v in got.items())
    # the anchor matrix: once per run, float16, one row per anchor sentence
    side = pq.read_table(run / "_side" / "rank_anchors.parquet")
    A = stored_anchor_vectors(ShardStore(str(run)), r.fingerprint)
    assert A.dtype == np.float16 and A.shape == (side.num_rows, 384) == (64, 384)
    # the harvest's rank_sim is exactly what a reader recomputes from the stored vectors and matrix
    pairs = ds.dataset(str(run / "pairs")).to_table().to_pandas()
    am = AnchorMatrix(A)
    want = am.rank_similarity(np.stack([by_id[s] for s in pairs.s1_id]), np.stack([by_id[s] for s in pairs.s2_id]))
    assert np.allclose(pairs.rank_sim.to_numpy(), want, atol=1e-12)


@slow
def test_rank_sim_from_vectors_agrees_with_codes(vectors_run):
    """The codes path (faiss, float32, 16-bit codes, lossless at 64 anchors) over the same sentences
    gives the same rank_sim up to float16 rounding of the stored vectors."""
    from sentsim.rank.targets import RankTargets, default_base_encoder

    cfg, run = vectors_run
    side = pq.read_table(run / "_side" / "rank_anchors.parquet")
    rt = RankTargets(default_base_encoder(), side["sentence_id"].to_numpy(), side["text"].to_pylist(), device="cpu")
    sents = ds.dataset(str(run / "sentences")).to_table()
    text = dict(zip(sents["sentence_id"].to_pylist(), sents["text"].to_pylist()))
    pairs = ds.dataset(str(run / "pairs")).to_table().to_pandas()
    codes1 = rt.codes([text[s] for s in pairs.s1_id])
    codes2 = rt.codes([text[s] for s in pairs.s2_id])
    from_codes = rank_similarity(codes1, codes2)
    assert spearmanr(from_codes, pairs.rank_sim).statistic > 0.99
    assert np.abs(from_codes - pairs.rank_sim.to_numpy()).max() < 0.02
    # and per sentence: ranks from the stored float16 vector vs the codes, Spearman near 1
    vecs = np.asarray(sents["base_vector"].to_pylist(), dtype=np.float16)
    ranks = AnchorMatrix(np.asarray(side["vector"].to_pylist(), dtype=np.float16)).ranks(vecs).numpy()
    codes = rt.codes(sents["text"].to_pylist()).astype(np.int64)
    rhos = [spearmanr(a, b).statistic for a, b in zip(ranks, codes)]
    assert min(rhos) > 0.995


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory):
    """A 2-layer BERT from config (random weights) with all-MiniLM-L6-v2's tokenizer files."""
    return tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _train(harvest_dir, backbone, out, **over):
    from sentsim.config import load_config
    from sentsim.students import StudentConfig, train_student

    base = {"batch_size": 8, "epochs": 4, "lr": 1e-3, "log_every": 1, "eval_every": 1000, "max_seq_length": 32}
    base.update(over)
    sets = [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in base.items()]
    cfg = load_config(StudentConfig, None, sets, objective="rankencoder")
    return train_student(cfg, data=str(harvest_dir), backbone=str(backbone), out=str(out), executor="inline",
                         verbose=False)


@slow
def test_vectors_harvest_trains_a_rankencoder_student_whose_loss_falls(vectors_run, tiny_backbone, tmp_path,
                                                                        one_torch_thread):
    cfg, run = vectors_run
    s = _train(run, tiny_backbone, tmp_path / "re")
    losses = [h["train_loss"] for h in s["history"] if h.get("train_loss") is not None]
    assert len(losses) >= 6 and np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses
    steps = [h for h in s["history"] if "pairs_kept" in h]
    assert any(h["l_r"] is not None for h in steps)  # the rank term ran on targets computed on the fly
    assert s["counts"]["sentences"] >= 16
    meta = json.loads((tmp_path / "re" / "model" / "rank_anchors.json").read_text())
    assert len(meta["anchors"]) == 64


@slow
def test_missing_or_mismatched_anchor_table_is_one_line(vectors_run, tiny_backbone, tmp_path):
    from sentsim.errors import UsageError
    from storage import ShardStore

    cfg, run = vectors_run
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    for f in (bad / "_side").glob("rank_anchors.*"):
        f.unlink()
    with pytest.raises(UsageError, match=r"rank_anchors.parquet is missing or from another run") as e:
        _train(bad, tiny_backbone, tmp_path / "o1")
    assert "\n" not in str(e.value)
    # an anchor table of another encoder's width (written properly, so its checksum is fine)
    side = pq.read_table(run / "_side" / "rank_anchors.parquet")
    narrow = np.ones((side.num_rows, 8), dtype=np.float16)
    side = side.set_column(side.schema.get_field_index("vector"), "vector",
                           pa.array(list(narrow), pa.list_(pa.float16())))
    fp = json.loads((bad / "manifest.json").read_text())["fingerprint"]
    ShardStore(str(bad)).write_side_table("rank_anchors", side, fp)
    with pytest.raises(UsageError, match="base vectors have 384 dimensions but the run's anchor matrix .* has 8") as e:
        _train(bad, tiny_backbone, tmp_path / "o2")
    assert "\n" not in str(e.value)
    # a corrupt one is named by its checksum
    p = bad / "_side" / "rank_anchors.parquet"
    p.write_bytes(p.read_bytes()[:-20] + b"x" * 20)
    with pytest.raises(UsageError, match="rank_anchors.parquet: checksum mismatch") as e:
        _train(bad, tiny_backbone, tmp_path / "o3")
    assert "\n" not in str(e.value)
