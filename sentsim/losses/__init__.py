"""Training losses, one per module, each documented with its inputs and source.

`LOSSES` registers the surrogate's pair-regression losses by the name `train surrogate --loss` takes
(cosine_regression, cosent). The students' objectives use the others directly: infonce and rank_mse
(RankEncoder), rse_relational (RSE), phrase_reconstruction (PaSeR)."""

from sentsim.losses.cosent import CoSENTLoss
from sentsim.losses.cosine_regression import CosineRegressionLoss

LOSSES = {"cosine_regression": CosineRegressionLoss, "cosent": CoSENTLoss}

__all__ = ["CoSENTLoss", "CosineRegressionLoss", "LOSSES"]
