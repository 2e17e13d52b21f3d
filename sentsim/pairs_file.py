"""Sentence-pair files, in every format the commands accept: the one reader of STS-B lines.

`read_pairs_file(path)` returns [(s1, s2, gold or None)] from
- STS-B TSV (genre, file, year, id, score, s1, s2[, source columns]: split on TAB only, no quoting);
- TSV or comma CSV with a header line naming the sentence columns (s1/s2, sentence1/sentence2,
  sentence_A/sentence_B) and optionally a gold column (gold, score, label, similarity,
  relatedness_score), found by name; CSV is parsed with the csv module (quotes, embedded commas);
- header-less TSV: s1<TAB>s2[<TAB>gold];
- SICK's header-less TSV (SICK_train.txt, SICK_trial.txt: pair_ID, sentence_A, sentence_B, relatedness_score,
  entailment_judgment), told line by line by its shape: five fields, an integer id, a score in [0, 5] and
  ENTAILMENT, NEUTRAL or CONTRADICTION; read as `eval sts` reads SICK, the relatedness score as gold and the
  label not at all. SICK's release with its header line is read by the header's names (sentence_A,
  sentence_B, relatedness_score);
- JSON lines, one object with s1, s2[, gold] a line: a file named .jsonl, .ndjson or .json, or one whose
  first line that is not blank starts with `{`, whatever its name (a .json file that is one JSON array or
  document is refused, never read a line at a time);
- Parquet with columns s1, s2[, gold] (read by those names alone where it has them), or else the other names
  a header line may give them (sentence1/sentence2, score ...), found as there.
Any of these may be gzip-compressed (found by its first bytes, 1f 8b; a plain file named .gz is read as it
is): the name without .gz tells the format (p.tsv.gz is TSV, p.jsonl.gz JSON lines).
Under a header line, a row with more filled fields than the header names is refused (a TAB inside a sentence
would otherwise move its text into a column nobody reads). An empty gold cell (or a null) is a pair without
gold; an empty or blank s1 or s2 is refused (a wholly blank line is skipped).
A first line that names columns other than these is refused, never read as a pair: the error names the
columns it found and the ones read. Such a header is a first line that is neither a header above nor a pair
that can be read, each of whose fields is a short name (a letter, then letters, digits, spaces, `_`, `-`,
`.`): with 3 or more columns, its third (gold) field is not a number (`sentA,sentB,score`). Two columns
cannot always tell a header from a pair of one-word sentences: a header is two names of which one is a
column name, above or common elsewhere (premise, hypothesis, sentence, sent, text, question, query, answer,
passage, document, anchor, positive, source, target ...; `question1`, `sentA`, `text-2` with a 1/2 or a/b
suffix), and the other has no space either, or is a column name too (`Sentence A<TAB>Sentence B`). Such a
two-word line above lines that are all pairs of words too (`cat<TAB>dog`, two fields each) is no different
from them: it is read as a pair, with a note naming it, unless it names a gold column. Above any other rows of
two fields (sentences: `question<TAB>answer` above `What is it?<TAB>A cat.`) the same line, naming no gold
column, is the header of the two sentence columns, s1 then s2, with a note naming it; a file whose rows have
more fields, or a column that is a number in every row (a score: `sentence<TAB>rating`), or no row at all, is
refused as above. A pair such as `question<TAB>answer` above sentences is read by putting a header line
`s1<TAB>s2` above it. The word-pair reading is tried first so that a file read as pairs of words is read so
whatever its rows below (a harvest resumed on it reads the pairs its first units did).

Every problem is an InputError naming the file and, where there is one, the line: JSON that Python
cannot read (nested too deeply, an integer of thousands of digits), a lone surrogate escape ("\\ud800",
which json.loads accepts but no text can hold), Parquet strings that are not UTF-8 and a truncated or
corrupt gzip stream included, so that a harvest refuses the file before any model loads.

Every row is one pair, in file order, a repeated row included: STS-B's own test file repeats two pairs,
one of them with two different gold scores, and each row is a judgement to score and compare.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import math
import re
import sys
import zlib
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

from corpus.documents import json_refusal, surrogate_refusal
from sentsim.errors import InputError, UsageError

Pair = Tuple[str, str, Optional[float]]

S1_NAMES = ("s1", "sentence1", "sentence_a", "sentence 1", "text1", "text_a")
S2_NAMES = ("s2", "sentence2", "sentence_b", "sentence 2", "text2", "text_b")
GOLD_NAMES = ("gold", "score", "label", "similarity", "relatedness_score", "relatedness")
# column names of other datasets' pair files (SNLI, QQP, sentence-transformers ...), read as the names of a
# header line's columns, never as a pair of one-word sentences (see the module's docstring)
OTHER_NAMES = ("premise", "hypothesis", "sentence", "sent", "text", "question", "query", "answer", "passage",
               "document", "doc", "context", "anchor", "positive", "source", "target", "src", "tgt", "string",
               "claim", "evidence", "title", "utterance")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 _.\-]{0,39}")
_NUMBERED = re.compile(r"([a-z]+)[ _\-]?(?:[0-9]+|[ab])")
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
SICK_LABELS = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")
_PAIR_ID = re.compile(r"[0-9]+")


def parse_score(text: str, where: str) -> float:
    """A finite gold score, or an InputError naming `where` (file:line)."""
    shown = repr(text) if len(text) <= 40 else repr(text[:30] + "...")  # a cell may hold a whole paragraph
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{where}: score {shown} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: score {shown} is not finite")
    return value


def checked_pair(s1: str, s2: str, gold: Optional[float], where: str) -> Pair:
    """The pair, or an InputError naming `where` when a sentence is empty or only white space: a row with a
    sentence missing is a mistake, never a pair to score."""
    for name, value in (("s1", s1), ("s2", s2)):
        if not value.strip():
            raise InputError(f"{where}: {name} is empty")
    return s1, s2, gold


def stsb_fields(cols: Sequence[str], where: str) -> Pair:
    """(s1, s2, gold) of one STS-B line already split on TAB (7 fields, some lines carry 2 more)."""
    if len(cols) < 7:
        raise InputError(f"{where}: expected at least 7 TAB-separated fields (STS-B), found {len(cols)}")
    return cols[5].strip(), cols[6].strip(), parse_score(cols[4].strip(), where)


def is_sick_line(cols: Sequence[str]) -> bool:
    """Whether a header-less line is SICK's (pair_ID, sentence_A, sentence_B, relatedness_score,
    entailment_judgment), told by its shape: five fields, an integer id, a score in [0, 5], one of SICK's
    three labels."""
    if len(cols) != 5 or not _PAIR_ID.fullmatch(cols[0].strip()) or cols[4].strip().upper() not in SICK_LABELS:
        return False
    try:
        score = float(cols[3])
    except ValueError:
        return False
    return 0 <= score <= 5


def is_stsb_line(cols: Sequence[str]) -> bool:
    return len(cols) >= 7 and _is_number(cols[4])


def decode_text(path: Path, raw: Optional[bytes] = None) -> str:
    """UTF-8 text (of `raw`, the file's bytes when not given), or an InputError naming the first line that
    is not UTF-8. A byte-order mark (which Excel and Notepad write) is dropped: it would otherwise hide a
    header line's first column name, and that header would be read as a pair."""
    raw = path.read_bytes() if raw is None else raw
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
                         "save the file as UTF-8") from None


