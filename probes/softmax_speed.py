"""Tuning probe for the softmax schedules (GPU only): times launch-plan variants the public dispatch does not
expose, to choose the settings tables in kernels/softmax.py.

This is a tuning instrument, not evidence: the site's figures come only from tools/build_results.py run
records. Its JSON output is kept under notes/probes/ beside the notes that cite it.

    python -m probes.softmax_speed --out probe.json [--quick] [--round 1|3|4|5|6|7|8|9|10|11]

Timing: rounds 1 and 3 use triton.testing.do_bench (CUDA events, L2 cleared before every call, median of
the samples); rounds 4-11 use the lab's own clock (lab.measure.timing.CudaEventClock: the same flush, the device held
while each round is queued so host time never shows, candidates interleaved), the clock of the run records.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import reference  # noqa: E402
from experiments._softmax import _liger_backward  # noqa: E402
from kernels.softmax import (  # noqa: E402
    SoftmaxPlan, _softmax_fwd_row_kernel, _softmax_fwd_single_block_kernel, plan_softmax, softmax_bwd, softmax_fwd,
)
from kernels.softmax_split_row_kernels import _wait_for_row  # noqa: E402
from probes.harness import HELD_TIMING, measure_held, probe_header, write_output  # noqa: E402

QUESTION = ("Which launch-plan settings (warps, tails, rows a program, split-row slices, L2 reuse, cache "
            "modifiers, one-row kernels, row-offset widths) bring the softmax schedules closest to the copy "
            "ceiling, on the H200 and then the H100?")
CANDIDATES = ("lab:auto", "lab:* settings the dispatch does not expose", "torch", "liger")
SHAPES = "the sweeps' shapes at M*N = 2^28 (1 GiB of fp32), short rows at M = 4096"
OUTPUTS = {
    "speed-h200-1": ("notes/probes/2026-11-22-h200-probe1.json.gz",),
    "speed-h200-2": ("notes/probes/2026-11-22-h200-probe2-persistent.json.gz",),
    "speed-h200-3": ("notes/probes/2026-11-22-h200-probe3-lean-tickets.json.gz",),
    "speed-h200-4": ("notes/probes/2026-11-22-h200-probe4-restored.json.gz",),
    "speed-h200-5": ("notes/probes/2026-11-22-h200-probe5-tails-short-rows-backoff.json.gz",),
    "speed-h200-6": ("notes/probes/2026-11-22-h200-probe6-chosen-settings.json.gz",),
    "speed-4": ("notes/probes/2026-11-22-h100-round4-l2-reuse-and-settings.json.gz",),
    "speed-5": ("notes/probes/2026-11-22-h100-round5-tails-short-rows-slices-a.json.gz",
                "notes/probes/2026-11-22-h100-round5-tails-short-rows-slices-b.json.gz"),
    "speed-6": ("notes/probes/2026-11-22-h100-round6-cache-modifiers-short-rows-backward.json.gz",),
    "speed-7": ("notes/probes/2026-11-22-h100-round7-lean-split-row-backward-settings.json.gz",),
    "speed-8": ("notes/probes/2026-11-23-h100-round8-one-row-kernels.json.gz",
                "notes/probes/2026-11-23-h100-round8-one-row-kernels-tails.json"),
    "speed-9": ("notes/probes/2026-11-23-h100-round9-one-row-forward.json.gz",),
    "speed-10": ("notes/probes/2026-11-23-h100-round10-bf16-backward-slices-short-forward.json",),
    "speed-11": ("notes/probes/2026-11-23-h100-round11-row-offset-width.json.gz",),
}

softmax_module = importlib.import_module("kernels.softmax")  # the package's `softmax` attribute is the function

TOTAL = 2**28  # elements per case: 1 GiB of fp32, far past the 50 MB L2


def time_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def check(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def measure(candidates, ref: torch.Tensor, nbytes: int, ceiling: float, key: dict) -> list[dict]:
    """Check each candidate's first 64 rows against `ref`, then time it; one printed row per candidate."""
    rows = []
    for name, fn in candidates:
        row = {**key, "variant": name}
        try:
            err = check(fn()[:64], ref)
            ms = time_ms(fn)
            gbs = nbytes / ms / 1e6
            row.update(ms=ms, gbs=gbs, pct=100 * gbs / ceiling, rel_err=err)
        except Exception as e:  # a variant that cannot run this shape is a finding, not a crash
            row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _split_row_plan(m: int, n: int, block_n: int, warps: int) -> SoftmaxPlan:
    splits = triton.cdiv(n, block_n)
    return SoftmaxPlan("split_row", block_n, 1, warps, m * splits, splits)


def forward_variants(m: int, n: int, dtype: torch.dtype):
    yield "auto", plan_softmax(m, n, dtype, "auto", True)
    yield "online", plan_softmax(m, n, dtype, "online")
    if n <= 65536:
        base = plan_softmax(m, n, dtype, "single_block")
        for warps in (4, 8, 16, 32):
            if base.block_n // (32 * warps) >= 4:
                yield f"single_block/w{warps}", SoftmaxPlan("single_block", base.block_n, base.rows_per_program, warps, base.grid)
        if base.block_n <= 2048:
            for rows in (1, 2, 4, 8):
                if rows != base.rows_per_program:
                    yield f"single_block/r{rows}", SoftmaxPlan("single_block", base.block_n, rows, base.num_warps, triton.cdiv(m, rows))
    if n >= 16384:
        for block_n in (4096, 8192, 16384):
            for warps in (4, 8, 16):
                plan = _split_row_plan(m, n, block_n, warps)
                if 2 <= plan.splits <= 64 and block_n // (32 * warps) >= 8:
                    yield f"split_row/b{block_n}w{warps}", plan


def peers_forward(n: int):
    yield "torch.softmax", reference.torch_softmax
    yield "torch.compile", reference.compiled_softmax
    if n <= 65536:
        try:
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            yield "liger", LigerSoftmaxFunction.apply
        except ImportError:
            pass


def backward_variants(m: int, n: int, dtype: torch.dtype):
    yield "auto", plan_softmax(m, n, dtype, "auto", True)
    yield "online", plan_softmax(m, n, dtype, "online")
    if n <= 32768:
        base = plan_softmax(m, n, dtype, "single_block")
        for warps in (4, 8, 16, 32):
            if base.block_n // (32 * warps) >= 4 and warps != base.num_warps:
                yield f"single_block/w{warps}", SoftmaxPlan("single_block", base.block_n, base.rows_per_program, warps, base.grid)
    if n >= 16384:
        for block_n, warps in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16)):
            plan = _split_row_plan(m, n, block_n, warps)
            if 2 <= plan.splits <= 64:
                yield f"split_row/b{block_n}w{warps}", plan


