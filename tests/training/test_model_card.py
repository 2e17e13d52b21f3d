"""An exported model says what it is: its README.md (YAML front matter, as sentence-transformers' own cards)
names its base model, the harvest it was trained on (path and fingerprint), the teacher's metric, the
objective and its settings, the row counts, and, once `sentsim eval sts` has run on it, its STS scores.

After a real tiny training run through the CLI (a PaSeR student, inline, on a small harvest); the surrogate's
card is checked after its Ray training runs in test_surrogate.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import sentsim_cli
from harvest_support import small_pairs_run, tiny_bert, write_pairs_run

from sentsim.evaluation.model_folder import INFO_FILE

pytestmark = pytest.mark.slow


def read_card(folder):
    """(front matter, body) of folder/README.md."""
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n"), text[:200]
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    harvest = write_pairs_run(root / "h", *small_pairs_run())
    backbone = tiny_bert(root / "bert", layers=1, width=32, heads=2, positions=64)
    out = root / "out"
    r = sentsim_cli("train", "student", "--objective", "paser", "--data", harvest, "--backbone", backbone,
                    "--out", out, "--executor", "inline", "--max-steps", "2", "--set", "max_seq_length=16",
                    "--set", "batch_size=8", "--set", "paser.decoder_layers=1", "--set", "paser.decoder_heads=2")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    sts = root / "sts" / "STS2013-en-test"
    sts.mkdir(parents=True)
    pairs = [("a man plays a flute", "a man is playing a flute", 5.0), ("a dog runs", "the cat sleeps", 0.5),
             ("prices rose", "prices went up", 4.0), ("it rains", "the senate voted", 0.0)]
    (sts / "STS.input.a.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in pairs))
    (sts / "STS.gs.a.txt").write_text("".join(f"{g}\n" for *_, g in pairs))
    return {"out": out, "model": out / "model", "harvest": harvest, "backbone": backbone, "sts": sts.parent}


def test_a_student_card_says_what_the_model_is(trained):
    model, harvest = trained["model"], trained["harvest"]
    front, body = read_card(model)
    assert front["library_name"] == "sentence-transformers" and front["pipeline_tag"] == "sentence-similarity"
    assert front["base_model"] == str(trained["backbone"])
    assert {"sentence-transformers", "sentsim", "sentsim-student", "paser"} <= set(front["tags"])
    assert "Unknown" not in body and "model-index" not in front  # not the library's blank template; no scores yet
    fingerprint = json.loads((harvest / "manifest.json").read_text())["fingerprint"]
    assert f"Harvest: `{harvest}`, fingerprint `{fingerprint}`" in body
    summary = json.loads((trained["out"] / "summary.json").read_text())
    assert f"Rows: trained on {summary['rows']} paser training rows" in body
    assert "skipped (no phrase): 4" in body and "sentences: 50" in body
    assert "Objective: `paser`, 002: phrase reconstruction" in body
    assert "| paser.top_k | `3` |" in body and "| batch_size | `8` |" in body
    # what was trained: 2 steps of 8 inside the first epoch (PaSeR trains each epoch's short last batch too)
    n = summary["rows"]
    per_epoch = -(-n // 8)
    assert f"Steps: 2, {2 / per_epoch:.2g} of an epoch of {per_epoch} steps: 16 of the {n} training rows read" in body
    assert "left out of each epoch" not in body and "Not evaluated yet" in body
    card = json.loads((model / INFO_FILE).read_text())["card"]
    assert card["data"]["fingerprint"] == fingerprint and card["base_model"]["init"] == "pretrained"


def test_eval_sts_records_its_scores_on_the_card(trained):
    model = trained["model"]
    r = sentsim_cli("eval", "sts", "--model", model, "--data", trained["sts"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "STS scores recorded" in r.stdout
    front, body = read_card(model)
    result = front["model-index"][0]["results"][0]
    assert result["dataset"]["name"] == "STS13"
    spearman = next(m["value"] for m in result["metrics"] if m["type"] == "spearman_cosine")
    info = json.loads((model / INFO_FILE).read_text())
    assert spearman == pytest.approx(info["sts"]["tasks"]["STS13"]["spearman"] / 100, abs=1e-4)
    assert "| STS13 | 4/4 |" in body and "Not evaluated yet" not in body
    # the card is documentation: the folder is still whole, and evaluates again
    r = sentsim_cli("eval", "sts", "--model", model, "--data", trained["sts"])
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_cards_average_is_the_suites_on_published_splits(trained, tmp_path):
    """A card accumulates every task eval sts scored: its mean is over the suite's tasks on their published
    splits only, not STS-B's dev split, nor SICK-R scored on train+trial for a missing test file, which the card
    lists with eval's note and leaves out of the model-index."""
    data = tmp_path / "sts"
    shutil.copytree(trained["sts"] / "STS2013-en-test", data / "STS2013-en-test")
    (data / "SICK").mkdir(parents=True)
    (data / "SICK" / "SICK_train.txt").write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        "1\ta man plays a flute\ta man is playing a flute\t4.8\tENTAILMENT\n"
        "2\ta dog runs\tthe cat sleeps\t1.2\tNEUTRAL\n3\tprices rose\tprices went up\t4.1\tENTAILMENT\n")
    (data / "stsbenchmark").mkdir()
    (data / "stsbenchmark" / "sts-dev.csv").write_text(
        "main-news\tMSRpar\t2012\t0001\t4.5\tprices rose\tprices went up\n"
        "main-news\tMSRpar\t2012\t0002\t0.5\ta dog runs\tthe senate voted\n"
        "main-news\tMSRpar\t2012\t0003\t3.0\tit rains\tit is raining hard\n")
    model = tmp_path / "model"
    shutil.copytree(trained["model"], model)
    r = sentsim_cli("eval", "sts", "--model", model, "--data", data, "--tasks", "STS13,SICK-R,STSb-dev")
    assert r.returncode == 0, r.stderr[-3000:]
    front, body = read_card(model)
    assert [x["dataset"]["name"] for x in front["model-index"][0]["results"]] == ["STS13", "STSb-dev"]
    sick = next(line for line in body.splitlines() if line.startswith("| SICK-R |"))
    assert "not comparable with published SICK-R" in sick
    stsb13 = json.loads((model / INFO_FILE).read_text())["sts"]["tasks"]["STS13"]["spearman"]
    assert f"| **Avg.** | | **{stsb13:.2f}** | | | mean of 1 of the suite's 7 tasks (STS13) |" in body


