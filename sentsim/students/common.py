"""What the three objectives share: the encoder (helper models from sentsim.surrogate), tokenising,
mean-pooled sentence vectors, and the Objective interface the training loop drives."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn


def tokenize(tok, texts: Sequence[str], max_len: int, device) -> dict:
    enc = tok([str(t) for t in texts], padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def column(batch: dict, name: str) -> list:
    """A batch column as a Python list (ray.data numpy batches and our own dict batches alike)."""
    v = batch[name]
    return v.tolist() if isinstance(v, np.ndarray) and v.dtype != object else list(v)


def stack_lists(values) -> np.ndarray:
    return np.stack([np.asarray(v) for v in values])


class Objective(nn.Module):
    """One training objective around a Siamese encoder (`self.model.embed(**enc)` -> mean-pooled vectors).

    step(batch) -> (loss, metrics); extra parameters (relation table, decoder) are submodules with
    their own learning rate from `param_groups`; `save_extras(folder)` writes what inference needs
    beside the sentence-transformers folder; the decoder of PaSeR writes nothing (dropped).
    """

    name = "objective"

    def __init__(self, model, tok, cfg):
        super().__init__()
        self.model = model
        self.tok = tok
        self.cfg = cfg

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
