"""Training of the context models (paper §3.2.2) on windows streamed from the corpus Parquet.

`train_context(corpus, out, config)`:
  1. tokenizer: byte-level BPE trained on the corpus' training documents (or the warm-start checkpoint's
     WordPiece, or `tokenizer_from`);
  2. one training run per model: with `model.layout=shared` (or a single direction) one run; with
     `layout=separate` and `direction=all` three runs, one per direction. Each run is a Ray Train
     `TorchTrainer` (DDP over `num_workers`, fractional CPUs per worker, GPU + bf16 autocast when
     present), or the same loop in-process with `executor=inline`;
  3. Adam(lr 1e-4, betas 0.9/0.999) with warm-up and an inverse-sqrt / linear / constant schedule;
  4. every `eval_every` steps rank 0 measures, on held-out documents and per direction, the token
     log-likelihood, perplexity and the **context-use gap** (held-out loss with the sources shuffled
     across examples minus the loss with the true sources, nats/token), and writes a checkpoint;
  5. a killed run resumes from its last checkpoint (model, optimiser, step, tokens seen) when started
     again with the same `--out`; the data stream restarts with a step-dependent seed;
  6. the final bundle (tokenizer.json, context.json, models/<name>/) is written to `out`.

Checkpoints live in `out/runs/<name>/checkpoints/step-NNNNNNNN/` (written atomically by rank 0) and
hold `model/` (safetensors), `optimizer.pt` (tensors only; read with `torch.load(weights_only=True)`)
and `state.json`.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from sentsim.context.config import DIRECTIONS, ContextTrainConfig
from sentsim.context.model import (ContextModel, build_model, init_cross_attention_from_self, new_parameter_names,
                                   save_bundle, warm_start_tokenizer)
from sentsim.context.tokenizer import ContextTokenizer, train_bpe
from sentsim.context.windows import Example, build_example, iter_documents
from sentsim.errors import UsageError

# --------------------------------------------------------------------------------------------------- data


def prepare_tokenizer(cfg: ContextTrainConfig, corpus: str, tokenizer_from: str = "") -> ContextTokenizer:
    if cfg.model.arch == "warm_start" or cfg.model.pretrained_path:
        return warm_start_tokenizer(cfg.model)
    if tokenizer_from:
        return ContextTokenizer.load(tokenizer_from)

    def texts():
        n = 0
        for doc in iter_documents(corpus, cfg.heldout_percent, "train"):
            for s in doc:
                yield s
                n += 1
                if n >= cfg.tokenizer_sentences:
                    return

    return train_bpe(texts(), cfg.model.vocab_size)


def _examples_of_doc(doc, tok, cfg: ContextTrainConfig, directions) -> Iterator[Example]:
    mc = cfg.model
    k = mc.context_sentences
    enc = tok.encode(doc)
    for i in range(len(doc)):
        if len(enc[i]) < cfg.min_sentence_tokens:
            continue
        left, right = enc[max(0, i - k):i], enc[i + 1:i + 1 + k]
        for d in directions:
            ex = build_example(tok.ids, k, d, left, enc[i], right, mc.max_source_tokens, mc.max_target_tokens)
            if ex is not None:
                yield ex


def collate(exs: list[Example], pad_id: int, bos_id: int) -> dict:
    B = len(exs)
    S = max(len(e.src) for e in exs)
    T = max(len(e.tgt) for e in exs)
    src = torch.full((B, S), pad_id, dtype=torch.long)
    src_slots = torch.zeros((B, S), dtype=torch.long)
    src_mask = torch.zeros((B, S), dtype=torch.long)
    dec_in = torch.full((B, T), pad_id, dtype=torch.long)
    dec_slots = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for r, e in enumerate(exs):
        s, t = len(e.src), len(e.tgt)
        src[r, :s] = torch.tensor(e.src)
        src_slots[r, :s] = torch.tensor(e.src_slots)
        src_mask[r, :s] = 1
        dec_in[r, 0] = bos_id
        dec_in[r, 1:t] = torch.tensor(e.tgt[:-1], dtype=torch.long)
        dec_slots[r, 1:t] = torch.tensor(e.tgt_slots[:-1], dtype=torch.long)
        labels[r, :t] = torch.tensor(e.tgt)
    return {"src": src, "src_slots": src_slots, "src_mask": src_mask, "dec_in": dec_in, "dec_slots": dec_slots,
            "labels": labels}


def token_batches(exs: list[Example], budget: int, rng: Optional[random.Random] = None) -> list[list[Example]]:
    """Sort by length, cut into batches of at most `budget` padded (source + target) tokens."""
    exs = sorted(exs, key=lambda e: (len(e.tgt) + len(e.src), len(e.tgt)))
    out, cur, ms, mt = [], [], 0, 0
    for e in exs:
        ns, nt = max(ms, len(e.src)), max(mt, len(e.tgt))
        if cur and (len(cur) + 1) * (ns + nt) > budget:
            out.append(cur)
            cur, ns, nt = [], len(e.src), len(e.tgt)
        cur.append(e)
        ms, mt = ns, nt
    if cur:
        out.append(cur)
    if rng is not None:
        rng.shuffle(out)
    return out


def train_batches(corpus: str, tok: ContextTokenizer, cfg: ContextTrainConfig, directions, rank: int, world: int,
                  seed: int) -> Iterator[dict]:
    """Endless stream of collated batches from this worker's shard of the training documents."""
    rng = random.Random(seed * 1_000_003 + rank)
    epoch = 0
    while True:
        buf: list[Example] = []
        produced = 0
        for doc in iter_documents(corpus, cfg.heldout_percent, "train", rank, world):
            for ex in _examples_of_doc(doc, tok, cfg, directions):
                buf.append(ex)
                produced += 1
            if len(buf) >= cfg.shuffle_buffer:
                for b in token_batches(buf, cfg.batch_tokens, rng):
                    yield collate(b, tok.pad_id, tok.bos_id)
                buf = []
        if buf:
            for b in token_batches(buf, cfg.batch_tokens, rng):
                yield collate(b, tok.pad_id, tok.bos_id)
        if produced == 0:
            raise UsageError(f"{corpus}: no training windows for worker {rank}/{world} "
                             f"(corpus too small for heldout_percent={cfg.heldout_percent} and {world} workers?)")
        epoch += 1


