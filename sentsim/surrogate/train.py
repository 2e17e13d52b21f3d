"""Surrogate training on Ray Train: TorchTrainer, DDP over `num_workers`, data streamed by ray.data.

Stages: "harvest" (fit the harvested Origin scores, paper section 3.4) and optionally
"finetune-sts" (continue on STS-B train with L2, section 4.1). Each stage keeps its Ray Train run
under OUT/ray/<stage>; running the same command again with the same --out resumes from the latest
checkpoint (model, optimizer, scheduler, step and curves), and a finished stage is not redone.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from sentsim.config import fingerprint
from sentsim.errors import UsageError
from sentsim.surrogate.config import SurrogateConfig


class TrainingDiverged(UsageError):
    """The loss stopped being finite; the message names the stage and the step."""


# Settings a resumed run may change: how long and how wide to train, not what is trained.
RESUMABLE_KEYS = ("epochs", "max_steps", "eval_every", "num_workers", "cpus_per_worker", "use_gpu", "checkpoints_to_keep")


def quiet_progress() -> None:
    """Per-step progress bars from ray.data and transformers would bury the curves in job logs."""
    try:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    except ImportError:
        pass
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# ----------------------------------------------------------------------------- worker side


def _collect(shard, limit: int) -> dict:
    """Materialise a (small, capped) dev/test split on the worker: lists of s1, s2, score."""
    s1, s2, y = [], [], []
    for batch in shard.iter_batches(batch_size=1024, batch_format="numpy"):
        s1 += [str(x) for x in batch["s1"]]
        s2 += [str(x) for x in batch["s2"]]
        y += [float(x) for x in batch["score"]]
        if len(y) >= limit:
            break
    return {"s1": s1[:limit], "s2": s2[:limit], "score": np.asarray(y[:limit], dtype=np.float64)}


def predict(model, tok, arch: str, s1, s2, max_len: int, batch_size: int, device, autocast) -> np.ndarray:
    """Surrogate predictions; the Siamese form encodes each unique sentence once (its whole point)."""
    import torch

    from sentsim.surrogate.models import tokenize

    model.eval()
    out = []
    with torch.no_grad(), autocast():
        if arch == "cross":
            for i in range(0, len(s1), batch_size):
                out.append(model(tokenize(tok, "cross", s1[i:i + batch_size], s2[i:i + batch_size], max_len, device)).float().cpu())
            model.train()
            return torch.cat(out).numpy().astype(np.float64)
        uniq = sorted(set(s1) | set(s2), key=len)  # length-sorted: less padding per batch
        vecs = {}
        for i in range(0, len(uniq), batch_size):
            chunk = uniq[i:i + batch_size]
            enc = tok(chunk, padding=True, truncation=True, max_length=max_len, return_tensors="pt").to(device)
            emb = model.embed(**enc).float().cpu()
            vecs.update(zip(chunk, emb))
    model.train()
    a = torch.stack([vecs[s] for s in s1])
    b = torch.stack([vecs[s] for s in s2])
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy().astype(np.float64)


def _metrics(pred: np.ndarray, y: np.ndarray, prefix: str) -> dict:
    from scipy.stats import spearmanr

    rho = spearmanr(pred, y).statistic if len(y) > 1 and np.ptp(pred) > 0 and np.ptp(y) > 0 else float("nan")
    return {f"{prefix}_l2": float(np.mean((pred - y) ** 2)), f"{prefix}_spearman": float(rho) * 100.0}


def train_loop_per_worker(config: dict):
    """Runs on every Ray Train worker. Returns rank 0's summary (history, nan_step) to the driver."""
    import os

    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from sentsim.losses import LOSSES
    from sentsim.surrogate.models import build_model, save_hf, tokenize

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_progress()
    t_start = time.perf_counter()
    cfg = SurrogateConfig.model_validate(config["cfg"])
    st = config["stage"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cpu" and "cpu_threads" in config:
        torch.set_num_threads(config["cpu_threads"])  # fractional-CPU workers must not grab every core

    state, history = None, []
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:  # resume: weights, optimizer, schedule, position and curves
        with ckpt.as_directory() as d:
            model, tok = build_model(cfg.arch, str(Path(d) / "model"), "pretrained", seed=cfg.seed)
            state = torch.load(Path(d) / "state.pt", map_location="cpu", weights_only=False)
            history = json.loads((Path(d) / "history.json").read_text())
    else:
        model, tok = build_model(cfg.arch, st["backbone"], st["init"], cfg.scratch.model_dump(), cfg.seed)
    model.to(device)
    ddp = ray.train.torch.prepare_model(model) if world > 1 else model
    raw = model  # unwrapped, for saving and for evaluation on rank 0

    params = [p for p in raw.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=st["lr"], weight_decay=cfg.weight_decay)
    total = st["total_steps"]
    warm = max(1, int(cfg.warmup_ratio * total))
    # linear warm-up then linear decay to zero, the usual BERT fine-tuning schedule
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    step = state["step"] if state else 0
    epoch0 = state["epoch"] if state else 0
    skip = state["batches_in_epoch"] if state else 0

    use_bf16 = device.type == "cuda" and cfg.bf16 and torch.cuda.is_bf16_supported()
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else nullcontext
    loss_obj = LOSSES[cfg.loss]()

    t_model = time.perf_counter() - t_start
    dev = _collect(ray.train.get_dataset_shard("dev"), cfg.eval_max_pairs)
    test = _collect(ray.train.get_dataset_shard("test"), cfg.eval_max_pairs)
    if rank == 0:
        n_params = sum(p.numel() for p in params)
        print(f"[surrogate {st['name']}] {world} worker(s) on {device}{' bf16' if use_bf16 else ''}; "
              f"{n_params / 1e6:.1f}M trainable parameters; model ready in {t_model:.1f}s, "
              f"dev/test ({len(dev['score'])}/{len(test['score'])} pairs) read in {time.perf_counter() - t_start - t_model:.1f}s; "
              f"{'resuming at step ' + str(step) if state else 'starting'}, {total} steps", flush=True)

    def evaluate() -> dict:
        m = {}
        for name, d in (("dev", dev), ("test", test)):
            pred = predict(raw, tok, cfg.arch, d["s1"], d["s2"], cfg.max_seq_length, cfg.eval_batch_size, device, autocast)
            m.update(_metrics(pred, d["score"], name))
        return m

    def report(point: dict, epoch: int, in_epoch: int) -> None:
        """Every worker reports (Ray Train synchronises on it); rank 0 attaches the checkpoint."""
        if rank != 0:
            ray.train.report({}, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as tmp:
            save_hf(raw, tok, Path(tmp) / "model")
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step,
                        "epoch": epoch, "batches_in_epoch": in_epoch}, Path(tmp) / "state.pt")
            (Path(tmp) / "history.json").write_text(json.dumps(history))
            ray.train.report(point, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    if step == 0 and rank == 0 and not history:
        history.append({"step": 0, "epoch": 0, "train_loss": None, "lr": 0.0, **evaluate(), "time_s": 0.0})

    train_shard = ray.train.get_dataset_shard("train")
    t0 = time.perf_counter() - (history[-1]["time_s"] if history else 0.0)
    running, n_running = 0.0, 0
    last_reported = step if state else -1
    epoch = epoch0
    for epoch in range(epoch0, st["epochs"]):
        if step >= total:
            break
        in_epoch = 0
        batches = train_shard.iter_batches(
            batch_size=st["batch_size"], batch_format="numpy", drop_last=False,
            local_shuffle_buffer_size=cfg.shuffle_buffer or None, local_shuffle_seed=cfg.seed + epoch,
        )
        for batch in batches:
            if in_epoch < skip:  # resumed mid-epoch: pass over the batches already trained on
                in_epoch += 1
                continue
            enc = tokenize(tok, cfg.arch, [str(x) for x in batch["s1"]], [str(x) for x in batch["s2"]], cfg.max_seq_length, device)
            y = torch.as_tensor(np.asarray(batch["score"], dtype=np.float32), device=device)
            with autocast():
                pred = ddp(enc)
            loss = loss_obj.on_scores(pred, y)
            bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0], device=device)
            if world > 1:
                dist.all_reduce(bad)  # every rank must stop together, or DDP would hang
            step += 1
            in_epoch += 1
            if bad.item() > 0:
                value = float(loss.detach().cpu())
                if rank == 0:
                    ray.train.report({"nan_step": step, "nan_value": str(value)}, checkpoint=None)
                else:
                    ray.train.report({}, checkpoint=None)
                return {"nan_step": step, "nan_value": str(value), "history": history}
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            running += float(loss.detach())
            n_running += 1
            if step % st["eval_every"] == 0 or step >= total:
                point = {"step": step, "epoch": epoch, "train_loss": running / max(1, n_running),
                         "lr": sched.get_last_lr()[0], "time_s": time.perf_counter() - t0}
                if rank == 0:
                    point.update(evaluate())
                    history.append(point)
                    print(f"[surrogate {st['name']}] step {step}/{total} loss {point['train_loss']:.4g} "
                          f"dev L2 {point['dev_l2']:.4g} dev/test Spearman vs teacher "
                          f"{point['dev_spearman']:.2f}/{point['test_spearman']:.2f} ({point['time_s']:.0f}s)", flush=True)
                running, n_running = 0.0, 0
                report(point, epoch, in_epoch)
                last_reported = step
            if step >= total:
                break
        skip = 0
    if last_reported != step:  # the data ran out before total_steps (e.g. uneven estimate)
        point = {"step": step, "epoch": epoch, "train_loss": running / max(1, n_running) if n_running else None,
                 "lr": sched.get_last_lr()[0], "time_s": time.perf_counter() - t0}
        if rank == 0:
            point.update(evaluate())
            history.append(point)
        report(point, epoch, 0)
    return {"history": history, "step": step} if rank == 0 else None


