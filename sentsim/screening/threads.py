"""The numbers a screening run stores are computed on one torch thread, in every executor.

With more intra-op threads, torch splits a large element-wise op or matrix product into per-thread ranges,
and a range's ends take other code paths (a scalar tail instead of a vector kernel, another GEMM blocking):
the last digits of a float change with the thread count. An inline build ran on every core and a Ray actor
on its one CPU (Ray sets OMP_NUM_THREADS to the actor's CPUs), so the same unit of the rep cache came out
differently by executor (-0.2547886 against -0.25478864). With one thread, a unit's rows depend on its
inputs alone; a build's parallelism is its units, on several actors.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def one_torch_thread():
    """Run the block on one torch intra-op thread; the process's own count is restored after it."""
    import torch

    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