_OLD_WARPS = {"forward": ((2048, 4), (4096, 8), (16384, 16), (131072, 32)),
              "backward": ((2048, 4), (4096, 8), (32768, 16), (131072, 32))}
_OLD_BYTES_PER_PROGRAM = {4: 2048, 2: 4096}


def round3_variants(m: int, n: int, dtype: torch.dtype, direction: str):
    """The settings in kernels/softmax.py now (auto), the same without the evict-first store hint, and the
    settings before head + tail lanes and the 1024-lane short-row rule (name, plan, store hint)."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    yield "auto", auto, ".cs"
    yield "auto-nohint", auto, ""
    if auto.impl == "single_block":
        padded = triton.next_power_of_2(n)
        size = torch.empty((), dtype=dtype).element_size()
        rows = max(1, _OLD_BYTES_PER_PROGRAM[size] // (padded * size))
        warps = next(w for limit, w in _OLD_WARPS[direction] if padded <= limit)
        old = SoftmaxPlan("single_block", padded, rows, warps, triton.cdiv(m, rows))
        if old != auto:
            yield "before", old, ""
            yield "before-hint", old, ".cs"


def _with_store_hint(fn, hint: str):
    def call():
        softmax_module._STORE_HINT = hint
        try:
            return fn()
        finally:
            softmax_module._STORE_HINT = ".cs"

    return call


ROUND3_SHAPES = {
    torch.float32: [(4096, n) for n in (384, 640, 1024, 2176, 3072, 4224, 4736, 5376, 8320, 9216, 10240, 12672)]
    + [(32768, n) for n in (256, 512, 1024)],
    torch.bfloat16: [(4096, 1024), (32768, 256), (32768, 512), (32768, 1024), (16384, 16384), (8192, 32768)],
    torch.float16: [(4096, 1024)],
}


def measure_forward(out: dict, m: int, n: int, dtype: torch.dtype, lab_forward, peers: bool, timer=None) -> None:
    """Time the forward of one shape into out["forward"]. lab_forward(x) gives the lab's (name, call)
    candidates; the peers are added when `peers`. timer: measure (do_bench, the default) or measure_held."""
    size = torch.empty((), dtype=dtype).element_size()
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
    ref = torch.softmax(x[:64].double(), -1)
    candidates = lab_forward(x)
    if peers:
        candidates += [(name, (lambda f=f: f(x))) for name, f in peers_forward(n)]
    key = {"dtype": str(dtype)[6:], "M": m, "N": n}
    out["forward"] += (timer or measure)(candidates, ref, 2 * m * n * size, out["copy_ceiling_gbs"], key)
    del x
    torch.cuda.empty_cache()


def measure_backward(out: dict, m: int, n: int, dtype: torch.dtype, lab_backward, peers: bool, timer=None) -> None:
    """Time the backward of one shape into out["backward"]; lab_backward(y, dy) gives the lab's candidates."""
    size = torch.empty((), dtype=dtype).element_size()
    y = torch.softmax(torch.randn(m, n, device="cuda", dtype=torch.float32), -1).to(dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    ref = reference.softmax_backward(y[:64].double(), dy[:64].double())
    candidates = lab_backward(y, dy)
    if peers:
        candidates += [("torch", lambda: reference.torch_softmax_backward(y, dy)),
                       ("torch.compile", lambda: reference.compiled_softmax_backward(y, dy))]
    key = {"dtype": str(dtype)[6:], "M": m, "N": n}
    out["backward"] += (timer or measure)(candidates, ref, 3 * m * n * size, out["copy_ceiling_gbs"], key)
    del y, dy
    torch.cuda.empty_cache()


def measure_shape(out: dict, m: int, n: int, dtype: torch.dtype, lab_forward, lab_backward, peers: bool) -> None:
    """Time one shape forward and (except float16) backward into `out`, with do_bench."""
    measure_forward(out, m, n, dtype, lab_forward, peers)
    if dtype != torch.float16:
        measure_backward(out, m, n, dtype, lab_backward, peers)


def run_round3(peers: bool = True) -> dict:
    torch.manual_seed(0)
    out = probe_header(forward=[], backward=[])
    for dtype, shapes in ROUND3_SHAPES.items():
        for m, n in shapes:
            def lab_forward(x, m=m, n=n, dtype=dtype):
                return [(f"lab:{name}", _with_store_hint(lambda p=plan: softmax_fwd(x, p), hint))
                        for name, plan, hint in round3_variants(m, n, dtype, "forward")]

            def lab_backward(y, dy, m=m, n=n, dtype=dtype):
                return [(f"lab:{name}", _with_store_hint(lambda p=plan: softmax_bwd(y, dy, p), hint))
                        for name, plan, hint in round3_variants(m, n, dtype, "backward")]

            measure_shape(out, m, n, dtype, lab_forward, lab_backward, peers)
    return out


def run(quick: bool, min_n: int = 0, peers: bool = True) -> dict:
    torch.manual_seed(0)
    out = probe_header(forward=[], backward=[])
    shapes = [(TOTAL // n, n) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)]
    shapes += [(32768, 256), (32768, 512), (4096, 1024)]
    if quick:
        shapes = shapes[::3]
    shapes = [(m, n) for m, n in shapes if n >= min_n]
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        for m, n in shapes:
            if dtype == torch.float16 and (m, n) != (4096, 1024):
                continue

            measure_shape(out, m, n, dtype, _forward_calls(list(forward_variants(m, n, dtype))),
                          _backward_calls(list(backward_variants(m, n, dtype))), peers)
    return out


# ---------------------------------------------------------------------------------------------------------
# Round 4: candidates for long rows that read x once from DRAM without programs waiting on each other, and
# the settings where the H200 records left the lab's kernel behind a peer.
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_l2_reuse_kernel(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
                         BLOCK_N: tl.constexpr, REVERSE: tl.constexpr, PASS1_EVICT: tl.constexpr,
                         PASS2_EVICT: tl.constexpr):
    # Candidate: a persistent grid walks rows; pass 1 folds the row tile by tile into (m, d), pass 2 reads it
    # again, last tile first, while the row is still in L2, and writes y. DRAM sees x once if the rows in
    # flight fit in L2. Random inputs only (no special-value handling): a probe candidate.
    offs = tl.arange(0, BLOCK_N)
    n_tiles = tl.cdiv(n_cols, BLOCK_N)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row = x_ptr + row * x_row_stride  # int32 offsets: the probe's matrices hold 2^28 elements
        y_row = y_ptr + row * y_row_stride
        m = tl.full([], -float("inf"), tl.float32)
        d = tl.full([], 0.0, tl.float32)
        for t in range(0, n_tiles):
            cols = t * BLOCK_N + offs
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"), eviction_policy=PASS1_EVICT)
            x = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        inv_d = 1.0 / d
        for t in range(0, n_tiles):
            tile = n_tiles - 1 - t if REVERSE else t
            cols = tile * BLOCK_N + offs
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"), eviction_policy=PASS2_EVICT)
            y = tl.exp(x.to(tl.float32) - m) * inv_d
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols, cache_modifier=".cs")


@triton.jit
def _bwd_l2_reuse_kernel(y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
                         BLOCK_N: tl.constexpr, REVERSE: tl.constexpr, PASS1_EVICT: tl.constexpr,
                         PASS2_EVICT: tl.constexpr):
    # Candidate backward: pass 1 accumulates <dy, y> per lane, pass 2 rereads y and dy (last tile first).
    offs = tl.arange(0, BLOCK_N)
    n_tiles = tl.cdiv(n_cols, BLOCK_N)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        y_row = y_ptr + row * y_row_stride  # int32 offsets: the probe's matrices hold 2^28 elements
        dy_row = dy_ptr + row * dy_row_stride
        acc = tl.zeros([BLOCK_N], tl.float32)
        for t in range(0, n_tiles):
            cols = t * BLOCK_N + offs
            y = tl.load(y_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=PASS1_EVICT)
            dy = tl.load(dy_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=PASS1_EVICT)
            acc += y.to(tl.float32) * dy.to(tl.float32)
        dot = tl.sum(acc, axis=0)
        for t in range(0, n_tiles):
            tile = n_tiles - 1 - t if REVERSE else t
            cols = tile * BLOCK_N + offs
            y = tl.load(y_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=PASS2_EVICT)
            dy = tl.load(dy_row + cols, mask=cols < n_cols, other=0.0, eviction_policy=PASS2_EVICT)
            dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
            tl.store(dx_ptr + row * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=cols < n_cols,
                     cache_modifier=".cs")


def _evict(hints: bool) -> dict:
    """Pass 1 asks L2 to keep the row, pass 2 to drop it; without hints both passes use the default."""
    return {"PASS1_EVICT": "evict_last" if hints else "", "PASS2_EVICT": "evict_first" if hints else ""}


def _l2_forward(x, per_sm, block_n, warps, reverse, hints):
    m, n = x.shape
    y = torch.empty_like(x)
    grid = min(m, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    _fwd_l2_reuse_kernel[(grid,)](x, y, m, n, x.stride(0), y.stride(0), BLOCK_N=block_n, REVERSE=reverse,
                                  num_warps=warps, **_evict(hints))
    return y


def _l2_backward(y, dy, per_sm, block_n, warps, reverse, hints):
    m, n = y.shape
    dx = torch.empty_like(y)
    grid = min(m, per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    _bwd_l2_reuse_kernel[(grid,)](y, dy, dx, m, n, y.stride(0), dy.stride(0), dx.stride(0), BLOCK_N=block_n,
                                  REVERSE=reverse, num_warps=warps, **_evict(hints))
    return dx


# (programs per SM, tile, warps, pass 2 last tile first, eviction hints)
L2_SETTINGS = ((1, 8192, 8, True, True), (2, 4096, 4, True, True), (2, 8192, 8, True, True),
               (4, 4096, 4, True, True), (2, 8192, 8, False, False), (2, 8192, 8, True, False))


def _single_block_plans(m, n, dtype, direction, warps=(), rows=(), tails=True):
    auto = plan_softmax(m, n, dtype, "single_block", direction=direction)
    yield "auto", plan_softmax(m, n, dtype, "auto", True, direction)
    for w in warps:
        if w != auto.num_warps:
            yield f"w{w}", SoftmaxPlan("single_block", auto.block_n, auto.rows_per_program, w, auto.grid, tail_n=auto.tail_n)
    for r in rows:
        for w in warps or (auto.num_warps,):
            if r != auto.rows_per_program:
                yield f"r{r}w{w}", SoftmaxPlan("single_block", auto.block_n, r, w, triton.cdiv(m, r), tail_n=auto.tail_n)
    if tails and auto.tail_n:
        padded = triton.next_power_of_2(n)
        for w in (16, 32):
            yield f"block{padded}w{w}", SoftmaxPlan("single_block", padded, 1, w, m)


def _l2_name(setting) -> str:
    per_sm, block_n, warps, reverse, hints = setting
    return f"l2/p{per_sm}b{block_n}w{warps}{'r' if reverse else ''}{'h' if hints else ''}"


def _forward_calls(plans, l2_settings=()):
    """lab_forward for measure_forward: the lab's plans, then the L2-reuse candidates."""
    return lambda x: ([(f"lab:{name}", (lambda p=p: softmax_fwd(x, p))) for name, p in plans]
                      + [(f"lab:{_l2_name(s)}", (lambda s=s: _l2_forward(x, *s))) for s in l2_settings])


def _backward_calls(plans, l2_settings=()):
    return lambda y, dy: ([(f"lab:{name}", (lambda p=p: softmax_bwd(y, dy, p))) for name, p in plans]
                          + [(f"lab:{_l2_name(s)}", (lambda s=s: _l2_backward(y, dy, *s))) for s in l2_settings])


def run_round4(peers: bool = True) -> dict:
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])

    def forward(m, n, dtype, lab_forward):
        measure_forward(out, m, n, dtype, lab_forward, peers, measure_held)

    def backward(m, n, dtype, lab_backward):
        measure_backward(out, m, n, dtype, lab_backward, peers, measure_held)

    # Long rows at M*N = 2^28: the dispatch now against the L2-reuse candidates.
    for dtype in (torch.bfloat16, torch.float32):
        for n in (16384, 32768, 65536, 131072, 262144):
            m = TOTAL // n
            plans = [("auto", plan_softmax(m, n, dtype, "auto", True))]
            if n >= 65536:
                plans += [(f"split_row/b16384w{w}", _split_row_plan(m, n, 16384, w))
                          for w in (8, 16)]
            forward(m, n, dtype, _forward_calls(plans, L2_SETTINGS))
            backward(m, n, dtype, _backward_calls([("auto", plan_softmax(m, n, dtype, "auto", True, "backward"))],
                                                  L2_SETTINGS))
    # The sweeps' shapes (M = 4096, fp32) where the H200 records had a peer ahead, and the seed case.
    for n in (640, 1024, 4480, 5376, 6016, 8448, 8704):
        warps = (1, 2, 4, 8) if n <= 1024 else (8, 16, 32)
        rows = (2,) if n <= 1024 else ()
        forward(4096, n, torch.float32, _forward_calls(_single_block_plans(4096, n, torch.float32, "forward", warps, rows)))
    forward(4096, 1024, torch.float16,
            _forward_calls(_single_block_plans(4096, 1024, torch.float16, "forward", (1, 2, 4, 8), (2,))))
    for n in (1408, 2048, 3072, 4608):
        backward(4096, n, torch.float32,
                 _backward_calls(_single_block_plans(4096, n, torch.float32, "backward", (2, 4, 8, 16), (), tails=False)))
    # Short rows at M = 32,768.
    forward(32768, 128, torch.float32,
            _forward_calls(_single_block_plans(32768, 128, torch.float32, "forward", (1, 2, 4), (4, 16))))
    return out


def run_round5(peers: bool = True) -> dict:
    """Round 4's findings checked further on the same clock: tails at 4096- and 8192-lane heads, warps for
    the shortest rows, and bf16 split-row slices."""
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])
    for dtype, m, n, plans in _round5_cases():
        measure_forward(out, m, n, dtype, _forward_calls(plans), peers, measure_held)
    return out


