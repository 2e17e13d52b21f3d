"""Corpus ingestion: documents in (JSONL, text, Parquet) -> sentence and chunk shards out."""

from corpus.config import CorpusConfig

__all__ = ["CorpusConfig"]
