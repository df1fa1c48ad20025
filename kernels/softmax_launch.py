"""The row softmax's launches, each described once: which kernel, grid, arguments and launch options a plan
(kernels/softmax_plan.py) gives for a matrix of rows, forward (_fwd_launch) and backward (_bwd_launch), and
the workspaces split-row launches take. kernels/softmax.py runs these descriptions three ways: through
kernel[grid] (softmax_fwd, softmax_bwd, as the experiments time one given plan), through a bound launcher
(eager calls) and as a node of a traced graph (torch.compile).
"""

from __future__ import annotations

import torch

from kernels._launch import launch_in_clusters, stream_workspace
from kernels.softmax_kernels import (
    _softmax_bwd_online_kernel,
    _softmax_bwd_row_kernel,
    _softmax_bwd_rows_pipelined_kernel,
    _softmax_bwd_single_block_kernel,
    _softmax_fwd_online_kernel,
    _softmax_fwd_row_kernel,
    _softmax_fwd_rows_pipelined_kernel,
    _softmax_fwd_single_block_kernel,
)
from kernels.softmax_plan import SoftmaxPlan, _next_power_of_2
from kernels.softmax_split_row_kernels import _softmax_bwd_split_row_kernel, _softmax_fwd_split_row_kernel



def _row_offsets_fit_int32(*matrices: torch.Tensor) -> bool:
    """Whether every element of these row-major matrices lies less than 2^31 elements past its start."""
    return all((t.shape[0] - 1) * t.stride(0) + t.shape[1] <= 2**31 for t in matrices)


def _cut_rows(plan: SoftmaxPlan, *matrices: torch.Tensor) -> bool:
    """Whether a launch of `plan` over these row matrices cuts its rows at 16-byte boundaries: the plan asks
    for it and every matrix starts on such a boundary with rows at the same offset from one, so one cut (the
    first matrix's) serves them all. Otherwise the rows are loaded element by element: slower, as correct."""
    vec = 16 // matrices[0].element_size()
    stride = matrices[0].stride(0)
    return plan.edges and all(_starts_aligned(t) and (t.stride(0) - stride) % vec == 0 for t in matrices)


def _starts_aligned(t: torch.Tensor) -> bool:
    try:
        return t.data_ptr() % 16 == 0
    except RuntimeError:  # a traced tensor has no address: its graph allocates storage aligned (torch.compile
        return t.storage_offset() * t.element_size() % 16 == 0  # copies misaligned inputs)


def _split_row_sync(n_rows: int, device: torch.device) -> torch.Tensor:
    """A zeroed ticket counter and one arrival counter per row, for one launch (the tuning probe's kernels)."""
    return torch.zeros(1 + n_rows, dtype=torch.int32, device=device)


def _stream_workspace(device: torch.device, n_rows: int, parts: tuple) -> tuple:
    """(*partials, counters) of an eager split-row launch. Launches share one set per stream, which the
    kernels leave zeroed, so none needs a memset. A launch captured into a CUDA graph gets a set of its own,
    zeroed inside the graph, so graphs replayed on different streams never share counters."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _fresh_workspace(device, n_rows, parts)
    sync = stream_workspace("softmax-split-row-sync", 1 + n_rows, torch.int32, device)
    return (*stream_workspace("softmax-split-row-partials", parts, torch.float32, device), sync)


def _fresh_workspace(device: torch.device, n_rows: int, parts: tuple) -> tuple:
    """The same for one launch: what a traced or captured graph allocates (and zeroes) itself."""
    partials = torch.empty(sum(parts), dtype=torch.float32, device=device).split(parts)
    return (*partials, _split_row_sync(n_rows, device))


def _fwd_launch(x: torch.Tensor, y: torch.Tensor, plan: SoftmaxPlan, workspace) -> tuple:
    """(kernel, grid, args, meta) of the forward launch of `plan` over row matrices x -> y; args begin with
    the tensors (x, y, then a split-row launch's partials and counters from `workspace`)."""
    n_rows, n_cols = x.shape
    grid, warps = (plan.grid,), plan.num_warps
    # x's cut, and whether y's rows share it (else y's body is stored element by element).
    cut = _cut_rows(plan, x)
    edges = dict(EDGES=cut, Y_ALIGNED=cut and _cut_rows(plan, x, y), VEC=16 // x.element_size())
    if plan.impl == "single_block" and plan.stages > 1:
        return _softmax_fwd_rows_pipelined_kernel, grid, (x, y, n_rows, n_cols, x.stride(0), y.stride(0)), dict(
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROW_OFFSET_64=not _row_offsets_fit_int32(x, y), num_warps=warps,
            STAGES=plan.stages, **edges)
    if plan.impl == "single_block" and plan.rows_per_program == 1:
        return _softmax_fwd_row_kernel, grid, (x, y, n_cols, x.stride(0), y.stride(0)), dict(
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROW_OFFSET_64=not _row_offsets_fit_int32(x, y), num_warps=warps,
            **edges)
    if plan.impl == "single_block":
        return _softmax_fwd_single_block_kernel, grid, (x, y, n_rows, n_cols, x.stride(0), y.stride(0)), dict(
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROWS_PER_PROGRAM=plan.rows_per_program, num_warps=warps)
    if plan.impl == "split_row":
        n_parts = n_rows * plan.splits
        ws = workspace(x.device, n_rows, (n_parts, n_parts))
        cap = {"maxnreg": plan.max_registers} if plan.max_registers else {}
        return _softmax_fwd_split_row_kernel, grid, (x, y, *ws, n_cols, plan.splits, x.stride(0), y.stride(0)), dict(
            BLOCK_N=plan.block_n, SPLITS_POW2=_next_power_of_2(plan.splits), num_warps=warps, **edges, **cap)
    return _softmax_fwd_online_kernel, grid, (x, y, n_cols, x.stride(0), y.stride(0)), dict(
        BLOCK_N=plan.block_n, num_warps=warps)


def _bwd_launch(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: SoftmaxPlan, workspace) -> tuple:
    """(kernel, grid, args, meta) of the backward launch of `plan` over row matrices (y, dy) -> dx."""
    n_rows, n_cols = y.shape
    grid, warps = (plan.grid,), plan.num_warps
    strides = (y.stride(0), dy.stride(0), dx.stride(0))
    edges = dict(EDGES=_cut_rows(plan, y, dy, dx), VEC=16 // y.element_size())
    if plan.impl == "single_block" and plan.stages > 1:
        return _softmax_bwd_rows_pipelined_kernel, grid, (y, dy, dx, n_rows, n_cols, *strides), dict(
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROW_OFFSET_64=not _row_offsets_fit_int32(y, dy, dx),
            num_warps=warps, STAGES=plan.stages, **edges)
    if plan.impl == "single_block" and (edges["EDGES"] or plan.reload):
        return _softmax_bwd_row_kernel, grid, (y, dy, dx, n_cols, *strides), dict(
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROW_OFFSET_64=not _row_offsets_fit_int32(y, dy, dx),
            num_warps=warps, RELOAD=plan.reload, **edges)
    if plan.impl == "single_block":
        return _softmax_bwd_single_block_kernel, grid, (y, dy, dx, n_rows, n_cols, *strides), dict(
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROWS_PER_PROGRAM=plan.rows_per_program, num_warps=warps)
    if plan.impl == "split_row":
        ws = workspace(y.device, n_rows, (n_rows * plan.splits,))
        return _softmax_bwd_split_row_kernel, grid, (y, dy, dx, *ws, n_cols, plan.splits, *strides), dict(
            BLOCK_N=plan.block_n, SPLITS_POW2=_next_power_of_2(plan.splits), num_warps=warps, CLUSTER=plan.cluster,
            **edges)
    return _softmax_bwd_online_kernel, grid, (y, dy, dx, n_cols, *strides), dict(BLOCK_N=plan.block_n, num_warps=warps)


def softmax_fwd(x: torch.Tensor, plan: SoftmaxPlan, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = softmax(x) along dim 1 of a 2-D tensor whose rows are contiguous; written into `out` if given."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    kernel, grid, args, meta = _fwd_launch(x, y, plan, _stream_workspace)
    kernel[grid](*args, **meta)
    return y


def softmax_bwd(
    y: torch.Tensor, dy: torch.Tensor, plan: SoftmaxPlan, out: torch.Tensor | None = None
) -> torch.Tensor:
    """dx = y * (dy - <dy, y>) along dim 1 of 2-D tensors whose rows are contiguous; into `out` if given."""
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device) if out is None else out
    kernel, grid, args, meta = _bwd_launch(y, dy, dx, plan, _stream_workspace)
    if plan.cluster:
        launch_in_clusters(kernel, grid, args, plan.splits, **meta)
    else:
        kernel[grid](*args, **meta)
    return dx


def _as_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """View (or, when no view exists, copy) `t` as a 2-D matrix whose rows run along `dim`, unit stride."""
    rows = t.movedim(dim, -1).reshape(-1, t.shape[dim])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _from_rows(rows: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    moved_shape = like.movedim(dim, -1).shape
    return rows.view(moved_shape).movedim(-1, dim)


def _matrix_view(t: torch.Tensor, dim: int) -> torch.Tensor | None:
    """`t` as a matrix of rows along `dim` with unit column stride, without a copy, when `dim` is the last
    dimension and such a view exists; else None."""
    if dim != t.dim() - 1:
        return None
    try:
        rows = t.view(-1, t.shape[-1])
    except RuntimeError:
        return None
    return rows if rows.stride(1) == 1 or rows.shape[1] == 1 else None
