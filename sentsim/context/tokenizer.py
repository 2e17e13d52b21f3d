"""Subword tokenizer of the context models: byte-level BPE trained on the corpus, or a warm-start checkpoint's.

Only the `tokenizers` library is used and nothing is fetched from a hub. The tokenizer is saved beside the
model as `tokenizer.json`; its SHA-256 is recorded in `context.json` so that a model is never paired with
a tokenizer it was not trained with.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sentsim.errors import UsageError

# Roles every tokenizer must provide. For the trained BPE they are dedicated tokens; for a BERT-style
# warm start they map onto that vocabulary's own special and `[unusedN]` tokens (no embedding resize).
ROLES = ("pad", "bos", "eos", "unk", "sep", "blank", "tag_fwd", "tag_left", "tag_right")
BPE_SPECIALS = {
    "pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "<sep>", "blank": "<blank>",
    "tag_fwd": "<fwd>", "tag_left": "<left>", "tag_right": "<right>",
}
WORDPIECE_SPECIALS = {
    "pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]", "sep": "[SEP]", "blank": "[MASK]",
    "tag_fwd": "[unused0]", "tag_left": "[unused1]", "tag_right": "[unused2]",
}


class ContextTokenizer:
    """A `tokenizers.Tokenizer` plus the ids of the roles above. `encode` never adds special tokens."""

    def __init__(self, tokenizer: Tokenizer, specials: dict[str, str]):
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.specials = dict(specials)
        self.ids: dict[str, int] = {}
        for role in ROLES:
            tok = specials.get(role)
            tid = tokenizer.token_to_id(tok) if tok else None
            if tid is None:
                raise UsageError(f"tokenizer has no token {tok!r} for role {role!r}")
            self.ids[role] = tid
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.sha256 = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()

    def __getattr__(self, name: str) -> int:  # tok.pad_id, tok.eos_id, ...
        if name.endswith("_id") and name[:-3] in ROLES:
            return self.ids[name[:-3]]
        raise AttributeError(name)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def save(self, directory: str | Path) -> Path:
        """Roles first, then tokenizer.json, each whole or not at all: a context trainer resumes with the
        tokenizer it finds there, so a kill while saving must leave either none or one that reads back."""
        from storage.fs import write_text_atomic

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(str(d / "tokenizer_roles.json"), json.dumps(self.specials, indent=1, sort_keys=True))
        # pretty, as Tokenizer.save writes it: the same bytes as tokenizers saved before
        write_text_atomic(str(d / "tokenizer.json"), self.tokenizer.to_str(pretty=True))
        return d / "tokenizer.json"

    @classmethod
    def load(cls, directory: str | Path, remedy: str = "") -> "ContextTokenizer":
        """`remedy`: what the caller's user can do about a file that does not read, added to the one line."""
        d = Path(directory)
        path = d / "tokenizer.json" if d.is_dir() else d
        roles = path.parent / "tokenizer_roles.json"
        if not path.is_file():
            raise UsageError(f"no tokenizer.json in {directory}")

        def unreadable(what: Path, exc: Exception) -> UsageError:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            return UsageError(f"{what}: not a readable tokenizer file ({reason})" + (f"; {remedy}" if remedy else ""))

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot parse
            raise unreadable(path, exc) from None
        try:
            specials = json.loads(roles.read_text()) if roles.is_file() else _guess_roles(tok)
        except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise unreadable(roles, exc) from None
        if not isinstance(specials, dict):
            raise unreadable(roles, ValueError("not a JSON object of roles"))
        return cls(tok, specials)


def _guess_roles(tok: Tokenizer) -> dict[str, str]:
    if tok.token_to_id("<pad>") is not None and tok.token_to_id("<blank>") is not None:
        return dict(BPE_SPECIALS)
    if tok.token_to_id("[PAD]") is not None:
        return dict(WORDPIECE_SPECIALS)
    raise UsageError("tokenizer.json has neither the BPE nor the WordPiece special tokens this project needs")


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> ContextTokenizer:
    """Byte-level BPE (as GPT-2/BART) with the context-model special tokens at ids 0..8."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    specials = [BPE_SPECIALS[r] for r in ROLES]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return ContextTokenizer(tok, BPE_SPECIALS)


BART_SPECIALS = {
    "pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "</s>", "blank": "<mask>",
    "tag_fwd": "<fwd>", "tag_left": "<left>", "tag_right": "<right>",
}


def seq2seq_from_checkpoint(path: str | Path) -> ContextTokenizer:
    """The tokenizer of a pretrained BART-style checkpoint, with the direction tags added if missing."""
    p = Path(path) / "tokenizer.json"
    if not p.is_file():
        raise UsageError(f"pretrained checkpoint {path} has no tokenizer.json")
    tok = Tokenizer.from_file(str(p))
    missing = [t for t in BART_SPECIALS.values() if tok.token_to_id(t) is None]
    if any(t not in ("<fwd>", "<left>", "<right>") for t in missing):
        raise UsageError(f"pretrained checkpoint {path}: tokenizer lacks {missing} "
                         "(expected BART's <s> </s> <pad> <unk> <mask>)")
    if missing:
        tok.add_special_tokens(missing)
    return ContextTokenizer(tok, BART_SPECIALS)


def wordpiece_from_checkpoint(path: str | Path) -> ContextTokenizer:
    """The tokenizer of a BERT-style checkpoint directory (tokenizer.json), used for a warm start."""
    p = Path(path) / "tokenizer.json"
    if not p.is_file():
        raise UsageError(f"warm-start checkpoint {path} has no tokenizer.json")
    return ContextTokenizer(Tokenizer.from_file(str(p)), WORDPIECE_SPECIALS)
