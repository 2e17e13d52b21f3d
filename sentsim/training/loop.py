"""The worker side: one step loop for every model sentsim fits by gradient descent.

`train_loop(config)` runs on each Ray Train worker (TorchTrainer, DDP over the workers) or, with
config["ray"] false, in the calling process. What is trained is a `Trainee`, built on the worker by
config["build"](config, session, checkpoint_dir): an nn.Module whose forward(batch, device) is one
step's (loss, metrics), plus how to save itself, evaluate on held-out data and describe a log line.
A trainee may also supply its own batches (`Trainee.batches`); otherwise the loop reads the Ray
dataset shard "train" (or, inline, the table it was given; a trainee's other named datasets are
tables there too, read through the same `session.shard(name).iter_batches`).

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
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
from torch import nn

from sentsim.hardware import bf16_native
from sentsim.training.common import counted, quiet_progress
from sentsim.training.settings import LoopSettings

STATE_FILE = "state.pt"
HISTORY_FILE = "history.json"
# keys of a history point that are not metrics (left out of the default log line)
_POINT_KEYS = ("step", "epoch", "train_loss", "lr", "time_s", "cpu_s", "precision")


def say(line: str) -> None:
    """A progress line of the loop, on stdout alone. Ray Train replaces `print` in its workers with a logger
    that writes to stderr and also tees to stdout, so a printed line reached the terminal twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


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


def make_optimizer(groups: list[dict], settings: LoopSettings, fused: bool = False):
    """Adam or AdamW over the trainee's groups. fused: one kernel for the whole update on a GPU (the
    for-each default launches several per tensor group)."""
    import torch

    kind = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[settings.optimizer]
    return kind(groups, lr=settings.lr, betas=tuple(settings.betas or (0.9, 0.999)),
                weight_decay=settings.weight_decay, **({"fused": True} if fused else {}))


def make_schedule(opt, settings: LoopSettings):
    """transformers' schedule by name: warm-up over `warmup_steps` (none at 0), then linear or cosine
    decay to zero at total_steps, inverse square root, or constant."""
    from transformers import get_scheduler

    return get_scheduler(SCHEDULES[settings.schedule], opt, num_warmup_steps=int(settings.warmup_steps or 0),
                         num_training_steps=settings.total_steps)


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
        settings: LoopSettings = config["loop"]
        if self._train is None:
            self._train = self.shard("train")
        return self._train.iter_batches(
            batch_size=settings.batch_size, batch_format="numpy", drop_last=settings.drop_last,
            local_shuffle_buffer_size=settings.shuffle_buffer or None, local_shuffle_seed=settings.seed + epoch)

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


def inline_checkpoint(out: Path, name: str = "checkpoint") -> Optional[Path]:
    """The checkpoint an inline run resumes from: OUT/<name> (`name` "checkpoint", or a stage's
    "checkpoint/<stage>"), or OUT/<name>.old when a kill landed between the two renames that replace it."""
    for d in (out / name, out / f"{name}.old"):
        if (d / STATE_FILE).is_file() and (d / HISTORY_FILE).is_file():
            return d
    return None


class TableShard:
    """An in-memory table read as a Ray dataset shard is (`iter_batches`, numpy batches): what an inline
    session hands a trainee that reads a named dataset (the surrogate's dev and test splits)."""

    def __init__(self, table):
        self.table = table

    def iter_batches(self, *, batch_size: int, batch_format: str = "numpy"):
        if batch_format != "numpy":
            raise ValueError(f"an inline shard gives numpy batches, not {batch_format!r}")
        for i in range(0, self.table.num_rows, batch_size):
            part = self.table.slice(i, batch_size)
            yield {c: part[c].to_numpy(zero_copy_only=False) for c in part.column_names}


