"""Cached discriminator representations for screening (paper 003 §3.3: "we cache sentence
representations in advance, and compute model scores in the last neural layer").

Per corpus sentence: the unit-normalised BiLSTM rep. Per valid centre position (a window of w
sentences on each side exists in the document): the context-only features g(c), l, r of the
interaction head. With these, scoring a candidate context for a query is O(d + D).

Saved as plain .npy (allow_pickle=False) plus cache.json with the corpus and discriminator
fingerprints; loading refuses a cache made for another corpus or another model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sentsim.errors import UsageError

FORMAT = "sentsim-repcache-v1"


class ContextCache:
    def __init__(self, sentence_ids, unit_reps, centre_ids, core, window: int, meta: dict, side_norms=None):
        self.sentence_ids = np.asarray(sentence_ids, np.int64)
        self.unit_reps = unit_reps
        self.centre_ids = np.asarray(centre_ids, np.int64)
        self.core = core
        self.window = window
        self.meta = meta
        if side_norms is None:  # norm of the mean unit rep of each side; 1 when w = 1
            side_norms = self._side_norms(self.centre_ids)
        self.side_norms = side_norms

    def _side_norms(self, centres: np.ndarray) -> np.ndarray:
        w = self.window
        out = np.ones((len(centres), 2), np.float32)
        if w == 1:
            return out
        offs = np.arange(1, w + 1)
        for j, ids in enumerate((centres[:, None] - offs[::-1][None, :], centres[:, None] + offs[None, :])):
            for lo in range(0, len(centres), 8192):
                pos = np.searchsorted(self.sentence_ids, ids[lo:lo + 8192])
                u = np.asarray(self.unit_reps[pos.ravel()]).reshape(pos.shape + (-1,)).mean(axis=1)
                out[lo:lo + 8192, j] = np.linalg.norm(u, axis=1)
        return out

    @classmethod
    def build(cls, disc, sentences, batch_size: int = 4096) -> "ContextCache":
        """`sentences`: a SentenceTable (ids sorted). Encodes every sentence once."""
        from sentsim.discriminator.data import window_centres

        reps = disc.encode(sentences.texts)
        unit = reps / np.maximum(np.linalg.norm(reps, axis=1, keepdims=True), 1e-12)
        w = disc.window
        centres = window_centres(sentences.ids, w)
        offs = np.arange(1, w + 1)
        core = np.empty((len(centres), 1 + 2 * disc.model.head.d), np.float32)
        for lo in range(0, len(centres), batch_size):
            c = centres[lo:lo + batch_size]
            left = reps[c[:, None] - offs[::-1][None, :]]
            right = reps[c[:, None] + offs[None, :]]
            core[lo:lo + batch_size] = disc.context_core(left, right)
        meta = {"format": FORMAT, "corpus_fingerprint": disc.corpus_fingerprint,
                "discriminator_fingerprint": disc.config.get("fingerprint"), "window": w,
                "n_sentences": int(len(sentences)), "n_centres": int(len(centres))}
        return cls(sentences.ids, unit.astype(np.float32), sentences.ids[centres], core, w, meta)

    def save(self, out: str | Path) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "sentence_ids.npy", self.sentence_ids, allow_pickle=False)
        np.save(out / "unit_reps.npy", self.unit_reps, allow_pickle=False)
        np.save(out / "centre_ids.npy", self.centre_ids, allow_pickle=False)
        np.save(out / "context_core.npy", self.core, allow_pickle=False)
        np.save(out / "side_norms.npy", self.side_norms, allow_pickle=False)
        (out / "cache.json").write_text(json.dumps(self.meta, indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, disc=None, mmap: bool = True) -> "ContextCache":
        path = Path(path)
        mp = path / "cache.json"
        if not mp.is_file():
            raise UsageError(f"{path}: not a representation cache (no cache.json)")
        meta = json.loads(mp.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise UsageError(f"{path}: unknown cache format {meta.get('format')!r}")
        if disc is not None and (meta.get("discriminator_fingerprint") != disc.config.get("fingerprint")
                                 or meta.get("corpus_fingerprint") != disc.corpus_fingerprint):
            raise UsageError(f"{path}: the cache was made with another discriminator or corpus; rebuild it")
        mode = "r" if mmap else None
        ld = lambda n: np.load(path / n, mmap_mode=mode, allow_pickle=False)  # noqa: E731
        return cls(ld("sentence_ids.npy"), ld("unit_reps.npy"), ld("centre_ids.npy"), ld("context_core.npy"),
                   int(meta["window"]), meta, side_norms=ld("side_norms.npy"))

    def centre_rows(self, centre_ids: np.ndarray) -> np.ndarray:
        rows = np.searchsorted(self.centre_ids, centre_ids)
        if len(rows) and (rows.max() >= len(self.centre_ids) or not np.array_equal(self.centre_ids[rows], centre_ids)):
            raise UsageError("a candidate context is not a window of the cached corpus")
        return rows

    def side_cosines(self, hn: np.ndarray, left_ids: np.ndarray, right_ids: np.ndarray,
                     rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos(unit mean of each side's unit reps, hn) for m candidates, without materialising
        the side vectors: mean_j(u_j . hn) / ||mean_j u_j|| (the norm is cached per centre)."""
        n_gather = left_ids.size + right_ids.size
        if n_gather * 2 >= len(self.sentence_ids):
            # cheaper to take one dot product per corpus sentence than to gather
            dots = np.asarray(self.unit_reps) @ hn
            get = lambda ids: dots[np.searchsorted(self.sentence_ids, ids)]  # noqa: E731
        else:
            get = lambda ids: np.asarray(self.unit_reps[np.searchsorted(self.sentence_ids, ids).ravel()]).reshape(  # noqa: E731
                ids.shape + (-1,)) @ hn
        norms = np.asarray(self.side_norms[rows])
        cl = get(left_ids).mean(axis=1) / np.maximum(norms[:, 0], 1e-12)
        cr = get(right_ids).mean(axis=1) / np.maximum(norms[:, 1], 1e-12)
        return cl.astype(np.float32), cr.astype(np.float32)

    def context_features(self, centre_ids: np.ndarray, left_ids: np.ndarray, right_ids: np.ndarray) -> np.ndarray:
        """[m, 1 + 2d + 2D] context features for candidates (ids must be valid windows)."""
        rows = self.centre_rows(centre_ids)
        core = np.asarray(self.core[rows])
        sides = []
        for ids in (left_ids, right_ids):
            pos = np.searchsorted(self.sentence_ids, ids)
            u = np.asarray(self.unit_reps[pos.ravel()]).reshape(ids.shape + (-1,)).mean(axis=1)
            sides.append(u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12))
        return np.concatenate([core, sides[0], sides[1]], axis=1).astype(np.float32)
