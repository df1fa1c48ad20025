"""RMSNorm fused into the linear projection that follows it, forward in Triton, backward through torch.

    r_m    = 1 / sqrt(mean_k x_mk^2 + eps)                  one number per row
    y_mn   = sum_k (x_mk * r_m * gamma_k) * W_nk            = F.linear(F.rms_norm(x, (K,), gamma, eps), W)
           = r_m * c_mn,   c_mn = sum_k (x_mk * gamma_k) * W_nk

r_m does not depend on k, so it leaves the sum: the product is a plain GEMM of a = x * gamma (gamma folded
into the x tile as it is loaded) against W^T, and r scales the fp32 accumulator c in the epilogue. The
row's sum of squares s_m = sum_k x_mk^2 accumulates in the same K-loop from the x tiles already loaded for
tl.dot, so x is read once and nothing normalised is written.

FLOPs: 2*M*N*K for the product (on the tensor cores for M > 1). s and the gamma fold add 3*M*K on the CUDA
cores in each of the N / BLOCK_N columns of output tiles: 3 / (2*BLOCK_N) of the product's count.
Bytes, for x [M, K], W [N, K], gamma [K] and y [M, N] of `size`-byte elements:

* fused (this kernel): x, W and gamma read once, y written once, r (M fp32) written:
  (M*K + N*K + K + M*N)*size + 4*M. Tiles re-read x once per column of output tiles and W once per row of
  them; those re-reads come mostly from L2 and are what the tile sizes trade against. Split-K adds a
  BLOCK_M x BLOCK_N fp32 partial per split, written and read back through L2.
* unfused (F.rms_norm, then F.linear): the normalised activations h = x * r * gamma are written and read
  back: 2*M*K*size more, and a second launch.

At decode (M <= 64) the op is a matrix-vector product bound by reading W (N*K*size: 100 MB at N = 12288,
K = 4096 in bf16); at prefill (M >= 1024) it is a compute-bound GEMM where the saved round trip of h is
worth 2*(F/B)/N of the math time (F/B: tensor-core FLOP/s over copy bytes/s, a few hundred on an H100).
The write-up docs/posts/rmsnorm-linear.md works through both floors.

Where r is computed (`RmsNormLinearPlan.rms`):

* "in-loop" (bfloat16, and every dtype at M = 1): s accumulates beside the product; r scales c at the end.
* "pre-pass" (float16, M > 1): a row kernel computes r first (one more read of x: M*K*size bytes) and the
  tile fed to tl.dot is x * r * gamma, as in F.rms_norm. float16 tops out at 65504, so folding gamma alone
  would overflow on large activations that the normalised product keeps in range; bfloat16 has float32's
  range, and the M = 1 kernel multiplies in float32.

Schedules, by shape class (`shape_class`; the config lists and what they were measured against sit beside
them below, the tuning notes in notes/rmsnorm-linear.md):

* vector (M = 1): a matrix-vector product on the CUDA cores, BLOCK_N rows of W per program, fp32
  partial sums kept per lane and reduced once; no tensor-core padding of one row to sixteen, no operand
  staging through shared memory.
* decode (M <= 64), middle, prefill (M >= 1024): tl.dot tiles. The x and gamma tiles are loaded one K-step
  ahead (W is pipelined by the compiler; x, scaled in registers first, is not). Decode and middle configs may
  split K across programs (SPLIT_K: the last program of a tile sums the partials, with no waiting) and may
  make W the first operand of the product (SWAP_AB: c^T = W a^T, so a wide W tile drives the warpgroup MMA).

Configs are autotuned on CUDA per shape class, keyed on (M bucket, N, K); the config that ran comes back in
the launch plan, and later launches of the same key go straight to the kernel. Under TRITON_INTERPRET one
small fixed config runs per schedule (with SPLIT_K = 2, so CPU tests cover the split-K fix-up).

Backward calls torch (see RmsNormLinearFunction.backward): its two GEMMs are cuBLAS's to win.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype, interpreter_enabled

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


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


@triton.jit
def _rmsnorm_linear_fwd_kernel(
    x_ptr, w_ptr, gamma_ptr, y_ptr, r_ptr, part_c_ptr, part_s_ptr, count_ptr,
    M, N, K, M_BUCKET,
    stride_xm, stride_wn, stride_ym,
    eps,
    RMS_IN_LOOP: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr,
):
    # SPLIT_K programs share one BLOCK_M x BLOCK_N tile of y, each summing over its own run of K-tiles.
    # M_BUCKET is only the autotuning key.
    # Grouped order: GROUP_M row-tiles walk the columns together, so a W tile is reused from L2 by them.
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    split = pid % SPLIT_K
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile // pids_per_group) * GROUP_M
    group_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile % pids_per_group) % group_m
    pid_n = (tile % pids_per_group) // group_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows and columns past the edge wrap onto valid ones: loads need no mask there, the store drops them.
    rows_in = (rows % M).to(tl.int64)
    cols_in = (cols % N).to(tl.int64)
    # This program's K range: whole K-tiles, so EVEN_K (K a multiple of BLOCK_K) still means unmasked loads.
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_per_split
    k_end = min(K, k_start + k_per_split)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows_in[:, None] * stride_xm + offs_k[None, :]
    if SWAP_AB:  # W as the first operand: c^T = W a^T, a [BLOCK_N, BLOCK_K] tile of W
        w_ptrs = w_ptr + cols_in[:, None] * stride_wn + offs_k[None, :]
        c_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:  # a [BLOCK_K, BLOCK_N] tile of W^T
        w_ptrs = w_ptr + cols_in[None, :] * stride_wn + offs_k[:, None]
    gamma_ptrs = gamma_ptr + offs_k

    c = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Squares accumulate elementwise and are summed across K once, after the loop: a row sum per K-tile
    # would cost a cross-warp reduction (shared memory and a barrier) in every iteration.
    s2 = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    if not RMS_IN_LOOP:
        r = tl.load(r_ptr + rows_in)
    # The x and gamma tiles are loaded one iteration ahead: the compiler pipelines W (it feeds tl.dot
    # directly) but not x, which is scaled in registers first; without the prefetch every iteration would
    # wait out an L2 round trip for x before its tl.dot could start. Loads past k_end are masked off.
    k_len = k_end - k_start
    in_k = tl.arange(0, BLOCK_K) < k_len
    x_next = tl.load(x_ptrs, mask=in_k[None, :], other=0.0)
    gamma_next = tl.load(gamma_ptrs, mask=in_k, other=0.0)
    for k0 in range(k_start, k_end, BLOCK_K):
        x = x_next.to(tl.float32)
        gamma = gamma_next.to(tl.float32)
        if EVEN_K:
            w = tl.load(w_ptrs)
        elif SWAP_AB:
            k_in = (k0 - k_start + tl.arange(0, BLOCK_K)) < k_len
            w = tl.load(w_ptrs, mask=k_in[None, :], other=0.0)
        else:
            k_in = (k0 - k_start + tl.arange(0, BLOCK_K)) < k_len
            w = tl.load(w_ptrs, mask=k_in[:, None], other=0.0)
        x_ptrs += BLOCK_K
        gamma_ptrs += BLOCK_K
        k_ahead = (k0 + BLOCK_K - k_start + tl.arange(0, BLOCK_K)) < k_len
        x_next = tl.load(x_ptrs, mask=k_ahead[None, :], other=0.0)
        gamma_next = tl.load(gamma_ptrs, mask=k_ahead, other=0.0)
        if RMS_IN_LOOP:
            s2 += x * x
            a = x * gamma[None, :]
        else:
            a = x * r[:, None] * gamma[None, :]
        a = a.to(w.dtype)
        if DOT_F32:  # the interpreter's tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584)
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        if SWAP_AB:
            c_t = tl.dot(w, tl.trans(a), c_t)
        else:
            c = tl.dot(a, w, c)
        w_ptrs += BLOCK_K
    s = tl.sum(s2, axis=1)
    if SWAP_AB:
        c = tl.trans(c_t)

    is_last = True
    if SPLIT_K > 1:
        # Serial split-K fix-up, with no waiting: every program leaves its partial c (and partial s) in the
        # workspace and counts itself in on the tile's counter; the program that arrives last sums the
        # partials, finishes the tile, and sets the counter back to zero for the next launch. acq_rel on the
        # counter orders each program's partials before its arrival and the last one's reads after it.
        tile_rows = tl.arange(0, BLOCK_M)
        row_in = rows < M
        part = (tile * SPLIT_K + split).to(tl.int64)
        c_offs = tile_rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(part_c_ptr + part * (BLOCK_M * BLOCK_N) + c_offs, c, mask=row_in[:, None])
        if RMS_IN_LOOP:
            tl.store(part_s_ptr + part * BLOCK_M + tile_rows, s, mask=row_in)
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        is_last = arrived == SPLIT_K - 1
        if is_last:
            first = (tile * SPLIT_K).to(tl.int64)
            c = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            s = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):
                c += tl.load(part_c_ptr + (first + j) * (BLOCK_M * BLOCK_N) + c_offs, mask=row_in[:, None],
                             other=0.0, cache_modifier=".cg")
                if RMS_IN_LOOP:
                    s += tl.load(part_s_ptr + (first + j) * BLOCK_M + tile_rows, mask=row_in, other=0.0,
                                 cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)

    if is_last:
        if RMS_IN_LOOP:
            r = tl.rsqrt(s / K + eps)
            c = c * r[:, None]
            if pid_n == 0:  # one program per row-tile keeps r for the backward pass
                tl.store(r_ptr + rows, r, mask=rows < M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
        tl.store(y_ptrs, c.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_linear_vector_kernel(
    x_ptr, w_ptr, gamma_ptr, y_ptr, r_ptr,
    N, K, stride_wn, eps,
    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LOAD_STAGES: tl.constexpr,
):
    # M = 1: one row of x against BLOCK_N rows of W on the CUDA cores, in fp32 throughout. A matrix-vector
    # product does 2 FLOPs per W element read, far below what the tensor cores would need to matter, and
    # without tl.dot there is no 16-row padding, no operand staging through shared memory and no barrier in
    # the loop: each thread streams its part of W and keeps elementwise partial sums, reduced once at the end.
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_in = (cols % N).to(tl.int64)  # columns past N wrap onto valid rows of W; their outputs are dropped
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + cols_in[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=LOAD_STAGES):
        ks = k0 + offs_k
        if EVEN_K:
            x = tl.load(x_ptr + ks).to(tl.float32)
            gamma = tl.load(gamma_ptr + ks).to(tl.float32)
            w = tl.load(w_ptrs + k0)
        else:
            x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            gamma = tl.load(gamma_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs + k0, mask=(ks < K)[None, :], other=0.0)
        s2 += x * x
        acc += w.to(tl.float32) * (x * gamma)[None, :]
    r = tl.rsqrt(tl.sum(s2, axis=0) / K + eps)
    if pid == 0:
        tl.store(r_ptr, r)
    y = tl.sum(acc, axis=1) * r
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


_EVEN_K = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
_rmsnorm_linear_fwd = _EVEN_K(_rmsnorm_linear_fwd_kernel)
_rmsnorm_linear_vector = _EVEN_K(_rmsnorm_linear_vector_kernel)


# --------------------------------------------------------------------------------------------------------
# Launch plan: pure functions of the shape and dtype, tested on both sides of every threshold
# --------------------------------------------------------------------------------------------------------

# Shape classes by the number of rows M (tokens). Decode: a matrix-vector product bound by reading W.
# Prefill: a compute-bound GEMM. The configs each class autotunes over are tabulated below.
VECTOR_MAX_M = 1
DECODE_MAX_M = 64
PREFILL_MIN_M = 1024
SHAPE_CLASSES = ("vector", "decode", "middle", "prefill")

# The autotuning key buckets M by powers of two (from 16, tl.dot's smallest tile, up to MAX_M_BUCKET), so
# a decode batch of 3 tokens reuses the choice made for 2 instead of tuning again.
MIN_M_BUCKET = 16
MAX_M_BUCKET = 16384

# r computed in the GEMM's K-loop, or by a row pre-pass; see the module docstring for why fp16 pre-passes.
RMS_MODE = {torch.bfloat16: "in-loop", torch.float16: "pre-pass"}
_RMS_PREPASS_MAX_BLOCK_K = 1024
_RMS_PREPASS_WARPS = 4

# Shared memory of one H100 thread block; configs whose pipelined tiles exceed it are never compiled.
SMEM_BYTES = 227 * 1024
_GROUP_M = 8

# Decode: one row-tile covers the whole batch (BLOCK_M = the M bucket), so W streams from DRAM exactly
# once; deep K tiles keep loads in flight. Two levers beyond the tile shape: split-K multiplies the programs
# (N / BLOCK_N tiles alone are 32 to 192 programs at N = 4096..12288 for 132 SMs), and SWAP_AB makes W the
# first operand (c^T = W a^T), so that a 64- or 128-row W tile drives Hopper's warpgroup MMA straight from
# shared memory while the 16-row x tile is the small second operand.
# Measured on the H200 (notes/rmsnorm-linear.md, probes 1-2): the best tiles at M = 16 stream W at 37% (N = 4096)
# and 62% (N = 12288) of the copy ceiling.
# (BLOCK_N, BLOCK_K, num_stages, num_warps, SPLIT_K, SWAP_AB)
_DECODE_TILES = (
    (64, 256, 4, 4, 1, False), (32, 256, 4, 4, 1, False), (64, 128, 4, 4, 1, False), (16, 512, 3, 4, 1, False),
    (128, 128, 4, 4, 2, False), (64, 256, 4, 4, 1, True), (64, 128, 4, 4, 1, True), (128, 128, 4, 4, 1, True),
    (64, 128, 4, 4, 2, True), (128, 128, 3, 4, 2, True), (64, 256, 3, 4, 2, True),
)
# Middle (65 <= M < 1024): memory-bound near M = 128, compute-bound near 1024.
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps, SPLIT_K)
_MIDDLE_TILES = (
    (64, 64, 128, 3, 4, 2), (128, 128, 128, 3, 8, 4), (128, 128, 64, 4, 8, 4), (64, 64, 128, 3, 4, 1),
    (64, 64, 64, 4, 4, 1), (128, 128, 64, 4, 8, 1), (64, 128, 64, 4, 4, 1), (128, 128, 128, 3, 8, 2),
    (128, 256, 64, 3, 8, 1), (64, 256, 64, 3, 8, 1),
)
# Prefill: the large tiles a Hopper GEMM wants (two warpgroups on 128 x 256); enough tiles without split-K.
_PREFILL_TILES = (
    (128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (256, 128, 64, 4, 8),
    (128, 128, 64, 4, 8), (128, 128, 64, 5, 4), (128, 128, 128, 3, 8), (64, 256, 64, 4, 4),
)

# Vector (M = 1): (BLOCK_N, BLOCK_K, num_warps, LOAD_STAGES): rows of W per program against the depth of
# each load, and loads in flight per program (the loop is software-pipelined). The eight best of 57 measured
# on the H200 (probe 3): all within 10% of each other at N = 4096 and 12288.
_VECTOR_TILES = (
    (8, 1024, 4, 3), (32, 256, 4, 4), (16, 512, 8, 4), (8, 512, 8, 4), (4, 256, 4, 4), (32, 512, 8, 3),
    (8, 512, 4, 3), (32, 256, 8, 3),
)

# Under the interpreter: one small config (programs run one at a time). GROUP_M = 2 still exercises the
# grouped order and SPLIT_K = 2 the split-K fix-up; tests force SPLIT_K = 1 and 3 through the launcher.
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 2,
                      "SWAP_AB": False, "num_warps": 4, "num_stages": 1}
INTERPRETER_VECTOR_CONFIG = {"BLOCK_N": 16, "BLOCK_K": 32, "LOAD_STAGES": 1, "num_warps": 4, "num_stages": 1}


def shape_class(n_rows: int) -> str:
    """"vector" for M <= VECTOR_MAX_M (one token: the CUDA-core matrix-vector kernel), "decode" for
    M <= DECODE_MAX_M, "prefill" for M >= PREFILL_MIN_M, "middle" between."""
    if n_rows <= VECTOR_MAX_M:
        return "vector"
    if n_rows <= DECODE_MAX_M:
        return "decode"
    if n_rows >= PREFILL_MIN_M:
        return "prefill"
    return "middle"


def m_bucket(n_rows: int) -> int:
    """The autotuning key for M: the next power of two, clamped to [MIN_M_BUCKET, MAX_M_BUCKET]."""
    return min(MAX_M_BUCKET, max(MIN_M_BUCKET, triton.next_power_of_2(max(1, n_rows))))


def smem_bytes(config: Mapping[str, int], element_size: int = 2) -> int:
    """Shared memory the software pipeline holds: num_stages copies of an x tile and a W tile (vector
    configs: LOAD_STAGES copies of a W tile, x and gamma)."""
    if "BLOCK_M" not in config:
        return config["LOAD_STAGES"] * (config["BLOCK_N"] + 2) * config["BLOCK_K"] * element_size
    per_stage = (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * element_size
    return config["num_stages"] * per_stage


def _config(block_m, block_n, block_k, stages, warps, split_k=1, swap_ab=False) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": _GROUP_M,
            "SPLIT_K": split_k, "SWAP_AB": swap_ab, "num_warps": warps, "num_stages": stages}


def class_configs(cls: str) -> list[dict]:
    """Every config the autotuner of shape class `cls` holds, before pruning by M bucket and shared memory."""
    if cls == "vector":
        return [{"BLOCK_N": bn, "BLOCK_K": bk, "LOAD_STAGES": stages, "num_warps": warps, "num_stages": 1}
                for bn, bk, warps, stages in _VECTOR_TILES]
    if cls == "decode":
        return [_config(bm, *tile) for bm in (16, 32, 64) for tile in _DECODE_TILES]
    if cls == "middle":
        return [_config(*tile) for tile in _MIDDLE_TILES]
    if cls == "prefill":
        return [_config(*tile) for tile in _PREFILL_TILES]
    raise ValueError(f"rmsnorm_linear: shape class must be one of {', '.join(SHAPE_CLASSES)}, got {cls!r}.")


def config_fits(config: Mapping[str, int], cls: str, bucket: int) -> bool:
    """Whether autotuning tries `config` for an M bucket: decode tiles cover the bucket in one row-tile,
    middle tiles are no taller than the bucket, and the pipelined tiles fit in shared memory."""
    if smem_bytes(config) > SMEM_BYTES:
        return False
    if cls == "vector":
        return True
    if cls == "decode":
        return config["BLOCK_M"] == bucket
    if cls == "middle":
        return config["BLOCK_M"] <= bucket
    return True


def candidate_configs(n_rows: int) -> list[dict]:
    """The configs autotuning benchmarks for M = n_rows on a GPU."""
    cls, bucket = shape_class(n_rows), m_bucket(n_rows)
    return [c for c in class_configs(cls) if config_fits(c, cls, bucket)]


@functools.cache
def _candidate_count(cls: str, bucket: int) -> int:
    # Every forward builds a plan: keep that to a dictionary lookup.
    return sum(config_fits(c, cls, bucket) for c in class_configs(cls))


@dataclass(frozen=True)
class RmsNormLinearPlan:
    """How one forward launch is laid out. Recorded next to every timing the lab takes.

    config: the tile config that ran (or, under the interpreter, will run); None on a GPU until autotuning
    has chosen one for this (M bucket, N, K).
    """

    shape_class: str
    m_bucket: int
    rms: str  # "in-loop" or "pre-pass"
    autotuned: bool
    candidates: int  # how many configs autotuning benchmarks (1: fixed)
    config: dict | None

    def as_dict(self) -> dict:
        return asdict(self)


def plan_rmsnorm_linear(
    n_rows: int, n_cols: int, n_features: int, dtype: torch.dtype, *, interpret: bool | None = None
) -> RmsNormLinearPlan:
    """Launch plan for y [n_rows, n_cols] = rmsnorm(x [n_rows, n_features]) @ W^T in `dtype`."""
    if dtype not in RMS_MODE:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"rmsnorm_linear: dtype {str(dtype).removeprefix('torch.')} is not supported; use {names}.")
    interpret = interpreter_enabled() if interpret is None else interpret
    cls, bucket = shape_class(n_rows), m_bucket(n_rows)
    rms = "in-loop" if cls == "vector" else RMS_MODE[dtype]  # the vector kernel's fp32 math cannot overflow
    if interpret:
        fixed = INTERPRETER_VECTOR_CONFIG if cls == "vector" else INTERPRETER_CONFIG
        return RmsNormLinearPlan(cls, bucket, rms, False, 1, dict(fixed))
    return RmsNormLinearPlan(cls, bucket, rms, True, _candidate_count(cls, bucket), None)


def config_dict(config: triton.Config) -> dict:
    """A triton.Config as the plain dict the plan records (EVEN_K is derived, not chosen: left out)."""
    kwargs = {k: v for k, v in config.kwargs.items() if k != "EVEN_K"}
    return {**kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def _prune_for_bucket(cls: str):
    def prune(configs, named_args, **kwargs):
        bucket = named_args["M_BUCKET"]
        return [c for c in configs if config_fits(config_dict(c), cls, bucket)]

    return prune


def _autotuner(cls: str):
    configs = [
        triton.Config({k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
                      num_warps=c["num_warps"], num_stages=c["num_stages"])
        for c in class_configs(cls)
    ]
    if cls == "vector":
        return triton.autotune(configs=configs, key=["N", "K"])(_rmsnorm_linear_vector)
    return triton.autotune(
        configs=configs, key=["M_BUCKET", "N", "K"], prune_configs_by={"early_config_prune": _prune_for_bucket(cls)}
    )(_rmsnorm_linear_fwd)


# One autotuner per shape class, each with its own config list and its own cache of choices.
_AUTOTUNERS = {cls: _autotuner(cls) for cls in SHAPE_CLASSES}


# --------------------------------------------------------------------------------------------------------
# Launchers (x 2-D with unit stride along K, W with unit stride along K, gamma contiguous)
# --------------------------------------------------------------------------------------------------------


def rms_inv(x: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """r = 1 / sqrt(mean(x^2, -1) + eps) in float32, one value per row of a 2-D x (the fp16 pre-pass)."""
    n_rows, n_features = x.shape
    r = torch.empty(n_rows, dtype=torch.float32, device=x.device) if out is None else out
    block_k = min(_RMS_PREPASS_MAX_BLOCK_K, max(16, triton.next_power_of_2(n_features)))
    _rms_inv_kernel[(n_rows,)](x, r, n_features, x.stride(0), eps, BLOCK_K=block_k, num_warps=_RMS_PREPASS_WARPS)
    return r


def rmsnorm_linear_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    plan: RmsNormLinearPlan,
    out: torch.Tensor | None = None,
    r_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, RmsNormLinearPlan]:
    """y = rmsnorm(x) @ W^T for 2-D x [M, K] and W [N, K] (unit stride along K), gamma [K] contiguous.

    Returns y [M, N] (into `out` if given; its rows may be strided), r [M] float32 (into `r_out` if given)
    and the plan with the config that ran.
    """
    n_rows, n_features = x.shape
    n_cols = weight.shape[0]
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if out is None else out
    r = torch.empty(n_rows, dtype=torch.float32, device=x.device) if r_out is None else r_out
    in_loop = plan.rms == "in-loop"
    if not in_loop:
        rms_inv(x, eps, out=r)
    tuning_key = (plan.shape_class, plan.m_bucket, n_cols, n_features, x.dtype)
    if plan.autotuned and plan.config is None and tuning_key in _TUNED:
        plan = replace(plan, config=_TUNED[tuning_key])
    cfg = plan.config  # None: autotuning has not chosen for this key yet

    if plan.shape_class == "vector":
        args = (x, weight, gamma, y, r, n_cols, n_features, weight.stride(0), eps)
        if cfg is None:
            tuner = _AUTOTUNERS["vector"]
            tuner[lambda meta: (triton.cdiv(n_cols, meta["BLOCK_N"]),)](*args)
        else:
            _rmsnorm_linear_vector[(triton.cdiv(n_cols, cfg["BLOCK_N"]),)](*args, **cfg)
    else:
        dot_f32 = interpreter_enabled() and x.dtype == torch.bfloat16
        configs = candidate_configs(n_rows) if cfg is None else [cfg]
        part_c, part_s, counts = split_k_workspace(n_rows, n_cols, configs, x.device)
        args = (x, weight, gamma, y, r, part_c, part_s, counts, n_rows, n_cols, n_features, plan.m_bucket,
                x.stride(0), weight.stride(0), y.stride(0), eps)
        if cfg is None:
            tuner = _AUTOTUNERS[plan.shape_class]
            tuner[lambda meta: (_tile_count(n_rows, n_cols, meta) * meta["SPLIT_K"],)](
                *args, RMS_IN_LOOP=in_loop, DOT_F32=dot_f32
            )
        else:
            _rmsnorm_linear_fwd[(_tile_count(n_rows, n_cols, cfg) * cfg["SPLIT_K"],)](
                *args, RMS_IN_LOOP=in_loop, DOT_F32=dot_f32, **cfg
            )
    if cfg is None:
        cfg = _TUNED[tuning_key] = config_dict(tuner.best_config)
        plan = replace(plan, config=cfg)
    return y, r, plan


# The config autotuning chose, per (shape class, M bucket, N, K, dtype). Later launches go straight to the
# kernel with it: the autotuner's own dispatch costs more host time per call than the kernel takes at decode.
_TUNED: dict[tuple, dict] = {}


def _tile_count(n_rows: int, n_cols: int, config: Mapping[str, int]) -> int:
    return triton.cdiv(n_rows, config["BLOCK_M"]) * triton.cdiv(n_cols, config["BLOCK_N"])


# Tile counters of the split-K fix-up, per (device, stream): zeroed once, and every launch leaves them at zero
# (the last program of a tile resets its counter), so no launch pays for a memset. One buffer per stream
# keeps launches on different streams from counting into each other's tiles.
_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def _tile_counters(n_tiles: int, device: torch.device) -> torch.Tensor:
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    counts = _COUNTERS.get(key)
    if counts is None or counts.numel() < n_tiles:
        counts = torch.zeros(max(n_tiles, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = counts
    return counts


def split_k_workspace(n_rows: int, n_cols: int, configs, device: torch.device):
    """(partial c, partial s, tile counters) large enough for every split-K config in `configs`.

    Each split leaves a BLOCK_M x BLOCK_N fp32 tile of c and BLOCK_M sums of squares: SPLIT_K * M_pad * N_pad
    floats in all (4 bytes each; at decode, M = 16 and N = 12288 with SPLIT_K = 4: 3 MiB, 3% of W's bytes,
    written and read back mostly through L2). Without split-K configs the buffers are one element each.
    """
    split = [c for c in configs if c["SPLIT_K"] > 1]
    c_elems = max((_tile_count(n_rows, n_cols, c) * c["SPLIT_K"] * c["BLOCK_M"] * c["BLOCK_N"] for c in split), default=1)
    s_elems = max((_tile_count(n_rows, n_cols, c) * c["SPLIT_K"] * c["BLOCK_M"] for c in split), default=1)
    n_tiles = max((_tile_count(n_rows, n_cols, c) for c in split), default=1)
    part_c = torch.empty(c_elems, dtype=torch.float32, device=device)
    part_s = torch.empty(s_elems, dtype=torch.float32, device=device)
    return part_c, part_s, _tile_counters(n_tiles, device)


def resolve_plan(n_rows: int, n_cols: int, n_features: int, dtype: torch.dtype, device: str) -> RmsNormLinearPlan:
    """The plan with the config that runs for this shape: on CUDA this launches once on random operands so
    that autotuning (cached per key) has chosen — never on zeros, which run faster than real data and would
    bias the choice; under the interpreter it is the fixed config, without a launch; anywhere else it is the
    pure plan (config None)."""
    plan = plan_rmsnorm_linear(n_rows, n_cols, n_features, dtype)
    if not plan.autotuned or torch.device(device).type != "cuda":
        return plan
    x = torch.randn(n_rows, n_features, device=device).to(dtype)
    weight = torch.randn(n_cols, n_features, device=device).mul_(n_features**-0.5).to(dtype)
    gamma = torch.ones(n_features, dtype=dtype, device=device)
    return rmsnorm_linear_fwd(x, weight, gamma, 1e-6, plan)[2]


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as a 2-D [M, K] view with unit stride along K (a copy only when no such view exists)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


# --------------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------------


class RmsNormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
        x_rows = _as_rows(x)
        w = weight if weight.stride(1) == 1 or weight.shape[1] == 1 else weight.contiguous()
        g = gamma.contiguous()
        n_rows, n_features = x_rows.shape
        n_cols = w.shape[0]
        if n_rows == 0 or n_cols == 0:  # nothing to launch; r from torch keeps backward uniform
            y_rows = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
            r = torch.rsqrt(x_rows.float().pow(2).mean(-1) + eps)
            ctx.plan = None
        else:
            plan = plan_rmsnorm_linear(n_rows, n_cols, n_features, x.dtype)
            y_rows, r, ctx.plan = rmsnorm_linear_fwd(x_rows, w, g, eps, plan)
        ctx.save_for_backward(x_rows, w, g, r)
        ctx.x_shape = x.shape
        return y_rows.view(*x.shape[:-1], n_cols)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        """Backward in torch: the two GEMMs (dW = dy^T h and dh = dy W, 4*M*N*K FLOPs, all but O(M*K) of the
        work) run in cuBLAS, the fastest GEMM on these GPUs, in the input dtype with fp32 accumulation as
        F.linear's backward does. The RMSNorm part is a few fp32 elementwise ops over [M, K]:
            xhat = x * r,  h = xhat * gamma,  g = dh * gamma,  dot = mean_k(g * xhat)
            dx = r * (g - xhat * dot),  dgamma = sum_m dh * xhat
        A fused row kernel would save those passes; no experiment here times the backward.
        """
        x_rows, w, gamma, r = ctx.saved_tensors
        dtype = x_rows.dtype
        dy_rows = dy.reshape(x_rows.shape[0], w.shape[0]).to(dtype)
        xhat = x_rows.float() * r[:, None]
        dx = dweight = dgamma = None
        if ctx.needs_input_grad[1]:
            h = (xhat * gamma.float()).to(dtype)  # the activations the product saw, as F.rms_norm returns them
            dweight = dy_rows.t() @ h
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[2]:
            dh = (dy_rows @ w).float()
            if ctx.needs_input_grad[2]:
                dgamma = (dh * xhat).sum(0).to(gamma.dtype)
            if ctx.needs_input_grad[0]:
                g = dh * gamma.float()
                dot = (g * xhat).mean(-1, keepdim=True)
                dx = (r[:, None] * (g - xhat * dot)).to(dtype).view(ctx.x_shape)
        return dx, dweight, dgamma, None


# --------------------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------------------


def check_rmsnorm_linear_inputs(op: str, x, weight, gamma, eps) -> None:
    """Type, dtype, shape, eps and device checks shared by the fused kernels (messages name what is accepted)."""
    for name, t in (("x", x), ("weight", weight), ("gamma", gamma)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    check_dtype(op, "x", x, SUPPORTED_DTYPES)
    for name, t in (("weight", weight), ("gamma", gamma)):
        if t.dtype != x.dtype:
            raise TypeError(
                f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')} but x has "
                f"{str(x.dtype).removeprefix('torch.')}; x, weight and gamma must share one dtype."
            )
    if x.dim() < 1:
        raise ValueError(f"{op}: x must have shape [..., K] (at least 1 dimension), got a 0-d tensor.")
    n_features = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != n_features:
        raise ValueError(
            f"{op}: weight must have shape [N, K] with K = {n_features} (the last dimension of x, "
            f"shape {tuple(x.shape)}), got {tuple(weight.shape)}."
        )
    if gamma.dim() != 1 or gamma.shape[0] != n_features:
        raise ValueError(
            f"{op}: gamma must have shape [K] with K = {n_features} (the last dimension of x, "
            f"shape {tuple(x.shape)}), got {tuple(gamma.shape)}."
        )
    if n_features == 0:
        raise ValueError(f"{op}: x has K = 0 features; the RMS of an empty row is undefined.")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a real number, got {type(eps).__name__}.")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps!r}.")
    check_device(op, x, weight, gamma)


def rmsnorm_linear(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """F.linear(F.rms_norm(x, (K,), gamma, eps), weight) in one kernel, differentiable.

    x: [..., K], any strides; weight: [N, K]; gamma: [K]; all float16 or all bfloat16, on CUDA (or on the
    CPU with TRITON_INTERPRET=1). Returns [..., N] in x's dtype. Products accumulate in fp32; r and the
    row's sum of squares are fp32. The maths: docs/posts/rmsnorm-linear.md.
    """
    check_rmsnorm_linear_inputs("rmsnorm_linear", x, weight, gamma, eps)
    return RmsNormLinearFunction.apply(x, weight, gamma, float(eps))