def test_a_card_says_what_its_steps_trained_and_an_older_card_what_it_recorded():
    """The steps line from what training_extent records (the budget inside an epoch, or whole epochs); a card
    exported before those were recorded (eval sts renders it again) says its steps and its epochs setting, not
    that its steps ran over those epochs."""
    from sentsim.training.model_card import render
    from sentsim.training.run import training_extent

    def steps_line(training: dict) -> str:
        return next(ln for ln in render({"card": {"training": training}}).splitlines() if ln.startswith("- Steps:"))

    inside = training_extent(3, 279, num_workers=1, batch_size=16, drop_last=True)
    assert inside == {"steps": 3, "steps_per_epoch": 17, "epochs_trained": 0.1765, "rows": 279, "rows_read": 48}
    assert steps_line({**inside, "epochs": 1}) == (
        "- Steps: 3, 0.18 of an epoch of 17 steps: 48 of the 279 training rows read (the step budget ended the run)")
    whole = training_extent(34, 279, num_workers=1, batch_size=16, drop_last=True)
    assert steps_line({**whole, "epochs": 2}) == "- Steps: 34, 2 epochs of 17 steps: 544 reads of the 279 training rows"
    two = training_extent(3, 100, num_workers=2, batch_size=16, drop_last=False)  # 50 a worker: 4 steps an epoch
    assert two["steps_per_epoch"] == 4 and two["rows_read"] == 96
    assert steps_line({"steps": 3, "epochs": 1}) == "- Steps: 3, with epochs=1"


def test_a_part_of_an_epoch_never_reads_as_a_whole_one():
    from sentsim.training.model_card import _steps_line

    assert "Steps: 299, 0.99 of an epoch of 300 steps" in _steps_line(
        dict(steps=299, steps_per_epoch=300, rows=300, rows_read=299))
    assert "Steps: 4, 0.0056 of an epoch of 719 steps" in _steps_line(
        dict(steps=4, steps_per_epoch=719, rows=719, rows_read=4))
