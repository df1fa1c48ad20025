"""The any-N softmax probe's backward rounds (GPU only): `python -m probes.softmax_any_n_backward --round K
--out FILE`, K = 6 to 10.

6: 2-byte rows on wide tails and the pipelined persistent grid, fp32 split-row slices; 7: 2-byte split-row
slices and warps in both directions; 8: 2-byte rows of 6,000-16,000 on other warps, the online chunk loop and
narrow slices, torch.compile beside them; 9: the chunk loop with L2 eviction hints; 10: the single-block
kernel reloading y and dy for dx (SoftmaxPlan.reload).
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
from kernels.softmax_plan import MAX_SPLITS, SoftmaxPlan  # noqa: E402
from probes.harness import probe_shape, run_rounds, split_row_plan as _split_row  # noqa: E402

QUESTION = ("Which backward schedules serve off-grid rows: wide tails, pipelined persistent grids, split-row "
            "slices and warps, the online chunk loop (with eviction hints), or reloading y and dy for dx?")
CANDIDATES = ("lab:auto", "lab:single/*", "lab:split/b*w*", "lab:online*", "lab:reload", "torch", "torch.compile",
              "liger")
SHAPES = "2-byte rows of 4,610-28,000 and 6,000-16,000, fp32 split rows of 32,768-262,144; M*N*2 of 256 MiB"
OUTPUTS = {
    "any-n-6": ("notes/probes/2026-11-25-h100-any-n-round6.json.gz",),
    "any-n-7": ("notes/probes/2026-11-25-h100-any-n-round7.json.gz",),
    "any-n-8": ("notes/probes/2026-11-25-h100-any-n-round8.json.gz",),
    "any-n-9": ("notes/probes/2026-11-25-h100-any-n-round9.json.gz",),
    "any-n-10": ("notes/probes/2026-11-25-h100-any-n-round10.json.gz",),
}


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


def _probe_shapes(result: dict, start: float, deadline: float, rounds: int, out: Path, shapes, plans,
                  backward_extra=None) -> list[dict]:
    """probe_shape at each (M or None, N, dtype, directions) of `shapes` with `plans` (and backward_extra),
    writing `out` after each, until the deadline (then result["stopped_at"] names the first shape not probed)."""
    rows: list[dict] = []
    for m, n, dtype, directions in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        rows += probe_shape(n, dtype, result["copy_ceiling_gbs"], rounds, plans, m, directions,
                            backward_extra=backward_extra)
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
    the candidates extra(y, dy) gives."""
    from kernels import reference as ref_ops

    def more(y: torch.Tensor, dy: torch.Tensor) -> list:
        return [("torch.compile", lambda: ref_ops.compiled_softmax_backward(y, dy)), *extra(y, dy)]

    return _probe_shapes(result, start, deadline, rounds, out, [(None, n, dtype, ("backward",)) for n, dtype in shapes],
                         plans, more)


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


def main(argv=None) -> int:
    return run_rounds(__doc__, {6: run_round6, 7: run_round7, 8: run_round8, 9: run_round9, 10: run_round10}, argv)


if __name__ == "__main__":
    sys.exit(main())
