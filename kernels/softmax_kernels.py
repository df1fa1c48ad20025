"""Row softmax kernels, forward and backward, in three schedules (the device code of kernels/softmax.py).

    y = softmax(x),  y_j = exp(x_j - m) / d,  m = max_k x_k,  d = sum_k exp(x_k - m)
    dx = y * (dy - dot),  dot = <dy, y> = sum_k dy_k * y_k

Schedules, with the DRAM bytes each moves for an M x N input of `size`-byte elements:

* single-block: a whole row (or several short rows) lives in registers, as one power-of-two block of lanes
  or, just past a power of two, as a head and a small tail (single_block_lanes). Forward reads x once and
  writes y once: 2*M*N*size. Backward reads y and dy once and writes dx once: 3*M*N*size. Rows longer than
  MAX_SINGLE_BLOCK_N are refused: the registers spill long before that. Plans with `stages` > 1 run it on a
  persistent grid whose programs walk rows with the next rows' loads in flight (same bytes).
* split-row (kernels/softmax_split_row_kernels.py): a long row is cut into slices held in the registers of
  cooperating programs, which merge their (m, d) pairs through global memory: 2*M*N*size forward,
  3*M*N*size backward, like single-block, for rows too long for one program. GPU only.
* online: tiles of BLOCK_N columns. Pass 1 carries the running max and normaliser (m, d) through the row
  (the online-softmax recurrence), pass 2 reads x again and writes y: 3*M*N*size, any N. The backward pass
  reads y and dy twice (once for dot, once for dx): 5*M*N*size.

Which schedule runs, with which block sizes and warps, is the plan's (kernels/softmax_plan.py); how each
launch gets its arguments is kernels/softmax.py's. The maths is written up in docs/posts (the softmax, its
gradient and the online softmax posts); what each setting was measured against is in notes/softmax-speed.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def _softmax_fwd_single_block_kernel(
    x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
):
    # One program owns ROWS_PER_PROGRAM whole rows: x is read once, y written once (2*M*N*size bytes).
    # A row is held as a head of BLOCK_N lanes and, when TAIL_N > 0, a tail of TAIL_N lanes after it (both
    # powers of two), so a 4224-element row takes 4096 + 128 lanes rather than 8192.
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_in = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = row_in[:, None] & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows64[:, None] * x_row_stride + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=1)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        tail_mask = row_in[:, None] & (tail_cols[None, :] < n_cols)
        x_tail = tl.load(x_ptr + rows64[:, None] * x_row_stride + tail_cols[None, :], mask=tail_mask,
                         other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_tail, axis=1))
    e = tl.exp(x - m[:, None])
    d = tl.sum(e, axis=1)
    if TAIL_N > 0:
        e_tail = tl.exp(x_tail - m[:, None])
        d += tl.sum(e_tail, axis=1)
    inv_d = (1.0 / d)[:, None]
    tl.store(y_ptr + rows64[:, None] * y_row_stride + cols[None, :], (e * inv_d).to(y_ptr.dtype.element_ty), mask=mask)
    if TAIL_N > 0:
        tl.store(y_ptr + rows64[:, None] * y_row_stride + tail_cols[None, :],
                 (e_tail * inv_d).to(y_ptr.dtype.element_ty), mask=tail_mask)


@triton.jit
def _row_cut(row, row_stride, n_cols, VEC: tl.constexpr):
    # Where a row is cut at 16-byte boundaries (VEC elements): the row's element offset, the `head` elements
    # before its first boundary and the `n_body` after it that fill whole vectors; the last
    # n_cols - head - n_body elements are its tail. The offset of the body and n_body are multiples of VEC,
    # hinted so, which lets the compiler load the body as 16-byte vectors under its mask. Rows whose length or
    # stride is not a multiple of 16 elements are loaded element by element without the cut.
    start = row * row_stride
    head = tl.minimum((VEC - start % VEC) % VEC, n_cols)
    n_body = tl.multiple_of((n_cols - head) // VEC * VEC, VEC)
    return start, head, n_body


@triton.jit
def _edge_offsets(head, n_body, n_cols, VEC: tl.constexpr):
    # The head and tail of a cut row (fewer than VEC elements each) as one block of 2*VEC lanes, by offset
    # from the body's start: lanes 0..VEC-1 hold offsets -VEC..-1 (the head), lanes VEC.. the elements past
    # the body. Returns (offsets, mask).
    k = tl.arange(0, 2 * VEC)
    offs = tl.where(k < VEC, k - VEC, n_body + k - VEC)
    return offs, tl.where(k < VEC, offs >= -head, offs < n_cols - head)


@triton.jit
def _softmax_fwd_row(
    x_ptr, y_ptr, row, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, EDGES: tl.constexpr, Y_ALIGNED: tl.constexpr, VEC: tl.constexpr,
):
    # One row of the single-block forward, for plans of one row a program: the same head and tail lanes and
    # bytes as _softmax_fwd_single_block_kernel, written on 1-D blocks. Its [1, BLOCK_N] form measured 0.1-2.3
    # points of the copy ceiling slower (fp32, 4096 rows of 2304-12672, H100, probe rounds 8 and 9).
    # EDGES: the row is cut at 16-byte boundaries (_row_cut): the lanes hold its aligned body, a block of
    # 2*VEC lanes its head and tail. Y_ALIGNED: y's rows start at the same offset from a 16-byte boundary as
    # x's, so y's body is stored as vectors too.
    if EDGES:
        x_start, head, n_main = _row_cut(row, x_row_stride, n_cols, VEC)
        x_row = x_ptr + tl.multiple_of(x_start + head, VEC)
        if Y_ALIGNED:
            y_row = y_ptr + tl.multiple_of(row * y_row_stride + head, VEC)
        else:
            y_row = y_ptr + row * y_row_stride + head
    else:
        n_main = n_cols
        x_row = x_ptr + row * x_row_stride
        y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_row + cols, mask=cols < n_main, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        x_tail = tl.load(x_row + tail_cols, mask=tail_cols < n_main, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_tail, axis=0))
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        x_edge = tl.load(x_row + edge, mask=edge_in, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_edge, axis=0))
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    if TAIL_N > 0:
        e_tail = tl.exp(x_tail - m)
        d += tl.sum(e_tail, axis=0)
    if EDGES:
        e_edge = tl.exp(x_edge - m)
        d += tl.sum(e_edge, axis=0)
    inv_d = 1.0 / d
    tl.store(y_row + cols, (e * inv_d).to(y_ptr.dtype.element_ty), mask=cols < n_main)
    if TAIL_N > 0:
        tl.store(y_row + tail_cols, (e_tail * inv_d).to(y_ptr.dtype.element_ty), mask=tail_cols < n_main)
    if EDGES:
        tl.store(y_row + edge, (e_edge * inv_d).to(y_ptr.dtype.element_ty), mask=edge_in)


@triton.jit
def _softmax_fwd_row_kernel(
    x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROW_OFFSET_64: tl.constexpr,
    EDGES: tl.constexpr, Y_ALIGNED: tl.constexpr, VEC: tl.constexpr,
):
    # The single-block forward, one row a program (_softmax_fwd_row). Row offsets are 32-bit unless some
    # element lies 2^31 or more past its tensor's start (ROW_OFFSET_64): the 32-bit form measured up to 0.9
    # points faster (probe round 8).
    row = tl.program_id(0)
    if ROW_OFFSET_64:
        row = row.to(tl.int64)
    _softmax_fwd_row(x_ptr, y_ptr, row, n_cols, x_row_stride, y_row_stride, BLOCK_N, TAIL_N, EDGES, Y_ALIGNED, VEC)


@triton.jit
def _softmax_fwd_rows_pipelined_kernel(
    x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROW_OFFSET_64: tl.constexpr,
    EDGES: tl.constexpr, Y_ALIGNED: tl.constexpr, VEC: tl.constexpr, STAGES: tl.constexpr,
):
    # The single-block forward on a persistent grid: each program walks rows pid, pid + programs, ... and the
    # compiler's software pipeline (STAGES) copies the next rows into shared memory while the program reduces
    # and stores the current one. A one-row program has no load in flight between its load and its store;
    # for 2-byte rows of 16k-24k lanes only two or three such programs fit an SM, too few to keep DRAM busy.
    for i in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        row = i
        if ROW_OFFSET_64:
            row = i.to(tl.int64)
        _softmax_fwd_row(x_ptr, y_ptr, row, n_cols, x_row_stride, y_row_stride, BLOCK_N, TAIL_N, EDGES,
                         Y_ALIGNED, VEC)


@triton.jit
def _softmax_fwd_online_kernel(
    x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr,
):
    # Pass 1 reads the row once and keeps one (m, d) pair per lane, merged at the end; pass 2 reads it again
    # and writes y: 3*M*N*size bytes. Lanes that have seen only -inf keep d = 0 (m_safe avoids -inf - -inf).
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    offs = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N], -float("inf"), tl.float32)
    d = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        d = d * tl.exp(m - m_safe) + tl.exp(x - m_safe)
        m = m_new
    m_row = tl.max(m, axis=0)
    # A row of only -inf gives m_row = -inf and d_row = NaN (0 * exp(NaN)), the value torch returns.
    d_row = tl.sum(d * tl.exp(m - m_row), axis=0)
    inv_d = 1.0 / d_row
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m_row) * inv_d
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _softmax_bwd_single_block_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
):
    # Reads y and dy once, writes dx once: 3*M*N*size bytes. Head and tail lanes as in the forward kernel.
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_in = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = row_in[:, None] & (cols[None, :] < n_cols)
    y = tl.load(y_ptr + rows64[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + rows64[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        tail_mask = row_in[:, None] & (tail_cols[None, :] < n_cols)
        y_tail = tl.load(y_ptr + rows64[:, None] * y_row_stride + tail_cols[None, :], mask=tail_mask,
                         other=0.0).to(tl.float32)
        dy_tail = tl.load(dy_ptr + rows64[:, None] * dy_row_stride + tail_cols[None, :], mask=tail_mask,
                          other=0.0).to(tl.float32)
        dot += tl.sum(y_tail * dy_tail, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(dx_ptr + rows64[:, None] * dx_row_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if TAIL_N > 0:
        dx_tail = y_tail * (dy_tail - dot[:, None])
        tl.store(dx_ptr + rows64[:, None] * dx_row_stride + tail_cols[None, :],
                 dx_tail.to(dx_ptr.dtype.element_ty), mask=tail_mask)


@triton.jit
def _softmax_bwd_row(
    y_ptr, dy_ptr, dx_ptr, row, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, EDGES: tl.constexpr, VEC: tl.constexpr,
    RELOAD: tl.constexpr = False,
):
    # One row of the single-block backward on 1-D blocks: 3*N*size bytes. EDGES cuts the row at 16-byte
    # boundaries as the forward row does; it is set only when y's, dy's and dx's rows all start at the same
    # offset from one, so one cut serves the three. RELOAD: the body's y and dy are not held across the
    # reduction but loaded again for dx, from L1/L2 (the first loads ask L2 to keep the lines, the second to
    # drop them), which frees their registers while the row is reduced; DRAM bytes stay 3*N*size.
    if EDGES:
        y_start, head, n_main = _row_cut(row, y_row_stride, n_cols, VEC)
        y_row = y_ptr + tl.multiple_of(y_start + head, VEC)
        dy_row = dy_ptr + tl.multiple_of(row * dy_row_stride + head, VEC)
        dx_row = dx_ptr + tl.multiple_of(row * dx_row_stride + head, VEC)
    else:
        n_main = n_cols
        y_row = y_ptr + row * y_row_stride
        dy_row = dy_ptr + row * dy_row_stride
        dx_row = dx_ptr + row * dx_row_stride
    cols = tl.arange(0, BLOCK_N)
    keep: tl.constexpr = "evict_last" if RELOAD else ""
    y = tl.load(y_row + cols, mask=cols < n_main, other=0.0, eviction_policy=keep).to(tl.float32)
    dy = tl.load(dy_row + cols, mask=cols < n_main, other=0.0, eviction_policy=keep).to(tl.float32)
    dot = tl.sum(y * dy, axis=0)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        y_tail = tl.load(y_row + tail_cols, mask=tail_cols < n_main, other=0.0).to(tl.float32)
        dy_tail = tl.load(dy_row + tail_cols, mask=tail_cols < n_main, other=0.0).to(tl.float32)
        dot += tl.sum(y_tail * dy_tail, axis=0)
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        y_edge = tl.load(y_row + edge, mask=edge_in, other=0.0).to(tl.float32)
        dy_edge = tl.load(dy_row + edge, mask=edge_in, other=0.0).to(tl.float32)
        dot += tl.sum(y_edge * dy_edge, axis=0)
    if RELOAD:
        y = tl.load(y_row + cols, mask=cols < n_main, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + cols, mask=cols < n_main, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=cols < n_main)
    if TAIL_N > 0:
        tl.store(dx_row + tail_cols, (y_tail * (dy_tail - dot)).to(dx_ptr.dtype.element_ty), mask=tail_cols < n_main)
    if EDGES:
        tl.store(dx_row + edge, (y_edge * (dy_edge - dot)).to(dx_ptr.dtype.element_ty), mask=edge_in)


@triton.jit
def _softmax_bwd_row_kernel(
    y_ptr, dy_ptr, dx_ptr, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROW_OFFSET_64: tl.constexpr,
    EDGES: tl.constexpr, VEC: tl.constexpr, RELOAD: tl.constexpr = False,
):
    # The single-block backward, one row a program (_softmax_bwd_row); offsets as in _softmax_fwd_row_kernel.
    row = tl.program_id(0)
    if ROW_OFFSET_64:
        row = row.to(tl.int64)
    _softmax_bwd_row(y_ptr, dy_ptr, dx_ptr, row, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
                     BLOCK_N, TAIL_N, EDGES, VEC, RELOAD)


@triton.jit
def _softmax_bwd_rows_pipelined_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROW_OFFSET_64: tl.constexpr,
    EDGES: tl.constexpr, VEC: tl.constexpr, STAGES: tl.constexpr,
):
    # The single-block backward on a persistent grid, the next rows' loads pipelined, as
    # _softmax_fwd_rows_pipelined_kernel does for the forward.
    for i in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        row = i
        if ROW_OFFSET_64:
            row = i.to(tl.int64)
        _softmax_bwd_row(y_ptr, dy_ptr, dx_ptr, row, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
                         BLOCK_N, TAIL_N, EDGES, VEC)


@triton.jit
def _softmax_bwd_online_kernel(
    y_ptr, dy_ptr, dx_ptr, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr,
):
    # Pass 1 reads y and dy for dot = <dy, y>; pass 2 reads them again and writes dx: 5*M*N*size bytes.
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * y_row_stride
    dy_row = dy_ptr + row * dy_row_stride
    dx_row = dx_ptr + row * dx_row_stride
    offs = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        y = tl.load(y_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += y * dy
    dot = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        y = tl.load(y_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        dx = y * (dy - dot)
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=cols < n_cols)
