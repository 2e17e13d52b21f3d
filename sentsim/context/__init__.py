"""Generative context models of paper 003 (sections 3.2.2 and 3.3): p(s|c<,c>), p(c<|s,c>), p(c>|c<,s),
their training on corpus windows, and the batched scorer of Eq. 3. See README.md in this folder.

Exports are imported on first use: the training stream's worker processes import this package and
need neither torch nor transformers."""

__all__ = [
    "DIRECTIONS", "ContextModelConfig", "ContextTrainConfig", "ScorerConfig", "ContextItem", "ContextScorer",
    "ScoreResult", "train_context",
]

_HOME = {"DIRECTIONS": "config", "ContextModelConfig": "config", "ContextTrainConfig": "config",
         "ScorerConfig": "config", "ContextItem": "scorer", "ContextScorer": "scorer", "ScoreResult": "scorer",
         "train_context": "train"}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"sentsim.context.{_HOME[name]}"), name)
