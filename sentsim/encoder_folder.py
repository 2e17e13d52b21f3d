"""Is a folder an encoder sentsim can load: a trainer's --backbone, a student's rankencoder.base_encoder, a
harvest's rank.encoder? The check each makes before the run goes ahead.

transformers' AutoTokenizer does not fail on a folder without tokenizer files: it builds the config's
tokenizer class around an empty vocabulary (a WordPiece of its five special tokens, a byte-level BPE of its
special tokens only), and every sentence then reads as [UNK]. A model trained or a rank vector computed on
that learns nothing, without any error. So the tokenizer files are asked for by name, as `eval sts` asks for
them (sentsim.evaluation.model_folder), and a sentsim context model, whose model folders keep their tokenizer
in the bundle above them and are seq2seq scorers rather than encoders, is named as what it is.

Light on purpose (no transformers import): the trainers' drivers and the harvest's checks call it first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from sentsim.errors import UsageError

# the files a transformers tokenizer is read from (a fast tokenizer's, or a vocabulary a slow one is built on)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
CONTEXT_FILE = "context.json"  # a sentsim context-model bundle's own record (sentsim.context.model)


# sentencepiece models under other names (DeBERTa-v2/v3's spm.model, RemBERT's sentencepiece.model, Marian's
# source.spm): any file of these suffixes is a vocabulary
SENTENCEPIECE_SUFFIXES = (".model", ".spm")
# tokenizers that read no file at all (bytes or characters are their tokens), named in tokenizer_config.json
FILELESS_TOKENIZERS = ("ByT5Tokenizer", "CanineTokenizer")


def has_tokenizer(folder: Path) -> bool:
    if any((folder / t).is_file() for t in TOKENIZER_FILES):
        return True
    if any(f.suffix in SENTENCEPIECE_SUFFIXES and f.is_file() for f in folder.iterdir()):
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("tokenizer_class") in FILELESS_TOKENIZERS


def context_bundle(folder: Path) -> Optional[Path]:
    """The sentsim context-model bundle `folder` is, or whose model folder (BUNDLE/models/NAME) it is."""
    folder = folder.absolute()
    candidates = [folder] + ([folder.parent.parent] if folder.parent.name == "models" else [])
    for d in candidates:
        try:
            meta = json.loads((d / CONTEXT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and str(meta.get("format", "")).startswith("sentsim-context"):
            return d
    return None


def not_an_encoder(p: Path, bundle: Path) -> str:
    """What a folder inside a context-model bundle (`context_bundle`) is, in words that follow its flag."""
    what = "a sentsim context-model bundle" if bundle == p.absolute() else \
        f"a model folder of the sentsim context-model bundle {bundle}"
    return (f"{what} (a seq2seq scorer for harvests, its tokenizer kept beside context.json), not an encoder")


def encoder_folder(path: str, flag: str = "--backbone") -> Path:
    """The folder holding the transformers config and tokenizer of the encoder at `path`: the path itself, or
    the Transformer module's subfolder of a sentence-transformers model. Raises UsageError (one line, naming
    `flag` and `path`) when it is no folder, a context model, or has no config or no tokenizer."""
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{flag} {path}: not a directory")
    bundle = context_bundle(p)
    if bundle is not None:
        raise UsageError(f"{flag} {path}: {not_an_encoder(p, bundle)}; give a transformers or "
                         "sentence-transformers model folder")
    if (p / "modules.json").is_file():
        try:
            for m in json.loads((p / "modules.json").read_text()):
                if m.get("type", "").endswith("Transformer"):
                    p = p / m.get("path", "")
                    break
        except (json.JSONDecodeError, AttributeError):
            raise UsageError(f"{flag} {path}: modules.json is not valid") from None
    if not (p / "config.json").is_file():
        raise UsageError(f"{flag} {path}: not a model (no config.json)")
    if not has_tokenizer(p):
        rel = "" if p == Path(path) else f"{p.relative_to(path)}/"
        raise UsageError(f"{flag} {path}: no tokenizer ({rel}tokenizer.json or a vocabulary file) is there; "
                         "without it every sentence would read as unknown tokens. Copy the tokenizer files of "
                         "the model it came from into it")
    return p
