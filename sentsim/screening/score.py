"""Head-only discriminator scores of a sentence in candidate contexts, from cached reps (003 §3.3:
"compute model scores in the last neural layer"). The harvest's `ContextSource` and the benches
call these; the LSTM runs on the query sentence only."""

from __future__ import annotations

import numpy as np

from sentsim.screening.candidates import Candidates


def score_candidates(disc, cache, sentence_features: np.ndarray, cands: Candidates, batch: int = 32_768) -> np.ndarray:
    """Discriminator logits of one sentence (features from `disc.project_sentences`) in every
    candidate context, from cached reps only (no LSTM run). See `score_windows`."""
    return score_windows(disc, cache, sentence_features, cands.centre_id, cands.left_ids, cands.right_ids, batch)


def score_windows(disc, cache, sentence_features: np.ndarray, centre_ids: np.ndarray, left_ids: np.ndarray,
                  right_ids: np.ndarray, batch: int = 32_768) -> np.ndarray:
    """Logits of one sentence in the windows around `centre_ids` ([m, w] side ids each).

    Uses the head's decomposition: logit = [g, l, r] . [1, a*v, b*v] + p(v) + a_l cl + a_r cr,
    i.e. one matrix-vector product over the cached context rows plus two gathered cosines.
    Equal to `disc.score_projected(cache.context_features(...), sentence_features)`.
    """
    head = disc.model.head
    d = head.d
    f = np.asarray(sentence_features, np.float32).reshape(-1)
    p, v, hn = float(f[0]), f[1:1 + d], f[1 + d:]
    q = np.concatenate([[1.0], v * head.bil_left.detach().numpy(),
                        v * head.bil_right.detach().numpy()]).astype(np.float32)
    a_l, a_r = (float(x) for x in head.cos_weight.detach().numpy())
    out = np.empty(len(centre_ids), dtype=np.float32)
    for lo in range(0, len(centre_ids), batch):
        hi = lo + batch
        rows = cache.centre_rows(centre_ids[lo:hi])
        base = np.asarray(cache.core[rows]) @ q
        cl, cr = cache.side_cosines(hn, left_ids[lo:hi], right_ids[lo:hi], rows)
        out[lo:hi] = base + p + a_l * cl + a_r * cr
    return out
