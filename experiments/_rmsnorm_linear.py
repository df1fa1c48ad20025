"""Profiles, inputs, byte and FLOP models shared by the RMSNorm + linear experiments (not an experiment itself).

One verdict per shape class, so two declarations share this module: rmsnorm-linear-decode (M <= 16, a
matrix-vector product bound by reading W, the lab's GEMV) and rmsnorm-linear-prefill (M >= 1024, a
compute-bound GEMM, the lab's tiled kernel).
"""

from __future__ import annotations

import functools

import torch

from experiments.spec import Case, Profile
from kernels import reference
from kernels.rmsnorm_linear import resolve_plan, rmsnorm_linear
from kernels.rmsnorm_linear_seed import SEED_TILES, rmsnorm_linear_seed

K = 4096
N_VALUES = (4096, 12288)
PREFILL_M = (1024, 4096, 8192)
# Decode: 1 to 16 tokens (powers of two) through the projections of a 4096-wide model (Q/K/V fused 12288,
# the MLP's 14336), one 8192-deep input, and an odd N that no tile divides (the last tile of W is ragged).
DECODE_M = (1, 2, 4, 8, 16)
DECODE_NK = ((4096, 4096), (12288, 4096), (14336, 4096), (4096, 8192))
DECODE_ODD_NK = ((11007, 4096),)
EPS = 1e-6

FUSED_SOURCES = ("kernels/rmsnorm_linear.py", "kernels/rmsnorm_gemv.py", "kernels/_rmsnorm_linear_tiled.py",
                 "kernels/_gemv.py", "kernels/_checks.py")
SEED_SOURCES = ("kernels/rmsnorm_linear_seed.py", "kernels/rmsnorm_linear.py", "kernels/_checks.py")
REFERENCE_SOURCES = ("kernels/reference.py",)

# ‖out − ref‖ / ‖ref‖ accepted against float64. The normalised activations and the output are each rounded
# once to the storage dtype (unit roundoff: bf16 2^-8 ≈ 3.9e-3, fp16 2^-11 ≈ 4.9e-4); over a K = 4096 sum of
# terms with random signs the two roundings give about half a unit norm-wise, the size of torch's own error.
# The bounds leave 4-5x room; a dropped gamma (≈ 0.1 with these inputs), one missing K-tile (≈ 1/sqrt(64)
# at 64-wide tiles) or a wrong r miss them by an order of magnitude.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}

BYTE_MODEL = (
    "(M·K + N·K + K + M·N)·size bytes: x, W and γ read once, y written once "
    "(the unfused pair also writes and reads the M·K normalised activations)"
)


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def case(m: int, n: int, k: int = K) -> Case:
    return Case(f"m{m}-n{n}-k{k}", {"M": m, "N": n, "K": k}, f"{m} token{'s' if m > 1 else ''} through a {k} → {n} projection")


def cases(m_values: tuple[int, ...]) -> tuple[Case, ...]:
    """Every M of `m_values` against N_VALUES at K = 4096 (the prefill grid)."""
    return tuple(case(m, n) for m in m_values for n in N_VALUES)


def decode_cases() -> tuple[Case, ...]:
    return tuple(case(m, n, k) for n, k in DECODE_NK + DECODE_ODD_NK for m in DECODE_M)


def bytes_moved(case: Case, dtype: torch.dtype) -> int:
    """x, W and gamma read once, y written once."""
    m, n, k = case["M"], case["N"], case["K"]
    return (m * k + n * k + k + m * n) * element_size(dtype)


def flops(case: Case, dtype: torch.dtype) -> int:
    """The product's multiply-adds, 2·M·N·K; the norm's O(M·K) is left out."""
    return 2 * case["M"] * case["N"] * case["K"]


def make_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """x ~ N(0, 1); W ~ N(0, 1/K), the usual initialisation scale; gamma ~ 1 + N(0, 0.1²), far enough from
    ones that forgetting it fails the accuracy check."""
    m, n, k = case["M"], case["N"], case["K"]
    x = torch.randn(m, k, generator=gen, dtype=torch.float32)
    weight = torch.randn(n, k, generator=gen, dtype=torch.float32) / k**0.5
    gamma = 1.0 + 0.1 * torch.randn(k, generator=gen, dtype=torch.float32)
    return {name: t.to(device=device, dtype=dtype) for name, t in (("x", x), ("weight", weight), ("gamma", gamma))}


def float64_reference(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return reference.rmsnorm_linear_float64(x, weight, gamma, EPS)


def torch_unfused(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return reference.rmsnorm_linear_reference(x, weight, gamma, EPS)


@functools.cache
def _compiled_pair():
    return torch.compile(reference.rmsnorm_linear_reference, dynamic=False)


def compiled_unfused(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """The unfused pair through torch.compile (compiled once per process, specialised per shape)."""
    return _compiled_pair()(x, weight, gamma, EPS)


def triton_fused(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return rmsnorm_linear(x, weight, gamma, EPS)


def triton_seed_style(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return rmsnorm_linear_seed(x, weight, gamma, EPS)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def fused_plan(case: Case, dtype: torch.dtype) -> dict:
    """The plan rmsnorm_linear runs for this case; on a GPU it includes the tile config autotuning chose."""
    return resolve_plan(case["M"], case["N"], case["K"], dtype, _device()).as_dict()


def seed_plan(case: Case, dtype: torch.dtype) -> dict:
    grid = (-(-case["M"] // SEED_TILES["BLOCK_M"]), -(-case["N"] // SEED_TILES["BLOCK_N"]))
    return {"tiles": dict(SEED_TILES), "grid": list(grid), "rms": "recomputed per output tile"}


TORCH_UNFUSED = Profile(
    "torch-unfused", "F.rms_norm, then F.linear: two PyTorch kernels, cuBLAS for the product",
    torch_unfused, REFERENCE_SOURCES,
)
TORCH_COMPILE = Profile(
    "torch.compile", "the same pair through torch.compile (Inductor's norm kernel, then its GEMM)",
    compiled_unfused, REFERENCE_SOURCES,
)
TRITON_SEED_STYLE = Profile(
    "triton-seed-style",
    "the fusion as tutorials write it (the lab's starting point): RMS recomputed in every output tile, normalised tile into tl.dot, "
    "64x128x64 tiles, untuned",
    triton_seed_style, SEED_SOURCES, plan=seed_plan,
)
TRITON_FUSED = Profile(
    "triton-fused",
    "the lab's kernel: gamma folded into the x tile, sum of squares beside the product, r in the epilogue; "
    "up to 16 tokens a weight-streaming GEMV (CUDA cores for one and two tokens, tensor cores from three; a fixed "
    "plan that splits K only where the tiles alone would leave most SMs idle); "
    "larger M tiled GEMMs autotuned per shape class",
    triton_fused, FUSED_SOURCES, plan=fused_plan,
)

PROFILES = (TORCH_UNFUSED, TORCH_COMPILE, TRITON_SEED_STYLE, TRITON_FUSED)
BASELINES = ("torch-unfused", "torch.compile")
DECISIONS = ("rmsnorm-linear-fusion",)