def heldout_examples(corpus: str, tok: ContextTokenizer, cfg: ContextTrainConfig, directions) -> dict:
    """Per direction, up to `heldout_windows` examples from the held-out documents (fixed sample)."""
    pool = {d: [] for d in directions}
    cap = cfg.heldout_windows * 20
    for doc in iter_documents(corpus, cfg.heldout_percent, "heldout"):
        for d in directions:
            if len(pool[d]) < cap:
                pool[d].extend(_examples_of_doc(doc, tok, cfg, [d]))
        if all(len(v) >= cap for v in pool.values()):
            break
    rng = random.Random(1234)
    out = {}
    for d, exs in pool.items():
        if len(exs) < 2:
            raise UsageError(f"{corpus}: fewer than 2 held-out windows for direction {d!r}; "
                             f"raise heldout_percent or use a larger corpus")
        out[d] = rng.sample(exs, min(len(exs), cfg.heldout_windows))
    return out


# --------------------------------------------------------------------------------------------- evaluation


def _loss_sum(model, exs, tok, budget, device, autocast_dtype) -> tuple[float, int]:
    total, n = 0.0, 0
    for b in token_batches(exs, budget):
        t = {k: v.to(device) for k, v in collate(b, tok.pad_id, tok.bos_id).items()}
        with _autocast(device, autocast_dtype):
            logits = model(t["src"], t["src_slots"], t["src_mask"], t["dec_in"], t["dec_slots"])
        loss = F.cross_entropy(logits.float().transpose(1, 2), t["labels"], ignore_index=-100, reduction="sum")
        total += float(loss)
        n += int((t["labels"] >= 0).sum())
    return total, n


