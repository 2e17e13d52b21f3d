"""A trainer that reads fewer rows than the run has says so in one line, with both counts, and accounts
for every row it leaves out (issue 37: a surrogate trained on 100 of 119 pairs with no note).

Through the commands, as typed: `sentsim train surrogate` (on the session's `ray start` head) and
`sentsim train student` (rse, paser; inline), on a 119-pair harvest with null scores, its own few dev
and test pairs and therefore a dev/test carve, repeated and phrase-less sentences.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import error_line, sentsim_cli
from harvest_support import small_pairs_run, tiny_bert, write_pairs_run

pytestmark = pytest.mark.slow

N, NULLS, DEV, TEST = 119, 12, 3, 2  # the counts of harvest_support.small_pairs_run
NOTE = re.compile(r"^note: training on (\d+) of (\d+) (.+?)(?: \((.*)\))?(?:;.*)?$", re.M)


def note_of(stdout: str, noun: str) -> tuple[int, int, dict]:
    """(trained, total, {reason: count}) of the one note line about `noun`."""
    found = [m for m in NOTE.finditer(stdout) if m.group(3) == noun]
    assert len(found) == 1, stdout
    m = found[0]
    parts = {}
    for part in (m.group(4) or "").split(", "):
        if part:
            n, why = part.split(" ", 1)
            parts[why] = int(n)
    return int(m.group(1)), int(m.group(2)), parts


@pytest.fixture(scope="module")
def harvest(tmp_path_factory):
    return write_pairs_run(tmp_path_factory.mktemp("notes") / "h", *small_pairs_run())


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("bert"), layers=1, width=32, heads=2, positions=64)


TINY = ["--max-steps", "1", "--force-new", "--set", "max_seq_length=16", "--set", "eval_every=1"]
WHOLE_EPOCHS = ["--force-new", "--set", "max_seq_length=16", "--set", "eval_every=1"]  # no step cap


def rows_per_epoch(curve) -> dict:
    """{epoch: rows its steps read} from a run's curves/<name>.json (every step a history point)."""
    history = json.loads(curve.read_text())
    steps = [h["step"] for h in history if h["step"] > 0]
    assert steps == list(range(1, len(steps) + 1)), steps  # every step logged: the sums below are whole
    out = {}
    for h in history:
        if h["step"] > 0:
            out[h["epoch"]] = out.get(h["epoch"], 0) + h["batch_rows"]
    return out


def test_the_capped_run_note_comes_only_when_max_steps_ends_the_first_epoch():
    from sentsim.training.run import capped_note

    # `make demo`'s student: 142 rows, batch 16, full batches only: 8 steps are its whole epoch (the 14 rows
    # an epoch leaves out are epoch_shortfall's note), and no cap is noted
    assert capped_note("s", 142, 8, num_workers=1, batch_size=16, drop_last=True) == ""
    assert capped_note("s", 142, 7, num_workers=1, batch_size=16, drop_last=True) == (
        "note: s: 7 steps of 1 x 16 see 112 of the 142 training rows (a seeded random part of them; "
        "raise max_steps to see them all)")
    assert capped_note("s", 142, 9, num_workers=1, batch_size=16, drop_last=False) == ""  # the short batch too
    assert "8 steps of 1 x 16 see 128 of the 142" in capped_note("s", 142, 8, num_workers=1, batch_size=16,
                                                                   drop_last=False)
    assert "2 steps of 2 x 16 see 64 of the 100" in capped_note("s", 100, 2, num_workers=2, batch_size=16,
                                                                 drop_last=False)
    assert capped_note("s", 100, 4, num_workers=2, batch_size=16, drop_last=False) == ""


