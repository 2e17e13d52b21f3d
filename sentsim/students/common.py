"""What the three objectives share: the encoder (helper models from sentsim.surrogate), tokenising,
mean-pooled sentence vectors, and `Objective`, the students' form of the shared loop's Trainee
(sentsim.training.loop): checkpoint contents, resume state and the dev metric are the same for all."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

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


class Objective(Trainee):
    """One training objective around a Siamese encoder (`self.model.embed(**enc)` -> mean-pooled vectors).

    step(batch, device) -> (loss, metrics); extra parameters (relation table, decoder) are submodules
    with their own learning rate from `param_groups`; `save_extras(folder)` writes what inference needs
    beside the sentence-transformers folder; the decoder of PaSeR writes nothing (dropped).
    """

    name = "objective"
    # relation rows or the MLM head may sit out a step; DDP must not wait for their gradients
    find_unused_parameters = True

    def __init__(self, model, tok, cfg):
        super().__init__()
        self.model = model
        self.tok = tok
        self.cfg = cfg
        self.dev = None  # {"s1", "s2", "score"}: harvested dev pairs for the dev metric, when there are any

    def embed(self, texts: Sequence[str], device) -> torch.Tensor:
        return self.model.embed(**tokenize(self.tok, texts, self.cfg.max_seq_length, device))

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": lr}]

    def step(self, batch: dict, device) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def forward(self, batch: dict, device) -> tuple[torch.Tensor, dict]:
        """= step(); the loop calls the (DDP-wrapped) module, so gradients are synchronised."""
        return self.step(batch, device)

    def save_extras(self, folder: Path) -> None:
        pass

    def load_extras(self, folder: Path) -> None:
        pass

    def save_encoder(self, folder: Path) -> None:
        from sentsim.surrogate.models import save_hf

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
        from sentsim.surrogate.trainee import metrics, predict

        pred = predict(self.model, self.tok, "siamese", self.dev["s1"], self.dev["s2"], self.cfg.max_seq_length, 64,
                       device, autocast)
        return metrics(pred, np.asarray(self.dev["score"]), "dev")
