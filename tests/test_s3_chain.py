"""The whole chain on s3:// (a local moto S3 server): corpus build, index build, harvest, store
verify, then a surrogate and a student trained straight from the s3:// harvest."""

from __future__ import annotations

import json

import pytest
from harvest_support import harvest_config, tiny_context_bundle
from test_store import s3_server  # noqa: F401  (the moto fixture, reused)

pytestmark = pytest.mark.slow

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256}


@pytest.fixture(scope="module")
def s3_harvest(s3_server, sample_path, speech_corpus, tmp_path_factory):  # noqa: F811
    from sentsim.corpus_job import build_corpus
    from sentsim.harvest.job import harvest
    from sentsim.retrieval import IndexConfig, build_index
    from storage import verify_store

    corpus = "s3://sentsim/chain/corpus"
    m = build_corpus([str(sample_path)], corpus, overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    assert m["complete"] and verify_store(corpus) == []
    tmp = tmp_path_factory.mktemp("s3_chain")
    index = tmp / "index"
    build_index(corpus, str(index), IndexConfig())  # the index reads its corpus from S3
    # the tiny context model's tokenizer is trained on the same texts (the local build of the sample)
    bundle = tiny_context_bundle(speech_corpus, tmp / "ctx")
    out = "s3://sentsim/chain/harvest"
    harvest(harvest_config(corpus, index, bundle, out), executor="inline", quiet=True)
    assert verify_store(out) == []
    return out, tmp


def test_chain_on_s3_reads_back(s3_harvest):
    from sentsim.surrogate.data import inspect_harvest
    from storage import RunReader

    out, _ = s3_harvest
    r = RunReader(out)
    assert r.is_complete() and r.progress()[0] == r.progress()[1]
    info = inspect_harvest(out)
    assert info.rows == r.rows("pairs") > 0 and all(f.startswith("sentsim/chain/harvest/pairs/") for f in info.files)
    assert r.side_table("rank_anchors") is not None


def test_surrogate_and_student_train_from_s3(s3_harvest, capsys):
    from sentsim.config import load_config
    from sentsim.students import StudentConfig, train_student
    from sentsim.surrogate import SurrogateConfig, train_surrogate
    from sentsim.surrogate.data import harvest_datasets, inspect_harvest

    out, tmp = s3_harvest
    # the surrogate's ray.data stream over the s3:// shards (what Ray Train consumes)
    import ray

    info = inspect_harvest(out)
    ds = harvest_datasets(info, eval_max_pairs=50)
    assert ds["train"].count() == info.scored["train"]
    ray.shutdown()
    cfg = SurrogateConfig.model_validate(dict(init="scratch", scratch=TINY, lr=1e-3, batch_size=8, max_seq_length=32,
                                              eval_every=2, max_steps=3, cpus_per_worker=0.5, shuffle_buffer=16,
                                              eval_max_pairs=20))
    summary = train_surrogate(cfg, data=out, backbone=_minilm(), out=str(tmp / "surrogate"))
    st = summary["stages"][0]
    # few rows: one epoch may end first
    assert 1 <= st["total_steps"] <= 3 and st["train_pairs"] == info.scored["train"]
    assert (tmp / "surrogate" / "model").is_dir() or __import__("os").path.isdir(st["model"])
    scfg = load_config(StudentConfig, None, ["batch_size=8", "max_steps=3", "log_every=1", "eval_every=1000",
                                             "rankencoder.check_sentences=2"], objective="rankencoder")
    s = train_student(scfg, data=out, backbone=_minilm(), out=str(tmp / "student"), executor="inline", verbose=False)
    assert 1 <= s["total_steps"] <= 3 and (tmp / "student" / "model").is_dir()  # few rows: an epoch may end first
    assert json.loads((tmp / "student" / "summary.json").read_text())["objective"] == "rankencoder"


def _minilm() -> str:
    from sentsim.rank.targets import default_base_encoder

    return default_base_encoder()


def test_one_writer_per_run_on_s3(s3_server, tmp_path):  # noqa: F811
    """The lease on S3 is a conditional PUT (If-None-Match: *), which the moto server honours with
    412: a second writer of the same run, here another process, is refused naming the holder."""
    import os
    import subprocess
    import sys

    from storage import ShardStore
    from storage.lease import LEASE

    uri = "s3://sentsim/lease/run"
    store = ShardStore(uri)
    import pyarrow as pa

    store.open_run("s", "fp", {}, [], {"t": pa.schema([("x", pa.int64())])}, planned_units=1)
    assert json.loads(store.fs.open_input_stream(f"sentsim/lease/run/{LEASE}").read())["pid"] == os.getpid()
    code = ("import pyarrow as pa; from storage import ShardStore; "
            f"ShardStore({uri!r}).open_run('s', 'fp', {{}}, [], {{'t': pa.schema([('x', pa.int64())])}}, "
            "planned_units=1, force_new=True)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                       env={**os.environ, **s3_server})
    assert r.returncode != 0 and f"being written by pid {os.getpid()}" in r.stderr
    assert store.read_manifest() is not None  # the refused --force-new deleted nothing
    store.release()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                       env={**os.environ, **s3_server})
    assert r.returncode == 0, r.stderr


def test_unreachable_object_store_is_one_line(tmp_path):
    """No S3 server at the configured endpoint: exit 2 and one line naming the settings, no traceback."""
    import os

    from conftest import free_port, sentsim_cli

    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    r = sentsim_cli("store", "verify", "s3://nobucket/run", env={**os.environ, **env}, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("sentsim: error:")]
    assert len(err) == 1 and "AWS_ENDPOINT_URL" in err[0]