def split_lines(text: str) -> List[str]:
    # split on \n only: str.splitlines() would also split on \x85, \u2028 ... inside sentences
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in out]


def _header_columns(cols: Sequence[str]) -> Optional[Tuple[int, int, Optional[int]]]:
    """(s1, s2, gold) column positions when `cols` is a header line, else None."""
    names = [c.strip().lower() for c in cols]

    def find(options):
        return next((i for i, n in enumerate(names) if n in options), None)

    i1, i2 = find(S1_NAMES), find(S2_NAMES)
    if i1 is None or i2 is None:
        return None
    return i1, i2, find(GOLD_NAMES)


def names_only(fields: Sequence[str]) -> bool:
    """Whether every field is a short name (a letter, then letters, digits, spaces, `_`, `-`, `.`): a line that
    could be a header, where a line of data (a sentence, a score) is not."""
    return all(_NAME.fullmatch(f.strip()) for f in fields)


def _is_column_name(field: str) -> bool:
    name = field.strip().lower()
    if name in S1_NAMES + S2_NAMES + GOLD_NAMES + OTHER_NAMES:
        return True
    numbered = _NUMBERED.fullmatch(name)
    return numbered is not None and numbered.group(1) in OTHER_NAMES


def _unread_header(cols: Sequence[str]) -> bool:
    """Whether a first line that is neither a recognised header nor an STS-B line names columns instead
    (the rule is in the module's docstring)."""
    fields = [c.strip() for c in cols]
    if not all(_NAME.fullmatch(f) for f in fields):
        return False
    if len(fields) >= 3:
        return not _is_number(fields[2])
    names = [_is_column_name(f) for f in fields]
    return len(fields) == 2 and (all(names) or (any(names) and " " not in "".join(fields)))


def _header_refusal(cols: Sequence[str], where: str, delimiter: str) -> InputError:
    found = ", ".join(c.strip() for c in cols)
    sep = "<TAB>" if delimiter == "\t" else ","
    pair = (f", or, if it is a pair, put the line s1{sep}s2 above it" if len(cols) == 2 else
            f", or, if it is a pair, its third field (gold) {cols[2].strip()!r} is not a number")
    alternatives = ", ".join(f"{a}/{b}" for a, b in zip(S1_NAMES[1:], S2_NAMES[1:]))
    return InputError(f"{where}: header line names columns {found}; the columns read are s1 and s2 (or "
                      f"{alternatives}) and optionally gold (or {', '.join(GOLD_NAMES[1:])}){pair}")


def _words_pair(cols: Sequence[str]) -> bool:
    """Whether a row's s1 and s2 are each one word (a short name without a space)."""
    return len(cols) >= 2 and all(_NAME.fullmatch(c.strip()) and " " not in c.strip() for c in cols[:2])


def first_line_header(cols: Sequence[str], where: str, delimiter: str,
                      below: Sequence[Sequence[str]] = ()) -> Optional[Tuple[int, int, Optional[int]]]:
    """A file's first line read as a header: its (s1, s2, gold) column positions when it names them, None
    when it is data; an InputError when it names other columns (the rule is in the module's docstring).
    `below` are the rows under it: two words above rows that are all pairs of words are a pair like them,
    read as one with a note on stderr (the note names the line, in case it was a header after all)."""
    header = _header_columns(cols)
    if header is None and not is_stsb_line(cols) and _unread_header(cols):
        # only a line like the rows under it: of two fields, as they are, and naming no gold column (a header
        # above scored rows, `text,label` above `good,positive`, names its columns)
        if len(cols) == 2 and _words_pair(cols) and not {c.strip().lower() for c in cols} & set(GOLD_NAMES) \
                and below and all(len(r) == 2 and _words_pair(r) for r in below):
            sep = "<TAB>" if delimiter == "\t" else ","
            a, b = (c.strip() for c in cols)
            print(f"note: {where}: {a}{sep}{b} read as a pair, as every line under it is a pair of words; if it "
                  f"names the columns, write s1{sep}s2 there instead", file=sys.stderr)
            return None
        if _names_two_sentence_columns(cols, below):
            sep = "<TAB>" if delimiter == "\t" else ","
            a, b = (c.strip() for c in cols)
            print(f"note: {where}: {a}{sep}{b} read as the header line, its columns s1 and s2 in that order; if it "
                  f"is a pair, put the line s1{sep}s2 above it", file=sys.stderr)
            return 0, 1, None
        raise _header_refusal(cols, where, delimiter)
    return header


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _names_two_sentence_columns(cols: Sequence[str], below: Sequence[Sequence[str]]) -> bool:
    """Whether a first line of two unread column names (`question<TAB>answer`) is the header of the two
    sentence columns under it: it names no gold column, and every row under it is two sentences (two fields,
    any after them empty), neither column a number in every row (a score column, `sentence<TAB>rating`)."""
    if len(cols) != 2 or {c.strip().lower() for c in cols} & set(GOLD_NAMES) or not below:
        return False
    if not all(len(r) >= 2 and not any(c.strip() for c in r[2:]) for r in below):
        return False
    return not any(all(_is_number(r[i].strip()) for r in below) for i in (0, 1))


def _rows_with_header(rows: List[Tuple[int, List[str]]], path: str, header, named: int,
                      delimiter: str) -> List[Pair]:
    """The pairs under a header line of `named` columns. A row with more (filled) fields than the header names
    is refused: its text has most likely moved (a TAB in a sentence), and reading the named columns alone
    would drop what moved."""
    i1, i2, ig = header
    need = max(i for i in header if i is not None) + 1
    out = []
    for n, cols in rows:
        if len(cols) < need:
            raise InputError(f"{path}:{n}: expected {need} columns as named in the header, found {len(cols)}")
        if any(c.strip() for c in cols[named:]):
            sep = "a TAB" if delimiter == "\t" else "an unquoted comma"
            raise InputError(f"{path}:{n}: {len(cols)} fields where the header names {named} columns; {sep} inside "
                             "a sentence moves its text into the next column: remove it (or name every column in "
                             "the header)")
        gold = None
        if ig is not None and cols[ig].strip() != "":
            gold = parse_score(cols[ig].strip(), f"{path}:{n}")
        out.append(checked_pair(cols[i1].strip(), cols[i2].strip(), gold, f"{path}:{n}"))
    return out


def _delimited(text: str, path: str, delimiter: str) -> List[Pair]:
    if delimiter == "\t":  # TAB files are never quoted (STS-B's sentences hold quote characters)
        rows = [(n, line.split("\t")) for n, line in enumerate(split_lines(text), 1) if line.strip()]
    else:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        rows = []
        try:
            for cols in reader:
                if any(c.strip() for c in cols):
                    rows.append((reader.line_num, cols))
        except csv.Error as exc:
            raise InputError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
    if not rows:
        return []
    header = first_line_header(rows[0][1], f"{path}:{rows[0][0]}", delimiter, [cols for _, cols in rows[1:]])
    if header is not None:
        return _rows_with_header(rows[1:], path, header, len(rows[0][1]), delimiter)
    out = []
    for n, cols in rows:
        where = f"{path}:{n}"
        if is_stsb_line(cols):
            out.append(checked_pair(*stsb_fields(cols, where), where))
        elif is_sick_line(cols):
            # as `eval sts` reads SICK (sentsim.evaluation.datasets.load_sick_file): the label is no gold
            out.append(checked_pair(cols[1].strip(), cols[2].strip(), parse_score(cols[3].strip(), where), where))
        elif len(cols) in (2, 3):
            # an empty third cell is no gold, as under a header line
            gold = parse_score(cols[2].strip(), where) if len(cols) == 3 and cols[2].strip() else None
            out.append(checked_pair(cols[0].strip(), cols[1].strip(), gold, where))
        else:
            sep = "TAB" if delimiter == "\t" else "comma"
            sick = (", or a SICK line: pair_ID, sentence_A, sentence_B, relatedness_score in 0-5, "
                    f"{'/'.join(SICK_LABELS)}" if len(cols) == 5 else "")
            raise InputError(f"{where}: expected s1 and s2 separated by {sep} (or a header line naming "
                             f"s1 and s2{sick}), found {len(cols)} column(s)")
    return out