def _round5_cases():
    for n in (4224, 4352, 4608, 8320, 8448, 8704):
        auto = plan_softmax(4096, n, torch.float32, "auto", True)
        padded = triton.next_power_of_2(n)
        head = padded // 2
        plans = [("auto", auto), (f"block{padded}w16", SoftmaxPlan("single_block", padded, 1, 16, 4096))]
        tail = max(16, triton.next_power_of_2(n - head))
        for w in ((4, 8) if head == 4096 else (8, 16)):
            plans.append((f"tail{tail}w{w}", SoftmaxPlan("single_block", head, 1, w, 4096, tail_n=tail)))
        yield torch.float32, 4096, n, plans
    for dtype in (torch.float32, torch.bfloat16):
        for n in (128, 256):
            rows = 1024 // n
            plans = [("auto", plan_softmax(32768, n, dtype, "auto", True))]
            plans += [(f"r{r}w{w}", SoftmaxPlan("single_block", n, r, w, triton.cdiv(32768, r)))
                      for r in (rows // 2, rows, rows * 2) for w in (1, 2, 4)]
            yield dtype, 32768, n, plans
    for n in (65536, 262144):
        m = TOTAL // n
        plans = [("auto", plan_softmax(m, n, torch.bfloat16, "auto", True))]
        plans += [(f"split_row/b{b}w{w}", _split_row_plan(m, n, b, w))
                  for b, w in ((4096, 2), (4096, 4), (8192, 2), (8192, 8), (16384, 4)) if n // b <= 64]
        yield torch.bfloat16, m, n, plans


# ---------------------------------------------------------------------------------------------------------
# Round 6: Liger's cache modifiers and division on the lab's single-block kernels, the shortest rows of the
# M = 4096 sweeps, the backward at M*N = 2^28, and bf16 split-row on 8 warps at 131k.
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_hinted_kernel(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
                       BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
                       LOAD_CM: tl.constexpr, STORE_CM: tl.constexpr, DIVIDE: tl.constexpr):
    # The lab's single-block forward with cache modifiers on its loads and stores, and optionally y = e / d
    # (Liger's form) in place of e * (1 / d). Random inputs only: a probe candidate.
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_in = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = row_in[:, None] & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows64[:, None] * x_row_stride + cols[None, :], mask=mask, other=-float("inf"),
                cache_modifier=LOAD_CM).to(tl.float32)
    m = tl.max(x, axis=1)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        tail_mask = row_in[:, None] & (tail_cols[None, :] < n_cols)
        x_tail = tl.load(x_ptr + rows64[:, None] * x_row_stride + tail_cols[None, :], mask=tail_mask,
                         other=-float("inf"), cache_modifier=LOAD_CM).to(tl.float32)
        m = tl.maximum(m, tl.max(x_tail, axis=1))
    e = tl.exp(x - m[:, None])
    d = tl.sum(e, axis=1)
    if TAIL_N > 0:
        e_tail = tl.exp(x_tail - m[:, None])
        d += tl.sum(e_tail, axis=1)
    if DIVIDE:
        y = e / d[:, None]
    else:
        y = e * (1.0 / d)[:, None]
    tl.store(y_ptr + rows64[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask,
             cache_modifier=STORE_CM)
    if TAIL_N > 0:
        if DIVIDE:
            y_tail = e_tail / d[:, None]
        else:
            y_tail = e_tail * (1.0 / d)[:, None]
        tl.store(y_ptr + rows64[:, None] * y_row_stride + tail_cols[None, :], y_tail.to(y_ptr.dtype.element_ty),
                 mask=tail_mask, cache_modifier=STORE_CM)


@triton.jit
def _bwd_hinted_kernel(y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
                       BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
                       LOAD_CM: tl.constexpr, STORE_CM: tl.constexpr):
    # The lab's single-block backward with a cache modifier on the loads of y (Liger's .ca) and on the store.
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_in = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = row_in[:, None] & (cols[None, :] < n_cols)
    y = tl.load(y_ptr + rows64[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0,
                cache_modifier=LOAD_CM).to(tl.float32)
    dy = tl.load(dy_ptr + rows64[:, None] * dy_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        tail_mask = row_in[:, None] & (tail_cols[None, :] < n_cols)
        y_tail = tl.load(y_ptr + rows64[:, None] * y_row_stride + tail_cols[None, :], mask=tail_mask, other=0.0,
                         cache_modifier=LOAD_CM).to(tl.float32)
        dy_tail = tl.load(dy_ptr + rows64[:, None] * dy_row_stride + tail_cols[None, :], mask=tail_mask,
                          other=0.0).to(tl.float32)
        dot += tl.sum(y_tail * dy_tail, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(dx_ptr + rows64[:, None] * dx_row_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask,
             cache_modifier=STORE_CM)
    if TAIL_N > 0:
        dx_tail = y_tail * (dy_tail - dot[:, None])
        tl.store(dx_ptr + rows64[:, None] * dx_row_stride + tail_cols[None, :], dx_tail.to(dx_ptr.dtype.element_ty),
                 mask=tail_mask, cache_modifier=STORE_CM)


# (name, load modifier, store modifier, divide): the plain copy first, which must time like lab:auto.
FORWARD_HINTS = (("copy", "", "", False), ("cs", "", ".cs", False), ("ca-cs", ".ca", ".cs", False),
                 ("ca-cs-div", ".ca", ".cs", True), ("div", "", "", True))
BACKWARD_HINTS = (("copy", "", ""), ("ca", ".ca", ""), ("cs", "", ".cs"), ("ca-cs", ".ca", ".cs"))


def _hinted_forward(x, plan: SoftmaxPlan, load_cm, store_cm, divide):
    m, n = x.shape
    y = torch.empty_like(x)
    _fwd_hinted_kernel[(plan.grid,)](x, y, m, n, x.stride(0), y.stride(0), BLOCK_N=plan.block_n,
                                     TAIL_N=plan.tail_n, ROWS_PER_PROGRAM=plan.rows_per_program, LOAD_CM=load_cm,
                                     STORE_CM=store_cm, DIVIDE=divide, num_warps=plan.num_warps)
    return y


def _hinted_backward(y, dy, plan: SoftmaxPlan, load_cm, store_cm):
    m, n = y.shape
    dx = torch.empty_like(y)
    _bwd_hinted_kernel[(plan.grid,)](y, dy, dx, m, n, y.stride(0), dy.stride(0), dx.stride(0), BLOCK_N=plan.block_n,
                                     TAIL_N=plan.tail_n, ROWS_PER_PROGRAM=plan.rows_per_program, LOAD_CM=load_cm,
                                     STORE_CM=store_cm, num_warps=plan.num_warps)
    return dx


def _short_row_plans(m, n, direction):
    """Rows per program and warps around the plan, and head + tail lanes (a 512 head for 640 and 768)."""
    auto = plan_softmax(m, n, torch.float32, "auto", True, direction)
    yield "auto", auto
    for r in (1, 2, 4):
        for w in (1, 2, 4):
            if (r, w) != (auto.rows_per_program, auto.num_warps):
                yield f"r{r}w{w}", SoftmaxPlan("single_block", auto.block_n, r, w, triton.cdiv(m, r))
    head = triton.next_power_of_2(n) // 2
    tail = triton.next_power_of_2(n - head)
    for r in (1, 2):
        for w in (1, 2, 4):
            yield f"tail{head}+{tail}r{r}w{w}", SoftmaxPlan("single_block", head, r, w, triton.cdiv(m, r), tail_n=tail)


def run_round6(peers: bool = True) -> dict:
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])
    liger = importlib.util.find_spec("liger_kernel") is not None
    # Cache modifiers at the sweep shapes (M = 4096, fp32) where Liger was a few tenths ahead.
    for n in (3456, 4096, 5376, 8192, 9216, 10240, 12672):
        auto = plan_softmax(4096, n, torch.float32, "auto", True)

        def lab_forward(x, auto=auto):
            return ([("lab:auto", lambda: softmax_fwd(x, auto))]
                    + [(f"lab:{name}", (lambda h=h: _hinted_forward(x, auto, *h))) for name, *h in FORWARD_HINTS])

        measure_forward(out, 4096, n, torch.float32, lab_forward, peers, measure_held)
    for n in (4096, 8192, 10368, 12672):
        auto = plan_softmax(4096, n, torch.float32, "auto", True, "backward")

        def lab_backward(y, dy, auto=auto):
            calls = [("lab:auto", lambda: softmax_bwd(y, dy, auto))]
            calls += [(f"lab:{name}", (lambda h=h: _hinted_backward(y, dy, auto, *h))) for name, *h in BACKWARD_HINTS]
            return calls + ([("liger", lambda: _liger_backward(y, dy))] if peers and liger else [])

        measure_backward(out, 4096, n, torch.float32, lab_backward, peers, measure_held)
    # The shortest rows of the M = 4096 sweeps, where torch.compile was ahead.
    for n in (384, 768):
        measure_forward(out, 4096, n, torch.float32, _forward_calls(list(_short_row_plans(4096, n, "forward"))),
                        peers, measure_held)
    for n in (640, 768):
        plans = list(_short_row_plans(4096, n, "backward"))
        measure_backward(out, 4096, n, torch.float32,
                         lambda y, dy, plans=plans: _backward_calls(plans)(y, dy)
                         + ([("liger", lambda: _liger_backward(y, dy))] if peers and liger else []),
                         peers, measure_held)
    # The backward at M*N = 2^28 (no experiment records it yet): the dispatch against nearby settings.
    for dtype in (torch.bfloat16, torch.float32):
        for k in range(10, 19):
            n = 2**k
            m = TOTAL // n
            plans = [("auto", plan_softmax(m, n, dtype, "auto", True, "backward"))]
            if n <= 32768:
                base = plans[0][1]
                plans += [(f"w{w}", SoftmaxPlan("single_block", base.block_n, base.rows_per_program, w, base.grid))
                          for w in (base.num_warps // 2, base.num_warps * 2) if w >= 1 and base.block_n // (32 * w) >= 4]
            if n >= 32768:
                plans += [(f"split_row/b{b}w{w}", _split_row_plan(m, n, b, w))
                          for b, w in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16)) if 2 <= n // b <= 64]
            measure_backward(out, m, n, dtype, _backward_calls(plans), False, measure_held)
    # bf16 forward split-row on 8 warps, which the H200 measured 4 points behind at 131k.
    for n in (65536, 131072, 262144):
        m = TOTAL // n
        plans = [("auto", plan_softmax(m, n, torch.bfloat16, "auto", True))]
        plans += [(f"split_row/b8192w{w}", _split_row_plan(m, n, 8192, w)) for w in (8,)]
        measure_forward(out, m, n, torch.bfloat16, _forward_calls(plans), False, measure_held)
    return out


# ---------------------------------------------------------------------------------------------------------
# Round 7: split-row programs that hold less across their wait (more programs resident per SM, so more bytes
# in flight), and a second reading of round 6's backward settings.
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_split_lean_kernel(x_ptr, y_ptr, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits, x_row_stride,
                           y_row_stride, BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr, RELOAD: tl.constexpr):
    # The lab's split-row forward, except that nothing computed from x survives the wait: y is recomputed
    # afterwards from x, either still in registers in its storage dtype (RELOAD False) or read again, from L2
    # (RELOAD True: the first read asks L2 to keep the slice, the second to drop it). Random inputs only.
    ticket = tl.atomic_add(sync_ptr, 1)
    row = ticket // n_splits
    part = ticket % n_splits
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    ptrs = x_ptr + row.to(tl.int64) * x_row_stride + cols
    x = tl.load(ptrs, mask=mask, other=-float("inf"), eviction_policy="evict_last" if RELOAD else "")
    m = tl.max(x.to(tl.float32), axis=0)
    tl.store(part_m_ptr + ticket, m)
    tl.store(part_d_ptr + ticket, tl.sum(tl.exp(x.to(tl.float32) - m), axis=0))
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="acq_rel") + 1
    arrived = _wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    pm = tl.load(part_m_ptr + parts, mask=in_row, other=-float("inf"), volatile=True)
    pd = tl.load(part_d_ptr + parts, mask=in_row, other=0.0, volatile=True)
    m_row = tl.max(pm, axis=0)
    inv_d = 1.0 / tl.sum(pd * tl.exp(pm - m_row), axis=0)
    if RELOAD:
        x = tl.load(ptrs, mask=mask, other=-float("inf"), eviction_policy="evict_first")
    y = tl.exp(x.to(tl.float32) - m_row) * inv_d
    tl.store(y_ptr + row.to(tl.int64) * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_split_lean_kernel(y_ptr, dy_ptr, dx_ptr, part_dot_ptr, sync_ptr, n_cols, n_splits, y_row_stride,
                           dy_row_stride, dx_row_stride, BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr,
                           RELOAD: tl.constexpr):
    # The split-row backward with y and dy kept in their storage dtype across the wait, or read again from L2.
    ticket = tl.atomic_add(sync_ptr, 1)
    row = ticket // n_splits
    part = ticket % n_splits
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    row64 = row.to(tl.int64)
    y_ptrs = y_ptr + row64 * y_row_stride + cols
    dy_ptrs = dy_ptr + row64 * dy_row_stride + cols
    y = tl.load(y_ptrs, mask=mask, other=0.0, eviction_policy="evict_last" if RELOAD else "")
    dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy="evict_last" if RELOAD else "")
    tl.store(part_dot_ptr + ticket, tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=0))
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="acq_rel") + 1
    arrived = _wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    dot = tl.sum(tl.load(part_dot_ptr + parts, mask=in_row, other=0.0, volatile=True), axis=0)
    if RELOAD:
        y = tl.load(y_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
        dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
    tl.store(dx_ptr + row64 * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


REGISTERS: dict[str, list] = {}  # variant -> [registers, spilled bytes] of its compiled kernel


def _note_registers(name: str, compiled) -> None:
    if name not in REGISTERS and compiled is not None:
        REGISTERS[name] = [getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)]


def _lean_forward(x, block_n, warps, reload):
    m, n = x.shape
    splits = triton.cdiv(n, block_n)
    y = torch.empty_like(x)
    part_m, part_d = torch.empty((2, m * splits), dtype=torch.float32, device=x.device)
    compiled = _fwd_split_lean_kernel[(m * splits,)](
        x, y, part_m, part_d, softmax_module._split_row_sync(m, x.device), n, splits, x.stride(0), y.stride(0),
        BLOCK_N=block_n, SPLITS_POW2=triton.next_power_of_2(splits), RELOAD=reload, num_warps=warps)
    _note_registers(f"fwd/{x.dtype}/b{block_n}w{warps}/{'reload' if reload else 'keep'}", compiled)
    return y


def _lean_backward(y, dy, block_n, warps, reload):
    m, n = y.shape
    splits = triton.cdiv(n, block_n)
    dx = torch.empty_like(y)
    part_dot = torch.empty(m * splits, dtype=torch.float32, device=y.device)
    compiled = _bwd_split_lean_kernel[(m * splits,)](
        y, dy, dx, part_dot, softmax_module._split_row_sync(m, y.device), n, splits, y.stride(0), dy.stride(0),
        dx.stride(0), BLOCK_N=block_n, SPLITS_POW2=triton.next_power_of_2(splits), RELOAD=reload, num_warps=warps)
    _note_registers(f"bwd/{y.dtype}/b{block_n}w{warps}/{'reload' if reload else 'keep'}", compiled)
    return dx


# (slice, warps, read again from L2)
LEAN_SETTINGS = ((8192, 4, False), (8192, 4, True), (8192, 8, True), (4096, 4, True), (16384, 8, True),
                 (16384, 16, True), (4096, 2, True))


def _lean_name(setting) -> str:
    block_n, warps, reload = setting
    return f"lean/b{block_n}w{warps}{'-reload' if reload else '-keep'}"


def run_round7(peers: bool = True) -> dict:
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])
    for dtype in (torch.bfloat16, torch.float32):
        for n in (32768, 65536, 131072, 262144):
            m = TOTAL // n
            settings = [s for s in LEAN_SETTINGS if 2 <= n // s[0] <= 64]
            plans = [("auto", plan_softmax(m, n, dtype, "auto", True))]
            if n == 32768:
                plans.append(("split_row/b8192w4", _split_row_plan(m, n, 8192, 4)))
            measure_forward(out, m, n, dtype, lambda x, plans=plans, settings=settings: (
                _forward_calls(plans)(x) + [(f"lab:{_lean_name(s)}", (lambda s=s: _lean_forward(x, *s))) for s in settings]),
                False, measure_held)
            plans = [("auto", plan_softmax(m, n, dtype, "auto", True, "backward"))]
            if n == 32768:
                plans.append(("split_row/b8192w8", _split_row_plan(m, n, 8192, 8)))
            measure_backward(out, m, n, dtype, lambda y, dy, plans=plans, settings=settings: (
                _backward_calls(plans)(y, dy)
                + [(f"lab:{_lean_name(s)}", (lambda s=s: _lean_backward(y, dy, *s))) for s in settings]),
                False, measure_held)
    # Round 6's backward settings again: one warp for rows of up to 1024 lanes, and 512-lane heads with tails.
    for m, ns in ((4096, (512, 640, 768, 896, 1024)), (32768, (256, 512, 768, 1024))):
        for n in ns:
            plans = list(_short_row_plans(m, n, "backward")) if n > 512 else [
                ("auto", plan_softmax(m, n, torch.float32, "auto", True, "backward"))]
            if n <= 512:
                auto = plans[0][1]
                plans += [(f"r{auto.rows_per_program}w{w}", SoftmaxPlan("single_block", auto.block_n, auto.rows_per_program,
                                                                        w, auto.grid)) for w in (1, 4)]
            measure_backward(out, m, n, torch.float32,
                             lambda y, dy, plans=plans: _backward_calls(plans)(y, dy)
                             + ([("liger", lambda: _liger_backward(y, dy))] if peers else []),
                             peers, measure_held)
    out["registers"] = REGISTERS
    return out


# ---------------------------------------------------------------------------------------------------------
# Round 8: the single-block kernels written over one row (1-D blocks, no row mask, Liger's form) against the
# lab's 2-D [ROWS_PER_PROGRAM, BLOCK_N] form at one row a program, with the lab's kernel timed twice as the
# noise floor, over more rounds than before.
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_row_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, INT32: tl.constexpr, DIVIDE: tl.constexpr):
    row = tl.program_id(0)
    if not INT32:
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
    if DIVIDE:
        y = e / d
    else:
        y = e * (1.0 / d)
    tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
    if TAIL_N > 0:
        if DIVIDE:
            y_tail = e_tail / d
        else:
            y_tail = e_tail * (1.0 / d)
        tl.store(y_row + tail_cols, y_tail.to(y_ptr.dtype.element_ty), mask=tail_cols < n_cols)


@triton.jit
def _bwd_row_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, y_row_stride, dy_row_stride, dx_row_stride,
                    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, INT32: tl.constexpr):
    row = tl.program_id(0)
    if not INT32:
        row = row.to(tl.int64)
    y_row = y_ptr + row * y_row_stride
    dy_row = dy_ptr + row * dy_row_stride
    dx_row = dx_ptr + row * dx_row_stride
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    y = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=0)
    if TAIL_N > 0:
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        y_tail = tl.load(y_row + tail_cols, mask=tail_cols < n_cols, other=0.0).to(tl.float32)
        dy_tail = tl.load(dy_row + tail_cols, mask=tail_cols < n_cols, other=0.0).to(tl.float32)
        dot += tl.sum(y_tail * dy_tail, axis=0)
    tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
    if TAIL_N > 0:
        tl.store(dx_row + tail_cols, (y_tail * (dy_tail - dot)).to(dx_ptr.dtype.element_ty), mask=tail_cols < n_cols)


