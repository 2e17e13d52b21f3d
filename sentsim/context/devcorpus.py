"""A small corpus from the first documents of ../shared/data/corpus files, for benchmarks.

It slices the documents into a temporary JSONL file and runs the real ingestion
(`sentsim.corpus_job.build_corpus`, in-process), so benchmark corpora are exactly what users get.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from pathlib import Path

DEFAULT_SOURCE = Path(os.environ.get("SENTSIM_DEV_CORPUS_SRC")
                      or Path(__file__).resolve().parents[2].parent / "shared" / "data" / "corpus")


def write_dev_corpus(out: str | Path, source: str | Path | None = None, max_docs: int = 60,
                     files: tuple[str, ...] = ("us_speeches_docs.jsonl.gz",), **_ignored) -> Path:
    from sentsim.corpus_job import build_corpus

    out = Path(out)
    src = Path(source) if source else DEFAULT_SOURCE
    with tempfile.TemporaryDirectory() as tmp:
        piece = Path(tmp) / "docs.jsonl"
        n = 0
        with open(piece, "w", encoding="utf-8") as dst:
            for name in files:
                with gzip.open(src / name, "rt", encoding="utf-8") as fh:
                    for line in fh:
                        if n >= max_docs:
                            break
                        dst.write(line)
                        n += 1
        build_corpus([str(piece)], str(out), executor="inline", quiet=True, force_new=True)
    return out
