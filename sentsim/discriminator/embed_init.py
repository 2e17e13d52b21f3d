"""Corpus-derived initial word embeddings (LSA): a truncated SVD of the sentence x word TF-IDF
matrix. A BiLSTM trained from random embeddings on a small CPU budget learns topical
coherence slowly; starting from co-occurrence vectors gives it word similarity on step one.
Words the SVD never saw and the special tokens keep a small random init.
"""

from __future__ import annotations

import numpy as np


def lsa_embeddings(token_ids: list[np.ndarray], vocab_size: int, dim: int, seed: int = 0,
                   max_rows: int = 200_000, context: int = 1) -> np.ndarray:
    """token_ids: one id array per sentence, in corpus order. Rows are sentences joined with
    `context` neighbours on each side (ignoring document edges: a small blur)."""
    import scipy.sparse as sp
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfTransformer

    rng = np.random.default_rng(seed)
    emb = rng.normal(0.0, 0.1, size=(vocab_size, dim)).astype(np.float32)
    n = len(token_ids)
    if n == 0:
        return emb
    rows = np.arange(n) if n <= max_rows else np.sort(rng.choice(n, max_rows, replace=False))
    indptr, indices = [0], []
    for r in rows:
        lo, hi = max(0, r - context), min(n, r + context + 1)
        ids = np.unique(np.concatenate([token_ids[j] for j in range(lo, hi)]))
        indices.append(ids)
        indptr.append(indptr[-1] + len(ids))
    indices = np.concatenate(indices) if indices else np.empty(0, np.int64)
    X = sp.csr_matrix((np.ones(len(indices), np.float32), indices, np.asarray(indptr)), shape=(len(rows), vocab_size))
    X = TfidfTransformer(sublinear_tf=True).fit_transform(X)
    k = min(dim, min(X.shape) - 1)
    if k < 2:
        return emb
    svd = TruncatedSVD(n_components=k, random_state=seed, n_iter=4)
    svd.fit(X)
    vecs = (svd.components_.T * np.sqrt(svd.singular_values_)[None, :]).astype(np.float32)  # [V, k]
    seen = np.asarray(X.getnnz(axis=0)).ravel() > 0
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    vecs = vecs / np.maximum(norms, 1e-8)
    emb[seen, :k] = vecs[seen] * 1.0
    emb[seen, k:] = 0.0
    emb[0] = 0.0
    return emb
