"""RMSNorm + linear as the fused-kernels seed post builds it: the lab's starting point, kept as a baseline.

    y = F.linear(F.rms_norm(x, (K,), gamma, eps), W)      x [M, K], W [N, K], gamma [K], y [M, N]

Each program owns one 64 x 128 tile of y and makes two passes over its 64 rows of x:

1. the RMS pass: sums x^2 over all K (64-wide steps) to get r = 1 / sqrt(mean(x^2) + eps) for its rows;
2. the product pass: reloads the same x tiles, normalises each in registers (x * r * gamma), casts it to
   the input dtype and feeds it to tl.dot with the W tile.

Every one of the N / 128 programs in a row of tiles repeats pass 1, so x is read (N / 128) * 2 times in all
(from L2 after the first), and pass 1 is pure latency: no tl.dot overlaps it. The tiles are fixed at
64 x 128 x 64 with Triton's default 4 warps and 3 stages, whatever the shape: at decode (M = 1) a 64-row tile
does 64 times the useful multiply work and N / 128 = 32 to 96 programs leave most of 132 SMs idle while W
streams. FLOPs and useful bytes are those of kernels/rmsnorm_linear.py (2*M*N*K; x, W, gamma read, y
written). Forward only: a timing baseline, its output carries no gradient. docs/posts/rmsnorm-linear.md
compares it with the lab's kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import interpreter_enabled
from kernels.rmsnorm_linear import check_rmsnorm_linear_inputs

# The seed's tiles and Triton's launch defaults, untuned.
SEED_TILES = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}


# --------------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_linear_seed_kernel(
    x_ptr, w_ptr, gamma_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    eps,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)

    # Pass 1: this tile's rows, all of K, for r (repeated by every program in the row of tiles).
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0).to(tl.float32)
        s += tl.sum(x * x, axis=1)
    r = tl.rsqrt(s / K + eps)

    # Pass 2: x again, normalised in registers, into tl.dot.
    c = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0).to(tl.float32)
        gamma = tl.load(gamma_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols64[None, :] * stride_wn + ks[:, None],
                    mask=(cols[None, :] < N) & (ks[:, None] < K), other=0.0)
        h = (x * r[:, None] * gamma[None, :]).to(w.dtype)
        if DOT_F32:  # the interpreter's tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584)
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        c = tl.dot(h, w, c)

    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(y_ptr + rows64[:, None] * stride_ym + cols[None, :], c.to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------
# Launcher and public function
# --------------------------------------------------------------------------------------------------------


def rmsnorm_linear_seed_fwd(
    x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """y [M, N] for 2-D x [M, K] and W [N, K] with unit stride along K, gamma [K] contiguous."""
    n_rows, n_features = x.shape
    n_cols = weight.shape[0]
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if out is None else out
    tiles = SEED_TILES
    grid = (triton.cdiv(n_rows, tiles["BLOCK_M"]), triton.cdiv(n_cols, tiles["BLOCK_N"]))
    _rmsnorm_linear_seed_kernel[grid](
        x, weight, gamma, y, n_rows, n_cols, n_features, x.stride(0), weight.stride(0), y.stride(0), eps,
        DOT_F32=interpreter_enabled() and x.dtype == torch.bfloat16, **tiles,
    )
    return y


def rmsnorm_linear_seed(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The seed-style fused RMSNorm + linear (forward only): same contract and checks as rmsnorm_linear.

    x: [..., K]; weight: [N, K]; gamma: [K]; all float16 or all bfloat16. Returns [..., N] in x's dtype.
    """
    check_rmsnorm_linear_inputs("rmsnorm_linear_seed", x, weight, gamma, eps)
    x_rows = x.reshape(-1, x.shape[-1])
    if x_rows.stride(-1) != 1:
        x_rows = x_rows.contiguous()
    w = weight if weight.stride(1) == 1 else weight.contiguous()
    n_cols = w.shape[0]
    if x_rows.shape[0] == 0 or n_cols == 0:
        return torch.empty(*x.shape[:-1], n_cols, dtype=x.dtype, device=x.device)
    y = rmsnorm_linear_seed_fwd(x_rows, w, gamma.contiguous(), float(eps))
    return y.view(*x.shape[:-1], n_cols)
