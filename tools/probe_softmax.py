"""Tuning probe for the softmax schedules (GPU only): times launch-plan variants the public dispatch does not
expose, to choose the settings tables in kernels/softmax.py.

This is a tuning instrument, not evidence: the site's figures come only from tools/build_results.py run
records. Its JSON output is kept under notes/probes/ beside the notes that cite it.

    python tools/probe_softmax.py --out probe.json [--quick]

Timing: triton.testing.do_bench (CUDA events, L2 cleared before every call, median of the samples).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import reference  # noqa: E402
from kernels.softmax import SoftmaxPlan, plan_softmax, softmax_bwd, softmax_fwd  # noqa: E402
from probe_common import probe_header  # noqa: E402

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
                splits = triton.cdiv(n, block_n)
                if 2 <= splits <= 64 and block_n // (32 * warps) >= 8:
                    yield f"split_row/b{block_n}w{warps}", SoftmaxPlan("split_row", block_n, 1, warps, m * splits, splits)


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
            splits = triton.cdiv(n, block_n)
            if 2 <= splits <= 64:
                yield f"split_row/b{block_n}w{warps}", SoftmaxPlan("split_row", block_n, 1, warps, m * splits, splits)


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


def measure_shape(out: dict, m: int, n: int, dtype: torch.dtype, lab_forward, lab_backward, peers: bool) -> None:
    """Time one shape forward and (except float16) backward into `out`. lab_forward(x) and
    lab_backward(y, dy) give the lab's (name, call) candidates; the peers are added when `peers`."""
    ceiling = out["copy_ceiling_gbs"]
    size = torch.empty((), dtype=dtype).element_size()
    key = {"dtype": str(dtype)[6:], "M": m, "N": n}
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
    ref = torch.softmax(x[:64].double(), -1)
    candidates = lab_forward(x)
    if peers:
        candidates += [(name, (lambda f=f: f(x))) for name, f in peers_forward(n)]
    out["forward"] += measure(candidates, ref, 2 * m * n * size, ceiling, key)
    del x
    if dtype == torch.float16:
        return
    y = torch.softmax(torch.randn(m, n, device="cuda", dtype=torch.float32), -1).to(dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    ref = reference.softmax_backward(y[:64].double(), dy[:64].double())
    candidates = lab_backward(y, dy)
    if peers:
        candidates += [("torch", lambda: reference.torch_softmax_backward(y, dy)),
                       ("torch.compile", lambda: reference.compiled_softmax_backward(y, dy))]
    out["backward"] += measure(candidates, ref, 3 * m * n * size, ceiling, key)
    del y, dy
    torch.cuda.empty_cache()


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

            def lab_forward(x, m=m, n=n, dtype=dtype):
                return [(f"lab:{name}", (lambda p=plan: softmax_fwd(x, p))) for name, plan in forward_variants(m, n, dtype)]

            def lab_backward(y, dy, m=m, n=n, dtype=dtype):
                return [(f"lab:{name}", (lambda p=plan: softmax_bwd(y, dy, p)))
                        for name, plan in backward_variants(m, n, dtype)]

            measure_shape(out, m, n, dtype, lab_forward, lab_backward, peers)
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
    parser.add_argument("--no-peers", action="store_true", help="time the lab's variants only")
    parser.add_argument("--round", type=int, choices=(1, 3), default=1,
                        help="1: schedules and settings; 3: the chosen settings against the previous ones and "
                             "the store hint (round 2 timed a split-row back-off that was dropped with its code)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("probe_softmax: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    if args.round == 3:
        result = run_round3(not args.no_peers)
    else:
        result = run(args.quick, args.min_n, not args.no_peers)
    result["wall_s"] = time.time() - start
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    summarize(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
