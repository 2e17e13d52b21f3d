"""A context-model bundle's `context.json`, read without loading a model.

The harvest checks every `--context-models` folder (its format, the directions it provides, its tokenizer)
before it writes anything, and a refusal there is the answer to a typo: it should come back in the time
`sentsim` takes to start, not after torch and transformers are imported. Loading the models themselves is
`sentsim.context.model.load_bundle`, which reads this file through `read_bundle_meta` too.
"""

from __future__ import annotations

import json
from pathlib import Path

from sentsim.errors import UsageError

FORMAT = "sentsim-context/1"


def read_bundle_meta(path: str | Path) -> dict:
    """context.json of the bundle a reader loads for `path` (sentsim.model_swap.resolve_in_place)."""
    from sentsim.model_swap import resolve_in_place

    p = resolve_in_place(path, "context.json") / "context.json"
    if not p.is_file():
        if not Path(path).exists():  # a typo in the path, told apart from a folder of something else
            raise UsageError(f"{path}: no such context-model directory")
        raise UsageError(f"{path}: not a context-model directory (no context.json)")
    meta = json.loads(p.read_text())
    if meta.get("format") != FORMAT:
        raise UsageError(f"{path}: context.json format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta
