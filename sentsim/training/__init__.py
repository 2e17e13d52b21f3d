"""One training loop for every model sentsim fits by gradient descent: the coherence discriminator
(sentsim.discriminator), the context models (sentsim.context), the surrogates (sentsim.surrogate) and
the student encoders (sentsim.students).

- `loop`: the worker side. `train_loop(config)` runs on Ray Train workers or in-process and trains a
  `Trainee` (an nn.Module whose forward(batch, device) is one step's loss and metrics, plus save,
  evaluate, describe and optionally batches hooks): optimizer, transformers schedule, bf16 autocast
  on GPUs, finite-loss check, wall-clock stop, history, evaluation, checkpoints and resume.
- `settings`: `LoopSettings`, the one typed settings object the loop reads (and `fit` takes its Ray
  resources from), built by a classmethod per trainer.
- `run`: the driver side. `claim_out` (run fingerprint, --force-new), `plan_steps`, `fit` (the one
  TorchTrainer, or inline; then the caller's export hook), `write_curves`, `TrainingDiverged`.
- `driver`: `EncoderDriver`, the ten steps the surrogate and student trainers share (check --out,
  backbone, fingerprint, lease, Ray, fit, curves, summary); each supplies only what differs.
- `common`: what both sides use (`quiet_progress`, `use_gpu`).
- `config`: the settings the transformer trainers share (`TrainingSection`, `ScratchConfig`, `RESUMABLE_KEYS`).
- `cli`: the flags the `sentsim train` commands share.

Each trainer supplies only what is its own: data loading and checks, the Trainee (its step, its
metrics, what it saves), and the export to its final folder format.
"""

# `loop` imports torch, so it is not imported here: configs and the CLI stay light.
from sentsim.training.common import quiet_progress
from sentsim.training.config import RESUMABLE_KEYS, ScratchConfig, TrainingSection
from sentsim.training.run import TrainingDiverged, claim_out, fit, plan_steps, write_curves
from sentsim.training.settings import LoopSettings

__all__ = ["RESUMABLE_KEYS", "LoopSettings", "ScratchConfig", "TrainingDiverged", "TrainingSection", "claim_out", "fit",
           "plan_steps", "quiet_progress", "write_curves"]
