"""Profiles, inputs and byte models shared by the softmax experiments (not an experiment itself)."""

from __future__ import annotations

import torch

from experiments._peers import QUACK_NOTE
from experiments.spec import Case, Profile
from kernels import reference
from kernels.softmax import MAX_SINGLE_BLOCK_N, plan_softmax, softmax, softmax_bwd

SOFTMAX_SOURCES = (
    "kernels/softmax.py", "kernels/softmax_launch.py", "kernels/softmax_kernels.py",
    "kernels/softmax_split_row_kernels.py", "kernels/softmax_plan.py", "kernels/_launch.py", "kernels/_checks.py",
)
REFERENCE_SOURCES = ("kernels/reference.py",)
LIGER_MAX_N = 65536  # liger_kernel.ops.utils.calculate_settings refuses larger rows
QUACK_VECTOR_BYTES = 16  # quack.softmax copies rows in 128-bit vectors from buffers it declares 16-byte aligned

# ‖out − ref‖ / ‖ref‖ accepted against float64, per dtype (a few units of the storage rounding).
FORWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BACKWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def forward_bytes(case: Case, dtype: torch.dtype) -> int:
    """Read x once, write y once."""
    return 2 * case["M"] * case["N"] * element_size(dtype)


def backward_bytes(case: Case, dtype: torch.dtype) -> int:
    """Read y and dy once, write dx once."""
    return 3 * case["M"] * case["N"] * element_size(dtype)


def forward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    x = torch.randn(case["M"], case["N"], generator=gen, device="cpu", dtype=torch.float32) * 3
    return {"x": x.to(device=device, dtype=dtype)}


def backward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    x = forward_inputs(case, dtype, device, gen)["x"]
    dy = torch.randn(case["M"], case["N"], generator=gen, device="cpu", dtype=torch.float32)
    return {"y": torch.softmax(x.float(), -1).to(dtype), "dy": dy.to(device=device, dtype=dtype)}


def forward_reference(x: torch.Tensor) -> torch.Tensor:
    return reference.softmax_float64(x, -1)


def backward_reference(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return reference.softmax_backward(y.double(), dy.double())


def _single_block_limit(case: Case, dtype: torch.dtype) -> str | None:
    if case["N"] > MAX_SINGLE_BLOCK_N:
        return f"single-block holds a row in registers: N <= {MAX_SINGLE_BLOCK_N}"
    return None


def _liger_limit(case: Case, dtype: torch.dtype) -> str | None:
    return f"Liger refuses N > {LIGER_MAX_N}" if case["N"] > LIGER_MAX_N else None


def quack_limit(case: Case, dtype: torch.dtype) -> str | None:
    """Why QuACK's softmax cannot take this row (None if it can): its copies are 16-byte vectors, so each row
    of N elements must start on a 16-byte boundary, which N · size a multiple of 16 guarantees."""
    if case["N"] * element_size(dtype) % QUACK_VECTOR_BYTES:
        # one wording for every such row, so that a page lists the refusal once with the cases it covers
        return (f"QuACK copies rows in {QUACK_VECTOR_BYTES}-byte vectors: it needs N × element size to be a "
                f"multiple of {QUACK_VECTOR_BYTES} bytes")
    return None


def _plan(impl: str, direction: str = "forward"):
    return lambda case, dtype: plan_softmax(case["M"], case["N"], dtype, impl, direction=direction).as_dict()


def _lab_softmax_bwd(impl: str):
    def run(y, dy):
        return softmax_bwd(y, dy, plan_softmax(y.shape[0], y.shape[1], y.dtype, impl, direction="backward"))

    return run


def _liger_forward(x):
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)


def _liger_backward(y, dy):
    from liger_kernel.ops.softmax import _softmax_backward
    from liger_kernel.ops.utils import calculate_settings

    block_size, num_warps = calculate_settings(y.shape[-1])
    return _softmax_backward(dy, y, block_size, num_warps, False)


def _quack_forward(x):
    from quack.softmax import softmax_fwd

    return softmax_fwd(x)