# ----------------------------------------------------------------------------- driver side


def _plot_curves(history: list[dict], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(steps, [h["dev_l2"] for h in history], marker="o")
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("dev L2 (mean squared error vs targets)")
    ax2.plot(steps, [h["dev_spearman"] for h in history], marker="o", label="dev")
    ax2.plot(steps, [h["test_spearman"] for h in history], marker="s", label="test")
    ax2.set_xlabel("step")
    ax2.set_ylabel("Spearman x100 vs targets")  # teacher scores; STS gold when fine-tuning
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _use_gpu(cfg: SurrogateConfig) -> bool:
    import ray

    if cfg.use_gpu is not None:
        return cfg.use_gpu
    return ray.cluster_resources().get("GPU", 0) >= cfg.num_workers


def run_stage(name: str, datasets: dict, n_train: int, spec: dict, cfg: SurrogateConfig, out: Path) -> dict:
    """Train one stage on Ray Train and export its model; returns the stage summary."""
    import ray.train
    from ray.train.torch import TorchTrainer

    use_gpu = _use_gpu(cfg)
    rows_per_worker = n_train // cfg.num_workers  # streaming_split(equal=True) gives each the same
    if rows_per_worker < 1:
        raise UsageError(f"stage {name}: {n_train} training pairs cannot feed {cfg.num_workers} workers")
    steps_per_epoch = math.ceil(rows_per_worker / spec["batch_size"])
    total = spec["epochs"] * steps_per_epoch
    if spec["max_steps"]:
        total = min(total, spec["max_steps"])
    spec = {**spec, "total_steps": total, "name": name}
    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    loop_config = {"cfg": cfg.model_dump(), "stage": spec, "cpu_threads": max(1, int(round(cfg.cpus_per_worker)))}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=name, storage_path=str((out / "ray").resolve()),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoints_to_keep),
        ),
        datasets=datasets,
        # only train is sharded; every worker sees the (capped) dev and test splits whole
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
    )
    t0 = time.perf_counter()
    result = trainer.fit()
    print(f"[surrogate {name}] Ray Train run finished in {time.perf_counter() - t0:.0f}s", flush=True)
    rv = result.return_value or {}
    if rv.get("nan_step"):
        raise TrainingDiverged(
            f"stage {name}: the training loss became {rv['nan_value']} at step {rv['nan_step']}; "
            "training stopped (check the scores' scale, or lower --set lr=...)"
        )
    if result.checkpoint is None:
        raise RuntimeError(f"stage {name}: training ended without a checkpoint")
    history = rv.get("history")
    model_dir = out / ("model" if name == "harvest" else "model-sts")
    from sentsim.surrogate.models import export_model

    with result.checkpoint.as_directory() as d:
        if history is None:
            history = json.loads((Path(d) / "history.json").read_text())
        export_model(Path(d) / "model", model_dir, cfg.arch, cfg.max_seq_length)
    curves = out / "curves"
    curves.mkdir(parents=True, exist_ok=True)
    (curves / f"{name}.json").write_text(json.dumps(history, indent=2))
    _plot_curves(history, curves / f"{name}.png", f"surrogate ({cfg.arch}, {spec['init']}) - {name}")
    return {"stage": name, "model": str(model_dir), "train_pairs": n_train, "total_steps": total,
            "gpu": use_gpu, "first": history[0], "last": history[-1]}


