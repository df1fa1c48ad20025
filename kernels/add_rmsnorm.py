"""Residual add fused with RMSNorm, forward and backward: the junction of two transformer sub-layers.

    h     = x + r                              the new residual stream, stored in x's dtype
    rstd  = 1 / sqrt(mean_k h_k^2 + eps)       one fp32 number per row, kept for the backward pass
    hhat  = h * rstd
    y     = hhat * gamma                       the normalised input of the next sub-layer

Both h and y are outputs: y feeds the next attention or MLP block, h is carried on to the next residual add,
so the gradient of h arrives from two places. With dh the gradient reaching h from downstream and dy the
gradient of y:

    g      = dy * gamma
    c      = mean_k(g_k * hhat_k)
    dx     = dr = dh + rstd * (g - hhat * c)
    dgamma = sum over rows of dy * hhat

Bytes, for M rows of H elements of `size` bytes (the byte model the experiments count):

* forward: reads x and r (M*H each) and gamma (H); writes h and y (M*H each): (4*M*H + H)*size. rstd
  (4*M bytes) is left out of the model. The best unfused torch path, an add kernel then a fused RMSNorm
  kernel, moves 5*M*H*size: the norm reads h back.
* backward: reads dy, dh and h (M*H each) and gamma (H); writes dx (M*H; dr is the same tensor) and dgamma
  (H): (4*M*H + 2*H)*size. Left out of the model: rstd (4*M bytes read) and the dgamma partials below. The
  best unfused path (the norm's backward kernel, then dh added to its result) moves 6*M*H*size.

dgamma is a sum over all M rows. It is reduced in two stages, without atomics: a backward program owns a
contiguous run of rows and keeps the running sum of dy * hhat for its whole row width in fp32 registers,
writing it once as one row of a [P, H] fp32 partials buffer; a second, small kernel sums the P partial rows.
P is a few programs per SM (BWD_PROGRAMS_PER_SM), so the partials are P*H*4*2 bytes, written and read back
mostly through L2: 1.6% of the backward's model bytes at M = 16384, H = 4096 in bf16, with P = 264.

Each program holds whole rows in registers (H <= MAX_H); the write-up is the residual add + RMSNorm section
of docs/posts/kernel-fusion.md.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype, interpreter_enabled
from kernels._launch import aligned, bind, stream_workspace

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DIRECTIONS = ("forward", "backward")


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _add_rmsnorm_fwd_kernel(
    x_ptr, r_ptr, gamma_ptr, h_ptr, y_ptr, rstd_ptr,
    n_cols, x_row_stride, r_row_stride, h_row_stride, y_row_stride, eps,
    BLOCK_H: tl.constexpr, ROW_OFFSET_64: tl.constexpr,
):
    # One row per program: reads x and r once, writes h and y once (4*H*size bytes), plus gamma (from L2).
    row = tl.program_id(0)
    if ROW_OFFSET_64:
        row = row.to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * r_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    # h is rounded to the storage dtype first and normalised as stored, as torch's x + r then rms_norm(h)
    # does; the backward pass sees the same h.
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * h_row_stride + cols, h, mask=mask)
    h = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    gamma = tl.load(gamma_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = h * rstd * gamma
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _add_rmsnorm_bwd_kernel(
    dy_ptr, dh_ptr, h_ptr, gamma_ptr, rstd_ptr, dx_ptr, part_dgamma_ptr,
    n_rows, n_cols, rows_per_program, dy_row_stride, dh_row_stride, h_row_stride, dx_row_stride,
    BLOCK_H: tl.constexpr, HAS_DH: tl.constexpr, ROW_OFFSET_64: tl.constexpr, LOAD_STAGES: tl.constexpr,
):
    # A run of rows_per_program rows: each row's dy, dh and h are read once and dx written once
    # ((3 + 1)*H*size bytes a row); gamma is read once a program and the partial sum of dy * hhat, held in
    # fp32 across the run, is written once a program (4*H bytes). With LOAD_STAGES > 1 the compiler copies
    # the next rows' dy, h and dh into shared memory (cp.async) while this row is reduced and written, so
    # a program is not idle between one row's reduction and the next row's loads.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < n_cols
    gamma = tl.load(gamma_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dgamma = tl.zeros([BLOCK_H], dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in tl.range(row_start, row_end, num_stages=LOAD_STAGES):
        m = row
        if ROW_OFFSET_64:
            m = m.to(tl.int64)
        dy = tl.load(dy_ptr + m * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + m * h_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + m)
        hhat = h * rstd
        g = dy * gamma
        c = tl.sum(g * hhat, axis=0) / n_cols
        dx = rstd * (g - hhat * c)
        if HAS_DH:
            dx += tl.load(dh_ptr + m * dh_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + m * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dgamma += dy * hhat
    tl.store(part_dgamma_ptr + pid * n_cols + cols, dgamma, mask=mask)


@triton.jit
def _dgamma_reduce_kernel(part_ptr, dgamma_ptr, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # The second stage: BLOCK_C columns of the [n_parts, n_cols] fp32 partials summed down, written in
    # gamma's dtype. Reads n_parts * BLOCK_C * 4 bytes, mostly from L2 (the backward kernel just wrote them).
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_in = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts[:, None] < n_parts) & col_in[None, :]
        acc += tl.load(part_ptr + parts[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(dgamma_ptr + cols, tl.sum(acc, axis=0).to(dgamma_ptr.dtype.element_ty), mask=col_in)


# --------------------------------------------------------------------------------------------------------
# Launch plan: pure functions of the shape, tested on both sides of every threshold
# --------------------------------------------------------------------------------------------------------

# Rows are held whole in registers, one power-of-two block of lanes a row. Past this many the backward's
# per-program state (gamma and the dgamma sum, besides the row's dy and h) no longer fits one SM's registers.
MAX_H = 32768
_MIN_BLOCK_H = 16
# (largest BLOCK_H, num_warps) by direction: 16 to 32 fp32 values a thread per row tensor. Untuned starting
# values (no GPU measurement behind them yet); checks/fusions.py times the alternatives.
_WARPS = {
    "forward": ((1024, 4), (4096, 8), (16384, 16), (MAX_H, 32)),
    "backward": ((1024, 4), (4096, 8), (8192, 16), (MAX_H, 32)),
}
# Backward programs launched per SM (capped at one per row): each keeps a dgamma partial, so more programs
# hide more memory latency but write more partials. One a SM with three load stages measured best or level on
# an H100 (notes/fusions.md: 85.2% of the copy ceiling at 4096 x 8192 bf16 against 78.0% for two and two
# stages; 95.4% against 94.1% at 16384 x 4096 fp32; 90.1% against 89.7% at 16384 x 4096 bf16).
BWD_PROGRAMS_PER_SM = 1
# Rows of loads in flight a backward program (the loop's num_stages): each stage past the first holds one
# row of dy, h and dh in shared memory, 3*BLOCK_H*size bytes, and must fit BWD_PREFETCH_SMEM_BYTES (an H100
# block has 227 KiB; the rest is left to the row reduction): fp32 rows of 32,768 lanes run unpipelined.
BWD_LOAD_STAGES = 3
BWD_PREFETCH_SMEM_BYTES = 200 * 1024
# Under the interpreter there is no SM count; this small one makes CPU tests run several rows a program.
INTERPRETER_SM_COUNT = 2
# The dgamma reduction's tile: BLOCK_P partial rows by BLOCK_C columns a step, 128-byte column runs.
_REDUCE_BLOCK_P = 64
_REDUCE_BLOCK_C = 32
_REDUCE_WARPS = 4


@dataclass(frozen=True)
class AddRmsNormPlan:
    """How one launch is laid out. Recorded next to every timing the lab takes."""

    direction: str
    block_h: int  # lanes a row
    num_warps: int
    grid: int  # programs launched (forward: one per row)
    rows_per_program: int = 1
    load_stages: int = 1  # rows of loads in flight a program (backward only)
    reduce_grid: int = 0  # programs of the dgamma reduction (backward only)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_add_rmsnorm(
    n_rows: int, n_cols: int, dtype: torch.dtype, direction: str = "forward", sm_count: int = 1
) -> AddRmsNormPlan:
    """Launch plan for n_rows rows of n_cols elements of `dtype`; `sm_count` sets the backward's programs."""
    if direction not in DIRECTIONS:
        raise ValueError(f"add_rmsnorm: direction must be 'forward' or 'backward', got {direction!r}.")
    if not 1 <= n_cols <= MAX_H:
        raise ValueError(f"add_rmsnorm: holds a row in registers and accepts 1 <= H <= {MAX_H}, got H = {n_cols}.")
    block_h = max(_MIN_BLOCK_H, triton.next_power_of_2(n_cols))
    num_warps = next(w for limit, w in _WARPS[direction] if block_h <= limit)
    if direction == "forward":
        return AddRmsNormPlan(direction, block_h, num_warps, n_rows)
    programs = max(1, min(n_rows, sm_count * BWD_PROGRAMS_PER_SM))
    rows_per_program = triton.cdiv(n_rows, programs) if n_rows else 1
    grid = triton.cdiv(n_rows, rows_per_program) if n_rows else 1
    stages = BWD_LOAD_STAGES
    while stages > 1 and (stages - 1) * 3 * block_h * _element_size(dtype) > BWD_PREFETCH_SMEM_BYTES:
        stages -= 1
    return AddRmsNormPlan(direction, block_h, num_warps, grid, rows_per_program, stages,
                          triton.cdiv(n_cols, _REDUCE_BLOCK_C))


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; INTERPRETER_SM_COUNT for tensors that Triton's interpreter runs."""
    if device.type != "cuda" or interpreter_enabled():
        return INTERPRETER_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _row_offset_64(*matrices: torch.Tensor) -> bool:
    """Whether some element of these row-major matrices lies 2^31 or more elements past its start."""
    return any((t.shape[0] - 1) * t.stride(0) + t.shape[1] > 2**31 - 1 for t in matrices)


