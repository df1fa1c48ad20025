"""Input checks shared by the kernel launchers.

Each check raises with a message that names what was wrong and what is accepted, so a caller never has
to read a Triton traceback to learn that a tensor was on the wrong device.
"""

from __future__ import annotations

import os

import torch

INTERPRET_ENV = "TRITON_INTERPRET"


def interpreter_enabled() -> bool:
    """True when Triton's interpreter runs the kernels (set before `kernels` is imported)."""
    return os.environ.get(INTERPRET_ENV, "0") not in ("", "0")


def check_device(op: str, *tensors: torch.Tensor) -> None:
    """CUDA tensors run compiled kernels; CPU tensors run only under Triton's interpreter."""
    for t in tensors:
        if t.device.type == "cuda":
            continue
        if t.device.type == "cpu" and interpreter_enabled():
            continue
        raise RuntimeError(
            f"{op}: got a tensor on device '{t.device}', but the Triton kernels run on CUDA. "
            f"Move the tensor to a GPU (x.cuda()), or set {INTERPRET_ENV}=1 before importing "
            "`kernels` to run them on the CPU through Triton's interpreter (slow; for tests)."
        )
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise RuntimeError(f"{op}: all tensors must be on one device, got {names}.")


def check_dtype(op: str, name: str, t: torch.Tensor, accepted: tuple[torch.dtype, ...]) -> None:
    if t.dtype in accepted:
        return
    names = ", ".join(str(d).removeprefix("torch.") for d in accepted)
    raise TypeError(f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')}; supported dtypes are {names}.")


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """Map a possibly negative `dim` to [0, ndim); a 0-d tensor behaves like a 1-d one, as in torch."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}.")
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(
            f"{op}: dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})."
        )
    return dim % rank
