"""RankEncoder student (../shared/papers/004_*, sections 3.2-3.6).

Inputs: the harvest's `sentences` shards (text, rank_codes: each sentence's ranks of the run's anchor
set under base encoder E1, section 3.2 Eq. 2; or, for a rank.storage=vectors harvest, base_vector: E1's
float16 vector, ranked here against the run's anchor matrix with torch, sentsim.rank.AnchorMatrix) and,
for the optional regression term, the harvested train pairs (s1, s2, score).

Loss per batch of m sentences (encoded twice; dropout makes the two views differ):
    l_cl  = InfoNCE(view 1, view 2), in-batch negatives, tau 0.05          (§3.1 Eq. 1, SimCSE)
    u_i   = g(decoded rank codes of x_i, or ranks from its base vector); u_i.u_j = Spearman under E1
                                                                           (§3.2 Eq. 2-3)
    l_r   = mean over pairs i<j with 0.5 <= u_i.u_j <= 0.8 of (u_i.u_j - cos(E2 x_i, E2 x_j))^2
                                                                           (§3.4 Eq. 4, §3.5 Eq. 6)
    total = max(0.05 * l_r, l_cl)                                          (§3.4 Eq. 5)
          + score_weight * mean (cos(E2 s1, E2 s2) - harvested score)^2    (optional; 003 §3.4's L2)
A batch whose filter keeps no pair contributes l_cl alone and is counted (`empty_filter_batches`).

Inference (§3.6 Eq. 7): sim = lambda_inf * u_i.u_j + (1 - lambda_inf) * cos, lambda_inf 0.1, with u
now computed by the trained encoder E2 over the same anchors: `RankEncoderScorer` (saved beside the
student: rank_anchors.json, the anchor sentences and lambda_inf).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from pydantic import Field, model_validator

from sentsim.config import Section
from sentsim.errors import UsageError
from sentsim.losses.infonce import InfoNCELoss
from sentsim.losses.rank_mse import RankMSELoss, hinge
from sentsim.students.common import Harvest, Objective, Prepared, column, stack_lists, tokenize

ANCHORS_FILE = "rank_anchors.json"


class RankEncoderConfig(Section):
    temperature: float = Field(0.05, gt=0)        # 004 §3.1 Eq. 1, SimCSE's tau (§4.3 follows the base encoder)
    lambda_train: float = Field(0.05, ge=0)       # 004 §4.3: lambda_train = 0.05 (Eq. 5)
    tau_lower: float = Field(0.5, ge=-1, le=1)    # 004 §4.3: tau_l = 0.5 (Eq. 6)
    tau_upper: float = Field(0.8, ge=-1, le=1)    # 004 §4.3: tau_u = 0.8 (Eq. 6)
    lambda_inf: float = Field(0.1, ge=0, le=1)    # 004 §4.3: lambda_inf = 0.1 (Eq. 7)
    # optional regression on the harvested pair scores (003 §3.4's L2), added to Eq. 5's total
    score_weight: float = Field(0.0, ge=0)
    score_batch_size: int = Field(32, ge=1)
    check_sentences: int = Field(8, ge=0)  # stored rank codes re-computed to prove the anchor set (0: skip)
    base_encoder: Optional[str] = None  # expected E1; must be the harvest's rank.encoder (default: theirs)

    @model_validator(mode="after")
    def _order(self):
        if self.tau_lower > self.tau_upper:
            raise ValueError(f"tau_lower {self.tau_lower} > tau_upper {self.tau_upper}")
        return self


class RankEncoderObjective(Objective):
    settings = RankEncoderConfig
    needs_data = "its rank vectors"
    side_files = (ANCHORS_FILE,)

    @classmethod
    def input_paths(cls, cfg) -> dict:
        return {"rankencoder.base_encoder": cfg.rankencoder.base_encoder}

    @classmethod
    def prepare(cls, cfg, harvest: Harvest) -> Prepared:
        """The harvest's sentences with their rank codes (or base vectors), the anchor set proved against
        them, and, with rankencoder.score_weight > 0, the scored train pairs of the regression term."""
        from sentsim.students import data as D
        from sentsim.surrogate.data import training_note

        root, manifest = harvest.root, harvest.manifest
        table, n_anchors, rows = D.rank_sentences(root, manifest)
        counts, skips, workers = {}, {}, {}
        if rows > table.num_rows:
            print(training_note(table.num_rows, rows, "sentence rows",
                                {"repeats of a sentence paired in several units": rows - table.num_rows}))
        if "base_vector" in table.column_names:  # rank.storage=vectors: workers read the run's anchor matrix
            workers["rank_vectors"] = {"data": str(root), "fingerprint": manifest.get("fingerprint")}
        rc = cfg.rankencoder
        anchors = None
        if rc.check_sentences > 0 or rc.base_encoder:
            ids, texts = D.check_anchor_set(root, manifest, table, rc.check_sentences, rc.base_encoder)
            anchors = ([int(i) for i in ids], list(texts))
        else:
            try:
                ids, texts = D.recover_anchors(manifest, root)
                anchors = ([int(i) for i in ids], list(texts))
            except UsageError as exc:
                skips["anchors"] = str(exc)
        workers.update(anchors=anchors, n_anchors=n_anchors)
        if rc.score_weight > 0:
            from sentsim.losses.cosine_regression import narrow_targets_warning
            from sentsim.surrogate.data import keep_split

            run, carve, left_out = D.harvest_pairs(root)
            pairs = keep_split(run, "train", carve)
            if pairs.num_rows == 0:
                raise UsageError(f"--data {harvest.data}: rankencoder.score_weight > 0 but no scored train pairs")
            print(training_note(pairs.num_rows, run.num_rows, "pairs for the score loss", left_out))
            y = pairs["score"].to_numpy()
            narrow = narrow_targets_warning(float(y.mean()), float(y.std()), "the score loss's harvested scores",
                                            "rankencoder.score_weight mostly pulls cosines toward their mean")
            if narrow:
                print(narrow)
            workers["pairs"] = {"s1": pairs["s1"].to_pylist(), "s2": pairs["s2"].to_pylist(),
                                "score": pairs["score"].to_numpy().tolist()}
            counts["score_pairs"] = pairs.num_rows
        # rows read, repeats included (the summary's rows are those trained on): the counts are part of the
        # fingerprint and of what makes a finished fit a no-op, and leaving out identical repeats is no other run
        counts["sentences"] = rows
        return Prepared(table, counts, skips, workers)

    @classmethod
    def around(cls, model, tok, cfg, spec: dict) -> "RankEncoderObjective":
        obj = cls(model, tok, cfg, spec.get("pairs"), spec.get("rank_vectors"))
        if spec.get("anchors"):
            obj.anchors = spec["anchors"]
        return obj

    @classmethod
    def scorers(cls, cfg, model_dir: str) -> dict:
        if not Path(model_dir, ANCHORS_FILE).is_file():  # the anchors could not be recovered (a skip)
            return {}
        return {"rankencoder-eq7": RankEncoderScorer(model_dir, cfg.rankencoder.lambda_inf)}

    def __init__(self, model, tok, cfg, pairs=None, rank_vectors=None):
        super().__init__(model, tok, cfg)
        self.rank_vectors = rank_vectors  # {"data", "fingerprint"} of a rank.storage=vectors harvest, or None
        self._anchors = None  # its AnchorMatrix, read from the run once per worker
        rc = cfg.rankencoder
        self.nce = InfoNCELoss(rc.temperature)
        self.rank = RankMSELoss(rc.tau_lower, rc.tau_upper)
        self.pairs = pairs  # dict s1, s2, score (numpy) for the regression term, or None
        self._rng = np.random.default_rng(cfg.seed)
        self.empty_filter_batches = 0
        self.anchors = None  # (ids, texts), saved for the scorer

    def step(self, batch: dict, device):
        from sentsim.rank import g_normalise

        rc = self.cfg.rankencoder
        texts = [str(t) for t in column(batch, "text")]
        m = len(texts)
        enc = tokenize(self.tok, texts + texts, self.cfg.max_seq_length, device)  # two dropout views, one pass
        v = self.model.embed(**enc)
        v1, v2 = v[:m], v[m:]
        l_cl = self.nce(v1, v2)
        if "base_vector" in batch:  # ranks on the fly: E1 vectors against the run's anchor matrix
            u = self.anchor_matrix(device).targets(stack_lists(batch["base_vector"]).astype(np.float32))
        else:
            u = torch.as_tensor(g_normalise(stack_lists(batch["rank_codes"]).astype(np.float64)), device=device)
        l_r, kept = self.rank(v1, u)
        if l_r is None:
            self.empty_filter_batches += 1
        loss = hinge(l_r, l_cl, rc.lambda_train)
        metrics = {"l_cl": float(l_cl.detach()), "l_r": None if l_r is None else float(l_r.detach()),
                   "pairs_kept": kept, "empty_filter_batches": self.empty_filter_batches}
        if rc.score_weight > 0 and self.pairs is not None and len(self.pairs["score"]):
            idx = self._rng.choice(len(self.pairs["score"]), size=min(rc.score_batch_size, len(self.pairs["score"])),
                                   replace=False)
            s1 = [self.pairs["s1"][i] for i in idx]
            s2 = [self.pairs["s2"][i] for i in idx]
            w = self.model.embed(**tokenize(self.tok, s1 + s2, self.cfg.max_seq_length, device))
            from sentsim.losses.cosine_regression import CosineRegressionLoss

            y = torch.as_tensor(np.asarray(self.pairs["score"], dtype=np.float32)[idx], device=device)
            l_s = CosineRegressionLoss()(w[:len(idx)], w[len(idx):], y)
            loss = loss + rc.score_weight * l_s
            metrics["l_score"] = float(l_s.detach())
        return loss, metrics

    def anchor_matrix(self, device):
        if self._anchors is None:
            from sentsim.harvest.anchors import stored_anchor_vectors
            from sentsim.rank import AnchorMatrix
            from storage import ShardStore

            if not self.rank_vectors:
                raise ValueError("batches carry base_vector but the objective was given no rank_vectors source")
            src = self.rank_vectors
            self._anchors = AnchorMatrix(stored_anchor_vectors(ShardStore(src["data"]), src["fingerprint"]), device)
        return self._anchors

    def extra_state(self) -> dict:
        return {**super().extra_state(), "empty_filter_batches": self.empty_filter_batches}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        self.empty_filter_batches = int(state.get("empty_filter_batches", 0))  # the count spans a resume

    def result(self) -> dict:
        return {"empty_filter_batches": self.empty_filter_batches}

    def save_extras(self, folder: Path) -> None:
        if self.anchors is not None:
            ids, texts = self.anchors
            (folder / ANCHORS_FILE).write_text(json.dumps(
                {"lambda_inf": self.cfg.rankencoder.lambda_inf, "anchor_ids": [int(i) for i in ids],
                 "anchors": list(texts)}))


# ----------------------------------------------------------------------------- inference


def rank_vectors(vectors: np.ndarray, anchor_vectors: np.ndarray) -> np.ndarray:
    """u = g(ranks of the anchors by cosine to each row), Eq. 2-3 (sentsim.rank.AnchorMatrix, as in training)."""
    from sentsim.rank import AnchorMatrix

    return AnchorMatrix(anchor_vectors).targets(vectors).cpu().numpy()


def rankencoder_similarity(v1: np.ndarray, v2: np.ndarray, anchor_vectors: np.ndarray, lambda_inf: float) -> np.ndarray:
    """Eq. 7 row-wise: lambda_inf * u_i.u_j + (1 - lambda_inf) * cos(v1_i, v2_i)."""
    u1, u2 = rank_vectors(v1, anchor_vectors), rank_vectors(v2, anchor_vectors)
    n1 = v1 / np.maximum(np.linalg.norm(v1, axis=1, keepdims=True), 1e-12)
    n2 = v2 / np.maximum(np.linalg.norm(v2, axis=1, keepdims=True), 1e-12)
    cos = np.sum(n1 * n2, axis=1)
    return lambda_inf * np.einsum("ij,ij->i", u1.astype(np.float64), u2.astype(np.float64)) + (1 - lambda_inf) * cos


class RankEncoderScorer:
    """A scorer for sentsim.evaluation.evaluate: Eq. 7 with the student's own vectors and the anchors
    saved beside it (rank_anchors.json), or anchors given explicitly."""

    kind = "rankencoder"

    def __init__(self, path: str, lambda_inf: float | None = None, anchors: Sequence[str] | None = None,
                 batch_size: int = 64, device: str = "cpu"):
        from sentsim.evaluation.scorers import load_model_scorer

        meta = {}
        f = Path(path) / ANCHORS_FILE
        if f.is_file():
            meta = json.loads(f.read_text())
        if anchors is None:
            anchors = meta.get("anchors")
        if not anchors:
            raise UsageError(f"{path}: no {ANCHORS_FILE} beside the model; give the anchor sentences explicitly")
        self.lambda_inf = float(lambda_inf if lambda_inf is not None else meta.get("lambda_inf", 0.1))
        self.base = load_model_scorer(path, batch_size, device)
        self.path = path
        self.anchor_vectors = self.base.embed(list(anchors))
        self.n_anchors = len(anchors)

    def info(self) -> dict:
        return {"kind": self.kind, "model": self.path,
                "pooling": f"{self.base.pooling}; Eq. 7 lambda_inf={self.lambda_inf} over {self.n_anchors} anchors"}

    def prepare(self, tasks) -> None:
        self.base.prepare(tasks)

    def begin_task(self, task) -> None:
        pass

    def score_pairs(self, s1, s2) -> np.ndarray:
        return rankencoder_similarity(self.base.embed(s1), self.base.embed(s2), self.anchor_vectors, self.lambda_inf)
