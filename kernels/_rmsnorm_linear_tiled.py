"""RMSNorm + linear as tiled GEMMs on the tensor cores: the schedules for M > 16 tokens (see kernels/rmsnorm_linear.py
for the maths and the dispatch; M <= 16 runs the weight-streaming kernel in kernels/rmsnorm_gemv.py).

The product is a GEMM of a = x * gamma (gamma folded into the x tile as it is loaded) against W^T; the row's
sum of squares s accumulates in the same K-loop from the x tiles already loaded for tl.dot, and r scales
the fp32 accumulator in the epilogue ("in-loop"), or, for float16, a row pre-pass computes r first and the
tile fed to tl.dot is x * r * gamma ("pre-pass": float16 tops out at 65504, so folding gamma alone could
overflow where the normalised product stays in range).

Bytes: x, W and gamma read once, y written once, r (M fp32) written: (M*K + N*K + K + M*N)*size + 4*M.
Tiles re-read x once per column of output tiles and W once per row of them, mostly from L2. Split-K adds a
BLOCK_M x BLOCK_N fp32 partial per split, written and read back through L2.

Shape classes: decode (17 <= M <= 64), middle, prefill (M >= 1024). The x and gamma tiles are loaded one
K-step ahead (W is pipelined by the compiler; x, scaled in registers first, is not). Decode and middle
configs may split K across programs (SPLIT_K: the last program of a tile sums the partials, with no
waiting) and may make W the first operand (SWAP_AB: c^T = W a^T). Configs are autotuned on CUDA per shape
class, keyed on (M bucket, N, K); the config that ran comes back in the launch plan and later launches of
the same key go straight to the kernel. Under TRITON_INTERPRET one small fixed config runs (SPLIT_K = 2, so
CPU tests cover the split-K fix-up). The tuning notes: notes/rmsnorm-linear.md.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from kernels._checks import interpreter_enabled
from kernels._gemv import workspace
from kernels.rmsnorm_gemv import rms_inv

# --------------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------------


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



_rmsnorm_linear_fwd = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})(
    _rmsnorm_linear_fwd_kernel
)


# --------------------------------------------------------------------------------------------------------
# Configs per shape class
# --------------------------------------------------------------------------------------------------------

TILED_CLASSES = ("decode", "middle", "prefill")

# The autotuning key buckets M by powers of two (from 16, tl.dot's smallest tile, up to MAX_M_BUCKET), so
# a decode batch of 19 tokens reuses the choice made for 18 instead of tuning again.
MIN_M_BUCKET = 16
MAX_M_BUCKET = 16384

# Shared memory of one H100 thread block; configs whose pipelined tiles exceed it are never compiled.
SMEM_BYTES = 227 * 1024
_GROUP_M = 8

# Decode: one row-tile covers the whole batch (BLOCK_M = the M bucket), so W streams from DRAM exactly
# once; deep K tiles keep loads in flight. Two levers beyond the tile shape: split-K multiplies the programs,
# and SWAP_AB makes W the first operand (c^T = W a^T), so that a 64- or 128-row W tile drives Hopper's
# warpgroup MMA straight from shared memory while the x tile is the small second operand.
# (BLOCK_N, BLOCK_K, num_stages, num_warps, SPLIT_K, SWAP_AB)
_DECODE_TILES = (
    (64, 256, 4, 4, 1, False), (32, 256, 4, 4, 1, False), (64, 128, 4, 4, 1, False), (16, 512, 3, 4, 1, False),
    (128, 128, 4, 4, 2, False), (64, 256, 4, 4, 1, True), (64, 128, 4, 4, 1, True), (128, 128, 4, 4, 1, True),
    (64, 128, 4, 4, 2, True), (128, 128, 3, 4, 2, True), (64, 256, 3, 4, 2, True),
)
_DECODE_BLOCK_M = (32, 64)
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

# Under the interpreter: one small config (programs run one at a time). GROUP_M = 2 still exercises the
# grouped order and SPLIT_K = 2 the split-K fix-up; tests force SPLIT_K = 1 and 3 through the launcher.
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 2,
                      "SWAP_AB": False, "num_warps": 4, "num_stages": 1}


def m_bucket(n_rows: int) -> int:
    """The autotuning key for M: the next power of two, clamped to [MIN_M_BUCKET, MAX_M_BUCKET]."""
    return min(MAX_M_BUCKET, max(MIN_M_BUCKET, triton.next_power_of_2(max(1, n_rows))))


def smem_bytes(config: Mapping[str, int], element_size: int = 2) -> int:
    """Shared memory the software pipeline holds: num_stages copies of an x tile and a W tile."""
    per_stage = (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * element_size
    return config["num_stages"] * per_stage


def _config(block_m, block_n, block_k, stages, warps, split_k=1, swap_ab=False) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": _GROUP_M,
            "SPLIT_K": split_k, "SWAP_AB": swap_ab, "num_warps": warps, "num_stages": stages}


def class_configs(cls: str) -> list[dict]:
    """Every config the autotuner of shape class `cls` holds, before pruning by M bucket and shared memory."""
    if cls == "decode":
        return [_config(bm, *tile) for bm in _DECODE_BLOCK_M for tile in _DECODE_TILES]
    if cls == "middle":
        return [_config(*tile) for tile in _MIDDLE_TILES]
    if cls == "prefill":
        return [_config(*tile) for tile in _PREFILL_TILES]
    raise ValueError(f"rmsnorm_linear: tiled shape class must be one of {', '.join(TILED_CLASSES)}, got {cls!r}.")


def config_fits(config: Mapping[str, int], cls: str, bucket: int) -> bool:
    """Whether autotuning tries `config` for an M bucket: decode tiles cover the bucket in one row-tile,
    middle tiles are no taller than the bucket, and the pipelined tiles fit in shared memory."""
    if smem_bytes(config) > SMEM_BYTES:
        return False
    if cls == "decode":
        return config["BLOCK_M"] == bucket
    if cls == "middle":
        return config["BLOCK_M"] <= bucket
    return True


def candidate_configs(cls: str, n_rows: int) -> list[dict]:
    """The configs autotuning benchmarks for shape class `cls` at M = n_rows on a GPU."""
    bucket = m_bucket(n_rows)
    return [c for c in class_configs(cls) if config_fits(c, cls, bucket)]


@functools.cache
def candidate_count(cls: str, bucket: int) -> int:
    return sum(config_fits(c, cls, bucket) for c in class_configs(cls))


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
    return triton.autotune(
        configs=configs, key=["M_BUCKET", "N", "K"], prune_configs_by={"early_config_prune": _prune_for_bucket(cls)}
    )(_rmsnorm_linear_fwd)


# One autotuner per shape class, each with its own config list and its own cache of choices.
AUTOTUNERS = {cls: _autotuner(cls) for cls in TILED_CLASSES}

# The config autotuning chose, per (shape class, M bucket, N, K, dtype). Later launches go straight to the
# kernel with it: the autotuner's own dispatch costs more host time per call than the kernel takes.
TUNED: dict[tuple, dict] = {}


# --------------------------------------------------------------------------------------------------------
# Launcher (x 2-D with unit stride along K, W with unit stride along K, gamma contiguous)
# --------------------------------------------------------------------------------------------------------


def tile_count(n_rows: int, n_cols: int, config: Mapping[str, int]) -> int:
    return triton.cdiv(n_rows, config["BLOCK_M"]) * triton.cdiv(n_cols, config["BLOCK_N"])


def split_k_workspace(n_rows: int, n_cols: int, configs, device: torch.device):
    """(partial c, partial s, tile counters) large enough for every split-K config in `configs`: views of
    the cached workspace (kernels/_gemv.py), so no launch allocates or zeroes one.

    Each split leaves a BLOCK_M x BLOCK_N fp32 tile of c and BLOCK_M sums of squares: SPLIT_K * M_pad * N_pad
    floats in all (4 bytes each; M = 64, N = 12288 with SPLIT_K = 2: 6 MiB, written and read back mostly
    through L2)."""
    split = [c for c in configs if c["SPLIT_K"] > 1]
    c_elems = max((tile_count(n_rows, n_cols, c) * c["SPLIT_K"] * c["BLOCK_M"] * c["BLOCK_N"] for c in split), default=1)
    s_elems = max((tile_count(n_rows, n_cols, c) * c["SPLIT_K"] * c["BLOCK_M"] for c in split), default=1)
    n_tiles = max((tile_count(n_rows, n_cols, c) for c in split), default=1)
    part, counts = workspace(c_elems + s_elems, n_tiles, device)
    return part[:c_elems], part[c_elems:c_elems + s_elems], counts


def rmsnorm_linear_tiled_fwd(x, weight, gamma, eps, shape_class, bucket, in_loop, config, y, r):
    """y [M, N] = rmsnorm(x) @ W^T for 2-D x [M, K] and W [N, K] (unit stride along K), gamma [K]
    contiguous, into y (rows may be strided) and r [M] float32. `config` None autotunes (on CUDA) and
    records the choice; returns the config that ran."""
    n_rows, n_features = x.shape
    n_cols = weight.shape[0]
    if not in_loop:
        rms_inv(x, eps, out=r)  # the float16 pre-pass
    tuning_key = (shape_class, bucket, n_cols, n_features, x.dtype)
    if config is None:
        config = TUNED.get(tuning_key)
    dot_f32 = interpreter_enabled() and x.dtype == torch.bfloat16
    configs = candidate_configs(shape_class, n_rows) if config is None else [config]
    part_c, part_s, counts = split_k_workspace(n_rows, n_cols, configs, x.device)
    args = (x, weight, gamma, y, r, part_c, part_s, counts, n_rows, n_cols, n_features, bucket,
            x.stride(0), weight.stride(0), y.stride(0), eps)
    if config is None:
        tuner = AUTOTUNERS[shape_class]
        tuner[lambda meta: (tile_count(n_rows, n_cols, meta) * meta["SPLIT_K"],)](
            *args, RMS_IN_LOOP=in_loop, DOT_F32=dot_f32
        )
        config = TUNED[tuning_key] = config_dict(tuner.best_config)
    else:
        _rmsnorm_linear_fwd[(tile_count(n_rows, n_cols, config) * config["SPLIT_K"],)](
            *args, RMS_IN_LOOP=in_loop, DOT_F32=dot_f32, **config
        )
    return config
