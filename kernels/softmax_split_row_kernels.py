"""Split-row softmax kernels, forward and backward (the device code of kernels/softmax.py's split-row plans).

A long row is cut into slices held in the registers of cooperating programs, which merge their (m, d) pairs
(forward) or their partial dots (backward) through global memory: x is read once and y written once
(2*M*N*size bytes), y and dy read once and dx written once (3*M*N*size), however long the row. GPU only: the
programs wait for each other, and Triton's interpreter runs one program at a time. The counters the programs
meet through end every launch zeroed, as they began it, so launches share them. The row cut at 16-byte
boundaries (EDGES) is kernels/softmax_kernels.py's.

The backward kernel also runs with the slices of a row as one cluster of the launch (CLUSTER, Hopper and
later; launched by kernels/_launch.py's bind(cluster=...)): the hardware schedules a cluster's programs
together, so they need no tickets, and they meet at the cluster's barrier instead of spinning on a counter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.softmax_kernels import _edge_offsets, _row_cut


@triton.jit
def _wait_for_row(counter_ptr, arrived, n_splits):
    # Spin (acquire) until all n_splits slices of the row have arrived, or until the last of them has set the
    # counter back to zero, which it does only once all have. A nanosleep back-off between polls measured
    # within noise of the plain spin (notes/softmax-speed.md, probe 5), so the spin stays plain.
    while (arrived < n_splits) & (arrived > 0):
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire")
    return arrived


@triton.jit
def _take_ticket(sync_ptr):
    # Tickets count up from sync_ptr[0]. The program holding the launch's last ticket sets the counter back
    # to zero (every ticket is taken by then), so the next launch finds it zeroed without a memset.
    ticket = tl.atomic_add(sync_ptr, 1)
    if ticket == tl.num_programs(0) - 1:
        tl.atomic_xchg(sync_ptr, 0)
    return ticket


@triton.jit
def _arrive_and_wait(counter_ptr, n_splits):
    # Release this slice's partials, then wait (acquire) until every slice of the row has released its own.
    # The last slice to arrive sets the row's counter back to zero (release) instead of waiting; the others
    # read that zero as "all arrived", with every partial visible through the last slice's acquire.
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel") + 1
    if arrived == n_splits:
        tl.atomic_xchg(counter_ptr, 0, sem="release")
    else:
        _wait_for_row(counter_ptr, arrived, n_splits)


@triton.jit
def _cluster_barrier(value):
    # Every thread of every program of the cluster arrives (release) and waits (acquire). Returns 0, computed
    # after the wait from `value`, so an address that adds it is not loaded before the barrier.
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned; mov.u32 $0, 0;",
        "=r,r", [value], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _softmax_fwd_split_row_kernel(
    x_ptr, y_ptr, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr,
    EDGES: tl.constexpr, Y_ALIGNED: tl.constexpr, VEC: tl.constexpr,
):
    # A row is cut into n_splits slices, one per program, each held in registers: x is read once and y
    # written once (2*M*N*size bytes) however long the row. The programs of a row meet once, through
    # global memory, to merge their (m, d) pairs with the online-softmax rule.
    # Work is taken in arrival order (a ticket from sync_ptr[0]), never by program id: every earlier ticket
    # belongs to a program already running, so a row's slices are all running or done before its last slice
    # waits, and the wait ends as long as n_splits programs fit on the GPU at once (MAX_SPLITS). The
    # interpreter runs programs one at a time and never gets this schedule. The counters in sync_ptr end
    # every launch zeroed, as they began it (_take_ticket, _arrive_and_wait).
    # EDGES and Y_ALIGNED as in _softmax_fwd_row_kernel: the slices tile the row's aligned body, and the
    # first slice also holds its head and tail.
    ticket = _take_ticket(sync_ptr)
    row = ticket // n_splits
    part = ticket % n_splits
    row64 = row.to(tl.int64)
    if EDGES:
        x_start, head, n_main = _row_cut(row64, x_row_stride, n_cols, VEC)
        x_row = x_ptr + tl.multiple_of(x_start + head, VEC)
        if Y_ALIGNED:
            y_row = y_ptr + tl.multiple_of(row64 * y_row_stride + head, VEC)
        else:
            y_row = y_ptr + row64 * y_row_stride + head
    else:
        n_main = n_cols
        x_row = x_ptr + row64 * x_row_stride
        y_row = y_ptr + row64 * y_row_stride
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_main
    x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        edge_in = edge_in & (part == 0)
        x_edge = tl.load(x_row + edge, mask=edge_in, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_edge, axis=0))
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp(x - m_safe)
    d = tl.sum(e, axis=0)
    if EDGES:
        e_edge = tl.exp(x_edge - m_safe)
        d += tl.sum(e_edge, axis=0)
    tl.store(part_m_ptr + ticket, m)
    tl.store(part_d_ptr + ticket, d)
    _arrive_and_wait(sync_ptr + 1 + row, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    pm = tl.load(part_m_ptr + parts, mask=in_row, other=-float("inf"), volatile=True)
    pd = tl.load(part_d_ptr + parts, mask=in_row, other=0.0, volatile=True)
    m_row = tl.max(pm, axis=0)
    # Slices of only -inf hold d = 0; a row of only -inf gives d_row = NaN, as torch does.
    d_row = tl.sum(tl.where(pm == -float("inf"), 0.0, pd * tl.exp(pm - m_row)), axis=0)
    d_row = tl.where(m_row == -float("inf"), float("nan"), d_row)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m_safe - m_row)) / d_row
    tl.store(y_row + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)
    if EDGES:
        tl.store(y_row + edge, (e_edge * scale).to(y_ptr.dtype.element_ty), mask=edge_in)


@triton.jit
def _softmax_bwd_split_row_kernel(
    y_ptr, dy_ptr, dx_ptr, part_dot_ptr, sync_ptr, n_cols, n_splits, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr, EDGES: tl.constexpr, VEC: tl.constexpr,
    CLUSTER: tl.constexpr = False,
):
    # The backward of the split-row schedule: each program holds a slice of y and dy, the programs of a row
    # add their partial dots through global memory, then each writes its slice of dx: 3*M*N*size bytes.
    # Tickets and the wait as in the forward kernel; EDGES as in _softmax_bwd_row_kernel. CLUSTER: the
    # n_splits programs of a row are one cluster of the launch, program id order, and meet at its barrier
    # (sync_ptr unused); the partials are read past L1, where no stale copy can sit.
    if CLUSTER:
        ticket = tl.program_id(0)
    else:
        ticket = _take_ticket(sync_ptr)
    row = ticket // n_splits
    part = ticket % n_splits
    row64 = row.to(tl.int64)
    if EDGES:
        y_start, head, n_main = _row_cut(row64, y_row_stride, n_cols, VEC)
        y_row = y_ptr + tl.multiple_of(y_start + head, VEC)
        dy_row = dy_ptr + tl.multiple_of(row64 * dy_row_stride + head, VEC)
        dx_row = dx_ptr + tl.multiple_of(row64 * dx_row_stride + head, VEC)
    else:
        n_main = n_cols
        y_row = y_ptr + row64 * y_row_stride
        dy_row = dy_ptr + row64 * dy_row_stride
        dx_row = dx_ptr + row64 * dx_row_stride
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_main
    y = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    partial = tl.sum(y * dy, axis=0)
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        edge_in = edge_in & (part == 0)
        y_edge = tl.load(y_row + edge, mask=edge_in, other=0.0).to(tl.float32)
        dy_edge = tl.load(dy_row + edge, mask=edge_in, other=0.0).to(tl.float32)
        partial += tl.sum(y_edge * dy_edge, axis=0)
    tl.store(part_dot_ptr + ticket, partial)
    if CLUSTER:
        parts = row * n_splits + _cluster_barrier(ticket) + tl.arange(0, SPLITS_POW2)
        in_row = tl.arange(0, SPLITS_POW2) < n_splits
        dot = tl.sum(tl.load(part_dot_ptr + parts, mask=in_row, other=0.0, cache_modifier=".cg"), axis=0)
    else:
        _arrive_and_wait(sync_ptr + 1 + row, n_splits)
        parts = row * n_splits + tl.arange(0, SPLITS_POW2)
        in_row = tl.arange(0, SPLITS_POW2) < n_splits
        dot = tl.sum(tl.load(part_dot_ptr + parts, mask=in_row, other=0.0, volatile=True), axis=0)
    tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
    if EDGES:
        tl.store(dx_row + edge, (y_edge * (dy_edge - dot)).to(dx_ptr.dtype.element_ty), mask=edge_in)
