"""Tuning probe for rows off the sweep grid (GPU only): the softmax forward and backward at row lengths that
are not powers of two, odd ones included, with and without the 16-byte row cut (SoftmaxPlan.edges), against
other warps, split-row slices and the peers. Chooses the plan settings the experiment `softmax-any-n` then
judges; it is a tuning instrument, not evidence (the site's figures come only from run records).

    python tools/probe_any_n.py --out probe.json [--deadline SECONDS] [--n 1001,50257]

Timing: the lab's clock (lab.measure.timing.CudaEventClock: L2 flushed, device held while each round is
queued, candidates interleaved), M chosen so M*N*2 bytes reach 256 MiB; the first 64 rows of every candidate
are checked against float64 before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import reference  # noqa: E402
from kernels.softmax import plan_softmax, softmax_bwd, softmax_fwd  # noqa: E402
from kernels.softmax_plan import MAX_SPLITS, SoftmaxPlan  # noqa: E402
from probe_common import probe_header  # noqa: E402
from probe_softmax import measure_held  # noqa: E402

# Off the sweep grid: odd lengths, even ones that are not multiples of 16, vocabulary sizes (GPT-2's 50,257,
# Llama 3's 128,256, Qwen's 151,936) and a power of two minus one.
ROW_LENGTHS = (1000, 1531, 2500, 3001, 4500, 6999, 10000, 12345, 20000, 25001, 30000, 40000, 50257, 100000,
               128256, 151936, 262143)
DTYPES = (torch.float32, torch.bfloat16)
MIN_BYTES = 256 << 20
LIGER_MAX_N = 65536


def _split_row(m: int, n: int, block_n: int, warps: int, edges: bool) -> SoftmaxPlan:
    splits = math.ceil(n / block_n)
    return SoftmaxPlan("split_row", block_n, 1, warps, m * splits, splits, edges=edges)


def lab_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    """The auto plan with and without the cut, then its neighbours: other warps, other split-row slices."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto), ("auto-no-cut", dataclasses.replace(auto, edges=False))]
    if auto.impl == "single_block":
        plans += [(f"single/w{w}", dataclasses.replace(auto, num_warps=w))
                  for w in (auto.num_warps // 2, auto.num_warps * 2) if 1 <= w <= 32]
        plans += [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges))
                  for b, w in ((2048, 4), (4096, 4), (4096, 8), (8192, 8)) if n > b and math.ceil(n / b) <= 16]
        head = 1 << (n.bit_length() - 1)  # the largest power of two not above n, and a tail for the rest
        tail = max(16, 1 << max(n - head - 1, 0).bit_length())
        if n > 4096 and head != n and tail < head and (head, tail) != (auto.block_n, auto.tail_n):
            plans += [(f"tail/{head}+{tail}w{w}", dataclasses.replace(auto, block_n=head, tail_n=tail, num_warps=w))
                      for w in (max(4, head // 1024), max(4, head // 512)) if w <= 32]
    elif auto.impl == "split_row":
        plans += [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges))
                  for b, w in ((4096, 4), (8192, 8), (16384, 8), (16384, 16))
                  if (b, w) != (auto.block_n, auto.num_warps) and math.ceil(n / b) <= MAX_SPLITS]
    return plans


def previous_plan(m: int, n: int, dtype: torch.dtype, direction: str) -> SoftmaxPlan:
    """The plan before tools/probe_any_n.py's first round (with the cut): 2-byte forward rows took fp32's
    tail rule, backward split-row slices were 8192 wide on 8 warps."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    if auto.impl == "single_block" and direction == "forward":
        return dataclasses.replace(plan_softmax(m, n, torch.float32, "auto", True, direction), edges=auto.edges)
    if auto.impl == "split_row" and direction == "backward":
        return _split_row(m, n, 8192, 8, auto.edges)
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


def forward_candidates(x: torch.Tensor, plans) -> list:
    y = torch.empty_like(x)
    out = [(f"lab:{name}", lambda p=plan: softmax_fwd(x, p, out=y)) for name, plan in plans]
    out.append(("torch", lambda: torch.softmax(x, -1)))
    if x.shape[1] <= LIGER_MAX_N:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        out.append(("liger", lambda: LigerSoftmaxFunction.apply(x)))
    return out


def backward_candidates(y: torch.Tensor, dy: torch.Tensor, plans) -> list:
    dx = torch.empty_like(y)
    out = [(f"lab:{name}", lambda p=plan: softmax_bwd(y, dy, p, out=dx)) for name, plan in plans]
    out.append(("torch", lambda: torch._softmax_backward_data(dy, y, -1, y.dtype)))
    if y.shape[1] <= LIGER_MAX_N:
        from experiments._softmax import _liger_backward
        out.append(("liger", lambda: _liger_backward(y, dy)))
    return out


def probe_shape(n: int, dtype: torch.dtype, ceiling: float, rounds: int, plans=lab_plans, m: int | None = None,
                directions=("forward", "backward"), extra=()) -> list[dict]:
    m = m or math.ceil(MIN_BYTES / (2 * n))
    size = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device="cuda").manual_seed(n)
    x = (torch.randn(m, n, device="cuda", generator=gen) * 3).to(dtype)
    key = {"dtype": str(dtype).removeprefix("torch."), "M": m, "N": n}
    rows = []
    if "forward" in directions:
        rows += measure_held(forward_candidates(x, plans(m, n, dtype, "forward")) + [(v, f(x)) for v, f in extra],
                             reference.softmax_float64(x[:64]), 2 * m * n * size, ceiling,
                             {**key, "direction": "forward"}, rounds)
    if "backward" not in directions:
        return rows
    y = torch.softmax(x.float(), -1).to(dtype)
    del x
    dy = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    rows += measure_held(backward_candidates(y, dy, plans(m, n, dtype, "backward")),
                         reference.softmax_backward(y[:64].double(), dy[:64].double()), 3 * m * n * size, ceiling,
                         {**key, "direction": "backward"}, rounds)
    del y, dy
    torch.cuda.empty_cache()
    return rows


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


def summarize(rows: list[dict]) -> None:
    print("\n== auto, no cut / previous, best lab variant, best peer (% of the copy ceiling)")
    keys = sorted({(r["direction"], r["dtype"], r["N"]) for r in rows})
    for key in keys:
        at = {r["variant"]: r for r in rows if (r["direction"], r["dtype"], r["N"]) == key and "pct" in r}
        lab = max((r for v, r in at.items() if v.startswith("lab:")), key=lambda r: r["pct"], default=None)
        peer = max((r for v, r in at.items() if not v.startswith("lab:")), key=lambda r: r["pct"], default=None)
        pct = lambda v: f"{at[v]['pct']:5.1f}" if v in at else "  -  "  # noqa: E731
        print(f"{key[0]:<8} {key[1]:<8} N={key[2]:<7} auto {pct('lab:auto')} no-cut {pct('lab:auto-no-cut')} prev {pct('lab:previous')} "
              f"best {lab['variant'] if lab else '-':<18} {lab['pct'] if lab else float('nan'):5.1f} "
              f"peer {peer['variant'] if peer else '-':<6} {peer['pct'] if peer else float('nan'):5.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=480.0, help="stop starting shapes after this many s")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--n", type=lambda s: tuple(int(v) for v in s.split(",")), default=ROW_LENGTHS)
    parser.add_argument("--round", type=int, choices=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), default=1,
                        help="1: the cut and the plans' neighbours; 2: the chosen rules against the previous plan "
                             "at other lengths, the sweeps' lengths, and the pipelined split-row lead; 3: 16-bit "
                             "forward rows held in their storage dtype (fewer registers, more programs an SM); 4: persistent "
                             "16-bit forward programs whose next rows' loads are pipelined (tl.range stages)"
                             "; 5: round 4's persistent schedule on the auto plan's lanes at lengths it was not "
                             "chosen on, and at the forward sweep's M; 6: the backward: 2-byte rows on wide tails "
                             "and the pipelined persistent grid, fp32 split-row slices by how they fill the row; 7: 2-byte "
                             "split-row slices and warps in both directions, round 6's rules at lengths they were "
                             "not chosen on; 8: 2-byte backward rows of 6,000-16,000 on other warps, the online chunk loop and narrow "
                             "split-row slices, torch.compile beside them; 9: round 8's chunk loop with L2 eviction hints; "
                             "10: the single-block backward reloading y and dy for dx (SoftmaxPlan.reload)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("probe_any_n: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    result = probe_header(timing="lab clock: L2 flushed, device held, candidates interleaved", rows=[])
    runners = {2: run_round2, 3: run_round3, 4: run_round4, 5: run_round5, 6: run_round6, 7: run_round7, 8: run_round8, 9: run_round9, 10: run_round10}
    if args.round in runners:
        result["rows"] = runners[args.round](result, start, args.deadline, args.rounds, args.out)
        args.n = ()
    for n in args.n:
        for dtype in DTYPES:
            if time.time() - start > args.deadline:
                result["stopped_at"] = {"N": n, "dtype": str(dtype)}
                break
            result["rows"] += probe_shape(n, dtype, result["copy_ceiling_gbs"], args.rounds)
            args.out.write_text(json.dumps(result, indent=1))
    result["wall_s"] = time.time() - start
    args.out.write_text(json.dumps(result, indent=1))
    summarize(result["rows"])
    return 0



# ---------------------------------------------------------------------------------------------------------
# A lead for long 16-bit rows: split-row whose programs stay resident and overlap the wait with the next slice
# ---------------------------------------------------------------------------------------------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.softmax_split_row_kernels import _wait_for_row  # noqa: E402


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
# Round 6: the backward. 2-byte single-block rows take fp32's tail rule and one row a program (N = 4610 holds
# one 8192 block); the forward's wide tails and pipelined persistent grid are tried on them. fp32 split-row
# slices of 4096 and 8192 where both fill the row alike (the long-rows experiment's M*N = 2^28).
# ---------------------------------------------------------------------------------------------------------

ROUND6_N = (4610, 5000, 6500, 9512, 10920, 12500, 15000, 18000, 21439, 24576, 28000)
ROUND6_FP16_N = (4610, 10920, 21439)
ROUND6_FP32_SPLIT_N = (32768, 65536, 131072, 262144, 40000, 50257, 100000, 151936)
SHARED_MEMORY_LIMIT = 220_000  # bytes a program's pipeline stages may take (228 KiB an SM on Hopper)


def round6_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    """The auto backward plan, then: one row a program on head + tail lanes (tail up to half the head), and
    both lane layouts on a persistent grid of 1 or 2 programs an SM with 2 or 3 stages (warps of the row plan)."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto)]
    if auto.impl == "split_row":
        return plans + [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges))
                        for b, w in ((4096, 4), (8192, 8), (8192, 4), (16384, 8))
                        if (b, w) != (auto.block_n, auto.num_warps) and math.ceil(n / b) <= MAX_SPLITS]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    size = torch.empty((), dtype=dtype).element_size()
    head = 1 << (n.bit_length() - 1)
    tail = max(16, 1 << max(n - head - 1, 0).bit_length())
    row_plan = dataclasses.replace(auto, rows_per_program=1, grid=m, edges=n % 16 != 0)
    layouts = [(auto.block_n, auto.tail_n, auto.num_warps)]
    if head != n and head >= 4096 and tail <= head // 2 and (head, tail) != (auto.block_n, auto.tail_n):
        warps = min(16, max(4, head // 1024))
        layouts.append((head, tail, warps))
        plans.append((f"row/b{head}+{tail}w{warps}", dataclasses.replace(row_plan, block_n=head, tail_n=tail,
                                                                         num_warps=warps)))
    for b, t, w in layouts:
        for stages in (2, 3):
            if (b + t) * size * 2 * stages > SHARED_MEMORY_LIMIT:
                continue
            for per_sm in (1, 2):
                plans.append((f"pers/b{b}+{t}w{w}s{stages}p{per_sm}",
                              dataclasses.replace(row_plan, block_n=b, tail_n=t, num_warps=w,
                                                  grid=min(m, per_sm * sms), stages=stages)))
    return plans


def _probe_shapes(result: dict, start: float, deadline: float, rounds: int, out: Path, shapes, plans) -> list[dict]:
    """probe_shape at each (M or None, N, dtype, directions) of `shapes` with `plans`, writing `out` after each,
    until the deadline (then result["stopped_at"] names the first shape not probed)."""
    rows: list[dict] = []
    for m, n, dtype, directions in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        rows += probe_shape(n, dtype, result["copy_ceiling_gbs"], rounds, plans, m, directions)
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    return rows


def run_round6(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    backward = ("backward",)
    shapes = [(None, n, torch.bfloat16, backward) for n in ROUND6_N]
    shapes += [(None, n, torch.float16, backward) for n in ROUND6_FP16_N]
    shapes += [(2**28 // n, n, torch.float32, backward) for n in ROUND6_FP32_SPLIT_N]
    return _probe_shapes(result, start, deadline, rounds, out, shapes, round6_plans)


# ---------------------------------------------------------------------------------------------------------
# Round 7: 2-byte split-row rows (forward 74-82%, backward 69-85% of the ceiling in the records) on other
# slice widths and warps; round 6's rules (4096 head + 1024 tail for the 2-byte backward, fp32 backward
# slices of 8192 on 4 warps unless 4096 fill the row better) at lengths they were not chosen on.
# ---------------------------------------------------------------------------------------------------------

ROUND7_SPLIT_N = (36481, 50257, 65536, 100000, 131072, 200001)
ROUND7_SLICES = ((4096, 2), (4096, 4), (4096, 8), (8192, 4), (8192, 8), (16384, 8), (16384, 16))
ROUND7_RULE_SHAPES = ((4700, torch.bfloat16), (5120, torch.float16), (4609, torch.bfloat16),
                      (17001, torch.float32), (20000, torch.float32), (24577, torch.float32),
                      (33333, torch.float32))


def round7_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto)]
    if auto.impl == "split_row":
        slices = ROUND7_SLICES if dtype != torch.float32 else ((4096, 4), (8192, 4), (8192, 8))
        return plans + [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges)) for b, w in slices
                        if (b, w) != (auto.block_n, auto.num_warps) and math.ceil(n / b) <= MAX_SPLITS]
    one_block = 1 << (n - 1).bit_length()
    if (auto.block_n, auto.tail_n) != (one_block, 0):
        warps = 16 if one_block >= 8192 else 8
        plans.append((f"row/b{one_block}w{warps}", dataclasses.replace(auto, block_n=one_block, tail_n=0,
                                                                        num_warps=warps)))
    return plans


def run_round7(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    shapes = [(None, n, dtype, ("backward",)) for n, dtype in ROUND7_RULE_SHAPES]
    shapes += [(None, n, torch.bfloat16, ("forward", "backward")) for n in ROUND7_SPLIT_N]
    shapes += [(None, n, torch.float16, ("backward",)) for n in ROUND7_SPLIT_N[::2]]
    return _probe_shapes(result, start, deadline, rounds, out, shapes, round7_plans)


# ---------------------------------------------------------------------------------------------------------
# Round 8: 2-byte backward rows of 6,000-16,000, where torch.compile reaches 97-101% of the ceiling and the
# lab's one 16,384-lane block on 16 warps 91-95%: other warps, the online schedule's chunk loop (pass one
# reduces sum(y * dy) chunk by chunk, pass two re-reads y and dy, from L2 while the rows in flight fit), and
# narrow split-row slices; torch.compile's backward timed beside them.
# ---------------------------------------------------------------------------------------------------------

ROUND8_N = ((9512, torch.bfloat16), (10920, torch.bfloat16), (9512, torch.float16), (10920, torch.float16),
            (6500, torch.bfloat16), (7777, torch.bfloat16), (9001, torch.bfloat16), (12000, torch.bfloat16),
            (13001, torch.bfloat16), (15000, torch.float16), (16384, torch.bfloat16))
ROUND8_ONLINE = ((1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8))


@triton.jit
def _bwd_online_aligned_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, row_stride, BLOCK_N: tl.constexpr,
                               ALIGN: tl.constexpr, EVICT: tl.constexpr):
    # The lab's online backward with the row length and stride hinted multiples of ALIGN elements (true for the
    # rows this probe gives it), so the masked loads can be 16-byte vectors as in a kernel compiled for one N.
    # EVICT: the first pass's loads ask L2 to keep their lines (evict_last) and the second pass's to drop
    # them (evict_first), as Inductor's looped reductions do.
    n_cols = tl.multiple_of(n_cols, ALIGN)
    row_stride = tl.multiple_of(row_stride, ALIGN)
    row = tl.program_id(0).to(tl.int64)
    y_row, dy_row, dx_row = y_ptr + row * row_stride, dy_ptr + row * row_stride, dx_ptr + row * row_stride
    offs = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    keep: tl.constexpr = "evict_last" if EVICT else ""
    drop: tl.constexpr = "evict_first" if EVICT else ""
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        y = tl.load(y_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=keep).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=keep).to(tl.float32)
        acc += y * dy
    dot = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        y = tl.load(y_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=drop).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=drop).to(tl.float32)
        tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=cols < n_cols)


