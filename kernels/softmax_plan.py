"""Launch plans of the row softmax (kernels/softmax.py): pure functions of the row count, row length, dtype
and direction, with the measurements behind every threshold beside its table. Tested on both sides of
every threshold (tests/test_softmax.py); the chosen plan goes into every run record.

Plain Python integer arithmetic throughout (`_cdiv`, `_next_power_of_2`): triton.cdiv and
triton.next_power_of_2 are constexpr functions whose host-side calls cost microseconds each.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from kernels._checks import interpreter_enabled
from kernels._launch import clusters_supported

IMPLS = ("auto", "single_block", "online")


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
# ...except 2-byte rows, whose heads in _WIDE_TAIL_HEADS[direction] take tails of up to a quarter of the
# head, on the warps the table gives. A bf16 row moves half the bytes of an fp32 row of the same lanes, so the
# lanes a padded block wastes cost it twice. Forward: at N = 10,000 and 20,000 (H100, M*N*2 = 256 MiB,
# probes/softmax_any_n.py round 1) 8192 + 2048 lanes measured 94.8% of the copy ceiling against 87.3% for one
# 16,384-lane block, and 16,384 + 4096 lanes 84.6% against 70.6%; fp32 rows lost 0.6-0.7 points the same way,
# so they keep the rule. Backward (round 6, bf16 and fp16): a 4096 head with a 1024 tail measured 99.5-99.7%
# against 91.2-96.5% for one 8192 block at N = 4610 and 5000; longer heads were mixed (8192 + 4096 at 10,920:
# +3 points; 8192 + 2048 at 9512: -5) or lost (16,384 + 2048-8192 at 18,000-21,439: 14 to 19 points lower),
# so they keep fp32's rule.
# A 4096 head with a tail of up to 1024 lanes on 4 warps, forward (probes/softmax_any_n.py rounds 14 and 15,
# bf16 and fp16): 4610 85.4 -> 96.0% of the copy ceiling (fp16 86.2 -> 96.5), 4709 86.1 -> 96.4, 4993 88.3 ->
# 96.7, against one 8192-lane block on 16 warps, and 2-4 points above that block on 8.
_WIDE_TAIL_HEADS = {"forward": {4096: 4, 8192: 16, 16384: 16}, "backward": {4096: 4}}  # head -> num_warps
_WIDE_TAIL_FRACTION = 4

# ...and 2-byte forward rows held one a program in one padded block of 4096 or 8192 lanes run on half the
# table's warps while the row fills at most _HALF_WARPS_FILL of the block: a thread then holds 64 bytes of
# the row, as an fp32 thread of the table does. Measured on the H100 (rounds 15 and 16, M*N*2 = 256 MiB, at
# every 2-byte length of softmax-any-n's draw the rule covers, bf16 and fp16): 4096 lanes, 2057 85.5 -> 91.0%
# (fp16 88.0 -> 92.8), 2490 92.7 -> 97.2, 2661 94.8 -> 97.8, 2887 97.2 -> 97.6, 2904 98.3 -> 97.9 (fill 71%),
# 3057 97.9 -> 97.8; 8192 lanes, 5545 92.0 -> 97.0, 5829 93.7 -> 97.7, 6445 96.3 -> 97.8, 6569 96.7 -> 97.8
# (fill 80%). Fuller rows lost 0.1-1.3 points (3300-3767 and 6700-7500, both dtypes; the powers of two
# 0.2-0.3), and 2048-lane blocks were level or lower (-0.4 to +0.2 at 1333-2012), so they keep the table's.
_HALF_WARPS_LANES = (4096, 8192)
_HALF_WARPS_FILL = 3 / 4

# ...and 2-byte backward rows held as one 16,384-lane block (N = 8193-16,384 without a tail) reload y and dy
# for dx instead of holding them across the row's reduction (SoftmaxPlan.reload): 8 warps while the row fills
# at most two thirds of the block, 32 above. Measured on the H100 (probes/softmax_any_n.py round 10, M*N*2 =
# 256 MiB, bf16 unless named), against the held row on 16 warps: 9001 87.6 -> 100.2% of the copy ceiling;
# 9512 90.9 -> 99.9 (fp16 91.0 -> 100.2); 10,000 95.0 -> 98.5; 10,920 94.6 -> 99.5 (fp16 94.3 -> 98.9);
# 12,000 99.1 -> 101.0; 13,001 96.7 -> 99.5; 15,000 100.0 -> 100.3; 16,384 100.4 -> 100.9. On 8 warps the
# fuller rows lost (12,000: 96.7; 16,384: 89.4), on 32 the emptier ones (9512: 83.9). fp32 rows and rows with
# a tail gained nothing (within a point) and hold theirs.
_RELOAD_BLOCK_N = 16384
_RELOAD_WARPS = ((2 / 3, 8), (1.0, 32))  # (largest fill of the block, num_warps)

# ...and 2-byte forward rows whose lanes are a head of 16,384 plus a tail (N = 16,385-24,576), or an
# 8192 head plus a wide tail on a cut row, run on a persistent grid with their next rows' loads pipelined
# (SoftmaxPlan.stages, _softmax_fwd_rows_pipelined_kernel). One-row programs of that many lanes leave DRAM
# idle between a row's load and its store. Measured on the H100 (probes/softmax_any_n.py rounds 4 and 5,
# M*N*2 = 256 MiB, bf16 unless named; lengths of round 5 not chosen on): 17,523 76.0 -> 89.0% of the copy
# ceiling; 18,000 81.8 -> 88.3; 19,999 84.7 -> 88.1; 20,480 (M = 4096) 84.3 -> 89.7; 21,439 68.2 -> 75.8;
# 22,000 76.1 -> 88.7 (fp16 76.3 -> 88.6); 24,576 82.2 -> 91.9; 9512 74.8 -> 86.4; 10,039 76.6 -> 85.3.
# Where one-row programs already reach 88-98% (8192 heads with short tails, one 16,384-lane block) the
# persistent grid measured 1-12 points lower, and at 27,000-32,768 lanes (one 32,768 block) it was mixed
# (+5 at 27,000, -2 to -3 at 31,000 and 32,768): those keep one row a program. Warps: 8, and 16 for a tail
# of 8192 (8 warps measured 66% there, 16 warps 76-92%); three stages (four measured up to 13 points lower
# where the stages no longer leave two programs an SM); two programs an SM.
_PIPELINED_HEAD = 16384  # this head with a tail of _PIPELINED_MIN_TAIL up to half the head
_PIPELINED_CUT_HEAD = 8192  # this head, on cut rows only, with a tail of _PIPELINED_MIN_TAIL
_PIPELINED_MIN_TAIL = 2048  # shorter tails are unmeasured on the persistent grid and keep one row a program
_PIPELINED_WARPS = ((4096, 8), (8192, 16))  # (largest tail, warps)
_PIPELINED_STAGES = 3
_PIPELINED_PROGRAMS_PER_SM = 2

# Online settings: tile width by element size (bytes); one tile is 16 KiB of input per program.
_ONLINE_BLOCK_N = {4: 4096, 2: 8192}
_ONLINE_WARPS = 8

# Split-row settings by direction and element size: (slice width BLOCK_N, num_warps). A row needs all its
# slices resident at once, so the number of slices is capped far below what one wave of 132 SMs holds.
# The backward's, measured on the H100 with probes/softmax_any_n.py (M*N*size of 256 MiB-1 GiB, 21 pairs of
# length and dtype of 17,001-262,144, all three dtypes): slices of 8192 on 4 warps were within a point of the
# best of 4096-16,384 lanes on 2-16 warps at every pair (bf16 36,481: 81.8% of the copy ceiling against 82.7%
# on 4096 x 2), also where narrower slices hold the row in fewer lanes (fp32 17,001: 95.8% against 94.5% on
# 4096 x 4; bf16 200,001: 89.0% against 83.4%). On 8 warps they measured up to 14 points lower, level at
# 2-byte 100,000 and 131,072 (rounds 6 and 7).
_SPLIT_ROW_SETTINGS = {"forward": {4: (8192, 4), 2: (8192, 4)}, "backward": {4: (8192, 4), 2: (8192, 4)}}
# The forward's slices compile under a register cap (SoftmaxPlan.max_registers) by (element size, rows cut at
# 16-byte boundaries): the cap that fits one more program an SM. Compiled for sm_90 (probes/occupancy.py), the
# slice kernel takes 91 registers a thread in 2-byte rows (five programs of 4 warps an SM) and 105-107 in
# cut fp32 rows (four); capped at 80 and 96 six and five fit, a few bytes spilled. Measured on the H100
# (rounds 14-16, M*N*size >= 256 MiB, every split-row length of softmax-any-n's draw): 2-byte +1.6 to +5.5
# points of the copy ceiling at all 37 pairs of length and dtype and 3 powers of two (36,481 75.8 -> 79.8%;
# 65,536 81.2 -> 84.4; 262,144 80.9 -> 84.3); cut fp32 +1.3 to +3.8 at all 27 (41,187 89.6 -> 93.4).
# Tighter caps spill more and lost 5-20 points; fp32 rows needing no cut compile to 96 registers already and
# lost 0.2-1.5 under the cap.
_SPLIT_ROW_MAX_REGISTERS = {(2, False): 80, (2, True): 80, (4, True): 96}
# ...except 2-byte backward rows of at most _CLUSTER_MAX_SPLITS slices on a GPU with clusters (compute
# capability 9.0 and later), whose slices are one cluster of the launch and meet at its barrier instead of
# taking tickets and spinning on a counter (SoftmaxPlan.cluster), in slices of 4096 lanes while the row needs
# at most _CLUSTER_NARROW_MAX_SPLITS of them. Measured on the H100 (probes/softmax_any_n.py rounds 12 and 13,
# M*N*2 = 256 MiB, bf16 unless named), against the ticketed slices of 8192: 33,333 79.0 -> 90.0% of the copy
# ceiling (9 x 4096; 86.8 on 5 x 8192); 36,481 82.8 -> 91.8 (9 x 4096); 46,372 83.9 -> 92.1 (4096: 91.7);
# fp16 41,187 80.2 -> 90.4 (4096: 90.2); 53,341 85.0 -> 89.6; 62,058 86.2 -> 94.3; 65,536 89.3 -> 96.6;
# 74,105 85.8 -> 86.6; 75,459 85.2 -> 87.3 (fp16 75,029 86.1 -> 87.7); 97,994 88.8 -> 90.9; fp16 100,000
# 88.6 -> 89.2; 129,820 90.8 -> 93.4; 131,072 92.2 -> 94.9. One length lost: 108,894 (14 slices) 88.5 ->
# 87.1. Slices of 16,384 lanes measured 60-86%. fp32 rows (already at 99-101%) and the forward (+1 to +6
# points at 8 slices and fewer, mixed above) keep their tickets.
_CLUSTER_MAX_SPLITS = 16
_CLUSTER_NARROW_N, _CLUSTER_NARROW_MAX_SPLITS = 4096, 9
DIRECTIONS = ("forward", "backward")
MAX_SPLITS = 64

# Triton specialises an integer argument that is a multiple of 16 (n_cols, a row stride) and can then prove
# a masked row load aligned and load it as 16-byte vectors. Any other row length or stride would be loaded
# element by element, so such rows are cut at 16-byte boundaries instead (SoftmaxPlan.edges): an aligned body
# loaded as vectors, and a head and a tail of fewer than 16 bytes each. Schedules of one row per program
# (single-block at one row a program, split-row) take the cut; rows short enough to share a program do not.
_SPECIALISED_MULTIPLE = 16


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
    edges: bool = False  # rows cut at 16-byte boundaries: vector loads for the body, head and tail apart
    stages: int = 1  # >1: a persistent grid walks rows, the next rows' loads pipelined (single_block only)
    reload: bool = False  # backward, one row a program: y and dy loaded again for dx, not held (single_block)
    cluster: bool = False  # a row's slices are one cluster of the launch, meeting at its barrier (split_row)
    max_registers: int = 0  # >0: the kernel is compiled under this many registers a thread (maxnreg, split_row)

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
    return dtype.itemsize


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _split_row_count(n_cols: int, dtype: torch.dtype) -> int:
    # The forward's slices decide, so the forward and the backward of a row dispatch alike.
    return _cdiv(n_cols, _SPLIT_ROW_SETTINGS["forward"][_element_size(dtype)][0])


def single_block_lanes(n_cols: int, wide_heads: tuple[int, ...] = ()) -> tuple[int, int]:
    """(head, tail) lanes of a single-block row: a row of N = 4224 takes 4096 + 128 lanes where one
    power-of-two block would take 8192. The head is the largest power of two below N, the tail the smallest
    power of two (at least _MIN_BLOCK_N) that covers the rest. Rows that are a power of two, shorter than
    _TAIL_MIN_N, or whose tail would exceed the head's limit (_TAIL_MAX_LANES, else head / _TAIL_MAX_FRACTION;
    heads in `wide_heads` allow head / _WIDE_TAIL_FRACTION) take one block: (next power of two, 0)."""
    padded = max(_MIN_BLOCK_N, _next_power_of_2(n_cols))
    head = padded // 2
    tail = max(_MIN_BLOCK_N, _next_power_of_2(n_cols - head)) if n_cols > head else 0
    max_tail = _TAIL_MAX_LANES.get(head, head // _TAIL_MAX_FRACTION)
    if head in wide_heads:
        max_tail = head // _WIDE_TAIL_FRACTION
    if padded == n_cols or n_cols < _TAIL_MIN_N or tail > max_tail:
        return padded, 0
    return head, tail


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _cuda_clusters(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def device_clusters(device: torch.device | None = None) -> bool:
    """Whether kernels on a CUDA device (None: the current one) can launch in clusters (compute capability
    9.0 and later) with this Triton (kernels/_launch.py); False under Triton's interpreter or without CUDA."""
    if interpreter_enabled() or not clusters_supported() or not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return False
    return _cuda_clusters(torch.cuda.current_device() if device is None or device.index is None else device.index)


