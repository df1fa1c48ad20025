"""Weight-only quantised linear layers at decode: int8 and int4 weights, dequantised in registers.

    int8:  y_mn = s_n * sum_k x_mk q_nk                       q [N, K] int8, s [N] (per output channel)
    int4:  y_mn = sum_g s_ng * sum_{k in g} x_mk (u_nk - 8)    u [N, K] in 0..15, s [N, K/G] (groups of G)

A decode step reads the weight once and nearly nothing else, so the kernel is a read of the integer
weights at the DRAM rate: that is the whole point of quantising them. Bytes, for x [M, K] and y [M, N] of
`size`-byte elements and scales of `s_size` bytes:

    int8: N*K + N*s_size + (M*K + M*N)*size                (4096 x 4096: 16.8 MB, half of bf16's)
    int4: N*K/2 + N*(K/G)*s_size + (M*K + M*N)*size        (4096 x 4096, G = 128: 8.7 MB)

Dequantising first and calling F.linear writes the dequantised weight (N*K*size) and reads it back: three
to five times the bytes of the fused read.

int4 layout (`quantize_int4`, `unpack_int4`): w_packed is uint8 [N, K/2]. Each group of G consecutive k of
a row occupies G/2 consecutive bytes; byte j of group g holds u at k = g*G + j in its low nibble and at
k = g*G + G/2 + j in its high nibble, with u = q + 8 for the signed value q in -8..7. So one group is one
load of G/2 bytes whose low nibbles pair with the first half of the group's x and high nibbles with the
second half, both contiguous. Scales are [N, K/G].

Forms and split-K as in kernels/_gemv.py (the plan table, fma_max_m, says which form runs; the plan is a
pure function of (bits, M, N, K, group, SM count)). Conversions avoid the slow integer-to-float instruction,
whose rate is a fraction of the FMA rate:
* int8, CUDA cores: q + 128 OR-ed into the mantissa of 2^23 is the float 2^23 + 128 + q exactly; one float
  subtraction leaves q. On the tensor cores that float's top half is q in bfloat16 (exact).
* int4, tensor cores (every M): a nibble OR-ed into the bits of 128.0 (bfloat16; 1024.0 for float16) is
  128 + u exactly, and subtracting 136 (1032) leaves q = u - 8 exactly. With one group a K-step the exact q
  go into the product and the group's scale multiplies the step's fp32 partial; with several groups a step
  each q is multiplied by its group's scale first (one rounding to x's dtype, as dequantising does).
Offline (probes/sass_decode.py) the int4 loop still spends about 4.2-4.7 instructions a weight, against the
about 5 an SM can issue per weight arriving at the copy rate: the int4 kernel is bound by its unpacking,
not by DRAM (notes/rmsnorm-linear.md, "The decode GEMVs on the graph clock").

On Hopper, int4 has a second kernel: kernels/int4_gluon.py (Gluon, the nibbles loaded straight into the
wgmma's register operand), run by int4_linear when the weight comes from prepack_int4 (int4_linear_impl names
the kernel; int4_gluon_refusal says where it cannot run). Measured in notes/dequant-linear.md.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype, interpreter_enabled
from kernels._gemv import DEFAULT_SM_COUNT, GemvPlan, choose_split_k, device_sm_count, split_k_sum, split_k_workspace
from kernels._launch import aligned, bind
from kernels.quantize import GROUP_SIZES, check_group_size, quantize_int4, quantize_int8, unpack_int4

__all__ = ["int8_linear", "int4_linear", "int4_linear_impl", "int4_gluon_refusal", "prepack_int4", "quantize_int8",
           "quantize_int4", "unpack_int4", "GROUP_SIZES"]

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _int8_as_float(q):
    # q (int8) -> fp32, exactly, without an integer-to-float conversion: 2^23 + 128 + q, minus 2^23 + 128.
    return (q.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _int8_linear_kernel(
    x_ptr, q_ptr, s_ptr, y_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_qn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr, EVEN_K: tl.constexpr, LOAD_STAGES: tl.constexpr, EVICT: tl.constexpr,
    DOT_F32: tl.constexpr, FAST_CVT: tl.constexpr,
):
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    split = pid % SPLIT_K
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_in = (cols % N).to(tl.int64)  # wrapped columns: unmasked loads, dropped at the store
    rows = tl.arange(0, BLOCK_M)
    row_in = rows < M
    offs_k = tl.arange(0, BLOCK_K)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    q_ptrs = q_ptr + cols_in[:, None] * stride_qn + offs_k[None, :]
    if USE_DOT:  # x^T [BLOCK_K, BLOCK_M], loaded straight into the second operand
        x_ptrs = x_ptr + rows.to(tl.int64)[None, :] * stride_xm + offs_k[:, None]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_K) if BLOCK_M == 1 else (BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=LOAD_STAGES):
        k_in = (k0 + offs_k) < K
        if EVEN_K:
            q = tl.load(q_ptrs + k0, eviction_policy=EVICT)
        else:
            q = tl.load(q_ptrs + k0, mask=k_in[None, :], other=0, eviction_policy=EVICT)
        if FAST_CVT:
            w = _int8_as_float(q)
        else:
            w = q.to(tl.float32)
        if USE_DOT:
            xt = tl.load(x_ptrs + k0, mask=row_in[None, :] & k_in[:, None], other=0.0)
            if FAST_CVT and x_ptr.dtype.element_ty == tl.bfloat16:  # q is exact in bf16: keep the top half
                wd = (w.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
            else:
                wd = w.to(x_ptr.dtype.element_ty)
            if DOT_F32:  # the interpreter's tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584)
                acc = tl.dot(wd.to(tl.float32), xt.to(tl.float32), acc)
            else:
                acc = tl.dot(wd, xt, acc)
        else:
            x = tl.load(x_ptrs + k0, mask=row_in[:, None] & k_in[None, :], other=0.0).to(tl.float32)
            if BLOCK_M == 1:
                acc += w * x
            else:
                acc += w[None, :, :] * x[:, None, :]

    if USE_DOT:
        c = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    elif BLOCK_M == 1:
        c = tl.sum(acc, axis=1)[None, :]
    else:
        c = tl.sum(acc, axis=2)
    is_last = True
    if SPLIT_K > 1:
        is_last, c, _ = split_k_sum(c, tl.zeros((BLOCK_M,), dtype=tl.float32), part_ptr, count_ptr, tile, split,
                                    SPLIT_K, BLOCK_M, BLOCK_N)
    if is_last:
        s = tl.load(s_ptr + cols_in).to(tl.float32)
        y = c * s[None, :]
        mask = row_in[:, None] & (cols < N)[None, :]
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int4_linear_kernel(
    x_ptr, p_ptr, s_ptr, y_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_pn, stride_sn, stride_ym,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, LOAD_STAGES: tl.constexpr, EVICT: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # One K-step is GS = BLOCK_K / GROUP whole groups: BLOCK_K / 2 contiguous bytes per row of W (a 16-byte
    # load holds 32 weights), GS scales per row, BLOCK_K values of k. The weights are dequantised in
    # registers, scale included, and meet x on the tensor cores (M padded to BLOCK_M >= 16).
    HALF: tl.constexpr = GROUP // 2
    GS: tl.constexpr = BLOCK_K // GROUP
    BYTES: tl.constexpr = BLOCK_K // 2
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    split = pid % SPLIT_K
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_in = (cols % N).to(tl.int64)  # wrapped columns: unmasked loads, dropped at the store
    rows = tl.arange(0, BLOCK_M)
    row_in = rows < M
    n_groups = K // GROUP
    n_steps = tl.cdiv(K, BLOCK_K)
    steps_per_split = tl.cdiv(n_steps, SPLIT_K)
    st_start = split * steps_per_split
    st_end = tl.minimum(n_steps, st_start + steps_per_split)
    offs_g = tl.arange(0, GS)
    offs_h = tl.arange(0, HALF)
    # The step's bytes as [BLOCK_N, GS, HALF]: byte h of group g sits at g*HALF + h.
    p_ptrs = p_ptr + cols_in[:, None, None] * stride_pn + (offs_g[:, None] * HALF + offs_h[None, :])[None, :, :]
    s_ptrs = s_ptr + cols_in[:, None] * stride_sn + offs_g[None, :]
    # x^T [BYTES, BLOCK_M] for the low nibbles: byte column j = g*HALF + h pairs with k = g*GROUP + h, and
    # the high nibbles with k + HALF (the packing of kernels/quantize.py).
    offs_b = tl.arange(0, BYTES)
    k_lo = (offs_b // HALF) * GROUP + offs_b % HALF
    x_ptrs = x_ptr + rows.to(tl.int64)[None, :] * stride_xm + k_lo[:, None]
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if dt == tl.bfloat16:  # 128 + u: a nibble in the mantissa of 128.0
        MAGIC_BITS: tl.constexpr = 0x4300
        MAGIC: tl.constexpr = 136.0  # 128 + 8: (128 + u) - 136 = q, exact
    else:  # float16: 1024 + u
        MAGIC_BITS: tl.constexpr = 0x6400
        MAGIC: tl.constexpr = 1032.0
    magic = tl.full((1, 1, 1), MAGIC, dtype=tl.float32).to(dt)
    if GS == 1:
        # One group a step: the weights stay exact small integers into the tensor cores, the group's scale
        # applies to the step's fp32 partial product, and the chain from the loaded bytes to the operand is
        # elementwise (the compiler may convert in the operand's own register layout).
        b_ptrs = p_ptr + cols_in[:, None] * stride_pn + offs_h[None, :]
        magic2 = tl.full((1, 1), MAGIC, dtype=tl.float32).to(dt)
        for st in tl.range(st_start, st_end, num_stages=LOAD_STAGES):
            k0 = st * BLOCK_K
            b = tl.load(b_ptrs + st * BYTES, eviction_policy=EVICT)
            s = tl.load(s_ptr + cols_in * stride_sn + st).to(tl.float32)
            x_lo = tl.load(x_ptrs + k0, mask=row_in[None, :], other=0.0)
            x_hi = tl.load(x_ptrs + (k0 + HALF), mask=row_in[None, :], other=0.0)
            q_lo = ((b & 0xF).to(tl.int16) | MAGIC_BITS).to(dt, bitcast=True)
            q_hi = ((b >> 4).to(tl.int16) | MAGIC_BITS).to(dt, bitcast=True)
            if DOT_F32:
                part = tl.dot(q_lo.to(tl.float32) - MAGIC, x_lo.to(tl.float32))
                part = tl.dot(q_hi.to(tl.float32) - MAGIC, x_hi.to(tl.float32), part)
            else:
                part = tl.dot(q_lo - magic2, x_lo)
                part = tl.dot(q_hi - magic2, x_hi, part)
            acc += part * s[:, None]
    else:
        for st in tl.range(st_start, st_end, num_stages=LOAD_STAGES):
            k0 = st * BLOCK_K
            if EVEN_K:
                b = tl.load(p_ptrs + st * BYTES, eviction_policy=EVICT)
                s = tl.load(s_ptrs + st * GS)
                x_lo = tl.load(x_ptrs + k0, mask=row_in[None, :], other=0.0)
                x_hi = tl.load(x_ptrs + (k0 + HALF), mask=row_in[None, :], other=0.0)
            else:  # the last step holds fewer than GS groups: masked bytes are u = 0 with scale 0
                g_in = (st * GS + offs_g) < n_groups
                b = tl.load(p_ptrs + st * BYTES, mask=g_in[None, :, None], other=0, eviction_policy=EVICT)
                s = tl.load(s_ptrs + st * GS, mask=g_in[None, :], other=0.0)
                x_in = row_in[None, :] & ((k0 + k_lo) < K)[:, None]
                x_lo = tl.load(x_ptrs + k0, mask=x_in, other=0.0)
                x_hi = tl.load(x_ptrs + (k0 + HALF), mask=x_in, other=0.0)
            # (MAGIC_BITS | u) as a 16-bit float is 128 + u (1024 + u) exactly; minus MAGIC leaves q exactly; one
            # rounding at the product with the group's scale, as dequantising to x's dtype does.
            v_lo = ((b & 0xF).to(tl.int16) | MAGIC_BITS).to(dt, bitcast=True)
            v_hi = ((b >> 4).to(tl.int16) | MAGIC_BITS).to(dt, bitcast=True)
            if DOT_F32:  # the interpreter computes on bfloat16 bit patterns (triton-lang/triton#11584): fp32 there
                s3 = s.to(dt).to(tl.float32)[:, :, None]
                w_lo = tl.reshape(((v_lo.to(tl.float32) - MAGIC) * s3).to(dt).to(tl.float32), (BLOCK_N, BYTES))
                w_hi = tl.reshape(((v_hi.to(tl.float32) - MAGIC) * s3).to(dt).to(tl.float32), (BLOCK_N, BYTES))
                acc = tl.dot(w_lo, x_lo.to(tl.float32), acc)
                acc = tl.dot(w_hi, x_hi.to(tl.float32), acc)
            else:
                s3 = s.to(dt)[:, :, None]
                w_lo = tl.reshape((v_lo - magic) * s3, (BLOCK_N, BYTES))
                w_hi = tl.reshape((v_hi - magic) * s3, (BLOCK_N, BYTES))
                acc = tl.dot(w_lo, x_lo, acc)
                acc = tl.dot(w_hi, x_hi, acc)

    c = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    is_last = True
    if SPLIT_K > 1:
        is_last, c, _ = split_k_sum(c, tl.zeros((BLOCK_M,), dtype=tl.float32), part_ptr, count_ptr, tile, split,
                                    SPLIT_K, BLOCK_M, BLOCK_N)
    if is_last:
        mask = row_in[:, None] & (cols < N)[None, :]
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], c.to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------
# Plan: a pure function of (bits, M, N, K)
# --------------------------------------------------------------------------------------------------------

# M <= fma_max_m(bits, N, K): CUDA cores (fp32); above: tensor cores, M padded to a power of two >= 16.
# int8's CUDA-core loop spends about 6 instructions a byte and an FMA per row: measured
# (checks/decode_probe.py, H100 and H200), four rows there beat the tensor-core tile at 4096 x 4096 and lose
# to it at 14336 x 4096. int4 carries two weights a byte, twice the conversions per byte read, and runs on
# the tensor cores at every M (its nibbles go straight into 16-bit operands there).
FMA_MAX_M = {8: 4, 4: 0}
FMA_MAX_M_WIDE = {8: 1, 4: 0}
WIDE_MIN_ELEMENTS = 4096 * 4096 + 1  # N*K from which a weight is "wide" (its own rows of the tables)
DOT_MAX_M = 64  # the largest batch one row-tile holds; larger M is refused (a GEMM's job)
# (BLOCK_N, BLOCK_K, num_warps, load stages) by (bits, form, M bucket); M bucket = the smallest key >= M.
# For int4 BLOCK_K is the K-values per step, a whole number of groups (at least one). WIDE_TILES replaces a
# row for wide weights. Each step of a program reads BLOCK_N * BLOCK_K (int8) or BLOCK_N * BLOCK_K / 2
# (int4) bytes of W; the rows are the best of the probe's sweep.
TILES = {
    (8, "fma", 1): (8, 512, 4, 6),
    (8, "fma", 4): (8, 256, 4, 8),
    (8, "dot", 64): (64, 128, 4, 5),
    (4, "dot", 64): (64, 512, 4, 3),
}
WIDE_TILES = {
    (4, "dot", 64): (64, 128, 4, 4),  # one group a step: the partial product scaled per group
}
# Split-K as for the bf16 GEMV: at least PROGRAMS_PER_SM[bits, form] programs an SM, no split under
# MIN_STEPS_PER_SPLIT K-steps. int8 on the tensor cores streams best near one program on every SM: measured
# (H100, graph clock, M = 16, K = 4096) 70.8% of the copy rate with no split at N = 14336 (224 tiles) against
# 58.7% split in two; at N = 4096 (64 tiles) split 2 43.8%, 4 42.5%, 8 35.1%. int4 is bound by its unpacking
# and moves within 1-2% whatever the split.
PROGRAMS_PER_SM = {(8, "fma"): 2, (8, "dot"): 0.5, (4, "dot"): 2}
MIN_STEPS_PER_SPLIT = 2
MAX_SPLIT_K = 16
EVICT_FIRST = False  # within 1% either way on the graph clock; see kernels/rmsnorm_gemv.py
FAST_CVT = True


def is_wide(n_cols: int, n_features: int) -> bool:
    return n_cols * n_features >= WIDE_MIN_ELEMENTS


def fma_max_m(bits: int, n_cols: int, n_features: int) -> int:
    """The largest M the CUDA-core form serves (0: none)."""
    return (FMA_MAX_M_WIDE if is_wide(n_cols, n_features) else FMA_MAX_M)[bits]


def _tile(bits: int, form: str, n_rows: int, wide: bool = False) -> tuple[int, int, int, int]:
    buckets = sorted(mb for (b, f, mb) in TILES if b == bits and f == form)
    key = (bits, form, next(mb for mb in buckets if mb >= n_rows))
    return WIDE_TILES.get(key, TILES[key]) if wide else TILES[key]


def plan_dequant_linear(bits: int, n_rows: int, n_cols: int, n_features: int, group_size: int = 128,
                        sm_count: int = DEFAULT_SM_COUNT) -> GemvPlan:
    """The launch plan for M = n_rows tokens through an N = n_cols by K = n_features weight of `bits` bits on
    a GPU of `sm_count` SMs: a pure function of its arguments (the tables above)."""
    if bits not in (4, 8):
        raise ValueError(f"dequant_linear: bits must be 4 or 8, got {bits!r}.")
    if not 1 <= n_rows <= DOT_MAX_M:
        raise ValueError(f"dequant_linear: serves 1 <= M <= {DOT_MAX_M} rows, got {n_rows}.")
    form = "fma" if n_rows <= fma_max_m(bits, n_cols, n_features) else "dot"
    block_n, block_k, warps, stages = _tile(bits, form, n_rows, is_wide(n_cols, n_features))
    block_m = max(1, triton.next_power_of_2(n_rows)) if form == "fma" else max(16, triton.next_power_of_2(n_rows))
    block_n = min(block_n, max(16 if form == "dot" else 1, triton.next_power_of_2(n_cols)))
    if bits == 4:  # whole groups, no more than K holds
        block_k = max(group_size, min(block_k, triton.next_power_of_2(n_features)))
    else:
        block_k = min(block_k, max(16, triton.next_power_of_2(n_features)))
    split = choose_split_k(triton.cdiv(n_cols, block_n), triton.cdiv(n_features, block_k),
                           min_programs=math.ceil(PROGRAMS_PER_SM[bits, form] * sm_count),
                           min_steps=MIN_STEPS_PER_SPLIT, max_split=MAX_SPLIT_K)
    return GemvPlan(form, block_m, block_n, block_k, split, warps, stages, True, EVICT_FIRST)


# --------------------------------------------------------------------------------------------------------
# Launchers (x 2-D with unit stride along K; weights with unit stride along K; scales contiguous)
# --------------------------------------------------------------------------------------------------------


def _workspace(plan: GemvPlan, n_cols: int, out: torch.Tensor):
    if plan.split_k > 1:
        return split_k_workspace(plan, n_cols, out.device)
    return out, out  # never touched without split-K


def _launch_spec(bits: int, x, weight, scales, plan: GemvPlan, out, group_size: int = 0, fast_cvt: bool = FAST_CVT):
    """(kernel, grid, arguments, constexprs and options) of one launch; the first six arguments are tensors."""
    n_rows, n_features = x.shape
    n_cols = weight.shape[0]
    part, counts = _workspace(plan, n_cols, out)
    meta = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, SPLIT_K=plan.split_k, USE_DOT=plan.form == "dot",
                LOAD_STAGES=plan.load_stages, EVICT="evict_first" if plan.evict_first else "",
                DOT_F32=interpreter_enabled(), num_warps=plan.num_warps, num_stages=1)
    if bits == 8:
        args = (x, weight, scales, out, part, counts, n_rows, n_cols, n_features, x.stride(0), weight.stride(0),
                out.stride(0))
        meta.update(BLOCK_K=plan.block_k, EVEN_K=n_features % plan.block_k == 0, FAST_CVT=fast_cvt)
        return _int8_linear_kernel, plan.grid(n_cols), args, meta
    args = (x, weight, scales, out, part, counts, n_rows, n_cols, n_features, x.stride(0), weight.stride(0),
            scales.stride(0), out.stride(0))
    if plan.form != "dot" or plan.block_k % group_size or plan.block_m < 16:
        raise ValueError(f"int4_linear: plans run on the tensor cores with whole groups a K-step (BLOCK_M >= 16, "
                         f"BLOCK_K a multiple of {group_size}), got {plan}.")
    meta.pop("USE_DOT")
    meta.update(GROUP=group_size, BLOCK_K=plan.block_k, EVEN_K=n_features % plan.block_k == 0)
    return _int4_linear_kernel, plan.grid(n_cols), args, meta


def int8_linear_fwd(x, w_q, scales, plan: GemvPlan, out: torch.Tensor, *, fast_cvt: bool = FAST_CVT) -> torch.Tensor:
    """out [M, N] = x [M, K] @ (w_q * scales[:, None])^T with `plan`."""
    kernel, grid, args, meta = _launch_spec(8, x, w_q, scales, plan, out, fast_cvt=fast_cvt)
    kernel[grid](*args, **meta)
    return out


def int4_linear_fwd(x, w_packed, scales, group_size: int, plan: GemvPlan, out: torch.Tensor) -> torch.Tensor:
    """out [M, N] = x [M, K] @ W^T for the packed int4 W with `plan`."""
    kernel, grid, args, meta = _launch_spec(4, x, w_packed, scales, plan, out, group_size)
    kernel[grid](*args, **meta)
    return out


# --------------------------------------------------------------------------------------------------------
# Public functions (forward only: the weights are constants, and x's gradient is not provided)
# --------------------------------------------------------------------------------------------------------


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_dequant_inputs(op: str, x, weight, scales, bits: int, group_size: int = 128) -> None:
    """Types, dtypes, shapes and devices, with messages that name what was given and what is accepted."""
    for name, t in (("x", x), ("weight", weight), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    check_dtype(op, "x", x, ACTIVATION_DTYPES)
    want = torch.int8 if bits == 8 else torch.uint8
    if weight.dtype != want:
        layout = "int8 [N, K]" if bits == 8 else "uint8 [N, K/2], two 4-bit values a byte (quantize_int4)"
        raise TypeError(f"{op}: weight has dtype {_name(weight.dtype)}; expected {layout}.")
    check_dtype(op, "scales", scales, SCALE_DTYPES)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x must have shape [..., K] with K > 0, got {tuple(x.shape)}.")
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{op}: forward only, but x requires grad; call it under torch.no_grad() or pass x.detach().")
    n_features = x.shape[-1]
    if bits == 8:
        if weight.dim() != 2 or weight.shape[1] != n_features:
            raise ValueError(f"{op}: weight must have shape [N, K] with K = {n_features} (the last dimension of x), "
                             f"got {tuple(weight.shape)}.")
        if scales.shape != (weight.shape[0],):
            raise ValueError(f"{op}: scales must have shape [N] = ({weight.shape[0]},), got {tuple(scales.shape)}.")
    else:
        check_group_size(op, group_size, n_features)
        if weight.dim() != 2 or 2 * weight.shape[1] != n_features:
            raise ValueError(f"{op}: weight must have shape [N, K/2] with K = {n_features} (the last dimension of x), "
                             f"got {tuple(weight.shape)}.")
        want_scales = (weight.shape[0], n_features // group_size)
        if tuple(scales.shape) != want_scales:
            raise ValueError(f"{op}: scales must have shape [N, K/group_size] = {want_scales}, got {tuple(scales.shape)}.")
    check_device(op, x, weight, scales)


class _Call:
    """A call's layout, worked out once per (shapes, strides, dtypes, devices, group size)."""

    __slots__ = ("n_rows", "n_cols", "out_shape", "x_is_rows", "w_ok", "s_ok", "cpu", "plan", "bits", "group_size",
                 "launchers")

    def __init__(self, x, weight, scales, bits: int, group_size: int):
        self.bits, self.group_size = bits, group_size
        self.launchers = {}  # bound launches (kernels/_launch.py) by the 16-byte alignment of x, weight, scales
        n_features = x.shape[-1]
        self.n_rows = math.prod(x.shape[:-1])
        self.n_cols = weight.shape[0]
        self.out_shape = (*x.shape[:-1], self.n_cols)
        self.x_is_rows = x.dim() == 2 and x.stride(1) == 1
        self.w_ok = weight.stride(1) == 1 or weight.shape[1] == 1
        self.s_ok = scales.is_contiguous()
        self.cpu = x.device.type == "cpu"
        self.plan = None
        if self.n_rows > DOT_MAX_M:
            raise ValueError(f"dequant_linear: serves up to M = {DOT_MAX_M} rows (decode and small batches), got "
                             f"{self.n_rows}; dequantise once and use F.linear for larger batches.")
        if self.n_rows and self.n_cols:
            self.plan = plan_dequant_linear(bits, self.n_rows, self.n_cols, n_features, group_size,
                                            device_sm_count(x.device))