ROW_FORMS = (("row1d", False, False), ("row1d-i32", True, False), ("row1d-i32-div", True, True))


def _row_forward(x, plan: SoftmaxPlan, int32, divide):
    y = torch.empty_like(x)
    _fwd_row_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK_N=plan.block_n,
                                   TAIL_N=plan.tail_n, INT32=int32, DIVIDE=divide, num_warps=plan.num_warps)
    return y


def _row_backward(y, dy, plan: SoftmaxPlan, int32):
    dx = torch.empty_like(y)
    _bwd_row_kernel[(y.shape[0],)](y, dy, dx, y.shape[1], y.stride(0), dy.stride(0), dx.stride(0),
                                   BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, INT32=int32, num_warps=plan.num_warps)
    return dx


ROUND8_ROUNDS = 100
ROUND8_N = (2304, 3456, 4096, 4224, 5376, 8192, 9216, 10240, 12672)
# --round 8 --tails: the sweeps' head + tail shapes, where the first run saw the 1-D form 2 points ahead
ROUND8_TAIL_N = (4224, 4352, 4480, 4608, 8320, 8448)


def _held_long(candidates, ref, nbytes, ceiling, key):
    return measure_held(candidates, ref, nbytes, ceiling, key, rounds=ROUND8_ROUNDS)