class InlineSession:
    """The calling process as the only worker: no Ray, checkpoints in OUT/checkpoint (or, for a trainer of
    several stages, OUT/checkpoint/<stage>: `name`); `tables`, pyarrow Tables by dataset name."""

    ray = False
    rank, world = 0, 1

    def __init__(self, out: Path, use_gpu: Optional[bool], name: str = "checkpoint", tables: Optional[dict] = None):
        import torch

        self.out, self.name, self.tables = out, name, tables or {}
        self.device = torch.device("cuda" if torch.cuda.is_available() and use_gpu is not False else "cpu")

    def shard(self, name: str):
        if self.tables.get(name) is None:
            raise RuntimeError(f"no dataset {name!r} was given to this inline run")
        return TableShard(self.tables[name])

    @contextmanager
    def checkpoint(self) -> Iterator[Optional[Path]]:
        yield inline_checkpoint(self.out, self.name)

    def wrap(self, module: nn.Module) -> nn.Module:
        return module

    def batches(self, config: dict, epoch: int):
        import pyarrow as pa

        settings: LoopSettings = config["loop"]
        table, bs = config["table"], settings.batch_size
        order = np.random.default_rng(settings.seed + epoch).permutation(table.num_rows)
        end = len(order) - bs + 1 if settings.drop_last else len(order)
        for i in range(0, end, bs):
            yield table.take(pa.array(order[i:i + bs])).to_pydict()

    def check(self, watch: "LossWatch", stop: bool) -> tuple[bool, bool]:
        return int(watch.bad_step) == 0, stop

    def report(self, point: dict, save) -> None:
        """Write checkpoint.tmp, then swap it in by renames: a kill at any moment leaves a whole one, and
        so does a power loss (`durable_replace`: every file fsynced before the rename, the folder after)."""
        from storage.fs import durable_replace

        ckpt, tmp, old = (self.out / n for n in (self.name, f"{self.name}.tmp", f"{self.name}.old"))
        for d in (tmp, old):
            if d.exists() and d != inline_checkpoint(self.out, self.name):
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
    """Runs on every worker. config["loop"] is the run's `LoopSettings`. Returns rank 0's summary (history,
    step, the trainee's result, or nan_step/nan_value when the loss stopped being finite); None on the
    other ranks."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_progress()
    t_start = time.perf_counter()
    settings: LoopSettings = config["loop"]
    session = RaySession() if config["ray"] else InlineSession(
        Path(config["out"]), settings.use_gpu, config.get("inline_dir", "checkpoint"), config.get("tables"))
    if session.device.type == "cpu" and settings.cpu_threads:
        torch.set_num_threads(settings.cpu_threads)  # fractional-CPU workers must not grab every core
    torch.manual_seed(settings.seed + session.rank)
    worker = _Worker(config, session)
    worker.announce(t_start)
    return worker.run()


class _Worker:
    """One worker's run of the loop: the trainee, its optimizer and schedule, where the run stands (step,
    epoch, batches into the epoch), its history, and the clocks its history points carry."""

    def __init__(self, config: dict, session):
        import torch

        self.config, self.session = config, session
        self.s: LoopSettings = config["loop"]
        self.rank0, self.device = session.rank == 0, session.device
        self.state, self.history = None, []
        with session.checkpoint() as ckpt:
            self.trainee = config["build"](config, session, ckpt)
            if ckpt is not None:  # resume: weights (built from ckpt/model), optimizer, schedule, position, curves
                self.state = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)
                self.trainee.load_extra_state(self.state)
                self.history = json.loads((ckpt / HISTORY_FILE).read_text())
        self.trainee.to(self.device)
        self.trainee.train()
        self.wrapped = session.wrap(self.trainee)
        groups = self.trainee.param_groups(self.s.lr)
        self.params = [p for g in groups for p in g["params"]]
        self.opt = make_optimizer(groups, self.s, fused=self.device.type == "cuda")
        self.sched = make_schedule(self.opt, self.s)
        state = self.state or {}
        if state:
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            # the optimizer comes back with the lr the saved run's plan gave this step (at its end: 0); a run given
            # more steps takes its own plan's from its first step on. Unchanged plan: the same number, bit for bit
            for group, base, fn in zip(self.opt.param_groups, self.sched.base_lrs,
                                       getattr(self.sched, "lr_lambdas", ())):
                group["lr"] = base * fn(self.sched.last_epoch)
            self.sched._last_lr = [group["lr"] for group in self.opt.param_groups]  # what the history logs
        self.step, self.epoch0 = state.get("step", 0), state.get("epoch", 0)
        self.skip = state.get("batches_in_epoch", 0)
        self.in_epoch, self.last_metrics, self.stop = self.skip, {}, False
        self._precision()

    def _precision(self) -> None:
        """bf16 where the hardware has it: GPUs always (when asked), CPUs only for trainers that opt in with
        cpu_bf16 and only with native bf16 (emulated bf16 on CPU is many times slower than fp32)."""
        import torch

        dev = self.device.type
        self.bf16 = self.s.bf16 and ((dev == "cuda" and bf16_native("cuda"))
                                     or (dev == "cpu" and bool(self.s.cpu_bf16) and bf16_native("cpu")))
        self.autocast = (lambda: torch.autocast(dev, dtype=torch.bfloat16)) if self.bf16 else nullcontext
        # each history point says the format its steps ran in, and on how many CPU threads: a run resumed on
        # other hardware may change either, and both change the arithmetic (a model rebuilt from the same seed
        # with another thread count is not the same model: docs/experiments/2026-11-25-seeds.md)
        self.fmt = {"precision": "bf16" if self.bf16 else "fp32", "threads": torch.get_num_threads()}

    def announce(self, t_start: float) -> None:
        if not (self.rank0 and self.s.verbose):
            return
        n_params = sum(p.numel() for p in self.params)
        note = self.trainee.note()
        say(f"[{self.s.label}] {self.session.world} worker(s) on {self.device}{' bf16' if self.bf16 else ''}; "
            f"{n_params / 1e6:.1f}M trainable parameters; ready in {time.perf_counter() - t_start:.1f}s"
            f"{'; ' + note if note else ''}; {'resuming at step ' + str(self.step) if self.state else 'starting'}, "
            f"{counted(self.s.total_steps, 'step')}")

    def evaluate(self) -> dict:
        return self.trainee.evaluate(self.device, self.autocast) if self.rank0 else {}

    def lrs(self) -> dict:
        last = self.sched.get_last_lr()
        return {"lr": last[0], **({"lr_groups": list(last)} if len(last) > 1 else {})}

    def clocks(self) -> dict:
        """What every history point after step 0 carries besides its metrics."""
        return {"time_s": round(time.perf_counter() - self.t0, 2), "cpu_s": round(time.process_time() - self.c0, 2),
                **self.fmt}

    def saver(self, epoch: int, in_epoch: int):
        def save(folder: Path) -> None:
            import torch

            self.trainee.save(folder)
            torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(), "step": self.step,
                        "epoch": epoch, "batches_in_epoch": in_epoch, **self.trainee.extra_state()},
                       folder / STATE_FILE)
            (folder / HISTORY_FILE).write_text(json.dumps(self.history))
        return save

    def _start_clocks(self) -> None:
        if self.step == 0 and self.rank0 and not self.history:
            self.history.append({"step": 0, "epoch": 0, "train_loss": None, "lr": 0.0, **self.evaluate(),
                                 "time_s": 0.0, "cpu_s": 0.0, **self.fmt})
        last = self.history[-1] if self.history else {}
        self.t0 = time.perf_counter() - (last.get("time_s") or 0.0)  # resumed: the clock continues
        # and so does the CPU count: this process's CPU seconds (all threads; rank 0's on Ray). Unlike time_s it
        # does not count time the process was stopped or waiting for a shared CPU (0 at points from before it)
        self.c0 = time.process_time() - (last.get("cpu_s") or 0.0)
        self.t_run = time.perf_counter()  # max_seconds counts this process's training only
        # The loss is read back from the device at sync points only: every `sync_every` steps, at each history
        # point and checkpoint, and where one worker alone decides to stop. On a CPU that is every step, as
        # reading costs nothing there; on a GPU a read makes the host wait for every queued kernel. A loss
        # that stops being finite between sync points is caught at the next one, and no checkpoint is
        # written from it (checkpoints are only written after that check).
        self.sync_every = self.s.sync_every or (1 if self.device.type == "cpu" else 32)
        self.watch = LossWatch(self.device)
        self.last_saved = self.step if self.state else -1

    def run(self) -> Optional[dict]:
        self._start_clocks()
        # a run resumed with its budget already spent (run again after it finished, or with a smaller budget)
        # trains no step: the check after each step would first take one more
        self.stop = self.state is not None and self.trainee.budget_spent()
        epoch, skip = self.epoch0, self.skip
        for epoch in range(self.epoch0, self.s.epochs):
            if self.step >= self.s.total_steps or self.stop:
                break
            failure = self._epoch(epoch, skip)
            if failure is not None:
                return {**failure, "history": self.history} if self.rank0 else None
            skip = 0
        return self._finish(epoch)

    def _epoch(self, epoch: int, skip: int) -> Optional[dict]:
        """Train on `epoch`'s batches past the first `skip` (a resumed run's); the failure (nan_step,
        nan_value) when a loss was not finite, after telling every rank to stop."""
        own = self.trainee.batches(self.session, epoch, skip)
        source = own if own is not None else itertools.islice(self.session.batches(self.config, epoch), skip, None)
        self.in_epoch = skip  # resumed mid-epoch: the batches already trained on are passed over
        for batch in source:
            failure = self._step(batch, epoch)
            if failure is not None:
                self.session.stop(failure)
                _close(source)
                return failure
            if self.stop or self.step >= self.s.total_steps:
                break
        _close(source)
        return None

    def _due(self, every: Optional[int]) -> bool:
        return bool(every) and self.step % every == 0

    def _step(self, batch, epoch: int) -> Optional[dict]:
        """One optimizer step, and the history point or checkpoint it is due; the failure of a loss that
        was not finite, caught before this step's update (so that loss was never applied)."""
        import torch

        s = self.s
        self.opt.zero_grad(set_to_none=True)  # before the forward: gradient caching (RSE) accumulates inside it
        with self.autocast():
            loss, metrics = self.wrapped(batch, self.device)
        self.step += 1
        self.in_epoch += 1
        self.watch.add(loss, self.step)
        wants_stop = ((bool(s.max_seconds) and time.perf_counter() - self.t_run >= s.max_seconds)
                      or self.trainee.budget_spent())
        point_due = (self.step >= s.total_steps or self.step % s.eval_every == 0 or self._due(s.checkpoint_every)
                     or self._due(s.log_every))
        self.stop = False
        if self.step % self.sync_every == 0 or point_due or (wants_stop and self.session.world == 1):
            finite, self.stop = self.session.check(self.watch, wants_stop)
            if not finite:
                return self.watch.failure(self.step)
        loss.backward()
        if s.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, s.max_grad_norm)
        self.opt.step()
        self.sched.step()
        self.last_metrics = metrics
        self._point(epoch, metrics)
        return None

    def _point(self, epoch: int, metrics: dict) -> None:
        """The history point (with evaluation at eval_every and at the end) and the checkpoint due now."""
        at_eval = self.step % self.s.eval_every == 0 or self.stop or self.step >= self.s.total_steps
        at_save = at_eval or self._due(self.s.checkpoint_every)
        if not (at_save or self._due(self.s.log_every)):
            return
        point = {"step": self.step, "epoch": epoch, "train_loss": self.watch.mean(), **self.lrs(), **metrics,
                 **self.clocks()}
        if at_eval:
            point.update(self.evaluate())
        if self.rank0:
            self.history.append(point)
            if self.s.verbose:
                say(f"[{self.s.label}] step {self.step}/{self.s.total_steps} loss {point['train_loss']:.4g}"
                    f"{self.trainee.describe(point)}")
        if at_save:
            self.session.report(point, self.saver(epoch, self.in_epoch))
            self.last_saved = self.step

    def _finish(self, epoch: int) -> Optional[dict]:
        """The last point and checkpoint when the data ran out before total_steps (e.g. an uneven
        estimate); rank 0's summary."""
        if self.last_saved != self.step:
            finite, _ = self.session.check(self.watch, False)
            if not finite:
                failure = self.watch.failure(self.step)
                self.session.stop(failure)
                return {**failure, "history": self.history} if self.rank0 else None
            point = {"step": self.step, "epoch": epoch, "train_loss": self.watch.mean(),
                     **self.lrs(), **self.last_metrics, **self.clocks(), **self.evaluate()}
            if self.rank0:
                self.history.append(point)
            self.session.report(point, self.saver(epoch, self.in_epoch))
        return {"history": self.history, "step": self.step, **self.trainee.result()} if self.rank0 else None
