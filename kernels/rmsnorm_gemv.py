"""RMSNorm + linear at decode (M <= 16 tokens): a weight-streaming matrix-vector kernel.

    r_m  = 1 / sqrt(s_m / K + eps),   s_m = sum_k x_mk^2
    y_mn = r_m * c_mn,                c_mn = sum_k (x_mk * gamma_k) * W_nk

At decode the product reads W [N, K] once and nearly nothing else: N*K*size bytes (bf16, K = 4096: 33.5 MB
at N = 4096, 117 MB at N = 14336), against M*K*size for x and M*N*size for y. So the kernel is a read of W
at the DRAM rate, and the norm must add no pass of its own. It adds none: r does not depend on k, so it
leaves the sum and scales c once, at the end; gamma is folded into x's tile as it is loaded (a = x * gamma);
and s accumulates from the same x tiles. x is tiny (M*K*size: 8 KB at M = 1) and stays in L2 while the
N / BLOCK_N programs each reload it, so the bytes that matter are W's, read once:

    bytes = (N*K + M*K + K + M*N) * size        (+ split-K partials through L2, see kernels/_gemv.py)

Each program owns BLOCK_N rows of W and, with split-K, a run of K (kernels/_gemv.py: the forms, the
fix-up). In the "fma" form (M <= 2) the math is fp32 throughout. In the "dot" form the tile fed to the
tensor cores is x * gamma rounded to the input dtype, as the tiled kernel does; for float16 that product can
pass 65504 where F.rms_norm's output would not, so float16 "dot" plans take r from a row pre-pass first and
feed x * r * gamma (one more read of x: M*K*size bytes).

The plan is a pure function of (M, N, K, dtype, SM count): the tables below, each threshold tested on both sides.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._checks import interpreter_enabled
from kernels._gemv import DEFAULT_SM_COUNT, GemvPlan, choose_split_k, split_k_sum, split_k_workspace
from kernels._launch import bind

# --------------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_gemv_kernel(
    x_ptr, w_ptr, gamma_ptr, y_ptr, r_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr, SWAP: tl.constexpr, RMS_IN_LOOP: tl.constexpr, STORE_R: tl.constexpr,
    EVEN_K: tl.constexpr, LOAD_STAGES: tl.constexpr, EVICT: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    split = pid % SPLIT_K
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_in = (cols % N).to(tl.int64)  # columns past N wrap onto rows of W: unmasked loads, dropped at the store
    rows = tl.arange(0, BLOCK_M)
    row_in = rows < M
    offs_k = tl.arange(0, BLOCK_K)
    # This program's run of K: whole K-tiles, so EVEN_K still means no masks.
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    w_ptrs = w_ptr + cols_in[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]

    if USE_DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    # Squares are kept per lane and summed across K once, after the loop (no reduction inside it).
    s2 = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    if not RMS_IN_LOOP:
        r = tl.load(r_ptr + rows, mask=row_in, other=0.0)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=LOAD_STAGES):
        ks = k0 + offs_k
        if EVEN_K:
            w = tl.load(w_ptrs + k0, eviction_policy=EVICT)
            x = tl.load(x_ptrs + k0, mask=row_in[:, None], other=0.0).to(tl.float32)
            gamma = tl.load(gamma_ptr + ks).to(tl.float32)
        else:
            k_in = ks < K
            w = tl.load(w_ptrs + k0, mask=k_in[None, :], other=0.0, eviction_policy=EVICT)
            x = tl.load(x_ptrs + k0, mask=row_in[:, None] & k_in[None, :], other=0.0).to(tl.float32)
            gamma = tl.load(gamma_ptr + ks, mask=k_in, other=0.0).to(tl.float32)
        if RMS_IN_LOOP:
            s2 += x * x
            a = x * gamma[None, :]
        else:
            a = x * r[:, None] * gamma[None, :]
        if USE_DOT:
            a = a.to(w.dtype)
            if DOT_F32:  # the interpreter's tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584)
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            if SWAP:
                acc = tl.dot(w, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(w), acc)
        elif BLOCK_M == 1:
            acc += w.to(tl.float32) * a
        else:
            acc += w.to(tl.float32)[None, :, :] * a[:, None, :]

    if USE_DOT:
        c = tl.trans(acc) if SWAP else acc
    elif BLOCK_M == 1:
        c = tl.sum(acc, axis=1)[None, :]
    else:
        c = tl.sum(acc, axis=2)
    s = tl.sum(s2, axis=1)

    is_last = True
    if SPLIT_K > 1:
        is_last, c, s = split_k_sum(c, s, part_ptr, count_ptr, tile, split, SPLIT_K, BLOCK_M, BLOCK_N)
    if is_last:
        if RMS_IN_LOOP:
            r = tl.rsqrt(s / K + eps)
            c = c * r[:, None]
            if STORE_R:
                if tile == 0:  # one program keeps r for the backward pass
                    tl.store(r_ptr + rows, r, mask=row_in)
        mask = row_in[:, None] & (cols < N)[None, :]
        y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
        tl.store(y_ptrs, c.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_inv_kernel(x_ptr, r_ptr, K, stride_xm, eps, BLOCK_K: tl.constexpr):
    # r_m = 1 / sqrt(s_m / K + eps) for one row: reads the row once (K*size bytes), writes 4 bytes.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    s = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs
        x = tl.load(x_ptr + row * stride_xm + ks, mask=ks < K, other=0.0).to(tl.float32)
        s += x * x
    r = tl.rsqrt(tl.sum(s, axis=0) / K + eps)
    tl.store(r_ptr + row, r)


# --------------------------------------------------------------------------------------------------------
# Plan: a pure function of (M, N, K, dtype)
# --------------------------------------------------------------------------------------------------------

GEMV_MAX_M = 16  # the GEMV serves M <= this; larger M runs the tiled kernels (kernels/_rmsnorm_linear_tiled.py)
# M <= FMA_MAX_M runs the CUDA-core form; above it, the tensor cores with M padded to 16. At M rows the
# CUDA-core form spends M FMAs (and a conversion) per weight: a Hopper SM streams about 8 bf16 weights a
# cycle at the copy rate and retires 128 FMAs. Measured (checks/decode_probe.py, H100, graph clock, K = 4096
# and 8192, N = 4096 to 14336): two rows on the CUDA cores are within 1% of the tensor-core tile either way
# (73.1% against 74.4% of the copy rate at 4096 x 4096, 91.9% against 90.8% at 14336 x 4096); four rows
# lose to it everywhere (64.5% against 74.4% at 4096 x 4096, 81.3% against 90.8% at 14336 x 4096).
FMA_MAX_M = 2

# CUDA-core tiles per M bucket (the smallest key >= M): (BLOCK_N, BLOCK_K, num_warps, load stages). A thread
# loads 8 contiguous elements of W a row (one 16-byte load) and keeps BLOCK_M * BLOCK_N * BLOCK_K /
# (32 * warps) fp32 partial sums.
FMA_TILE = {1: (8, 1024, 4, 3), 2: (8, 512, 4, 4)}
# Tensor-core tiles by BLOCK_N: (BLOCK_N, BLOCK_K, num_warps, load stages). One K-step reads BLOCK_N x 256
# elements of W (32 or 64 KB of bf16); the stages keep 128 or 192 KB of W in flight per program, one program
# an SM. 16 rows of a are the small operand of the warpgroup MMA (W first, see DOT_SWAP).
DOT_TILES = {64: (64, 256, 4, 4), 128: (128, 256, 4, 3)}
DOT_SWAP = True
# The 128-row tile when it alone gives at least DOT_WIDE_MIN_TILES_PER_SM tiles an SM, else the 64-row one.
# Measured (H100, graph clock, M = 16, split 1): 128-row tiles 90.8% / 87.2% of the copy rate at N = 14336 /
# 11007 (112 / 86 tiles) against 89.8% / 80.9% for 64-row ones; at N = 4096 (32 tiles of 128) 54.7% against
# 74.4% for 64 tiles of 64.
DOT_WIDE_MIN_TILES_PER_SM = 0.5


# Split-K, CUDA-core form: PROGRAMS_PER_SM programs an SM at least (so every SM streams), no split shorter
# than MIN_STEPS_PER_SPLIT K-steps, at most MAX_SPLIT_K.
PROGRAMS_PER_SM = 2
MIN_PROGRAMS = PROGRAMS_PER_SM * DEFAULT_SM_COUNT
MIN_STEPS_PER_SPLIT = 4
MAX_SPLIT_K = 8
# Split-K, tensor-core form: a program keeps so much of W in flight that one an SM on half the SMs already
# streams near the copy rate, and splitting K costs more than it buys (partials, a shorter pipeline): at
# 4096 x 4096, 64 programs of 16 K-steps reach 74.4% and 128 of 8 steps 64.5%; at 14336 x 4096, 112 programs
# 90.8% and 224 programs 80.3%. Only tiles that leave three quarters of the SMs idle (fewer than
# DOT_SPLIT_BELOW_TILES_PER_SM an SM) split, to at least DOT_MIN_PROGRAMS_PER_SM programs an SM: N = 2048,
# 32 tiles: split 4 49.8%, 2 45.4%, 1 40.3%; N = 1024, 16 tiles: split 8 31.9%, 4 30.5%, 1 21.2%.
DOT_SPLIT_BELOW_TILES_PER_SM = 0.25
DOT_MIN_PROGRAMS_PER_SM = 0.5
DOT_MIN_STEPS_PER_SPLIT = 1

# Loads of W marked evict-first (see GemvPlan.evict_first): within 1% either way in the probe's sweep on the
# graph clock (H100, H200), so off: on the lab's clock, which leaves L2 full of dirty lines before each call,
# it would buy an advantage a real decode step does not have (notes/rmsnorm-linear.md).
EVICT_FIRST = False

_RMS_PREPASS_MAX_BLOCK_K = 1024


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(max(1, n)))


def dot_split_k(n_tiles: int, k_steps: int, sm_count: int) -> int:
    """Split-K of the tensor-core form (see DOT_SPLIT_BELOW_TILES_PER_SM)."""
    if n_tiles >= DOT_SPLIT_BELOW_TILES_PER_SM * sm_count:
        return 1
    return choose_split_k(n_tiles, k_steps, min_programs=math.ceil(DOT_MIN_PROGRAMS_PER_SM * sm_count),
                          min_steps=DOT_MIN_STEPS_PER_SPLIT, max_split=MAX_SPLIT_K)


def plan_rmsnorm_gemv(n_rows: int, n_cols: int, n_features: int, dtype: torch.dtype,
                      sm_count: int = DEFAULT_SM_COUNT) -> GemvPlan:
    """The GEMV plan for M = n_rows <= GEMV_MAX_M tokens through an N = n_cols by K = n_features weight on a
    GPU of `sm_count` SMs: a pure function of its arguments (the tables above).

    Tiles shrink to the problem (a K-tile no wider than K's power of two) so small shapes run the same
    code as large ones."""
    if not 1 <= n_rows <= GEMV_MAX_M:
        raise ValueError(f"rmsnorm_linear: the GEMV serves 1 <= M <= {GEMV_MAX_M} rows, got {n_rows}.")
    if n_rows <= FMA_MAX_M:
        block_m = _pow2_at_least(n_rows, 1)
        block_n, block_k, warps, stages = FMA_TILE[block_m]
        block_n = min(block_n, _pow2_at_least(n_cols, 1))
        block_k = min(block_k, _pow2_at_least(n_features, 16))
        split = choose_split_k(triton.cdiv(n_cols, block_n), triton.cdiv(n_features, block_k),
                               min_programs=PROGRAMS_PER_SM * sm_count, min_steps=MIN_STEPS_PER_SPLIT,
                               max_split=MAX_SPLIT_K)
        return GemvPlan("fma", block_m, block_n, block_k, split, warps, stages, False, EVICT_FIRST)
    wide = triton.cdiv(n_cols, 128) >= DOT_WIDE_MIN_TILES_PER_SM * sm_count
    block_n, block_k, warps, stages = DOT_TILES[128 if wide else 64]
    block_n = min(block_n, _pow2_at_least(n_cols, 16))
    block_k = min(block_k, _pow2_at_least(n_features, 16))
    split = dot_split_k(triton.cdiv(n_cols, block_n), triton.cdiv(n_features, block_k), sm_count)
    return GemvPlan("dot", 16, block_n, block_k, split, warps, stages, DOT_SWAP, EVICT_FIRST)


def rms_mode(plan: GemvPlan, dtype: torch.dtype) -> str:
    """"in-loop" (s beside the product, r in the epilogue) or "pre-pass" (float16 on the tensor cores)."""
    return "pre-pass" if plan.form == "dot" and dtype == torch.float16 else "in-loop"


# --------------------------------------------------------------------------------------------------------
# Launchers (x 2-D with unit stride along K, W with unit stride along K, gamma contiguous)
# --------------------------------------------------------------------------------------------------------


def rms_inv(x: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """r = 1 / sqrt(mean(x^2, -1) + eps) in float32, one value per row of a 2-D x (the float16 pre-pass)."""
    n_rows, n_features = x.shape
    r = torch.empty(n_rows, dtype=torch.float32, device=x.device) if out is None else out
    block_k = min(_RMS_PREPASS_MAX_BLOCK_K, max(16, triton.next_power_of_2(n_features)))
    _rms_inv_kernel[(n_rows,)](x, r, n_features, x.stride(0), eps, BLOCK_K=block_k, num_warps=4)
    return r


def _meta(plan: GemvPlan, dtype: torch.dtype, n_features: int, in_loop: bool, store_r: bool) -> dict:
    """The constexprs and launch options of one plan."""
    return dict(
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, SPLIT_K=plan.split_k,
        USE_DOT=plan.form == "dot", SWAP=plan.swap, RMS_IN_LOOP=in_loop, STORE_R=store_r,
        EVEN_K=n_features % plan.block_k == 0, LOAD_STAGES=plan.load_stages,
        EVICT="evict_first" if plan.evict_first else "", DOT_F32=interpreter_enabled() and dtype == torch.bfloat16,
        num_warps=plan.num_warps, num_stages=1,
    )


def _args(x, weight, gamma, eps, plan, out, r_out, n_cols):
    """The kernel's arguments; unused pointers (no split-K, no r kept) are given `out`, never touched."""
    part, counts = split_k_workspace(plan, n_cols, x.device) if plan.split_k > 1 else (out, out)
    n_rows, n_features = x.shape
    return (x, weight, gamma, out, out if r_out is None else r_out, part, counts,
            n_rows, n_cols, n_features, x.stride(0), weight.stride(0), out.stride(0), eps)


def rmsnorm_gemv_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    plan: GemvPlan,
    out: torch.Tensor,
    r_out: torch.Tensor | None = None,
    rms: str | None = None,
) -> torch.Tensor:
    """y = rmsnorm(x) @ W^T into `out` [M, N] (rows may be strided) for x [M, K], W [N, K], gamma [K];
    r [M] float32 into `r_out` when given (the backward pass needs it), else not stored. `rms` overrides
    rms_mode (tests force the hazard the float16 pre-pass avoids)."""
    n_cols = weight.shape[0]
    in_loop = (rms or rms_mode(plan, x.dtype)) == "in-loop"
    if not in_loop:
        r_out = rms_inv(x, eps, out=r_out)
    args = _args(x, weight, gamma, eps, plan, out, r_out, n_cols)
    _rmsnorm_gemv_kernel[plan.grid(n_cols)](*args, **_meta(plan, x.dtype, x.shape[1], in_loop, r_out is not None))
    return out


