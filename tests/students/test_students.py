"""Student encoders trained on a real (small) harvest of the sample corpus: each objective's loss
falls over a short CPU run and the saved student reloads with sentence-transformers; bad inputs fail
with one clear line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import error_line, sentsim_cli
from harvest_support import build_index_for, harvest_config, reseal, tiny_bert, tiny_context_bundle
from run_support import rewrite_manifest, without_ray

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harvest_dir(speech_corpus, tmp_path_factory):
    """A real harvest: 8 anchors, their partners, contexts scored by a tiny context model, rank codes
    of every sentence over 64 anchors under all-MiniLM-L6-v2 (E1)."""
    from sentsim.harvest.job import harvest

    root = tmp_path_factory.mktemp("student_harvest")
    cfg = harvest_config(speech_corpus, build_index_for(speech_corpus, root / "index"),
                         tiny_context_bundle(speech_corpus, root / "ctx"), root / "run",
                         anchors={"n": 8, "per_unit": 4})
    harvest(cfg, executor="inline", quiet=True)
    return root / "run"


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory):
    """A 2-layer BERT from config (random weights) with all-MiniLM-L6-v2's tokenizer files."""
    return tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _train(objective, harvest_dir, backbone, out, executor="inline", **over):
    from sentsim.config import load_config
    from sentsim.students import StudentConfig, train_student

    base = {"batch_size": 8, "epochs": 4, "lr": 1e-3, "log_every": 1, "eval_every": 1000, "max_seq_length": 32}
    base.update(over)
    sets = [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in base.items()]
    cfg = load_config(StudentConfig, None, sets, objective=objective)
    return train_student(cfg, data=str(harvest_dir), backbone=str(backbone), out=str(out), executor=executor,
                         verbose=False)


def _falls(summary, k=3, by=0.1):
    """Mean of the last k step losses below the first k's by a fraction `by` of the first."""
    losses = [h["train_loss"] for h in summary["history"] if h.get("train_loss") is not None]
    assert len(losses) >= 2 * k, losses
    first, last = np.mean(losses[:k]), np.mean(losses[-k:])
    assert last < (1 - by) * first, losses
    return first, last


def _reload(model_dir, dim):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    v = st.encode(["A man is playing a flute.", "Congress passed the bill."])
    assert v.shape == (2, dim) and np.isfinite(v).all()
    return st


def _tiny_sts_task():
    from sentsim.evaluation.datasets import StsSet, StsTask

    s1 = ["A man is playing a flute.", "The senate passed the law.", "A dog runs.", "Prices rose sharply."]
    s2 = ["A man plays the flute.", "Congress approved the bill.", "The cat sleeps.", "It is raining."]
    return StsTask("tiny", [StsSet("tiny", s1, s2, np.array([5.0, 4.0, 1.0, 0.0]))])


def test_rankencoder_trains_reloads_and_scores_with_eq7(harvest_dir, tiny_backbone, tmp_path, capsys):
    from sentsim.evaluation import evaluate
    from sentsim.students.rankencoder import RankEncoderScorer

    s = _train("rankencoder", harvest_dir, tiny_backbone, tmp_path / "re", rankencoder={"score_weight": 0.5})
    # the tiny teacher's scores all sit at about 1: the score term's L2 says what that means, before training
    assert "warning: the score loss's harvested scores sit in a narrow band" in capsys.readouterr().out
    _falls(s)
    assert s["counts"]["sentences"] >= 16 and s["counts"]["score_pairs"] > 0
    steps = [h for h in s["history"] if "pairs_kept" in h]
    # every step either kept pairs or was counted as l_cl-only
    assert s["empty_filter_batches"] == sum(1 for h in steps if h["pairs_kept"] == 0)
    assert any(h["l_r"] is not None for h in steps) and all("l_score" in h for h in steps)
    _reload(s["model"], 64)
    meta = json.loads((tmp_path / "re" / "model" / "rank_anchors.json").read_text())
    assert len(meta["anchors"]) == 64 and meta["lambda_inf"] == 0.1
    # the inference rule's file is part of the folder the export swaps in whole, and of its file list
    listed = json.loads((tmp_path / "re" / "model" / "sentsim_model.json").read_text())["files"]
    assert listed["rank_anchors.json"] == (tmp_path / "re" / "model" / "rank_anchors.json").stat().st_size
    scorer = RankEncoderScorer(s["model"])
    rep = evaluate(scorer, [_tiny_sts_task()])
    assert rep.tasks[0].scored == 4 and rep.scorer["kind"] == "rankencoder"


