"""BiLSTM coherence discriminator (paper 003 §3.2.1) with an interaction head; see model.py."""

from sentsim.discriminator.io import Discriminator
from sentsim.discriminator.model import CoherenceModel, ModelConfig
from sentsim.discriminator.train import DiscriminatorJob, TrainConfig, train_discriminator

__all__ = ["Discriminator", "CoherenceModel", "ModelConfig", "DiscriminatorJob", "TrainConfig", "train_discriminator"]
