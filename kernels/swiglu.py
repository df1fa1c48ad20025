"""SwiGLU's gate, c = silu(a) * b, forward and backward, each one streaming pass over the tensors.

    s  = sigmoid(a),  silu(a) = a * s
    c  = a * s * b
    da = dc * b * s * (1 + a * (1 - s))        (d silu / da = s + a * s * (1 - s))
    db = dc * a * s

a is the gate projection's output and b the up projection's, each [..., I]. Two layouts:

* swiglu(a, b): two tensors of one shape. When both are contiguous the kernel sees them as flat vectors of
  n = a.numel() elements; otherwise as rows of I elements with their own row strides (so a and b may be
  views into a packed tensor without a copy).
* swiglu_packed(ab): one [..., 2I] tensor holding the gate in the first half of its last dimension and the up
  projection in the second, as a merged gate/up projection writes it. Its gradient d(ab) is one [..., 2I]
  tensor too: da in the first half, db in the second.

Bytes, for n = T * I output elements of `size` bytes:

* forward: reads a and b, writes c: 3*n*size. Unfused (F.silu(a) * b): silu reads a and writes silu(a), the
  product reads silu(a) and b and writes c: 5*n*size.
* backward: reads dc, a and b, writes da and db: 5*n*size. Autograd of the unfused pair runs dc * b, then
  dc * silu(a), then silu's backward on a: 9*n*size, and the forward keeps silu(a) alive for it.

The math is a handful of fp32 operations per element, so both passes are bound by DRAM bandwidth: each
program streams one block of BLOCK contiguous elements. A block that lies wholly inside its row loads and
stores without a mask, so the compiler emits 16-byte vector accesses; only the last block of a row (of the
flat vector, when flat) takes the masked path, so any size, odd ones included, is handled. The write-up is
the SwiGLU section of docs/posts/kernel-fusion.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype
from kernels._launch import aligned, bind

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DIRECTIONS = ("forward", "backward")


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _block_start(col_blocks, BLOCK: tl.constexpr, OFFSET_64: tl.constexpr):
    # Programs run row-major over (row, column block): a flat launch is one row of col_blocks blocks.
    pid = tl.program_id(0)
    row = pid // col_blocks
    start = (pid - row * col_blocks) * BLOCK
    if OFFSET_64:
        row = row.to(tl.int64)
        start = start.to(tl.int64)
    return row, start


@triton.jit
def _swiglu_fwd_kernel(
    a_ptr, b_ptr, c_ptr, n_cols, col_blocks, a_row_stride, b_row_stride, c_row_stride,
    BLOCK: tl.constexpr, OFFSET_64: tl.constexpr,
):
    # Reads a and b once, writes c once: 3 * BLOCK * size bytes a program.
    row, start = _block_start(col_blocks, BLOCK, OFFSET_64)
    cols = start + tl.arange(0, BLOCK)
    a_ptrs = a_ptr + row * a_row_stride + cols
    b_ptrs = b_ptr + row * b_row_stride + cols
    c_ptrs = c_ptr + row * c_row_stride + cols
    if start + BLOCK <= n_cols:  # a whole block: unmasked, so 16-byte vector loads and stores
        a = tl.load(a_ptrs).to(tl.float32)
        b = tl.load(b_ptrs).to(tl.float32)
        c = a * tl.sigmoid(a) * b
        tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty))
    else:
        mask = cols < n_cols
        a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=mask, other=0.0).to(tl.float32)
        c = a * tl.sigmoid(a) * b
        tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_grads(dc, a, b):
    s = tl.sigmoid(a)
    silu = a * s
    da = dc * b * (s + silu * (1.0 - s))
    db = dc * silu
    return da, db


@triton.jit
def _swiglu_bwd_kernel(
    dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n_cols, col_blocks,
    dc_row_stride, a_row_stride, b_row_stride, da_row_stride, db_row_stride,
    BLOCK: tl.constexpr, OFFSET_64: tl.constexpr,
):
    # Reads dc, a and b once, writes da and db once: 5 * BLOCK * size bytes a program. silu(a) is
    # recomputed from a rather than saved by the forward pass: one exp costs nothing next to a tensor read.
    row, start = _block_start(col_blocks, BLOCK, OFFSET_64)
    cols = start + tl.arange(0, BLOCK)
    dc_ptrs = dc_ptr + row * dc_row_stride + cols
    a_ptrs = a_ptr + row * a_row_stride + cols
    b_ptrs = b_ptr + row * b_row_stride + cols
    da_ptrs = da_ptr + row * da_row_stride + cols
    db_ptrs = db_ptr + row * db_row_stride + cols
    if start + BLOCK <= n_cols:
        dc = tl.load(dc_ptrs).to(tl.float32)
        a = tl.load(a_ptrs).to(tl.float32)
        b = tl.load(b_ptrs).to(tl.float32)
        da, db = _swiglu_grads(dc, a, b)
        tl.store(da_ptrs, da.to(da_ptr.dtype.element_ty))
        tl.store(db_ptrs, db.to(db_ptr.dtype.element_ty))
    else:
        mask = cols < n_cols
        dc = tl.load(dc_ptrs, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=mask, other=0.0).to(tl.float32)
        da, db = _swiglu_grads(dc, a, b)
        tl.store(da_ptrs, da.to(da_ptr.dtype.element_ty), mask=mask)
        tl.store(db_ptrs, db.to(db_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------
# Launch plan: a pure function of the shape and dtype, tested on both sides of every threshold
# --------------------------------------------------------------------------------------------------------

# Elements a program streams, and its warps, by direction. Measured on an H100 at 4096 x 14336
# (checks/fusions.py, notes/fusions.md): every block of 1024-4096 elements on 8 warps ran within a
# point of the others (96.6-99.8% of the copy ceiling); 2048 was best or level forward, 1024 backward.
BLOCK_SETTINGS = {"forward": (2048, 8), "backward": (1024, 8)}
# A row-wise launch shrinks its block (down to MIN_BLOCK) while the padding of each row's last block would
# exceed 1/MAX_ROW_PADDING of the row: I = 14,336 takes 2048-element blocks (7 a row, none padded) where
# 4096 would leave the fourth block of every row half empty.
MIN_BLOCK = 1024
MAX_ROW_PADDING = 8


@dataclass(frozen=True)
class SwigluPlan:
    """How one launch is laid out. Recorded next to every timing the lab takes."""

    rows: int  # rows of the launch: 1 for a flat launch over contiguous tensors
    cols: int  # elements a row
    block: int  # elements a program
    num_warps: int
    col_blocks: int  # programs a row
    grid: int  # programs launched
    offset_64: bool  # element offsets need 64 bits

    def as_dict(self) -> dict:
        return asdict(self)


def plan_swiglu(n_rows: int, n_cols: int, direction: str = "forward", max_offset: int | None = None) -> SwigluPlan:
    """Launch plan for n_rows rows of n_cols elements (n_rows = 1: one flat vector).

    max_offset: the largest element offset any tensor of the launch reaches (from its start); defaults to
    n_rows * n_cols, the contiguous case. When an offset or the end of a block past it could reach 2^31, the
    kernel computes offsets in 64 bits.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"swiglu: direction must be 'forward' or 'backward', got {direction!r}.")
    block, num_warps = BLOCK_SETTINGS[direction]
    if n_rows > 1:
        while block > MIN_BLOCK and (triton.cdiv(n_cols, block) * block - n_cols) * MAX_ROW_PADDING > n_cols:
            block //= 2
    col_blocks = triton.cdiv(n_cols, block)
    max_offset = n_rows * n_cols if max_offset is None else max_offset
    return SwigluPlan(n_rows, n_cols, block, num_warps, col_blocks, n_rows * col_blocks, max_offset + block >= 2**31)