def test_rankencoder_refuses_rank_vectors_of_another_anchor_set(harvest_dir, tiny_backbone, tmp_path):
    from sentsim.errors import UsageError

    bad = tmp_path / "bad"
    shutil.copytree(harvest_dir, bad)
    for f in sorted((bad / "sentences").glob("*.parquet")):  # ranks of a reversed anchor order
        t = pq.read_table(f)
        codes = [None if c is None else [63 - x for x in c] for c in t["rank_codes"].to_pylist()]
        t = t.set_column(t.schema.get_field_index("rank_codes"), "rank_codes", pa.array(codes, pa.list_(pa.uint32())))
        pq.write_table(t, f)
    reseal(bad)  # a run written so, not one edited since: the readers would refuse that first
    with pytest.raises(UsageError, match="another anchor set"):
        _train("rankencoder", bad, tiny_backbone, tmp_path / "o1")
    m = json.loads((harvest_dir / "manifest.json").read_text())
    m["config"]["rank"]["n_anchors"] = 32
    shutil.rmtree(bad)
    shutil.copytree(harvest_dir, bad)
    rewrite_manifest(bad, m)  # as a harvest with that setting wrote it
    with pytest.raises(UsageError, match="64..64 entries, but the harvest's anchor set .* has 32"):
        _train("rankencoder", bad, tiny_backbone, tmp_path / "o2")