class BoundGemv:
    """rmsnorm_gemv_fwd for one layout (shapes, strides, dtypes, pointer alignment, eps, whether r is kept),
    bound once through kernels/_launch.py: a call passes only its tensors. float16 on the tensor cores
    (the r pre-pass) takes the ordinary launch."""

    def __init__(self, x, weight, gamma, eps: float, plan: GemvPlan, out, r_out):
        self.plan, self.eps, self.n_cols = plan, eps, weight.shape[0]
        self.prepass = rms_mode(plan, x.dtype) != "in-loop"
        self.launch = None
        if not self.prepass:
            args = _args(x, weight, gamma, eps, plan, out, r_out, self.n_cols)
            meta = _meta(plan, x.dtype, x.shape[1], True, r_out is not None)
            self.launch = bind(_rmsnorm_gemv_kernel, plan.grid(self.n_cols), args, varying=7, **meta)

    def __call__(self, x, weight, gamma, out, r_out) -> None:
        if self.launch is None:
            rmsnorm_gemv_fwd(x, weight, gamma, self.eps, self.plan, out, r_out)
            return
        if self.plan.split_k > 1:
            part, counts = split_k_workspace(self.plan, self.n_cols, x.device)
        else:
            part = counts = out
        self.launch(x, weight, gamma, out, out if r_out is None else r_out, part, counts)
