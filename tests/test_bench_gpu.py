"""bench/gpu.py (issue 38) runs on a CPU in seconds with --tiny, so that the GPU bench never rots between the
rare runs on a GPU: every section completes and the last line is the JSON object the issue names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_bench_runs_every_section_on_a_cpu(tmp_path, speech_corpus):
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny", "--device", "cpu",
                           "--corpus", str(speech_corpus), "--teacher-minutes", "0.1", "--micro-batches", "8,1",
                           "--compile", "score",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("device", "peak_tflops", "train_mfu", "train_padding", "score_mfu", "score_padding",
                "host_target_tokens_per_s"):
        assert last[key] is not None, (key, last)
    assert last["failed"] == [], json.loads((out / "gpu.json").read_text())["errors"]
    assert last["score_fp32_max_rel_diff"] < 1e-4  # the scorer's fp32 log-probs are a plain forward's
    assert 0 <= last["train_padding"] < 0.25 and 0 < last["train_mfu"] < 1
    assert (out / "gpu.md").read_text().startswith("Device: cpu")
    trained = [r["shape"] for r in json.loads((out / "gpu.json").read_text())["sections"]["train"]["rows"]]
    assert trained == ["bart", "bart, micro_batches=1", "warm_start"]
    scored = json.loads((out / "gpu.json").read_text())["sections"]["score"]["rows"]
    assert [r["compile"] for r in scored] == [False, False, True]
    assert scored[-1]["max_abs_diff_vs_eager"] < 0.05  # bf16 where this CPU has it


def test_a_gpu_asked_for_where_there_is_none_is_refused_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cuda", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr
