"""Things that score sentence pairs for the evaluator.

Every scorer has `info()` (what is recorded beside the numbers: model, pooling, kind),
`prepare(tasks)` (called once with every task to evaluate, so encoders can batch all unique
sentences in one pass) and `score_pairs(s1, s2) -> float array` (NaN where a pair has no score).
"""

from __future__ import annotations

import codecs
import io
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from corpus.documents import json_refusal, surrogate_refusal
from sentsim.errors import InputError, UsageError
from sentsim.pairs_file import JSON_SUFFIXES, arrow_texts, decode_text, file_bytes, names_only


class Scorer:
    kind = "scorer"

    def info(self) -> dict:
        return {"kind": self.kind}

    def prepare(self, tasks) -> None:  # optional hook: every task, once, before scoring
        pass

    def begin_task(self, task) -> None:  # optional hook: before each task's pairs are scored
        pass

    def score_pairs(self, s1: Sequence[str], s2: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


def _unique_sentences(tasks) -> list[str]:
    seen: dict[str, None] = {}
    for task in tasks:
        for st in task.sets:
            for s in (*st.s1, *st.s2):
                seen.setdefault(s, None)
    return list(seen)


def _cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=1)


class EmbeddingScorer(Scorer):
    """Cosine of sentence vectors; each unique sentence is encoded once and cached.

    `encode(list[str]) -> (n, d) array` does the batching; prepare() sends it every unique
    sentence of the suite at once so that batches are full and length-sorted.
    """

    kind = "bi-encoder"

    def __init__(self, encode: Callable[[list[str]], np.ndarray], model: str, pooling: str):
        self._encode = encode
        self.model = model
        self.pooling = pooling
        self.cache: dict[str, np.ndarray] = {}
        self.encoded = 0  # how many sentences actually went through the model

    def info(self) -> dict:
        return {"kind": self.kind, "model": self.model, "pooling": self.pooling}

    def embed(self, sentences: Sequence[str]) -> np.ndarray:
        todo = [s for s in dict.fromkeys(sentences) if s not in self.cache]
        if todo:
            vecs = np.asarray(self._encode(todo), dtype=np.float32)
            if vecs.shape[0] != len(todo):
                raise RuntimeError(f"encoder returned {vecs.shape[0]} vectors for {len(todo)} sentences")
            self.encoded += len(todo)
            self.cache.update(zip(todo, vecs))
        return np.stack([self.cache[s] for s in sentences])

    def prepare(self, tasks) -> None:
        self.embed(_unique_sentences(tasks))

    def score_pairs(self, s1, s2) -> np.ndarray:
        return _cosine_rows(self.embed(s1), self.embed(s2))


class CrossEncoderScorer(Scorer):
    """A `[CLS] s1 [SEP] s2` regression model; no vectors to cache, so pairs are scored directly."""

    kind = "cross-encoder"

    def __init__(self, path: str, batch_size: int = 64, device: str | None = None):
        from sentence_transformers import CrossEncoder

        self.model_path = path
        self.model = CrossEncoder(path, device=device)
        self.batch_size = batch_size

    def info(self) -> dict:
        return {"kind": self.kind, "model": self.model_path, "pooling": "cls (cross-encoder head)"}

    def score_pairs(self, s1, s2) -> np.ndarray:
        preds = self.model.predict(list(zip(s1, s2)), batch_size=self.batch_size, show_progress_bar=False)
        return np.asarray(preds, dtype=np.float64).reshape(-1)


class TfidfScorer(Scorer):
    """TF-IDF cosine baseline. IDF is fitted on the unique sentences of each task in turn
    (transductive but label-free), so a task's number does not depend on which others run."""

    kind = "tfidf"

    def __init__(self):
        self.vectorizer = None

    def info(self) -> dict:
        return {"kind": self.kind, "model": "TF-IDF cosine", "pooling": "none (sparse bag of words, IDF per task)"}

    def begin_task(self, task) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.vectorizer = TfidfVectorizer(lowercase=True, sublinear_tf=True)
        self.vectorizer.fit(_unique_sentences([task]))

    def score_pairs(self, s1, s2) -> np.ndarray:
        if self.vectorizer is None:
            raise RuntimeError("TfidfScorer.begin_task() must run before score_pairs()")
        a = self.vectorizer.transform(s1)
        b = self.vectorizer.transform(s2)  # rows are L2-normalised, so the dot is the cosine
        return np.asarray(a.multiply(b).sum(axis=1)).reshape(-1)


