"""The any-N softmax probe's forward rounds (GPU only): `python -m probes.softmax_any_n_forward --round K
--out FILE`, K = 2 to 5 or 11.

2: the chosen rules against the previous plan at lengths they were not chosen on, the sweeps' lengths, and a
persistent split-row lead for long 2-byte rows; 3: 2-byte rows held in their storage dtype; 4: persistent
programs with the next rows' loads pipelined; 5: round 4's schedule at lengths it was not chosen on; 11: the
row read again instead of held across a reduction.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.softmax import plan_softmax  # noqa: E402
from kernels.softmax_plan import SoftmaxPlan  # noqa: E402
from kernels.softmax_split_row_kernels import _wait_for_row  # noqa: E402
from probes.harness import MIN_BYTES, probe_shape, run_rounds, split_row_plan  # noqa: E402

QUESTION = ("Which forward schedules hold off-grid rows near the copy ceiling: the chosen rules at new lengths, "
            "rows kept in their storage dtype, persistent pipelined programs, or the row read again?")
CANDIDATES = ("lab:auto", "lab:previous", "lab:tail/*", "pipelined/b*w*p*", "lean/*", "persistent/*", "reload/*",
              "torch", "liger")
OUTPUTS = {
    "any-n-2": ("notes/probes/2026-11-24-h100-any-n-round2.json.gz",),
    "any-n-3": ("notes/probes/2026-11-24-h100-any-n-round3.json.gz",),
    "any-n-4": ("notes/probes/2026-11-24-h100-any-n-round4.json.gz",),
    "any-n-5": ("notes/probes/2026-11-24-h100-any-n-round5.json.gz",),
    "any-n-11": ("notes/probes/2026-11-25-h100-any-n-round11.json.gz",),
}


def previous_plan(m: int, n: int, dtype: torch.dtype, direction: str) -> SoftmaxPlan:
    """The plan before round 1 (with the cut): 2-byte forward rows took fp32's tail rule, backward split-row
    slices were 8192 wide on 8 warps."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    if auto.impl == "single_block" and direction == "forward":
        return dataclasses.replace(plan_softmax(m, n, torch.float32, "auto", True, direction), edges=auto.edges)
    if auto.impl == "split_row" and direction == "backward":
        return split_row_plan(m, n, 8192, 8, auto.edges)
    return auto


