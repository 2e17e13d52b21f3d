"""Sentence splitting and normalisation.

Sentences come from blingfire's trained sentence breaker (a maintained PyPI package with its
model inside the wheel, so it works offline and is fast enough for millions of paragraphs).
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

_WS = re.compile(r"\s+")
# A JSON escape such as "\ud800" decodes to a lone surrogate: a Python string, but no UTF-8 text, so
# the sentence breaker (and every Arrow or Parquet writer) fails on it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> Optional[int]:
    """The offset of the first lone surrogate in `text` (which no UTF-8 file can hold), or None."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()


def normalise(text: str) -> str:
    """Collapse every run of whitespace (incl. newlines, tabs, NBSP) to one space."""
    return _WS.sub(" ", text).strip()


def split_sentences(paragraph: str) -> List[str]:
    """Split one already-normalised paragraph into sentences, keeping order."""
    if not paragraph:
        return []
    at = lone_surrogate(paragraph)
    if at is not None:  # callers check their input first; this names the problem should one slip through
        raise ValueError(f"text holds a lone surrogate (U+{ord(paragraph[at]):04X} at character {at}), "
                         "which is not UTF-8 text")
    import blingfire  # here, not at the top: scoring and training import this module but never split

    return [s for s in (normalise(x) for x in blingfire.text_to_sentences(paragraph).split("\n")) if s]


def cap_tokens(sentence: str, max_tokens: int) -> Tuple[str, int, bool]:
    """Return (text, n_tokens, truncated). Tokens are whitespace words, the unit users reason in."""
    words = sentence.split(" ")
    if len(words) <= max_tokens:
        return sentence, len(words), False
    return " ".join(words[:max_tokens]), max_tokens, True
