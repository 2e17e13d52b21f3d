"""Configuration of `sentsim train student`. Defaults cite the paper section they follow; the keys
every trainer shares (init, epochs, max_steps, workers, GPU, bf16, seed, scratch, ...) come from
sentsim.training.config.

The objective's name and its own section come from the registry (sentsim.students.objectives): each
registered objective with `settings` adds a section named after it (`rankencoder.temperature`), declared
in its own module beside its loss. The registry is read once, here, when this module is first imported."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, create_model, model_validator

from sentsim.students import objectives
from sentsim.training.config import TrainingSection

_REGISTERED = objectives.seal()
ObjectiveName = Literal[tuple(r.name for r in _REGISTERED)]  # pydantic refuses any other name in one line


class StudentSettings(TrainingSection):
    objective: ObjectiveName = _REGISTERED[0].name
    # rows per worker and step; unset: the objective's own, from its paper (objectives.py: rankencoder 64 as 004
    # follows SimCSE, rse 128 from 000 appendix D's {128, 256, 512}, paser 64 from 002 §4.2's {32, 64, 96})
    batch_size: Optional[int] = Field(None, ge=2)
    lr: float = Field(3e-5, gt=0)                 # SimCSE / PaSeR §4.2: 3e-5
    warmup_ratio: float = Field(0.0, ge=0, le=1)  # 000 appendix D: no warm-up
    weight_decay: float = Field(0.0, ge=0)        # 000 appendix D: no weight decay
    max_seq_length: int = Field(32, ge=8)         # SimCSE / 000 appendix D / 002 §4.2: 32
    # the sentence vector: mean over tokens (003 §3.4's surrogate, and how all-MiniLM-L6-v2 was trained), or
    # the last layer's [CLS] as RSE (000 §4.1) and PaSeR (002 §4.2; Table 9: [CLS] +1.0 on STS-B) take it
    pooling: Literal["mean", "cls"] = "mean"
    ADDED_LATER = {"pooling": "mean"}
    log_every: int = Field(10, ge=1)
    # 000 §4.1 evaluates every 125 steps; here half as often (each evaluation encodes the dev pairs); checkpoints too
    eval_every: int = Field(250, ge=1)
    eval_max_pairs: int = Field(2000, ge=10)

    @model_validator(mode="before")
    @classmethod
    def _objective_batch_size(cls, data):
        """An unset batch_size is the objective's (its registration), so a validated config always holds one."""
        if isinstance(data, dict) and data.get("batch_size") is None:
            chosen = {r.name: r for r in _REGISTERED}.get(data.get("objective", _REGISTERED[0].name))
            if chosen is not None:  # an unknown objective is refused by its own field
                data = {**data, "batch_size": chosen.batch_size}
        return data


def _sections() -> dict:
    out = {}
    for r in _REGISTERED:
        if r.name in StudentSettings.model_fields:  # its section would replace the shared key
            raise ValueError(f"student objective {r.name!r} has the name of a key every student has; rename it")
        settings = objectives.objective_class(r.name).settings
        if settings is not None:
            out[r.name] = (settings, settings())
    return out


# The keys above, then one section per registered objective that has settings, in registration order.
StudentConfig = create_model("StudentConfig", __base__=StudentSettings, __module__=__name__, **_sections())