def _max_offset(*matrices: torch.Tensor) -> int:
    """The largest element offset reached by any of these 2-D, unit-stride-along-columns matrices."""
    return max((t.shape[0] - 1) * t.stride(0) + t.shape[1] for t in matrices)


# --------------------------------------------------------------------------------------------------------
# Launchers (2-D matrices with unit stride along their rows; a flat launch passes one row)
# --------------------------------------------------------------------------------------------------------


def _row_strides(plan: SwigluPlan, *matrices: torch.Tensor) -> list[int]:
    # A flat launch has one row: its stride is never used, and 0 keeps an odd element count from hiding the
    # 16-byte alignment of every block from the compiler (it specialises on integer arguments divisible by 16).
    return [t.stride(0) if plan.rows > 1 else 0 for t in matrices]


def swiglu_fwd(a: torch.Tensor, b: torch.Tensor, plan: SwigluPlan, out: torch.Tensor | None = None) -> torch.Tensor:
    """c = silu(a) * b for 2-D a, b [R, C]; c is contiguous unless `out` is given."""
    c = torch.empty(a.shape, dtype=a.dtype, device=a.device) if out is None else out
    _swiglu_fwd_kernel[(plan.grid,)](
        a, b, c, plan.cols, plan.col_blocks, *_row_strides(plan, a, b, c),
        BLOCK=plan.block, OFFSET_64=plan.offset_64, num_warps=plan.num_warps,
    )
    return c


