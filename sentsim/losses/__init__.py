"""Training losses for pair regression, one per module, each documented with its inputs and source."""

from sentsim.losses.cosent import CoSENTLoss
from sentsim.losses.cosine_regression import CosineRegressionLoss

LOSSES = {"cosine_regression": CosineRegressionLoss, "cosent": CoSENTLoss}

__all__ = ["CoSENTLoss", "CosineRegressionLoss", "LOSSES"]
