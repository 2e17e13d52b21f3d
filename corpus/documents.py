"""Turning raw records into sentence and chunk rows. Runs inside the Ray task that owns a unit."""

from __future__ import annotations

import codecs
import hashlib
import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import pyarrow as pa

from corpus.config import CorpusConfig
from corpus.readers import NOT_UTF8, RawRecord
from corpus.splitter import cap_tokens, lone_surrogate, normalise, split_sentences

# sentence_id = (doc_key << SENT_BITS) | sent_idx: ids are unique, stable across re-runs of the
# same inputs, and consecutive within a document, so a sentence's neighbours are id - 1 and id + 1.
SENT_BITS = 20
MAX_SENTENCES_PER_DOC = 1 << SENT_BITS

SENTENCE_SCHEMA = pa.schema(
    [
        ("sentence_id", pa.int64()),
        ("doc_id", pa.string()),
        ("para_idx", pa.int32()),
        ("sent_idx", pa.int32()),
        ("text", pa.string()),
        ("n_tokens", pa.int32()),
    ]
)
CHUNK_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.int64()),
        ("doc_id", pa.string()),
        ("first_sentence_id", pa.int64()),
        ("n_sentences", pa.int32()),
    ]
)


def doc_key_of(sentence_id):
    """The document key of a sentence id (an int or a numpy array of them)."""
    return sentence_id >> SENT_BITS


def sentence_id_of(doc_key, sent_idx):
    """The id of sentence `sent_idx` of document `doc_key`; sent_idx 0 gives the document's first id."""
    return (doc_key << SENT_BITS) | sent_idx


def same_doc(a, b):
    return doc_key_of(a) == doc_key_of(b)


# Sentences given as text (a pairs file, `sentsim contexts --sentences`), not taken from the corpus, get
# ids with this bit set: a document key would need 42 bits to reach it, so they never meet a corpus id.
EXPLICIT_ID_BIT = 1 << 62