def run_round8(peers: bool = True, tails: bool = False) -> dict:
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])
    liger = importlib.util.find_spec("liger_kernel") is not None
    shapes = ROUND8_TAIL_N if tails else ROUND8_N
    for n in shapes:
        auto = plan_softmax(4096, n, torch.float32, "auto", True)

        def lab_forward(x, auto=auto):
            calls = [("lab:auto", lambda: softmax_fwd(x, auto)), ("lab:auto-again", lambda: softmax_fwd(x, auto))]
            return calls + [(f"lab:{name}", (lambda i=i, d=d: _row_forward(x, auto, i, d))) for name, i, d in ROW_FORMS]

        measure_forward(out, 4096, n, torch.float32, lab_forward, peers, _held_long)
    for n in shapes:
        auto = plan_softmax(4096, n, torch.float32, "auto", True, "backward")

        def lab_backward(y, dy, auto=auto):
            calls = [("lab:auto", lambda: softmax_bwd(y, dy, auto)), ("lab:auto-again", lambda: softmax_bwd(y, dy, auto))]
            calls += [(f"lab:{name}", (lambda i=i: _row_backward(y, dy, auto, i))) for name, i, d in ROW_FORMS if not d]
            return calls + ([("liger", lambda: _liger_backward(y, dy))] if peers and liger else [])

        measure_backward(out, 4096, n, torch.float32, lab_backward, peers, _held_long)
    return out


