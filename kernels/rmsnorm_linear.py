"""RMSNorm fused into the linear projection that follows it: the public function, its launch plan and autograd.

    r_m    = 1 / sqrt(mean_k x_mk^2 + eps)                  one number per row
    y_mn   = sum_k (x_mk * r_m * gamma_k) * W_nk            = F.linear(F.rms_norm(x, (K,), gamma, eps), W)
           = r_m * c_mn,   c_mn = sum_k (x_mk * gamma_k) * W_nk

r_m does not depend on k, so it leaves the sum: the product is a plain GEMM of a = x * gamma against W^T,
and r scales the fp32 accumulator c at the end. The row's sum of squares accumulates from the x tiles the
product loads anyway, so x is read once and nothing normalised is written.

Bytes, for x [M, K], W [N, K], gamma [K] and y [M, N] of `size`-byte elements:

* fused: x, W and gamma read once, y written once: (M*K + N*K + K + M*N)*size (+ 4*M for r when autograd
  keeps it).
* unfused (F.rms_norm, then F.linear): the normalised activations h = x * r * gamma are written and read
  back: 2*M*K*size more, and a second launch.

Schedules by the number of rows M (`shape_class`), each in its own file:

* gemv (M <= 16, decode): a weight-streaming matrix-vector kernel that reads W once at the DRAM rate,
  split across K where N alone cannot fill the GPU (kernels/rmsnorm_gemv.py). Its plan is a pure function
  of (M, N, K, dtype).
* decode (17..64), middle, prefill (M >= 1024): tiled GEMMs on the tensor cores, autotuned per shape class
  on CUDA (kernels/_rmsnorm_linear_tiled.py).

The call path is kept lean for decode loops: everything that depends only on shapes, strides, dtypes and
devices (the checks, the plan) is worked out on the first call and cached; later calls with the same
layout allocate only their output and launch. Backward calls torch (RmsNormLinearFunction.backward).
The write-ups: docs/posts/rmsnorm-linear.md and the decode section of docs/posts/kernel-fusion.md.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import torch

from kernels import _rmsnorm_linear_tiled as tiled
from kernels._checks import check_device, check_dtype, interpreter_enabled
from kernels._gemv import DEFAULT_SM_COUNT, GemvPlan, device_sm_count
from kernels._launch import aligned
from kernels.rmsnorm_gemv import GEMV_MAX_M, BoundGemv, plan_rmsnorm_gemv, rms_mode, rmsnorm_gemv_fwd

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)

# Shape classes by the number of rows M (tokens).
DECODE_MAX_M = 64
PREFILL_MIN_M = 1024
SHAPE_CLASSES = ("gemv", "decode", "middle", "prefill")
# The tiled kernels' r: in the K-loop, or (float16) from a row pre-pass; see kernels/_rmsnorm_linear_tiled.py.
RMS_MODE = {torch.bfloat16: "in-loop", torch.float16: "pre-pass"}


def shape_class(n_rows: int) -> str:
    """"gemv" for M <= GEMV_MAX_M, "decode" for M <= DECODE_MAX_M, "prefill" for M >= PREFILL_MIN_M,
    "middle" between."""
    if n_rows <= GEMV_MAX_M:
        return "gemv"
    if n_rows <= DECODE_MAX_M:
        return "decode"
    if n_rows >= PREFILL_MIN_M:
        return "prefill"
    return "middle"


@dataclass(frozen=True)
class RmsNormLinearPlan:
    """How one forward launch is laid out. Recorded next to every timing the lab takes.

    config: for "gemv", the GemvPlan (fixed by the shape); for the tiled classes, the tile config that ran
    (or, under the interpreter, will run), None on a GPU until autotuning has chosen one.
    """

    shape_class: str
    m_bucket: int
    rms: str  # "in-loop" or "pre-pass"
    autotuned: bool
    candidates: int  # how many configs autotuning benchmarks (1: fixed)
    config: dict | None

    def as_dict(self) -> dict:
        return asdict(self)


def _check_plan_dtype(dtype: torch.dtype) -> None:
    if dtype not in RMS_MODE:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"rmsnorm_linear: dtype {str(dtype).removeprefix('torch.')} is not supported; use {names}.")


def plan_rmsnorm_linear(
    n_rows: int, n_cols: int, n_features: int, dtype: torch.dtype, *, interpret: bool | None = None,
    sm_count: int = DEFAULT_SM_COUNT,
) -> RmsNormLinearPlan:
    """Launch plan for y [n_rows, n_cols] = rmsnorm(x [n_rows, n_features]) @ W^T in `dtype` on a GPU of
    `sm_count` SMs (the GEMV's split-K depends on it)."""
    _check_plan_dtype(dtype)
    cls, bucket = shape_class(n_rows), tiled.m_bucket(n_rows)
    if cls == "gemv":
        gemv = plan_rmsnorm_gemv(n_rows, n_cols, n_features, dtype, sm_count)
        return RmsNormLinearPlan(cls, bucket, rms_mode(gemv, dtype), False, 1, gemv.as_dict())
    interpret = interpreter_enabled() if interpret is None else interpret
    if interpret:
        return RmsNormLinearPlan(cls, bucket, RMS_MODE[dtype], False, 1, dict(tiled.INTERPRETER_CONFIG))
    return RmsNormLinearPlan(cls, bucket, RMS_MODE[dtype], True, tiled.candidate_count(cls, bucket), None)


def candidate_configs(n_rows: int) -> list[dict]:
    """The tile configs autotuning benchmarks for M = n_rows on a GPU (none for the GEMV: its plan is fixed)."""
    cls = shape_class(n_rows)
    return [] if cls == "gemv" else tiled.candidate_configs(cls, n_rows)


# --------------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------------


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
    n_rows = x.shape[0]
    y = torch.empty((n_rows, weight.shape[0]), dtype=x.dtype, device=x.device) if out is None else out
    r = torch.empty(n_rows, dtype=torch.float32, device=x.device) if r_out is None else r_out
    if plan.shape_class == "gemv":
        gemv = GemvPlan(**plan.config)
        rmsnorm_gemv_fwd(x, weight, gamma, eps, gemv, y, r, rms=plan.rms)
        return y, r, plan
    config = tiled.rmsnorm_linear_tiled_fwd(x, weight, gamma, eps, plan.shape_class, plan.m_bucket,
                                            plan.rms == "in-loop", plan.config, y, r)
    return y, r, plan if plan.config == config else RmsNormLinearPlan(**{**plan.as_dict(), "config": config})


def resolve_plan(n_rows: int, n_cols: int, n_features: int, dtype: torch.dtype, device: str) -> RmsNormLinearPlan:
    """The plan with the config that runs for this shape: for the GEMV and under the interpreter, the pure
    plan; for a tiled class on CUDA, the plan after one launch on random operands, so that autotuning
    (cached per key) has chosen: never on zeros, which run faster than real data and would bias the
    choice; anywhere else, the pure plan (config None)."""
    plan = plan_rmsnorm_linear(n_rows, n_cols, n_features, dtype, sm_count=device_sm_count(torch.device(device)))
    if not plan.autotuned or torch.device(device).type != "cuda":
        return plan
    x = torch.randn(n_rows, n_features, device=device).to(dtype)
    weight = torch.randn(n_cols, n_features, device=device).mul_(n_features**-0.5).to(dtype)
    gamma = torch.ones(n_features, dtype=dtype, device=device)
    return rmsnorm_linear_fwd(x, weight, gamma, 1e-6, plan)[2]


class _Call:
    """What a call's layout decides, worked out once per (shapes, strides, dtypes, devices, eps)."""

    __slots__ = ("n_rows", "n_cols", "n_features", "out_shape", "x_is_rows", "w_ok", "gamma_ok", "cpu",
                 "gemv", "shape_class", "bucket", "in_loop", "config", "bound")

    def __init__(self, x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor):
        self.n_features = x.shape[-1]
        self.n_rows = math.prod(x.shape[:-1])
        self.n_cols = weight.shape[0]
        self.out_shape = (*x.shape[:-1], self.n_cols)
        self.x_is_rows = x.dim() == 2 and (x.stride(1) == 1 or self.n_features == 1)
        self.w_ok = weight.stride(1) == 1 or self.n_features == 1
        self.gamma_ok = gamma.is_contiguous()
        self.cpu = x.device.type == "cpu"
        self.gemv = self.config = None
        self.bound: dict[tuple, BoundGemv] = {}  # GEMV launchers by (r kept, x / W / gamma 16-byte aligned)
        self.shape_class = shape_class(self.n_rows)
        self.bucket = tiled.m_bucket(self.n_rows)
        self.in_loop = True
        if self.n_rows == 0 or self.n_cols == 0:
            return
        plan = plan_rmsnorm_linear(self.n_rows, self.n_cols, self.n_features, x.dtype,
                                   sm_count=device_sm_count(x.device))
        self.in_loop = plan.rms == "in-loop"
        if self.shape_class == "gemv":
            self.gemv = GemvPlan(**plan.config)
        elif not plan.autotuned:
            self.config = plan.config


_CALLS: dict[tuple, _Call] = {}
_MAX_CALLS = 4096


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as a 2-D [M, K] view with unit stride along K (a copy only when no such view exists)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


def _forward(call: _Call, x, weight, gamma, eps: float, keep_r: bool):
    """(y [..., N], x as rows, W, gamma as launched, r [M] float32 or None)."""
    x_rows = x if call.x_is_rows else _as_rows(x)
    w = weight if call.w_ok else weight.contiguous()
    g = gamma if call.gamma_ok else gamma.contiguous()
    y = torch.empty((call.n_rows, call.n_cols), dtype=x.dtype, device=x.device)
    r = None
    if call.n_rows == 0 or call.n_cols == 0:  # nothing to launch; r from torch keeps backward uniform
        if keep_r:
            r = torch.rsqrt(x_rows.float().pow(2).mean(-1) + eps)
    elif call.gemv is not None:
        if keep_r:
            r = torch.empty(call.n_rows, dtype=torch.float32, device=x.device)
        _launch_gemv(call, x_rows, w, g, eps, y, r)
    else:
        r = torch.empty(call.n_rows, dtype=torch.float32, device=x.device)
        call.config = tiled.rmsnorm_linear_tiled_fwd(x_rows, w, g, eps, call.shape_class, call.bucket,
                                                     call.in_loop, call.config, y, r)
    if len(call.out_shape) != 2:
        y = y.view(call.out_shape)
    return y, x_rows, w, g, r


def _launch_gemv(call: _Call, x, w, g, eps: float, y, r) -> None:
    """The GEMV through a launcher bound once per layout (kernels/_launch.py): after the first call, a call
    costs the kernel's own launch and nothing of Triton's argument binding."""
    key = (r is not None, aligned(x), aligned(w), aligned(g))
    bound = call.bound.get(key)
    if bound is None:
        bound = call.bound[key] = BoundGemv(x, w, g, eps, call.gemv, y, r)
    bound(x, w, g, y, r)


# --------------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------------


class RmsNormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float, call: _Call):
        y, x_rows, w, g, r = _forward(call, x, weight, gamma, eps, keep_r=True)
        ctx.save_for_backward(x_rows, w, g, r)
        ctx.x_shape = x.shape
        return y

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
        return dx, dweight, dgamma, None, None



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
    try:
        key = (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
               gamma.shape, gamma.stride(), gamma.dtype, gamma.device, type(eps), eps)
        call = _CALLS.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable eps: the checks say which
        key = call = None
    if call is None:
        check_rmsnorm_linear_inputs("rmsnorm_linear", x, weight, gamma, eps)
        call = _Call(x, weight, gamma)
        if key is not None:
            if len(_CALLS) >= _MAX_CALLS:
                _CALLS.clear()
            _CALLS[key] = call
    elif call.cpu:  # whether CPU tensors may run depends on TRITON_INTERPRET, which may have changed
        check_device("rmsnorm_linear", x, weight, gamma)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or gamma.requires_grad):
        return RmsNormLinearFunction.apply(x, weight, gamma, float(eps), call)
    return _forward(call, x, weight, gamma, float(eps), keep_r=False)[0]
