"""Profiles, inputs, byte models and cases shared by the residual add + RMSNorm experiments (not an experiment
itself): add-rmsnorm-fwd times (h, y) = (x + r, rms_norm(x + r) * gamma); add-rmsnorm-bwd times its backward
alone, on each profile's own retained forward graph (experiments/_backward.py).
"""

from __future__ import annotations

import torch

from experiments._backward import retained_backward
from experiments._peers import QUACK_NOTE
from experiments.spec import Case, Profile
from kernels import reference_fusions as ref
from kernels.add_rmsnorm import add_rmsnorm, plan_add_rmsnorm, sm_count

EPS = 1e-6
KERNEL_SOURCES = ("kernels/add_rmsnorm.py", "kernels/_checks.py", "kernels/_launch.py")
REFERENCE_SOURCES = ("kernels/reference_fusions.py",)

# (tokens T, hidden H): two decode batches, then prefill and training sizes from 2k to 16k features, where
# the traffic (48 MiB to 2 GiB a call) is far past the 50 MB L2 and the kernels are bound by DRAM.
SHAPES = (
    (1, 4096), (32, 4096),
    (4096, 2048), (4096, 4096), (4096, 5120), (4096, 8192), (4096, 16384),
    (16384, 2048), (16384, 4096), (16384, 7168), (16384, 8192), (32768, 4096),
)
CASES = tuple(Case(f"{t}x{h}", {"T": t, "H": h}, f"{t:,} token{'s' if t > 1 else ''}, hidden size {h:,}")
              for t, h in SHAPES)
DTYPES = (torch.bfloat16, torch.float32)

# ‖out − ref‖ / ‖ref‖ against float64, the largest over the outputs. Each output is rounded once or twice to
# the storage dtype (unit roundoff: bf16 2^-8, fp16 2^-11): h by the add, y by the store (and once more where
# a peer rounds the normalised row before gamma). Backward: dx is rounded once, dgamma after a sum over T
# rows in fp32. A dropped gamma, a missing dh or a wrong rstd miss these bounds by an order of magnitude.
FORWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BACKWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

FORWARD_BYTE_MODEL = "forward: (4·T·H + H)·size bytes (x and r read, h and y written, γ read once; rstd left out)"
BACKWARD_BYTE_MODEL = (
    "backward: (4·T·H + 2·H)·size bytes (dy, dh and h read, dx written, γ read and dγ written once; "
    "rstd and dγ's partial sums left out)"
)


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def forward_bytes(case: Case, dtype: torch.dtype) -> int:
    """Read x and r, write h and y; gamma read once."""
    return (4 * case["T"] * case["H"] + case["H"]) * element_size(dtype)


def backward_bytes(case: Case, dtype: torch.dtype) -> int:
    """Read dy, dh and h, write dx (dr is the same tensor); gamma read once, dgamma written once."""
    return (4 * case["T"] * case["H"] + 2 * case["H"]) * element_size(dtype)


def forward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """x, r ~ N(0, 1); gamma ~ 1 + N(0, 0.1²), far enough from ones that dropping it fails the check."""
    t, h = case["T"], case["H"]
    x = torch.randn(t, h, generator=gen, dtype=torch.float32)
    residual = torch.randn(t, h, generator=gen, dtype=torch.float32)
    gamma = 1.0 + 0.1 * torch.randn(h, generator=gen, dtype=torch.float32)
    return {name: v.to(device=device, dtype=dtype) for name, v in (("x", x), ("residual", residual), ("gamma", gamma))}