def evaluate(model: ContextModel, heldout: dict, tok: ContextTokenizer, budget: int, device=torch.device("cpu"),
             autocast_dtype=None) -> dict:
    """Per direction: held-out loss (nats/token), token log-likelihood, perplexity, and the context-use gap
    = loss with every example's source taken from another example (a derangement) - loss with its own."""
    was = model.training
    model.eval()
    out = {}
    with torch.inference_mode():
        for d, exs in heldout.items():
            s, n = _loss_sum(model, exs, tok, budget, device, autocast_dtype)
            perm = list(range(len(exs)))
            random.Random(99).shuffle(perm)
            shifted = perm[1:] + perm[:1]  # perm[i] gets the source of shifted[i] != perm[i]
            src_of = dict(zip(perm, shifted))
            shuf = [Example(exs[src_of[i]].src, exs[src_of[i]].src_slots, e.tgt, e.tgt_slots)
                    for i, e in enumerate(exs)]
            s2, n2 = _loss_sum(model, shuf, tok, budget, device, autocast_dtype)
            loss, loss_sh = s / max(n, 1), s2 / max(n2, 1)
            out[d] = {"loss": loss, "token_loglik": -loss, "perplexity": math.exp(min(loss, 50.0)),
                      "shuffled_loss": loss_sh, "context_gap": loss_sh - loss, "tokens": n, "windows": len(exs)}
    model.train(was)
    return out


def _autocast(device, dtype):
    if dtype is None or device.type != "cuda":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast("cuda", dtype=dtype)


# ------------------------------------------------------------------------------------------- checkpoints


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    d = Path(run_dir) / "checkpoints"
    best, best_step = None, -1
    if d.is_dir():
        for c in d.iterdir():
            st = c / "state.json"
            if c.name.startswith("step-") and st.is_file():
                try:
                    step = json.loads(st.read_text())["step"]
                except (ValueError, KeyError):
                    continue
                if step > best_step:
                    best, best_step = c, step
    return best


def _save_checkpoint(run_dir: Path, model: ContextModel, opt, state: dict, keep: int = 2) -> Path:
    ck = Path(run_dir) / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    final = ck / f"step-{state['step']:08d}"
    tmp = ck / f".tmp-{state['step']:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save(tmp / "model")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    olds = sorted(p for p in ck.iterdir() if p.name.startswith("step-") and p != final)
    for p in olds[:-max(keep - 1, 0)] if keep > 1 else olds:
        shutil.rmtree(p, ignore_errors=True)
    return final


def _lr_at(step: int, cfg: ContextTrainConfig) -> float:
    w = cfg.warmup_steps
    if w and step < w:
        return cfg.lr * (step + 1) / w
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "inverse_sqrt":
        return cfg.lr * math.sqrt(max(w, 1) / max(step + 1, 1)) if w else cfg.lr / math.sqrt(step + 1)
    # linear decay to 0 at max_steps
    return cfg.lr * max(0.0, (cfg.max_steps - step) / max(1, cfg.max_steps - w))


def _param_groups(model: ContextModel, cfg: ContextTrainConfig) -> list[dict]:
    """Pretrained weights at `lr`, warm-start additions at `lr * new_params_lr_scale`. The group layout is
    fixed by the config, so a resumed optimiser state always matches."""
    new = new_parameter_names(model)
    groups = {False: [], True: []}
    for n, p in model.named_parameters():
        if p.requires_grad:
            groups[n in new].append(p)
    out = [{"params": groups[False], "lr_scale": 1.0}]
    if new:
        out.append({"params": groups[True], "lr_scale": cfg.new_params_lr_scale})
    return [g for g in out if g["params"]]


# ------------------------------------------------------------------------------------------- train loop


