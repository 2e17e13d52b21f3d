"""bench/gpu.py (issue 38) runs on a CPU in seconds with --tiny, so that the GPU bench never rots between the
rare runs on a GPU: every section completes and the last line is the JSON object the issue names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_bench_runs_every_section_on_a_cpu(tmp_path, speech_corpus):
    out, files = tmp_path / "gpu", _pair_files(tmp_path / "pairs")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny", "--device", "cpu",
                           "--corpus", str(speech_corpus), "--teacher-minutes", "0.1", "--micro-batches", "8,1",
                           "--compile", "score", "--pack", "400", "--attention", "flex",
                           "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                           "--teacher-pairs", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("device", "peak_tflops", "train_mfu", "train_padding", "score_mfu", "score_padding",
                "host_target_tokens_per_s"):
        assert last[key] is not None, (key, last)
    errors = json.loads((out / "gpu.json").read_text())["errors"]
    # FlexAttention has no backward pass on a CPU: its runs are refused there, each in its own entry
    flex = ["train bart, attention=flex", "train bart, pack_tokens=400, attention=flex"]
    assert last["failed"] == flex, errors
    assert all("trains on a GPU only" in errors[k] for k in flex)
    assert last["score_fp32_max_rel_diff"] < 1e-4  # the scorer's fp32 log-probs are a plain forward's
    assert 0 <= last["train_padding"] < 0.25 and 0 < last["train_mfu"] < 1
    assert (out / "gpu.md").read_text().startswith("Device: cpu")
    trained = [r["shape"] for r in json.loads((out / "gpu.json").read_text())["sections"]["train"]["rows"]]
    assert trained == ["bart", "bart, micro_batches=1", "bart, pack_tokens=400", "warm_start"]
    assert last["train_mfu_packed"] is not None
    scored = json.loads((out / "gpu.json").read_text())["sections"]["score"]["rows"]
    assert [r["compile"] for r in scored] == [False, False, True]
    assert scored[-1]["max_abs_diff_vs_eager"] < 0.05  # bf16 where this CPU has it
    # a compiled figure says whether it is of whole-function graphs: the scorer's two functions, no break
    assert scored[-1]["compiled_graph_breaks"] == 0 and 1 <= scored[-1]["compiled_graphs"] <= 6, scored[-1]
    assert last["transformers"] and "graph(s), 0 break(s)" in (out / "gpu.md").read_text()


def test_a_gpu_asked_for_where_there_is_none_is_refused_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cuda", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


# The one-run teacher (bench/gpu.py --teacher-minutes, bench/gpu_teacher.py): a CPU dry run of the GPU command,
# on pair files in each format the harvest reads, with no Ray importable (the GPU machine has none).
STSB_LINES = [("5.000", "The government of the United States must act now.", "The United States government must act."),
              ("1.200", "The people of this country want peace.", "The Congress passed a law on taxes."),
              ("3.400", "We must protect the rights of all citizens.", "The rights of every citizen are protected."),
              ("0.400", "Our army is strong.", "The year has been a good one for trade.")]
DEV_ROWS = [("The Constitution gives the President power.", "The President holds power under the Constitution.", 4.6),
            ("Taxes must be reduced this year.", "The navy needs new ships.", 0.2),
            ("I thank the Congress for its work.", "Congress has done good work, and I thank it.", 4.0),
            ("Our economy is growing.", "The public debt must be paid.", 1.0)]


def _pair_files(d: Path) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    files = {"stsb": d / "sts-test.csv", "dev": d / "dev.jsonl", "extra": d / "extra pairs.csv"}
    files["stsb"].write_text("".join(f"main-news\theadlines\t2012\t{i:04d}\t{g}\t{a}\t{b}\n"
                                     for i, (g, a, b) in enumerate(STSB_LINES)))
    files["dev"].write_text("".join(json.dumps({"s1": a, "s2": b, "gold": g}) + "\n" for a, b, g in DEV_ROWS))
    files["extra"].write_text('s1,s2,gold\n"The world is at peace, and we are glad.",We are glad of peace.,4.8\n'
                              "The law was passed by the Senate.,Farmers need better prices.,0.5\n"
                              "Education is the key to our future.,Our future depends on schools.,3.9\n")
    return files


def _no_ray(tmp_path: Path) -> dict:
    import os

    from run_support import without_ray

    return dict(os.environ, **without_ray(tmp_path))  # no Ray on the GPU machine


@pytest.mark.slow
def test_teacher_dry_run_scores_every_set_and_leaves_score_files_that_remake_it(tmp_path, speech_corpus):
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_teacher as gt

    files, out = _pair_files(tmp_path / "pairs"), tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny", "--device", "cpu",
                           "--teacher-minutes", "0.05", "--sections", "teacher", "--corpus", str(speech_corpus),
                           "--stsb-test", str(files["stsb"]), "--dev-pairs", str(files["dev"]),
                           "--pairs", str(files["extra"]), "--teacher-pairs", "3", "--out", str(out),
                           "--teacher-sizes", "16,100,16/100"],
                          capture_output=True, text=True, timeout=600, env=_no_ray(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["failed"] == [], json.loads((out / "gpu.json").read_text())["errors"]
    assert last["teacher_target_tokens"] > 0
    teacher = last["teacher"]
    assert set(teacher) == {"stsb_test", "dev", "extra_pairs"}
    for name, by_size in teacher.items():
        assert set(by_size) == {"16", "100", "16/100"}, name
        for r in by_size.values():
            assert r["scored"] == r["pairs"] == 3
            for key in ("spearman", "tfidf", "diff"):
                assert -200 <= r[key] <= 200, (name, key, r)
            assert len(r["diff_ci"]) == 2 and r["diff_ci"][0] <= r["diff_ci"][1]
            assert abs(r["diff"] - (r["spearman"] - r["tfidf"])) < 1e-9
        assert by_size["16"]["contexts_per_pair"] <= by_size["100"]["contexts_per_pair"]
        # 16 chosen by Eq. 3 from 100 (contexts.rerank_shortlist) holds as many contexts as the first 16
        assert by_size["16/100"]["contexts_per_pair"] == by_size["16"]["contexts_per_pair"]
    # the score files are all a CPU needs to remake the numbers, and they hold what the sets hold
    assert sorted(p.name for p in out.glob("teacher-*.jsonl.gz")) == [
        "teacher-dev.jsonl.gz", "teacher-extra_pairs.jsonl.gz", "teacher-stsb_test.jsonl.gz"]
    assert gt.report(out) == teacher
    rows = gt.read_scores(out / "teacher-dev.jsonl.gz")
    assert [(r["s1"], r["s2"], r["gold"]) for r in rows] == [tuple(x) for x in DEV_ROWS[:3]]
    assert [r["tfidf"] for r in rows] == pytest.approx(list(gt.tfidf_cosine(DEV_ROWS[:3])))
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_teacher.py"), "report", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1]) == teacher
    assert "| stsb_test | 100 | 3/3 |" in (out / "gpu.md").read_text()
    assert "| stsb_test | 16/100 | 3/3 |" in (out / "gpu.md").read_text()
    runs = json.loads((out / "gpu.json").read_text())["sections"]["teacher"]["scoring"]
    by = {(r["set"], r["size"]): r["items"] for r in runs}
    assert by[("dev", "16/100")] > by[("dev", "16")]  # the shortlists' items besides Eq. 4's
    # STS-B test at every size before the other sets: out of time, the dev sample goes first
    assert [r["set"] for r in runs][:3] == ["stsb_test"] * 3
    # the scorer ran on the teacher's shape before training (its rate plans `fill`), and the training's row
    # is kept apart from the scoring's
    res = json.loads((out / "gpu.json").read_text())
    assert last["teacher_probe_items_per_s"] > 0
    assert res["teacher_train"]["target_tokens_total"] == last["teacher_target_tokens"]


def test_a_smaller_context_set_is_the_prefix_of_a_larger_one(tmp_path, speech_corpus):
    """Only the largest |C_s| is made; each smaller one is cut from it. That is what ContextStage selects at
    the smaller size, because selection is greedy in retrieval order."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_teacher as gt

    pairs = [(a, b, float(g)) for g, a, b in STSB_LINES] + list(DEV_ROWS)
    index = str(tmp_path / "index")
    gt.ensure_index(str(speech_corpus), index)
    for size in (4, 40):
        gt.make_contexts(str(speech_corpus), index, {"s": pairs}, size, tmp_path / "ctx")
    small = gt.read_units(tmp_path / "ctx" / "s-k4.jsonl.gz", 4)
    cut = gt.read_units(tmp_path / "ctx" / "s-k40.jsonl.gz", 4)
    assert cut == small
    assert any(len(cs["contexts"]) == 4 for u in small for cs in u["csets"].values())
    assert gt.pairs_of(cut) == pairs


def test_the_fast_bootstrap_is_bench_common_s():
    """All resamples at once, the same draws and statistic as bench/common.py's loops (ties and NaN too)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    import common
    import gpu_teacher as gt

    rng = np.random.default_rng(3)
    gold = np.round(rng.random(120) * 5, 1)
    a, b = np.round(gold + rng.random(120), 1), gold + rng.random(120)
    a[[5, 17]] = np.nan
    assert np.allclose(gt.bootstrap(a, gold, n=300), common.bootstrap(a, gold, n=300), atol=1e-9)
    ok = np.isfinite(a)
    assert np.allclose(gt.paired_bootstrap(a[ok], b[ok], gold[ok], n=300),
                       common.paired_bootstrap(a[ok], b[ok], gold[ok], n=300), atol=1e-9)
