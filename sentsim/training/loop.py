"""The worker side: one step loop for every model sentsim fits by gradient descent.

`train_loop(config)` runs on each Ray Train worker (TorchTrainer, DDP over the workers) or, with
config["ray"] false, in the calling process. What is trained is a `Trainee`, built on the worker by
config["build"](config, session, checkpoint_dir): an nn.Module whose forward(batch, device) is one
step's (loss, metrics), plus how to save itself, evaluate on held-out data and describe a log line.
A trainee may also supply its own batches (`Trainee.batches`); otherwise the loop reads the Ray
dataset shard "train" (or, inline, the table it was given).

The loop owns the rest: Adam or AdamW over the trainee's parameter groups (each group keeps its own
lr), a transformers schedule by name (linear, cosine, inverse_sqrt, constant; with warm-up), bf16
autocast on GPUs, gradient clipping, a finite-loss check and a wall-clock stop every rank agrees on,
history points every `log_every` steps, evaluation and a checkpoint every `eval_every` steps (and a
checkpoint alone every `checkpoint_every`), and resume from the latest checkpoint (weights,
optimizer, schedule, position in the epoch, history).

A checkpoint folder holds what `Trainee.save` writes (model/ as safetensors, side files), state.pt
(optimizer, scheduler, position and the trainee's extra state, read back with
torch.load(weights_only=True): nothing is unpickled) and history.json.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
from torch import nn

from sentsim.hardware import bf16_native
from sentsim.training.common import quiet_progress

STATE_FILE = "state.pt"
HISTORY_FILE = "history.json"
# keys of a history point that are not metrics (left out of the default log line)
_POINT_KEYS = ("step", "epoch", "train_loss", "lr", "time_s", "cpu_s", "precision")


class Trainee(nn.Module):
    """What the loop trains. forward(batch, device) -> (loss, metrics) is one step; the loop calls it
    through DDP when there are several workers, so every parameter it touches is synchronised."""

    # DDP must be told when some parameters may get no gradient in a step (relation rows, MLM head)
    find_unused_parameters = False

    def param_groups(self, lr: float) -> list[dict]:
        """Optimizer groups; a group's own "lr" is kept (the schedule scales every group alike)."""
        return [{"params": [p for p in self.parameters() if p.requires_grad], "lr": lr}]

    def batches(self, session, epoch: int, skip: int) -> Optional[Iterable]:
        """This worker's batches of `epoch` without the first `skip` (a resumed run), for a trainee that
        reads its own data (session.rank/world say which share is its own); may be endless. None: the
        loop reads the Ray dataset shard "train" (inline: the table it was given)."""
        return None

    def save(self, folder: Path) -> None:
        """Write folder/model (a transformers checkpoint) and any side files the export needs."""
        raise NotImplementedError

    def extra_state(self) -> dict:
        """Tensors and numbers beyond model/ that a resumed run needs (saved in state.pt)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def evaluate(self, device, autocast) -> dict:
        """Dev metrics for a history point (rank 0 only); {} when there is nothing to evaluate."""
        return {}

    def describe(self, point: dict) -> str:
        """The log line's tail after 'step N/T loss L'."""
        return "".join(f" {k} {v:.4g}" for k, v in point.items() if k not in _POINT_KEYS and isinstance(v, float))

    def note(self) -> str:
        """Extra words for the start-up line (e.g. how many dev pairs were read)."""
        return ""

    def result(self) -> dict:
        """Added to rank 0's return value (e.g. counters the run summary reports)."""
        return {}

    def budget_spent(self) -> bool:
        """True once a budget of the trainee's own (e.g. target tokens) is used up; every rank stops together."""
        return False


# schedule names of the loop -> transformers' (a constant schedule still warms up)
SCHEDULES = {"linear": "linear", "cosine": "cosine", "inverse_sqrt": "inverse_sqrt", "constant": "constant_with_warmup"}


def make_optimizer(groups: list[dict], L: dict):
    import torch

    kind = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[L.get("optimizer", "adamw")]
    # fused: one kernel for the whole update on a GPU (the for-each default launches several per tensor group)
    return kind(groups, lr=L["lr"], betas=tuple(L.get("betas") or (0.9, 0.999)), weight_decay=L["weight_decay"],
                **({"fused": True} if L.get("fused") else {}))


def make_schedule(opt, L: dict):
    """transformers' schedule by name: warm-up over `warmup_steps` (none at 0), then linear or cosine
    decay to zero at total_steps, inverse square root, or constant."""
    from transformers import get_scheduler

    return get_scheduler(SCHEDULES[L.get("schedule", "linear")], opt, num_warmup_steps=int(L.get("warmup_steps") or 0),
                         num_training_steps=L["total_steps"])