def _jsonl(text: str, path: str) -> List[Pair]:
    out = []
    for n, line in enumerate(split_lines(text), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:  # ValueError: malformed JSON, or an integer too long to read
            raise InputError(f"{where}: {json_refusal(exc)}; expected a JSON object with s1 and s2") from None
        if not isinstance(obj, dict) or "s1" not in obj or "s2" not in obj:
            raise InputError(f"{where}: expected a JSON object with s1 and s2")
        s1, s2 = obj["s1"], obj["s2"]
        if not isinstance(s1, str) or not isinstance(s2, str):
            raise InputError(f"{where}: s1 and s2 must be strings")
        for name, value in (("s1", s1), ("s2", s2)):
            reason = surrogate_refusal(value, name)
            if reason:  # checked here, not when the pair reaches a model or a Parquet writer
                raise InputError(f"{where}: {reason}")
        gold = obj.get("gold")
        if gold is not None:
            if isinstance(gold, bool) or not isinstance(gold, (int, float)):
                raise InputError(f"{where}: gold must be a number")
            gold = parse_score(str(gold), where)
        out.append(checked_pair(s1, s2, gold, where))
    return out


def arrow_texts(column, where: str, name: str) -> list:
    """The Python values of an Arrow column, or an InputError naming the first row whose bytes are not UTF-8
    (a string column's bytes are not checked when a Parquet file is written)."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        pass
    for row, cell in enumerate(column):
        try:
            cell.as_py()
        except UnicodeDecodeError:
            raise InputError(f"{where}: row {row}: {name} is not UTF-8 text") from None
    raise InputError(f"{where}: column {name} is not UTF-8 text")


def _parquet(p: Path, raw: Optional[bytes] = None) -> List[Pair]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # a path where there is one; bytes (a gzipped file's) on this thread only: Arrow's thread pool, left busy
        # with a read from memory, can abort the process at exit ("terminate called", apache/arrow#34314)
        t = pq.read_table(p) if raw is None else pq.read_table(pa.BufferReader(raw), use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{p}: not a readable Parquet file ({(str(exc).splitlines() or [''])[0]})") from None
    names = t.column_names
    if {"s1", "s2"} <= set(names):
        # a file with the plain names is read by them alone, whatever other columns it has: as it always was, so
        # that a --pairs harvest resumed on it scores the pairs and gold its first units did
        c1, c2, cg = "s1", "s2", "gold" if "gold" in names else None
    else:
        # else by the names a header line may give them (sentence1/sentence2, score ...), found as there
        found = _header_columns(names)
        if found is None:
            alternatives = ", ".join(f"{a}/{b}" for a, b in zip(S1_NAMES[1:], S2_NAMES[1:]))
            raise InputError(f"{p}: needs columns s1 and s2 (or {alternatives}; has {', '.join(names) or 'none'})")
        if len({n.strip().lower() for n in names}) < len(names):
            raise InputError(f"{p}: two columns have one name, in other cases ({', '.join(names)}); rename one")
        c1, c2, cg = (None if i is None else names[i] for i in found)
    gold = [None] * t.num_rows
    if cg is not None:
        kind = t.schema.field(cg).type
        # checked here, before any scoring: else a string gold would fail only when a scored unit is written
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
                or pa.types.is_null(kind)):
            raise InputError(f"{p}: column {cg} has type {kind}; it must hold numbers (null for an unscored pair)")
        gold = [None if g is None else float(g) for g in t.column(cg).to_pylist()]
    rows = list(zip(arrow_texts(t.column(c1), f"{p}", c1), arrow_texts(t.column(c2), f"{p}", c2), gold))
    for i, (a, b, g) in enumerate(rows):
        if not isinstance(a, str) or not isinstance(b, str):
            raise InputError(f"{p}: row {i}: {c1} and {c2} must be non-null strings")
        if g is not None and not math.isfinite(g):
            # refused, as a text file's 'nan' is: null is how a Parquet file says 'no gold score'
            raise InputError(f"{p}: row {i}: {cg} {g!r} is not finite (leave it null for a pair without gold)")
        checked_pair(a, b, g, f"{p}: row {i}")
    return rows


class FileBytes(NamedTuple):
    raw: bytes      # the file's bytes, decompressed when they were gzip
    name: str       # its name, lower case, without .gz: the name that tells the format
    gzipped: bool   # whether the file held a gzip stream (a Parquet one is then read from `raw`)


def file_bytes(p: Path) -> FileBytes:
    """The bytes of `p`, decompressed when they are gzip (its first bytes 1f 8b, as corpus inputs are told,
    whatever its name), and the name that tells its format. A plain file named .gz is read as it is; a
    truncated or corrupt gzip stream is an InputError."""
    raw, name = p.read_bytes(), p.name.lower()
    gzipped = raw[:2] == b"\x1f\x8b"
    if gzipped:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{p}: unreadable or truncated gzip stream ({exc})") from None
    return FileBytes(raw, name[:-3] if name.endswith(".gz") else name, gzipped)


def first_text_line(text: str) -> Tuple[int, str]:
    """The first line that is not blank, and its number (1, "" for a file of blank lines)."""
    return next(((n, ln) for n, ln in enumerate(split_lines(text), 1) if ln.strip()), (1, ""))


def is_json_lines(text: str, name: str) -> bool:
    """Whether a text file is read as JSON lines: by its name, or a first line that is a JSON object."""
    return name.endswith(JSON_SUFFIXES) or first_text_line(text)[1].lstrip().startswith("{")


def holds_pairs(text: str, name: str) -> bool:
    """Whether a text file that may also be a list of sentences, one a line, is a pairs file: it is named
    .csv or .tsv, is JSON lines, or its first line holds a TAB or names the sentence columns (`s1,s2`,
    `sentence1,sentence2,score` ...)."""
    first = first_text_line(text)[1]
    if name.endswith((".csv", ".tsv")) or is_json_lines(text, name) or "\t" in first:
        return True
    try:
        cols = next(csv.reader([first]))
    except csv.Error:  # not a line of CSV, so no header
        return False
    return _header_columns(cols) is not None


def pairs_of_text(text: str, path: str, name: str) -> List[Pair]:
    """The pairs of a text file's decoded `text`; `name` (as file_bytes gives it) and the first line tell
    its format."""
    n, first = first_text_line(text)
    if is_json_lines(text, name):
        # one JSON document (an array, or an object over several lines) read a line at a time would fail
        # at a line that says nothing of what to give instead
        if (name.endswith(".json") and first.lstrip().startswith("[")) or first.strip() in ("[", "{"):
            raise InputError(f"{path}:{n}: one JSON document, not JSON lines; give one object with s1, s2 (and "
                             "optionally gold) on each line")
        return _jsonl(text, path)
    return _delimited(text, path, "\t" if "\t" in first or "," not in first else ",")


def read_pairs_file(path: str) -> List[Pair]:
    """All pairs of `path`, one per row (repeated rows kept, see the module's docstring); refuses a missing,
    unreadable or empty file, or a folder, with a one-line error."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{path}: is a folder; --pairs takes one file of sentence pairs")
    if not p.is_file():
        raise UsageError(f"{path}: pairs file not found")
    raw, name, gzipped = file_bytes(p)
    if name.endswith(".parquet"):
        rows = _parquet(p, raw if gzipped else None)
    else:
        rows = pairs_of_text(decode_text(p, raw), str(path), name)
    if not rows:
        raise InputError(f"{path}: no pairs")
    return rows
