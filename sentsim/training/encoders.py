"""The encoder helpers every transformer trainer shares (surrogates and students): the backbone's
folder and its checks on the driver, pooling (mean or [CLS]), and the dev metric against target scores.

Light on purpose: torch, transformers and scipy are imported where they are used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sentsim.errors import UsageError

if TYPE_CHECKING:
    import torch


def resolve_backbone(path: str, flag: str = "--backbone") -> Path:
    """The folder holding the transformers config and tokenizer: the path itself, or the Transformer module's
    subfolder of a sentence-transformers model. Raises UsageError when there is no usable encoder there
    (sentsim.encoder_folder: no tokenizer files, or a context model)."""
    from sentsim.encoder_folder import encoder_folder

    return encoder_folder(path, flag)


def check_backbone(path: str, init: str) -> dict:
    """Load config and tokenizer on the driver, so a bad path fails before any worker starts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer

    p = resolve_backbone(path)
    try:
        config = AutoConfig.from_pretrained(str(p))
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--backbone {path}: config.json is not a transformers config ({exc})") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(p))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--backbone {path}: no usable tokenizer ({type(exc).__name__}: {exc})") from None
    if len(tok) <= len(set(tok.all_special_ids)):  # files there, but a vocabulary of its special tokens alone
        raise UsageError(f"--backbone {path}: its tokenizer holds only its {len(tok)} special token(s); every "
                         "sentence would read as unknown tokens")
    if init == "pretrained":
        weights = [f for f in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
                   if (p / f).is_file()]
        if not weights:
            raise UsageError(f"--backbone {path}: no weights (model.safetensors); "
                             "use --init scratch to train from random weights")
    return {"path": str(p), "model_type": config.model_type, "vocab_size": len(tok),
            "hidden_size": getattr(config, "hidden_size", None)}


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of each row's hidden states over its real tokens."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


POOLINGS = ("mean", "cls")  # sentence-transformers' Pooling modes of the same names, so an export loads alike


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str = "mean") -> torch.Tensor:
    """A sentence vector per row: the mean over its real tokens, or its first ([CLS]) token's last hidden
    state (not BERT's pooler MLP, which sentence-transformers' "cls" mode does not apply either)."""
    if mode == "mean":
        return mean_pool(hidden, mask)
    if mode == "cls":
        return hidden[:, 0]
    raise ValueError(f"pooling {mode!r}: one of {', '.join(POOLINGS)}")


def metrics(pred: np.ndarray, y: np.ndarray, prefix: str) -> dict:
    """{prefix}_l2 and {prefix}_spearman (x100) of predictions against targets."""
    from scipy.stats import spearmanr

    rho = spearmanr(pred, y).statistic if len(y) > 1 and np.ptp(pred) > 0 and np.ptp(y) > 0 else float("nan")
    return {f"{prefix}_l2": float(np.mean((pred - y) ** 2)), f"{prefix}_spearman": float(rho) * 100.0}
