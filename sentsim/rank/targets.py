"""Building rank-vector targets: a base encoder E1, a sampled anchor corpus, and faiss.

Resources: the encoder runs on GPU when there is one. `rank.storage=codes` (`RankTargets`): anchors
are encoded once per actor and held in a faiss inner-product index (vectors are L2-normalised, so
inner product = cosine). `rank.storage=vectors` (`BaseVectors`): anchors are encoded once per run
(`embed_texts`, stored in the run's side table) and each sentence keeps its float16 E1 vector.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from sentsim.bundled_model import default_base_encoder  # noqa: F401  (the harvest and bench/ take it from here)
from sentsim.errors import UsageError
from sentsim.rank.vectors import AnchorMatrix, RankCodec, ranks_from_similarities, vector_bytes
from sentsim.runtime import quiet_progress


@functools.lru_cache(maxsize=4)
def load_encoder(path: str, device: Optional[str] = None):
    """A sentence-transformers model from a local folder; a plain transformers folder gets mean pooling.
    Cached per process: in-process runs and tests load each encoder once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    # a rank actor on a cluster node does not see the driver's HF_HUB_DISABLE_PROGRESS_BARS (sentsim.cli):
    # transformers' "Loading weights" bar would otherwise land in every job's log, once per actor
    quiet_progress()

    if not Path(path).is_dir():
        raise UsageError(f"{path}: base encoder must be a local model folder (transformers or sentence-transformers)")
    from sentsim.encoder_folder import encoder_folder

    encoder_folder(path, "base encoder")  # one without its tokenizer would load, and rank every sentence as [UNK]
    try:
        return SentenceTransformer(path, device=device or ("cuda" if _cuda() else "cpu"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a loadable encoder ({str(exc).splitlines()[0]})") from None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def sample_anchors(corpus: str, n: int, seed: int, min_tokens: int = 3) -> tuple[np.ndarray, list[str]]:
    """A seeded sample of n corpus sentences (ids sorted, so the set is order-independent)."""
    from corpus.view import read_table

    table = read_table(corpus, "sentences", ["sentence_id", "text", "n_tokens"])  # marked shards only, local or s3
    ids = table.column("sentence_id").to_numpy()
    ok = table.column("n_tokens").to_numpy() >= min_tokens
    pool = np.sort(ids[ok])
    if len(pool) < 2:
        raise UsageError(f"{corpus}: fewer than 2 sentences with >= {min_tokens} tokens to use as anchors")
    if n > len(pool):
        n = len(pool)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(pool, size=n, replace=False))
    pos = {int(s): i for i, s in enumerate(ids)}
    texts = table.column("text").to_pylist()
    return chosen, [texts[pos[int(s)]] for s in chosen]


class RankTargets:
    """Rank vectors of sentences against a fixed anchor set under base encoder E1."""

    def __init__(self, encoder_path: str, anchor_ids: np.ndarray, anchor_texts: Sequence[str], bits: int = 16,
                 batch_size: int = 256, device: Optional[str] = None):
        import faiss

        self.encoder_path = encoder_path
        self.encoder = load_encoder(encoder_path, device)
        self.batch_size = batch_size
        self.anchor_ids = np.asarray(anchor_ids, dtype=np.int64)
        self.codec = RankCodec(len(self.anchor_ids), bits)
        vecs = self.embed(list(anchor_texts))
        self.index = faiss.IndexFlatIP(vecs.shape[1])
        self.index.add(vecs)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        v = self.encoder.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.ascontiguousarray(v, dtype=np.float32)

    def similarities(self, texts: Sequence[str]) -> np.ndarray:
        """[m, n] cosine to every anchor, in anchor order (faiss returns them sorted; we unsort)."""
        q = self.embed(texts)
        n = self.index.ntotal
        scores, idx = self.index.search(q, n)
        sims = np.empty_like(scores)
        np.put_along_axis(sims, idx, scores, axis=1)
        return sims

    def codes(self, texts: Sequence[str]) -> np.ndarray:
        """[m, n] compact rank codes (dtype per the codec)."""
        if not len(texts):
            return np.zeros((0, self.codec.n_anchors), dtype=self.codec.dtype)
        return self.codec.encode(ranks_from_similarities(self.similarities(texts)))


def embed_texts(encoder_path: str, texts: Sequence[str], batch_size: int = 256, device: Optional[str] = None
                ) -> np.ndarray:
    """[m, dim] float32 L2-normalised E1 vectors."""
    v = load_encoder(encoder_path, device).encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                                                  normalize_embeddings=True, show_progress_bar=False)
    return np.ascontiguousarray(v, dtype=np.float32).reshape(len(texts), -1)


def encoder_dim(encoder_path: str) -> int:
    return _dim(load_encoder(encoder_path))


def _dim(encoder) -> int:
    f = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
    return int(f())


class BaseVectors:
    """`rank.storage=vectors`: each sentence's E1 vector (L2-normalised, stored as float16), and the
    run's anchor matrix, from which `AnchorMatrix` computes ranks where they are used."""

    def __init__(self, encoder_path: str, anchor_vectors: Optional[np.ndarray] = None, batch_size: int = 256,
                 device: Optional[str] = None):
        self.encoder_path = encoder_path
        self.encoder = load_encoder(encoder_path, device)
        self.batch_size = batch_size
        self.dim = _dim(self.encoder)
        self.anchors = None if anchor_vectors is None else AnchorMatrix(anchor_vectors, device=self.encoder.device)

    @property
    def bytes_per_sentence(self) -> int:
        return vector_bytes(self.dim)

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        """[m, dim] float16: what the `base_vector` column stores (and what ranks are computed from)."""
        if not len(texts):
            return np.zeros((0, self.dim), dtype=np.float16)
        v = self.encoder.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(v, dtype=np.float32).astype(np.float16)


def anchor_matrix(table, where: str) -> np.ndarray:
    """[n, dim] float16 from a `rank_anchors` side table's `vector` column, or one UsageError line."""
    import pyarrow.compute as pc

    if "vector" not in table.column_names:
        raise UsageError(f"{where}: no anchor vectors (the run wrote rank codes, not rank.storage=vectors)")
    col = table.column("vector").combine_chunks()
    if col.null_count or len(col) < 2:
        raise UsageError(f"{where}: {col.null_count} of {len(col)} anchor vectors are missing")
    lengths = pc.unique(pc.list_value_length(col)).to_pylist()
    if len(lengths) != 1 or not lengths[0]:
        raise UsageError(f"{where}: anchor vectors of unequal lengths {sorted(lengths)[:4]}")
    return np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float16).reshape(len(col), lengths[0])
