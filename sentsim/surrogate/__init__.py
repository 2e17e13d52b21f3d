"""Surrogate models (paper section 3.4): fast encoders trained to reproduce harvested Origin scores.

    from sentsim.surrogate import SurrogateConfig, train_surrogate
    train_surrogate(SurrogateConfig(), data="harvest/", backbone=MINILM, out="surrogate/")
"""

from sentsim.surrogate.config import SurrogateConfig
from sentsim.surrogate.train import TrainingDiverged, train_surrogate

__all__ = ["SurrogateConfig", "TrainingDiverged", "train_surrogate"]