def _pair_frame(table, where: str):
    """(s1, s2, score) of an Arrow table as a DataFrame; its score column checked while nulls and NaN still differ.
    The column types are checked as RunReader checks a run's (a text score is refused by its type, not cast)."""
    import pandas as pd

    from storage.reader import check_file_columns

    check_file_columns(f"--scores {where}", table.schema, ["s1", "s2", "score"], numeric=["score"])

    return pd.DataFrame({"s1": arrow_texts(table.column("s1"), f"--scores {where}", "s1"),
                         "s2": arrow_texts(table.column("s2"), f"--scores {where}", "s2"),
                         "score": present_scores(table.column("score").to_pylist(), where)})


def present_scores(values: list, where: str, lines: Optional[list] = None) -> list:
    """A score column as floats, NaN where a pair has none (null, or an empty cell: read as None here). A
    value that is there but is not a finite number is refused: a NaN or infinite score is no score, and
    taking it as 'none' would hide a broken scorer; a text is not a score. A refusal names the value's
    line in a text file (`lines`, one per value), else its row (0-based, as Parquet readers count)."""
    at = (lambda row: f"{where}:{lines[row]}") if lines is not None else (lambda row: f"{where}: row {row}")
    out, bad = [], []
    for row, v in enumerate(values):
        if v is None:
            out.append(float("nan"))
            continue
        try:
            x = float(v) if not isinstance(v, bool) else None
        except (TypeError, ValueError):
            x = None
        if x is None:
            raise InputError(f"--scores {at(row)}: score {v!r} is not a number")
        if not np.isfinite(x):
            bad.append(row)
        out.append(x)
    if bad:
        raise InputError(f"--scores {where}: {len(bad)} score(s) are NaN or infinite (first at {at(bad[0])}); "
                         "leave a pair without a score empty (null)")
    return out


def _read_pair_table(path: Path):
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.reader import check_file_columns

    try:
        if path.is_dir():
            if (path / "manifest.json").is_file():  # a run: its completed pairs/ shards only
                return _read_run_pairs(str(path))
            # a hand-made folder: its pairs/ table when it has one (never dot-temp files)
            table_dir = path / "pairs" if (path / "pairs").is_dir() else path
            parts = sorted(table_dir.rglob("*.parquet"))
            parts = [p for p in parts if not any(x.startswith(".") for x in p.relative_to(table_dir).parts)]
            if not parts:
                raise UsageError(f"--scores {path}: a directory, but no *.parquet files under it")
            frames = []
            for part in parts:  # only the three columns: harvest shards carry many more
                check_file_columns(f"--scores {part}", pq.read_schema(part), ["s1", "s2", "score"],
                                   numeric=["score"])
                frames.append(_pair_frame(pq.read_table(part, columns=["s1", "s2", "score"]), str(part)))
            return pd.concat(frames, ignore_index=True)
        # as the pairs reader finds them: gzip by its first bytes, the name less .gz telling the format, and
        # JSON lines by a first object as well as by name
        raw, name, gzipped = file_bytes(path)
        if name.endswith(".parquet"):
            # a plain file by its path; unpacked bytes on this thread only (pairs_file._parquet says why)
            table = (pq.read_table(pa.BufferReader(raw), use_threads=False) if gzipped
                     else pq.read_table(path))
            return _pair_frame(table, str(path))
        if name.endswith(JSON_SUFFIXES) or raw.removeprefix(codecs.BOM_UTF8).lstrip()[:1] == b"{":
            return _read_jsonl_pairs(path, raw)
        if name.endswith((".csv", ".tsv")):
            try:  # as the pairs reader says it: the line of the first byte that is not UTF-8
                text = decode_text(path, raw)
            except InputError as exc:
                raise InputError(f"--scores {exc}") from None
            if not text.strip():
                raise InputError(f"--scores {path}: an empty file; it needs a header line naming s1, s2 and score, "
                                 "then one scored pair a line")
            first = text.lstrip("\ufeff").split("\n", 1)[0].rstrip("\r")
            fields = first.split("\t" if name.endswith(".tsv") else ",")
            if not {"s1", "s2", "score"} & {f.strip() for f in fields} and not names_only(fields):
                # a first line of data, not of names (an STS-B line): it would be taken for the header
                raise InputError(f"--scores {path}: no header line naming s1, s2 and score (the first line reads "
                                 f"{first[:80]!r}{'...' if len(first) > 80 else ''}); put one above the scored pairs")
            # score read as text: an empty cell is the only 'no score', a literal nan or inf is refused
            tsv = dict(sep="\t", quoting=3) if name.endswith(".tsv") else {}
            df = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""],
                             dtype={"score": str, "s1": str, "s2": str}, **tsv)
            if "score" in df.columns:  # data row i is line i + 2, below the header (one line a row)
                df["score"] = present_scores([None if pd.isna(v) else v for v in df["score"]], str(path),
                                             lines=list(range(2, len(df) + 2)))
            return df
    except UsageError:
        raise
    except Exception as exc:  # a corrupt file is the user's input problem, not a crash
        raise InputError(f"--scores {path}: cannot read ({type(exc).__name__}: {exc})") from None
    raise UsageError(f"--scores {path}: unsupported file type; use .parquet, .csv, .tsv or .jsonl")