# --------------------------------------------------------------------------------------------------------
# Launchers (2-D matrices [M, H] with unit stride along H; gamma contiguous)
# --------------------------------------------------------------------------------------------------------


def add_rmsnorm_fwd(
    x: torch.Tensor, r: torch.Tensor, gamma: torch.Tensor, eps: float, plan: AddRmsNormPlan,
    h_out: torch.Tensor | None = None, y_out: torch.Tensor | None = None, rstd_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, rstd) for x, r [M, H]: h and y in x's dtype, rstd [M] fp32; written into the `*_out` if given."""
    n_rows, n_cols = x.shape
    h = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if h_out is None else h_out
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if y_out is None else y_out
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device) if rstd_out is None else rstd_out
    _add_rmsnorm_fwd_kernel[(plan.grid,)](
        x, r, gamma, h, y, rstd, n_cols, x.stride(0), r.stride(0), h.stride(0), y.stride(0), eps,
        BLOCK_H=plan.block_h, ROW_OFFSET_64=_row_offset_64(x, r, h, y), num_warps=plan.num_warps,
    )
    return h, y, rstd


def add_rmsnorm_bwd(
    dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor,
    plan: AddRmsNormPlan, dx_out: torch.Tensor | None = None, dgamma_out: torch.Tensor | None = None,
    partials_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dgamma) from the upstream gradients dy and dh (None: h is not used downstream) and the saved
    h [M, H] and rstd [M]. dx is also dr. `partials_out` is the [plan.grid, H] fp32 first stage of dgamma."""
    n_rows, n_cols = h.shape
    dx = torch.empty((n_rows, n_cols), dtype=h.dtype, device=h.device) if dx_out is None else dx_out
    dgamma = torch.empty(n_cols, dtype=gamma.dtype, device=h.device) if dgamma_out is None else dgamma_out
    partials = (torch.empty((plan.grid, n_cols), dtype=torch.float32, device=h.device)
                if partials_out is None else partials_out)
    has_dh = dh is not None
    dh_arg = dh if has_dh else dy  # never read when has_dh is False
    _add_rmsnorm_bwd_kernel[(plan.grid,)](
        dy, dh_arg, h, gamma, rstd, dx, partials,
        n_rows, n_cols, plan.rows_per_program, dy.stride(0), dh_arg.stride(0), h.stride(0), dx.stride(0),
        BLOCK_H=plan.block_h, HAS_DH=has_dh, ROW_OFFSET_64=_row_offset_64(dy, dh_arg, h, dx),
        LOAD_STAGES=plan.load_stages, num_warps=plan.num_warps,
    )
    _dgamma_reduce_kernel[(plan.reduce_grid,)](
        partials, dgamma, plan.grid, n_cols, BLOCK_P=_REDUCE_BLOCK_P, BLOCK_C=_REDUCE_BLOCK_C, num_warps=_REDUCE_WARPS,
    )
    return dx, dgamma


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., H] as a 2-D [M, H] view with unit stride along H (a copy only when no such view exists)."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


# --------------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------------


class AddRmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float):
        x_rows, r_rows, g = _as_rows(x), _as_rows(residual), gamma.contiguous()
        plan = plan_add_rmsnorm(*x_rows.shape, x.dtype, "forward")
        h_rows, y_rows, rstd = add_rmsnorm_fwd(x_rows, r_rows, g, eps, plan)
        ctx.save_for_backward(h_rows, g, rstd)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros read
        ctx.x_shape = x.shape
        return h_rows.view(x.shape), y_rows.view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dh: torch.Tensor | None, dy: torch.Tensor | None):
        h_rows, gamma, rstd = ctx.saved_tensors
        if dy is None:  # y unused downstream: dx = dr = dh, and gamma gets no gradient
            dx = None if dh is None else dh.to(h_rows.dtype)
            return dx, dx, None, None
        dy_rows = _as_rows(dy.to(h_rows.dtype))
        dh_rows = None if dh is None else _as_rows(dh.to(h_rows.dtype))
        plan = plan_add_rmsnorm(*h_rows.shape, h_rows.dtype, "backward", sm_count(h_rows.device))
        dx_rows, dgamma = add_rmsnorm_bwd(dy_rows, dh_rows, h_rows, gamma, rstd, plan)
        dx = dx_rows.view(ctx.x_shape)
        needs = ctx.needs_input_grad
        return (dx if needs[0] else None), (dx if needs[1] else None), (dgamma if needs[2] else None), None


# --------------------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------------------


def check_add_rmsnorm_inputs(op: str, x, residual, gamma, eps) -> None:
    """Type, dtype, shape, eps and device checks (messages name what was given and what is accepted)."""
    for name, t in (("x", x), ("residual", residual), ("gamma", gamma)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    check_dtype(op, "x", x, SUPPORTED_DTYPES)
    for name, t in (("residual", residual), ("gamma", gamma)):
        if t.dtype != x.dtype:
            raise TypeError(
                f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')} but x has "
                f"{str(x.dtype).removeprefix('torch.')}; x, residual and gamma must share one dtype."
            )
    if x.dim() < 1:
        raise ValueError(f"{op}: x must have shape [..., H] (at least 1 dimension), got a 0-d tensor.")
    if residual.shape != x.shape:
        raise ValueError(
            f"{op}: residual must have the shape of x, {tuple(x.shape)} (no broadcasting), got {tuple(residual.shape)}."
        )
    n_features = x.shape[-1]
    if gamma.dim() != 1 or gamma.shape[0] != n_features:
        raise ValueError(
            f"{op}: gamma must have shape [H] with H = {n_features} (the last dimension of x, "
            f"shape {tuple(x.shape)}), got {tuple(gamma.shape)}."
        )
    if n_features == 0:
        raise ValueError(f"{op}: x has H = 0 features; the RMS of an empty row is undefined.")
    if n_features > MAX_H:
        raise ValueError(f"{op}: holds a row in registers and accepts H <= {MAX_H}, got H = {n_features}.")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a real number, got {type(eps).__name__}.")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps!r}.")
    check_device(op, x, residual, gamma)


# Inference routes: for a layout seen before (contiguous x and residual, no gradient wanted), a bound launcher
# of the forward kernel (kernels/_launch.py) and nothing else: no checks, no autograd, no plan; rstd, which only
# the backward reads, goes to a per-stream workspace instead of a new tensor.
_ROUTES: dict[tuple, object] = {}


def _route_key(x, residual, gamma, eps) -> tuple:
    return (x.__class__, residual.__class__, gamma.__class__, x.shape, x.stride(), residual.shape, residual.stride(),
            gamma.shape, gamma.stride(), x.dtype, residual.dtype, gamma.dtype, x.device, residual.device,
            gamma.device, aligned(x), aligned(residual), aligned(gamma), eps.__class__, eps)


def _build_route(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float):
    """The inference launcher for x's layout, or None where the checked path must run (views that are not
    plain rows)."""
    if not (x.is_contiguous() and residual.is_contiguous() and gamma.is_contiguous()):
        return None
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    plan = plan_add_rmsnorm(n_rows, n_cols, x.dtype, "forward")
    shape, dtype, device = x.shape, x.dtype, x.device
    h, y = torch.empty_like(x), torch.empty_like(x)
    rstd = stream_workspace("add_rmsnorm.rstd", n_rows, torch.float32, device)
    launch = bind(_add_rmsnorm_fwd_kernel, (plan.grid,),
                  (x, residual, gamma, h, y, rstd, n_cols, n_cols, n_cols, n_cols, n_cols, float(eps)), varying=6,
                  BLOCK_H=plan.block_h, ROW_OFFSET_64=n_rows * n_cols > 2**31 - 1, num_warps=plan.num_warps)

    def route(x, residual, gamma):
        h = torch.empty(shape, dtype=dtype, device=device)
        y = torch.empty(shape, dtype=dtype, device=device)
        launch(x, residual, gamma, h, y, stream_workspace("add_rmsnorm.rstd", n_rows, torch.float32, device))
        return h, y

    return route


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y) with h = x + residual and y = rms_norm(h) * gamma, in one kernel; differentiable.

    x, residual: [..., H], the same shape, any strides; gamma: [H]; all float32, float16 or bfloat16 (one
    dtype), on CUDA (or on the CPU with TRITON_INTERPRET=1); 1 <= H <= MAX_H. Returns h and y contiguous, in
    x's shape and dtype. The sum of squares and the normalisation run in fp32 on h as stored. Gradients reach
    x, residual and gamma from both outputs (h is usually carried on as the next residual stream).
    """
    compiling = torch.compiler.is_compiling()
    wants_grad = torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or
                                              getattr(residual, "requires_grad", False) or
                                              getattr(gamma, "requires_grad", False))
    key = None
    if not (compiling or wants_grad):
        try:
            key = _route_key(x, residual, gamma, eps)
            route = _ROUTES.get(key)
        except Exception:  # noqa: BLE001 - not tensors, or no storage: the checks say what is wrong
            key, route = None, None
        if route is not None:
            return route(x, residual, gamma)
    check_add_rmsnorm_inputs("add_rmsnorm", x, residual, gamma, eps)
    if x.numel() == 0:  # no rows: nothing to launch; torch keeps autograd's graph
        h = x + residual
        return h, h * gamma
    if key is not None:
        route = _build_route(x, residual, gamma, eps)
        if route is not None:
            _ROUTES[key] = route
            return route(x, residual, gamma)
    return AddRmsNormFunction.apply(x, residual, gamma, float(eps))