def backward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """The forward inputs, and upstream gradients dh and dy ~ N(0, 1)."""
    inputs = forward_inputs(case, dtype, device, gen)
    t, h = case["T"], case["H"]
    for name in ("dh", "dy"):
        inputs[name] = torch.randn(t, h, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return inputs


def forward_reference(x, residual, gamma):
    return ref.add_rmsnorm_float64(x, residual, gamma, EPS)


def backward_reference(x, residual, gamma, dh, dy):
    """(dx, dr, dgamma) in float64; dr = dx."""
    dx, dgamma = ref.add_rmsnorm_backward_float64(x, residual, gamma, dy, dh, EPS)
    return dx, dx, dgamma


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _plan(direction: str):
    def plan(case: Case, dtype: torch.dtype) -> dict:
        return plan_add_rmsnorm(case["T"], case["H"], dtype, direction, sm_count(_device())).as_dict()

    return plan


def lab(x, residual, gamma):
    return add_rmsnorm(x, residual, gamma, EPS)


def torch_eager(x, residual, gamma):
    return ref.add_rmsnorm_reference(x, residual, gamma, EPS)


def torch_compiled(x, residual, gamma):
    return ref.compiled_add_rmsnorm(x, residual, gamma, EPS)


def liger(x, residual, gamma):
    """Liger's fused add + RMSNorm in its default ("llama") casting mode, not in place; returns (h, y)."""
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    y, h = LigerFusedAddRMSNormFunction.apply(x, residual, gamma, EPS, 0.0, "llama", False)
    return h, y


def quack(x, residual, gamma):
    """QuACK's RMSNorm with a residual, prenorm=True so that it returns the sum as well; returns (h, y)."""
    from quack.rmsnorm import rmsnorm

    y, h = rmsnorm(x, gamma, residual=residual, eps=EPS, prenorm=True)
    return h, y


# ---- forward profiles ------------------------------------------------------------------------------------

TRITON = Profile("triton", "the lab's add_rmsnorm: one program per row, the row held in registers",
                 lab, KERNEL_SOURCES, plan=_plan("forward"))
TORCH = Profile("torch", "x + r, then F.rms_norm: eager PyTorch, two kernels", torch_eager, REFERENCE_SOURCES)
TORCH_COMPILE = Profile("torch.compile", "the same pair through torch.compile (Inductor's fused kernel)",
                        torch_compiled, REFERENCE_SOURCES)
LIGER = Profile("liger", "Liger-Kernel's LigerFusedAddRMSNormFunction", liger, (), requires="liger_kernel")
QUACK = Profile("quack", "QuACK's rmsnorm with residual= and prenorm=True (CuTe DSL)", quack, (), requires="quack",
                requires_note=QUACK_NOTE)

FORWARD_PROFILES = (TRITON, TORCH, TORCH_COMPILE, LIGER, QUACK)
PEERS = ("torch", "torch.compile", "liger", "quack")

# ---- backward profiles -----------------------------------------------------------------------------------

_LEAVES = ("x", "residual", "gamma")
_GRADS = ("dh", "dy")  # in the order the forwards return (h, y)

BWD_TRITON = Profile(
    "triton", "the lab's backward: runs of rows a program, dγ summed in two stages (partials, then a reduce)",
    retained_backward(lab, _LEAVES, _GRADS), KERNEL_SOURCES, plan=_plan("backward"),
)
BWD_TORCH = Profile("torch", "eager autograd of x + r, then F.rms_norm", retained_backward(torch_eager, _LEAVES, _GRADS),
                    REFERENCE_SOURCES)
BWD_TORCH_COMPILE = Profile(
    "torch.compile", "the backward AOTAutograd compiled for the pair under torch.compile",
    retained_backward(torch_compiled, _LEAVES, _GRADS), REFERENCE_SOURCES,
)
BWD_LIGER = Profile("liger", "Liger-Kernel's LigerFusedAddRMSNormFunction backward (not in place)",
                    retained_backward(liger, _LEAVES, _GRADS), (), requires="liger_kernel")

BWD_QUACK = Profile("quack", "QuACK's rmsnorm backward (residual=, prenorm=True; CuTe DSL)",
                    retained_backward(quack, _LEAVES, _GRADS), (), requires="quack", requires_note=QUACK_NOTE)

BACKWARD_PROFILES = (BWD_TRITON, BWD_TORCH, BWD_TORCH_COMPILE, BWD_LIGER, BWD_QUACK)
DECISIONS = ("fused-add-rmsnorm-swiglu",)