def device_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors of a CUDA device (None: the current one) that its kernels run on; 0 under
    Triton's interpreter or without CUDA, where no plan depends on them."""
    if interpreter_enabled() or not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return 0
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    return _cuda_sms(index)


def _pipelined_lanes(n_cols: int, block_n: int, tail_n: int, edges: bool) -> tuple[int, int] | None:
    """(head, tail) of a 2-byte forward row run on the pipelined persistent grid, or None to keep one row a
    program (the rule and its measurements: _PIPELINED_HEAD above)."""
    head = _next_power_of_2(n_cols) // 2
    tail = _next_power_of_2(n_cols - head)
    if head == _PIPELINED_HEAD and _PIPELINED_MIN_TAIL <= tail <= head // 2:
        return head, tail
    if edges and block_n == _PIPELINED_CUT_HEAD and tail_n >= _PIPELINED_MIN_TAIL:
        return block_n, tail_n
    return None


def plan_softmax(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype,
    impl: str = "auto",
    allow_split_row: bool | None = None,
    direction: str = "forward",
    row_stride: int | None = None,
    sms: int | None = None,
    clusters: bool | None = None,
) -> SoftmaxPlan:
    """Launch plan for a row softmax over an n_rows x n_cols matrix; `direction` is "forward" or "backward";
    `row_stride`: elements from one row's start to the next (None: n_cols, rows back to back); `sms`: the
    streaming multiprocessors the launch runs on (None: device_sms() of the current device; 0: no persistent
    grid); `clusters`: whether the launch may run in clusters (None: device_clusters() of the current device;
    a caller whose launcher cannot, such as a traced graph's, passes False)."""
    if impl not in IMPLS:
        raise ValueError(f"softmax: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    if direction not in DIRECTIONS:
        raise ValueError(f"softmax: direction must be 'forward' or 'backward', got {direction!r}.")
    if impl == "auto":
        impl = choose_impl(n_cols, dtype, allow_split_row, direction)
    stride = n_cols if row_stride is None else row_stride
    edges = n_cols % _SPECIALISED_MULTIPLE != 0 or stride % _SPECIALISED_MULTIPLE != 0
    if impl == "single_block":
        padded = max(_MIN_BLOCK_N, _next_power_of_2(n_cols))
        if padded > MAX_SINGLE_BLOCK_N:
            raise ValueError(
                f"softmax: impl='single_block' holds a row in registers and accepts N <= {MAX_SINGLE_BLOCK_N}, "
                f"got N = {n_cols}; use impl='online' or impl='auto'."
            )
        two_byte = _element_size(dtype) == 2
        wide_heads = _WIDE_TAIL_HEADS[direction] if two_byte else {}
        block_n, tail_n = single_block_lanes(n_cols, tuple(wide_heads))
        if tail_n and tail_n > _TAIL_MAX_LANES.get(block_n, block_n // _TAIL_MAX_FRACTION):
            num_warps = wide_heads[block_n]
        elif tail_n:
            num_warps = _TAIL_WARPS[block_n]
        elif block_n <= _ONE_WARP_MAX_N.get(_element_size(dtype), 0):
            num_warps = 1
        else:
            num_warps = next(w for limit, w in _SINGLE_BLOCK_WARPS[direction] if block_n <= limit)
        rows = max(1, _LANES_PER_PROGRAM // (block_n + tail_n))  # block_n alone is a power of two here
        if (direction == "forward" and two_byte and rows == 1 and not tail_n and block_n in _HALF_WARPS_LANES
                and n_cols <= _HALF_WARPS_FILL * block_n):
            num_warps //= 2
        sms = device_sms() if sms is None else sms
        forward_pipelined = direction == "forward" and two_byte and rows == 1 and sms
        pipelined = _pipelined_lanes(n_cols, block_n, tail_n, edges) if forward_pipelined else None
        if pipelined:
            block_n, tail_n = pipelined
            num_warps = next(w for limit, w in _PIPELINED_WARPS if tail_n <= limit)
            return SoftmaxPlan("single_block", block_n, 1, num_warps, min(n_rows, _PIPELINED_PROGRAMS_PER_SM * sms),
                               tail_n=tail_n, edges=edges, stages=_PIPELINED_STAGES)
        reload = direction == "backward" and two_byte and rows == 1 and (block_n, tail_n) == (_RELOAD_BLOCK_N, 0)
        if reload:
            num_warps = next(w for fill, w in _RELOAD_WARPS if n_cols <= fill * block_n)
        return SoftmaxPlan("single_block", block_n, rows, num_warps, _cdiv(n_rows, rows), tail_n=tail_n,
                           edges=edges and rows == 1, reload=reload)
    if impl == "split_row":
        block_n, num_warps = _SPLIT_ROW_SETTINGS[direction][_element_size(dtype)]
        cluster = direction == "backward" and _element_size(dtype) == 2 and _cdiv(n_cols, block_n) <= _CLUSTER_MAX_SPLITS
        cluster = cluster and (device_clusters() if clusters is None else clusters)
        if cluster and _cdiv(n_cols, _CLUSTER_NARROW_N) <= _CLUSTER_NARROW_MAX_SPLITS:
            block_n = _CLUSTER_NARROW_N
        splits = _cdiv(n_cols, block_n)
        capped = direction == "forward" and not cluster
        max_registers = _SPLIT_ROW_MAX_REGISTERS.get((_element_size(dtype), edges), 0) if capped else 0
        return SoftmaxPlan("split_row", block_n, 1, num_warps, n_rows * splits, splits, edges=edges, cluster=cluster,
                           max_registers=max_registers)
    block_n = min(_ONLINE_BLOCK_N[_element_size(dtype)], max(_MIN_BLOCK_N, _next_power_of_2(n_cols)))
    return SoftmaxPlan("online", block_n, 1, _ONLINE_WARPS, n_rows)

