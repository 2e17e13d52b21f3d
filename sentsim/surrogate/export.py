"""The surrogate's and students' exports replace their OUT/model whole: `sentsim.model_swap.replace_folder`
(written beside as OUT/model.new, sealed, swapped in by renames; `finish_swap` completes a swap a kill
cut short). Kept under this name for the trainers that import it."""

from __future__ import annotations

from sentsim.model_swap import finish_swap, replace_folder, seal, stage, swap_steps

__all__ = ["finish_swap", "replace_folder", "seal", "stage", "swap_steps"]
