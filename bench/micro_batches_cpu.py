"""What a bucketed step of 8 micro-batches costs on a CPU against one batch (issue 38; `micro_batches`)

    python bench/micro_batches_cpu.py [--model bench|gpu] [--rounds 2] [--steps 80] [--threads 1]

Trains `sentsim train context` inline with `micro_batches` 1 and 8 in turn (alternating, `--rounds` times),
4,096 padded tokens a step, fp32, and reports the training process's CPU seconds per step and per 1,000
target tokens between the first quarter of the steps and the last, median over rounds. `--model bench` is
bench/stream_quality.py's 1.5M-parameter BART on the bundled sample; `--model gpu` the 52.5M BART of
configs/gpu_context.yaml on a corpus run and tokenizer you give (e.g. ../shared/gpu's, copied into .gpu/).
Results: bench/results/micro_batches_cpu_<model>.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("bench", "gpu"), default="bench")
    ap.add_argument("--corpus", default="", help="a corpus run (default: the bundled sample, built here)")
    ap.add_argument("--tokenizer", default="", help="a tokenizer folder (default: a BPE trained here)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro-batches", default="1,8")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import yaml
    from common import machine, sample_corpus_and_bpe
    from stream_quality import MODEL

    from sentsim.context.config import ContextTrainConfig
    from sentsim.context.train import train_context

    gpu_model = yaml.safe_load((ROOT / "configs" / "gpu_context.yaml").read_text())["model"]
    model = MODEL if a.model == "bench" else gpu_model
    work = Path(tempfile.mkdtemp(prefix="micro-batches-"))
    corpus, tok = sample_corpus_and_bpe(work, model["vocab_size"], a.corpus, a.tokenizer)
    ks = [int(x) for x in a.micro_batches.split(",")]
    every = max(1, a.steps // 4)
    res: dict = {k: [] for k in ks}
    for r in range(a.rounds):
        for k in ks:
            cfg = ContextTrainConfig.model_validate({
                "model": model, "lr": 1e-3, "warmup_steps": 50, "heldout_percent": 5.0 if not a.corpus else 0.5,
                "heldout_windows": 64, "batch_tokens": 4096, "micro_batches": k, "max_steps": a.steps,
                "eval_every": 10**7, "checkpoint_every": 10**7, "log_every": every, "executor": "inline",
                "use_gpu": "no", "bf16": "off", "torch_threads": a.threads})
            out = work / f"k{k}-r{r}"
            train_context(corpus, str(out), cfg, tokenizer_from=tok, force_new=True)
            h = json.loads((out / "runs" / "shared" / "history.json").read_text())
            first, last = h[1], h[-1]  # the first quarter's steps hold start-up
            cpu = last["cpu_s"] - first["cpu_s"]
            target = last["target_tokens_seen"] - first["target_tokens_seen"]
            row = {"micro_batches": k, "round": r, "cpu_s_per_step": cpu / (last["step"] - first["step"]),
                   "cpu_s_per_1k_target_tokens": 1000 * cpu / target,
                   "padding": 1 - (last["tokens_seen"] - first["tokens_seen"])
                   / (last["padded_tokens_seen"] - first["padded_tokens_seen"])}
            res[k].append(row)
            print(json.dumps(row), flush=True)
    med = {k: {m: statistics.median(x[m] for x in rows) for m in ("cpu_s_per_step", "cpu_s_per_1k_target_tokens",
                                                                   "padding")} for k, rows in res.items()}
    base = med[ks[0]]["cpu_s_per_1k_target_tokens"]
    lines = [f"Machine: {machine()}", "",
             f"`python bench/micro_batches_cpu.py --model {a.model} --rounds {a.rounds} --steps {a.steps} "
             f"--threads {a.threads}{' --corpus ' + a.corpus if a.corpus else ''}`: BART d_model {model['d_model']}, "
             f"{model['encoder_layers']}+{model['decoder_layers']} layers, vocabulary {model['vocab_size']}, 4,096 "
             f"padded tokens a step, fp32, {a.threads} thread(s); medians over {a.rounds} alternating round(s)", "",
             "| micro_batches | CPU-s a step | CPU-s per 1,000 target tokens | against the first | padding |",
             "|---:|---:|---:|---:|---:|"]
    for k in ks:
        m = med[k]
        lines.append(f"| {k} | {m['cpu_s_per_step']:.3f} | {m['cpu_s_per_1k_target_tokens']:.3f} | "
                     f"{m['cpu_s_per_1k_target_tokens'] / base:.2f}x | {m['padding']:.1%} |")
    out = Path(a.out or ROOT / "bench" / "results" / f"micro_batches_cpu_{a.model}")
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(), "args": vars(a), "runs": res}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
