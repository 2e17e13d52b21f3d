"""The whole chain on s3:// (a local moto S3 server): corpus build, index build, harvest, store
verify, then a surrogate and a student trained straight from the s3:// harvest. Once through the
library, and once through the `sentsim` commands as a user types them (subprocesses), every run they
read or write on s3://: corpus, index, harvest, remix, rep cache, contexts, and the trainers reading
their corpus or harvest from there."""

from __future__ import annotations

import json
import os

import pytest
from conftest import sentsim_cli
from harvest_support import harvest_config, tiny_bert, tiny_context_bundle
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
    """`sentsim train surrogate` and `sentsim train student` with --data s3://... (as typed at a shell)."""
    from sentsim.surrogate.data import harvest_datasets, inspect_harvest

    out, tmp = s3_harvest
    # the surrogate's ray.data stream over the s3:// shards (what Ray Train consumes)
    import ray

    info = inspect_harvest(out)
    ds = harvest_datasets(info, eval_max_pairs=50)
    assert ds["train"].count() == info.scored["train"]
    ray.shutdown()
    sets = [f"scratch.{k}={v}" for k, v in TINY.items()] + [
        "lr=1e-3", "batch_size=8", "max_seq_length=32", "eval_every=2", "cpus_per_worker=0.5", "shuffle_buffer=16",
        "eval_max_pairs=20"]
    r = _cli("train", "surrogate", "--data", out, "--backbone", _minilm(), "--out", tmp / "surrogate", "--init",
             "scratch", "--max-steps", "3", *_sets(sets))
    summary = json.loads((tmp / "surrogate" / "summary.json").read_text())
    st = summary["stages"][0]
    # few rows: one epoch may end first
    assert 1 <= st["total_steps"] <= 3 and st["train_pairs"] == info.scored["train"], r.stdout
    assert (tmp / "surrogate" / "model" / "config.json").is_file()
    sets = ["batch_size=8", "log_every=1", "eval_every=1000", "rankencoder.check_sentences=2"]
    _cli("train", "student", "--objective", "rankencoder", "--data", out, "--backbone", tiny_bert(tmp / "bert"),
         "--out", tmp / "student", "--executor", "inline", "--max-steps", "3", *_sets(sets))
    s = json.loads((tmp / "student" / "summary.json").read_text())
    assert 1 <= s["total_steps"] <= 3 and (tmp / "student" / "model").is_dir()  # few rows: an epoch may end first
    assert s["objective"] == "rankencoder"


def _sets(pairs) -> list:
    return [x for p in pairs for x in ("--set", p)]


def _cli(*args, env: dict | None = None):
    """A `sentsim` command that must succeed; a local Ray of its own (its workers inherit the S3 settings)."""
    r = sentsim_cli(*args, env=env, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stdout[-2000:], r.stderr[-3000:])
    return r


# the harvest settings of harvest_support.harvest_config, as a user passes them
HARVEST_SETS = ["seed=3", "anchors.n=8", "anchors.per_unit=2", "partners.neighbours=1", "partners.same_doc=1",
                "partners.random=1", "partners.neighbour_chunks=8", "contexts.size=6", "contexts.retrieve_chunks=40",
                "rank.n_anchors=64", "scoring.batch_tokens=2048"]


@pytest.fixture(scope="module")
def cli_chain(s3_harvest, sample_path):
    """corpus build, index build (both on s3://), harvest, remix: commands in subprocesses."""
    _, tmp = s3_harvest
    root = "s3://sentsim/cli"
    corpus, index, harvest, remix = (f"{root}/{n}" for n in ("corpus", "index", "harvest", "remix"))
    _cli("corpus", "build", sample_path, "--out", corpus, "--executor", "inline", "--set", "docs_per_unit=4")
    _cli("index", "build", "--corpus", corpus, "--out", index)  # the settings of the library chain's index
    r = _cli("harvest", "--corpus", corpus, "--index", index, "--context-models", tmp / "ctx", "--out", harvest,
             "--executor", "inline", *_sets(HARVEST_SETS))
    assert f"in 4/4 units -> {harvest}" in r.stdout and "score by split: train n=" in r.stdout, r.stdout
    _cli("remix", harvest, "--out", remix, "--lambda-fwd", "0.5")
    return {"corpus": corpus, "index": index, "harvest": harvest, "remix": remix, "tmp": tmp}


def test_the_chain_through_the_commands_on_s3(cli_chain, s3_harvest):
    """The harvest the commands wrote from an s3:// corpus and an s3:// index is the library's, row for row
    (the same fingerprint: input paths are not part of it); verify and the readers see it whole."""
    from storage import RunReader

    for run in ("corpus", "harvest", "remix"):
        r = _cli("store", "verify", cli_chain[run])
        assert r.stdout.strip() == f"{cli_chain[run]}: OK"
    ours, theirs = RunReader(cli_chain["harvest"]), RunReader(s3_harvest[0])
    assert ours.is_complete() and ours.fingerprint == theirs.fingerprint
    cols = ["pair_id", "score", "split"]
    assert ours.read_table("pairs", cols).sort_by("pair_id").equals(theirs.read_table("pairs", cols).sort_by("pair_id"))
    remix = RunReader(cli_chain["remix"])
    assert remix.is_complete() and remix.rows("pairs") == ours.rows("pairs")
    # the index is on s3:// too, written in one build folder and committed by index.json
    import pyarrow.fs as pafs

    from sentsim.retrieval.base import check_index
    from storage import fs as sfs

    man = check_index(cli_chain["index"], corpus=cli_chain["corpus"])
    fs, root = sfs.resolve(cli_chain["index"])
    names = {i.base_name for i in fs.get_file_info(pafs.FileSelector(root))}
    assert names == {"index.json", man["vocab"].split("/")[0]}


def test_rep_cache_and_contexts_on_s3_through_the_commands(cli_chain):
    """`sentsim cache build` and `sentsim contexts`: corpus, index, cache and output all on s3://."""
    from storage import RunReader

    tmp = cli_chain["tmp"]
    disc = _tiny_discriminator(cli_chain["corpus"], tmp / "disc")
    cache, contexts = "s3://sentsim/cli/cache", "s3://sentsim/cli/contexts"
    _cli("cache", "build", "--corpus", cli_chain["corpus"], "--discriminator", disc, "--out", cache,
         "--executor", "inline")
    r = _cli("contexts", "--corpus", cli_chain["corpus"], "--index", cli_chain["index"], "--discriminator", disc,
             "--out", contexts, "--executor", "inline", "--set", "sample=16", "--set", f"contexts.rep_cache={cache}")
    assert "contexts: 16 sentences screened" in r.stdout
    assert RunReader(cache).is_complete() and RunReader(contexts).is_complete()
    assert RunReader(cache).rows("reps") == RunReader(cli_chain["corpus"]).rows("sentences")


def test_a_cluster_whose_nodes_lack_the_s3_settings_is_one_line(cli_chain, s3_server, sample_path,  # noqa: F811
                                                                  monkeypatch):
    """docs/cluster.md followed with the S3 settings in the client's environment only: the head was started
    without them, so the harvest's actors cannot open the s3:// corpus. Ray hands that error back as the text
    of an ActorDiedError; the command still says it in one line, exit 2, naming every node's environment. A
    misspelt bucket is refused, and not created."""
    import boto3
    from conftest import start_head, stop_head

    for key in s3_server:
        monkeypatch.delenv(key)
    head = start_head(cli_chain["tmp"] / "head_without_s3")
    try:
        env = {**head["env"], **s3_server}
        r = sentsim_cli("harvest", "--address", head["gcs"], "--corpus", cli_chain["corpus"], "--index",
                        cli_chain["index"], "--context-models", cli_chain["tmp"] / "ctx", "--out",
                        "s3://sentsim/cli/attached", *_sets(HARVEST_SETS), env=env, timeout=600)
    finally:
        stop_head(head)
    # the cluster's own log lines may still arrive after it (e.g. its GCS on the actors it kills)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("sentsim: error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1, r.stderr[-3000:]
    assert errors[0].startswith("sentsim: error: cannot use the object store (") and "every node" in errors[0], errors
    for args in (("index", "build", "--corpus", cli_chain["corpus"], "--out", "s3://sentsimm/index"),
                 ("corpus", "build", sample_path, "--out", "s3://sentsimm/corpus", "--executor", "inline")):
        r = sentsim_cli(*args, env={**os.environ, **s3_server}, timeout=300)
        assert r.returncode == 2 and r.stderr.strip() == (
            "sentsim: error: cannot use the object store: the bucket sentsimm does not exist; sentsim makes no "
            "bucket (a misspelt name would otherwise get one): create it, or correct the path"), r.stderr[-2000:]
    client = boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"], aws_access_key_id="test",
                          aws_secret_access_key="test", region_name="us-east-1")
    assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["sentsim"]


