"""Save and load the discriminator: model.safetensors + config.json + vocab.json.

config.json carries the model config, the corpus fingerprint and the vocabulary fingerprint;
loading refuses a model trained on another corpus when the caller names the corpus. A folder is a model
while its config.json is there; an export replaces it in place (sentsim.model_swap.replace_in_place), and
loading reads the new model beside it when a kill cut that replacement short, and refuses in one line a
folder whose files are not whole (a truncated copy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from sentsim.errors import UsageError
from sentsim.identity import fingerprint

FORMAT = "sentsim-discriminator-v1"


def save_config(out: Path, job, corpus_fp: str, vocab, final: dict, history: list) -> None:
    cfg = {
        "format": FORMAT,
        "model": job.model.model_dump(),
        "train": job.train.model_dump(),
        "corpus_fingerprint": corpus_fp,
        "vocab_fingerprint": vocab.fingerprint,
        "vocab_size": len(vocab),
        "fingerprint": fingerprint(job.model_dump(), corpus_fp, vocab.fingerprint),
        "metrics": final,
        "history": history,
    }
    from storage.fs import write_text_atomic

    # config.json is the model's commit file: a folder without it is no model (sentsim.model_swap)
    write_text_atomic(str(Path(out) / "config.json"), json.dumps(cfg, indent=2))


class Discriminator:
    """Inference wrapper: encode sentences (to cache) and score contexts from cached reps."""

    def __init__(self, model, vocab, config: dict):
        self.model = model.eval()
        self.vocab = vocab
        self.config = config
        self.cfg = model.cfg
        self.window = model.cfg.window
        self.corpus_fingerprint = config.get("corpus_fingerprint")

    @property
    def rep_dim(self) -> int:
        return self.model.encoder.dim

    @classmethod
    def load(cls, path: str | Path, corpus: str | Path | None = None,
             expected_fingerprint: str | None = None) -> "Discriminator":
        from safetensors.torch import load_file

        from sentsim.discriminator.model import CoherenceModel, ModelConfig
        from sentsim.discriminator.vocab import Vocab
        from sentsim.evaluation.model_folder import check_model_folder
        from sentsim.model_swap import resolve_in_place
        from sentsim.retrieval.base import check_fingerprint

        path = resolve_in_place(path, "config.json")
        cp = path / "config.json"
        if not cp.is_file() or not (path / "model.safetensors").is_file():
            raise UsageError(f"{path}: not a discriminator directory (needs config.json and model.safetensors)")
        check_model_folder(path, "discriminator")  # every file whole, before any is parsed
        config = json.loads(cp.read_text(encoding="utf-8"))
        if config.get("format") != FORMAT:
            raise UsageError(f"{path}: unknown discriminator format {config.get('format')!r}")
        check_fingerprint(config, f"discriminator {path}", corpus=corpus, expected=expected_fingerprint)
        vocab = Vocab.load(path / "vocab.json")
        if vocab.fingerprint != config.get("vocab_fingerprint"):
            raise UsageError(f"{path}: vocab.json does not match the one the model was trained with")
        model = CoherenceModel(len(vocab), ModelConfig.model_validate(config["model"]))
        try:
            model.load_state_dict(load_file(str(path / "model.safetensors")))
        except (RuntimeError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"{path}: model.safetensors does not match config.json ({first})") from None
        return cls(model, vocab, config)

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Sentence reps float32 [n, 2*hidden] (batched by length)."""
        import torch

        from sentsim.discriminator.model import pad_batch

        toks = [self.vocab.encode(t, self.cfg.max_tokens) for t in texts]
        out = np.zeros((len(toks), self.rep_dim), dtype=np.float32)
        order = np.argsort([len(t) for t in toks], kind="stable")
        with torch.inference_mode():
            for lo in range(0, len(order), batch_size):
                idx = order[lo:lo + batch_size]
                tok, lens = pad_batch([toks[i] for i in idx])
                out[idx] = self.model.encoder(tok, lens).numpy()
        return out

    def project_contexts(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Cached reps of the context sentences, left/right [m, w, D] -> context features [m, F]."""
        import torch

        with torch.inference_mode():
            return self.model.head.project_context(
                torch.from_numpy(np.ascontiguousarray(left, np.float32)),
                torch.from_numpy(np.ascontiguousarray(right, np.float32))).numpy()

    def context_core(self, left: np.ndarray, right: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """The cacheable, context-only part of the features: [m, 1 + 2d] (g, l, r)."""
        import torch

        out = np.empty((len(left), self.model.head.context_core_dim), np.float32)
        with torch.inference_mode():
            for lo in range(0, len(left), batch_size):
                out[lo:lo + batch_size] = self.model.head.project_context_core(
                    torch.from_numpy(np.ascontiguousarray(left[lo:lo + batch_size], np.float32)),
                    torch.from_numpy(np.ascontiguousarray(right[lo:lo + batch_size], np.float32))).numpy()
        return out

    def project_sentences(self, reps: np.ndarray) -> np.ndarray:
        """Sentence reps [m, D] -> sentence features [m, G] (computed once per query)."""
        import torch

        reps = np.asarray(reps, np.float32)
        reps = reps[None, :] if reps.ndim == 1 else reps
        with torch.inference_mode():
            return self.model.head.project_sentence(torch.from_numpy(np.ascontiguousarray(reps))).numpy()

    def score_projected(self, ctx: np.ndarray, sent: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """Logits [m] of one sentence (features [G] or [1, G]; or [m, G]) in m projected contexts."""
        import torch

        sent = np.asarray(sent, np.float32)
        sent = sent[None, :] if sent.ndim == 1 else sent
        out = np.empty(len(ctx), dtype=np.float32)
        with torch.inference_mode():
            for lo in range(0, len(ctx), batch_size):
                ss = sent if sent.shape[0] == 1 else sent[lo:lo + batch_size]
                out[lo:lo + batch_size] = self.model.head.score_projected(
                    torch.from_numpy(np.ascontiguousarray(ctx[lo:lo + batch_size])),
                    torch.from_numpy(np.ascontiguousarray(ss))).numpy()
        return out

    def score(self, left: np.ndarray, centre: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Logits for windows given cached reps: left/right [m, w, D], centre [m, D] or [D]."""
        return self.score_projected(self.project_contexts(left, right), self.project_sentences(centre))

    def probability(self, left, centre, right) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.score(left, centre, right)))
