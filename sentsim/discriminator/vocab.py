"""Word-level vocabulary for the discriminator, built from the corpus and saved with the model."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np

from sentsim.errors import UsageError
from sentsim.identity import fingerprint

PAD, UNK, EMPTY = "<pad>", "<unk>", "<empty>"
SPECIALS = [PAD, UNK, EMPTY]
PAD_ID, UNK_ID, EMPTY_ID = 0, 1, 2
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)?|[^\w\s]", re.UNICODE)


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class Vocab:
    def __init__(self, tokens: list[str]):
        if tokens[: len(SPECIALS)] != SPECIALS:
            raise UsageError("vocabulary does not start with the special tokens <pad> <unk> <empty>")
        self.tokens = tokens
        self.index = {t: i for i, t in enumerate(tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.tokens)

    @classmethod
    def build(cls, texts: Iterable[str], size: int, min_count: int) -> "Vocab":
        counts: Counter = Counter()
        for t in texts:
            counts.update(tokenize(t))
        kept = [w for w, c in counts.most_common() if c >= min_count][: max(size - len(SPECIALS), 0)]
        return cls(SPECIALS + kept)

    def encode(self, text: str, max_tokens: int) -> np.ndarray:
        """Token ids, truncated to max_tokens; an empty sentence becomes [<empty>] (never length 0)."""
        ids = [self.index.get(w, UNK_ID) for w in tokenize(text)[:max_tokens]]
        return np.asarray(ids or [EMPTY_ID], dtype=np.int64)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.tokens, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        try:
            tokens = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path}: cannot read the vocabulary: {exc}") from None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise UsageError(f"{path}: the vocabulary must be a JSON list of strings")
        return cls(tokens)