def _tiny_discriminator(corpus: str, out) -> str:
    """`sentsim train discriminator --corpus s3://...` (Ray Train, two steps): refused before issue 37
    with "no such directory"."""
    sets = ["model.embed_dim=16", "model.hidden=16", "model.head_dim=16", "model.max_tokens=16",
            "model.embed_init=random", "train.max_steps=2", "train.batch_size=8", "train.max_heldout_windows=32"]
    r = _cli("train", "discriminator", "--corpus", corpus, "--out", out, "--num-workers", "1", *_sets(sets))
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 2
    return str(out)


def test_train_context_reads_an_s3_corpus(cli_chain):
    sets = ["model.vocab_size=400", "model.d_model=32", "model.encoder_layers=1", "model.decoder_layers=1",
            "model.attention_heads=2", "model.ffn_dim=64", "model.max_source_tokens=64", "model.max_target_tokens=32",
            "max_steps=2", "eval_every=2", "warmup_steps=1", "batch_tokens=512", "heldout_percent=20",
            "heldout_windows=8", "tokenizer_sentences=2000", "shuffle_buffer=64", "torch_threads=1"]
    out = cli_chain["tmp"] / "ctx_from_s3"
    r = _cli("train", "context", "--corpus", cli_chain["corpus"], "--out", out, "--direction", "fwd",
             "--num-workers", "1", *_sets(sets))
    assert "model fwd:" in r.stdout and "2 steps" in r.stdout
    assert (out / "models/fwd/model.safetensors").is_file()


def test_an_output_over_an_s3_input_is_refused(cli_chain):
    """The audit's `harvest --corpus X --out X --force-new`, on s3://: refused before anything is deleted,
    as is an --out inside the input's prefix; the corpus still verifies."""
    from storage import verify_store

    corpus = cli_chain["corpus"]
    for out in (corpus, corpus + "/", f"{corpus}/harvest"):
        r = sentsim_cli("harvest", "--corpus", corpus, "--index", cli_chain["index"], "--context-models",
                        cli_chain["tmp"] / "ctx", "--out", out, "--force-new", timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "the input --corpus" in lines[0], r.stderr[-2000:]
    r = sentsim_cli("remix", cli_chain["harvest"], "--out", cli_chain["harvest"], "--force-new", timeout=300)
    assert r.returncode == 2 and "is the input HARVEST" in r.stderr
    assert verify_store(corpus) == [] and verify_store(cli_chain["harvest"]) == []


def test_s3_without_credentials_is_one_line_and_writes_nothing(s3_server, sample_path, tmp_path):  # noqa: F811
    """No AWS keys anywhere (the lease's boto3 raises botocore's NoCredentialsError): exit 2, one line that
    names the settings, no traceback, and nothing written; with the keys the same command runs."""
    import boto3

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=s3_server["AWS_ENDPOINT_URL"], AWS_DEFAULT_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"))
    import shutil
    import subprocess

    exe = shutil.which("sentsim")
    cmd = [exe, "corpus", "build", str(sample_path), "--out", "s3://sentsim/nocreds/corpus", "--executor", "inline"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    assert "credentials" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]
    listed = boto3.client("s3").list_objects_v2(Bucket="sentsim", Prefix="nocreds/")
    assert listed.get("KeyCount", 0) == 0
    r = subprocess.run(cmd, capture_output=True, text=True, env={**env, **s3_server}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