# ----------------------------------------------------------------------------- sessions


class RaySession:
    """One Ray Train worker: rank, device, its shard of the train dataset, checkpoints via report()."""

    ray = True

    def __init__(self):
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self._train = None

    def shard(self, name: str):
        import ray.train

        return ray.train.get_dataset_shard(name)

    @contextmanager
    def checkpoint(self) -> Iterator[Optional[Path]]:
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            yield None
            return
        with ckpt.as_directory() as d:
            yield Path(d)

    def wrap(self, module: nn.Module) -> nn.Module:
        if self.world == 1:
            return module
        import ray.train.torch

        return ray.train.torch.prepare_model(
            module, parallel_strategy_kwargs={"find_unused_parameters": module.find_unused_parameters})

    def batches(self, config: dict, epoch: int):
        L = config["loop"]
        if self._train is None:
            self._train = self.shard("train")
        return self._train.iter_batches(
            batch_size=L["batch_size"], batch_format="numpy", drop_last=L["drop_last"],
            local_shuffle_buffer_size=L["shuffle_buffer"] or None, local_shuffle_seed=L["seed"] + epoch)

    def check(self, watch: "LossWatch", stop: bool) -> tuple[bool, bool]:
        """(every rank's losses were finite, some rank wants to stop): every rank must stop together, or
        DDP would hang. One host read, and one all-reduce with several workers."""
        import torch

        flags = torch.stack([(watch.bad_step > 0).float(), torch.tensor(float(stop), device=watch.device)])
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        bad, halt = flags.tolist()
        return bad == 0, halt > 0

    def report(self, point: dict, save) -> None:
        """Every worker reports (Ray Train synchronises on it); rank 0 attaches the checkpoint."""
        import ray.train

        if self.rank != 0:
            ray.train.report({}, checkpoint=None)
            return
        flat = {k: v for k, v in point.items() if isinstance(v, (int, float, str))}  # nested ones stay in history
        with tempfile.TemporaryDirectory() as tmp:
            save(Path(tmp))
            ray.train.report(flat, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    def stop(self, info: dict) -> None:
        import ray.train

        ray.train.report(info if self.rank == 0 else {}, checkpoint=None)


def inline_checkpoint(out: Path) -> Optional[Path]:
    """The checkpoint an inline run resumes from: OUT/checkpoint, or OUT/checkpoint.old when a kill
    landed between the two renames that replace it."""
    for d in (out / "checkpoint", out / "checkpoint.old"):
        if (d / STATE_FILE).is_file() and (d / HISTORY_FILE).is_file():
            return d
    return None


class InlineSession:
    """The calling process as the only worker: no Ray, checkpoints in OUT/checkpoint."""

    ray = False
    rank, world = 0, 1

    def __init__(self, out: Path, use_gpu: Optional[bool]):
        import torch

        self.out = out
        self.device = torch.device("cuda" if torch.cuda.is_available() and use_gpu is not False else "cpu")

    def shard(self, name: str):
        raise RuntimeError(f"no Ray dataset {name!r} in an inline run")

    @contextmanager
    def checkpoint(self) -> Iterator[Optional[Path]]:
        yield inline_checkpoint(self.out)

    def wrap(self, module: nn.Module) -> nn.Module:
        return module

    def batches(self, config: dict, epoch: int):
        import pyarrow as pa

        L = config["loop"]
        table, bs = config["table"], L["batch_size"]
        order = np.random.default_rng(L["seed"] + epoch).permutation(table.num_rows)
        end = len(order) - bs + 1 if L["drop_last"] else len(order)
        for i in range(0, end, bs):
            yield table.take(pa.array(order[i:i + bs])).to_pydict()

    def check(self, watch: "LossWatch", stop: bool) -> tuple[bool, bool]:
        return int(watch.bad_step) == 0, stop

    def report(self, point: dict, save) -> None:
        """Write checkpoint.tmp, then swap it in by renames: a kill at any moment leaves a whole one, and
        so does a power loss (`durable_replace`: every file fsynced before the rename, the folder after)."""
        from storage.fs import durable_replace

        ckpt, tmp, old = (self.out / n for n in ("checkpoint", "checkpoint.tmp", "checkpoint.old"))
        for d in (tmp, old):
            if d.exists() and d != inline_checkpoint(self.out):
                shutil.rmtree(d)
        tmp.mkdir(parents=True)
        save(tmp)
        if ckpt.exists():
            if old.exists():
                shutil.rmtree(old)
            durable_replace(str(ckpt), str(old))
        durable_replace(str(tmp), str(ckpt))
        if old.exists():
            shutil.rmtree(old)

    def stop(self, info: dict) -> None:
        pass


# ----------------------------------------------------------------------------- the loop


class LossWatch:
    """The training loss as the device has it: a running sum, and the first step whose loss was not
    finite with that value. Kept on the device, so that a step never waits for the host to read the
    loss (on a GPU every such read stalls the queue of kernels); the loop reads it at sync points."""

    def __init__(self, device):
        import torch

        self.device = device
        self.sum = torch.zeros((), dtype=torch.float64, device=device)
        self.n = 0
        self.bad_step = torch.zeros((), dtype=torch.long, device=device)
        self.bad_value = torch.zeros((), dtype=torch.float32, device=device)

    def add(self, loss, step: int) -> None:
        import torch

        v = loss.detach().float().reshape(())
        first = ~torch.isfinite(v) & (self.bad_step == 0)
        self.bad_step.masked_fill_(first, step)
        self.bad_value = torch.where(first, v, self.bad_value)
        self.sum += v
        self.n += 1

    def mean(self) -> Optional[float]:
        """The mean loss since the last call (a host read), or None when no step was taken."""
        if not self.n:
            return None
        out = float(self.sum) / self.n
        self.sum.zero_()
        self.n = 0
        return out

    def failure(self, step: int) -> dict:
        """nan_step / nan_value of the first non-finite loss (this step's, when another rank had it)."""
        bad = int(self.bad_step)
        return {"nan_step": bad or step, "nan_value": str(float(self.bad_value)) if bad else "nan"}


def _close(source) -> None:
    """Stop a batch source that runs worker processes (the context models' stream) once the loop leaves it."""
    close = getattr(source, "close", None)
    if callable(close):
        close()


def train_loop(config: dict):
    """Runs on every worker. Returns rank 0's summary (history, step, the trainee's result, or
    nan_step/nan_value when the loss stopped being finite); None on the other ranks."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_progress()
    t_start = time.perf_counter()
    L = config["loop"]
    session = RaySession() if config["ray"] else InlineSession(Path(config["out"]), L.get("use_gpu"))
    rank0 = session.rank == 0
    device = session.device
    if device.type == "cpu" and L.get("cpu_threads"):
        torch.set_num_threads(L["cpu_threads"])  # fractional-CPU workers must not grab every core
    torch.manual_seed(L["seed"] + session.rank)

    state, history = None, []
    with session.checkpoint() as ckpt:
        trainee = config["build"](config, session, ckpt)
        if ckpt is not None:  # resume: weights (built from ckpt/model), optimizer, schedule, position, curves
            state = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)
            trainee.load_extra_state(state)
            history = json.loads((ckpt / HISTORY_FILE).read_text())
    trainee.to(device)
    trainee.train()
    wrapped = session.wrap(trainee)
    groups = trainee.param_groups(L["lr"])
    params = [p for g in groups for p in g["params"]]
    opt = make_optimizer(groups, {**L, "fused": device.type == "cuda"})
    total = L["total_steps"]
    sched = make_schedule(opt, L)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    step = state["step"] if state else 0
    epoch0 = state["epoch"] if state else 0
    skip = state["batches_in_epoch"] if state else 0

    # bf16 where the hardware has it: GPUs always (when asked), CPUs only for trainers that opt in with
    # cpu_bf16 and only with native bf16 (emulated bf16 on CPU is many times slower than fp32)
    use_bf16 = L.get("bf16", False) and (
        (device.type == "cuda" and bf16_native("cuda"))
        or (device.type == "cpu" and L.get("cpu_bf16", False) and bf16_native("cpu")))
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext
    # each history point says the format its steps ran in, and on how many CPU threads: a run resumed on other
    # hardware may change either, and both change the arithmetic (a model rebuilt from the same seed with
    # another thread count is not the same model: docs/experiments/2026-11-25-seeds.md)
    fmt = {"precision": "bf16" if use_bf16 else "fp32", "threads": torch.get_num_threads()}
    label, verbose = L["label"], L.get("verbose", True)
    if rank0 and verbose:
        n_params = sum(p.numel() for p in params)
        note = trainee.note()
        print(f"[{label}] {session.world} worker(s) on {device}{' bf16' if use_bf16 else ''}; "
              f"{n_params / 1e6:.1f}M trainable parameters; ready in {time.perf_counter() - t_start:.1f}s"
              f"{'; ' + note if note else ''}; {'resuming at step ' + str(step) if state else 'starting'}, "
              f"{total} steps", flush=True)

    def evaluate() -> dict:
        return trainee.evaluate(device, autocast) if rank0 else {}

    def lrs() -> dict:
        last = sched.get_last_lr()
        return {"lr": last[0], **({"lr_groups": list(last)} if len(last) > 1 else {})}

    def save_at(epoch: int, in_epoch: int):
        def save(folder: Path) -> None:
            trainee.save(folder)
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step, "epoch": epoch,
                        "batches_in_epoch": in_epoch, **trainee.extra_state()}, folder / STATE_FILE)
            (folder / HISTORY_FILE).write_text(json.dumps(history))
        return save

    if step == 0 and rank0 and not history:
        history.append({"step": 0, "epoch": 0, "train_loss": None, "lr": 0.0, **evaluate(), "time_s": 0.0,
                        "cpu_s": 0.0, **fmt})
    t0 = time.perf_counter() - ((history[-1].get("time_s") or 0.0) if history else 0.0)  # resumed: the clock continues
    # and so does the CPU count: this process's CPU seconds (all threads; rank 0's on Ray). Unlike time_s it
    # does not count time the process was stopped or waiting for a shared CPU (0 at points from before it)
    c0 = time.process_time() - ((history[-1].get("cpu_s") or 0.0) if history else 0.0)

    def clocks() -> dict:  # what every history point after step 0 carries besides its metrics
        return {"time_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2), **fmt}

    t_run = time.perf_counter()  # max_seconds counts this process's training only
    max_seconds, ckpt_every = L.get("max_seconds") or 0, L.get("checkpoint_every") or 0
    # The loss is read back from the device at sync points only: every `sync_every` steps, at each history
    # point and checkpoint, and where one worker alone decides to stop. On a CPU that is every step, as
    # reading costs nothing there; on a GPU a read makes the host wait for every queued kernel. A loss
    # that stops being finite between sync points is caught at the next one, and no checkpoint is
    # written from it (checkpoints are only written after that check).
    sync_every = L.get("sync_every") or (1 if device.type == "cpu" else 32)
    watch = LossWatch(device)
    last_metrics = {}
    last_saved = step if state else -1
    # a run resumed with its budget already spent (run again after it finished, or with a smaller budget)
    # trains no step: the check after each step below would first take one more
    epoch, in_epoch, stop = epoch0, skip, state is not None and trainee.budget_spent()
    for epoch in range(epoch0, L["epochs"]):
        if step >= total or stop:
            break
        own = trainee.batches(session, epoch, skip)
        source = own if own is not None else itertools.islice(session.batches(config, epoch), skip, None)
        in_epoch = skip  # resumed mid-epoch: the batches already trained on are passed over
        for batch in source:
            opt.zero_grad(set_to_none=True)  # before the forward: gradient caching (RSE) accumulates inside it
            with autocast():
                loss, metrics = wrapped(batch, device)
            step += 1
            in_epoch += 1
            watch.add(loss, step)
            wants_stop = (bool(max_seconds) and time.perf_counter() - t_run >= max_seconds) or trainee.budget_spent()
            point_due = (step >= total or step % L["eval_every"] == 0 or (ckpt_every and step % ckpt_every == 0)
                         or (L.get("log_every") and step % L["log_every"] == 0))
            stop = False
            if step % sync_every == 0 or point_due or (wants_stop and session.world == 1):
                finite, stop = session.check(watch, wants_stop)
                if not finite:  # before this step's update: a loss caught here was never applied
                    info = watch.failure(step)
                    session.stop(info)
                    _close(source)
                    return {**info, "history": history} if rank0 else None
            loss.backward()
            if L.get("max_grad_norm"):
                torch.nn.utils.clip_grad_norm_(params, L["max_grad_norm"])
            opt.step()
            sched.step()
            last_metrics = metrics
            last = stop or step >= total
            at_eval = step % L["eval_every"] == 0 or last
            at_save = at_eval or (ckpt_every and step % ckpt_every == 0)
            if at_save or (L.get("log_every") and step % L["log_every"] == 0):
                point = {"step": step, "epoch": epoch, "train_loss": watch.mean(), **lrs(),
                         **metrics, **clocks()}
                if at_eval:
                    point.update(evaluate())
                if rank0:
                    history.append(point)
                    if verbose:
                        print(f"[{label}] step {step}/{total} loss {point['train_loss']:.4g}{trainee.describe(point)}",
                              flush=True)
                if at_save:
                    session.report(point, save_at(epoch, in_epoch))
                    last_saved = step
            if last:
                break
        _close(source)
        skip = 0
    if last_saved != step:  # the data ran out before total_steps (e.g. an uneven estimate)
        finite, _ = session.check(watch, False)
        if not finite:
            info = watch.failure(step)
            session.stop(info)
            return {**info, "history": history} if rank0 else None
        point = {"step": step, "epoch": epoch, "train_loss": watch.mean(),
                 **lrs(), **last_metrics, **clocks(), **evaluate()}
        if rank0:
            history.append(point)
        session.report(point, save_at(epoch, in_epoch))
    return {"history": history, "step": step, **trainee.result()} if rank0 else None