def train_loop(loop_config: dict) -> None:
    """One worker's loop; runs under Ray Train (DDP) or in-process (`executor=inline`)."""
    cfg = ContextTrainConfig.model_validate(loop_config["config"])
    corpus, run_dir = loop_config["corpus"], Path(loop_config["run_dir"])
    directions = loop_config["directions"]
    use_ray = loop_config.get("ray", False)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    rank, world = 0, 1
    if use_ray:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        device = ray.train.torch.get_device()
    else:
        want_gpu = cfg.use_gpu == "yes" or (cfg.use_gpu == "auto" and torch.cuda.is_available())
        device = torch.device("cuda" if want_gpu else "cpu")
    amp = torch.bfloat16 if device.type == "cuda" else None
    tok = ContextTokenizer.load(loop_config["tokenizer_dir"])

    ck = latest_checkpoint(run_dir)
    state = {"step": 0, "tokens_seen": 0, "target_tokens_seen": 0, "elapsed_s": 0.0, "history": []}
    if ck is not None:
        model = ContextModel.load(ck / "model", cfg.model, tok)
        state = json.loads((ck / "state.json").read_text())
    else:
        model = build_model(cfg.model, tok, seed=cfg.seed)
        if cfg.cross_attention_from_self():
            init_cross_attention_from_self(model)
    if cfg.freeze_encoder:
        model.freeze_encoder()
    model.to(device)
    model.train()
    raw_model = model
    if use_ray and world > 1:
        import ray.train.torch

        model = ray.train.torch.prepare_model(
            model, move_to_device=False,
            parallel_strategy_kwargs={"find_unused_parameters": not cfg.model.sentence_position_embeddings})
    opt = torch.optim.Adam(_param_groups(raw_model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                           weight_decay=cfg.weight_decay)
    if ck is not None and (ck / "optimizer.pt").is_file():
        saved = torch.load(ck / "optimizer.pt", map_location=device, weights_only=True)
        if len(saved["param_groups"]) == len(opt.param_groups):
            opt.load_state_dict(saved)
        elif rank == 0:  # a checkpoint from before the warm-start parameter groups: keep weights, new Adam state
            print(f"{ck}: optimiser state has {len(saved['param_groups'])} parameter group(s), this config "
                  f"{len(opt.param_groups)}; resuming the weights with a fresh optimiser", flush=True)
    heldout = heldout_examples(corpus, tok, cfg, directions) if rank == 0 else None
    if rank == 0 and not state["history"]:
        ev = evaluate(raw_model, heldout, tok, cfg.batch_tokens, device, amp)
        state["history"].append({"step": 0, "tokens_seen": 0, "eval": ev})
        _log(run_dir, {"step": 0, "eval": ev})

    batches = train_batches(corpus, tok, cfg, directions, rank, world, seed=cfg.seed + state["step"])
    start_step = state["step"]
    t0 = time.perf_counter() - state["elapsed_s"]
    run_t0 = time.perf_counter()
    step = start_step
    while step < cfg.max_steps:
        b = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg) * g["lr_scale"]
        with _autocast(device, amp):
            logits = model(b["src"], b["src_slots"], b["src_mask"], b["dec_in"], b["dec_slots"])
        loss = F.cross_entropy(logits.float().transpose(1, 2), b["labels"], ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_([p for p in raw_model.parameters() if p.requires_grad], cfg.grad_clip)
        opt.step()
        step += 1
        n_tgt = int((b["labels"] >= 0).sum())
        state["tokens_seen"] += (int(b["src_mask"].sum()) + n_tgt) * world
        state["target_tokens_seen"] += n_tgt * world
        stop = cfg.max_seconds and (time.perf_counter() - run_t0) >= cfg.max_seconds
        if world > 1:
            flag = torch.tensor([1.0 if stop else 0.0], device=device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item() > 0)
        last = stop or step >= cfg.max_steps
        if step % cfg.eval_every == 0 or step % cfg.checkpoint_every == 0 or last:
            metrics = {"step": step, "train_loss": float(loss.detach()), "lr": opt.param_groups[0]["lr"],
                       "lr_new": opt.param_groups[-1]["lr"],
                       "tokens_seen": state["tokens_seen"], "target_tokens_seen": state["target_tokens_seen"]}
            if rank == 0:
                state["step"] = step
                state["elapsed_s"] = time.perf_counter() - t0
                metrics["elapsed_s"] = state["elapsed_s"]
                if step % cfg.eval_every == 0 or last:
                    metrics["eval"] = evaluate(raw_model, heldout, tok, cfg.batch_tokens, device, amp)
                    state["history"].append({"step": step, "tokens_seen": state["tokens_seen"],
                                             "elapsed_s": state["elapsed_s"], "eval": metrics["eval"]})
                _save_checkpoint(run_dir, raw_model, opt, state)
                _log(run_dir, metrics)
            if use_ray:
                import ray.train

                flat = {"step": step, "train_loss": metrics["train_loss"]}
                for d, ev in (metrics.get("eval") or {}).items():
                    flat[f"{d}/loss"] = ev["loss"]
                    flat[f"{d}/context_gap"] = ev["context_gap"]
                ray.train.report(flat)
        if stop:
            break


def _log(run_dir: Path, rec: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")


# ------------------------------------------------------------------------------------------- driver


def _run(loop_config: dict, cfg: ContextTrainConfig, run_dir: Path, address: Optional[str]) -> None:
    if cfg.executor == "inline":
        train_loop({**loop_config, "ray": False})
        return
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    gpus = ray.cluster_resources().get("GPU", 0)
    use_gpu = cfg.use_gpu == "yes" or (cfg.use_gpu == "auto" and gpus >= cfg.num_workers)
    res = {"CPU": cfg.cpus_per_worker}
    if use_gpu:
        res["GPU"] = 1
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={**loop_config, "ray": True},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu, resources_per_worker=res),
        run_config=RunConfig(name="ray", storage_path=str(run_dir.resolve()),
                             failure_config=FailureConfig(max_failures=2)),
    )
    trainer.fit()