def swiglu_bwd(
    dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, plan: SwigluPlan,
    da: torch.Tensor | None = None, db: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) for 2-D dc, a, b [R, C]; written into `da`, `db` if given (e.g. the halves of one d(ab))."""
    da = torch.empty(a.shape, dtype=a.dtype, device=a.device) if da is None else da
    db = torch.empty(b.shape, dtype=b.dtype, device=b.device) if db is None else db
    _swiglu_bwd_kernel[(plan.grid,)](
        dc, a, b, da, db, plan.cols, plan.col_blocks, *_row_strides(plan, dc, a, b, da, db),
        BLOCK=plan.block, OFFSET_64=plan.offset_64, num_warps=plan.num_warps,
    )
    return da, db


def _as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """`t` as a 2-D [-1, n_cols] view with unit stride along the rows (a copy only when no such view exists)."""
    rows = t.reshape(-1, n_cols)
    return rows if rows.stride(-1) == 1 or n_cols == 1 else rows.contiguous()


def _operand_rows(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """One flat row each when every tensor is contiguous (the fewest partial blocks), else rows of the last dim."""
    if all(t.is_contiguous() for t in tensors):
        return [t.view(1, -1) for t in tensors]
    n_cols = tensors[0].shape[-1] if tensors[0].dim() else 1
    return [_as_rows(t, n_cols) for t in tensors]


def _plan_for(direction: str, *matrices: torch.Tensor) -> SwigluPlan:
    n_rows, n_cols = matrices[0].shape
    return plan_swiglu(n_rows, n_cols, direction, _max_offset(*matrices))


# --------------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------------


class SwigluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a_rows, b_rows = _operand_rows(a, b)
        c_rows = torch.empty(a_rows.shape, dtype=a.dtype, device=a.device)
        swiglu_fwd(a_rows, b_rows, _plan_for("forward", a_rows, b_rows, c_rows), out=c_rows)
        ctx.save_for_backward(a, b)
        return c_rows.view(a.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dc: torch.Tensor):
        a, b = ctx.saved_tensors
        dc_rows, a_rows, b_rows = _operand_rows(dc.to(a.dtype), a, b)
        da = torch.empty(a.shape, dtype=a.dtype, device=a.device)
        db = torch.empty(b.shape, dtype=b.dtype, device=b.device)
        da_rows, db_rows = da.view(a_rows.shape), db.view(b_rows.shape)
        plan = _plan_for("backward", dc_rows, a_rows, b_rows, da_rows, db_rows)
        swiglu_bwd(dc_rows, a_rows, b_rows, plan, da_rows, db_rows)
        return (da if ctx.needs_input_grad[0] else None), (db if ctx.needs_input_grad[1] else None)


class SwigluPackedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ab: torch.Tensor) -> torch.Tensor:
        half = ab.shape[-1] // 2
        ab_rows = _as_rows(ab, 2 * half)
        c_rows = torch.empty((ab_rows.shape[0], half), dtype=ab.dtype, device=ab.device)
        a_rows, b_rows = ab_rows[:, :half], ab_rows[:, half:]
        swiglu_fwd(a_rows, b_rows, _plan_for("forward", a_rows, b_rows, c_rows), out=c_rows)
        ctx.save_for_backward(ab_rows)
        ctx.ab_shape = ab.shape
        return c_rows.view(*ab.shape[:-1], half)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dc: torch.Tensor):
        (ab_rows,) = ctx.saved_tensors
        half = ab_rows.shape[1] // 2
        dc_rows = _as_rows(dc.to(ab_rows.dtype), half)
        dab = torch.empty(ab_rows.shape, dtype=ab_rows.dtype, device=ab_rows.device)
        a_rows, b_rows, da_rows, db_rows = ab_rows[:, :half], ab_rows[:, half:], dab[:, :half], dab[:, half:]
        plan = _plan_for("backward", dc_rows, a_rows, b_rows, da_rows, db_rows)
        swiglu_bwd(dc_rows, a_rows, b_rows, plan, da_rows, db_rows)
        return dab.view(ctx.ab_shape)


# --------------------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------------------


def _check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    check_dtype(op, name, t, SUPPORTED_DTYPES)


def check_swiglu_inputs(op: str, a, b) -> None:
    """Type, dtype, shape and device checks for swiglu (messages name what is accepted)."""
    _check_tensor(op, "a", a)
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"{op}: b must be a torch.Tensor, got {type(b).__name__}.")
    if b.dtype != a.dtype:
        raise TypeError(
            f"{op}: b has dtype {str(b.dtype).removeprefix('torch.')} but a has "
            f"{str(a.dtype).removeprefix('torch.')}; a and b must share one dtype."
        )
    if a.shape != b.shape:
        raise ValueError(
            f"{op}: a and b must have the same shape (no broadcasting), got {tuple(a.shape)} and {tuple(b.shape)}."
        )
    check_device(op, a, b)


def check_swiglu_packed_input(op: str, ab) -> None:
    """Type, dtype, shape and device checks for swiglu_packed."""
    _check_tensor(op, "ab", ab)
    if ab.dim() < 1 or ab.shape[-1] % 2:
        raise ValueError(
            f"{op}: ab must have shape [..., 2I] (gate, then up, along an even last dimension), "
            f"got {tuple(ab.shape)}."
        )
    check_device(op, ab)


_ROUTES: dict[tuple, object] = {}  # swiglu's inference routes (contiguous a and b: one flat launch)


def _flat_route(a: torch.Tensor, b: torch.Tensor):
    if not (a.is_contiguous() and b.is_contiguous()):
        return None
    shape, dtype, device = a.shape, a.dtype, a.device
    a1, b1 = a.view(1, -1), b.view(1, -1)
    c1 = torch.empty(a1.shape, dtype=dtype, device=device)
    plan = _plan_for("forward", a1, b1, c1)
    launch = bind(_swiglu_fwd_kernel, (plan.grid,), (a1, b1, c1, plan.cols, plan.col_blocks, *_row_strides(plan, a1, b1, c1)),
                  varying=3, BLOCK=plan.block, OFFSET_64=plan.offset_64, num_warps=plan.num_warps)

    def route(a, b):
        c = torch.empty(shape, dtype=dtype, device=device)
        launch(a, b, c)
        return c

    return route


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b, differentiable; a (gate) and b (up) of one shape, any strides.

    dtype float32, float16 or bfloat16 (both the same), on CUDA (or on the CPU with TRITON_INTERPRET=1).
    Returns a contiguous tensor of a's shape and dtype; the math runs in fp32 and is rounded once at the store.
    """
    key = None
    if not (torch.compiler.is_compiling() or (torch.is_grad_enabled() and (getattr(a, "requires_grad", False)
                                                                           or getattr(b, "requires_grad", False)))):
        try:  # a layout seen before, no gradient wanted: its bound launcher, nothing else
            key = (a.__class__, b.__class__, a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device,
                   b.device, aligned(a), aligned(b))
            route = _ROUTES.get(key)
        except Exception:  # noqa: BLE001 - not tensors, or no storage: the checks say what is wrong
            key, route = None, None
        if route is not None:
            return route(a, b)
    check_swiglu_inputs("swiglu", a, b)
    if a.numel() == 0:
        return (a * b).clone()  # nothing to compute; keeps autograd's graph without a launch
    if key is not None:
        route = _flat_route(a, b)
        if route is not None:
            _ROUTES[key] = route
            return route(a, b)
    return SwigluFunction.apply(a, b)


