"""RSE student: relational sentence embeddings (../shared/papers/000_*, section 3).

Inputs: triples (s_i, relation, s_j, hard negative) built by `sentsim.students.data.rse_triples` from
  - harvested train pairs with score >= rse.score_threshold: relation `context-similar` (a partner
    the teacher scored below rse.hard_negative_below is the hard negative); rse.positive_top_fraction
    and rse.hard_negative_bottom_fraction make the same cuts by rank among the train split's scores;
  - every harvested sentence paired with itself: relation `same-sent` (dropout positives, §3.2 r6);
  - a user file of (s_i, relation, s_j[, hard_negative]) in JSONL or Parquet (e.g. NLI entailment
    with the contradiction as hard negative, §3.2).
  A triple without a hard negative gets a random tail of its own relation (in-relation negative, §3.3).

Loss (§3.3 Eq. 2, tau 0.05): InfoNCE of (h_i + h_r) against h_j, the other tails in the batch and
every hard negative; h_r is a learned relation embedding with its own learning rate (1e-2,
appendix D). With rse.grad_cache_chunk > 0 the batch is encoded in chunks with gradient caching
(Gao et al. 2021a, as §3.3 does to reach batch 512): the loss is taken on detached vectors, their
gradients are cached, then each chunk is re-encoded with the same dropout masks and back-propagated.

Inference (§3.3 "How can we use?"): sim(h_i + h_r, h_j) for one relation, or a weighted sum over
relations: `RelationalScorer`. The relation table is saved beside the student as relations.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from sentsim.config import Section
from sentsim.errors import UsageError
from sentsim.losses.rse_relational import RelationalContrastiveLoss, relational_similarity
from sentsim.students.common import Harvest, Objective, Prepared, column, tokenize

RELATIONS_FILE = "relations.json"


class RSEConfig(Section):
    temperature: float = Field(0.05, gt=0)        # 000 Table 4 / appendix D: tau = 0.05
    relation_lr: float = Field(1e-2, gt=0)        # 000 appendix D: relation embeddings lr 1e-2
    # sources (000 §3.2): harvested pairs above a threshold, dropout same-sentence, a user triples file
    context_similar: bool = True
    # harvested scores are Eq. 4 similarities (003 §3.3): cosines and correlations, within [-1, 1]
    score_threshold: float = Field(0.5, ge=-1, le=1)      # harvested score >= this -> (s1, context-similar, s2)
    hard_negative_below: float = Field(0.0, ge=-1, le=1)  # a partner scoring below this: s1's in-relation hard neg.
    # the same two cuts by rank, for harvests whose scores do not spread over [-1, 1] (all near 1, say): the
    # top fraction of the train split's scored pairs are positives, the bottom fraction hard negatives; each,
    # when set, replaces its threshold above (000 has labelled relations, not scores, so it gives no value)
    positive_top_fraction: Optional[float] = Field(None, gt=0, le=1)          # replaces score_threshold
    hard_negative_bottom_fraction: Optional[float] = Field(None, gt=0, lt=1)  # replaces hard_negative_below
    ADDED_LATER = {"positive_top_fraction": None, "hard_negative_bottom_fraction": None}
    same_sent: bool = True                        # 000 §3.2 relation r6 (SimCSE dropout)
    same_sent_max: int = Field(150_000, ge=0)     # 000 §3.2: at most 150K samples for other relations
    triples: Optional[str] = None                 # JSONL/Parquet with s_i, relation, s_j[, hard_negative]
    relations: Optional[list[str]] = None         # allowed relation names for the triples file (None: any)
    # inference (000 §3.3 "How can we use?"): weights over relations; None = the first relation alone
    inference_weights: Optional[dict[str, float]] = None
    grad_cache_chunk: int = Field(0, ge=0)        # >0: gradient caching (Gao et al. 2021a), chunk size per pass

    @model_validator(mode="after")
    def _thresholds(self):
        # above it, a pair scoring between the two would be its anchor's positive and its hard negative at once
        if self.hard_negative_below > self.score_threshold:
            raise ValueError(f"hard_negative_below {self.hard_negative_below:g} > score_threshold "
                             f"{self.score_threshold:g}: a pair between them would be a positive and a hard negative")
        top, bottom = self.positive_top_fraction, self.hard_negative_bottom_fraction
        if top is not None and bottom is not None and top + bottom > 1:
            raise ValueError(f"positive_top_fraction {top:g} + hard_negative_bottom_fraction {bottom:g} > 1: "
                             "a pair in both would be a positive and a hard negative")
        return self


class RSEObjective(Objective):
    settings = RSEConfig
    side_files = (RELATIONS_FILE,)
    data_files = ("triples",)
    # needs_data stays None: a triples file alone is enough

    @classmethod
    def input_paths(cls, cfg) -> dict:
        return {"--triples": cfg.rse.triples}

    @classmethod
    def check(cls, cfg, backbone: str, backbone_path: str) -> None:
        if cfg.rse.grad_cache_chunk and cfg.num_workers > 1:
            raise UsageError("rse.grad_cache_chunk with num_workers > 1 is not supported (gradient caching runs its "
                             "own backward passes, which DDP cannot synchronise); use one worker or grad_cache_chunk=0")

    @classmethod
    def prepare(cls, cfg, harvest: Harvest) -> Prepared:
        """Every relation source as one triples table (sentsim.students.data.rse_triples); the relation
        names, in id order, go to the workers (one learned vector each)."""
        from sentsim.students import data as D

        table, relations, counts = D.rse_triples(harvest.root, cfg)
        if cfg.rse.inference_weights:
            unknown = [r for r in cfg.rse.inference_weights if r not in relations]
            if unknown:
                raise UsageError(f"rse.inference_weights: unknown relation(s) {', '.join(unknown)}; "
                                 f"training has {', '.join(relations)}")
        return Prepared(table, {"triples": table.num_rows, "per_relation": counts}, {}, {"relations": relations})

    @classmethod
    def around(cls, model, tok, cfg, spec: dict) -> "RSEObjective":
        return cls(model, tok, cfg, spec["relations"], model.encoder.config.hidden_size)

    @classmethod
    def scorers(cls, cfg, model_dir: str) -> dict:
        return {"relational": RelationalScorer(model_dir)}

    def __init__(self, model, tok, cfg, relations: list[str], dim: int):
        super().__init__(model, tok, cfg)
        self.relations = list(relations)
        self.relation_table = nn.Parameter(torch.randn(len(relations), dim) * 0.01)  # random init (§3.1)
        self.loss_fn = RelationalContrastiveLoss(cfg.rse.temperature)

    def param_groups(self, lr: float) -> list[dict]:
        return super().param_groups(lr) + [{"params": [self.relation_table], "lr": self.cfg.rse.relation_lr,
                                            "weight_decay": 0.0}]

    def _texts(self, batch):
        heads = [str(x) for x in column(batch, "s_i")]
        tails = [str(x) for x in column(batch, "s_j")]
        hards = [None if x is None else str(x) for x in column(batch, "hard_negative")]
        rel = torch.as_tensor(np.asarray(column(batch, "relation_id"), dtype=np.int64))
        mask = torch.tensor([h is not None for h in hards])
        hards = [h if h is not None else "" for h in hards]
        return heads, tails, hards, rel, mask

    def loss_on(self, vecs: torch.Tensor, rel, mask, n: int) -> torch.Tensor:
        h, t, hn = vecs[:n], vecs[n:2 * n], vecs[2 * n:]
        return self.loss_fn(h, self.relation_table, rel, t, hn if bool(mask.any()) else None, mask)

    def step(self, batch: dict, device):
        heads, tails, hards, rel, mask = self._texts(batch)
        rel, mask = rel.to(device), mask.to(device)
        n = len(heads)
        texts = heads + tails + hards
        chunk = self.cfg.rse.grad_cache_chunk
        if not chunk:
            vecs = self.model.embed(**tokenize(self.tok, texts, self.cfg.max_seq_length, device))
            loss = self.loss_on(vecs, rel, mask, n)
            return loss, {"loss_rse": float(loss.detach())}
        return self._grad_cache_step(texts, rel, mask, n, chunk, device)

    def _grad_cache_step(self, texts, rel, mask, n, chunk, device):
        """Gradient caching: returns a loss whose .backward() is a no-op for the encoder (its gradients
        are already accumulated); the relation table's gradient flows through the returned loss."""
        pieces = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
        states, reps = [], []
        with torch.no_grad():
            for p in pieces:
                states.append((torch.get_rng_state(),
                               torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None))
                reps.append(self.model.embed(**tokenize(self.tok, p, self.cfg.max_seq_length, device)))
        leaf = torch.cat(reps).detach().requires_grad_(True)
        loss = self.loss_on(leaf, rel, mask, n)
        enc_grad = torch.autograd.grad(loss, leaf, retain_graph=True)[0]
        offset = 0
        for p, (cpu_state, cuda_state) in zip(pieces, states):
            saved = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
            torch.set_rng_state(cpu_state)  # the same dropout masks as the cached pass
            if cuda_state is not None:
                torch.cuda.set_rng_state_all(cuda_state)
            v = self.model.embed(**tokenize(self.tok, p, self.cfg.max_seq_length, device))
            torch.set_rng_state(saved[0])
            if saved[1] is not None:
                torch.cuda.set_rng_state_all(saved[1])
            v.backward(enc_grad[offset:offset + len(p)].to(v.dtype))
            offset += len(p)
        return loss, {"loss_rse": float(loss.detach()), "grad_cache_chunks": len(pieces)}

    def save_extras(self, folder: Path) -> None:
        (folder / RELATIONS_FILE).write_text(json.dumps({
            "relations": self.relations, "vectors": self.relation_table.detach().float().cpu().tolist(),
            "inference_weights": self.cfg.rse.inference_weights}))

    def load_extras(self, folder: Path) -> None:
        f = folder / RELATIONS_FILE
        if f.is_file():
            data = json.loads(f.read_text())
            if data["relations"] == self.relations:
                with torch.no_grad():
                    self.relation_table.copy_(torch.tensor(data["vectors"]))


