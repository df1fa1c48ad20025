"""Rounds 12, 13 and 17 of the any-N softmax probe (GPU only: `python -m probes.softmax_any_n_cluster --round K
--out FILE`): split rows whose slices meet at a hardware cluster barrier instead of through tickets and
counters; round 17 sets 2-byte forward clusters against the ticketed slices under a register cap.

The split-row kernels (kernels/softmax_split_row_kernels.py) let the programs of a row meet through global
memory: a ticket from one counter orders the work so that a row's slices are all running before its last
one waits, and the slices spin on a per-row counter until every partial has arrived. On Hopper a launch can
group its programs into clusters that the hardware schedules together (up to 8, or 16 non-portably), and
whose programs can wait for each other at one barrier (`barrier.cluster.arrive` / `barrier.cluster.wait`,
release and acquire by default). Here a row's slices are one cluster: no ticket, no counter, no spin; each
slice writes its partials to its own slot, meets the others at the barrier, then reads the row's partials.

Triton 3.6 does not compile `num_ctas` > 1 for these kernels (its CTA planning and its reductions assume a
block held by one CTA; the reduction's lowering asserts `isReduceWithinCTA`), so the kernels here are
compiled for one CTA and launched in clusters by kernels/_launch.py's bind(cluster=...), which hands the
compiled kernel's own launcher the cluster size. The barrier is the lab's (inline PTX); the backward
candidates are the lab's clustered split-row backward at other settings.
The cluster size need not be a power of two (a row of 21,439 lanes can be 3 slices of 8192).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments._any_n import draw_row_lengths  # noqa: E402
from kernels._launch import MAX_CLUSTER, bind  # noqa: E402
from kernels.softmax import plan_softmax, softmax_bwd, softmax_fwd  # noqa: E402
from kernels.softmax_plan import SoftmaxPlan, device_sms  # noqa: E402
from kernels.softmax_kernels import _edge_offsets, _row_cut  # noqa: E402
from kernels.softmax_split_row_kernels import _cluster_barrier  # noqa: E402
from probes.harness import deferred, probe_shape, run_rounds, time_forward_shapes, write_output  # noqa: E402

QUESTION = ("Do split rows whose slices meet at a hardware cluster barrier (no tickets, no counters) beat the "
            "ticketed split-row kernels, in both directions and against the capped tickets?")
CANDIDATES = ("lab:auto", "lab:cluster{C}x{lanes}w{warps}", "cluster{C}x{lanes}w{warps}r{cap}")
OUTPUTS = {
    "any-n-12": ("notes/probes/2026-11-25-h100-any-n-round12.json.gz",),
    "any-n-13": ("notes/probes/2026-11-25-h100-any-n-round13.json.gz",),
    "any-n-17": ("notes/probes/2026-11-25-h100-any-n-round17.json.gz",),
}


@triton.jit
def _fwd_cluster_kernel(x_ptr, y_ptr, part_m_ptr, part_d_ptr, n_cols, x_row_stride, y_row_stride,
                        BLOCK_N: tl.constexpr, CLUSTER: tl.constexpr, CLUSTER_POW2: tl.constexpr,
                        EDGES: tl.constexpr, VEC: tl.constexpr):
    # Program pid is slice pid % CLUSTER of row pid // CLUSTER; a cluster is CLUSTER consecutive programs.
    pid = tl.program_id(0)
    row = pid // CLUSTER
    part = pid % CLUSTER
    row64 = row.to(tl.int64)
    if EDGES:
        x_start, head, n_main = _row_cut(row64, x_row_stride, n_cols, VEC)
        x_row = x_ptr + tl.multiple_of(x_start + head, VEC)
        y_row = y_ptr + tl.multiple_of(row64 * y_row_stride + head, VEC)
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
    tl.store(part_m_ptr + pid, m)
    tl.store(part_d_ptr + pid, d)
    zero = _cluster_barrier(pid)
    slot = tl.arange(0, CLUSTER_POW2)
    parts = row * CLUSTER + zero + slot
    pm = tl.load(part_m_ptr + parts, mask=slot < CLUSTER, other=-float("inf"), cache_modifier=".cg")
    pd = tl.load(part_d_ptr + parts, mask=slot < CLUSTER, other=0.0, cache_modifier=".cg")
    m_row = tl.max(pm, axis=0)
    d_row = tl.sum(tl.where(pm == -float("inf"), 0.0, pd * tl.exp(pm - m_row)), axis=0)
    d_row = tl.where(m_row == -float("inf"), float("nan"), d_row)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m_safe - m_row)) / d_row
    tl.store(y_row + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)
    if EDGES:
        tl.store(y_row + edge, (e_edge * scale).to(y_ptr.dtype.element_ty), mask=edge_in)


def _edges(x: torch.Tensor) -> bool:
    return x.shape[1] % 16 != 0 or x.stride(0) % 16 != 0


def cluster_forward(x: torch.Tensor, cluster: int, block_n: int, warps: int, maxnreg: int | None = None):
    """A callable writing softmax(x) with each row's `cluster` slices of block_n lanes as one cluster of the
    launch; maxnreg caps the registers a thread (None: the compiler's choice)."""
    m, n = x.shape
    y = torch.empty_like(x)
    parts = torch.empty(2, m * cluster, device=x.device, dtype=torch.float32)
    vec = 16 // x.element_size()
    meta = dict(BLOCK_N=block_n, CLUSTER=cluster, CLUSTER_POW2=max(2, 1 << (cluster - 1).bit_length()),
                EDGES=_edges(x), VEC=vec, num_warps=warps, **({"maxnreg": maxnreg} if maxnreg else {}))
    args = (x, y, parts[0], parts[1], n, x.stride(0), y.stride(0))
    launch = bind(_fwd_cluster_kernel, (m * cluster,), args, varying=4, cluster=cluster, **meta)

    def run():
        launch(*args[:4])
        return y

    return run


def cluster_backward(y: torch.Tensor, dy: torch.Tensor, cluster: int, block_n: int, warps: int):
    """The lab's split-row backward with the row's slices as one cluster (SoftmaxPlan.cluster), at these
    settings."""
    m, n = y.shape
    plan = SoftmaxPlan("split_row", block_n, 1, warps, m * cluster, cluster, edges=_edges(y), cluster=True)
    dx = torch.empty_like(y)
    return lambda: softmax_bwd(y, dy, plan, out=dx)


ROUND12_SLICES = ((2048, 2), (4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16))
ROUND13_SLICES = ((4096, 4), (8192, 4), (8192, 8))


def cluster_settings(n: int, slices=ROUND12_SLICES) -> list[tuple[int, int, int]]:
    """(cluster, slice lanes, warps) that cover a contiguous row of n: `slices` (lanes, warps), clusters of
    2-16."""
    out = []
    for block_n, warps in slices:
        cluster = math.ceil((n + (16 if n % 16 else 0)) / block_n)  # the cut's head and tail, where it has them
        if 2 <= cluster <= MAX_CLUSTER:
            out.append((cluster, block_n, warps))
    return out


# 2-byte lengths the records put below the targets, both schedules: one-row plans of 9,000-22,403 and
# split rows of 36,481-268,850, powers of two among them; fp32 at two lengths for comparison.
ROUND12_N = tuple((n, torch.bfloat16) for n in (9512, 17523, 21439, 22403, 36481, 41187, 65536, 75029, 100000,
                                                131072, 162321, 262144))
ROUND12_N += ((21439, torch.float16), (75029, torch.float16), (65536, torch.float32), (131072, torch.float32))


# Round 13: round 12's lead at the split-row lengths of softmax-any-n's draw, with clusters of 9-15 allowed
# (non-portable); slices of 4096 and 8192 lanes only (16,384 lost at every length in round 12).
ROUND13_N = tuple((n, torch.bfloat16) for n in (33333, 36481, 46372, 53341, 62058, 74105, 75459, 97994, 108894,
                                                129820, 131072))
ROUND13_N += ((41187, torch.float16), (75029, torch.float16), (100000, torch.float16), (75029, torch.float32))


def run_round12(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return _run_cluster_round(ROUND12_N, ROUND12_SLICES, result, start, deadline, rounds, out)


def run_round13(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return _run_cluster_round(ROUND13_N, ROUND13_SLICES, result, start, deadline, rounds, out)


def _run_cluster_round(shapes, slices, result: dict, start: float, deadline: float, rounds: int,
                       out: Path) -> list[dict]:
    rows: list[dict] = []
    for n, dtype in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        settings = cluster_settings(n, slices)
        extra = [(f"lab:cluster{c}x{b}w{w}", lambda x, c=c, b=b, w=w: cluster_forward(x, c, b, w))
                 for c, b, w in settings]

        def backward_extra(y, dy, settings=settings):
            return [(f"lab:cluster{c}x{b}w{w}", cluster_backward(y, dy, c, b, w)) for c, b, w in settings]

        rows += probe_shape(n, dtype, result["copy_ceiling_gbs"], rounds,
                            lambda m, n, d, r: [("auto", plan_softmax(m, n, d, "auto", True, r))], None,
                            ("forward", "backward"), extra, backward_extra)
        result["rows"] = rows
        write_output(out, result)
    return rows


# Round 17: the draw's 2-byte split-row lengths that fit a cluster of 8192-lane slices, and the powers of two.
ROUND17_SLICES = ((8192, 4, None), (8192, 4, 80), (4096, 4, None))
SPLIT_MIN_N = 32769  # the shortest row the auto plan splits


def round17_shapes() -> list[tuple[int, torch.dtype]]:
    split = [n for n in draw_row_lengths() if SPLIT_MIN_N <= n and math.ceil((n + 16) / 8192) <= MAX_CLUSTER]
    shapes = [(n, torch.bfloat16) for n in split + [65536, 131072]]
    return shapes + [(n, torch.float16) for n in split[::3]]


def round17_candidates(x: torch.Tensor) -> list[tuple[str, object]]:
    """The auto plan (ticketed slices) and clusters of ROUND17_SLICES that cover the row."""
    y = torch.empty_like(x)
    m, n = x.shape
    auto = plan_softmax(m, n, x.dtype, "auto", True, "forward", sms=device_sms())
    out = [("lab:auto", lambda: softmax_fwd(x, auto, out=y))]
    for block_n, warps, cap in ROUND17_SLICES:
        for cluster, lanes, w in cluster_settings(n, ((block_n, warps),)):
            out.append((f"cluster{cluster}x{lanes}w{w}r{cap or 0}",
                        deferred(lambda x, c=cluster, b=lanes, w=w, r=cap: cluster_forward(x, c, b, w, r))(x)))
    return out


def run_round17(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return time_forward_shapes(result, start, deadline, rounds, out, round17_shapes(), round17_candidates)


SHAPES = {"12": ROUND12_N, "13": ROUND13_N, "17": "the draw's 2-byte split-row lengths a cluster covers, 65,536, 131,072"}


def main(argv=None) -> int:
    return run_rounds(__doc__, {12: run_round12, 13: run_round13, 17: run_round17}, argv)


if __name__ == "__main__":
    sys.exit(main())