def text_id(text: str) -> int:
    """The id of a sentence given by its text: a hash of the text, the same in every run and process."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return EXPLICIT_ID_BIT | (h & (EXPLICIT_ID_BIT - 1))


class BadDocument(Exception):
    """A record that cannot be ingested; the message is the user-facing reason."""


@dataclass
class UnitResult:
    sentences: dict = field(default_factory=lambda: {k: [] for k in SENTENCE_SCHEMA.names})
    chunks: dict = field(default_factory=lambda: {k: [] for k in CHUNK_SCHEMA.names})
    documents: int = 0
    truncated_sentences: int = 0
    empty_paragraphs: int = 0
    skipped: List[dict] = field(default_factory=list)

    def tables(self) -> Tuple[pa.Table, pa.Table]:
        return (
            pa.Table.from_pydict(self.sentences, schema=SENTENCE_SCHEMA),
            pa.Table.from_pydict(self.chunks, schema=CHUNK_SCHEMA),
        )


def parse_record(rec: RawRecord) -> Tuple[Optional[str], List[str]]:
    """(doc_id or None, paragraphs). Raises BadDocument with a reason for the user."""
    if rec.kind == "parquet":
        doc_id, body = rec.payload
        if body is NOT_UTF8:
            raise BadDocument("text (or id) is not valid UTF-8")
        if body is None:
            raise BadDocument("empty document (null text)")
        if isinstance(body, str):
            return doc_id, body.split("\n\n") if "\n\n" in body else [body]
        if isinstance(body, list) and all(isinstance(p, str) or p is None for p in body):
            return doc_id, [p or "" for p in body]
        raise BadDocument("text column must hold a string or a list of strings")
    raw: bytes = rec.payload
    if rec.line == 1 and raw.startswith(codecs.BOM_UTF8):  # a file's byte-order mark, not its first document's text
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadDocument(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    if rec.kind == "text":
        # A blank line is a paragraph break; single newlines are hard wraps inside a paragraph.
        paras, cur = [], []
        for line in text.splitlines():
            if line.strip():
                cur.append(line)
            elif cur:
                paras.append(" ".join(cur))
                cur = []
        if cur:
            paras.append(" ".join(cur))
        return None, paras
    return _parse_json_document(text)


def json_refusal(exc: Exception) -> str:
    """What is wrong with a line that json.loads refused: the reason for a user, without a traceback."""
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON ({exc.msg} at column {exc.colno})"
    if isinstance(exc, RecursionError):
        return "malformed JSON (nested too deeply to read)"
    # Python refuses to read an integer of more than sys.get_int_max_str_digits() digits
    return f"malformed JSON ({str(exc).split(';')[0]})"


def surrogate_refusal(text: str, what: str) -> Optional[str]:
    """The reason to refuse `text` (named `what`) when it holds a lone surrogate (a JSON escape such as
    \\ud800 that stands for no character), else None."""
    at = lone_surrogate(text)
    if at is None:
        return None
    return (f"{what} holds a lone surrogate escape (\\u{ord(text[at]):04x} at character {at}), "
            "which is no character; fix the escape")


def _parse_json_document(text: str) -> Tuple[Optional[str], List[str]]:
    try:
        obj = json.loads(text)
        doc_id = obj.get("id") if isinstance(obj, dict) else None
        doc_id = None if doc_id is None else str(doc_id)  # a nested id is written out: as deep as it was read
    except (ValueError, RecursionError) as exc:  # ValueError: malformed JSON, or an integer too long to read
        raise BadDocument(json_refusal(exc)) from None
    if not isinstance(obj, dict):
        raise BadDocument("a JSON line must be an object with a 'paragraphs' list")
    paras = obj.get("paragraphs")
    if paras is None:
        # JSONL from elsewhere mostly holds one text field: say what this reader wants instead of it
        texts = [k for k, v in obj.items() if isinstance(v, str) and k != "id"]
        held = f" (this object's text fields: {', '.join(repr(k) for k in texts[:4])})" if texts else ""
        raise BadDocument(f"missing 'paragraphs' field{held}; a JSON line gives a document as "
                          "{\"paragraphs\": [\"...\", ...]}, or give a Parquet file with its text in a column "
                          "(text_column)")
    if not isinstance(paras, list) or not all(isinstance(p, str) for p in paras):
        raise BadDocument("'paragraphs' must be a list of strings")
    for what, value in [("id", doc_id or "")] + [(f"paragraph {i}", p) for i, p in enumerate(paras)]:
        reason = surrogate_refusal(value, what)
        if reason:
            raise BadDocument(reason)
    return doc_id, paras


def ingest_document(out: UnitResult, rec: RawRecord, doc_key: int, cfg: CorpusConfig) -> None:
    """Append one document's sentences and chunks to `out`, or raise BadDocument."""
    doc_id, paragraphs = parse_record(rec)
    if doc_id is None:
        doc_id = f"{rec.source}:{rec.line}"
    sents: List[Tuple[int, str, int, bool]] = []
    empty = 0
    for p_idx, para in enumerate(paragraphs):
        if len(para) > cfg.max_paragraph_chars:
            raise BadDocument(
                f"paragraph {p_idx} has {len(para):,} characters (max_paragraph_chars={cfg.max_paragraph_chars:,})"
            )
        norm = normalise(para)
        if not norm:
            empty += 1
            continue
        for s in split_sentences(norm):
            text, n_tok, cut = cap_tokens(s, cfg.max_sentence_tokens)
            sents.append((p_idx, text, n_tok, cut))
    if not sents:
        raise BadDocument("empty document (no text after whitespace normalisation)")
    if len(sents) > MAX_SENTENCES_PER_DOC:
        raise BadDocument(f"{len(sents):,} sentences in one document (limit {MAX_SENTENCES_PER_DOC:,})")
    base = sentence_id_of(doc_key, 0)
    S = out.sentences
    for i, (p_idx, text, n_tok, cut) in enumerate(sents):
        S["sentence_id"].append(base | i)
        S["doc_id"].append(doc_id)
        S["para_idx"].append(p_idx)
        S["sent_idx"].append(i)
        S["text"].append(text)
        S["n_tokens"].append(n_tok)
        out.truncated_sentences += cut
    size = cfg.chunk.size
    stride = cfg.chunk.stride or size
    C = out.chunks
    for c_idx, start in enumerate(range(0, len(sents), stride)):
        n = min(size, len(sents) - start)
        C["chunk_id"].append(base | c_idx)
        C["doc_id"].append(doc_id)
        C["first_sentence_id"].append(base | start)
        C["n_sentences"].append(n)
        if start + size >= len(sents):
            break
    out.documents += 1
    out.empty_paragraphs += empty