_CALLS: dict[tuple, _Call] = {}
_MAX_CALLS = 4096


def _call(op: str, x, weight, scales, bits: int, group_size: int) -> _Call:
    try:
        key = (bits, group_size, x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(),
               weight.dtype, weight.device, scales.shape, scales.stride(), scales.dtype, scales.device)
        call = _CALLS.get(key)
    except (AttributeError, TypeError):
        key = call = None
    if call is None:
        check_dequant_inputs(op, x, weight, scales, bits, group_size)
        call = _Call(x, weight, scales, bits, group_size)
        if key is not None:
            if len(_CALLS) >= _MAX_CALLS:
                _CALLS.clear()
            _CALLS[key] = call
    else:
        if call.cpu:  # CPU tensors may run only under TRITON_INTERPRET, which may have changed
            check_device(op, x, weight, scales)
        if x.requires_grad and torch.is_grad_enabled():
            check_dequant_inputs(op, x, weight, scales, bits, group_size)
    return call


def _run(call: _Call, x, weight, scales) -> torch.Tensor:
    y = torch.empty((call.n_rows, call.n_cols), dtype=x.dtype, device=x.device)
    if call.plan is not None:
        x_rows = x if call.x_is_rows else x.reshape(call.n_rows, x.shape[-1]).contiguous()
        w = weight if call.w_ok else weight.contiguous()
        s = scales if call.s_ok else scales.contiguous()
        part, counts = _workspace(call.plan, call.n_cols, y)
        key = (aligned(x_rows), aligned(w), aligned(s))
        launch = call.launchers.get(key)
        if launch is None:  # bound once per layout: later calls pass their tensors and nothing else
            kernel, grid, args, meta = _launch_spec(call.bits, x_rows, w, s, call.plan, y, call.group_size)
            launch = call.launchers[key] = bind(kernel, grid, args, varying=6, **meta)
        launch(x_rows, w, s, y, part, counts)
    return y if len(call.out_shape) == 2 else y.view(call.out_shape)


def int8_linear(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x @ (w_q * scales[:, None])^T with the int8 weight dequantised in registers.

    x: [..., K] bfloat16 or float16 with at most 64 rows in all; w_q: int8 [N, K]; scales: [N], float32,
    bfloat16 or float16 (quantize_int8 makes both). Returns [..., N] in x's dtype, accumulated in fp32.
    """
    return _run(_call("int8_linear", x, w_q, scales, 8, 0), x, w_q, scales)


# --------------------------------------------------------------------------------------------------------
# int4 on Hopper: the Gluon kernel (kernels/int4_gluon.py) on a prepacked weight
# --------------------------------------------------------------------------------------------------------

INT4_IMPLS = ("triton", "gluon")


@functools.cache
def _gluon_module():
    """kernels/int4_gluon.py, or None where this Triton's triton.experimental.gluon lacks what it uses."""
    try:
        from kernels import int4_gluon
    except Exception:  # an older or newer Triton without Hopper's Gluon names
        return None
    return int4_gluon


@functools.cache
def _capability(device: torch.device) -> tuple[int, int] | None:
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def int4_gluon_refusal(device, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why the Gluon int4 kernel cannot serve x of `dtype` on `device` (None: it can): off Hopper, under the
    interpreter, another dtype, or a Triton without Gluon. Where it can, prepack_int4 is worth calling."""
    module = _gluon_module()
    if module is None:
        return "triton.experimental.gluon does not import in this Triton"
    return module.gluon_refusal(_capability(torch.device(device)), interpreter_enabled(), dtype)


def prepack_int4(w_packed: torch.Tensor, scales: torch.Tensor, group_size: int = 128):
    """quantize_int4's (w_packed uint8 [N, K/2], scales [N, K/G]) in the Gluon kernel's order: an Int4Prepacked
    (kernels/int4_gluon.py) that int4_linear takes in place of (w_packed, scales), running the Gluon kernel.
    Keep it instead of the plain pair, not beside it; `.unprepack()` gives the pair back exactly."""
    module = _gluon_module()
    if module is None:
        raise RuntimeError("prepack_int4: triton.experimental.gluon does not import in this Triton.")
    return module.prepack_int4(w_packed, scales, group_size)


def is_prepacked(weight) -> bool:
    module = _gluon_module()
    return module is not None and isinstance(weight, module.Int4Prepacked)


def int4_linear_impl(weight) -> str:
    """The kernel int4_linear runs for this weight: "gluon" for prepack_int4's weight, "triton" for the plain
    uint8 [N, K/2] one (what run records name as the int4 kernel)."""
    return "gluon" if is_prepacked(weight) else "triton"


def int4_linear(x: torch.Tensor, w_packed, scales: torch.Tensor | None = None,
                group_size: int | None = None) -> torch.Tensor:
    """x @ W^T for the int4 weight W = q * scale of q's group, dequantised in registers.

    x: [..., K] bfloat16 or float16 with at most 64 rows in all. w_packed, one of:
    * uint8 [N, K/2] in the layout of kernels/quantize.py, with scales [N, K/group_size] (float32, bfloat16 or
      float16) and group_size one of 32, 64, 128, 256 dividing K (128 if None; quantize_int4 makes both):
      the Triton kernel above, on any CUDA GPU and in the interpreter;
    * prepack_int4's Int4Prepacked (scales None, group_size None or its own): the Gluon kernel of
      kernels/int4_gluon.py, on Hopper GPUs only (int4_gluon_refusal says why not elsewhere), 64 rows a launch.
    Returns [..., N] in x's dtype. int4_linear_impl(w_packed) names the kernel that runs.
    """
    if is_prepacked(w_packed):
        refusal = int4_gluon_refusal(x.device, x.dtype) if isinstance(x, torch.Tensor) else None
        return _gluon_module().int4_linear_prepacked(x, w_packed, scales, group_size, refusal, DOT_MAX_M)
    group_size = 128 if group_size is None else group_size
    if scales is None and isinstance(w_packed, torch.Tensor):
        raise TypeError("int4_linear: scales [N, K/group_size] are required with a uint8 [N, K/2] weight (only "
                        "prepack_int4's weight carries its own).")
    return _run(_call("int4_linear", x, w_packed, scales, 4, group_size), x, w_packed, scales)