def _read_jsonl_pairs(path: Path, raw: bytes):
    """JSON lines (`raw`, the file's bytes, unpacked) read by the json module, where null (no score) and NaN
    (refused) stay apart."""
    import pandas as pd

    rows, lines = [], []
    try:
        text = decode_text(path, raw)
    except InputError as exc:
        raise InputError(f"--scores {exc}") from None
    with io.StringIO(text, newline=None) as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError) as exc:  # ValueError: malformed, or an integer too long
                    raise InputError(f"--scores {path}:{n}: {json_refusal(exc)}") from None
                if not isinstance(obj, dict):
                    raise InputError(f"--scores {path}:{n}: expected a JSON object with s1, s2, score")
                for col in ("s1", "s2"):  # pandas cannot hold such a string, so it is named by its line here
                    reason = isinstance(obj.get(col), str) and surrogate_refusal(obj[col], col)
                    if reason:
                        raise InputError(f"--scores {path}:{n}: {reason}")
                rows.append(obj)
                lines.append(n)
    if any("score" in r for r in rows):  # a line without one has none
        scores = present_scores([r.get("score") for r in rows], str(path), lines=lines)
        rows = [dict(r, score=x) for r, x in zip(rows, scores)]
    return pd.DataFrame(rows)


def check_pair_texts(df, where: str) -> None:
    """Refuse a pair whose s1 or s2 is not text (bytes, a number, a list) or holds a lone surrogate: such a
    sentence matches no sentence of a task, and bytes that are not UTF-8 cannot even be compared."""
    for col in ("s1", "s2"):
        for row, v in zip(df.index, df[col]):
            if not isinstance(v, str):
                raise InputError(f"{where}: row {row}: {col} is {type(v).__name__}, not text")
            reason = surrogate_refusal(v, col)
            if reason:
                raise InputError(f"{where}: row {row}: {reason}")


def _read_run_pairs(uri: str):
    """Scored pairs of a harvest run (local or s3://) through the shard store's reader: the units
    with a completion marker, never a killed writer's leftovers."""
    from storage import RunReader

    reader = RunReader(uri, what="--scores")
    if not reader.files("pairs", required=False):
        from storage.store import part_of_run_refusal

        refusal = part_of_run_refusal(uri, f"--scores {uri}")  # a pool harvest's pool_vectors/: no pairs there
        if refusal is not None:
            raise UsageError(refusal)
        stage = reader.manifest.get("stage")
        if stage not in ("harvest", "harvest-remix"):  # a corpus, rep cache or contexts run holds no pairs ever
            raise UsageError(f"--scores {uri}: not a harvest run but a {stage!r} run; give the --out of `sentsim "
                             "harvest` (or `sentsim remix`), or a file of scored pairs (s1, s2, score)")
        raise UsageError(f"--scores {uri}: a run, but it has no completed pairs/ shards")
    try:
        table = reader.read_table("pairs", ["s1", "s2", "score"], numeric=["score"])
    except InputError as exc:
        raise InputError(f"--scores {exc}") from None
    note = reader.store.incomplete_note()
    if note:  # as the trainers say it: the coverage the report gives is then the completed units'
        print(f"note: --scores {note}; scoring with the pairs of its completed units only",
              file=sys.stderr, flush=True)
    return _pair_frame(table, uri)


