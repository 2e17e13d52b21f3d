"""The surrogate as a `sentsim.training.loop.Trainee`: one step fits the batch's predicted similarity
to its target score (paper section 3.4, or STS-B gold / 5 when fine-tuning, section 4.1); the dev
and test metrics are L2 and Spearman x100 against those targets.

Its dev metric is `predict` (sentsim.training.encoder_models) and `metrics` (sentsim.training.encoders), as the
students' is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sentsim.training.encoder_models import predict
from sentsim.training.encoders import metrics
from sentsim.training.loop import Trainee


def collect(shard, limit: int) -> dict:
    """Materialise a (small, capped) dev/test split on the worker: lists of s1, s2, score."""
    s1, s2, y = [], [], []
    for batch in shard.iter_batches(batch_size=1024, batch_format="numpy"):
        s1 += [str(x) for x in batch["s1"]]
        s2 += [str(x) for x in batch["s2"]]
        y += [float(x) for x in batch["score"]]
        if len(y) >= limit:
            break
    return {"s1": s1[:limit], "s2": s2[:limit], "score": np.asarray(y[:limit], dtype=np.float64)}


class SurrogateTrainee(Trainee):
    def __init__(self, model, tok, cfg, evals: dict, loss: str, targets: str = "teacher"):
        from sentsim.losses import LOSSES

        super().__init__()
        self.model = model
        self.tok = tok
        self.cfg = cfg
        self.loss_name = loss
        self.loss = LOSSES[loss]()
        self.targets = targets  # whose scores dev and test hold: the teacher's, or STS-B's gold
        self.evals = evals  # {"dev": {s1, s2, score}, "test": ...}

    def forward(self, batch: dict, device):
        from sentsim.training.encoder_models import tokenize

        enc = tokenize(self.tok, self.cfg.arch, [str(x) for x in batch["s1"]], [str(x) for x in batch["s2"]],
                       self.cfg.max_seq_length, device)
        y = torch.as_tensor(np.asarray(batch["score"], dtype=np.float32), device=device)
        return self.loss.on_scores(self.model(enc), y), {"batch_rows": len(y)}  # a short last batch counts too

    def save(self, folder: Path) -> None:
        from sentsim.training.encoder_models import save_hf

        save_hf(self.model, self.tok, folder / "model")

    def evaluate(self, device, autocast) -> dict:
        m = {}
        for name, d in self.evals.items():
            pred = predict(self.model, self.tok, self.cfg.arch, d["s1"], d["s2"], self.cfg.max_seq_length,
                           self.cfg.eval_batch_size, device, autocast)
            m.update(metrics(pred, d["score"], name))
        return m

    def describe(self, point: dict) -> str:
        if "dev_l2" not in point:
            return ""
        # under cosent the cosines keep the targets' order, not their values: their L2 says nothing
        l2 = "" if self.loss_name == "cosent" else f" dev L2 {point['dev_l2']:.4g}"
        return (f"{l2} dev/test Spearman vs {self.targets} "
                f"{point['dev_spearman']:.2f}/{point['test_spearman']:.2f} ({point['time_s']:.0f}s)")

    def note(self) -> str:
        return "dev/test " + "/".join(str(len(d["score"])) for d in self.evals.values()) + " pairs"


def build_trainee(config: dict, session, ckpt) -> SurrogateTrainee:
    """On the worker: the model from the checkpoint (resume) or the stage's backbone, and the capped
    dev/test splits, which every worker reads whole."""
    from sentsim.surrogate.config import SurrogateConfig
    from sentsim.training.encoder_models import build_model

    cfg = SurrogateConfig.model_validate(config["cfg"])
    st = config["stage"]
    if ckpt is not None:
        model, tok = build_model(cfg.arch, str(ckpt / "model"), "pretrained", seed=cfg.seed)
    else:
        model, tok = build_model(cfg.arch, st["backbone"], st["init"], cfg.scratch.model_dump(), cfg.seed)
    evals = {name: collect(session.shard(name), cfg.eval_max_pairs) for name in ("dev", "test")}
    # the fine-tune stage trains with 003 §4.1's L2 whatever the harvest stage's loss (SurrogateRun.train)
    gold = config["loop"].label.endswith("finetune-sts")  # its dev and test hold STS-B's gold scores
    return SurrogateTrainee(model, tok, cfg, evals, loss=st.get("loss", cfg.loss),
                            targets="gold" if gold else "teacher")
