"""`sentsim train discriminator`: Ray Train (TorchTrainer) over the corpus windows.

Every worker reads the corpus and the saved vocabulary itself (paths, not data, travel in the
config), takes every world_size-th training window, and trains the same model under DDP (gloo
on CPU) when there are several workers. Rank 0 evaluates held-out windows (whole held-out
documents; the window tail when the corpus has one document) and reports accuracy and AUC,
overall and per negative type. The final checkpoint holds model.safetensors and metrics.json.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from pydantic import Field

from sentsim.config import Section, fingerprint
from sentsim.discriminator.model import ModelConfig
from sentsim.errors import UsageError


class TrainConfig(Section):
    epochs: int = Field(1, ge=1)
    # Steps per worker; None runs the epochs out.
    max_steps: Optional[int] = Field(None, ge=1)
    # Windows per step; each window gives one positive and one negative.
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    # Paper 003 §3.2.1: half of the replacements from the same document, half random.
    same_doc_frac: float = Field(0.5, ge=0.0, le=1.0)
    heldout_frac: float = Field(0.1, gt=0.0, lt=1.0)
    max_heldout_windows: int = Field(2000, ge=1)
    max_train_windows: Optional[int] = Field(None, ge=1)
    eval_every: Optional[int] = Field(None, ge=1)
    num_workers: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    seed: int = 0


class DiscriminatorJob(Section):
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()


# ---------------------------------------------------------------- worker side


def _load_worker_data(corpus: str, vocab_path: str, mcfg: ModelConfig, tcfg: TrainConfig):
    from sentsim.discriminator.data import doc_ranges, split_heldout, window_centres
    from sentsim.discriminator.vocab import Vocab
    from sentsim.retrieval.corpus_view import SentenceTable

    st = SentenceTable.load(corpus)
    vocab = Vocab.load(vocab_path)
    toks = [vocab.encode(t, mcfg.max_tokens) for t in st.texts]
    centres = window_centres(st.ids, mcfg.window)
    train_c, held_c, how = split_heldout(st.ids, centres, tcfg.heldout_frac, tcfg.seed)
    rng = np.random.default_rng(tcfg.seed + 1)
    if tcfg.max_train_windows and len(train_c) > tcfg.max_train_windows:
        train_c = np.sort(rng.choice(train_c, tcfg.max_train_windows, replace=False))
    if len(held_c) > tcfg.max_heldout_windows:
        held_c = np.sort(rng.choice(held_c, tcfg.max_heldout_windows, replace=False))
    starts, ends, _ = doc_ranges(st.ids)
    return dict(ids=st.ids, toks=toks, train=train_c, held=held_c, split=how, starts=starts, ends=ends, vocab=vocab)


def _run_batch(model, data, centres, negatives, window):
    import torch

    from sentsim.discriminator.data import batch_windows
    from sentsim.discriminator.model import pad_batch

    uniq, L, C, R, y = batch_windows(centres, negatives, window)
    tok, lens = pad_batch([data["toks"][p] for p in uniq])
    logits = model(tok, lens, torch.from_numpy(L), torch.from_numpy(C), torch.from_numpy(R))
    return logits, torch.from_numpy(y)


def evaluate(model, data, window: int, same_doc_frac: float, seed: int, batch: int = 128) -> dict:
    import torch
    from sklearn.metrics import roc_auc_score

    from sentsim.discriminator.data import sample_negatives
    from sentsim.retrieval.corpus_view import DOC_SHIFT

    held = data["held"]
    rng = np.random.default_rng(seed + 12345)
    negs = sample_negatives(held, data["ids"], data["starts"], data["ends"], same_doc_frac, rng)
    # which negatives came from the same document (for the per-type AUC)
    same = (data["ids"][negs] >> DOC_SHIFT) == (data["ids"][held] >> DOC_SHIFT)
    was_training = model.training
    model.eval()
    pos, neg = [], []
    with torch.inference_mode():
        for lo in range(0, len(held), batch):
            logits, _ = _run_batch(model, data, held[lo:lo + batch], negs[lo:lo + batch], window)
            p = torch.sigmoid(logits).numpy()
            B = len(held[lo:lo + batch])
            pos.append(p[:B])
            neg.append(p[B:])
    model.train(was_training)
    pos, neg = np.concatenate(pos), np.concatenate(neg)
    y = np.concatenate([np.ones_like(pos), np.zeros_like(neg)])
    s = np.concatenate([pos, neg])
    out = {
        "heldout_windows": int(len(held)),
        "heldout_accuracy": float(((s > 0.5) == (y > 0.5)).mean()),
        "heldout_auc": float(roc_auc_score(y, s)),
    }
    for name, m in (("same_doc", same), ("random", ~same)):
        if m.any():
            yy = np.concatenate([np.ones(m.sum()), np.zeros(m.sum())])
            out[f"heldout_auc_{name}"] = float(roc_auc_score(yy, np.concatenate([pos[m], neg[m]])))
    return out


def train_loop(config: dict, report: Callable[[dict, Optional[str]], None] | None = None,
               rank: int = 0, world: int = 1, wrap: Callable | None = None) -> None:
    """The training loop; Ray Train calls `train_loop_per_worker` which supplies report/rank/wrap."""
    import torch

    from sentsim.discriminator.data import sample_negatives
    from sentsim.discriminator.model import CoherenceModel

    mcfg = ModelConfig.model_validate(config["model"])
    tcfg = TrainConfig.model_validate(config["train"])
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    torch.manual_seed(tcfg.seed)
    data = _load_worker_data(config["corpus"], config["vocab_path"], mcfg, tcfg)
    model = CoherenceModel(len(data["vocab"]), mcfg)
    if config.get("embed_init_path"):
        import torch as _t

        init = np.load(config["embed_init_path"], allow_pickle=False)
        with _t.no_grad():
            model.encoder.embed.weight.copy_(_t.from_numpy(init))
    if wrap is not None:
        model = wrap(model)
    core = model.module if hasattr(model, "module") else model
    opt = torch.optim.AdamW(model.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    mine = data["train"][rank::world]
    if len(data["train"]) < world:
        raise UsageError(f"{len(data['train'])} training windows cannot feed {world} workers")
    # every rank runs the same number of steps (DDP needs it): the smallest shard decides
    steps_per_epoch = max(1, math.ceil((len(data["train"]) // world) / tcfg.batch_size))
    total = tcfg.max_steps or steps_per_epoch * tcfg.epochs
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=tcfg.lr, total_steps=total, pct_start=0.1)
    eval_every = tcfg.eval_every or total
    history = []
    step, epoch, t0, losses = 0, 0, time.perf_counter(), []
    if rank == 0 and config.get("eval_at_start", True):
        history.append({"step": 0, "epoch": 0, **evaluate(core, data, mcfg.window, tcfg.same_doc_frac, tcfg.seed)})
    model.train()
    while step < total:
        rng = np.random.default_rng(tcfg.seed * 1000 + epoch * 10 + rank)
        order = rng.permutation(mine)
        for lo in range(0, len(order), tcfg.batch_size):
            if step >= total:
                break
            c = order[lo:lo + tcfg.batch_size]
            if len(c) < tcfg.batch_size and len(order) >= tcfg.batch_size:
                continue
            n = sample_negatives(c, data["ids"], data["starts"], data["ends"], tcfg.same_doc_frac, rng)
            logits, y = _run_batch(model, data, c, n, mcfg.window)
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            step += 1
            if step % eval_every == 0 or step == total:
                final = step == total
                metrics = {"step": step, "epoch": epoch, "train_loss": float(np.mean(losses[-50:])),
                           "train_seconds": round(time.perf_counter() - t0, 2), "heldout_split": data["split"],
                           "train_windows": int(len(data["train"])), "world_size": world}
                if rank == 0:
                    metrics.update(evaluate(core, data, mcfg.window, tcfg.same_doc_frac, tcfg.seed))
                history.append(metrics)
                ckpt_dir = None
                if final and rank == 0:
                    ckpt_dir = tempfile.mkdtemp(prefix="disc-ckpt-")
                    from safetensors.torch import save_file

                    save_file({k: v.detach().contiguous().cpu() for k, v in core.state_dict().items()},
                              os.path.join(ckpt_dir, "model.safetensors"))
                    Path(ckpt_dir, "metrics.json").write_text(json.dumps(history, indent=2))
                if report is not None:
                    report(metrics, ckpt_dir)
        epoch += 1


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    world, rank = ctx.get_world_size(), ctx.get_world_rank()

    def report(metrics, ckpt_dir):
        ckpt = ray.train.Checkpoint.from_directory(ckpt_dir) if ckpt_dir else None
        ray.train.report(metrics, checkpoint=ckpt)

    def wrap(model):
        return ray.train.torch.prepare_model(model) if world > 1 else model

    train_loop(config, report=report, rank=rank, world=world, wrap=wrap)


# ---------------------------------------------------------------- driver side


def ensure_ray(address: str | None = None, num_cpus: float | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)


def train_discriminator(corpus: str | Path, out: str | Path, job: DiscriminatorJob | None = None,
                        address: str | None = None) -> dict:
    """Build the vocabulary, train on Ray Train, save model + vocab + config into `out`."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from sentsim.discriminator.io import save_config
    from sentsim.discriminator.vocab import Vocab
    from sentsim.retrieval.corpus_view import SentenceTable, corpus_fingerprint

    job = job or DiscriminatorJob()
    corpus = Path(corpus).resolve()
    out = Path(out).resolve()
    corpus_fp = corpus_fingerprint(corpus)
    st = SentenceTable.load(corpus)
    if len(st) == 0:
        raise UsageError(f"{corpus}: the corpus has no sentences")
    from sentsim.discriminator.data import window_centres

    n_windows = len(window_centres(st.ids, job.model.window))
    if n_windows < 2:
        raise UsageError(
            f"{corpus}: only {n_windows} window(s) of {2 * job.model.window + 1} consecutive sentences of one "
            f"document; the discriminator needs at least 2 (lower model.window or add documents)"
        )
    vocab = Vocab.build(st.texts, job.model.vocab_size, job.model.min_count)
    if len(vocab) <= 3:
        vocab = Vocab.build(st.texts, job.model.vocab_size, 1)
    out.mkdir(parents=True, exist_ok=True)
    vocab.save(out / "vocab.json")
    init_path = None
    if job.model.embed_init == "lsa":
        from sentsim.discriminator.embed_init import lsa_embeddings

        emb = lsa_embeddings([vocab.encode(t, job.model.max_tokens) for t in st.texts], len(vocab),
                             job.model.embed_dim, seed=job.train.seed)
        init_path = out / "_embed_init.npy"
        np.save(init_path, emb, allow_pickle=False)
    del st

    ensure_ray(address)
    storage = out / "_ray_train"
    shutil.rmtree(storage, ignore_errors=True)  # never resume a half-finished earlier run by accident
    config = {"corpus": str(corpus), "vocab_path": str(out / "vocab.json"),
              "model": job.model.model_dump(), "train": job.train.model_dump(),
              "threads": max(1, int(job.train.cpus_per_worker)),
              "embed_init_path": str(init_path) if init_path else None}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=job.train.num_workers, use_gpu=False,
                                     resources_per_worker={"CPU": job.train.cpus_per_worker}),
        run_config=RunConfig(name=f"discriminator-{fingerprint(config)}", storage_path=str(storage)),
    )
    t0 = time.perf_counter()
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"discriminator training ended without a checkpoint: {result.error}")
    with result.checkpoint.as_directory() as d:
        shutil.copy(Path(d) / "model.safetensors", out / "model.safetensors")
        history = json.loads((Path(d) / "metrics.json").read_text())
    shutil.rmtree(storage, ignore_errors=True)
    if init_path is not None:
        init_path.unlink(missing_ok=True)
    final = history[-1]
    final["fit_seconds"] = round(time.perf_counter() - t0, 2)
    save_config(out, job, corpus_fp, vocab, final, history)
    return final