class PairFileScorer(Scorer):
    """Scores looked up in a file of scored pairs (s1, s2, score), e.g. Origin scores from a
    `--pairs` harvest. A pair matches in either order; pairs absent from the file (or with a
    null score) are NaN and the evaluator reports the coverage."""

    kind = "pair-file"

    def __init__(self, path: str | Path):
        if "://" in str(path):  # a run in an object store (s3://...)
            df = _read_run_pairs(str(path))
        else:
            path = Path(path)
            if not path.exists():
                raise UsageError(f"--scores {path}: no such file")
            df = _read_pair_table(path)
        missing = [c for c in ("s1", "s2", "score") if c not in df.columns]
        if missing:
            raise InputError(f"--scores {path}: missing column(s) {', '.join(missing)}; "
                             f"found {', '.join(map(str, df.columns))}")
        df = df[["s1", "s2", "score"]].dropna()
        if df.empty:
            raise InputError(f"--scores {path}: no rows with a score")
        check_pair_texts(df, f"--scores {path}")
        try:
            scores = df["score"].astype(float)
        except (TypeError, ValueError):
            raise InputError(f"--scores {path}: column 'score' is not numeric") from None
        # duplicates (the same pair scored twice) are averaged, and said to be when their scores differ
        keys = [df["s1"].astype(str).str.strip(), df["s2"].astype(str).str.strip()]
        grouped = scores.groupby(keys).mean()
        differing = int((scores.groupby(keys).nunique() > 1).sum())
        if differing:
            print(f"note: --scores {path}: {differing} pair(s) appear more than once with different scores; "
                  "each is scored by the mean of its scores", file=sys.stderr)
        self.table: dict[tuple[str, str], float] = dict(zip(grouped.index, grouped.to_numpy()))
        self.path = str(path)

    def info(self) -> dict:
        return {"kind": self.kind, "model": self.path, "pooling": "n/a (precomputed scores)",
                "pairs_in_file": len(self.table)}

    def score_pairs(self, s1, s2) -> np.ndarray:
        out = np.full(len(s1), np.nan)
        for i, (a, b) in enumerate(zip(s1, s2)):
            v = self.table.get((a, b))
            if v is None:
                v = self.table.get((b, a))
            if v is not None:
                out[i] = v
        return out


def _pick_device(device: str | None) -> str:
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _hf_as_sentence_transformer(path: str, device: str):
    """A plain transformers encoder checkpoint (no sentence-transformers files), wrapped as
    Transformer + mean Pooling: the paper's surrogate pooling (section 3.4), encoded by
    sentence-transformers' own batching."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tr = Transformer(path)
    return SentenceTransformer(modules=[tr, Pooling(tr.get_embedding_dimension(), "mean")], device=device)


def _st_pooling(path: Path) -> str:
    modules = json.loads((path / "modules.json").read_text())
    names = []
    for m in modules:
        t = m.get("type", "")
        if t.endswith("Pooling"):
            cfg_path = path / m.get("path", "") / "config.json"
            mode = "mean"
            if cfg_path.is_file():
                cfg = json.loads(cfg_path.read_text())
                if "pooling_mode" in cfg:
                    mode = str(cfg["pooling_mode"])
                else:
                    # older configs: pooling_mode_mean_tokens: true, ...
                    modes = [k[len("pooling_mode_"):].replace("_tokens", "").replace("_token", "")
                             for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
                    mode = "+".join(modes) or mode
            names.append(mode)
        elif t.endswith("Normalize"):
            names.append("normalize")
    return " + ".join(names) or "unknown"


def load_model_scorer(path: str, batch_size: int = 64, device: str | None = None) -> Scorer:
    """A sentence-transformers folder, a cross-encoder or a plain transformers encoder checkpoint."""
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"--model {path}: not a directory")
    if not (p / "config.json").is_file() and not (p / "modules.json").is_file():
        from sentsim.evaluation.model_folder import exported_model_hint

        raise UsageError(f"--model {path}: not a model folder (no config.json or modules.json)"
                         f"{exported_model_hint(p)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub while evaluating
    device = _pick_device(device)
    archs: list[str] = []
    if (p / "config.json").is_file():
        try:
            archs = json.loads((p / "config.json").read_text()).get("architectures") or []
        except json.JSONDecodeError:
            raise UsageError(f"--model {path}: config.json is not valid JSON") from None
    try:
        if any(a.endswith("ForSequenceClassification") for a in archs):
            return CrossEncoderScorer(str(p), batch_size, device)
        if (p / "modules.json").is_file():
            from sentence_transformers import SentenceTransformer

            model, pooling = SentenceTransformer(str(p), device=device), _st_pooling(p)
        else:
            model, pooling = _hf_as_sentence_transformer(str(p), device), "mean (last layer)"

        def encode(sentences: list[str]) -> np.ndarray:
            return model.encode(sentences, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

        return EmbeddingScorer(encode, str(p), pooling)
    except UsageError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--model {path}: cannot load the model ({type(exc).__name__}: {exc})") from None
