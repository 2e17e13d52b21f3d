"""The encoder forms the surrogate and student trainers build, their backbones, predictions, and export to
sentence-transformers folders (a student is a Siamese encoder).

- Siamese (section 3.4): one encoder, mean pooling over the last layer (a student may take [CLS]),
  cosine of the two vectors.
- Cross (section 5.6, "BERT-style"): `[CLS] s1 [SEP] s2` through the encoder, a regression head
  on [CLS]. Slightly more accurate in the paper (77.43 vs 77.32) but nothing can be cached.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from sentsim.training.encoders import pool, resolve_backbone


class SiameseSurrogate(nn.Module):
    arch = "siamese"

    def __init__(self, encoder: nn.Module, pooling: str = "mean"):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling  # sentsim.training.encoders.POOLINGS; the export's Pooling module says the same

    def embed(self, input_ids, attention_mask, **extra) -> torch.Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra)
        return pool(out.last_hidden_state, attention_mask, self.pooling)

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


def build_model(arch: str, backbone: str, init: str, scratch: dict | None = None, seed: int = 0,
                pooling: str = "mean"):
    """(model, tokenizer). init="scratch" builds a small BERT with random weights around the
    backbone's tokenizer (the paper trains a surrogate from scratch too, section 3.4). `pooling`: the
    Siamese form's (mean or cls)."""
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
        # neither pooling uses BERT's pooler MLP over [CLS]; frozen, DDP does not wait for its gradients,
        # and it stays in the checkpoint so that loaders see a complete BertModel
        encoder.pooler.requires_grad_(False)
    model = CrossSurrogate(encoder) if arch == "cross" else SiameseSurrogate(encoder, pooling)
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
                 extras: Optional[Callable[[Path], None]] = None, pooling: str = "mean") -> Path:
    """Siamese -> a sentence-transformers folder (Transformer + Pooling of `pooling`, weights at the root
    so plain AutoModel loads it too). Cross -> a CrossEncoder folder with an identity activation: the
    head regresses the teacher's similarity directly, so no sigmoid. `extras(folder)` adds side files;
    `card` (sentsim.training.model_card) is what README.md says the model is.

    Written beside `out` and swapped in by renames (sentsim.model_swap): a kill at any moment
    leaves the old model or the new one, whole."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentsim.model_swap import replace_folder
    from sentsim.training.model_card import CARD_FILE, render

    info = {"format": 1, "card": {"form": "cross-encoder" if arch == "cross" else "sentence-transformer",
                                  "max_seq_length": max_seq_length, **(card or {})}}

    def write(folder: Path) -> None:
        _save_final(hf_dir, folder, arch, max_seq_length, pooling)
        if extras is not None:
            extras(folder)
        (folder / CARD_FILE).write_text(render(info), encoding="utf-8")  # over the library's blank template

    return replace_folder(Path(out), write, info)


def _save_final(hf_dir: Path, folder: Path, arch: str, max_seq_length: int, pooling: str = "mean") -> None:
    if arch == "cross":
        from sentence_transformers import CrossEncoder

        ce = CrossEncoder(str(hf_dir), num_labels=1, max_length=max_seq_length, activation_fn=nn.Identity(),
                          device="cpu")
        ce.save(str(folder))
        return
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tr = Transformer(str(hf_dir), max_seq_length=max_seq_length)
    st = SentenceTransformer(modules=[tr, Pooling(tr.get_embedding_dimension(), pooling)], device="cpu")
    st.save(str(folder))


def predict(model, tok, arch: str, s1, s2, max_len: int, batch_size: int, device, autocast) -> np.ndarray:
    """Surrogate predictions; the Siamese form encodes each unique sentence once (its whole point)."""
    model.eval()
    out = []
    with torch.no_grad(), autocast():
        if arch == "cross":
            for i in range(0, len(s1), batch_size):
                out.append(model(tokenize(tok, "cross", s1[i:i + batch_size], s2[i:i + batch_size], max_len,
                                          device)).float().cpu())
            model.train()
            return torch.cat(out).numpy().astype(np.float64)
        uniq = sorted(set(s1) | set(s2), key=len)  # length-sorted: less padding per batch
        vecs = {}
        for i in range(0, len(uniq), batch_size):
            chunk = uniq[i:i + batch_size]
            enc = tok(chunk, padding=True, truncation=True, max_length=max_len, return_tensors="pt").to(device)
            emb = model.embed(**enc).float().cpu()
            vecs.update(zip(chunk, emb))
    model.train()
    a = torch.stack([vecs[s] for s in s1])
    b = torch.stack([vecs[s] for s in s2])
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy().astype(np.float64)
