"""EDA-style augmentation for PaSeR (002 §3.1.3; Wei & Zou 2019): synonym replacement, random
deletion, token reordering. Mask tokens are never touched, so s~ keeps its masked phrases.

Synonym replacement needs a thesaurus; WordNet is not available offline, so a word's "synonym" is
its nearest whole-word neighbour by cosine of the encoder's input embeddings (the vocabulary the
model already has), restricted to alphabetic vocabulary entries.
"""

from __future__ import annotations

import numpy as np
import torch


class EmbeddingSynonyms:
    def __init__(self, tok, embeddings: torch.Tensor, max_vocab: int = 30000):
        vocab = tok.get_vocab()
        words = [(w, i) for w, i in vocab.items()
                 if w.isalpha() and w.islower() and len(w) > 2 and i < embeddings.shape[0]]
        words.sort(key=lambda x: x[1])
        words = words[:max_vocab]
        self.words = [w for w, _ in words]
        self.index = {w: k for k, w in enumerate(self.words)}
        with torch.no_grad():
            e = embeddings[torch.tensor([i for _, i in words], dtype=torch.long)].float()
            self.vecs = torch.nn.functional.normalize(e, dim=-1)

    def synonym(self, word: str) -> str | None:
        k = self.index.get(word.lower())
        if k is None:
            return None
        sims = self.vecs @ self.vecs[k]
        sims[k] = -1.0
        return self.words[int(torch.argmax(sims))]


def eda(text: str, rng: np.random.Generator, mask_token: str, p_syn: float = 0.0, p_del: float = 0.0,
        p_swap: float = 0.0, synonyms: EmbeddingSynonyms | None = None) -> str:
    words = text.split()
    if not words:
        return text
    if p_syn and synonyms is not None:
        words = [(synonyms.synonym(w) or w) if mask_token not in w and rng.random() < p_syn else w for w in words]
    if p_del and len(words) > 1:
        kept = [w for w in words if mask_token in w or rng.random() >= p_del]
        words = kept or [words[int(rng.integers(len(words)))]]
    if p_swap and len(words) > 1:
        for _ in range(max(1, int(round(p_swap * len(words))))):
            i, j = rng.integers(len(words), size=2)
            words[i], words[j] = words[j], words[i]
    return " ".join(words)