def test_surrogate_says_what_it_trains_on(harvest, backbone, tmp_path, ray_head):
    env = {**ray_head["env"], "RAY_ADDRESS": ray_head["gcs"]}
    r = sentsim_cli("train", "surrogate", "--data", harvest, "--backbone", backbone, "--out", tmp_path / "s",
                    "--init", "scratch", "--num-workers", "1", *WHOLE_EPOCHS, "--set", "batch_size=8",
                    "--set", "scratch.hidden_size=32", "--set", "scratch.num_layers=1", "--set", "scratch.num_heads=2",
                    "--set", "scratch.intermediate_size=64", "--set", "cpus_per_worker=0.5", env=env)
    # (a Ray actor's own traceback, "(PlacementGroupCleaner pid=...) Traceback", is Ray's: it finds the
    # other engineers' Ray instances on a shared machine; sentsim's would start a line)
    own = [ln for ln in r.stderr.splitlines() if ln.startswith("Traceback")]
    assert r.returncode == 0 and not own, (r.stdout[-2000:], r.stderr[-3000:])
    trained, total, left_out = note_of(r.stdout, "pairs")
    assert total == N and trained + sum(left_out.values()) == N  # every pair accounted for
    assert left_out["null score"] == NULLS and left_out["dev"] == DEV and left_out["test"] == TEST
    assert left_out["carved out of train to dev/test"] > 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["stages"][0]["train_pairs"] == trained
    # the epoch's last, short batch is trained on too: every train pair is read once an epoch, and no note
    # says any is left out
    assert trained % 8 and rows_per_epoch(tmp_path / "s" / "curves" / "harvest.json") == {0: trained}
    assert summary["stages"][0]["total_steps"] == -(-trained // 8) and "leaves out" not in r.stdout
    assert " training rows (a seeded random part" not in r.stdout  # whole epochs: no capped-run note


def test_rse_student_says_what_it_trains_on(harvest, backbone, tmp_path):
    r = sentsim_cli("train", "student", "--objective", "rse", "--data", harvest, "--backbone", backbone,
                    "--out", tmp_path / "rse", "--executor", "inline", *TINY, "--set", "batch_size=16",
                    "--set", "rse.score_threshold=0.3")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout[-2000:], r.stderr[-3000:])
    trained, total, left_out = note_of(r.stdout, "pairs as context-similar triples")
    assert total == N and trained + sum(left_out.values()) == N
    assert left_out["null score"] == NULLS and left_out["train below rse.score_threshold 0.3"] > 0
    used, rows, why = note_of(r.stdout, "sentences as same-sent triples")
    assert rows == 60 and used + sum(why.values()) == rows and why["repeated or empty texts"] == 5 + 1 + 1
    summary = json.loads((tmp_path / "rse" / "summary.json").read_text())
    assert summary["counts"]["per_relation"] == {"context-similar": trained, "same-sent": used}
    # each epoch drops the last part batch (InfoNCE wants full ones): said too, with the count
    n = trained + used
    assert f"note: {n} rse training rows; each epoch leaves out {n % 16} of them" in r.stdout
    # --max-steps 1 ends the run inside its first epoch: which rows it sees is said too
    assert f"note: student rse: 1 step of 1 x 16 sees 16 of the {n} training rows" in r.stdout


def test_paser_student_says_what_it_trains_on(harvest, backbone, tmp_path):
    r = sentsim_cli("train", "student", "--objective", "paser", "--data", harvest, "--backbone", backbone,
                    "--out", tmp_path / "paser", "--executor", "inline", *WHOLE_EPOCHS, "--set", "batch_size=4",
                    "--epochs", "2", "--set", "log_every=1",
                    "--set", "paser.decoder_layers=1", "--set", "paser.decoder_heads=2")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout[-2000:], r.stderr[-3000:])
    used, rows, why = note_of(r.stdout, "sentences")
    assert rows == 60 and used + sum(why.values()) == rows
    assert why == {"repeated texts": 6, "without a RAKE phrase": 4}  # 5 copies and the 2nd ""; 3 + ""
    # PaSeR's loss is per sentence (no in-batch negatives): each epoch's short last batch is trained on, so
    # every sentence is read once an epoch and no row is left out
    assert used % 4 and rows_per_epoch(tmp_path / "paser" / "curves" / "paser.json") == {0: used, 1: used}
    assert "leaves out" not in r.stdout


def test_a_nan_score_in_a_harvest_is_refused_by_the_students(backbone, tmp_path, capsys):
    """The surrogate refused NaN scores; the students read them as scored (keep_split keeps NaN). (The command
    runs in this process: it is refused before any training, and a subprocess's start-up would cost more.)"""
    from sentsim.cli import main

    bad = write_pairs_run(tmp_path / "h", *small_pairs_run(nan_score=True))
    rc = main(["train", "student", "--objective", "rse", "--data", str(bad), "--backbone", str(backbone),
               "--out", str(tmp_path / "o"), "--executor", "inline", *TINY])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err[-3000:]
    assert "1 score(s) are NaN or infinite" in err and not (tmp_path / "o").exists()


def test_the_epoch_cap_note_names_the_epochs_that_end_a_longer_max_steps():
    from sentsim.training.run import epoch_cap_note

    assert epoch_cap_note("s", 0, epochs=1, per_epoch=13) == ""  # no step budget: the epochs are the plan
    assert epoch_cap_note("s", 13, epochs=1, per_epoch=13) == ""
    assert epoch_cap_note("s", 30, epochs=1, per_epoch=13) == (
        "note: s: --max-steps 30 is past the 13 steps its epochs hold (1 epoch x 13 steps), so it trains 13; "
        "raise --epochs to train longer")
    assert "past the 1 step its epochs hold (1 epoch x 1 step)" in epoch_cap_note("s", 2, epochs=1, per_epoch=1)
    assert "finetune.max_steps 9 is past the 8 steps its epochs hold (2 epochs x 4 steps)" in epoch_cap_note(
        "s", 9, epochs=2, per_epoch=4, steps_key="finetune.max_steps")


def _card_body(model) -> str:
    return (model / "README.md").read_text().split("\n---\n", 1)[1]


