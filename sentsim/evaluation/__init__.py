"""The STS evaluation suite: dataset loaders, scorers and the Spearman/Pearson evaluator.

    tasks, missing = discover_tasks(data_dir)       # STS12-16, STS-B, SICK-R found under data_dir
    scorer = load_model_scorer(path)                # or TfidfScorer(), PairFileScorer(file)
    report = evaluate(scorer, tasks, missing)
    print(format_table(report))
"""

from sentsim.evaluation.datasets import TASK_NAMES, StsSet, StsTask, discover_tasks, load_task
from sentsim.evaluation.evaluator import EvalReport, evaluate
from sentsim.evaluation.report import format_table, to_json, to_markdown
from sentsim.evaluation.scorers import (
    EmbeddingScorer,
    PairFileScorer,
    TfidfScorer,
    load_model_scorer,
)

__all__ = [
    "StsSet", "StsTask", "discover_tasks", "load_task", "TASK_NAMES",
    "EvalReport", "evaluate", "format_table", "to_markdown", "to_json",
    "EmbeddingScorer", "PairFileScorer", "TfidfScorer", "load_model_scorer",
]
