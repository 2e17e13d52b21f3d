"""Surrogate models (paper section 3.4): fast encoders trained to reproduce harvested Origin scores.

    from sentsim.surrogate import SurrogateConfig, train_surrogate
    train_surrogate(SurrogateConfig(), data="harvest/", backbone=MINILM, out="surrogate/")

config.py (settings), data.py (harvest checks, ray.data splits), models.py (Siamese and cross forms,
export), export.py (a model folder replaced all or nothing, students' too), card.py (the README.md that
says what a model is), trainee.py (the step and the dev metric), train.py (stages on the shared loop of
sentsim.training).
"""

from sentsim.surrogate.config import SurrogateConfig
from sentsim.surrogate.train import TrainingDiverged, train_surrogate

__all__ = ["SurrogateConfig", "TrainingDiverged", "train_surrogate"]