def test_a_student_says_when_its_epochs_end_a_longer_max_steps_and_its_card_what_it_trained(harvest, backbone,
                                                                                           tmp_path, capsys):
    """--max-steps past the epochs: the fresh run says the epochs end it, and so does the rerun that finds it
    finished (not a bare "nothing to do"); the card says the steps, epochs and rows it trained. (In this
    process: inline.)"""
    from harvest_support import cli_in_process

    out = tmp_path / "rse"
    args = ["train", "student", "--objective", "rse", "--data", harvest, "--backbone", backbone, "--out", out,
            "--executor", "inline", "--set", "max_seq_length=16", "--set", "eval_every=100", "--set", "batch_size=16",
            "--set", "rse.score_threshold=0.3"]
    r = cli_in_process(capsys, *args, "--max-steps", "1000")
    assert r.returncode == 0, r.stderr[-3000:]
    n = int(re.search(r"^note: (\d+) rse training rows; each epoch leaves out", r.stdout, re.M).group(1))
    per_epoch, left = n // 16, n % 16
    note = (f"note: student rse: --max-steps 1000 is past the {per_epoch} steps its epochs hold (1 epoch x "
            f"{per_epoch} steps), so it trains {per_epoch}; raise --epochs to train longer")
    assert note in r.stdout and f"starting, {per_epoch} steps" in r.stdout, r.stdout
    body = _card_body(out / "model")
    assert f"Steps: {per_epoch}, 1 epoch of {per_epoch} steps: {n - left} reads of the {n} training rows" in body
    assert f"left out of each epoch (a short last batch): {left}" in body

    again = cli_in_process(capsys, *args, "--max-steps", "2000")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"already trained to step {per_epoch} with these settings; nothing to do" in again.stdout
    assert note.replace("1000", "2000") in again.stdout and "starting" not in again.stdout

    # one step inside the epoch: the card counts what it read, and no epoch's left-out rows
    r = cli_in_process(capsys, *args, "--max-steps", "1", "--out", tmp_path / "one")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "is past the" not in r.stdout
    body = _card_body(tmp_path / "one" / "model")
    assert f"Steps: 1, {1 / per_epoch:.2g} of an epoch of {per_epoch} steps: 16 of the {n} training rows read" in body
    assert "left out of each epoch" not in body


def test_a_batch_no_epoch_fills_is_refused_without_a_note_on_the_rows_an_epoch_leaves_out(harvest, backbone,
                                                                                         tmp_path, capsys):
    """The refusal explains the run, not a note before it on the rows each epoch of it would leave out."""
    from harvest_support import cli_in_process

    refused = tmp_path / "big"
    r = cli_in_process(capsys, "train", "student", "--objective", "rse", "--data", harvest, "--backbone", backbone,
                       "--out", refused, "--executor", "inline", "--set", "rse.score_threshold=0.3",
                       "--set", "batch_size=400")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"rse: \d+ training rows cannot fill one batch of 400 per worker", error_line(r.stderr))
    assert "leaves out" not in r.stdout and not refused.exists()
    # with a batch an epoch fills, the same rows' shortfall is said
    r = cli_in_process(capsys, "train", "student", "--objective", "rse", "--data", harvest, "--backbone", backbone,
                       "--out", refused, "--executor", "inline", "--set", "rse.score_threshold=0.3",
                       "--set", "batch_size=64", "--set", "max_seq_length=16", "--max-steps", "1")
    assert r.returncode == 0 and "each epoch leaves out" in r.stdout, r.stderr[-3000:]


def test_a_surrogate_says_when_its_epochs_end_a_longer_max_steps(harvest, backbone, tmp_path, capsys):
    from harvest_support import cli_in_process

    out = tmp_path / "s"
    args = ["train", "surrogate", "--data", harvest, "--backbone", backbone, "--out", out, "--executor", "inline",
            "--init", "scratch", "--epochs", "1", "--set", "batch_size=32", "--set", "max_seq_length=16",
            "--set", "eval_every=100", "--set", "scratch.hidden_size=32", "--set", "scratch.num_layers=1",
            "--set", "scratch.num_heads=2", "--set", "scratch.intermediate_size=64"]
    r = cli_in_process(capsys, *args, "--max-steps", "30")
    assert r.returncode == 0, r.stderr[-3000:]
    trained, _, _ = note_of(r.stdout, "pairs")
    per_epoch = -(-trained // 32)
    note = (f"note: surrogate harvest: --max-steps 30 is past the {per_epoch} steps its epochs hold (1 epoch x "
            f"{per_epoch} steps), so it trains {per_epoch}; raise --epochs to train longer")
    assert note in r.stdout and f"starting, {per_epoch} steps" in r.stdout, r.stdout
    assert re.search(rf"^harvest: {trained} pairs, {per_epoch} steps; ", r.stdout, re.M), r.stdout
    body = _card_body(out / "model")
    assert f"Steps: {per_epoch}, 1 epoch of {per_epoch} steps: {trained} reads of the {trained} training rows" in body
    again = cli_in_process(capsys, *args, "--max-steps", "40")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"already trained to step {per_epoch} with these settings; nothing to do" in again.stdout
    assert note.replace("30", "40") in again.stdout
