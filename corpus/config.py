"""Configuration of `sentsim corpus build`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sentsim.config import Section


class ChunkConfig(Section):
    # Retrieval returns chunks of consecutive sentences of one document; each sentence slot of a
    # chunk is one candidate context (003 paper, section 3.3: "text chunks" retrieved by TF-IDF).
    size: int = Field(8, ge=1, le=1024, description="sentences per chunk")
    stride: int | None = Field(None, ge=1, description="sentences between chunk starts; default = size (no overlap)")


class CorpusConfig(Section):
    chunk: ChunkConfig = ChunkConfig()
    on_error: Literal["fail", "skip"] = Field("fail",
                                              description="bad document: stop with exit 2, or skip and count it")
    max_sentence_tokens: int = Field(200, ge=1, description="longer sentences are cut to this many words and counted")
    max_paragraph_chars: int = Field(200_000, ge=1,
                                     description="a longer paragraph is bad input (e.g. 1 MB with no punctuation)")
    docs_per_unit: int = Field(16, ge=1, description="documents per work unit (one shard, one completion marker)")
    unit_bytes: int = Field(2_000_000, ge=1_000,
                            description="raw input bytes per work unit, whichever limit comes first")
    text_column: str = Field("text", description="Parquet inputs: the column holding document text or paragraphs")
    id_column: str | None = Field(None, description="Parquet inputs: optional column with document ids")
    max_in_flight: int | None = Field(None, ge=1, description="units held by the driver and sent to Ray at once "
                                      "(default max(16, 4x cluster CPUs)); bounds memory")

    def semantic(self) -> dict:
        """The part of the config that changes the output (and so the fingerprint)."""
        d = self.model_dump()
        d.pop("max_in_flight")
        return d
