"""The corpus: ingestion (documents in JSONL, text or Parquet -> sentence and chunk tables per work
unit) and the reader of the corpus runs it writes (`view`: open_corpus, sentence and chunk lookups,
CorpusIndex).

The lower layer: it imports from sentsim only the kernel (sentsim.config, sentsim.errors), and from
storage/ the run reader and file hashes. The job that runs units on Ray and writes shards is
`sentsim.corpus_job` (`sentsim corpus build`); it cannot live here, above the executor.
"""

from corpus.config import CorpusConfig

__all__ = ["CorpusConfig"]