ROUND9_N = (1024, 1536, 2048, 3072, 4096, 4224, 8192, 12672, 16384)
ROUND9_DTYPES = (torch.float32, torch.bfloat16)
# Round 11: round 9's shapes and the forward sweep's points where Liger led the H100 records at b0f1dbb.
ROUND11_N = (1024, 2304, 4096, 4224, 4992, 5888, 6400, 7424, 8192, 8320, 9216, 10368, 11904)


def _forward_2d(x, plan: SoftmaxPlan):
    """The [ROWS_PER_PROGRAM, BLOCK_N] single-block forward kernel at a one-row plan, as before round 9."""
    y = torch.empty_like(x)
    _softmax_fwd_single_block_kernel[(plan.grid,)](
        x, y, x.shape[0], x.shape[1], x.stride(0), y.stride(0), BLOCK_N=plan.block_n, TAIL_N=plan.tail_n,
        ROWS_PER_PROGRAM=plan.rows_per_program, num_warps=plan.num_warps)
    return y


def _forward_64_bit(x, plan: SoftmaxPlan):
    """The kernel's one-row forward with 64-bit row offsets, the form it takes past 2^31 elements."""
    y = torch.empty_like(x)
    _softmax_fwd_row_kernel[(plan.grid,)](
        x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK_N=plan.block_n, TAIL_N=plan.tail_n, ROW_OFFSET_64=True,
        EDGES=False, Y_ALIGNED=False, VEC=16 // x.element_size(), num_warps=plan.num_warps)
    return y


def run_round9(peers: bool = True, shapes=ROUND9_N, with_64_bit: bool = False) -> dict:
    """The kernel's one-row forward (lab:auto) against the 2-D form it replaced, fp32 and bf16, from 1,024
    columns up, with the lab's kernel timed twice as the noise floor. with_64_bit (round 11): the one-row
    form with 64-bit row offsets (lab:row1d-i64) joins them."""
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])
    for dtype in ROUND9_DTYPES:
        for n in shapes:
            auto = plan_softmax(4096, n, dtype, "auto", True)
            if auto.impl != "single_block" or auto.rows_per_program != 1:
                continue

            def lab_forward(x, auto=auto):
                calls = [("lab:auto", lambda: softmax_fwd(x, auto)), ("lab:auto-again", lambda: softmax_fwd(x, auto)),
                         ("lab:2d", lambda: _forward_2d(x, auto))]
                return calls + ([("lab:row1d-i64", lambda: _forward_64_bit(x, auto))] if with_64_bit else [])

            measure_forward(out, 4096, n, dtype, lab_forward, peers, _held_long)
    return out