def _online_aligned(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, block_n: int, warps: int,
                    evict: bool = False, align: int | None = None):
    m, n = y.shape
    align = 16 // y.element_size() if align is None else align
    _bwd_online_aligned_kernel[(m,)](y, dy, dx, n, y.stride(0), BLOCK_N=block_n, ALIGN=align, EVICT=evict,
                                     num_warps=warps)
    return dx


def round8_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto)]
    if auto.impl == "single_block":
        plans += [(f"single/w{w}", dataclasses.replace(auto, num_warps=w)) for w in (8, 32) if w != auto.num_warps]
    plans += [(f"online/b{b}w{w}", SoftmaxPlan("online", b, 1, w, m)) for b, w in ROUND8_ONLINE if b < n]
    plans += [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges)) for b, w in ((2048, 4), (4096, 4))]
    return plans


def run_round8(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return _backward_rounds(result, start, deadline, rounds, out, ROUND8_N, round8_plans, _round8_extra)


def _round8_extra(y: torch.Tensor, dy: torch.Tensor) -> list:
    if y.shape[1] % (16 // y.element_size()):
        return []
    dx = torch.empty_like(y)
    return [(f"lab:online-aligned/b{b}w{w}", lambda b=b, w=w: _online_aligned(y, dy, dx, b, w))
            for b, w in ROUND8_ONLINE if b < y.shape[1]]


def _backward_rounds(result: dict, start: float, deadline: float, rounds: int, out: Path, shapes, plans,
                     extra) -> list[dict]:
    """The backward at each (N, dtype) of `shapes`: the lab's `plans`, the peers, torch.compile's backward and
    the candidates extra(y, dy) gives, writing `out` after each shape until the deadline."""
    from kernels import reference as ref_ops

    rows: list[dict] = []
    for n, dtype in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            break
        m = math.ceil(MIN_BYTES / (2 * n))
        gen = torch.Generator(device="cuda").manual_seed(n)
        y = torch.softmax(torch.randn(m, n, device="cuda", generator=gen).float() * 3, -1).to(dtype)
        dy = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
        size = y.element_size()
        candidates = backward_candidates(y, dy, plans(m, n, dtype, "backward"))
        candidates.append(("torch.compile", lambda: ref_ops.compiled_softmax_backward(y, dy)))
        candidates += extra(y, dy)
        rows += measure_held(candidates, reference.softmax_backward(y[:64].double(), dy[:64].double()),
                             3 * m * n * size, result["copy_ceiling_gbs"],
                             {"dtype": str(dtype).removeprefix("torch."), "M": m, "N": n, "direction": "backward"},
                             rounds)
        del y, dy
        torch.cuda.empty_cache()
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    return rows


# ---------------------------------------------------------------------------------------------------------
# Round 9: round 8's online chunk loop with L2 eviction hints (the first pass keeps its lines, the second
# drops them, as Inductor's looped reductions do), at the lengths where torch.compile led and at held-out ones.
# ---------------------------------------------------------------------------------------------------------

ROUND9_N = ((9512, torch.bfloat16), (10920, torch.bfloat16), (9001, torch.bfloat16), (13001, torch.bfloat16),
            (12000, torch.bfloat16), (10920, torch.float16), (6500, torch.bfloat16), (16384, torch.bfloat16),
            (9512, torch.float32), (10920, torch.float32))
ROUND9_ONLINE = ((2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16))


def round9_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto), ("online/b4096w8", SoftmaxPlan("online", 4096, 1, 8, m))]
    if auto.impl == "single_block" and auto.num_warps != 8:
        plans.append(("single/w8", dataclasses.replace(auto, num_warps=8)))
    return plans


