"""GPU check of the decode kernels (GPU only): correctness at real sizes, GPU time on the graph clock, the
plan candidates side by side, and host time per call. A tuning instrument, not evidence: the site's figures
come only from tools/build_results.py run records.

    python checks/decode.py [OUT_DIR]          # default: $OUT, else the current directory
    python checks/decode.py OUT_DIR --no-compile   # skip the torch.compile peers (faster)
    python checks/decode.py OUT_DIR --quick        # 4096 x 4096 only

Sections, each printed as a table and written to OUT_DIR/gpu_check_decode.json as it finishes:

* rmsnorm: rmsnorm_linear's GEMV (the plan table's choice, then alternatives) against F.rms_norm + F.linear
  eager and compiled, M in {1, 4, 16}, N x K in {4096 x 4096, 14336 x 4096}, bf16.
* dequant: int8_linear and int4_linear (group 128) against dequantise + F.linear (eager, compiled),
  _weight_int8pack_mm and _weight_int4pack_mm (tinygemm), M in {1, 16}, the same shapes.
* host: wall time per call of rmsnorm_linear and of the eager pair at 1 x 4096 -> 4096, with the device held
  (host only) and back to back over 2000 calls (max of host and GPU).
* flush: one point timed per call after zeroing a 2 x L2 buffer (the lab clock's flush, which leaves dirty
  lines) and after reading one (clean lines), to show what the flush itself adds.

Graph clock: calls replayed from one CUDA graph, each call on its own copy of the weights (the copies
together at least 4 x L2, so none is found in L2), per-call time = replay time / calls; host work excluded.
Correctness: every provider's output against a float64 reference on 64 output columns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch._dynamo
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import dequant_linear as dl  # noqa: E402
from kernels import reference  # noqa: E402
from kernels import rmsnorm_gemv as rg  # noqa: E402
from kernels import _gemv  # noqa: E402
from kernels._gemv import GemvPlan, choose_split_k  # noqa: E402
from kernels.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8  # noqa: E402
from kernels.rmsnorm_linear import rmsnorm_linear  # noqa: E402

EPS = 1e-6
GROUP = 128
BF16 = torch.bfloat16
SHAPES = ((4096, 4096), (14336, 4096))
CHECK_COLS = 64
TOLERANCE = 1e-2  # ‖out − ref‖ / ‖ref‖ on the checked columns, bf16


def split_for(block_n: int, block_k: int, n: int, k: int) -> int:
    return choose_split_k(-(-n // block_n), -(-k // block_k), min_programs=rg.MIN_PROGRAMS,
                          min_steps=rg.MIN_STEPS_PER_SPLIT, max_split=rg.MAX_SPLIT_K)


def name_of(plan: GemvPlan, extra: str = "") -> str:
    swap = "-swap" if plan.form == "dot" and plan.swap else ""
    evict = "-evict" if plan.evict_first else ""
    return (f"{plan.form}{plan.block_m}-n{plan.block_n}k{plan.block_k}-s{plan.split_k}-w{plan.num_warps}"
            f"-st{plan.load_stages}{swap}{evict}{extra}")


# --------------------------------------------------------------------------------------------------------
# Clocks
# --------------------------------------------------------------------------------------------------------


def graph_us(fn, operands: list[tuple], replays: int = 15) -> float:
    """Median per-call µs of `fn(*operands[i])` over the copies, replayed from one CUDA graph."""
    calls = operands * max(1, 16 // len(operands))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture (cuBLAS workspaces, compiled guards, autotuning)
        for ops in operands:
            fn(*ops)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for ops in calls:
            fn(*ops)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


def copy_ceiling_gbs() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * src.numel() * 4 / statistics.median(times) / 1e6


def rotate_bytes() -> int:
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (50 << 20)
    return max(256 << 20, 4 * l2)


def copies(make, nbytes: int) -> list:
    return [make() for _ in range(max(2, math.ceil(rotate_bytes() / nbytes)))]


def rel_err(out: torch.Tensor, ref: torch.Tensor, cols: torch.Tensor) -> float:
    got = out.double()[:, cols]
    return float((got - ref).norm() / ref.norm())


# --------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------


def rmsnorm_candidates(m: int, n: int, k: int) -> list[GemvPlan]:
    table = rg.plan_rmsnorm_gemv(m, n, k, BF16)
    if table.form == "fma" and m == 1:
        alts = [GemvPlan("fma", 1, 16, 512, 1, 8, 4, False), GemvPlan("fma", 1, 4, 1024, 1, 4, 4, False),
                replace(table, split_k=2)]
    else:
        alts = [replace(table, swap=not table.swap),
                GemvPlan("dot", 16, 32, 256, split_for(32, 256, n, k), 4, 4, False),
                GemvPlan("dot", 16, 128, 128, split_for(128, 128, n, k), 4, 3, True),
                replace(table, split_k=table.split_k * 2 if table.split_k < 8 else 1)]
        if m <= 4:
            alts[2] = GemvPlan("fma", 4, 4, 256, 1, 4, 4, False)
    return [table] + alts + [replace(table, evict_first=True)]


_COMPILED_PAIR = []


def compiled_pair():
    """F.rms_norm + F.linear through torch.compile, one compiled function for every section."""
    if not _COMPILED_PAIR:
        _COMPILED_PAIR.append(torch.compile(reference.rmsnorm_linear_reference, dynamic=False))
    return _COMPILED_PAIR[0]


def section_rmsnorm(out: dict, compile_peers: bool) -> None:
    compiled = compiled_pair() if compile_peers else None
    rows = []
    for n, k in SHAPES:
        ws = copies(lambda: (torch.randn(n, k, device="cuda") / k**0.5).to(BF16), n * k * 2)
        gamma = (1 + 0.1 * torch.randn(k, device="cuda")).to(BF16)
        cols = torch.linspace(0, n - 1, CHECK_COLS, device="cuda").long()
        for m in (1, 4, 16):
            x = torch.randn(m, k, device="cuda").to(BF16)
            ref = reference.rmsnorm_linear_float64(x, ws[0][cols], gamma, EPS)
            ops = [(x, w, gamma) for w in ws]
            providers = [("torch eager", lambda x, w, g: reference.rmsnorm_linear_reference(x, w, g, EPS))]
            if compiled is not None:
                providers.append(("torch.compile", lambda x, w, g: compiled(x, w, g, EPS)))
            providers.append(("lab rmsnorm_linear", lambda x, w, g: rmsnorm_linear(x, w, g, EPS)))
            for i, plan in enumerate(rmsnorm_candidates(m, n, k)):
                label = ("lab plan " if i == 0 else "lab alt ") + name_of(plan)
                providers.append((label, lambda x, w, g, p=plan: rg.rmsnorm_gemv_fwd(
                    x, w, g, EPS, p, torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device))))
            floor = n * k * 2 / out["copy_ceiling_gbs"] / 1e3
            for name, fn in providers:
                rows.append(run_one("rmsnorm", name, fn, ops, ref, cols, {"M": m, "N": n, "K": k}, floor))
            del x
        del ws
        torch.cuda.empty_cache()
    out["rmsnorm"] = rows


def dequant_candidates(bits: int, m: int, n: int, k: int) -> list[tuple[GemvPlan, bool]]:
    """The plan table's choice first, then other tiles and forms, the plain int-to-float conversion (int8)
    and evict-first W loads. (plan, fast conversion)."""
    table = dl.plan_dequant_linear(bits, m, n, k, GROUP)
    bk = GROUP if bits == 4 else 128
    alts = []
    if m == 1:  # both forms at one token
        fma_k = bk if bits == 4 else 512
        alts += [GemvPlan("fma", 1, 32 if bits == 4 else 16, fma_k, split_for(32 if bits == 4 else 16, fma_k, n, k), 4, 4),
                 GemvPlan("fma", 1, 128 if bits == 4 else 4, bk if bits == 4 else 1024, 1, 4, 4)]
    alts += [GemvPlan("dot", 16, 32, bk, split_for(32, bk, n, k), 4, 3),
             GemvPlan("dot", 16, 128, bk, split_for(128, bk, n, k), 8, 3),
             replace(table, split_k=table.split_k * 2 if table.split_k < 8 else 1)]
    pairs = [(table, True)] + [(p, True) for p in alts if p != table]
    if bits == 8:
        pairs.append((table, False))  # the plain int-to-float conversion
    return pairs + [(replace(table, evict_first=True), True)]


def section_dequant(out: dict, compile_peers: bool) -> None:
    def torch_dequant(x, w, s):
        if w.dtype == torch.int8:
            return F.linear(x, dequantize_int8(w, s, x.dtype))
        return F.linear(x, dequantize_int4(w, s, GROUP, x.dtype))

    compiled = torch.compile(torch_dequant, dynamic=False) if compile_peers else None
    rows = []
    for bits in (8, 4):
        for n, k in SHAPES:
            def make():
                w = (torch.randn(n, k, device="cuda") / k**0.5).to(BF16)
                if bits == 8:
                    return quantize_int8(w)
                packed, scales = quantize_int4(w, GROUP)
                u = reference.unpack_int4_reference(packed, GROUP).add_(8).to(torch.int32)
                tiny = torch.ops.aten._convert_weight_to_int4pack((u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8), 8)
                sz = torch.stack([scales.t(), torch.zeros_like(scales.t())], dim=2).contiguous()
                return packed, scales, tiny, sz

            ws = copies(make, n * k * bits // 8)
            cols = torch.linspace(0, n - 1, CHECK_COLS, device="cuda").long()
            for m in (1, 16):
                x = torch.randn(m, k, device="cuda").to(BF16)
                w0, s0 = ws[0][0][cols], ws[0][1][cols]
                ref = (reference.int8_linear_reference(x.double(), w0, s0.double()) if bits == 8 else
                       reference.int4_linear_reference(x.double(), w0, s0.double(), GROUP))
                ops = [(x, *c) for c in ws]
                providers = [("torch dequant+linear", lambda x, w, s, *_: torch_dequant(x, w, s))]
                if compiled is not None:
                    providers.append(("torch.compile dequant+linear", lambda x, w, s, *_: compiled(x, w, s)))
                if bits == 8:
                    providers.append(("torch _weight_int8pack_mm", lambda x, w, s: torch.ops.aten._weight_int8pack_mm(x, w, s)))
                    providers.append(("lab int8_linear", lambda x, w, s: dl.int8_linear(x, w, s)))
                else:
                    providers.append(("torch _weight_int4pack_mm", lambda x, w, s, t, z: torch.ops.aten._weight_int4pack_mm(x, t, GROUP, z)))
                    providers.append(("lab int4_linear", lambda x, w, s, *_: dl.int4_linear(x, w, s, GROUP)))
                for i, (plan, fast) in enumerate(dequant_candidates(bits, m, n, k)):
                    label = ("lab plan " if i == 0 else "lab alt ") + name_of(plan, "" if fast else "-slowcvt")
                    if bits == 8:
                        fn = lambda x, w, s, p=plan, f=fast: dl.int8_linear_fwd(  # noqa: E731
                            x, w, s, p, torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device), fast_cvt=f)
                    else:
                        fn = lambda x, w, s, *_, p=plan: dl.int4_linear_fwd(  # noqa: E731
                            x, w, s, GROUP, p, torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device))
                    providers.append((label, fn))
                floor = (n * k * bits // 8) / out["copy_ceiling_gbs"] / 1e3
                for name, fn in providers:
                    rows.append(run_one(f"int{bits}", name, fn, ops, ref, cols, {"M": m, "N": n, "K": k}, floor))
            del ws
            torch.cuda.empty_cache()
    out["dequant"] = rows


def run_one(op, name, fn, ops, ref, cols, shape, floor_us) -> dict:
    row = {"op": op, "provider": name, **shape, "floor_us": round(floor_us, 2)}
    try:
        row["rel_err"] = rel_err(fn(*ops[0]), ref, cols)
        row["correct"] = row["rel_err"] <= TOLERANCE
        row["us"] = round(graph_us(fn, ops), 2)
        row["pct_of_floor"] = round(100 * floor_us / row["us"], 1)
    except Exception as exc:  # noqa: BLE001 - a provider that cannot run here is a finding
        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    print(json.dumps(row), flush=True)
    return row


def host_us(fn, calls: int = 200, batches: int = 10) -> tuple[float, float]:
    """(host µs per call with the device held, so launches never wait; µs per call back to back over
    calls * batches calls)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    cycles_per_us = torch.cuda.get_device_properties(0).clock_rate / 1e3
    held = []
    for _ in range(batches):
        torch.cuda._sleep(int(calls * 150 * cycles_per_us))  # ~150 µs a call: longer than any host call here
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        held.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls * batches):
        fn()
    torch.cuda.synchronize()
    return statistics.median(held), (time.perf_counter() - start) / (calls * batches) * 1e6


