"""`LoopSettings`: what `train_loop` is told about one run, and the Ray resources `fit` asks for it.

One frozen type for every trainer; each builds it with its own classmethod (`from_section` for the
transformer trainers, `for_context`, `for_discriminator`), so the names and defaults live here alone.
It travels inside the loop config to the Ray Train workers (pickled with the rest of that dict).

`record()` is what the fit's record fingerprints: every field, less the optional ones a trainer left
unset (None), so that a run keeps the fingerprint it had when its settings were a plain dict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

# left out of record() while None: only some trainers set them
OPTIONAL = frozenset({"betas", "checkpoint_every", "max_seconds", "cpu_bf16", "max_failures", "sync_every"})


def worker_threads(cpus_per_worker: float) -> int:
    """Torch threads for a CPU worker that Ray gives `cpus_per_worker` CPUs: the whole CPUs of that share, at
    least 1. Rounding would oversubscribe: two workers of 1.5 CPUs each on a 3-core node would run 4 threads."""
    return max(1, math.floor(cpus_per_worker))


def rounded_threads(cpus_per_worker: float) -> int:
    """The thread count the surrogate and student trainers took before `worker_threads` (round, at least 1):
    only to recognise the fits they recorded with it (training/run.py, FitRecord)."""
    return max(1, int(round(cpus_per_worker)))


@dataclass(frozen=True)
class LoopSettings:
    """The loop's settings. Cadences count optimizer steps; 0 or None turns an optional one off."""

    label: str  # the run's name in every log line ("student rankencoder", "context forward", ...)
    total_steps: int  # optimizer steps to take (the plan's; a trainee's budget or max_seconds may stop it sooner)
    epochs: int  # passes over the data at most
    seed: int  # torch's seed (plus the worker's rank) and the shuffle's (plus the epoch)
    batch_size: Optional[int]  # rows per worker and step; None for a trainee that makes its own batches
    lr: float  # peak learning rate (a parameter group's own lr is kept and scaled alike)
    weight_decay: float
    max_grad_norm: Optional[float]  # gradient clipping; 0 or None: none
    eval_every: int  # a history point with evaluation and a checkpoint every N steps (and at the end)
    log_every: Optional[int]  # a history point without evaluation every N steps; None or 0: at evals only
    bf16: bool  # autocast to bfloat16 where the hardware has it natively
    use_gpu: Optional[bool]  # None: one GPU per worker when there are enough (fit resolves it for Ray)
    cpu_threads: int  # torch threads on a CPU worker; 0: torch's default
    num_workers: int  # Ray Train DDP workers
    cpus_per_worker: float  # Ray CPUs per worker (fractions allowed)
    checkpoints_to_keep: int  # Ray Train checkpoints kept
    verbose: bool = True  # print the start-up line and each history point
    drop_last: bool = False  # drop a worker's short last batch of an epoch
    shuffle_buffer: int = 0  # Ray's local shuffle buffer (rows); 0: none
    optimizer: str = "adamw"  # "adamw" or "adam"
    schedule: str = "linear"  # linear, cosine, inverse_sqrt or constant (each after the warm-up)
    warmup_steps: int = 0
    betas: Optional[tuple[float, float]] = None  # Adam's betas; None: (0.9, 0.999)
    checkpoint_every: Optional[int] = None  # a checkpoint without evaluation every N steps
    max_seconds: Optional[float] = None  # a wall-clock stop for this process's training, agreed by every rank
    cpu_bf16: Optional[bool] = None  # bf16 on CPUs too (when native); None: fp32 there
    max_failures: Optional[int] = None  # Ray Train restarts after a worker failure; None: 0
    sync_every: Optional[int] = None  # read the loss back every N steps; None: every step on CPU, 32 on GPU

    @classmethod
    def from_section(cls, cfg, *, label: str, total_steps: int, verbose: bool = True, **over) -> "LoopSettings":
        """From a TrainingSection (surrogates, students); `over` replaces values of a stage or objective."""
        names = ("epochs", "batch_size", "lr", "weight_decay", "max_grad_norm", "eval_every", "seed", "use_gpu",
                 "bf16", "num_workers", "cpus_per_worker", "checkpoints_to_keep")
        values = {k: getattr(cfg, k) for k in names}
        values.update(label=label, total_steps=total_steps, verbose=verbose, log_every=getattr(cfg, "log_every", None),
                      cpu_threads=worker_threads(cfg.cpus_per_worker),
                      warmup_steps=int(cfg.warmup_ratio * total_steps))
        values.update(over)
        return cls(**values)

    @classmethod
    def for_context(cls, cfg, name: str) -> "LoopSettings":
        """From a ContextTrainConfig, for its run `name`: the trainee makes its own batches."""
        return cls(
            label=f"context {name}", total_steps=cfg.max_steps, epochs=1, seed=cfg.seed, batch_size=None,
            optimizer="adam", lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay,
            schedule=cfg.schedule, warmup_steps=cfg.warmup_steps, max_grad_norm=cfg.grad_clip,
            eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, log_every=cfg.log_every or None,
            max_seconds=cfg.max_seconds, bf16=cfg.bf16 == "auto", cpu_bf16=True, cpu_threads=cfg.torch_threads,
            use_gpu={"auto": None, "yes": True, "no": False}[cfg.use_gpu], num_workers=cfg.num_workers,
            cpus_per_worker=cfg.cpus_per_worker, checkpoints_to_keep=2, max_failures=2)

    @classmethod
    def for_discriminator(cls, tc, *, total_steps: int, epochs: int) -> "LoopSettings":
        """From the discriminator's train section: a one-cycle shape (10% warm-up, cosine decay), CPU only."""
        return cls(
            label="discriminator", total_steps=total_steps, epochs=epochs, seed=tc.seed, batch_size=tc.batch_size,
            lr=tc.lr, betas=(0.9, 0.999), weight_decay=tc.weight_decay, schedule="cosine",
            warmup_steps=int(0.1 * total_steps), max_grad_norm=tc.grad_clip, eval_every=tc.eval_every or total_steps,
            log_every=None, bf16=False, use_gpu=False, cpu_threads=worker_threads(tc.cpus_per_worker),
            num_workers=tc.num_workers, cpus_per_worker=tc.cpus_per_worker, checkpoints_to_keep=2)

    def record(self) -> dict:
        """The settings as the fit's record fingerprints them: every field but the unset optional ones."""
        return {k: v for k, v in asdict(self).items() if not (k in OPTIONAL and v is None)}
