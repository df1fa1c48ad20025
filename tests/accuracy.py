"""Norm-wise error helpers shared by the kernel tests (the kernels' float64 checks)."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """‖a − ref‖ / ‖ref‖ in float64."""
    return ((a.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def stored(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`ref` stored in `dtype` the way the kernels' final cast does it on this device."""
    if dtype == torch.bfloat16 and ref.device.type == "cpu":  # the interpreter's cast truncates
        bits = ref.float().view(torch.int32) & ~0xFFFF
        return bits.view(torch.float32).double()
    return ref.to(dtype).double()


def reference_error(candidate: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error an accurate kernel is allowed: torch's in the same dtype, or the storage rounding alone."""
    return max(rel_err(candidate, ref), rel_err(stored(ref, dtype), ref))