def round2_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    """Round 2: the chosen rules against the previous plan, and tails up to half the head (16 warps)."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto), ("previous", previous_plan(m, n, dtype, direction))]
    head = 1 << (n.bit_length() - 1)
    tail = max(16, 1 << max(n - head - 1, 0).bit_length())
    if auto.impl == "single_block" and 4096 < n and head != n and tail < head and (head, tail) != (auto.block_n, auto.tail_n):
        plans.append((f"tail/{head}+{tail}w16", dataclasses.replace(auto, block_n=head, tail_n=tail, num_warps=16)))
    return plans


# Round 2: lengths the rules were not chosen on (odd ones included), then the sweeps' lengths the rules touch.
ROUND2_N = (9001, 10500, 11111, 14000, 17001, 18500, 21000, 23333, 27000, 36001, 45001, 77777, 200001)
ROUND2_SWEEP = ((4096, 9216, "forward"), (4096, 10240, "forward"), (8192, 32768, "backward"),
                (4096, 65536, "backward"), (2048, 131072, "backward"), (1024, 262144, "backward"))
ROUND2_LEAD_N = (65536, 131072, 262144)


def run_round2(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    rows: list[dict] = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ceiling = result["copy_ceiling_gbs"]
    for n in ROUND2_LEAD_N:  # bf16 forward at M*N = 2^28, the long-rows experiment's size
        if time.time() - start > deadline:
            return rows
        extra = [(f"pipelined/b{b}w{w}p{k}", lambda x, b=b, w=w, k=k: pipelined_forward(x, b, w, k * sms))
                 for b, w in ((8192, 4), (8192, 8)) for k in (2, 3, 4)]
        rows += probe_shape(n, torch.bfloat16, ceiling, rounds, lambda m, n, d, r: [("auto", plan_softmax(m, n, d, "auto", True, r))],
                            2**28 // n, ("forward",), extra)
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    for m, n, direction in ROUND2_SWEEP:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            if time.time() - start > deadline:
                return rows
            if direction == "forward" and dtype == torch.float32:
                continue
            rows += probe_shape(n, dtype, ceiling, rounds, round2_plans, m, (direction,))
    for n in ROUND2_N:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            if time.time() - start > deadline:
                return rows
            rows += probe_shape(n, dtype, ceiling, rounds, round2_plans)
            result["rows"] = rows
            out.write_text(json.dumps(result, indent=1))
    return rows


# ---------------------------------------------------------------------------------------------------------
# A lead for long 16-bit rows: split-row whose programs stay resident and overlap the wait with the next slice
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _slice_partials(x_ptr, part_m_ptr, part_d_ptr, ticket, n_cols, n_splits, x_row_stride, valid,
                    BLOCK_N: tl.constexpr):
    row = ticket // n_splits
    cols = (ticket % n_splits) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (cols < n_cols) & valid
    x = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp(x - m_safe)
    if valid:
        tl.store(part_m_ptr + ticket, m)
        tl.store(part_d_ptr + ticket, tl.sum(e, axis=0))
    return e, m, m_safe


@triton.jit
def _arrive(counter_ptr, n_splits):
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel") + 1
    if arrived == n_splits:
        tl.atomic_xchg(counter_ptr, 0, sem="release")
    return arrived


@triton.jit
def _fwd_split_row_pipelined_kernel(x_ptr, y_ptr, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits, n_tickets,
                                    x_row_stride, y_row_stride, BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr):
    # Persistent programs, each taking tickets in arrival order. A program loads its next slice, stores that
    # slice's partials and arrives for it before it waits for the row of the slice it holds, so its loads
    # overlap its partners' arrival. Every program arrives for each ticket it takes before it waits for any,
    # so a wait ends as long as more programs run than a row has slices.
    ticket = tl.atomic_add(sync_ptr, 1)
    valid = ticket < n_tickets
    e, m, m_safe = _slice_partials(x_ptr, part_m_ptr, part_d_ptr, ticket, n_cols, n_splits, x_row_stride, valid,
                                   BLOCK_N)
    arrived = n_splits
    if valid:
        arrived = _arrive(sync_ptr + 1 + ticket // n_splits, n_splits)
    while valid:
        nxt = tl.atomic_add(sync_ptr, 1)
        nxt_valid = nxt < n_tickets
        e_n, m_n, m_safe_n = _slice_partials(x_ptr, part_m_ptr, part_d_ptr, nxt, n_cols, n_splits, x_row_stride,
                                             nxt_valid, BLOCK_N)
        arrived_n = n_splits
        if nxt_valid:
            arrived_n = _arrive(sync_ptr + 1 + nxt // n_splits, n_splits)
        row = ticket // n_splits
        _wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
        parts = row * n_splits + tl.arange(0, SPLITS_POW2)
        in_row = tl.arange(0, SPLITS_POW2) < n_splits
        pm = tl.load(part_m_ptr + parts, mask=in_row, other=-float("inf"), volatile=True)
        pd = tl.load(part_d_ptr + parts, mask=in_row, other=0.0, volatile=True)
        m_row = tl.max(pm, axis=0)
        d_row = tl.sum(tl.where(pm == -float("inf"), 0.0, pd * tl.exp(pm - m_row)), axis=0)
        scale = tl.where(m == -float("inf"), 0.0, tl.exp(m_safe - m_row)) / d_row
        cols = (ticket % n_splits) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(y_ptr + row.to(tl.int64) * y_row_stride + cols, (e * scale).to(y_ptr.dtype.element_ty),
                 mask=cols < n_cols)
        ticket, valid, e, m, m_safe, arrived = nxt, nxt_valid, e_n, m_n, m_safe_n, arrived_n
    # The last ticket ever taken (one past the work per program) sets the ticket counter back to zero.
    if ticket == n_tickets + tl.num_programs(0) - 1:
        tl.atomic_xchg(sync_ptr, 0)


def pipelined_forward(x: torch.Tensor, block_n: int, warps: int, programs: int):
    m, n = x.shape
    splits = math.ceil(n / block_n)
    part = torch.empty(2, m * splits, dtype=torch.float32, device=x.device)
    sync = torch.zeros(1 + m, dtype=torch.int32, device=x.device)
    y = torch.empty_like(x)

    def run():
        _fwd_split_row_pipelined_kernel[(programs,)](
            x, y, part[0], part[1], sync, n, splits, m * splits, x.stride(0), y.stride(0),
            BLOCK_N=block_n, SPLITS_POW2=1 << (splits - 1).bit_length(), num_warps=warps)
        return y

    return run


# ---------------------------------------------------------------------------------------------------------
# Round 3: 16-bit forward rows held in registers in their storage dtype
# ---------------------------------------------------------------------------------------------------------
# Reading of rounds 1-2: where a 16-bit row needs a block of 16k-32k lanes, the single-block forward holds the
# row as fp32 (x, then e), 32-64 registers a thread for the row alone, so one or two programs fit an SM and
# their load phases do not overlap their exp/store phases. Holding x as bf16/fp16 (two to a register) and
# recomputing exp(x - m) at the store halves that; the extra exp is cheap against a 2-byte element's bytes.

from kernels.softmax_kernels import _edge_offsets, _row_cut  # noqa: E402


@triton.jit
def _fwd_row_lean_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK_N: tl.constexpr,
                         TAIL_N: tl.constexpr, EDGES: tl.constexpr, VEC: tl.constexpr):
    row = tl.program_id(0)
    if EDGES:
        x_start, head, n_main = _row_cut(row, x_row_stride, n_cols, VEC)
        x_row = x_ptr + tl.multiple_of(x_start + head, VEC)
        y_row = y_ptr + tl.multiple_of(row * y_row_stride + head, VEC)
    else:
        n_main = n_cols
        x_row = x_ptr + row * x_row_stride
        y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_row + cols, mask=cols < n_main, other=-float("inf"))
    m = tl.max(x, axis=0).to(tl.float32)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        x_tail = tl.load(x_row + tail_cols, mask=tail_cols < n_main, other=-float("inf"))
        m = tl.maximum(m, tl.max(x_tail, axis=0).to(tl.float32))
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        x_edge = tl.load(x_row + edge, mask=edge_in, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_edge, axis=0))
    d = tl.sum(tl.exp(x.to(tl.float32) - m), axis=0)
    if TAIL_N > 0:
        d += tl.sum(tl.exp(x_tail.to(tl.float32) - m), axis=0)
    if EDGES:
        d += tl.sum(tl.exp(x_edge - m), axis=0)
    inv_d = 1.0 / d
    tl.store(y_row + cols, (tl.exp(x.to(tl.float32) - m) * inv_d).to(y_ptr.dtype.element_ty), mask=cols < n_main)
    if TAIL_N > 0:
        tl.store(y_row + tail_cols, (tl.exp(x_tail.to(tl.float32) - m) * inv_d).to(y_ptr.dtype.element_ty),
                 mask=tail_cols < n_main)
    if EDGES:
        tl.store(y_row + edge, (tl.exp(x_edge - m) * inv_d).to(y_ptr.dtype.element_ty), mask=edge_in)


REGISTERS: dict[str, tuple[int, int]] = {}


def lean_forward(x: torch.Tensor, block_n: int, tail_n: int, warps: int, name: str):
    m, n = x.shape
    y = torch.empty_like(x)
    vec = 16 // x.element_size()
    edges = n % 16 != 0

    def run():
        k = _fwd_row_lean_kernel[(m,)](x, y, n, x.stride(0), y.stride(0), BLOCK_N=block_n, TAIL_N=tail_n,
                                       EDGES=edges, VEC=vec, num_warps=warps)
        if k is not None and hasattr(k, "n_regs"):
            REGISTERS.setdefault(name, (k.n_regs, k.n_spills))
        return y

    return run


ROUND3_N = (2057, 4610, 9512, 10039, 12345, 17523, 21439, 22403, 30000, 41187, 50257, 65536, 75029, 131072)


def round3_extra(n: int) -> list:
    """Lean variants: one power-of-two block at 8-32 warps, and head + tail where the tail is at most half."""
    out = []
    padded = 1 << (n - 1).bit_length()
    for w in (4, 8, 16, 32):
        if 8 <= padded // (32 * w) <= 64:
            out.append((f"lean/b{padded}w{w}", padded, 0, w))
    head = 1 << (n.bit_length() - 1)
    tail = max(16, 1 << max(n - head - 1, 0).bit_length())
    if head != n and tail <= head // 2 and head >= 4096:
        for w in (16, 32):
            if 8 <= head // (32 * w) <= 64:
                out.append((f"lean/t{head}+{tail}w{w}", head, tail, w))
    return [(name, lambda x, b=b, t=t, w=w, name=name: lean_forward(x, b, t, w, name)) for name, b, t, w in out]


def run_round3(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    rows: list[dict] = []
    ceiling = result["copy_ceiling_gbs"]

    def auto_and_padded(m, n, d, r):
        auto = plan_softmax(m, n, d, "auto", True, r)
        plans = [("auto", auto)]
        padded = 1 << (n - 1).bit_length()
        if auto.impl == "split_row" or auto.block_n != padded or auto.tail_n:
            if padded <= 65536:
                plans.append((f"single/b{padded}w32", SoftmaxPlan("single_block", padded, 1, 32, m, edges=auto.edges)))
        return plans

    for n in ROUND3_N:
        for dtype in (torch.bfloat16, torch.float16):
            if time.time() - start > deadline:
                result["stopped_at"] = {"N": n, "dtype": str(dtype)}
                return rows
            REGISTERS.clear()
            got = probe_shape(n, dtype, ceiling, rounds, auto_and_padded, None, ("forward",), round3_extra(n))
            for row in got:
                if row["variant"] in REGISTERS:
                    row["registers"], row["spills"] = REGISTERS[row["variant"]]
            rows += got
            result["rows"] = rows
            out.write_text(json.dumps(result, indent=1))
    return rows


# ---------------------------------------------------------------------------------------------------------
# Round 4: persistent single-block programs with the next rows' loads in flight
# ---------------------------------------------------------------------------------------------------------
# Reading of round 3: at the same lanes, a 16-bit row reaches 89% (N = 30,000 in 32,768 lanes) or 68%
# (21,439), and fewer registers did not change that. Each program loads its row, then reduces, exps and
# stores with no load of its own in flight; only other resident programs keep DRAM busy. A persistent program
# that walks rows with tl.range(num_stages=S) lets the compiler issue the next rows' loads (asynchronous
# copies into shared memory) while it works on the current one.


@triton.jit
def _fwd_row_persistent_kernel(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride, BLOCK_N: tl.constexpr,
                               TAIL_N: tl.constexpr, EDGES: tl.constexpr, VEC: tl.constexpr,
                               STAGES: tl.constexpr):
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        if EDGES:
            x_start, head, n_main = _row_cut(row, x_row_stride, n_cols, VEC)
            x_row = x_ptr + tl.multiple_of(x_start + head, VEC)
            y_row = y_ptr + tl.multiple_of(row * y_row_stride + head, VEC)
        else:
            head = 0
            n_main = n_cols
            x_row = x_ptr + tl.multiple_of(row * x_row_stride, VEC)
            y_row = y_ptr + tl.multiple_of(row * y_row_stride, VEC)
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


def persistent_forward(x: torch.Tensor, block_n: int, tail_n: int, warps: int, stages: int, per_sm: int, name: str):
    m, n = x.shape
    y = torch.empty_like(x)
    vec = 16 // x.element_size()
    edges = n % 16 != 0
    programs = min(m, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)

    def run():
        k = _fwd_row_persistent_kernel[(programs,)](x, y, m, n, x.stride(0), y.stride(0), BLOCK_N=block_n,
                                                    TAIL_N=tail_n, EDGES=edges, VEC=vec, STAGES=stages,
                                                    num_warps=warps)
        if k is not None and hasattr(k, "n_regs"):
            REGISTERS.setdefault(name, (k.n_regs, k.n_spills, k.metadata.shared))
        return y

    return run


ROUND4_N = (2057, 4610, 9512, 10039, 17523, 21439, 30000, 41187, 50257, 65536)


def round4_extra(n: int) -> list:
    padded = 1 << (n - 1).bit_length()
    head = 1 << (n.bit_length() - 1)
    tail = max(16, 1 << max(n - head - 1, 0).bit_length())
    blocks = [(padded, 0)] if padded <= 32768 else []
    if head != n and tail <= head // 2 and head >= 4096:
        blocks.append((head, tail))
    out = []
    for b, t in blocks:
        for w in ((4, 8) if b <= 8192 else (8, 16)):
            for stages in (2, 3):
                if (b + t) * 2 * stages > 200_000:
                    continue
                for per_sm in (1, 2):
                    name = f"pers/b{b}+{t}w{w}s{stages}p{per_sm}"
                    out.append((name, lambda x, b=b, t=t, w=w, s=stages, p=per_sm, name=name:
                                persistent_forward(x, b, t, w, s, p, name)))
    return out


def run_round4(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    rows: list[dict] = []
    ceiling = result["copy_ceiling_gbs"]
    for n in ROUND4_N:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n}
            return rows
        REGISTERS.clear()
        got = probe_shape(n, torch.bfloat16, ceiling, rounds,
                          lambda m, n, d, r: [("auto", plan_softmax(m, n, d, "auto", True, r))], None, ("forward",),
                          round4_extra(n))
        for row in got:
            if row["variant"] in REGISTERS:
                row["registers"], row["spills"], row["shared"] = REGISTERS[row["variant"]][:3]
        rows += got
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    return rows


ROUND5_N = (8500, 9001, 11111, 13000, 14000, 15500, 16384, 18000, 19999, 22000, 24576, 27000, 31000, 32768)
ROUND5_SWEEP = ((4096, 9216), (4096, 12288), (4096, 16384), (4096, 20480), (4096, 24576), (4096, 32768))


def round5_extra(m: int, n: int, dtype: torch.dtype) -> list:
    auto = plan_softmax(m, n, dtype, "auto", False, "forward")
    out = []
    for w in (8, 16):
        for stages in (3, 4):
            if (auto.block_n + auto.tail_n) * 2 * stages > 220_000:
                continue
            name = f"pers/b{auto.block_n}+{auto.tail_n}w{w}s{stages}p2"
            out.append((name, lambda x, b=auto.block_n, t=auto.tail_n, w=w, s=stages, name=name:
                        persistent_forward(x, b, t, w, s, 2, name)))
    if auto.block_n == 32768 and n <= 24576:
        out.append(("pers/b16384+8192w16s3p2", lambda x: persistent_forward(x, 16384, 8192, 16, 3, 2,
                                                                              "pers/b16384+8192w16s3p2")))
    return out


def run_round5(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    rows: list[dict] = []
    ceiling = result["copy_ceiling_gbs"]
    shapes = [(None, n, torch.bfloat16) for n in ROUND5_N] + [(None, n, torch.float16) for n in ROUND5_N[::3]]
    shapes += [(m, n, torch.bfloat16) for m, n in ROUND5_SWEEP]
    for m, n, dtype in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n}
            return rows
        REGISTERS.clear()
        mm = m or math.ceil(MIN_BYTES / (2 * n))
        got = probe_shape(n, dtype, ceiling, rounds,
                          lambda m, n, d, r: [("auto", plan_softmax(m, n, d, "auto", True, r))], m, ("forward",),
                          round5_extra(mm, n, dtype))
        for row in got:
            if row["variant"] in REGISTERS:
                row["registers"], row["spills"], row["shared"] = REGISTERS[row["variant"]][:3]
        rows += got
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    return rows


# ---------------------------------------------------------------------------------------------------------
# Round 11: the forward reading its row again instead of holding it across a reduction, as the backward's
# SoftmaxPlan.reload does (probe round 10): PASSES=2 holds x through the max and reads it again for the store
# (e is consumed by the sum); PASSES=3 also reads it again for the sum, so no row is held across either
# reduction. The first load keeps its lines in L2, the last drops them; DRAM bytes stay 2*N*size when the
# rows in flight fit in L2. One power-of-two block a row, one row a program, the cut where the row needs it.
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_row_reload_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK_N: tl.constexpr,
                           EDGES: tl.constexpr, VEC: tl.constexpr, PASSES: tl.constexpr):
    row = tl.program_id(0)
    if EDGES:
        x_start, head, n_main = _row_cut(row, x_row_stride, n_cols, VEC)
        x_row = x_ptr + tl.multiple_of(x_start + head, VEC)
        y_row = y_ptr + tl.multiple_of(row * y_row_stride + head, VEC)
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        x_edge = tl.load(x_row + edge, mask=edge_in, other=-float("inf")).to(tl.float32)
    else:
        n_main = n_cols
        x_row = x_ptr + row * x_row_stride
        y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_row + cols, mask=cols < n_main, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
    m = tl.max(x, axis=0)
    if EDGES:
        m = tl.maximum(m, tl.max(x_edge, axis=0))
    if PASSES == 3:
        x = tl.load(x_row + cols, mask=cols < n_main, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
    d = tl.sum(tl.exp(x - m), axis=0)
    if EDGES:
        d += tl.sum(tl.exp(x_edge - m), axis=0)
    inv_d = 1.0 / d
    x = tl.load(x_row + cols, mask=cols < n_main, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
    tl.store(y_row + cols, (tl.exp(x - m) * inv_d).to(y_ptr.dtype.element_ty), mask=cols < n_main)
    if EDGES:
        tl.store(y_row + edge, (tl.exp(x_edge - m) * inv_d).to(y_ptr.dtype.element_ty), mask=edge_in)


def reload_forward(x: torch.Tensor, warps: int, passes: int, name: str):
    """A launcher of the round-11 kernel over a contiguous x (y gets x's alignment, so one cut serves both)."""
    m, n = x.shape
    y = torch.empty_like(x)
    vec = 16 // x.element_size()
    block_n = max(16, 1 << (n - 1).bit_length())

    def run():
        k = _fwd_row_reload_kernel[(m,)](x, y, n, x.stride(0), y.stride(0), BLOCK_N=block_n, EDGES=n % 16 != 0,
                                         VEC=vec, PASSES=passes, num_warps=warps)
        if k is not None and hasattr(k, "n_regs"):
            REGISTERS.setdefault(name, (k.n_regs, k.n_spills))
        return y

    return run


ROUND11_N = tuple((n, torch.bfloat16) for n in (2057, 4610, 6500, 9001, 9512, 10039, 10920, 12345, 13001, 16384,
                                                17523, 19211, 21439, 22403, 28000, 30000))
ROUND11_N += ((9512, torch.float16), (21439, torch.float16), (9512, torch.float32), (21439, torch.float32))


def round11_extra(n: int) -> list:
    return [(f"lab:reload{p}/w{w}", lambda x, w=w, p=p: reload_forward(x, w, p, f"lab:reload{p}/w{w}"))
            for p in (2, 3) for w in (8, 16, 32)]


def run_round11(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    rows: list[dict] = []
    for n, dtype in ROUND11_N:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        REGISTERS.clear()
        got = probe_shape(n, dtype, result["copy_ceiling_gbs"], rounds,
                          lambda m, n, d, r: [("auto", plan_softmax(m, n, d, "auto", True, r))], None, ("forward",),
                          round11_extra(n))
        for row in got:
            if row["variant"] in REGISTERS:
                row["registers"], row["spills"] = REGISTERS[row["variant"]]
        rows += got
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    return rows


SHAPES = {"2": ROUND2_N + ROUND2_LEAD_N, "3-5, 11": "the round's own lengths, M*N*2 bytes of 256 MiB"}


def main(argv=None) -> int:
    return run_rounds(__doc__, {2: run_round2, 3: run_round3, 4: run_round4, 5: run_round5, 11: run_round11}, argv)


if __name__ == "__main__":
    sys.exit(main())
