"""torch.compile for the context model's hot functions: one graph each, for every batch shape.

On the H200 three quarters of a training step's GPU time was outside the matrix products: autocast's dtype
copies, layer norms, other element-wise work, bias-gradient sums (BENCHMARKS.md, "GPU"). A compiler fuses
that work into few kernels. Batches change their rows and lengths from one to the next (planned on length,
`stream.py`, `batching.plan_batches`), and a graph compiled for static shapes is compiled again for each new
shape; compiling layer by layer that way ran slower than eager on the H200 (12.1% MFU against 18.8%). So
every dimension of every tensor argument is marked dynamic before the first call: a function compiles
once, at the start, and serves every batch after it. The parameters keep their static shapes.

`dynamic(fn)` wraps a function whose first argument is the model and whose other arguments are tensors or
dicts of tensors (`train.token_loss`; the scorer's `encode_states` and `target_logprobs`).
"""

from __future__ import annotations

from typing import Callable

import torch


def _mark(value) -> None:
    if isinstance(value, torch.Tensor):
        for d in range(value.dim()):
            # "maybe": a dimension the graph needs as a constant is specialised (one more compile), not an error
            torch._dynamo.maybe_mark_dynamic(value, d)
    elif isinstance(value, dict):
        for v in value.values():
            _mark(v)


def dynamic(fn: Callable) -> Callable:
    """`fn` compiled with torch.compile, every tensor dimension of its arguments dynamic from the first call."""
    compiled = torch.compile(fn)

    def call(model, *args, **kwargs):
        for a in (*args, *kwargs.values()):
            _mark(a)
        return compiled(model, *args, **kwargs)

    call.__name__ = call.__qualname__ = f"compiled_{fn.__name__}"
    call.__doc__ = fn.__doc__
    return call