# Inference routes for swiglu_packed: for a contiguous [..., 2I] layout seen before, with no gradient wanted,
# a bound launcher of the forward kernel (kernels/_launch.py): no checks, no autograd, no plan per call.
_PACKED_ROUTES: dict[tuple, object] = {}


def _packed_route(ab: torch.Tensor):
    if not ab.is_contiguous():
        return None
    half = ab.shape[-1] // 2
    rows = ab.view(-1, 2 * half)
    n_rows = rows.shape[0]
    out_shape, dtype, device = (*ab.shape[:-1], half), ab.dtype, ab.device
    c = torch.empty((n_rows, half), dtype=dtype, device=device)
    a, b = rows[:, :half], rows[:, half:]
    plan = _plan_for("forward", a, b, c)
    launch = bind(_swiglu_fwd_kernel, (plan.grid,), (a, b, c, plan.cols, plan.col_blocks, *_row_strides(plan, a, b, c)),
                  varying=3, BLOCK=plan.block, OFFSET_64=plan.offset_64, num_warps=plan.num_warps)

    def route(ab):
        rows = ab.view(n_rows, 2 * half)
        c = torch.empty(out_shape, dtype=dtype, device=device)
        launch(rows[:, :half], rows[:, half:], c)
        return c

    return route


def swiglu_packed(ab: torch.Tensor) -> torch.Tensor:
    """silu(ab[..., :I]) * ab[..., I:] for ab of shape [..., 2I], differentiable; returns [..., I].

    The layout of a merged gate/up projection: gate first, up second along the last dimension. Same dtypes
    and devices as swiglu; the gradient is one [..., 2I] tensor.
    """
    key = None
    if not (torch.compiler.is_compiling() or (torch.is_grad_enabled() and getattr(ab, "requires_grad", False))):
        try:
            key = (ab.__class__, ab.shape, ab.stride(), ab.dtype, ab.device, aligned(ab))
            route = _PACKED_ROUTES.get(key)
        except Exception:  # noqa: BLE001 - not a tensor, or no storage: the checks say what is wrong
            key, route = None, None
        if route is not None:
            return route(ab)
    check_swiglu_packed_input("swiglu_packed", ab)
    if ab.numel() == 0:
        half = ab.shape[-1] // 2
        return (ab[..., :half] * ab[..., half:]).clone()
    if key is not None:
        route = _packed_route(ab)
        if route is not None:
            _PACKED_ROUTES[key] = route
            return route(ab)
    return SwigluPackedFunction.apply(ab)
