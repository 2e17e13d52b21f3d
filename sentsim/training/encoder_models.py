"""The two surrogate forms of the paper, their backbones, and export to sentence-transformers folders.

- Siamese (section 3.4): one encoder, mean pooling over the last layer, cosine of the two vectors.
- Cross (section 5.6, "BERT-style"): `[CLS] s1 [SEP] s2` through the encoder, a regression head
  on [CLS]. Slightly more accurate in the paper (77.43 vs 77.32) but nothing can be cached.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from sentsim.errors import UsageError


def resolve_backbone(path: str) -> Path:
    """The folder holding the transformers config: the path itself, or the Transformer module's
    subfolder of a sentence-transformers model. Raises UsageError when there is no model there."""
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"--backbone {path}: not a directory")
    if (p / "modules.json").is_file():
        try:
            for m in json.loads((p / "modules.json").read_text()):
                if m.get("type", "").endswith("Transformer"):
                    p = p / m.get("path", "")
                    break
        except (json.JSONDecodeError, AttributeError):
            raise UsageError(f"--backbone {path}: modules.json is not valid") from None
    if not (p / "config.json").is_file():
        raise UsageError(f"--backbone {path}: not a model (no config.json)")
    return p


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
    if init == "pretrained":
        weights = [f for f in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
                   if (p / f).is_file()]
        if not weights:
            raise UsageError(f"--backbone {path}: no weights (model.safetensors); "
                             "use --init scratch to train from random weights")
    return {"path": str(p), "model_type": config.model_type, "vocab_size": len(tok),
            "hidden_size": getattr(config, "hidden_size", None)}


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


class SiameseSurrogate(nn.Module):
    arch = "siamese"

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def embed(self, input_ids, attention_mask, **extra) -> torch.Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra)
        return mean_pool(out.last_hidden_state, attention_mask)

    def forward(self, batch: dict) -> torch.Tensor:
        """`batch` holds both sides stacked (s1 rows, then s2 rows): one encoder pass per step,
        which DDP needs (one forward per backward) and which pads both sides together."""
        v = self.embed(**batch)
        n = v.shape[0] // 2
        return F.cosine_similarity(v[:n].float(), v[n:].float(), dim=-1)


class CrossSurrogate(nn.Module):
    arch = "cross"

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder  # an AutoModelForSequenceClassification with one label

    def forward(self, batch: dict) -> torch.Tensor:
        return self.encoder(**batch).logits[:, 0].float()


def build_model(arch: str, backbone: str, init: str, scratch: dict | None = None, seed: int = 0):
    """(model, tokenizer). init="scratch" builds a small BERT with random weights around the
    backbone's tokenizer (the paper trains a surrogate from scratch too, section 3.4)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        BertModel,
    )

    p = resolve_backbone(backbone)
    tok = AutoTokenizer.from_pretrained(str(p))
    torch.manual_seed(seed)  # the same random init on every worker (DDP also broadcasts rank 0's)
    if init == "scratch":
        s = scratch or {}
        cfg = BertConfig(
            vocab_size=len(tok), hidden_size=s.get("hidden_size", 256), num_hidden_layers=s.get("num_layers", 4),
            num_attention_heads=s.get("num_heads", 4), intermediate_size=s.get("intermediate_size", 1024),
            max_position_embeddings=s.get("max_position_embeddings", 512), pad_token_id=tok.pad_token_id or 0,
            num_labels=1,
        )
        encoder = BertForSequenceClassification(cfg) if arch == "cross" else BertModel(cfg)
    elif arch == "cross":
        config = AutoConfig.from_pretrained(str(p), num_labels=1)
        encoder = AutoModelForSequenceClassification.from_pretrained(str(p), config=config)
    else:
        encoder = AutoModel.from_pretrained(str(p))
    if arch == "siamese" and getattr(encoder, "pooler", None) is not None:
        # mean pooling never uses BERT's [CLS] pooler; frozen, DDP does not wait for its gradients,
        # and it stays in the checkpoint so that loaders see a complete BertModel
        encoder.pooler.requires_grad_(False)
    model = CrossSurrogate(encoder) if arch == "cross" else SiameseSurrogate(encoder)
    return model, tok


def tokenize(tok, arch: str, s1: list[str], s2: list[str], max_len: int, device=None) -> dict:
    if arch == "cross":
        enc = tok(list(s1), list(s2), padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    else:
        enc = tok(list(s1) + list(s2), padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items()} if device is not None else dict(enc)


def save_hf(model: nn.Module, tok, folder: Path) -> None:
    """Plain transformers checkpoint (what checkpoints hold; export turns it into the final form)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.encoder.save_pretrained(str(folder), safe_serialization=True)
    tok.save_pretrained(str(folder))


def export_model(hf_dir: Path, out: Path, arch: str, max_seq_length: int, card: Optional[dict] = None,
                 extras: Optional[Callable[[Path], None]] = None) -> Path:
    """Siamese -> a sentence-transformers folder (Transformer + mean Pooling, weights at the root so
    plain AutoModel loads it too). Cross -> a CrossEncoder folder with an identity activation: the
    head regresses the teacher's similarity directly, so no sigmoid. `extras(folder)` adds side files;
    `card` (sentsim.surrogate.card) is what README.md says the model is.

    Written beside `out` and swapped in by renames (sentsim.model_swap): a kill at any moment
    leaves the old model or the new one, whole."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentsim.model_swap import replace_folder
    from sentsim.surrogate.card import CARD_FILE, render

    info = {"format": 1, "card": {"form": "cross-encoder" if arch == "cross" else "sentence-transformer",
                                  "max_seq_length": max_seq_length, **(card or {})}}

    def write(folder: Path) -> None:
        _save_final(hf_dir, folder, arch, max_seq_length)
        if extras is not None:
            extras(folder)
        (folder / CARD_FILE).write_text(render(info), encoding="utf-8")  # over the library's blank template

    return replace_folder(Path(out), write, info)


def _save_final(hf_dir: Path, folder: Path, arch: str, max_seq_length: int) -> None:
    if arch == "cross":
        from sentence_transformers import CrossEncoder

        ce = CrossEncoder(str(hf_dir), num_labels=1, max_length=max_seq_length, activation_fn=nn.Identity(),
                          device="cpu")
        ce.save(str(folder))
        return
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tr = Transformer(str(hf_dir), max_seq_length=max_seq_length)
    st = SentenceTransformer(modules=[tr, Pooling(tr.get_embedding_dimension(), "mean")], device="cpu")
    st.save(str(folder))
