"""Cached discriminator representations for screening (paper 003 §3.3: "we cache sentence
representations in advance, and compute model scores in the last neural layer").

Per corpus sentence: the unit-normalised BiLSTM rep. Per valid centre position (a window of w
sentences on each side exists in the document): the context-only features g(c), l, r of the
interaction head, and the norm of each side's mean unit rep. With these, scoring a candidate
context for a query is O(d + D).

On disk it is a shard-store run (`to_tables`, written by `sentsim cache build`, see cache_job.py;
`from_store` reads it back and refuses a cache made for another corpus or another model): tables
`reps` (sentence_id, unit_rep) and `centres` (centre_id, core, side_norms), one Parquet file per
unit of whole documents, readable with pyarrow.
"""

from __future__ import annotations

import numpy as np

from sentsim.errors import UsageError
from sentsim.identity import REP_CACHE_FORMAT, REP_CACHE_STAGE


def store_schemas(rep_dim: int, core_dim: int):
    """The Parquet tables of a cache run: fixed-size float32 lists, one row per sentence / centre."""
    import pyarrow as pa

    return {
        "reps": pa.schema([("sentence_id", pa.int64()), ("unit_rep", pa.list_(pa.float32(), rep_dim))]),
        "centres": pa.schema([("centre_id", pa.int64()), ("core", pa.list_(pa.float32(), core_dim)),
                              ("side_norms", pa.list_(pa.float32(), 2))]),
    }


def check_meta(meta: dict, disc, where: str) -> None:
    """Refuse a cache whose discriminator or corpus is not `disc`'s."""
    if disc is not None and (meta.get("discriminator_fingerprint") != disc.config.get("fingerprint")
                             or meta.get("corpus_fingerprint") != disc.corpus_fingerprint
                             or int(meta.get("window", -1)) != disc.window):
        raise UsageError(f"{where}: the cache was made with another discriminator or corpus; rebuild it")


def _matrix(col, width: int) -> np.ndarray:
    """A fixed_size_list<float32> column -> float32 [n, width]."""
    flat = col.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat, np.float32).reshape(-1, width)


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
        from sentsim.screening.threads import one_torch_thread

        w = disc.window
        centres = window_centres(sentences.ids, w)
        offs = np.arange(1, w + 1)
        core = np.empty((len(centres), 1 + 2 * disc.model.head.d), np.float32)
        with one_torch_thread():  # the same bits in every executor (screening/threads.py)
            reps = disc.encode(sentences.texts)
            for lo in range(0, len(centres), batch_size):
                c = centres[lo:lo + batch_size]
                left = reps[c[:, None] - offs[::-1][None, :]]
                right = reps[c[:, None] + offs[None, :]]
                core[lo:lo + batch_size] = disc.context_core(left, right)
        unit = reps / np.maximum(np.linalg.norm(reps, axis=1, keepdims=True), 1e-12)
        meta = {"format": REP_CACHE_FORMAT, "corpus_fingerprint": disc.corpus_fingerprint,
                "discriminator_fingerprint": disc.config.get("fingerprint"), "window": w,
                "rep_dim": int(reps.shape[1]), "core_dim": int(core.shape[1]),
                "n_sentences": int(len(sentences)), "n_centres": int(len(centres))}
        return cls(sentences.ids, unit.astype(np.float32), sentences.ids[centres], core, w, meta)

    # ---- the shard-store form, its one form on disk -------------------------------------------
    def to_tables(self) -> dict:
        """This cache as the store's tables (one unit's worth when built on whole documents)."""
        import pyarrow as pa

        def fixed(a: np.ndarray):
            a = np.ascontiguousarray(a, np.float32)
            return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])

        sch = store_schemas(self.unit_reps.shape[1], self.core.shape[1])
        return {
            "reps": pa.Table.from_arrays([pa.array(self.sentence_ids), fixed(self.unit_reps)], schema=sch["reps"]),
            "centres": pa.Table.from_arrays([pa.array(self.centre_ids), fixed(self.core), fixed(self.side_norms)],
                                            schema=sch["centres"]),
        }

    @classmethod
    def from_store(cls, uri: str, disc=None) -> "ContextCache":
        """Load a complete cache run (see cache_job.py) into memory; sentence ids ascending."""
        from storage import RunReader

        reader = RunReader(uri, manifest_required=False)
        manifest = reader.manifest
        if manifest.get("stage") != REP_CACHE_STAGE:
            raise UsageError(f"{uri}: not a representation cache run (no {REP_CACHE_STAGE} manifest.json)")
        if not reader.is_complete():
            raise UsageError(f"{uri}: the representation cache is incomplete; finish it with `sentsim cache build`")
        meta = dict(manifest.get("cache") or {})
        if meta.get("format") != REP_CACHE_FORMAT:
            raise UsageError(f"{uri}: unknown cache format {meta.get('format')!r}")
        check_meta(meta, disc, uri)

        # the reader yields exactly the files the run's markers vouch for, nothing else in the folders
        def table(name: str, key: str):
            return reader.dataset(name).to_table().sort_by(key)

        reps, centres = table("reps", "sentence_id"), table("centres", "centre_id")
        meta.update(n_sentences=reps.num_rows, n_centres=centres.num_rows)
        return cls(reps.column("sentence_id").to_numpy(), _matrix(reps.column("unit_rep"), int(meta["rep_dim"])),
                   centres.column("centre_id").to_numpy(), _matrix(centres.column("core"), int(meta["core_dim"])),
                   int(meta["window"]), meta, side_norms=_matrix(centres.column("side_norms"), 2))

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