ROUND10_BWD_N = (16384, 32768, 65536)


def run_round10(peers: bool = True) -> dict:
    """Where the H100 records at the one-row forward still had a peer ahead by more than noise: bf16
    backward at M*N = 2^28 (torch.compile 2.4% ahead at N = 32,768), single-block warps against split-row
    slices; and the fp32 forward at 4096 x 384 (torch.compile 2.6% ahead), rows a program against warps."""
    torch.manual_seed(0)
    out = probe_header(timing=HELD_TIMING, forward=[], backward=[])
    for n in ROUND10_BWD_N:
        m = TOTAL // n
        auto = plan_softmax(m, n, torch.bfloat16, "auto", True, "backward")
        plans = [("auto", auto), ("auto-again", auto)]
        if auto.impl == "single_block":
            plans += [(f"w{w}", SoftmaxPlan("single_block", auto.block_n, 1, w, m)) for w in (8, 32) if w != auto.num_warps]
        plans += [(f"split_row/b{b}w{w}", _split_row_plan(m, n, b, w))
                  for b, w in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16))
                  if b < n and (auto.impl != "split_row" or (b, w) != (auto.block_n, auto.num_warps))]
        measure_backward(out, m, n, torch.bfloat16, _backward_calls(plans), peers, _held_long)
    plans = [("auto-again", plan_softmax(4096, 384, torch.float32, "auto", True))]
    plans += list(_single_block_plans(4096, 384, torch.float32, "forward", (1, 2, 4), (1, 4)))
    measure_forward(out, 4096, 384, torch.float32, _forward_calls(plans), peers, _held_long)
    return out


