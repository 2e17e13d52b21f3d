"""Which number formats this machine runs fast.

bf16 autocast pays only where the hardware has bf16 arithmetic: CUDA GPUs that report it, and CPUs
with AVX512_BF16 or AMX (x86) or the BF16 extension (Arm). On other CPUs torch emulates bf16 matmuls
at a small fraction of the fp32 rate (measured on an AVX2-only EPYC: 0.8 against 62 GFLOP/s for a
1024x1024 matmul; on an EPYC with avx512_bf16, 427 against 193 on 2 threads; BENCHMARKS.md, "Scoring"), so there
"auto" means fp32.

`SENTSIM_CPU_BF16=1` or `=0` overrides the detection (e.g. a container that hides the CPU flags).
"""

from __future__ import annotations

import functools
import os
import platform

# CPU feature flags (as /proc/cpuinfo names them) that mean native bf16 arithmetic
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset:
    """The CPU's feature flags from /proc/cpuinfo (Linux: "flags" on x86, "Features" on Arm); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_bf16_native() -> bool:
    """Whether this CPU has bf16 arithmetic (or SENTSIM_CPU_BF16 says so)."""
    forced = os.environ.get("SENTSIM_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return True  # Apple M2 and later have BF16; torch's CPU kernels use it
    return bool(cpu_flags() & BF16_CPU_FLAGS)


def bf16_native(device_type: str) -> bool:
    """Whether bf16 autocast is native (fast) on this device type ("cuda" or "cpu")."""
    if device_type == "cuda":
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return cpu_bf16_native()
    return False


def resolve_autocast(autocast: str, device_type: str) -> str:
    """The format an `autocast` setting ("auto", "bf16", "fp16" or "off") computes in on this device type:
    "auto" is "bf16" where bf16 is native and "off" (fp32) elsewhere; the others are themselves."""
    if autocast != "auto":
        return autocast
    return "bf16" if bf16_native(device_type) else "off"


def describe() -> str:
    """One line for logs and benchmark headers: CPU model, cores and whether bf16 is native."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs, bf16 {'native' if cpu_bf16_native() else 'emulated (fp32 used)'}"


__all__ = ["BF16_CPU_FLAGS", "bf16_native", "cpu_bf16_native", "cpu_flags", "describe", "resolve_autocast"]


def prefer_shape_free_attention(device) -> None:
    """On a GPU, leave cuDNN out of scaled-dot-product attention. It builds an execution plan for every
    new (batch, length) shape, milliseconds each; batches planned on their lengths have a new shape almost
    every time, and scoring on an H200 spent 70% of its time there (BENCHMARKS.md, "GPU"). Flash and
    memory-efficient attention need no plan."""
    import torch

    if getattr(device, "type", device) == "cuda" and torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)
