"""RMSNorm fused into the linear projection that follows it, forward in Triton, backward through torch.

    r_m    = 1 / sqrt(mean_k x_mk^2 + eps)                  one number per row
    y_mn   = sum_k (x_mk * r_m * gamma_k) * W_nk            = F.linear(F.rms_norm(x, (K,), gamma, eps), W)
           = r_m * c_mn,   c_mn = sum_k (x_mk * gamma_k) * W_nk

r_m does not depend on k, so it leaves the sum: the product is a plain GEMM of a = x * gamma (gamma folded
into the x tile as it is loaded) against W^T, and r scales the fp32 accumulator c in the epilogue. The
row's sum of squares s_m = sum_k x_mk^2 accumulates in the same K-loop from the x tiles already loaded for
tl.dot, so x is read once and nothing normalised is written.

FLOPs: 2*M*N*K for the product on the tensor cores. s and the gamma fold add 3*M*K on the CUDA cores in
each of the N / BLOCK_N columns of output tiles: 3 / (2*BLOCK_N) of the product's count.
Bytes, for x [M, K], W [N, K], gamma [K] and y [M, N] of `size`-byte elements:

* fused (this kernel): x, W and gamma read once, y written once, r (M fp32) written:
  (M*K + N*K + K + M*N)*size + 4*M. Tiles re-read x once per column of output tiles and W once per row of
  them; those re-reads come mostly from L2 and are what the tile sizes trade against.
* unfused (F.rms_norm, then F.linear): the normalised activations h = x * r * gamma are written and read
  back: 2*M*K*size more, and a second launch.

At decode (M <= 64) the op is a matrix-vector product bound by reading W (N*K*size: 100 MB at N = 12288,
K = 4096 in bf16); at prefill (M >= 1024) it is a compute-bound GEMM where the saved round trip of h is
worth 2*(F/B)/N of the math time (F/B: tensor-core FLOP/s over copy bytes/s, a few hundred on an H100).
The write-up docs/posts/rmsnorm-linear.md works through both floors.

Where r is computed (`RmsNormLinearPlan.rms`):

* "in-loop" (bfloat16): s accumulates beside tl.dot; r scales c in the epilogue.
* "pre-pass" (float16): a row kernel computes r first (one more read of x: M*K*size bytes) and the tile fed
  to tl.dot is x * r * gamma, as in F.rms_norm. float16 tops out at 65504, so folding gamma alone would
  overflow on large activations that the normalised product keeps in range; bfloat16 has float32's range.

Tiles are autotuned on CUDA from a config list per shape class (decode M <= 64, middle, prefill M >= 1024),
keyed on (M bucket, N, K); the config that ran comes back in the launch plan. Under TRITON_INTERPRET one small
fixed config runs. Split-K is left out: decode tiles as narrow as BLOCK_N = 16 or 32 already turn
N = 4096..12288 into 128 to 768 programs for 132 SMs; if decode runs show idle SMs, it is the next schedule
to try.

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
    x_ptr, w_ptr, gamma_ptr, y_ptr, r_ptr,
    M, N, K, M_BUCKET,
    stride_xm, stride_wn, stride_ym,
    eps,
    RMS_IN_LOOP: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # One program owns a BLOCK_M x BLOCK_N tile of y. M_BUCKET is only the autotuning key.
    # Grouped order: GROUP_M row-tiles walk the columns together, so a W tile is reused from L2 by them.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_m
    pid_n = (pid % pids_per_group) // group_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows and columns past the edge wrap onto valid ones: loads need no mask there, the store drops them.
    rows_in = (rows % M).to(tl.int64)
    cols_in = (cols % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows_in[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + cols_in[None, :] * stride_wn + offs_k[:, None]  # a [BLOCK_K, BLOCK_N] tile of W^T
    gamma_ptrs = gamma_ptr + offs_k

    c = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if not RMS_IN_LOOP:
        r = tl.load(r_ptr + rows_in)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs).to(tl.float32)
            gamma = tl.load(gamma_ptrs).to(tl.float32)
            w = tl.load(w_ptrs)
        else:
            k_in = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=k_in[None, :], other=0.0).to(tl.float32)
            gamma = tl.load(gamma_ptrs, mask=k_in, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, mask=k_in[:, None], other=0.0)
        if RMS_IN_LOOP:
            s += tl.sum(x * x, axis=1)
            a = x * gamma[None, :]
        else:
            a = x * r[:, None] * gamma[None, :]
        a = a.to(w.dtype)
        if DOT_F32:  # the interpreter's tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584)
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        c = tl.dot(a, w, c)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        gamma_ptrs += BLOCK_K

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
# Launch plan: pure functions of the shape and dtype, tested on both sides of every threshold
# --------------------------------------------------------------------------------------------------------

# Shape classes by the number of rows M (tokens). Decode: a matrix-vector product bound by reading W.
# Prefill: a compute-bound GEMM. The configs each class autotunes over are tabulated below.
DECODE_MAX_M = 64
PREFILL_MIN_M = 1024
SHAPE_CLASSES = ("decode", "middle", "prefill")

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
# once; small BLOCK_N gives enough programs to occupy every SM; deep K tiles keep loads in flight.
# (BLOCK_N, BLOCK_K, num_stages, num_warps)
_DECODE_TILES = (
    (16, 256, 4, 4), (16, 512, 3, 4), (32, 128, 5, 4), (32, 256, 4, 4), (32, 512, 3, 4),
    (64, 128, 4, 4), (64, 256, 3, 4), (64, 256, 4, 8), (128, 128, 3, 4), (128, 128, 4, 8),
)
# Middle (65 <= M < 1024): memory-bound near M = 128, compute-bound near 1024.
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
_MIDDLE_TILES = (
    (64, 64, 128, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 3, 4), (64, 256, 64, 3, 8),
    (128, 64, 64, 4, 4), (128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 256, 64, 3, 8),
)
# Prefill: the large tiles a Hopper GEMM wants (two warpgroups on 128 x 256).
_PREFILL_TILES = (
    (128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (256, 128, 64, 4, 8),
    (128, 128, 64, 4, 8), (128, 128, 64, 5, 4), (128, 128, 128, 3, 8), (64, 256, 64, 4, 4),
)

# Under the interpreter: one small config (programs run one at a time; GROUP_M = 2 still exercises grouping).
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 1}


def shape_class(n_rows: int) -> str:
    """"decode" for M <= DECODE_MAX_M, "prefill" for M >= PREFILL_MIN_M, "middle" between."""
    if n_rows <= DECODE_MAX_M:
        return "decode"
    if n_rows >= PREFILL_MIN_M:
        return "prefill"
    return "middle"


def m_bucket(n_rows: int) -> int:
    """The autotuning key for M: the next power of two, clamped to [MIN_M_BUCKET, MAX_M_BUCKET]."""
    return min(MAX_M_BUCKET, max(MIN_M_BUCKET, triton.next_power_of_2(max(1, n_rows))))


def smem_bytes(config: Mapping[str, int], element_size: int = 2) -> int:
    """Shared memory the software pipeline holds: num_stages copies of an x tile and a W tile."""
    per_stage = (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * element_size
    return config["num_stages"] * per_stage


def _config(block_m, block_n, block_k, stages, warps) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": _GROUP_M,
            "num_warps": warps, "num_stages": stages}


def class_configs(cls: str) -> list[dict]:
    """Every config the autotuner of shape class `cls` holds, before pruning by M bucket and shared memory."""
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
    if interpret:
        return RmsNormLinearPlan(cls, bucket, RMS_MODE[dtype], False, 1, dict(INTERPRETER_CONFIG))
    return RmsNormLinearPlan(cls, bucket, RMS_MODE[dtype], True, _candidate_count(cls, bucket), None)


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
    dot_f32 = interpreter_enabled() and x.dtype == torch.bfloat16
    if not in_loop:
        rms_inv(x, eps, out=r)
    args = (x, weight, gamma, y, r, n_rows, n_cols, n_features, plan.m_bucket,
            x.stride(0), weight.stride(0), y.stride(0), eps)
    if plan.autotuned:
        tuner = _AUTOTUNERS[plan.shape_class]

        def grid(meta):
            return (triton.cdiv(n_rows, meta["BLOCK_M"]) * triton.cdiv(n_cols, meta["BLOCK_N"]),)

        tuner[grid](*args, RMS_IN_LOOP=in_loop, DOT_F32=dot_f32)
        plan = replace(plan, config=config_dict(tuner.best_config))
    else:
        cfg = plan.config
        grid = (triton.cdiv(n_rows, cfg["BLOCK_M"]) * triton.cdiv(n_cols, cfg["BLOCK_N"]),)
        _rmsnorm_linear_fwd[grid](*args, RMS_IN_LOOP=in_loop, DOT_F32=dot_f32, **cfg)
    return y, r, plan


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