def _quack_backward(y, dy):
    from quack.softmax import softmax_bwd

    return softmax_bwd(dy, y)


# ---- forward profiles ------------------------------------------------------------------------------------

TRITON_AUTO = Profile(
    "triton-auto", "the lab's softmax, impl='auto' (single-block, split-row or online by row length)",
    lambda x: softmax(x, -1, impl="auto"), SOFTMAX_SOURCES, plan=_plan("auto"),
)
TRITON_SINGLE_BLOCK = Profile(
    "triton-single-block", "the lab's softmax, impl='single_block' (whole row in registers)",
    lambda x: softmax(x, -1, impl="single_block"), SOFTMAX_SOURCES, plan=_plan("single_block"),
    unsupported=_single_block_limit,
)
TRITON_ONLINE = Profile(
    "triton-online", "the lab's softmax, impl='online' ((m, d) pass, then a normalising pass)",
    lambda x: softmax(x, -1, impl="online"), SOFTMAX_SOURCES, plan=_plan("online"),
)
TORCH = Profile("torch.softmax", "torch.softmax (PyTorch's fused CUDA kernel)", reference.torch_softmax,
                REFERENCE_SOURCES)
TORCH_COMPILE = Profile("torch.compile", "torch.softmax through torch.compile (Inductor's Triton kernel)",
                        reference.compiled_softmax, REFERENCE_SOURCES)
NAIVE_TORCH = Profile("naive-torch", "five eager PyTorch operations (max, subtract, exp, sum, divide)",
                      reference.naive_softmax, REFERENCE_SOURCES)
LIGER = Profile("liger", "Liger-Kernel's LigerSoftmaxFunction", _liger_forward, (),
                unsupported=_liger_limit, requires="liger_kernel")

QUACK = Profile("quack", "QuACK's softmax_fwd (CuTe DSL; long rows split across a thread-block cluster)",
                _quack_forward, (), unsupported=quack_limit, requires="quack", requires_note=QUACK_NOTE)

FORWARD_PEERS = ("torch.softmax", "torch.compile", "liger", "quack")

# ---- backward profiles -----------------------------------------------------------------------------------

BWD_TRITON_AUTO = Profile("triton-auto", "the lab's softmax_bwd with the plan impl='auto' picks",
                          _lab_softmax_bwd("auto"), SOFTMAX_SOURCES, plan=_plan("auto", "backward"))
BWD_TRITON_SINGLE_BLOCK = Profile(
    "triton-single-block", "the lab's single-block backward (y and dy read once)",
    _lab_softmax_bwd("single_block"), SOFTMAX_SOURCES, plan=_plan("single_block", "backward"),
    unsupported=_single_block_limit,
)
BWD_TRITON_ONLINE = Profile("triton-online", "the lab's tiled backward (y and dy read twice)",
                            _lab_softmax_bwd("online"), SOFTMAX_SOURCES, plan=_plan("online", "backward"))
BWD_TORCH = Profile("torch", "PyTorch's softmax backward kernel (what autograd runs)",
                    reference.torch_softmax_backward, REFERENCE_SOURCES)
BWD_TORCH_COMPILE = Profile("torch.compile", "y * (dy - sum(y * dy)) through torch.compile",
                            reference.compiled_softmax_backward, REFERENCE_SOURCES)
BWD_NAIVE_TORCH = Profile("naive-torch", "the backward formula in three eager PyTorch operations",
                          reference.softmax_backward, REFERENCE_SOURCES)
BWD_LIGER = Profile("liger", "Liger-Kernel's softmax backward launcher", _liger_backward, (),
                    unsupported=_liger_limit, requires="liger_kernel")

BWD_QUACK = Profile("quack", "QuACK's softmax_bwd (CuTe DSL; long rows split across a thread-block cluster)",
                    _quack_backward, (), unsupported=quack_limit, requires="quack", requires_note=QUACK_NOTE)

BACKWARD_PEERS = ("torch", "torch.compile", "liger", "quack")