def section_host(out: dict) -> None:
    k = n = 4096
    x = torch.randn(1, k, device="cuda").to(BF16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(BF16)
    g = torch.ones(k, device="cuda", dtype=BF16)
    w8, s8 = quantize_int8(w)
    w4, s4 = quantize_int4(w, GROUP)
    rows = []
    for name, fn in (("torch F.linear(F.rms_norm)", lambda: F.linear(F.rms_norm(x, (k,), g, EPS), w)),
                     ("lab rmsnorm_linear", lambda: rmsnorm_linear(x, w, g, EPS)),
                     ("torch F.linear alone", lambda: F.linear(x, w)),
                     ("lab int8_linear", lambda: dl.int8_linear(x, w8, s8)),
                     ("lab int4_linear", lambda: dl.int4_linear(x, w4, s4, GROUP))):
        held, wall = host_us(fn)
        rows.append({"call": name, "host_us_device_held": round(held, 2), "wall_us_back_to_back": round(wall, 2)})
        print(json.dumps(rows[-1]), flush=True)
    out["host"] = rows


def section_flush(out: dict, compile_peers: bool) -> None:
    """M = 1, 4096 x 4096: per-call events after a zeroing flush (dirty L2) and after a reading flush."""
    k = n = 4096
    x = torch.randn(1, k, device="cuda").to(BF16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(BF16)
    g = torch.ones(k, device="cuda", dtype=BF16)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (50 << 20)
    buf = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    table = rg.plan_rmsnorm_gemv(1, n, k, BF16)
    fns = {"torch eager": lambda: reference.rmsnorm_linear_reference(x, w, g, EPS),
           "lab plan": lambda: rmsnorm_linear(x, w, g, EPS),
           "lab plan evict-first": lambda: rg.rmsnorm_gemv_fwd(
               x, w, g, EPS, replace(table, evict_first=True), torch.empty(1, n, dtype=BF16, device="cuda"))}
    if compile_peers:
        fns["torch.compile"] = lambda: compiled_pair()(x, w, g, EPS)
    rows = []
    for flush_name, flush in (("zero_ (dirty lines)", buf.zero_), ("sum (clean lines)", lambda: buf.sum())):
        times = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for _ in range(40):
            for name, fn in fns.items():
                flush()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(2_000_000)  # hold the device while the host queues: host time stays off the clock
                start.record()
                fn()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) * 1e3)
        for name, t in times.items():
            rows.append({"flush": flush_name, "provider": name, "us": round(statistics.median(t), 2)})
            print(json.dumps(rows[-1]), flush=True)
    out["flush"] = rows


