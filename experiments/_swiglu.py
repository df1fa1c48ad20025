"""Profiles, inputs, byte models and cases shared by the SwiGLU experiments (not an experiment itself):
swiglu-fwd times c = silu(a) * b; swiglu-bwd times its backward alone, on each profile's own retained forward
graph (experiments/_backward.py).
"""

from __future__ import annotations

import torch

from experiments._backward import retained_backward
from experiments.spec import Case, Profile
from kernels import reference_fusions as ref
from kernels.swiglu import plan_swiglu, swiglu

KERNEL_SOURCES = ("kernels/swiglu.py", "kernels/_checks.py", "kernels/_launch.py")
REFERENCE_SOURCES = ("kernels/reference_fusions.py",)

# (tokens T, intermediate size I): two decode batches, then 4k to 32k tokens at the MLP widths of common
# models (4096 to 28,672), and one odd shape (4097 x 11,007) whose element count is odd, so the last block of
# the flat launch is a masked tail.
SHAPES = (
    (1, 14336), (64, 14336),
    (4096, 4096), (4096, 11008), (4096, 14336), (4097, 11007), (8192, 14336), (2048, 28672),
    (16384, 4096), (16384, 11008), (16384, 14336), (32768, 8192),
)
CASES = tuple(Case(f"{t}x{i}", {"T": t, "I": i}, f"{t:,} token{'s' if t > 1 else ''}, intermediate size {i:,}")
              for t, i in SHAPES)
DTYPES = (torch.bfloat16, torch.float32)

# ‖out − ref‖ / ‖ref‖ against float64 (the largest over the outputs): one rounding to the storage dtype at
# the store, two where a peer rounds silu(a) before the product. A wrong sigmoid derivative or a swapped
# gate and up miss these bounds by orders of magnitude.
FORWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BACKWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

FORWARD_BYTE_MODEL = "forward: 3·T·I·size bytes (a and b read, c written)"
BACKWARD_BYTE_MODEL = "backward: 5·T·I·size bytes (dc, a and b read, da and db written)"


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def forward_bytes(case: Case, dtype: torch.dtype) -> int:
    """Read a and b, write c."""
    return 3 * case["T"] * case["I"] * element_size(dtype)


def backward_bytes(case: Case, dtype: torch.dtype) -> int:
    """Read dc, a and b, write da and db."""
    return 5 * case["T"] * case["I"] * element_size(dtype)


def forward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """a (gate) ~ N(0, 2²), wide enough to reach both tails of the sigmoid; b (up) ~ N(0, 1)."""
    t, i = case["T"], case["I"]
    a = 2.0 * torch.randn(t, i, generator=gen, dtype=torch.float32)
    b = torch.randn(t, i, generator=gen, dtype=torch.float32)
    return {"a": a.to(device=device, dtype=dtype), "b": b.to(device=device, dtype=dtype)}


def backward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """The forward inputs and an upstream gradient dc ~ N(0, 1)."""
    inputs = forward_inputs(case, dtype, device, gen)
    dc = torch.randn(case["T"], case["I"], generator=gen, dtype=torch.float32)
    inputs["dc"] = dc.to(device=device, dtype=dtype)
    return inputs


def forward_reference(a, b):
    return ref.swiglu_float64(a, b)


def backward_reference(a, b, dc):
    return ref.swiglu_backward_float64(a, b, dc)


def _plan(direction: str):
    def plan(case: Case, dtype: torch.dtype) -> dict:
        # The experiments' inputs are contiguous: one flat launch over T * I elements.
        return plan_swiglu(1, case["T"] * case["I"], direction).as_dict()

    return plan


def liger(a, b):
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


# ---- forward profiles ------------------------------------------------------------------------------------

TRITON = Profile("triton", "the lab's swiglu: one flat streaming pass, unmasked 16-byte accesses but at the tail",
                 swiglu, KERNEL_SOURCES, plan=_plan("forward"))
TORCH = Profile("torch", "F.silu(a) * b: eager PyTorch, two kernels", ref.swiglu_reference, REFERENCE_SOURCES)
TORCH_COMPILE = Profile("torch.compile", "F.silu(a) * b through torch.compile (one Inductor kernel)",
                        ref.compiled_swiglu, REFERENCE_SOURCES)
LIGER = Profile("liger", "Liger-Kernel's LigerSiLUMulFunction", liger, (), requires="liger_kernel")

FORWARD_PROFILES = (TRITON, TORCH, TORCH_COMPILE, LIGER)
PEERS = ("torch", "torch.compile", "liger")

# ---- backward profiles -----------------------------------------------------------------------------------

_LEAVES = ("a", "b")
_GRADS = ("dc",)

BWD_TRITON = Profile("triton", "the lab's swiglu backward: dc, a and b read once, da and db written once",
                     retained_backward(swiglu, _LEAVES, _GRADS), KERNEL_SOURCES, plan=_plan("backward"))
BWD_TORCH = Profile("torch", "eager autograd of F.silu(a) * b", retained_backward(ref.swiglu_reference, _LEAVES, _GRADS),
                    REFERENCE_SOURCES)
BWD_TORCH_COMPILE = Profile("torch.compile", "the backward AOTAutograd compiled for F.silu(a) * b",
                            retained_backward(ref.compiled_swiglu, _LEAVES, _GRADS), REFERENCE_SOURCES)
# Liger's backward writes da and db over the a and b it saved: it differentiates copies of the inputs.
BWD_LIGER = Profile("liger", "Liger-Kernel's LigerSiLUMulFunction backward (writes into its saved a and b)",
                    retained_backward(liger, _LEAVES, _GRADS, clone_leaves=True), (), requires="liger_kernel")

BACKWARD_PROFILES = (BWD_TRITON, BWD_TORCH, BWD_TORCH_COMPILE, BWD_LIGER)
DECISIONS = ("fused-add-rmsnorm-swiglu",)