def train_context(corpus: str, out: str, config: Optional[ContextTrainConfig] = None, tokenizer_from: str = "",
                  address: Optional[str] = None) -> dict:
    """Train the context model(s) and write the bundle to `out`. Returns a summary (also `out/train_summary.json`)."""
    cfg = config or ContextTrainConfig()
    out_p = Path(out)
    out_p.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tok_dir = out_p / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        tok = ContextTokenizer.load(tok_dir)  # resuming: keep the tokenizer the checkpoints were trained with
    else:
        tok = prepare_tokenizer(cfg, corpus, tokenizer_from)
        tok.save(tok_dir)
    if (cfg.model.arch == "bart" and not cfg.model.pretrained_path and tok.vocab_size > cfg.model.vocab_size
            and not tokenizer_from):
        raise UsageError(f"tokenizer has {tok.vocab_size} tokens, more than model.vocab_size={cfg.model.vocab_size}")
    dirs = list(DIRECTIONS) if cfg.direction == "all" else [cfg.direction]
    if cfg.direction == "all" and cfg.model.layout == "shared":
        runs = {"shared": dirs}
    else:
        runs = {d: [d] for d in dirs}
    summary = {"corpus": str(corpus), "config": cfg.model_dump(), "runs": {}}
    models, by_dir = {}, {}
    for name, rdirs in runs.items():
        run_dir = out_p / "runs" / name
        loop_config = {"config": cfg.model_dump(), "corpus": str(corpus), "run_dir": str(run_dir),
                       "directions": rdirs, "tokenizer_dir": str(tok_dir)}
        _run(loop_config, cfg, run_dir, address)
        ck = latest_checkpoint(run_dir)
        if ck is None:
            raise RuntimeError(f"training run {name} produced no checkpoint")
        state = json.loads((ck / "state.json").read_text())
        models[name] = ContextModel.load(ck / "model", cfg.model, tok)
        for d in rdirs:
            by_dir[d] = name
        hist = state["history"]
        summary["runs"][name] = {
            "directions": rdirs, "steps": state["step"], "tokens_seen": state["tokens_seen"],
            "target_tokens_seen": state["target_tokens_seen"], "train_seconds": state["elapsed_s"],
            "initial_eval": hist[0]["eval"] if hist else None, "final_eval": hist[-1]["eval"] if hist else None,
            "parameters": models[name].n_parameters(),
        }
    summary["wall_seconds"] = time.perf_counter() - t0
    save_bundle(out_p, cfg.model, tok, models, by_dir, extra={"trained": {
        "corpus": str(corpus), "runs": {k: {kk: vv for kk, vv in v.items() if kk != "initial_eval"}
                                        for k, v in summary["runs"].items()}}})
    (out_p / "train_summary.json").write_text(json.dumps(summary, indent=1))
    return summary
