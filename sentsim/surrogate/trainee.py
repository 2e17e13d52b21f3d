"""The surrogate as a `sentsim.training.loop.Trainee`: one step fits the batch's predicted similarity
to its target score (paper section 3.4, or STS-B gold / 5 when fine-tuning, section 4.1); the dev
and test metrics are L2 and Spearman x100 against those targets.

`predict` and `metrics` also serve the students' dev evaluation (sentsim.students).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

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


def predict(model, tok, arch: str, s1, s2, max_len: int, batch_size: int, device, autocast) -> np.ndarray:
    """Surrogate predictions; the Siamese form encodes each unique sentence once (its whole point)."""
    from sentsim.surrogate.models import tokenize

    model.eval()
    out = []
    with torch.no_grad(), autocast():
        if arch == "cross":
            for i in range(0, len(s1), batch_size):
                out.append(model(tokenize(tok, "cross", s1[i:i + batch_size], s2[i:i + batch_size], max_len,
                                          device)).float().cpu())
            model.train()
            return torch.cat(out).numpy().astype(np.float64)
        uniq = sorted(set(s1) | set(s2), key=len)  # length-sorted: less padding per batch
        vecs = {}
        for i in range(0, len(uniq), batch_size):
            chunk = uniq[i:i + batch_size]
            enc = tok(chunk, padding=True, truncation=True, max_length=max_len, return_tensors="pt").to(device)
            emb = model.embed(**enc).float().cpu()
            vecs.update(zip(chunk, emb))
    model.train()
    a = torch.stack([vecs[s] for s in s1])
    b = torch.stack([vecs[s] for s in s2])
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy().astype(np.float64)


def metrics(pred: np.ndarray, y: np.ndarray, prefix: str) -> dict:
    from scipy.stats import spearmanr

    rho = spearmanr(pred, y).statistic if len(y) > 1 and np.ptp(pred) > 0 and np.ptp(y) > 0 else float("nan")
    return {f"{prefix}_l2": float(np.mean((pred - y) ** 2)), f"{prefix}_spearman": float(rho) * 100.0}


class SurrogateTrainee(Trainee):
    def __init__(self, model, tok, cfg, evals: dict):
        from sentsim.losses import LOSSES

        super().__init__()
        self.model = model
        self.tok = tok
        self.cfg = cfg
        self.loss = LOSSES[cfg.loss]()
        self.evals = evals  # {"dev": {s1, s2, score}, "test": ...}

    def forward(self, batch: dict, device):
        from sentsim.surrogate.models import tokenize

        enc = tokenize(self.tok, self.cfg.arch, [str(x) for x in batch["s1"]], [str(x) for x in batch["s2"]],
                       self.cfg.max_seq_length, device)
        y = torch.as_tensor(np.asarray(batch["score"], dtype=np.float32), device=device)
        return self.loss.on_scores(self.model(enc), y), {"batch_rows": len(y)}  # a short last batch counts too

    def save(self, folder: Path) -> None:
        from sentsim.surrogate.models import save_hf

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
        return (f" dev L2 {point['dev_l2']:.4g} dev/test Spearman vs teacher "
                f"{point['dev_spearman']:.2f}/{point['test_spearman']:.2f} ({point['time_s']:.0f}s)")

    def note(self) -> str:
        return "dev/test " + "/".join(str(len(d["score"])) for d in self.evals.values()) + " pairs"


def build_trainee(config: dict, session, ckpt) -> SurrogateTrainee:
    """On the worker: the model from the checkpoint (resume) or the stage's backbone, and the capped
    dev/test splits, which every worker reads whole."""
    from sentsim.surrogate.config import SurrogateConfig
    from sentsim.surrogate.models import build_model

    cfg = SurrogateConfig.model_validate(config["cfg"])
    st = config["stage"]
    if ckpt is not None:
        model, tok = build_model(cfg.arch, str(ckpt / "model"), "pretrained", seed=cfg.seed)
    else:
        model, tok = build_model(cfg.arch, st["backbone"], st["init"], cfg.scratch.model_dump(), cfg.seed)
    evals = {name: collect(session.shard(name), cfg.eval_max_pairs) for name in ("dev", "test")}
    return SurrogateTrainee(model, tok, cfg, evals)