def summarize(result: dict) -> None:
    for direction in ("forward", "backward"):
        print(f"\n== {direction}: best lab variant vs best peer (% of copy ceiling)")
        keys = sorted({(r["dtype"], r["M"], r["N"]) for r in result[direction]}, key=lambda k: (k[0], k[2], k[1]))
        for key in keys:
            rows = [r for r in result[direction] if (r["dtype"], r["M"], r["N"]) == key and "gbs" in r]
            lab = [r for r in rows if r["variant"].startswith("lab:")]
            peers = [r for r in rows if not r["variant"].startswith("lab:")]
            best_lab = max(lab, key=lambda r: r["gbs"], default=None)
            best_peer = max(peers, key=lambda r: r["gbs"], default=None)
            auto = next((r for r in lab if r["variant"] == "lab:auto"), None)
            fmt = lambda r: f"{r['variant']:<26} {r['pct']:5.1f}%" if r else "-"  # noqa: E731
            print(f"{key[0]:<9} {key[1]:>7}x{key[2]:<7} auto {auto['pct'] if auto else float('nan'):5.1f}%  "
                  f"best {fmt(best_lab)}  peer {fmt(best_peer)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="every third shape only")
    parser.add_argument("--min-n", type=int, default=0, help="only rows at least this long")
    parser.add_argument("--tails", action="store_true", help="round 8 at the head + tail shapes")
    parser.add_argument("--no-peers", action="store_true", help="time the lab's variants only")
    parser.add_argument("--round", type=int, choices=(1, 3, 4, 5, 6, 7, 8, 9, 10, 11), default=1,
                        help="1: schedules and settings; 3: the chosen settings against the previous ones and "
                             "the store hint (round 2 timed a split-row back-off that was dropped with its code); "
                             "4: L2-reuse candidates for long rows and the settings behind a peer, on the lab's clock; "
                             "5: tails, the shortest rows' warps and bf16 split-row slices, on the same clock; "
                             "6: cache modifiers, the sweeps' shortest rows, the backward at M*N = 2^28; "
                             "7: split-row programs that hold less across the wait, round 6's backward settings again; "
                             "8: one-row 1-D single-block kernels against the lab's 2-D form, 100 rounds; "
                             "9: the kernel's one-row forward against the 2-D form, fp32 and bf16; "
                             "10: bf16 backward slices at M*N = 2^28 and the forward at 4096 x 384; "
                             "11: round 9 with the one-row form's 64-bit row offsets, at more of the sweep's shapes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("softmax_speed: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    if args.round == 3:
        result = run_round3(not args.no_peers)
    elif args.round == 4:
        result = run_round4(not args.no_peers)
    elif args.round == 5:
        result = run_round5(not args.no_peers)
    elif args.round == 6:
        result = run_round6(not args.no_peers)
    elif args.round == 7:
        result = run_round7(not args.no_peers)
    elif args.round == 8:
        result = run_round8(not args.no_peers, args.tails)
    elif args.round == 9:
        result = run_round9(not args.no_peers)
    elif args.round == 10:
        result = run_round10(not args.no_peers)
    elif args.round == 11:
        result = run_round9(not args.no_peers, ROUND11_N, with_64_bit=True)
    else:
        result = run(args.quick, args.min_n, not args.no_peers)
    result["wall_s"] = time.time() - start
    write_output(args.out, result)
    summarize(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
