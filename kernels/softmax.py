"""Row softmax, forward and backward, in three schedules.

    y = softmax(x),  y_j = exp(x_j - m) / d,  m = max_k x_k,  d = sum_k exp(x_k - m)
    dx = y * (dy - dot),  dot = <dy, y> = sum_k dy_k * y_k

Schedules, with the DRAM bytes each moves for an M x N input of `size`-byte elements:

* single-block: a whole row (or several short rows) lives in registers, as one power-of-two block of lanes
  or, just past a power of two, as a head and a small tail (single_block_lanes). Forward reads x once and
  writes y once: 2*M*N*size. Backward reads y and dy once and writes dx once: 3*M*N*size. Rows longer than
  MAX_SINGLE_BLOCK_N are refused: the registers spill long before that.
* split-row: a long row is cut into slices held in the registers of cooperating programs, which merge
  their (m, d) pairs through global memory: 2*M*N*size forward, 3*M*N*size backward, like single-block, for
  rows too long for one program. GPU only (the programs wait for each other; the interpreter runs one
  program at a time).
* online: tiles of BLOCK_N columns. Pass 1 carries the running max and normaliser (m, d) through the row
  (the online-softmax recurrence), pass 2 reads x again and writes y: 3*M*N*size, any N. The backward pass
  reads y and dy twice (once for dot, once for dx): 5*M*N*size.

`impl="auto"` takes single-block up to a row length set per direction and dtype, and split-row beyond it
(online under the interpreter, or past MAX_SPLITS slices); AUTO_SINGLE_BLOCK_MAX_N records the measurements
behind those thresholds. `impl="single_block"` and `impl="online"` force a schedule. The maths is written up in
docs/posts (the softmax, its gradient and the online softmax posts); what each setting was measured against
is in notes/softmax-speed.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype, interpreter_enabled, normalize_dim

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
IMPLS = ("auto", "single_block", "online")


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


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
def _softmax_fwd_row_kernel(
    x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROW_OFFSET_64: tl.constexpr,
):
    # The single-block forward for plans of one row per program: the same head and tail lanes and bytes as
    # _softmax_fwd_single_block_kernel, written on 1-D blocks. Its [1, BLOCK_N] form measured 0.1-2.3 points
    # of the copy ceiling slower (fp32, 4096 rows of 2304-12672, H100, probe rounds 8 and 9). Row offsets
    # are 32-bit unless some element lies 2^31 or more past its tensor's start (ROW_OFFSET_64): the 32-bit
    # form measured up to 0.9 points faster (probe round 8).
    row = tl.program_id(0)
    if ROW_OFFSET_64:
        row = row.to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        x_tail = tl.load(x_row + tail_cols, mask=tail_cols < n_cols, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_tail, axis=0))
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    if TAIL_N > 0:
        e_tail = tl.exp(x_tail - m)
        d += tl.sum(e_tail, axis=0)
    inv_d = 1.0 / d
    tl.store(y_row + cols, (e * inv_d).to(y_ptr.dtype.element_ty), mask=cols < n_cols)
    if TAIL_N > 0:
        tl.store(y_row + tail_cols, (e_tail * inv_d).to(y_ptr.dtype.element_ty), mask=tail_cols < n_cols)


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


@triton.jit
def _wait_for_row(counter_ptr, arrived, n_splits):
    # Spin (acquire) until all n_splits slices of the row have arrived. A nanosleep back-off between polls
    # measured within noise of the plain spin (notes/softmax-speed.md, probe 5), so the spin stays plain.
    while arrived < n_splits:
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire")
    return arrived


@triton.jit
def _softmax_fwd_split_row_kernel(
    x_ptr, y_ptr, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    # A row is cut into n_splits slices, one per program, each held in registers: x is read once and y
    # written once (2*M*N*size bytes) however long the row. The programs of a row meet once, through
    # global memory, to merge their (m, d) pairs with the online-softmax rule.
    # Work is taken in arrival order (a ticket from sync_ptr[0]), never by program id: every earlier ticket
    # belongs to a program already running, so a row's slices are all running or done before its last slice
    # waits, and the wait ends as long as n_splits programs fit on the GPU at once (MAX_SPLITS). The
    # interpreter runs programs one at a time and never gets this schedule.
    ticket = tl.atomic_add(sync_ptr, 1)
    row = ticket // n_splits
    part = ticket % n_splits
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp(x - m_safe)
    tl.store(part_m_ptr + ticket, m)
    tl.store(part_d_ptr + ticket, tl.sum(e, axis=0))
    # Release our partials, then wait (acquire) until every slice of the row has released its own.
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="acq_rel") + 1
    arrived = _wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    pm = tl.load(part_m_ptr + parts, mask=in_row, other=-float("inf"), volatile=True)
    pd = tl.load(part_d_ptr + parts, mask=in_row, other=0.0, volatile=True)
    m_row = tl.max(pm, axis=0)
    # Slices of only -inf hold d = 0; a row of only -inf gives d_row = NaN, as torch does.
    d_row = tl.sum(tl.where(pm == -float("inf"), 0.0, pd * tl.exp(pm - m_row)), axis=0)
    d_row = tl.where(m_row == -float("inf"), float("nan"), d_row)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m_safe - m_row)) / d_row
    tl.store(y_ptr + row.to(tl.int64) * y_row_stride + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_split_row_kernel(
    y_ptr, dy_ptr, dx_ptr, part_dot_ptr, sync_ptr, n_cols, n_splits, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    # The backward of the split-row schedule: each program holds a slice of y and dy, the programs of a row
    # add their partial dots through global memory, then each writes its slice of dx: 3*M*N*size bytes.
    # Tickets and the wait as in the forward kernel.
    ticket = tl.atomic_add(sync_ptr, 1)
    row = ticket // n_splits
    part = ticket % n_splits
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    row64 = row.to(tl.int64)
    y = tl.load(y_ptr + row64 * y_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row64 * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(part_dot_ptr + ticket, tl.sum(y * dy, axis=0))
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="acq_rel") + 1
    arrived = _wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    dot = tl.sum(tl.load(part_dot_ptr + parts, mask=in_row, other=0.0, volatile=True), axis=0)
    dx = y * (dy - dot)
    tl.store(dx_ptr + row64 * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------
# Launch plan: pure functions of the shape and dtype, tested on both sides of every threshold
# --------------------------------------------------------------------------------------------------------

# Longest row the single-block schedule accepts: a 131,072-element fp32 row already spills registers, and
# the compiler refuses larger blocks.
MAX_SINGLE_BLOCK_N = 131072

# impl="auto": single-block up to and including this N, by direction and dtype; above it split-row on a GPU,
# online under the interpreter. Forward, measured on an NVIDIA H200 (132 SMs, copy ceiling 4.2 TB/s),
# M*N = 2^28, L2 flushed (notes/softmax-speed.md, probe 1): at N = 32,768 single-block 98% of the ceiling
# against split-row's 90% (fp32) and 76% against 71% (bf16); at N = 65,536 single-block 72% against 89%
# (fp32), 66% against 72% (bf16). Backward, measured on an H100 (rounds 6 and 7, twice): at N = 32,768 an
# fp32 row is two 128 KiB tensors, and single-block reached 95% of the ceiling against split-row's 102%;
# in bf16 single-block held 100% against 92%. The records of experiments `softmax-long-rows` and
# `softmax-bwd-long-rows` show the resulting dispatch against every peer.
AUTO_SINGLE_BLOCK_MAX_N = {
    "forward": {torch.float32: 32768, torch.float16: 32768, torch.bfloat16: 32768},
    "backward": {torch.float32: 16384, torch.float16: 32768, torch.bfloat16: 32768},
}

# Single-block settings, by padded row length: (largest BLOCK_N, num_warps). Larger rows need more warps
# to keep the per-thread register footprint near 16-64 elements. Measured on the H200 (notes/softmax-speed.md):
# 2k-element rows run at 99% with 4 warps and 87% with 8 (bf16); rows of up to 1024 lanes a program run
# best on 2 warps (probe 5); the backward at 32k holds two tensors a row and prefers 16 warps (99% against
# 75% with 32, fp32). The backward of one 1024-lane row a program runs on one warp: at M = 4096, fp32,
# N = 640-1024 it measured 2-4 points above two warps, twice; at M = 32,768 and 262,144 within half a point
# (H100, rounds 6 and 7). Rows of 512 lanes and fewer, two or more a program, measured 1 point lower on one.
_SINGLE_BLOCK_WARPS = {
    "forward": ((1024, 2), (2048, 4), (4096, 8), (16384, 16), (MAX_SINGLE_BLOCK_N, 32)),
    "backward": ((512, 2), (1024, 1), (2048, 4), (4096, 8), (32768, 16), (MAX_SINGLE_BLOCK_N, 32)),
}
# Rows held as head + tail lanes take their warps from the head, in both directions (probes 5 and 6, fp32
# at M = 4096: 4 warps for a 4096 head, 8 for 8192; 16 warps on head + tail cost 10-30 points).
_TAIL_WARPS = {4096: 4, 8192: 8, 16384: 16, 32768: 32, 65536: 32}
# Short rows share a program up to this many lanes (probe 5, M = 32,768: 4 rows of 256, 2 of 512, 1 of
# 1024, on 2 warps, are within a point or two of the best of 64 variants in both dtypes and directions).
_LANES_PER_PROGRAM = 1024
# ...except rows of at most this many lanes, by element size, whose programs run on one warp: fp32 rows of
# 128 at M = 32,768 measured 74% of the ceiling on one warp against 68% on two (H100, probe round 5, twice);
# bf16 rows of 128 measured a point lower on one warp, so 2-byte rows keep two.
_ONE_WARP_MAX_N = {4: 128}
_MIN_BLOCK_N = 16
# Rows at least this long are held as a power-of-two head plus a power-of-two tail when the tail is at most
# _TAIL_MAX_LANES[head] lanes, or 1/_TAIL_MAX_FRACTION of a head not in the table (single_block_lanes).
# Measured at M = 4096, fp32: a 4096 head gains 1-5 points with tails of 128 (H200, H100), 256 (H100) and
# 512 lanes (H100: 97% at N = 4608 against 96% for one 8192-lane block); an 8192 head is level with one
# 16384-lane block at a 128-lane tail and 1.5-2 points behind it at 256 and 512 (H100 and H200). Heads of
# 2048 gained nothing; longer heads are unmeasured and keep the 1/16 rule.
_TAIL_MIN_N = 4096
_TAIL_MAX_LANES = {4096: 512, 8192: 128}
_TAIL_MAX_FRACTION = 16

# Online settings: tile width by element size (bytes); one tile is 16 KiB of input per program.
_ONLINE_BLOCK_N = {4: 4096, 2: 8192}
_ONLINE_WARPS = 8

# Split-row settings by element size: (slice width BLOCK_N, num_warps). A row needs all its slices resident
# at once, so the number of slices is capped far below what one wave of 132 SMs holds.
_SPLIT_ROW_SETTINGS = {"forward": {4: (8192, 4), 2: (8192, 4)}, "backward": {4: (8192, 8), 2: (8192, 8)}}
DIRECTIONS = ("forward", "backward")
MAX_SPLITS = 64


@dataclass(frozen=True)
class SoftmaxPlan:
    """How one launch is laid out. Recorded next to every timing the lab takes."""

    impl: str  # "single_block", "online" or "split_row"
    block_n: int
    rows_per_program: int
    num_warps: int
    grid: int  # programs launched
    splits: int = 1  # programs per row (split_row only)
    tail_n: int = 0  # lanes of a row past the first block_n (single_block only; 0: none)

    def as_dict(self) -> dict:
        return asdict(self)


def choose_impl(
    n_cols: int, dtype: torch.dtype, allow_split_row: bool | None = None, direction: str = "forward"
) -> str:
    """The schedule impl="auto" runs for rows of `n_cols` elements of `dtype` in `direction`.

    allow_split_row: whether programs may wait for each other; None means "unless Triton's interpreter
    runs the kernels" (it runs one program at a time, so such a wait would never end).
    """
    if allow_split_row is None:
        allow_split_row = not interpreter_enabled()
    if n_cols <= AUTO_SINGLE_BLOCK_MAX_N[direction][dtype]:
        return "single_block"
    if allow_split_row and _split_row_count(n_cols, dtype) <= MAX_SPLITS:
        return "split_row"
    return "online"


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _split_row_count(n_cols: int, dtype: torch.dtype) -> int:
    # Both directions cut rows into slices of the same width, so forward and backward dispatch alike.
    return triton.cdiv(n_cols, _SPLIT_ROW_SETTINGS["forward"][_element_size(dtype)][0])


def single_block_lanes(n_cols: int) -> tuple[int, int]:
    """(head, tail) lanes of a single-block row: a row of N = 4224 takes 4096 + 128 lanes where one
    power-of-two block would take 8192. The head is the largest power of two below N, the tail the smallest
    power of two (at least _MIN_BLOCK_N) that covers the rest. Rows that are a power of two, shorter than
    _TAIL_MIN_N, or whose tail would exceed the head's limit (_TAIL_MAX_LANES, else head / _TAIL_MAX_FRACTION)
    take one block: (next power of two, 0)."""
    padded = max(_MIN_BLOCK_N, triton.next_power_of_2(n_cols))
    head = padded // 2
    tail = max(_MIN_BLOCK_N, triton.next_power_of_2(n_cols - head)) if n_cols > head else 0
    max_tail = _TAIL_MAX_LANES.get(head, head // _TAIL_MAX_FRACTION)
    if padded == n_cols or n_cols < _TAIL_MIN_N or tail > max_tail:
        return padded, 0
    return head, tail


def plan_softmax(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype,
    impl: str = "auto",
    allow_split_row: bool | None = None,
    direction: str = "forward",
) -> SoftmaxPlan:
    """Launch plan for a row softmax over an n_rows x n_cols matrix; `direction` is "forward" or "backward"."""
    if impl not in IMPLS:
        raise ValueError(f"softmax: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    if direction not in DIRECTIONS:
        raise ValueError(f"softmax: direction must be 'forward' or 'backward', got {direction!r}.")
    if impl == "auto":
        impl = choose_impl(n_cols, dtype, allow_split_row, direction)
    if impl == "single_block":
        padded = max(_MIN_BLOCK_N, triton.next_power_of_2(n_cols))
        if padded > MAX_SINGLE_BLOCK_N:
            raise ValueError(
                f"softmax: impl='single_block' holds a row in registers and accepts N <= {MAX_SINGLE_BLOCK_N}, "
                f"got N = {n_cols}; use impl='online' or impl='auto'."
            )
        block_n, tail_n = single_block_lanes(n_cols)
        if tail_n:
            num_warps = _TAIL_WARPS[block_n]
        elif block_n <= _ONE_WARP_MAX_N.get(_element_size(dtype), 0):
            num_warps = 1
        else:
            num_warps = next(w for limit, w in _SINGLE_BLOCK_WARPS[direction] if block_n <= limit)
        rows = max(1, _LANES_PER_PROGRAM // (block_n + tail_n))  # block_n alone is a power of two here
        return SoftmaxPlan("single_block", block_n, rows, num_warps, triton.cdiv(n_rows, rows), tail_n=tail_n)
    if impl == "split_row":
        block_n, num_warps = _SPLIT_ROW_SETTINGS[direction][_element_size(dtype)]
        splits = triton.cdiv(n_cols, block_n)
        return SoftmaxPlan("split_row", block_n, 1, num_warps, n_rows * splits, splits)
    block_n = min(_ONLINE_BLOCK_N[_element_size(dtype)], max(_MIN_BLOCK_N, triton.next_power_of_2(n_cols)))
    return SoftmaxPlan("online", block_n, 1, _ONLINE_WARPS, n_rows)


# --------------------------------------------------------------------------------------------------------
# Launchers (2-D, rows contiguous in their last dimension)
# --------------------------------------------------------------------------------------------------------


def _launch_split_row(kernel, plan: SoftmaxPlan, args: tuple) -> None:
    kernel[(plan.grid,)](
        *args, BLOCK_N=plan.block_n, SPLITS_POW2=triton.next_power_of_2(plan.splits), num_warps=plan.num_warps,
    )


def _split_row_sync(n_rows: int, device: torch.device) -> torch.Tensor:
    """Zeroed per launch: the ticket counter, then one arrival counter per row."""
    return torch.zeros(1 + n_rows, dtype=torch.int32, device=device)


def _row_offsets_fit_int32(*matrices: torch.Tensor) -> bool:
    """Whether every element of these row-major matrices lies less than 2^31 elements past its start."""
    return all((t.shape[0] - 1) * t.stride(0) + t.shape[1] <= 2**31 for t in matrices)


def softmax_fwd(x: torch.Tensor, plan: SoftmaxPlan, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = softmax(x) along dim 1 of a 2-D tensor whose rows are contiguous; written into `out` if given."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if out is None else out
    if plan.impl == "single_block" and plan.rows_per_program == 1:
        _softmax_fwd_row_kernel[(plan.grid,)](
            x, y, n_cols, x.stride(0), y.stride(0), BLOCK_N=plan.block_n, TAIL_N=plan.tail_n,
            ROW_OFFSET_64=not _row_offsets_fit_int32(x, y), num_warps=plan.num_warps,
        )
    elif plan.impl == "single_block":
        _softmax_fwd_single_block_kernel[(plan.grid,)](
            x, y, n_rows, n_cols, x.stride(0), y.stride(0),
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROWS_PER_PROGRAM=plan.rows_per_program,
            num_warps=plan.num_warps,
        )
    elif plan.impl == "split_row":
        part_m, part_d = torch.empty((2, n_rows * plan.splits), dtype=torch.float32, device=x.device)
        args = (x, y, part_m, part_d, _split_row_sync(n_rows, x.device), n_cols, plan.splits, x.stride(0), y.stride(0))
        _launch_split_row(_softmax_fwd_split_row_kernel, plan, args)
    else:
        _softmax_fwd_online_kernel[(plan.grid,)](
            x, y, n_cols, x.stride(0), y.stride(0), BLOCK_N=plan.block_n, num_warps=plan.num_warps,
        )
    return y


def softmax_bwd(
    y: torch.Tensor, dy: torch.Tensor, plan: SoftmaxPlan, out: torch.Tensor | None = None
) -> torch.Tensor:
    """dx = y * (dy - <dy, y>) along dim 1 of 2-D tensors whose rows are contiguous; into `out` if given."""
    n_rows, n_cols = y.shape
    dx = torch.empty((n_rows, n_cols), dtype=y.dtype, device=y.device) if out is None else out
    if plan.impl == "single_block":
        _softmax_bwd_single_block_kernel[(plan.grid,)](
            y, dy, dx, n_rows, n_cols, y.stride(0), dy.stride(0), dx.stride(0),
            BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROWS_PER_PROGRAM=plan.rows_per_program,
            num_warps=plan.num_warps,
        )
    elif plan.impl == "split_row":
        part_dot = torch.empty(n_rows * plan.splits, dtype=torch.float32, device=y.device)
        sync = _split_row_sync(n_rows, y.device)
        args = (y, dy, dx, part_dot, sync, n_cols, plan.splits, y.stride(0), dy.stride(0), dx.stride(0))
        _launch_split_row(_softmax_bwd_split_row_kernel, plan, args)
    else:
        _softmax_bwd_online_kernel[(plan.grid,)](
            y, dy, dx, n_cols, y.stride(0), dy.stride(0), dx.stride(0),
            BLOCK_N=plan.block_n, num_warps=plan.num_warps,
        )
    return dx


def _as_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """View (or, when no view exists, copy) `t` as a 2-D matrix whose rows run along `dim`, unit stride."""
    rows = t.movedim(dim, -1).reshape(-1, t.shape[dim])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _from_rows(rows: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    moved_shape = like.movedim(dim, -1).shape
    return rows.view(moved_shape).movedim(-1, dim)


# --------------------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------------------


class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, impl: str) -> torch.Tensor:
        x_rows = _as_rows(x, dim)
        plan = plan_softmax(x_rows.shape[0], x_rows.shape[1], x.dtype, impl)
        y_rows = softmax_fwd(x_rows, plan)
        ctx.save_for_backward(y_rows)
        ctx.impl = impl
        ctx.dim = dim
        return _from_rows(y_rows, x, dim)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        (y_rows,) = ctx.saved_tensors
        dy_rows = _as_rows(dy.to(y_rows.dtype), ctx.dim)
        plan = plan_softmax(y_rows.shape[0], y_rows.shape[1], y_rows.dtype, ctx.impl, direction="backward")
        dx_rows = softmax_bwd(y_rows, dy_rows, plan)
        return _from_rows(dx_rows, dy, ctx.dim), None, None


def softmax(x: torch.Tensor, dim: int = -1, *, impl: str = "auto") -> torch.Tensor:
    """Softmax of `x` along `dim`, differentiable; same shape and dtype as `x`.

    x: any shape and strides, dtype float32, float16 or bfloat16, on CUDA (or on the CPU with
    TRITON_INTERPRET=1). impl: "auto" (pick by row length and dtype), "single_block" or "online".
    Special values follow torch.softmax: -inf entries give 0; a row that is all -inf, or holds NaN or +inf,
    gives NaN. Math in fp32 whatever the input dtype.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax: x must be a torch.Tensor, got {type(x).__name__}.")
    check_dtype("softmax", "x", x, SUPPORTED_DTYPES)
    if impl not in IMPLS:
        raise ValueError(f"softmax: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    dim = normalize_dim("softmax", dim, x.dim())
    check_device("softmax", x)
    if x.dim() == 0:
        return softmax(x.reshape(1), 0, impl=impl).reshape(())
    if x.numel() == 0:
        return x.clone()  # nothing to compute; clone keeps autograd's graph without a launch
    return SoftmaxFunction.apply(x, dim, impl)
