"""Round 14 of the any-N softmax probe (GPU only: `python -m probes.softmax_any_n_packed --out FILE`): the 2-byte
forward holding its row packed, two elements to a 32-bit register.

Why. A forward program holds its slice from the load to the store: through the row's reductions, and in a
split row through the wait for the row's other slices. The lab's kernels hold it as fp32 (x, or e = exp(x - m)),
four bytes of registers a lane whatever the storage dtype. The register file then bounds the bytes a GPU has
in flight per SM at the same figure in lanes for every dtype, which for 2-byte rows is half the bytes of an
fp32 row: fp32 split rows measure 96% of the copy ceiling, bf16 ones 76-83% on the same slices (records at
31439f9). Round 3 tried holding bf16 values and recomputing exp at the store; the compiler kept one 32-bit
register per element and occupancy hardly moved.

What. The slice's aligned body is loaded as int32 words, each two 2-byte elements, and only the words are
held: the fp32 values are unpacked from them (bf16: a shift or a mask; fp16: a conversion) for the maximum,
again for the sum, and again, with exp recomputed, for the store, where pairs are packed back into words.
Each unpacking after the first reads the words through an opaque zero (inline PTX), so the compiler cannot
keep an earlier unpacking's fp32 values alive instead (compiled for sm_90 with the launch's alignment, the
kernel then holds 8192 lanes on 4 warps in fewer registers than the lab's fp32-holding kernel). The numerics
are the lab's: the same exp of the same fp32 values, one rounding at the store. Costs: a second exp per
element, and rows must be cut at 16-byte boundaries (the cut's head and tail stay fp32, as in the lab's
kernels) or be aligned whole.

Candidates, forward only, 2-byte: split rows meeting through tickets (the lab's scheme) and as one cluster
(rounds 12-13's), slices of 8192 and 16,384 lanes; one row a program (no wait) up to 65,536 lanes; beside the
auto plan and the peers. At the one-row lengths below 90%, also the lab's own kernel on other warps and
lanes (round14_plans): the warps of its table are fp32's, 16 elements a thread at 4096 and 8192 lanes. The
kernels run under Triton's interpreter too (one slice a row, or one row a program), which
tests/test_probe_any_n.py uses to check them against the lab's forward.
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

from kernels._checks import interpreter_enabled  # noqa: E402
from kernels._launch import MAX_CLUSTER, bind  # noqa: E402
from kernels.softmax import plan_softmax  # noqa: E402
from kernels.softmax_kernels import _edge_offsets, _row_cut  # noqa: E402
from kernels.softmax_plan import MAX_SPLITS, SoftmaxPlan  # noqa: E402
from kernels.softmax_split_row_kernels import _arrive_and_wait, _cluster_barrier, _take_ticket  # noqa: E402
from probes.harness import MIN_BYTES, deferred, lab_capped, probe_shape, run_rounds, write_output  # noqa: E402

QUESTION = ("Does the 2-byte forward run faster holding its row packed, two elements a 32-bit register, as split "
            "rows (tickets or a cluster) or one row a program; and the lab's own kernels on other warps or under "
            "a register cap?")
CANDIDATES = ("lab:auto", "packed:split{S}x{lanes}w{warps}r{cap}", "packed:cluster*", "packed:row*", "lab:auto-r{cap}",
              "lab:w*", "torch", "liger")
OUTPUTS = {"any-n-14": ("notes/probes/2026-11-25-h100-any-n-round14.json.gz",)}

# Two -inf elements in one word (the fill of masked words): bf16 0xFF80, fp16 0xFC00, as a signed int32.
NEG_INF_PAIR = {torch.bfloat16: 0xFF80FF80 - (1 << 32), torch.float16: 0xFC00FC00 - (1 << 32)}


@triton.jit
def _opaque_zero(value, OPAQUE: tl.constexpr):
    # 0, computed by inline PTX the compiler cannot see through (value only orders it); a plain 0 where
    # OPAQUE is off (Triton's interpreter runs no PTX).
    if OPAQUE:
        return tl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [value], dtype=tl.int32, is_pure=False, pack=1)
    else:
        return 0


@triton.jit
def _unpack(words, IS_BF16: tl.constexpr):
    # A word's two 2-byte elements as fp32: (low half, high half).
    if IS_BF16:
        lo = (words << 16).to(tl.float32, bitcast=True)
        hi = (words & -65536).to(tl.float32, bitcast=True)
    else:
        lo = (words & 65535).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (words >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pack(lo, hi, DTYPE: tl.constexpr):
    # Two fp32 values rounded to DTYPE, as one word (lo in the low half).
    lo_bits = lo.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 65535
    hi_bits = hi.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) << 16
    return hi_bits | lo_bits


@triton.jit
def _row_words(x_ptr, y_ptr, row64, n_cols, x_row_stride, y_row_stride, EDGES: tl.constexpr, VEC: tl.constexpr):
    # The row's aligned body as int32 words: (x words, y words, words in the body, head, elements in the body).
    if EDGES:
        x_start, head, n_main = _row_cut(row64, x_row_stride, n_cols, VEC)
        x_off = x_start + head
        y_off = row64 * y_row_stride + head
    else:
        head = 0
        n_main = n_cols
        x_off = row64 * x_row_stride
        y_off = row64 * y_row_stride
    xw = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + tl.multiple_of(x_off // 2, VEC // 2)
    yw = y_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + tl.multiple_of(y_off // 2, VEC // 2)
    return xw, yw, tl.multiple_of(n_main // 2, VEC // 2), head, n_main


@triton.jit
def _fwd_split_packed_kernel(
    x_ptr, y_ptr, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr, EDGES: tl.constexpr, VEC: tl.constexpr,
    CLUSTER: tl.constexpr, IS_BF16: tl.constexpr, NEG_INF: tl.constexpr, OPAQUE: tl.constexpr,
):
    # The lab's split-row forward (kernels/softmax_split_row_kernels.py) holding its slice as words. CLUSTER:
    # a row's slices are one cluster of the launch (program id order) meeting at its barrier; else tickets.
    if CLUSTER:
        slot = tl.program_id(0)
    else:
        slot = _take_ticket(sync_ptr)
    row = slot // n_splits
    part = slot % n_splits
    row64 = row.to(tl.int64)
    xw, yw, n_words, head, n_main = _row_words(x_ptr, y_ptr, row64, n_cols, x_row_stride, y_row_stride, EDGES, VEC)
    cw = part * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    in_body = cw < n_words
    words = tl.load(xw + cw, mask=in_body, other=NEG_INF)
    lo, hi = _unpack(words, IS_BF16)
    m = tl.maximum(tl.max(lo, axis=0), tl.max(hi, axis=0))
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        edge_in = edge_in & (part == 0)
        x_edge = tl.load(x_ptr + (row64 * x_row_stride + head) + edge, mask=edge_in, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_edge, axis=0))
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    lo, hi = _unpack(words + _opaque_zero(slot, OPAQUE), IS_BF16)
    d = tl.sum(tl.exp(lo - m_safe), axis=0) + tl.sum(tl.exp(hi - m_safe), axis=0)
    if EDGES:
        e_edge = tl.exp(x_edge - m_safe)
        d += tl.sum(e_edge, axis=0)
    tl.store(part_m_ptr + slot, m)
    tl.store(part_d_ptr + slot, d)
    slots = tl.arange(0, SPLITS_POW2)
    if CLUSTER:
        zero = _cluster_barrier(slot)
        parts = row * n_splits + zero + slots
        pm = tl.load(part_m_ptr + parts, mask=slots < n_splits, other=-float("inf"), cache_modifier=".cg")
        pd = tl.load(part_d_ptr + parts, mask=slots < n_splits, other=0.0, cache_modifier=".cg")
    else:
        _arrive_and_wait(sync_ptr + 1 + row, n_splits)
        zero = _opaque_zero(slot, OPAQUE)
        parts = row * n_splits + slots
        pm = tl.load(part_m_ptr + parts, mask=slots < n_splits, other=-float("inf"), volatile=True)
        pd = tl.load(part_d_ptr + parts, mask=slots < n_splits, other=0.0, volatile=True)
    m_row = tl.max(pm, axis=0)
    d_row = tl.sum(tl.where(pm == -float("inf"), 0.0, pd * tl.exp(pm - m_row)), axis=0)
    d_row = tl.where(m_row == -float("inf"), float("nan"), d_row)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m_safe - m_row)) / d_row
    lo, hi = _unpack(words + zero, IS_BF16)
    tl.store(yw + cw, _pack(tl.exp(lo - m_safe) * scale, tl.exp(hi - m_safe) * scale, y_ptr.dtype.element_ty),
             mask=in_body)
    if EDGES:
        tl.store(y_ptr + (row64 * y_row_stride + head) + edge, (e_edge * scale).to(y_ptr.dtype.element_ty),
                 mask=edge_in)


@triton.jit
def _fwd_row_packed_kernel(
    x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, EDGES: tl.constexpr, VEC: tl.constexpr, IS_BF16: tl.constexpr, NEG_INF: tl.constexpr,
    OPAQUE: tl.constexpr,
):
    # One row a program, BLOCK_N >= the row's body lanes, held as words through both reductions.
    row64 = tl.program_id(0).to(tl.int64)
    xw, yw, n_words, head, n_main = _row_words(x_ptr, y_ptr, row64, n_cols, x_row_stride, y_row_stride, EDGES, VEC)
    cw = tl.arange(0, BLOCK_N // 2)
    in_body = cw < n_words
    words = tl.load(xw + cw, mask=in_body, other=NEG_INF)
    lo, hi = _unpack(words, IS_BF16)
    m = tl.maximum(tl.max(lo, axis=0), tl.max(hi, axis=0))
    if EDGES:
        edge, edge_in = _edge_offsets(head, n_main, n_cols, VEC)
        x_edge = tl.load(x_ptr + (row64 * x_row_stride + head) + edge, mask=edge_in, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x_edge, axis=0))
    lo, hi = _unpack(words + _opaque_zero(m.to(tl.int32, bitcast=True), OPAQUE), IS_BF16)
    d = tl.sum(tl.exp(lo - m), axis=0) + tl.sum(tl.exp(hi - m), axis=0)
    if EDGES:
        e_edge = tl.exp(x_edge - m)
        d += tl.sum(e_edge, axis=0)
    inv_d = 1.0 / d
    lo, hi = _unpack(words + _opaque_zero(d.to(tl.int32, bitcast=True), OPAQUE), IS_BF16)
    tl.store(yw + cw, _pack(tl.exp(lo - m) * inv_d, tl.exp(hi - m) * inv_d, y_ptr.dtype.element_ty), mask=in_body)
    if EDGES:
        tl.store(y_ptr + (row64 * y_row_stride + head) + edge, (e_edge * inv_d).to(y_ptr.dtype.element_ty),
                 mask=edge_in)


def _meta(x: torch.Tensor, y: torch.Tensor) -> dict:
    """EDGES (the cut) where a row's length or stride is not a multiple of 16 elements. x and y must share
    their layout and start on 16-byte boundaries: the words are read and written at the same offsets."""
    if x.dtype not in NEG_INF_PAIR or x.stride() != y.stride() or x.stride(1) != 1:
        raise ValueError("packed rows: 2-byte x and y of one row-major layout")
    if x.data_ptr() % 16 or y.data_ptr() % 16:
        raise ValueError("packed rows: x and y must start on 16-byte boundaries")
    return dict(EDGES=x.shape[1] % 16 != 0 or x.stride(0) % 16 != 0, VEC=8, IS_BF16=x.dtype == torch.bfloat16,
                NEG_INF=NEG_INF_PAIR[x.dtype], OPAQUE=not interpreter_enabled())


def slices(n: int, block_n: int) -> int:
    return math.ceil((n + (16 if n % 16 else 0)) / block_n)  # the cut's head and tail, where it has them


def split_forward(x: torch.Tensor, block_n: int, warps: int, cluster: bool, maxnreg: int | None = None):
    """A callable writing softmax(x) with rows split into slices of block_n lanes, held packed; maxnreg caps
    the registers a thread (more programs an SM)."""
    m, n = x.shape
    y = torch.empty_like(x)
    splits = slices(n, block_n)
    parts = torch.empty(2, m * splits, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + m, device=x.device, dtype=torch.int32)
    meta = dict(BLOCK_N=block_n, SPLITS_POW2=max(2, triton.next_power_of_2(splits)), CLUSTER=cluster,
                num_warps=warps, **_meta(x, y))
    if maxnreg:
        meta["maxnreg"] = maxnreg
    args = (x, y, parts[0], parts[1], sync, n, splits, x.stride(0), y.stride(0))
    if cluster:
        launch = bind(_fwd_split_packed_kernel, (m * splits,), args, varying=5, cluster=splits, **meta)

        def run():
            launch(*args[:5])
            return y
        return run

    def run():
        _fwd_split_packed_kernel[(m * splits,)](*args, **meta)
        return y
    return run


def row_forward(x: torch.Tensor, warps: int, maxnreg: int | None = None):
    """A callable writing softmax(x), one row a program holding its row packed."""
    m, n = x.shape
    y = torch.empty_like(x)
    block_n = triton.next_power_of_2(n)
    meta = dict(BLOCK_N=block_n, num_warps=warps, **_meta(x, y))
    if maxnreg:
        meta["maxnreg"] = maxnreg

    def run():
        _fwd_row_packed_kernel[(m,)](x, y, n, x.stride(0), y.stride(0), **meta)
        return y
    return run


# (slice lanes, warps, register cap or None). Compiled for sm_90 with the launch's alignment (bf16, cut rows),
# the packed kernel holds 8192 lanes on 4 warps in 80 registers a thread (the lab's fp32-holding one: 91), 64
# under a cap of 64 without spilling (8 programs an SM: 128 KiB of loads in flight); 16,384 lanes on 4 warps in
# 144, 104 capped without spilling, 96 with 12 bytes spilled (5 programs an SM, 160 KiB; fp32 rows' 8192
# lanes on 4 warps take 107 registers: 4 programs, 128 KiB). Clustered, 127 and 228 uncapped. Read with
# probes/occupancy.py.
ROUND14_SPLITS = ((8192, 4, None), (8192, 4, 64), (16384, 4, 104), (16384, 4, 96), (16384, 8, 64))
ROUND14_CLUSTERS = ((8192, 4, 64), (16384, 4, 96), (16384, 8, 64))
# One row a program: 64 lanes a thread (warps = lanes / 2048), uncapped and capped. Compiled as above, 16,384
# lanes on 8 warps hold in 121 registers packed, 72 capped without spilling (the lab's one-row kernel needs 80
# to spill nothing); 32,768 on 16 warps likewise.
ROUND14_ROW_CAPS = (None, 72, 64)
ROUND14_ROW_MAX_N = 65536
# 2-byte lengths below the forward's targets in the records at 31439f9: one-row plans of 9,512-22,403, split rows
# of 33,333-262,144 (powers of two among them).
ROUND14_N = tuple((n, torch.bfloat16) for n in (9512, 17523, 21439, 22403, 33333, 41187, 62058, 65536, 97994,
                                                131072, 162321, 262144))
ROUND14_N += ((21439, torch.float16), (41187, torch.float16), (75029, torch.float16))


# The lab's own kernels under a register cap, where the compiled kernel holds fewer programs an SM than its
# plan assumes (compiled for sm_90 with the launch's alignment, ptxas -v): the pipelined forward of a 16,384
# head and an 8192 tail on 16 warps (N = 20,481-24,576: 21,439 and 22,403 at 76-78% in the records) uses 128
# registers a thread, so one program an SM fits where its grid asks for two; capped at 64 (24 bytes spilled)
# two fit. The split-row forward's 8192 lanes on 4 warps use 91 (five an SM); capped at 80 (20 bytes spilled),
# six.
LAB_CAPS = {"pipelined16": 64, "split8192": 80}


def round14_candidates(n: int) -> list[tuple[str, object]]:
    """(name, f(x) -> callable) of round 14 at row length n."""
    out = []
    for block_n, warps, cap in ROUND14_SPLITS:
        if 2 <= slices(n, block_n) <= MAX_SPLITS:
            out.append((f"packed:split{slices(n, block_n)}x{block_n}w{warps}r{cap or 0}",
                        deferred(lambda x, b=block_n, w=warps, c=cap: split_forward(x, b, w, False, c))))
    for block_n, warps, cap in ROUND14_CLUSTERS:
        if 2 <= slices(n, block_n) <= MAX_CLUSTER:
            out.append((f"packed:cluster{slices(n, block_n)}x{block_n}w{warps}r{cap or 0}",
                        deferred(lambda x, b=block_n, w=warps, c=cap: split_forward(x, b, w, True, c))))
    if n <= ROUND14_ROW_MAX_N:
        block_n = triton.next_power_of_2(n)
        warps = max(1, block_n // 2048)
        for cap in ROUND14_ROW_CAPS:
            out.append((f"packed:row{block_n}w{warps}r{cap or 0}",
                        deferred(lambda x, w=warps, c=cap: row_forward(x, w, c))))
    return out


# One-row 2-byte lengths below 90% in the records at 31439f9 (85-90%), where the plans' warps come from fp32's
# table (16 elements a thread at 4096 and 8192 lanes): the lab's own kernel on half the warps, a 4096 head with
# a tail of up to 1024 lanes on 4 warps (the backward's rule), the pipelined plans as one row a program, and
# the packed one-row kernel.
ROUND14_SINGLE_N = tuple((n, torch.bfloat16) for n in (2057, 2490, 4610, 4709, 4993, 9177, 9512, 10193, 10920,
                                                       11261, 19211))
ROUND14_SINGLE_N += ((2057, torch.float16), (4610, torch.float16), (10920, torch.float16))
# ...and the two fp32 forward lengths where Liger led in those records (4396 and 8244: 0.980x and 0.985x, the
# lab at 98.6-98.7% of the ceiling on a head plus a short tail, Liger on one padded block at 32 elements a
# thread), with two fp32 tail lengths beside them: one padded block at 32 and 16 elements a thread.
ROUND14_FP32_N = tuple((n, torch.float32) for n in (4396, 4610, 8244, 9177))


def round14_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    """The auto plan and the lab-kernel variants round 14 times at a one-row length."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    out = [("auto", auto)]
    if auto.impl != "single_block":
        return out
    one_row = dataclasses.replace(auto, stages=1, grid=m)
    lanes = n + (16 if auto.edges else 0)
    if dtype == torch.float32:  # (head, tail, warps): one padded block at 32 and 16 elements a thread
        padded = triton.next_power_of_2(lanes)
        variants = [(padded, 0, w) for w in (padded // 1024, padded // 512) if 1 <= w <= 32]
    else:  # the auto plan's lanes one row a program, on its warps and on half, then other lanes
        head, tail, warps = one_row.block_n, one_row.tail_n, one_row.num_warps
        variants = [(head, tail, warps)] + ([(head, tail, warps // 2)] if warps > 1 else [])
        if 4096 < lanes <= 5120:
            variants.append((4096, 1024, 4))
        if 8192 < lanes <= 10240:
            variants.append((8192, 2048, 8))
        if 10240 < lanes <= 12288:  # three programs an SM where 16,384 lanes hold two
            variants.append((8192, 4096, 8))
        if 8192 < lanes <= 16384:
            variants.append((16384, 0, 8))
    seen = {auto}
    for block_n, tail_n, warps in variants:
        plan = dataclasses.replace(one_row, block_n=block_n, tail_n=tail_n, num_warps=warps)
        if plan not in seen:
            seen.add(plan)
            out.append((f"one-row/{plan.block_n}+{plan.tail_n}w{plan.num_warps}", plan))
    return out


def lab_capped_candidates(m: int, n: int, dtype: torch.dtype) -> list[tuple[str, object]]:
    """(name, f(x) -> callable): the auto plan under LAB_CAPS where it applies."""
    auto = plan_softmax(m, n, dtype, "auto", True, "forward")
    if auto.impl == "single_block" and auto.stages > 1 and auto.num_warps == 16:
        cap = LAB_CAPS["pipelined16"]
    elif auto.impl == "split_row" and (auto.block_n, auto.num_warps) == (8192, 4):
        cap = LAB_CAPS["split8192"]
    else:
        return []
    return [(f"lab:auto-r{cap}", deferred(lambda x, p=auto, c=cap: lab_capped(x, p, c)))]


def run_round14(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    def auto_only(m, n, dtype, direction):
        return [("auto", plan_softmax(m, n, dtype, "auto", True, direction))]

    shapes = [(n, dtype, round14_plans) for n, dtype in ROUND14_SINGLE_N + ROUND14_FP32_N]
    shapes += [(n, dtype, auto_only) for n, dtype in ROUND14_N]
    rows: list[dict] = []
    for n, dtype, plans in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        m = math.ceil(MIN_BYTES / (2 * n))
        extra = (round14_candidates(n) if dtype in NEG_INF_PAIR else []) + lab_capped_candidates(m, n, dtype)
        rows += probe_shape(n, dtype, result["copy_ceiling_gbs"], rounds, plans, m, ("forward",), extra)
        result["rows"] = rows
        write_output(out, result)
    return rows


SHAPES = tuple(ROUND14_SINGLE_N + ROUND14_FP32_N + ROUND14_N)


def main(argv=None) -> int:
    return run_rounds(__doc__, {14: run_round14}, argv)


if __name__ == "__main__":
    sys.exit(main())
