"""Generative context models of paper 003 (sections 3.2.2 and 3.3): p(s|c<,c>), p(c<|s,c>), p(c>|c<,s),
their training on corpus windows, and the batched scorer of Eq. 3. See README.md in this folder."""

from sentsim.context.config import DIRECTIONS, ContextModelConfig, ContextTrainConfig, ScorerConfig
from sentsim.context.scorer import ContextItem, ContextScorer, ScoreResult

__all__ = [
    "DIRECTIONS", "ContextModelConfig", "ContextTrainConfig", "ScorerConfig", "ContextItem", "ContextScorer",
    "ScoreResult", "train_context",
]


def train_context(*args, **kwargs):
    from sentsim.context.train import train_context as _train

    return _train(*args, **kwargs)