def train_surrogate(cfg: SurrogateConfig, *, data: str | None, backbone: str, out: str,
                    finetune_sts: str | None = None, address: str | None = None, restart: bool = False) -> dict:
    """Validate every input, then run the stages. Returns the run summary (also OUT/summary.json)."""
    from sentsim.surrogate.data import harvest_datasets, inspect_harvest, stsb_datasets
    from sentsim.surrogate.models import check_backbone

    if not data and not finetune_sts:
        raise UsageError("give --data HARVEST_DIR, --finetune-sts STSB_DIR, or both")
    # every check that can fail does so here, before Ray or any worker starts
    harvest = inspect_harvest(data) if data else None
    bb = check_backbone(backbone, cfg.init)
    if finetune_sts:
        from sentsim.evaluation.datasets import locate_task

        if locate_task(Path(finetune_sts), "STSb-train") is None:
            raise UsageError(f"--finetune-sts {finetune_sts}: no sts-train.csv there (STS-B folder expected)")
    if harvest and cfg.loss == "cosine_regression" and (harvest.score_range[0] < -1 or harvest.score_range[1] > 1):
        print(f"warning: harvested scores span {harvest.score_range}, outside a cosine's [-1, 1]")
    out_dir = Path(out)
    what = {k: v for k, v in cfg.model_dump().items() if k not in RESUMABLE_KEYS}
    run_id = fingerprint(what, harvest.summary() if harvest else None, bb, finetune_sts)
    run_file = out_dir / "run.json"
    if restart and (out_dir / "ray").exists():
        shutil.rmtree(out_dir / "ray")
    elif run_file.is_file() and (out_dir / "ray").exists():
        prev = json.loads(run_file.read_text()).get("fingerprint")
        if prev != run_id:
            raise UsageError(
                f"--out {out} holds a run with other settings (fingerprint {prev}, now {run_id}); "
                "use a new --out, or --restart to discard it"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps({"fingerprint": run_id, "config": cfg.model_dump(), "backbone": bb,
                                    "data": harvest.summary() if harvest else None, "finetune_sts": finetune_sts}, indent=2))

    from sentsim.runtime import init_ray

    quiet_progress()
    init_ray(address)
    stages = []
    current_backbone, current_init = backbone, cfg.init
    if harvest:
        spec = {"backbone": bb["path"], "init": cfg.init, "epochs": cfg.epochs, "batch_size": cfg.batch_size,
                "lr": cfg.lr, "eval_every": cfg.eval_every, "max_steps": cfg.max_steps}
        stages.append(run_stage("harvest", harvest_datasets(harvest, cfg.eval_max_pairs), harvest.scored["train"], spec, cfg, out_dir))
        current_backbone, current_init = stages[-1]["model"], "pretrained"
    if finetune_sts:
        ds, counts = stsb_datasets(finetune_sts)
        ft = cfg.finetune
        spec = {"backbone": str(current_backbone), "init": current_init, "epochs": ft.epochs, "batch_size": ft.batch_size,
                "lr": ft.lr, "eval_every": ft.eval_every, "max_steps": ft.max_steps}
        stages.append(run_stage("finetune-sts", ds, counts["train"], spec, cfg, out_dir))
    summary = {"fingerprint": run_id, "stages": stages}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