# --------------------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------------------


def summarize(rows: list[dict], key=("op", "M", "N", "K")) -> list[str]:
    """One line per point: the best peer, the plan table's choice, the best lab candidate, the speedups."""
    lines = []
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        points.setdefault(tuple(r[k] for k in key), []).append(r)
    for point, group in points.items():
        ok = [r for r in group if "us" in r and r.get("correct")]
        bad = [r["provider"] for r in group if not r.get("correct")]
        peers = [r for r in ok if not r["provider"].startswith("lab")]
        labs = [r for r in ok if r["provider"].startswith("lab ")]
        plan = next((r for r in ok if r["provider"].startswith("lab plan")), None)
        text = " ".join(f"{k}={v}" for k, v in zip(key, point))
        if peers:
            peer = min(peers, key=lambda r: r["us"])
            text += f" | best peer {peer['provider']} {peer['us']} us"
            if plan:
                text += f" | plan {plan['us']} us ({plan['pct_of_floor']}% of floor, {peer['us'] / plan['us']:.2f}x)"
            if labs:
                best = min(labs, key=lambda r: r["us"])
                text += (f" | best lab {best['provider']} {best['us']} us ({best['pct_of_floor']}% of floor, "
                         f"{peer['us'] / best['us']:.2f}x)")
        if bad:
            text += f" | INCORRECT/ERROR: {', '.join(bad)}"
        lines.append(text)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    parser.add_argument("--quick", action="store_true", help="4096 x 4096 only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    out_path = Path(args.out_dir) / "gpu_check_decode.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if args.quick:
        global SHAPES
        SHAPES = SHAPES[:1]
    for limit in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):  # one compiled graph per shape, never a silent eager fallback
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))

    # Graphs here are replayed one at a time on one stream: split-K launches may share the stream's cached
    # counters (the figures in notes/ taken before kernels/_gemv.py's zeroed slab were timed this way).
    _gemv.CAPTURE_OWN_WORKSPACE = False
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "clock": "CUDA-graph replay, weight copies rotated past L2; split-K counters shared, not zeroed in-graph",
           "copy_ceiling_gbs": copy_ceiling_gbs()}
    print(f"{out['gpu']}: copy ceiling {out['copy_ceiling_gbs']:.0f} GB/s", flush=True)
    started = time.time()
    for name, section in (("host", lambda: section_host(out)),
                          ("rmsnorm", lambda: section_rmsnorm(out, not args.no_compile)),
                          ("dequant", lambda: section_dequant(out, not args.no_compile)),
                          ("flush", lambda: section_flush(out, not args.no_compile))):
        t0 = time.time()
        try:
            section()
        except Exception as exc:  # noqa: BLE001 - keep what the other sections found
            out[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(out[f"{name}_error"], flush=True)
        out[f"{name}_seconds"] = round(time.time() - t0, 1)
        out_path.write_text(json.dumps(out, indent=1))
    out["summary"] = summarize(out.get("rmsnorm", []) + out.get("dequant", []))
    out["wall_s"] = round(time.time() - started, 1)
    out_path.write_text(json.dumps(out, indent=1))
    print("\n".join(["", "== summary (graph clock, µs per call) =="] + out["summary"]))
    for r in out.get("host", []):
        print(f"host {r['call']:<28} {r['host_us_device_held']:7.2f} us held, {r['wall_us_back_to_back']:7.2f} us back to back")
    print(f"wrote {out_path} in {out['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
