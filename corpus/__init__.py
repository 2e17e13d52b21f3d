"""Corpus ingestion: documents in (JSONL, text, Parquet) -> sentence and chunk tables per work unit.

The lower layer: it imports from sentsim only the kernel (sentsim.config, sentsim.errors). The job
that runs units on Ray and writes shards is `sentsim.corpus_job` (`sentsim corpus build`).
"""

from corpus.config import CorpusConfig

__all__ = ["CorpusConfig"]
