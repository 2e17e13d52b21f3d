"""Spearman x 100 (the "all" setting: every pair of a year pooled) and Pearson x 100 per task."""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class SetResult:
    name: str
    n: int
    scored: int
    spearman: float | None
    pearson: float | None


@dataclass
class TaskResult:
    name: str
    n: int           # pairs with a gold score
    scored: int      # of those, pairs the scorer gave a score (always n for models)
    spearman: float | None  # x100, all pairs of the task pooled
    pearson: float | None
    data_hash: str
    note: str = ""
    sets: list[SetResult] = field(default_factory=list)
    undefined: str = ""  # why spearman is None (the task is then left out of the average); "" when it is not


@dataclass
class EvalReport:
    scorer: dict
    tasks: list[TaskResult]
    missing_tasks: list[str]
    data_hash: str
    seconds: float

    @property
    def average(self) -> float | None:
        vals = [t.spearman for t in self.tasks if t.spearman is not None]
        return float(np.mean(vals)) if vals else None

    def task(self, name: str) -> TaskResult:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["average_spearman"] = self.average
        return d


def correlations(pred: np.ndarray, gold: np.ndarray) -> tuple[float | None, float | None, int]:
    """(Spearman x100, Pearson x100, pairs used); pairs with a NaN prediction are left out."""
    pred = np.asarray(pred, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    keep = np.isfinite(pred)
    n = int(keep.sum())
    if n < 2 or np.ptp(pred[keep]) == 0 or np.ptp(gold[keep]) == 0:
        return None, None, n  # undefined: too few pairs or a constant side
    # here, not at the top: scipy.stats costs every command that imports sentsim.evaluation ~1.5 s
    from scipy.stats import pearsonr, spearmanr

    rho = spearmanr(pred[keep], gold[keep]).statistic
    r = pearsonr(pred[keep], gold[keep]).statistic
    return float(rho) * 100.0, float(r) * 100.0, n


def undefined_reason(pred: np.ndarray, gold: np.ndarray) -> str:
    """Why `correlations` has no value for these pairs ("" where it has one): a rank correlation needs two or
    more scored pairs, and neither side constant."""
    pred = np.asarray(pred, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    keep = np.isfinite(pred)
    n = int(keep.sum())
    if n == 0:
        return "no pair scored"
    if n == 1:
        return "1 pair scored"
    if np.ptp(pred[keep]) == 0:
        return "scores constant"
    if np.ptp(gold[keep]) == 0:
        return "gold constant"
    return ""


def evaluate(scorer, tasks, missing_tasks: list[str] | None = None) -> EvalReport:
    start = time.perf_counter()
    scorer.prepare(tasks)  # one batched encoding pass over every unique sentence
    results = []
    for task in tasks:
        scorer.begin_task(task)
        preds, golds, set_results = [], [], []
        for st in task.sets:
            p = scorer.score_pairs(st.s1, st.s2)
            rho, r, used = correlations(p, st.gold)
            set_results.append(SetResult(st.name, len(st), used, rho, r))
            preds.append(p)
            golds.append(st.gold)
        pred, gold = np.concatenate(preds), np.concatenate(golds)
        rho, r, used = correlations(pred, gold)
        notes = [task.note] if task.note else []
        if used < task.n_pairs:
            notes.append(f"scores for {used} of {task.n_pairs} pairs")
        # a row of dashes says nothing of why: a model whose cosines are all equal is not a data problem
        undefined = undefined_reason(pred, gold) if rho is None else ""
        if undefined:
            notes.append(f"{undefined}: Spearman undefined")
        results.append(TaskResult(task.name, task.n_pairs, used, rho, r, task.data_hash(), "; ".join(notes),
                                  set_results, undefined))
    overall = hashlib.sha256("".join(f"{t.name}:{t.data_hash}" for t in results).encode()).hexdigest()[:16]
    return EvalReport(dict(scorer.info()), results, list(missing_tasks or []), overall, time.perf_counter() - start)