def test_rankencoder_trains_on_each_sentence_once_through_the_command(harvest_dir, tiny_backbone, tmp_path):
    """A harvest writes a sentence's row once for every unit it is paired in; the student reads one of each."""
    run = tmp_path / "run"
    shutil.copytree(harvest_dir, run)
    first, second = sorted((run / "sentences").glob("*.parquet"))[:2]
    repeated = pq.read_table(first).slice(0, 3)  # three sentences paired in the second unit too
    pq.write_table(pa.concat_tables([pq.read_table(second), repeated]), second)
    reseal(run)
    ids = pa.concat_tables([pq.read_table(f) for f in sorted((run / "sentences").glob("*.parquet"))])["sentence_id"]
    rows, distinct = len(ids), len(set(ids.to_pylist()))
    assert rows - distinct >= 3
    # inline on a machine without Ray, --num-workers 2 notwithstanding: one process is the one worker
    r = sentsim_cli("train", "student", "--objective", "rankencoder", "--data", run, "--out", tmp_path / "st",
                    "--backbone", tiny_backbone, "--executor", "inline", "--max-steps", "1", "--num-workers", "2",
                    "--set", "batch_size=8", "--set", "max_seq_length=32", env=without_ray(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"note: training on {distinct} of {rows} sentence rows ({rows - distinct} repeats of a sentence "
            "paired in several units)") in r.stdout
    summary = json.loads((tmp_path / "st" / "summary.json").read_text())
    assert summary["rows"] == distinct and summary["counts"]["sentences"] == rows
    assert not (tmp_path / "st" / "ray").exists() and (tmp_path / "st" / "checkpoint").is_dir()
    assert "| num_workers | `1` |" in (tmp_path / "st" / "model" / "README.md").read_text()


def test_an_encoder_without_its_tokenizer_is_refused_as_every_objectives_backbone_and_as_the_base_encoder(
        harvest_dir, tiny_backbone, tmp_path, capsys):
    """A folder of config and weights alone loads in transformers around an empty vocabulary (all [UNK]): each
    objective's --backbone, and rankencoder.base_encoder, refuse it in one line before --out is made."""
    from harvest_support import cli_in_process

    notok = tmp_path / "bb_notok"
    notok.mkdir()
    for f in ("config.json", "model.safetensors"):
        (notok / f).write_bytes((tiny_backbone / f).read_bytes())
    base = ["train", "student", "--data", harvest_dir, "--executor", "inline", "--max-steps", "1"]
    triples = tmp_path / "t.jsonl"
    triples.write_text('{"s_i": "a b", "relation": "entailment", "s_j": "c d"}\n')
    for objective in ("rankencoder", "rse", "paser"):
        extra = ["--triples", triples] if objective == "rse" else []
        out = tmp_path / f"o-{objective}"
        r = cli_in_process(capsys, *base, "--objective", objective, "--backbone", notok, "--out", out, *extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert f"--backbone {notok}: no tokenizer (tokenizer.json or a vocabulary file) is there" in \
            error_line(r.stderr)
        assert not out.exists()
    out = tmp_path / "o-base"
    r = cli_in_process(capsys, *base, "--objective", "rankencoder", "--backbone", tiny_backbone, "--out", out,
                       "--set", f"rankencoder.base_encoder={notok}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"rankencoder.base_encoder {notok}: no tokenizer" in error_line(r.stderr)
    assert not out.exists()


def test_eval_sts_over_part_of_the_suite_says_so_beside_its_average(harvest_dir, tiny_backbone, tmp_path):
    year = tmp_path / "sts" / "STS2013-en-test"  # one task of the seven
    year.mkdir(parents=True)
    (year / "STS.input.a.txt").write_text("A man plays.\tA man is playing.\nA dog runs.\tPrices rose.\n"
                                          "It rains.\tIt is raining.\n")
    (year / "STS.gs.a.txt").write_text("4.5\n0.2\n4.8\n")
    r = sentsim_cli("train", "student", "--objective", "rankencoder", "--data", harvest_dir, "--out", tmp_path / "st",
                    "--backbone", tiny_backbone, "--executor", "inline", "--max-steps", "1",
                    "--set", "batch_size=8", "--set", "max_seq_length=32", "--eval-sts", tmp_path / "sts")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"note: --eval-sts {tmp_path / 'sts'}: averages over 1 of the suite's 7 tasks (STS12, STS14, STS15, "
            "STS16, STSb, SICK-R not found)") in r.stdout
    assert "STS suite average: cosine" in r.stdout


def test_triples_with_another_objective_is_refused_not_ignored(tmp_path):
    triples = tmp_path / "t.jsonl"
    triples.write_text('{"s_i": "a", "relation": "entailment", "s_j": "b"}\n')
    r = sentsim_cli("train", "student", "--triples", triples, "--data", tmp_path / "h", "--out", tmp_path / "o")
    assert r.returncode == 2, r.stderr[-3000:]
    assert error_line(r.stderr) == ("sentsim: error: --triples is read by --objective rse only, and this run's "
                                    "objective is rankencoder; add --objective rse, or leave --triples out")
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_rse_trains_with_all_relation_sources_and_scores_relationally(harvest_dir, tiny_backbone, tmp_path):
    from sentsim.evaluation import evaluate
    from sentsim.students.rse import RelationalScorer

    triples = tmp_path / "nli.jsonl"
    rows = [{"s_i": f"A person number {i} is walking outside.", "relation": "entailment",
             "s_j": f"Person {i} walks.", "hard_negative": f"Person {i} is sitting."} for i in range(12)]
    triples.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    s = _train("rse", harvest_dir, tiny_backbone, tmp_path / "rse",
               rse={"triples": str(triples), "grad_cache_chunk": 12,
                    "inference_weights": {"entailment": 1.0, "same-sent": 0.5}})
    _falls(s)
    per = s["counts"]["per_relation"]
    assert set(per) == {"context-similar", "same-sent", "entailment"} and per["entailment"] == 12
    _reload(s["model"], 64)
    rel = json.loads((tmp_path / "rse" / "model" / "relations.json").read_text())
    assert rel["relations"] == ["context-similar", "same-sent", "entailment"]
    # learned at lr 1e-2
    assert np.asarray(rel["vectors"]).shape == (3, 64) and np.abs(np.asarray(rel["vectors"])).max() > 0.05
    mixed = evaluate(RelationalScorer(s["model"]), [_tiny_sts_task()])
    assert mixed.scorer["pooling"].endswith("{'entailment': 1.0, 'same-sent': 0.5}")
    one = RelationalScorer(s["model"], relation="same-sent")
    a = one.score_pairs(["a b"], ["c d"])
    assert a.shape == (1,) and -1 <= a[0] <= 1


def test_rse_cuts_the_harvest_by_rank_through_the_command(harvest_dir, tiny_backbone, tmp_path):
    """`rse.positive_top_fraction` and `rse.hard_negative_bottom_fraction` through `sentsim train student`:
    the notes count what each cut took and left, by its setting's name."""
    import re

    r = sentsim_cli("train", "student", "--objective", "rse", "--executor", "inline", "--data", harvest_dir,
                    "--backbone", tiny_backbone, "--out", tmp_path / "o", "--max-steps", "1",
                    "--set", "batch_size=8", "--set", "rse.positive_top_fraction=0.5",
                    "--set", "rse.hard_negative_bottom_fraction=0.25")
    assert r.returncode == 0, r.stderr[-2000:]
    took = re.search(r"note: training on (\d+) of \d+ pairs as context-similar triples \(.*?(\d+) train outside "
                     r"the top rse\.positive_top_fraction 0\.5", r.stdout)
    hard = re.search(r"note: (\d+) train pairs in the bottom rse\.hard_negative_bottom_fraction 0\.25 give", r.stdout)
    assert took and hard, r.stdout
    top, rest = int(took[1]), int(took[2])
    n = top + rest  # the train split's scored pairs
    assert n >= 8 and top == -(-n // 2) and int(hard[1]) == n // 4, r.stdout


def test_rse_rejects_unknown_relations_in_the_triples_file(harvest_dir, tiny_backbone, tmp_path):
    triples = tmp_path / "t.jsonl"
    triples.write_text('{"s_i": "a", "relation": "entailment", "s_j": "b"}\n'
                       '{"s_i": "a", "relation": "nope", "s_j": "b"}\n')
    r = sentsim_cli("train", "student", "--objective", "rse", "--executor", "inline", "--data", harvest_dir,
                    "--backbone", tiny_backbone, "--out", tmp_path / "o", "--triples", triples,
                    "--set", "rse.relations=[entailment]")
    assert r.returncode == 2, r.stderr
    assert "t.jsonl:2: unknown relation 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_paser_trains_and_saves_the_encoder_without_its_decoder(harvest_dir, tiny_backbone, tmp_path):
    from safetensors import safe_open

    s = _train("paser", harvest_dir, tiny_backbone, tmp_path / "paser", epochs=5,
               paser={"decoder_layers": 1, "decoder_lr": 3e-3, "random_deletion": 0.1, "token_reordering": 0.1,
                      "synonym_replacement": 0.1})
    _falls(s, by=0.04)  # ln(30522) = 10.3 for the MLM term, that for each target token summed in Eq. 3
    assert s["skips"]["no_phrase"]["count"] >= 0 and s["counts"]["sentences"] >= 16
    hist = [h for h in s["history"] if "l_generative" in h]
    assert hist and all("l_mlm" in h for h in hist)
    _reload(s["model"], 64)
    with safe_open(str(tmp_path / "paser" / "model" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not any("decoder" in k or "cls." in k or "positions" in k for k in keys)


def test_a_paser_run_from_before_the_joint_signal_norm_is_refused_by_name_and_resumes_with_it(
        harvest_dir, tiny_backbone, tmp_path):
    """A PaSeR run built with a norm per memory vector and a per-token mean generative loss (as every run was
    before `paser.signal_norm` and `paser.generative_reduction`) keeps its fingerprint under those values;
    under today's defaults the same --out is refused in one line naming both keys, and setting them back
    resumes it from its checkpoint."""
    from conftest import error_line

    args = ["train", "student", "--objective", "paser", "--executor", "inline", "--data", harvest_dir,
            "--backbone", tiny_backbone, "--out", tmp_path / "p", "--set", "batch_size=8", "--set", "eval_every=2",
            "--set", "paser.decoder_layers=1"]
    old = ["--set", "paser.signal_norm=per_vector", "--set", "paser.generative_reduction=mean"]
    r = sentsim_cli(*args, *old, "--max-steps", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    r = sentsim_cli(*args, "--max-steps", "4")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert "holds a run with other settings" in line, line
    assert "config.paser.signal_norm: 'per_vector' -> 'joint'" in line, line
    assert "config.paser.generative_reduction: 'mean' -> 'sum'" in line, line
    assert "config.max_steps" not in line  # a resumable key is not named as the reason
    r = sentsim_cli(*args, *old, "--max-steps", "4")
    assert r.returncode == 0 and "resuming at step 2, 4 steps" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])


def test_attention_heads_that_do_not_divide_the_width_are_refused_before_the_run_goes_ahead(
        harvest_dir, tiny_backbone, tmp_path, capsys):
    """PaSeR's decoder_heads must divide the encoder's width (the backbone's hidden_size, or scratch.hidden_size),
    and a scratch encoder's num_heads its hidden_size, for every objective and the surrogate: each is refused in
    one line (exit 2) naming the keys and the widths, before a model is built, where it was a ValueError when a
    worker built the model after the run went ahead; --out holds no run record."""
    from harvest_support import cli_in_process

    paser = ["train", "student", "--objective", "paser", "--executor", "inline", "--data", harvest_dir,
             "--backbone", tiny_backbone, "--set", "batch_size=8", "--set", "paser.decoder_layers=1"]
    for extra, line in (
            (["--set", "paser.decoder_heads=5"],
             f"paser.decoder_heads 5 must divide the encoder width 64 (the hidden_size of --backbone {tiny_backbone}); "
             "set paser.decoder_heads to a divisor of 64"),
            (["--set", "init=scratch", "--set", "scratch.hidden_size=48", "--set", "scratch.num_heads=4",
              "--set", "paser.decoder_heads=32"],
             "paser.decoder_heads 32 must divide the encoder width 48 (scratch.hidden_size); set paser.decoder_heads "
             "to a divisor of 48")):
        out = tmp_path / f"paser{len(extra)}"
        r = cli_in_process(capsys, *paser, "--out", out, *extra)
        assert r.returncode == 2 and error_line(r.stderr) == f"sentsim: error: {line}", r.stderr[-2000:]
        assert not (out / "run.json").exists() and not (out / "checkpoint").exists()
    scratch = ["--set", "init=scratch", "--set", "scratch.num_heads=3"]
    for command in (["student", "--objective", "rankencoder"], ["student", "--objective", "rse"],
                    ["student", "--objective", "paser"], ["surrogate"]):
        out = tmp_path / command[-1]
        r = cli_in_process(capsys, "train", *command, "--executor", "inline", "--data", harvest_dir,
                           "--backbone", tiny_backbone, "--out", out, *scratch)
        assert r.returncode == 2 and error_line(r.stderr) == (
            "sentsim: error: invalid config: scratch.num_heads 3 must divide scratch.hidden_size 256 (each attention "
            "head takes an equal share of the width)"), r.stderr[-2000:]
        assert not (out / "run.json").exists()


def test_a_cls_pooled_student_is_trained_exported_and_evaluated_on_cls(harvest_dir, tiny_backbone, tmp_path):
    """`--set pooling=cls` (000 §4.1, 002 §4.2): the export's Pooling module takes [CLS], so what
    sentence-transformers encodes is the encoder's first token, its card and `eval sts` say so."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    out = tmp_path / "cls"
    r = sentsim_cli("train", "student", "--objective", "paser", "--executor", "inline", "--data", harvest_dir,
                    "--backbone", tiny_backbone, "--out", out, "--max-steps", "2", "--set", "batch_size=8",
                    "--set", "pooling=cls", "--set", "paser.decoder_layers=1")
    assert r.returncode == 0, r.stderr[-2000:]
    model = out / "model"
    text = ["A man is playing a flute.", "Congress passed the bill."]
    got = SentenceTransformer(str(model), device="cpu").encode(text, convert_to_tensor=True)
    tok, enc = AutoTokenizer.from_pretrained(str(model)), AutoModel.from_pretrained(str(model)).eval()
    with torch.no_grad():
        want = enc(**tok(text, padding=True, return_tensors="pt")).last_hidden_state[:, 0]
    assert torch.allclose(got, want, atol=1e-5)
    assert "cosine of its [CLS] vectors" in (model / "README.md").read_text()
    year = tmp_path / "sts" / "STS2013-en-test"  # a SentEval year of one set
    year.mkdir(parents=True)
    (year / "STS.input.a.txt").write_text("A man plays.\tA man is playing.\nA dog runs.\tPrices rose.\n"
                                          "It rains.\tIt is raining.\n")
    (year / "STS.gs.a.txt").write_text("4.5\n0.2\n4.8\n")
    r = sentsim_cli("eval", "sts", "--model", model, "--data", tmp_path / "sts", "--tasks", "STS13")
    assert r.returncode == 0 and "pooling: cls" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])


def test_a_kill_while_a_student_writes_its_reports_leaves_the_last_ones_whole(harvest_dir, tiny_backbone, tmp_path,
                                                                              monkeypatch):
    """summary.json, eval.json, eval.md and the curves' history are renamed into place whole: a kill while a
    resumed run writes its summary leaves the last run's, not half a new one, and no temporary file in sight."""
    from run_support import Killed, killed_before_renaming

    from sentsim.config import load_config
    from sentsim.students import StudentConfig, train_student

    year = tmp_path / "sts" / "STS2013-en-test"  # a SentEval year of one set
    year.mkdir(parents=True)
    (year / "STS.input.a.txt").write_text("A man plays.\tA man is playing.\nA dog runs.\tPrices rose.\n"
                                          "It rains.\tIt is raining.\n")
    (year / "STS.gs.a.txt").write_text("4.5\n0.2\n4.8\n")
    out = tmp_path / "stu"

    def train(steps: int) -> dict:
        cfg = load_config(StudentConfig, None, ["batch_size=8", "max_seq_length=16", "eval_every=1000",
                                                f"max_steps={steps}"], objective="rankencoder")
        return train_student(cfg, data=str(harvest_dir), backbone=str(tiny_backbone), out=str(out),
                             executor="inline", eval_sts=str(tmp_path / "sts"), verbose=False)

    train(2)
    summary = (out / "summary.json").read_bytes()
    renamed = killed_before_renaming(monkeypatch, "summary.json")
    with pytest.raises(Killed):
        train(3)
    assert (out / "summary.json").read_bytes() == summary and json.loads(summary)["history"][-1]["step"] == 2
    assert {str(out / n) for n in ("eval.json", "eval.md")} <= set(renamed)
    assert [p for p in renamed if p.startswith(str(out / "curves")) and p.endswith(".json")]
    assert not [p for p in out.rglob(".tmp-*")]


# ---------------------------------------------------------------- the Ray Train path and resume


def _checkpoint_with_last_step(root):
    """The checkpoint folder under a Ray Train storage path whose history ends at the latest step."""
    found = [(json.loads((h.parent / "history.json").read_text())[-1]["step"], h.parent)
             for h in root.rglob("state.pt")]
    return max(found)[1]


def test_rankencoder_on_ray_train_exports_what_it_trained(harvest_dir, tiny_backbone, tmp_path, ray_local,
                                                          one_torch_thread):
    """TorchTrainer on the module's local Ray, two DDP workers at half a CPU each: the loss falls, and the
    exported folder reloads with sentence-transformers and embeds as the trained model does. (Resume on
    Ray Train, with another worker count, is the shared loop's and is tested with the surrogate.)"""
    import torch

    from sentsim.config import load_config
    from sentsim.students import StudentConfig
    from sentsim.students.train import build_objective

    out = tmp_path / "ray_re"
    s = _train("rankencoder", harvest_dir, tiny_backbone, out, executor="ray", epochs=20, max_steps=12, eval_every=4,
               num_workers=2, cpus_per_worker=0.5)
    assert [h["step"] for h in s["history"]] == list(range(13))
    assert (out / "ray" / "rankencoder").is_dir() and not (out / "checkpoint").exists()
    _falls(s)
    assert (out / "curves" / "rankencoder.png").stat().st_size > 1000

    # the trained weights as the objective holds them in memory, against the exported folder
    sents = ["A man is playing a flute.", "Congress passed the bill.", "The economy grew last year."]
    cfg = load_config(StudentConfig, None, ["max_seq_length=32"], objective="rankencoder")
    obj, _ = build_objective(cfg, str(_checkpoint_with_last_step(out / "ray") / "model"), "pretrained", {})
    obj.eval()
    with torch.no_grad():
        mine = obj.embed(sents, torch.device("cpu")).numpy()
    st = _reload(s["model"], 64)
    np.testing.assert_allclose(st.encode(sents, convert_to_numpy=True), mine, atol=1e-5)
    assert json.loads((out / "model" / "rank_anchors.json").read_text())["lambda_inf"] == 0.1

    # the executor is no setting of the run, and the inline one does not read Ray Train's checkpoints: asked
    # inline with the same settings and budget, the finished model is finished (nothing trained, its bytes kept);
    # a smaller budget is refused as on Ray, a larger one naming the executor that continues it
    from sentsim.errors import UsageError
    from sentsim.identity import checkpoint_hash

    def model_bytes() -> tuple:
        files = {str(f.relative_to(out)): f.read_bytes() for f in (out / "model").rglob("*") if f.is_file()}
        return checkpoint_hash(str(out / "model")), files

    before = model_bytes()
    ray_run = dict(epochs=20, eval_every=4, num_workers=2, cpus_per_worker=0.5)
    again = _train("rankencoder", harvest_dir, tiny_backbone, out, executor="inline", max_steps=12, **ray_run)
    assert again["history"] == s["history"] and model_bytes() == before
    for steps, said in ((6, "is at step 12, past the 6 steps this run plans"),
                        (20, "at step 12 on --executor ray, which --executor inline does not read")):
        with pytest.raises(UsageError) as refused:
            _train("rankencoder", harvest_dir, tiny_backbone, out, executor="inline", max_steps=steps, **ray_run)
        line = str(refused.value)
        assert said in line and "--executor ray" in line and "--force-new" in line and "\n" not in line, line
    assert model_bytes() == before and not (out / "checkpoint").exists()


def test_ray_rows_come_in_a_seeded_order_not_the_harvests(ray_local):
    """What the Ray path hands Ray Train: every row once, in an order the seed fixes, not anchor by
    anchor as the harvest wrote them (Ray's own shuffle only mixes a few batches)."""
    import pyarrow as pa

    from sentsim.students.train import seeded_ray_dataset

    table = pa.table({"row": list(range(500)), "s1": [f"sentence {i}" for i in range(500)]})

    def rows(seed):
        return [r["row"] for r in seeded_ray_dataset(table, seed).iter_rows()]

    first = rows(0)
    assert sorted(first) == list(range(500)) and first == rows(0)
    assert first != list(range(500)) and first != rows(1)
    assert np.mean(np.diff(first) == 1) < 0.05  # no long runs of harvest order left


def test_killed_inline_run_resumes_from_its_checkpoint(harvest_dir, tiny_backbone, tmp_path):
    """The Ray job file run as a process and killed (SIGKILL) mid-run; the same command with the same
    --out picks up at the checkpoint's step and its history continues unbroken."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    from sentsim.training.loop import inline_checkpoint

    out = tmp_path / "killed"
    cmd = [sys.executable, str(ROOT / "jobs" / "train_student.py"), "--objective", "rankencoder",
           "--executor", "inline", "--data", str(harvest_dir), "--backbone", str(tiny_backbone), "--out", str(out),
           "--set", "batch_size=8", "--set", "lr=1e-3", "--set", "log_every=1", "--set", "eval_every=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd + ["--epochs", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    def saved_step():
        try:  # the loop may be swapping the checkpoint folder in just now
            return json.loads((inline_checkpoint(out) / "history.json").read_text())[-1]["step"]
        except (TypeError, OSError, ValueError):
            return -1

    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None and saved_step() < 4:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]  # killed mid-run, not finished
    ck = inline_checkpoint(out)
    saved = json.loads((ck / "history.json").read_text())
    at = saved[-1]["step"]
    assert at >= 4 and at % 2 == 0

    r = subprocess.run(cmd + ["--epochs", "200", "--max-steps", str(at + 4)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming at step {at}, {at + 4} steps" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert [h["step"] for h in s["history"]] == list(range(at + 5))
    assert s["history"][:at + 1] == saved
    _reload(s["model"], 64)


def test_nan_loss_names_the_step_inline(harvest_dir, tiny_backbone, tmp_path):
    """A loss that stops being finite ends the run with TrainingDiverged naming the step, and no model
    is exported. That is the shared loop's check and fit's message, the same for every trainer and
    for inline and Ray Train; tested inline (a Ray Train run took ~100 s to start for a run that
    diverges at once). An absurd learning rate sends the weights to inf after the first update."""
    from sentsim.training import TrainingDiverged

    with pytest.raises(TrainingDiverged, match=r"rankencoder.*the training loss became (nan|inf) at step 2;") as exc:
        _train("rankencoder", harvest_dir, tiny_backbone, tmp_path / "nan", lr=1e30, max_steps=6)
    assert str(exc.value).endswith("lower --set lr=...")  # and what to do about it
    assert not (tmp_path / "nan" / "model").exists()


def test_force_new_discards_the_old_runs_model_and_summary_before_training(harvest_dir, tiny_backbone, tmp_path):
    """--force-new discards the run at --out: its model and reports go with its state when the new run claims
    the folder, so a new run that stops before its own export (here: it diverges) leaves no model or summary of
    the old settings for `eval sts --model` to take for its own."""
    from conftest import error_line, sentsim_cli

    out = tmp_path / "stu"
    args = ("train", "student", "--objective", "rankencoder", "--data", harvest_dir, "--backbone", tiny_backbone,
            "--out", out, "--executor", "inline", "--set", "batch_size=8", "--set", "max_seq_length=16")
    r = sentsim_cli(*args, "--max-steps", "2")
    assert r.returncode == 0 and (out / "model").is_dir() and (out / "summary.json").is_file(), r.stderr[-2000:]
    r = sentsim_cli(*args, "--max-steps", "6", "--set", "lr=1e30", "--force-new")
    assert r.returncode == 2 and "the training loss became" in error_line(r.stderr), r.stderr[-2000:]
    assert not (out / "model").exists() and not (out / "summary.json").exists() and not (out / "curves").exists()
    assert "finished" not in json.loads((out / "run.json").read_text())  # the new run's record, unfinished


def test_a_force_new_run_refused_after_its_claim_keeps_the_old_run_whole(harvest_dir, tiny_backbone, tmp_path,
                                                                        capsys, ray_local):
    """--force-new discards the run at --out when the new run goes ahead, not when it claims --out: a student run
    refused after its claim (on Ray, workers the cluster cannot hold) exits 2 in one line and leaves every file
    of the old inline run as it was, run.json and model included; a --force-new run that goes ahead replaces it."""
    from harvest_support import cli_in_process

    from sentsim.identity import checkpoint_hash

    out = tmp_path / "stu"
    args = ("train", "student", "--objective", "rankencoder", "--data", harvest_dir, "--backbone", tiny_backbone,
            "--out", out, "--set", "batch_size=8", "--set", "max_seq_length=16", "--max-steps", "2")
    r = cli_in_process(capsys, *args, "--executor", "inline")
    assert r.returncode == 0, r.stderr[-2000:]
    old_fp, old_model = json.loads((out / "run.json").read_text())["fingerprint"], checkpoint_hash(str(out / "model"))
    before = _files(out)
    assert {"run.json", "summary.json", "model/config.json", "checkpoint/state.pt"} <= set(before), sorted(before)

    r = cli_in_process(capsys, *args, "--executor", "ray", "--num-workers", "3", "--force-new")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "3 worker(s) of 1 CPU each ask for 3 CPUs" in error_line(r.stderr), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _files(out) == before

    r = cli_in_process(capsys, *args, "--executor", "inline", "--set", "lr=1e-3", "--force-new")
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((out / "run.json").read_text())
    assert rec["fingerprint"] != old_fp and rec["config"]["lr"] == 1e-3
    assert checkpoint_hash(str(out / "model")) != old_model


def _files(out) -> dict:
    """Every file under `out` by its bytes and mtime."""
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def _rse_args(data, triples, backbone, out) -> list:
    return ["train", "student", "--objective", "rse", "--executor", "inline", "--data", data, "--triples", triples,
            "--backbone", backbone, "--out", out, "--set", "batch_size=8", "--set", "max_seq_length=16",
            "--set", "eval_every=1000"]


def _nli_triples(path, partner: str = "walks") -> None:
    path.write_text("".join(json.dumps({"s_i": f"A person number {i} is walking outside.", "relation": "entailment",
                                        "s_j": f"Person {i} {partner}."}) + "\n" for i in range(12)))


def test_a_student_knows_its_harvest_and_triples_by_content_not_path(harvest_dir, tiny_backbone, tmp_path, capsys):
    """A student's data are part of its run's identity by their content, not their paths: the harvest (its
    fingerprint and its pairs and sentences shards' sha256) and the objective's data file (rse's triples, by its
    sha256). Both copied elsewhere are the same run (a no-op); either edited in place, its counts unchanged, is
    another run, refused naming its content and leaving --out as it was."""
    from harvest_support import cli_in_process

    h, triples, out = tmp_path / "h", tmp_path / "nli.jsonl", tmp_path / "o"
    shutil.copytree(harvest_dir, h)
    _nli_triples(triples)
    r = cli_in_process(capsys, *_rse_args(h, triples, tiny_backbone, out), "--max-steps", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((out / "run.json").read_text())
    assert rec["format"] == 2 and rec["data"]["path"] == str(h) and rec["data"]["pairs_sha256"]
    assert rec["files"]["rse.triples"]["path"] == str(triples)

    moved = tmp_path / "elsewhere"
    shutil.copytree(h, moved / "h")
    shutil.copy(triples, moved / "nli.jsonl")
    r = cli_in_process(capsys, *_rse_args(moved / "h", moved / "nli.jsonl", tiny_backbone, out), "--max-steps", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already trained to step 1 with these settings; nothing to do" in r.stdout, r.stdout
    assert json.loads((out / "run.json").read_text())["fingerprint"] == rec["fingerprint"]

    before = _files(out)
    _nli_triples(triples, partner="strolls")  # as many triples of the same relation: the same counts
    r = cli_in_process(capsys, *_rse_args(h, triples, tiny_backbone, out), "--max-steps", "1")
    assert r.returncode == 2 and "holds a run with other settings" in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    assert "files.rse.triples.sha256" in line and "counts" not in line and ".path" not in line, line
    assert _files(out) == before

    _nli_triples(triples)
    shard = sorted((h / "pairs").glob("*.parquet"))[0]
    t = pq.read_table(shard)
    # each pair the other way round: the same pairs, scores and counts, other training rows
    pq.write_table(t.set_column(t.column_names.index("s1"), "s1", t["s2"])
                    .set_column(t.column_names.index("s2"), "s2", t["s1"]), shard)
    reseal(h)
    r = cli_in_process(capsys, *_rse_args(h, triples, tiny_backbone, out), "--max-steps", "1")
    assert r.returncode == 2 and "holds a run with other settings" in r.stderr, r.stderr[-3000:]
    line = error_line(r.stderr)
    assert "data.pairs_sha256" in line and "counts" not in line and "data.path" not in line, line
    assert _files(out) == before


def as_format_1(out) -> str:
    """Rewrite OUT/run.json as a student's record was written before run records had a format (format 1): its
    fingerprint made of the config less its top-level resumable keys, --data as given and the counts, and its
    record holding --data as given. Returns that fingerprint."""
    from sentsim.config import without_added_later
    from sentsim.identity import fingerprint
    from sentsim.students import StudentConfig
    from sentsim.training.config import RESUMABLE_KEYS

    rec = json.loads((out / "run.json").read_text())
    what = without_added_later({k: v for k, v in rec["config"].items() if k not in RESUMABLE_KEYS},
                               StudentConfig.ADDED_LATER)
    for name, field in StudentConfig.model_fields.items():
        if isinstance(what.get(name), dict):
            what[name] = without_added_later(what[name], field.annotation.ADDED_LATER)
    fp = fingerprint("student", what, rec["backbone"], rec["data"]["path"], rec["counts"])
    (out / "run.json").write_text(json.dumps({"fingerprint": fp, "config": rec["config"], "backbone": rec["backbone"],
                                              "data": rec["data"]["path"], "counts": rec["counts"]}, indent=2))
    return fp


def test_a_student_of_an_earlier_run_format_goes_on_under_its_fingerprint(harvest_dir, tiny_backbone, tmp_path,
                                                                          capsys):
    """A student run whose record was written before its data were known by content (format 1: no `format` in
    run.json, its fingerprint holding --data's and the triples' paths) is this same run: the same command again
    trains nothing, a larger --max-steps resumes, both under the fingerprint it holds and its record keeping
    format 1."""
    from harvest_support import cli_in_process

    triples, out = tmp_path / "nli.jsonl", tmp_path / "o"
    _nli_triples(triples)
    args = _rse_args(harvest_dir, triples, tiny_backbone, out)
    assert cli_in_process(capsys, *args, "--max-steps", "1").returncode == 0
    held = as_format_1(out)
    # its fit recorded as a format-1 run's was (the workers' config holding the triples' path): made again here
    (out / "checkpoint" / "rse.done.json").unlink()
    r = cli_in_process(capsys, *args, "--max-steps", "1")
    assert r.returncode == 0 and "resuming at step 1, 1 step" in r.stdout, r.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["fingerprint"] == held

    r = cli_in_process(capsys, *args, "--max-steps", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already trained to step 1 with these settings; nothing to do" in r.stdout, r.stdout
    rec = json.loads((out / "run.json").read_text())
    assert (rec["fingerprint"], rec["format"]) == (held, 1)

    r = cli_in_process(capsys, *args, "--max-steps", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming at step 1, 2 steps" in r.stdout, r.stdout
    rec = json.loads((out / "run.json").read_text())
    assert (rec["fingerprint"], rec["format"]) == (held, 1)
    assert json.loads((out / "summary.json").read_text())["fingerprint"] == held
