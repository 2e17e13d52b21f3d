"""One training loop for every model sentsim fits by gradient descent: the surrogates
(sentsim.surrogate) and the student encoders (sentsim.students).

- `loop`: the worker side. `train_loop(config)` runs on Ray Train workers or in-process and trains a
  `Trainee` (an nn.Module whose forward(batch, device) is one step's loss and metrics, plus save,
  evaluate and describe hooks): optimizer, schedule, bf16 autocast on GPUs, finite-loss check,
  history, dev evaluation, checkpoints and resume.
- `run`: the driver side. `claim_out` (run fingerprint, --restart), `plan_steps`, `fit` (TorchTrainer
  or inline, then the caller's export hook), `write_curves`, `TrainingDiverged`.
- `config`: the settings both trainers share (`TrainingSection`, `ScratchConfig`, `RESUMABLE_KEYS`).
- `cli`: the flags both `sentsim train` commands share.

Each trainer supplies only what is its own: data loading and checks, the Trainee (its step, its
dev metric, what it saves), and the export to its final folder format.
"""

# `loop` imports torch, so it is not imported here: configs and the CLI stay light.
from sentsim.training.config import RESUMABLE_KEYS, ScratchConfig, TrainingSection
from sentsim.training.run import TrainingDiverged, claim_out, fit, plan_steps, quiet_progress, write_curves

__all__ = ["RESUMABLE_KEYS", "ScratchConfig", "TrainingDiverged", "TrainingSection", "claim_out", "fit", "plan_steps",
           "quiet_progress", "write_curves"]
