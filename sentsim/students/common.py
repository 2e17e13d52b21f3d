"""What the objectives share: the encoder (sentsim.training.encoder_models), tokenising,
pooled sentence vectors (mean or [CLS], `pooling`), and `Objective`, the students' form of the shared loop's Trainee
(sentsim.training.loop): checkpoint contents, resume state and the dev metric are the same for all.
`Objective` also holds what every objective declares for the trainer (its settings, its data, its
encoder, its inference files and scorers; sentsim.students.objectives lists them), with defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from sentsim.training.loop import Trainee


def tokenize(tok, texts: Sequence[str], max_len: int, device) -> dict:
    enc = tok([str(t) for t in texts], padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def column(batch: dict, name: str) -> list:
    """A batch column as a Python list (ray.data numpy batches and our own dict batches alike)."""
    v = batch[name]
    return v.tolist() if isinstance(v, np.ndarray) and v.dtype != object else list(v)


def stack_lists(values) -> np.ndarray:
    return np.stack([np.asarray(v) for v in values])


@dataclass(frozen=True)
class Harvest:
    """What an objective's `prepare` reads: --data as given, its harvest run (a storage.RunReader, None
    without --data) and manifest, and the backbone's local path."""

    data: Optional[str]
    root: Any
    manifest: dict
    backbone: str


@dataclass
class Prepared:
    """An objective's training data, from `prepare` on the driver: the table the loop reads, the counts
    and skips the run summary reports (counts are part of the run's fingerprint), and what `build`
    needs on the workers (JSON-able; it travels in the training config; keys other than the trainer's,
    sentsim.students.train.WORKER_KEYS)."""

    table: Any  # pyarrow.Table
    counts: dict = field(default_factory=dict)
    skips: dict = field(default_factory=dict)
    for_workers: dict = field(default_factory=dict)


class Objective(Trainee):
    """One training objective around a Siamese encoder (`self.model.embed(**enc)` -> vectors pooled as
    the config's `pooling` says).

    step(batch, device) -> (loss, metrics); extra parameters (relation table, decoder) are submodules
    with their own learning rate from `param_groups`; `save_extras(folder)` writes what inference needs
    beside the sentence-transformers folder; the decoder of PaSeR writes nothing (dropped).

    The class attributes and classmethods below are what the trainer (sentsim.students.train) asks of a
    registered objective (sentsim.students.objectives); a subclass overrides those it needs.
    """

    settings: Optional[type] = None  # its config section (a sentsim.config.Section), reached as cfg.<name>
    needs_data: Optional[str] = None  # what it reads from --data (words for the error); None: --data optional
    side_files: tuple[str, ...] = ()  # files `save_extras` writes that the exported student keeps
    # keys of its settings section naming a file it reads (local): the run's fingerprint holds that file's
    # sha256, not its path, so the file moved or copied is the same run and one edited in place is not
    data_files: tuple[str, ...] = ()
    # in-batch negatives (InfoNCE) want every batch full: each epoch's short last batch is dropped, and the
    # trainer's note says how many rows that leaves out; an objective whose loss is per row trains on it
    full_batches = True
    # relation rows or the MLM head may sit out a step; DDP must not wait for their gradients
    find_unused_parameters = True

    def __init__(self, model, tok, cfg):
        super().__init__()
        self.model = model
        self.tok = tok
        self.cfg = cfg
        self.dev = None  # {"s1", "s2", "score"}: harvested dev pairs for the dev metric, when there are any

    # ------------------------------------------------------------- what the trainer asks of an objective

    @classmethod
    def input_paths(cls, cfg) -> dict:
        """{config key or flag: path} of the inputs its settings name, which --out must not overlap."""
        return {}

    @classmethod
    def check(cls, cfg, backbone: str, backbone_path: str) -> None:
        """Refuse settings or a backbone (--backbone as given, and its model folder) it cannot train with,
        with a UsageError, before any data is read."""

    @classmethod
    def prepare(cls, cfg, harvest: Harvest) -> Prepared:
        """On the driver: the training table and its counts, checked here so that a bad input fails
        before Ray starts."""
        raise NotImplementedError

    @classmethod
    def build(cls, cfg, backbone: str, init: str, spec: dict) -> "Objective":
        """On a worker: the objective around a Siamese encoder from `backbone` (init pretrained or scratch,
        the surrogate's `build_model`); `spec` holds `Prepared.for_workers`."""
        from sentsim.training.encoder_models import build_model

        model, tok = build_model("siamese", backbone, init, cfg.scratch.model_dump(), cfg.seed, cfg.pooling)
        return cls.around(model, tok, cfg, spec)

    @classmethod
    def around(cls, model, tok, cfg, spec: dict) -> "Objective":
        """The objective around a built encoder; override to pass it what `prepare` gave the workers."""
        return cls(model, tok, cfg)

    @classmethod
    def scorers(cls, cfg, model_dir: str) -> dict:
        """{report name: sentsim.evaluation scorer} for the objective's own inference rule, evaluated
        beside plain cosine by --eval-sts."""
        return {}

    # ------------------------------------------------------------- training

    def embed(self, texts: Sequence[str], device) -> torch.Tensor:
        return self.model.embed(**tokenize(self.tok, texts, self.cfg.max_seq_length, device))

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": lr}]

    def step(self, batch: dict, device) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def forward(self, batch: dict, device) -> tuple[torch.Tensor, dict]:
        """= step(); the loop calls the (DDP-wrapped) module, so gradients are synchronised. Adds the
        batch's row count to the step's metrics (history points say what each step read)."""
        loss, metrics = self.step(batch, device)
        return loss, {**metrics, "batch_rows": len(next(iter(batch.values())))}

    def save_extras(self, folder: Path) -> None:
        pass

    def load_extras(self, folder: Path) -> None:
        pass

    def save_encoder(self, folder: Path) -> None:
        from sentsim.training.encoder_models import save_hf

        save_hf(self.model, self.tok, folder)

    # ------------------------------------------------------------- the shared loop's hooks

    def save(self, folder: Path) -> None:
        self.save_encoder(folder / "model")
        self.save_extras(folder)

    def extra_state(self) -> dict:
        # the objective's own parameters (relation table, decoder, MLM head); the encoder is in model/
        return {"objective_extra": {k: v for k, v in self.state_dict().items() if not k.startswith("model.")}}

    def load_extra_state(self, state: dict) -> None:
        if "objective_extra" in state:
            self.load_state_dict(state["objective_extra"], strict=False)

    def evaluate(self, device, autocast) -> dict:
        """Dev L2 and Spearman x100 of the cosine against the harvested dev scores (the surrogate's metric)."""
        if not self.dev:
            return {}
        from sentsim.training.encoder_models import predict
        from sentsim.training.encoders import metrics

        pred = predict(self.model, self.tok, "siamese", self.dev["s1"], self.dev["s2"], self.cfg.max_seq_length, 64,
                       device, autocast)
        return metrics(pred, np.asarray(self.dev["score"]), "dev")
