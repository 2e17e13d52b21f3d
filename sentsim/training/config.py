"""Settings every trainer shares (surrogates and students), with the defaults they agree on.

Each trainer's own config subclasses `TrainingSection` and declares the keys whose defaults come from
its paper (batch size, learning rate, warm-up, sequence length, evaluation cadence).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sentsim.config import Bf16WhenThere, GpuWhenThere, Section, Seed

# Settings a resumed run may change: how long and how wide to train, not what is trained. They are
# left out of the run's fingerprint, in the config and in each of its sections (a stage's own budget: the
# surrogate's finetune.max_steps), so changing them against the same --out resumes.
RESUMABLE_KEYS = ("epochs", "max_steps", "eval_every", "log_every", "num_workers", "cpus_per_worker", "use_gpu",
                  "checkpoints_to_keep")

# The format of a trainer's run record (OUT/run.json, sentsim.training.run.claim_out): how the fingerprint it
# holds was made. A record without one is format 1; sentsim/run_formats.py says what changed since and how a
# run of an earlier format keeps the fingerprint it holds.
TRAINING_FORMAT = 2


def resumable_paths(dump: dict, prefix: str = "") -> tuple[str, ...]:
    """The dotted keys of `dump` (a config's model_dump) named in RESUMABLE_KEYS, its sections' included."""
    out: list[str] = []
    for k, v in dump.items():
        if isinstance(v, dict):
            out += resumable_paths(v, f"{prefix}{k}.")
        elif k in RESUMABLE_KEYS:
            out.append(prefix + k)
    return tuple(out)


def without_resumable(dump: dict) -> dict:
    """`dump` less RESUMABLE_KEYS, in every section: what a trainer's fingerprint holds of its config."""
    return {k: without_resumable(v) if isinstance(v, dict) else v for k, v in dump.items() if
            isinstance(v, dict) or k not in RESUMABLE_KEYS}


class ScratchConfig(Section):
    """The small BERT trained from random weights (the surrogate paper, section 3.4, reports a
    from-scratch surrogate; its size is not given, so these are a laptop-sized default)."""

    hidden_size: int = Field(256, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(1024, ge=8)


class TrainingSection(Section):
    init: Literal["pretrained", "scratch"] = "pretrained"  # the backbone's weights, or a ScratchConfig BERT
    epochs: int = Field(1, ge=1)
    max_steps: int = Field(0, ge=0)  # 0: run the epochs out
    max_grad_norm: float = Field(1.0, gt=0)
    num_workers: int = Field(1, ge=1)  # DDP processes on Ray Train
    cpus_per_worker: float = Field(1.0, gt=0)  # fractional on small machines: 0.5 lets two workers share a core
    use_gpu: GpuWhenThere = None  # None (auto): use GPUs when the cluster has one per worker
    bf16: Bf16WhenThere = True  # (auto = true): autocast to bfloat16 on GPUs that support it; losses reduce in float32
    checkpoints_to_keep: int = Field(2, ge=1)
    seed: Seed = 0
    scratch: ScratchConfig = ScratchConfig()

    @model_validator(mode="after")
    def _scratch_heads_divide_its_width(self):
        # said when the config is read: BERT refuses it only when a worker builds the model, after the run went ahead
        s = self.scratch
        if self.init == "scratch" and s.hidden_size % s.num_heads:
            raise ValueError(f"scratch.num_heads {s.num_heads} must divide scratch.hidden_size {s.hidden_size} "
                             "(each attention head takes an equal share of the width)")
        return self