def load_relations(path: str) -> tuple[list[str], np.ndarray, dict | None]:
    f = Path(path) / RELATIONS_FILE
    if not f.is_file():
        raise UsageError(f"{path}: no {RELATIONS_FILE}; not an RSE student")
    data = json.loads(f.read_text())
    return data["relations"], np.asarray(data["vectors"], dtype=np.float32), data.get("inference_weights")


def mix_relation_vector(relations, vectors, weights: dict | None):
    """[(weight, vector)] for a weighted mix; None = the first relation alone."""
    if not weights:
        return [(1.0, vectors[0])]
    unknown = [r for r in weights if r not in relations]
    if unknown:
        raise UsageError(f"unknown relation(s) {', '.join(unknown)}; the student knows {', '.join(relations)}")
    total = sum(weights.values())
    if total <= 0:
        raise UsageError("relation weights must sum to more than 0")
    return [(w / total, vectors[relations.index(r)]) for r, w in weights.items()]


class RelationalScorer:
    """sentsim.evaluation scorer: sum_r w_r * sim(h_i + h_r, h_j) (a single relation when one weight)."""

    kind = "rse-relational"

    def __init__(self, path: str, relation: str | None = None, weights: dict | None = None, batch_size: int = 64,
                 device: str = "cpu"):
        from sentsim.evaluation.scorers import load_model_scorer

        self.relations, self.vectors, saved = load_relations(path)
        self.weights = {relation: 1.0} if relation else (weights or saved)
        self.mix = mix_relation_vector(self.relations, self.vectors, self.weights)
        self.base = load_model_scorer(path, batch_size, device)
        self.path = path

    def info(self) -> dict:
        w = self.weights or {self.relations[0]: 1.0}
        return {"kind": self.kind, "model": self.path, "pooling": f"{self.base.pooling}; relations {w}"}

    def prepare(self, tasks) -> None:
        self.base.prepare(tasks)

    def begin_task(self, task) -> None:
        pass

    def score_pairs(self, s1, s2) -> np.ndarray:
        a = torch.as_tensor(self.base.embed(s1))
        b = torch.as_tensor(self.base.embed(s2))
        out = torch.zeros(len(s1), dtype=torch.float64)
        for w, vec in self.mix:
            out += w * relational_similarity(a, b, torch.as_tensor(vec)).double()
        return out.numpy()
