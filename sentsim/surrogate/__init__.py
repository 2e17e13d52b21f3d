"""Surrogate models (paper section 3.4): fast encoders trained to reproduce harvested Origin scores.

    from sentsim.bundled_model import default_base_encoder   # the bundled all-MiniLM-L6-v2
    from sentsim.surrogate import SurrogateConfig, train_surrogate
    train_surrogate(SurrogateConfig(), data="harvest/", backbone=default_base_encoder(), out="surrogate/")

config.py (settings), data.py (harvest checks; ray.data splits, or tables inline), trainee.py (the step and
the dev metric), train.py (stages on the shared loop and driver of sentsim.training). Shared with the students, in
sentsim.training: the Siamese and cross forms, their export (replaced all or nothing by sentsim.model_swap)
and predictions (encoder_models.py), and the model card, the README.md that says what a model is
(model_card.py).
"""

from sentsim.surrogate.config import SurrogateConfig
from sentsim.surrogate.train import TrainingDiverged, train_surrogate

__all__ = ["SurrogateConfig", "TrainingDiverged", "train_surrogate"]
