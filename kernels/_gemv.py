"""What the weight-streaming kernels share: the launch plan's shape, the split-K rule, and the split-K
fix-up with its cached workspaces.

At decode a linear layer y [M, N] = a [M, K] @ W^T reads W [N, K] once and almost nothing else, so its time
is W's bytes over the DRAM bandwidth. The kernels built on this module (kernels/rmsnorm_gemv.py,
kernels/dequant_linear.py) give each program BLOCK_N rows of W and a run of K, in one of two forms:

* "fma": on the CUDA cores, in fp32. W's tile is multiplied elementwise into a [BLOCK_M, BLOCK_N, BLOCK_K]
  accumulator (BLOCK_M rows of a held in registers, so each W element loaded serves every row) and reduced
  over K once, after the loop. For a few rows (the plans say how many): M FMAs per W element stay under the
  CUDA cores' rate.
* "dot": on the tensor cores, M padded to BLOCK_M >= 16. With `swap`, W is the first operand
  (c^T [BLOCK_N, BLOCK_M] = W a^T), so a 64-row W tile fills Hopper's warpgroup MMA and a weight computed in
  registers (dequantised) may feed it without a trip through shared memory.

Split-K: when N / BLOCK_N programs alone cannot keep every SM streaming, SPLIT_K programs share one tile of
y, each over its own run of K. Each leaves its fp32 partial tile (and a per-row side vector, e.g. the sum of
squares of x) in a workspace and counts itself in on the tile's counter; the program that arrives last sums
the partials, finishes the tile and sets the counter back to zero, so no launch pays for a memset and none
waits for another. The result is deterministic: whichever program arrives last, it adds the partials in
the fixed order 0, 1, ..., SPLIT_K - 1 (the atomic only counts arrivals; no value is added atomically). Workspace: SPLIT_K * BLOCK_M * (BLOCK_N + 1) fp32 per tile, written and read back
through L2 (at M = 16, N = 4096, BLOCK_N = 64, SPLIT_K = 4: 1.1 MB against W's 33.5 MB).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

FORMS = ("fma", "dot")


@dataclass(frozen=True)
class GemvPlan:
    """How one weight-streaming launch is laid out; recorded beside every timing the lab takes.

    block_m: rows of a held per program (a power of two >= M; >= 16 for "dot").
    load_stages: loads in flight per program (the K-loop's software pipeline depth).
    swap: "dot" only: W as the first operand of the product.
    evict_first: W's loads marked to leave L2 first, so streaming W does not push out what else is cached.
    """

    form: str
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    load_stages: int
    swap: bool = True
    evict_first: bool = False

    def n_tiles(self, n_cols: int) -> int:
        return triton.cdiv(n_cols, self.block_n)

    def grid(self, n_cols: int) -> tuple[int]:
        return (self.n_tiles(n_cols) * self.split_k,)

    def as_dict(self) -> dict:
        return asdict(self)


# The SM count a plan assumes when none is given (an H100 SXM and an H200 both have 132).
DEFAULT_SM_COUNT = 132


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    """The device's SM count (DEFAULT_SM_COUNT off CUDA, e.g. under the interpreter): a plan input."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def choose_split_k(n_tiles: int, k_steps: int, *, min_programs: int, min_steps: int, max_split: int) -> int:
    """The smallest power of two s with n_tiles * s >= min_programs, but no split shorter than `min_steps`
    K-steps and none past `max_split` (1 when the tiles alone are enough)."""
    split = 1
    while n_tiles * split < min_programs and split < max_split and k_steps >= 2 * split * min_steps:
        split *= 2
    return split


# --------------------------------------------------------------------------------------------------------
# The split-K fix-up
# --------------------------------------------------------------------------------------------------------


@triton.jit
def split_k_sum(c, v, part_ptr, count_ptr, tile, split,
                SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Leave this program's partial c [BLOCK_M, BLOCK_N] and side vector v [BLOCK_M]; returns (is_last,
    sum of c, sum of v) where the sums hold only in the program that arrived last."""
    slot = BLOCK_M * (BLOCK_N + 1)
    base = part_ptr + tile.to(tl.int64) * (SPLIT_K * slot)
    rows = tl.arange(0, BLOCK_M)
    c_offs = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    v_offs = BLOCK_M * BLOCK_N + rows
    tl.store(base + split * slot + c_offs, c)
    tl.store(base + split * slot + v_offs, v)
    # acq_rel: this program's partials are visible before its arrival counts; the last one's reads
    # happen after every arrival it saw.
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    is_last = arrived == SPLIT_K - 1
    c_sum = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    v_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if is_last:
        for j in range(SPLIT_K):  # not unrolled: a 64-row tile's partials all in flight would spill
            c_sum += tl.load(base + j * slot + c_offs, cache_modifier=".cg")
            v_sum += tl.load(base + j * slot + v_offs, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0)
    return is_last, c_sum, v_sum


# --------------------------------------------------------------------------------------------------------
# Cached workspaces: no allocation and no memset on the hot path
# --------------------------------------------------------------------------------------------------------

# Per (device, stream): (partials, tile counters). Counters are zeroed once and every launch leaves them at
# zero; one pair per stream keeps launches on different streams from counting into each other's tiles.
_WORKSPACES: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
# Buffers outgrown by a larger launch stay referenced: a CUDA graph captured earlier may still use them.
_RETIRED: list[torch.Tensor] = []
_MIN_PART_FLOATS = 1 << 16
# A launch captured into a CUDA graph takes buffers of its own (see workspace); a timing tool that replays its
# graphs one at a time on one stream may turn this off and share the stream's buffers instead.
CAPTURE_OWN_WORKSPACE = True
_MIN_COUNTERS = 1024
# Counters for captured launches: per device, a slab zeroed outside any capture and handed out in slices no
# other launch ever gets, so a graph's launches count only into their own tiles and the graph replays no
# memset of its own (on the H100's graph clock a memset node cost 1.1-1.7 us a split launch, median 1.3:
# notes/probes/2026-11-27-h100-int4-split-map*.json, round int4-split-map). Slices are not reused: a graph may
# outlive any record of it. A stream's first eager call makes the device's slab; after a capture has drawn on it,
# the next eager call renews it if less than a quarter is free (the eager hot path looks at one set, no more); a
# capture that finds too little falls back to zeroing its counters inside the graph.
_SLAB_COUNTERS = 1 << 18
_SLABS: dict[str, list] = {}  # str(device) -> [zeroed int32 slab, first free index]
_SLABS_DRAWN: set[str] = set()  # devices whose slab a capture has drawn on since it was last looked at


def _stream_id(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def workspace(n_floats: int, n_counters: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partials, int32 tile counters at zero) of at least these sizes, cached per device and stream.

    While a CUDA graph is being captured each launch gets buffers of its own: partials from the graph's memory
    and counters from the device's zeroed slab (zeroed in the graph only when the slab is short). Graphs
    captured on one stream may be replayed on several at once, and must not count into each other's tiles."""
    if CAPTURE_OWN_WORKSPACE and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return (torch.empty(max(n_floats, 1), dtype=torch.float32, device=device),
                zeroed_counters(max(n_counters, 1), device))
    name = str(device)
    if name in _SLABS_DRAWN:
        renew_slab(device)
    key = (name, _stream_id(device))
    found = _WORKSPACES.get(key)
    if found is not None and found[0].numel() >= n_floats and found[1].numel() >= n_counters:
        return found
    if device.type == "cuda":
        renew_slab(device)  # before this stream's first capture
    part = found[0] if found is not None and found[0].numel() >= n_floats else None
    counts = found[1] if found is not None and found[1].numel() >= n_counters else None
    if part is None:
        part = torch.empty(max(_MIN_PART_FLOATS, triton.next_power_of_2(n_floats)), dtype=torch.float32, device=device)
        if found is not None:
            _RETIRED.append(found[0])
    if counts is None:
        counts = torch.zeros(max(_MIN_COUNTERS, triton.next_power_of_2(n_counters)), dtype=torch.int32, device=device)
        if found is not None:
            _RETIRED.append(found[1])
    _WORKSPACES[key] = (part, counts)
    return part, counts


def renew_slab(device: torch.device, size: int = _SLAB_COUNTERS) -> None:
    """Outside a capture: give the device a fresh zeroed slab when it has none or less than a quarter free (the
    old one stays referenced: graphs captured earlier count in its slices)."""
    name = str(device)
    _SLABS_DRAWN.discard(name)
    slab = _SLABS.get(name)
    if slab is None or slab[0].numel() - slab[1] < slab[0].numel() // 4:
        if slab is not None:
            _RETIRED.append(slab[0])
        _SLABS[name] = [torch.zeros(size, dtype=torch.int32, device=device), 0]


def zeroed_counters(n: int, device: torch.device) -> torch.Tensor:
    """n int32 counters at zero that no other caller gets: a slice of the device's slab, else a new zeroed
    tensor (inside a capture, a memset in the graph)."""
    name = str(device)
    if device.type == "cuda":
        _SLABS_DRAWN.add(name)
    slab = _SLABS.get(name)
    if slab is not None and slab[0].numel() - slab[1] >= n:
        slab[1] += n
        return slab[0][slab[1] - n:slab[1]]
    return torch.zeros(n, dtype=torch.int32, device=device)


def split_k_workspace(plan: GemvPlan, n_cols: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(partials, tile counters) large enough for `plan` over n_cols outputs, on the current stream."""
    n_tiles = plan.n_tiles(n_cols)
    return workspace(n_tiles * plan.split_k * plan.block_m * (plan.block_n + 1), n_tiles, device)


def counters_at_rest(device: torch.device) -> bool:
    """Whether every tile counter on this device's current stream is back at zero (for tests)."""
    found = _WORKSPACES.get((str(device), _stream_id(device)))
    return found is None or int(found[1].abs().sum()) == 0