def _round9_extra(y: torch.Tensor, dy: torch.Tensor) -> list:
    n = y.shape[1]
    align = 16 // y.element_size() if n % (16 // y.element_size()) == 0 else 1
    dx = torch.empty_like(y)
    return [(f"lab:online-evict-a{align}/b{b}w{w}", lambda b=b, w=w: _online_aligned(y, dy, dx, b, w, True, align))
            for b, w in ROUND9_ONLINE if b < n]


def run_round9(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return _backward_rounds(result, start, deadline, rounds, out, ROUND9_N, round9_plans, _round9_extra)


# ---------------------------------------------------------------------------------------------------------
# Round 10: the single-block backward with SoftmaxPlan.reload (y and dy loaded again for dx instead of held
# across the reduction, the first loads kept in L2, the second dropped: round 9 read Inductor's kernel, which
# reloads so, at 96-100% where the lab held the row at 91-95%), on the auto plan's lanes and other warps.
# ---------------------------------------------------------------------------------------------------------

ROUND10_N = tuple((n, torch.bfloat16) for n in (2057, 3001, 4610, 6500, 8244, 9001, 9512, 10000, 10920, 12000,
                                                13001, 15000, 16384, 21439, 28000))
ROUND10_N += ((9512, torch.float16), (10920, torch.float16), (4396, torch.float32), (9512, torch.float32),
              (12000, torch.float32), (20000, torch.float32))


def round10_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto)]
    if auto.impl != "single_block" or auto.rows_per_program != 1 or auto.stages != 1:
        return plans
    for w in sorted({auto.num_warps, 8, 16, 32}):
        if w >= auto.num_warps // 2:
            plans.append((f"reload/w{w}", dataclasses.replace(auto, num_warps=w, reload=True)))
    return plans


def run_round10(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return _backward_rounds(result, start, deadline, rounds, out, ROUND10_N, round10_plans, lambda y, dy: [])


if __name__ == "__main__":
    sys.exit(main())
