"""What a call of the lab's softmax costs the host, against torch.softmax, and whether the compiled and
graphed routes give the right numbers (GPU; a CPU mode profiles the Python alone).

    python -m probes.host_overhead [OUT_DIR]              # GPU; OUT_DIR defaults to $OUT
    python -m probes.host_overhead --cpu-stub [OUT_DIR]   # CPU: the interpreter with kernel bodies stubbed

GPU mode, in about two minutes on an H100:
* host time per call: wall time over 2000 back-to-back calls, best of 5, on one-row inputs (1 x 1024 fp32,
  and the split-row row 1 x 131072 bf16) so the GPU never limits it: torch.softmax against the lab's
  softmax, forward, forward with requires_grad, and forward + backward through autograd (y.backward with
  x.grad cleared before each, and torch.autograd.grad as experiments/softmax_call_overhead.py calls it).
  Targets: forward <= torch, forward + backward <= 1.5 x torch.
* cProfile's top entries for the lab's forward and forward + backward.
* correctness against float64: repeated eager calls (split-row counters must reset themselves), two
  streams at once, manual CUDA graph capture and replay, make_graphed_callables (forward + backward),
  torch.compile(fullgraph=True) with Inductor, mode="reduce-overhead", and a row count that changes.
* GPU time of the split-row kernels with self-resetting counters against the kernels they replace (a
  memset of the counters before every launch, not counted), at M*N = 2^28, do_bench medians.

It prints a compact table and writes host-overhead.json (or host-overhead-cpu-stub.json) into OUT_DIR.
A tuning and acceptance instrument, not evidence for the site: the site's figures come from run records.
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import io
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

CPU_STUB = "--cpu-stub" in sys.argv
if CPU_STUB:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton decorates the kernels

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import reference  # noqa: E402
from kernels.softmax import plan_softmax, softmax  # noqa: E402

QUESTION = ("What does one call of the lab's softmax cost the host against torch.softmax, and do the compiled "
            "and graphed routes give the right numbers?")
CANDIDATES = ("torch.softmax", "lab softmax", "lab softmax through autograd", "CUDA graph", "torch.compile")
OUTPUTS = {
    "host-cpu-stub": ("notes/probes/2026-11-23-cpu-stub-host-overhead-before.json",
                      "notes/probes/2026-11-23-cpu-stub-host-overhead-after.json"),
    "host-h100": ("notes/probes/2026-11-23-h100-host-overhead.json",),
}

CALLS, REPEATS = 2000, 5


def host_us_per_call(fn, calls: int = CALLS, repeats: int = REPEATS) -> float:
    """Best of `repeats` of the wall time of `calls` back-to-back calls (the queue drained after), per call."""
    for _ in range(50):
        fn()
    sync = torch.cuda.synchronize if torch.cuda.is_available() and not CPU_STUB else (lambda: None)
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def top_entries(fn, calls: int, n: int = 12) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue().strip()


def call_cases(device: str, dtype: torch.dtype, n: int):
    """(name, torch's call, the lab's call) on one row of n elements."""
    x = torch.randn(1, n, device=device, dtype=dtype)
    xg = x.clone().requires_grad_()
    dy = torch.randn(1, n, device=device, dtype=dtype)

    def backward_of(f):
        def step():
            xg.grad = None
            f(xg).backward(dy)
        return step

    def grad_of(f):
        return lambda: torch.autograd.grad(f(xg), xg, dy)

    yield "forward", lambda: torch.softmax(x, -1), lambda: softmax(x)
    yield "forward, requires_grad", lambda: torch.softmax(xg, -1), lambda: softmax(xg)
    yield "forward + backward", backward_of(lambda t: torch.softmax(t, -1)), backward_of(softmax)
    yield "forward + autograd.grad", grad_of(lambda t: torch.softmax(t, -1)), grad_of(softmax)


def host_table(device: str) -> dict:
    rows = {}
    inputs = [("1x1024 fp32", torch.float32, 1024), ("1x131072 bf16 (split-row)", torch.bfloat16, 131072)]
    for label, dtype, n in inputs:
        for case, torch_fn, lab_fn in call_cases(device, dtype, n):
            name = f"{label}: {case}"
            t_torch = host_us_per_call(torch_fn) if not CPU_STUB else None
            t_lab = host_us_per_call(lab_fn)
            rows[name] = {"torch_us": t_torch, "lab_us": t_lab,
                          "ratio": None if t_torch is None else t_lab / t_torch}
            ratio = "" if t_torch is None else f"{t_torch:8.1f} {t_lab / t_torch:6.2f}x"
            print(f"{name:48s} lab {t_lab:8.1f} us/call   torch{ratio}", flush=True)
        if CPU_STUB:
            break  # the interpreter's long rows add nothing to a profile of the Python
    plan_us = host_us_per_call(lambda: plan_softmax(1, 1024, torch.float32))
    rows["plan_softmax(1, 1024, fp32)"] = {"lab_us": plan_us}
    print(f"{'plan_softmax(1, 1024, fp32)':48s} lab {plan_us:8.1f} us/call", flush=True)
    return rows


def targets(rows: dict) -> dict:
    fwd = rows["1x1024 fp32: forward"]["ratio"]
    fwd_bwd = rows["1x1024 fp32: forward + backward"]["ratio"]
    return {"forward <= torch": fwd is not None and fwd <= 1.0,
            "forward + backward <= 1.5 x torch": fwd_bwd is not None and fwd_bwd <= 1.5}


def profiles(device: str) -> dict:
    x = torch.randn(1, 1024, device=device)
    xg = x.clone().requires_grad_()
    dy = torch.randn(1, 1024, device=device)

    def fwd_bwd():
        xg.grad = None
        softmax(xg).backward(dy)

    return {"forward": top_entries(lambda: softmax(x), CALLS),
            "forward + backward": top_entries(fwd_bwd, CALLS // 4)}


# ---------------------------------------------------------------------------------------------------------
# Correctness of every route on the GPU, against float64
# ---------------------------------------------------------------------------------------------------------

RTOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2}  # tests/test_softmax.py's bounds
GRAD = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
SHAPES = [((8, 1024), torch.float32), ((2, 131072), torch.bfloat16), ((3, 100000), torch.float32)]


def _errors(y, x, dx=None, dy=None) -> dict:
    ref = reference.softmax_float64(x.detach())
    err = ((y.detach().double() - ref).abs() / (ref.abs() + 1e-30)).max().item() if y is not None else 0.0
    out = {"y_rel_max": err, "ok": bool(err <= RTOL[x.dtype] and not torch.isnan(y).any())}
    if dx is not None:
        x64 = x.detach().double().requires_grad_()
        torch.softmax(x64, -1).backward(dy.double())
        g = ((dx.double() - x64.grad).norm() / x64.grad.norm()).item()
        out.update(dx_rel_norm=g, ok=out["ok"] and g <= GRAD[x.dtype])
    return out


def _fresh(shape, dtype, grad=False):
    x = torch.randn(shape, device="cuda").mul_(3).to(dtype)
    return x.requires_grad_() if grad else x


def _worst(results: list) -> dict:
    return {"ok": all(r["ok"] for r in results), "calls": len(results),
            **{k: max(r.get(k, 0.0) for r in results) for k in ("y_rel_max", "dx_rel_norm")}}


def check_eager_repeated(shape, dtype) -> dict:
    results = []
    for _ in range(20):
        x, dy = _fresh(shape, dtype, True), _fresh(shape, dtype)
        y = softmax(x)
        y.backward(dy)
        results.append(_errors(y, x, x.grad, dy))
    return _worst(results)


def check_two_streams(shape, dtype) -> dict:
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    xs = [_fresh(shape, dtype) for _ in range(8)]
    torch.cuda.synchronize()
    ys = []
    for i, x in enumerate(xs):
        with torch.cuda.stream(streams[i % 2]):
            ys.append(softmax(x))
    torch.cuda.synchronize()
    return _worst([_errors(y, x) for x, y in zip(xs, ys)])


def check_cuda_graph(shape, dtype) -> dict:
    x = _fresh(shape, dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        softmax(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = softmax(x)
    results = []
    for _ in range(10):
        x.copy_(_fresh(shape, dtype))
        graph.replay()
        torch.cuda.synchronize()
        results.append(_errors(y, x))
    return _worst(results)


def check_graphed_callable(shape, dtype) -> dict:
    graphed = torch.cuda.make_graphed_callables(lambda t: softmax(t), (_fresh(shape, dtype, True),))
    results = []
    for _ in range(5):
        x, dy = _fresh(shape, dtype, True), _fresh(shape, dtype)
        y = graphed(x)
        y.backward(dy)
        results.append(_errors(y, x, x.grad, dy))
    return _worst(results)


def check_compiled(mode: str) -> dict:
    torch._dynamo.reset()
    f = torch.compile(lambda t: softmax(t) * 2.0, fullgraph=True, mode=mode)
    results = []
    for shape, dtype in SHAPES + [((5, 1024), torch.float32), ((11, 1024), torch.float32)]:  # rows change
        for _ in range(3):  # reduce-overhead records its CUDA graph on a later call, then replays it
            x, dy = _fresh(shape, dtype, True), _fresh(shape, dtype)
            y = f(x)
            y.backward(dy * 2.0)
            results.append(_errors(y / 2.0, x, x.grad / 2.0, dy * 2.0))
    return _worst(results)


def correctness() -> dict:
    checks = {}
    plans = {f"{s}/{d}": plan_softmax(s[0], s[1], d).impl for s, d in SHAPES}
    for name, fn, shapes in [("eager, 20 calls", check_eager_repeated, SHAPES),
                             ("eager, two streams", check_two_streams, SHAPES[1:]),
                             ("manual CUDA graph, 10 replays", check_cuda_graph, SHAPES),
                             ("make_graphed_callables", check_graphed_callable, SHAPES)]:
        for shape, dtype in shapes:
            key = f"{name}: {shape} {str(dtype).removeprefix('torch.')}"
            checks[key] = _run_check(fn, shape, dtype)
    for mode in ("default", "reduce-overhead"):
        checks[f"torch.compile(fullgraph=True, mode={mode!r})"] = _run_check(check_compiled, mode)
    for key, result in checks.items():
        status = "ok" if result.get("ok") else "FAIL"
        detail = result.get("error") or f"y {result['y_rel_max']:.1e}  dx {result.get('dx_rel_norm', 0.0):.1e}"
        print(f"{key:60s} {status:4s} {detail}", flush=True)
    return {"plans": plans, "checks": checks}


def _run_check(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:  # a failing route is a finding, not a crash of the probe
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}


# ---------------------------------------------------------------------------------------------------------
# GPU time of the split-row kernels: self-resetting counters against a memset before every launch
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _before_wait_for_row(counter_ptr, arrived, n_splits):
    while arrived < n_splits:
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire")
    return arrived


@triton.jit
def _before_fwd_split_row_kernel(
    x_ptr, y_ptr, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits, x_row_stride, y_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    # The forward split-row kernel as it was before its counters reset themselves (commit 6befa83).
    ticket = tl.atomic_add(sync_ptr, 1)
    row = ticket // n_splits
    part = ticket % n_splits
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp(x - m_safe)
    tl.store(part_m_ptr + ticket, m)
    tl.store(part_d_ptr + ticket, tl.sum(e, axis=0))
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="acq_rel") + 1
    arrived = _before_wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    pm = tl.load(part_m_ptr + parts, mask=in_row, other=-float("inf"), volatile=True)
    pd = tl.load(part_d_ptr + parts, mask=in_row, other=0.0, volatile=True)
    m_row = tl.max(pm, axis=0)
    d_row = tl.sum(tl.where(pm == -float("inf"), 0.0, pd * tl.exp(pm - m_row)), axis=0)
    d_row = tl.where(m_row == -float("inf"), float("nan"), d_row)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m_safe - m_row)) / d_row
    tl.store(y_ptr + row.to(tl.int64) * y_row_stride + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _before_bwd_split_row_kernel(
    y_ptr, dy_ptr, dx_ptr, part_dot_ptr, sync_ptr, n_cols, n_splits, y_row_stride, dy_row_stride, dx_row_stride,
    BLOCK_N: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    # The backward split-row kernel as it was before its counters reset themselves (commit 6befa83).
    ticket = tl.atomic_add(sync_ptr, 1)
    row = ticket // n_splits
    part = ticket % n_splits
    cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    row64 = row.to(tl.int64)
    y = tl.load(y_ptr + row64 * y_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row64 * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(part_dot_ptr + ticket, tl.sum(y * dy, axis=0))
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="acq_rel") + 1
    arrived = _before_wait_for_row(sync_ptr + 1 + row, arrived, n_splits)
    parts = row * n_splits + tl.arange(0, SPLITS_POW2)
    in_row = tl.arange(0, SPLITS_POW2) < n_splits
    dot = tl.sum(tl.load(part_dot_ptr + parts, mask=in_row, other=0.0, volatile=True), axis=0)
    dx = y * (dy - dot)
    tl.store(dx_ptr + row64 * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def split_row_gpu_time() -> dict:
    """do_bench medians (ms) of the split-row kernels now and before, at M x N = 2048 x 131072."""
    from triton.testing import do_bench

    from kernels.softmax import softmax_bwd, softmax_fwd

    m, n, out = 2048, 131072, {}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        for direction in ("forward", "backward"):
            plan = plan_softmax(m, n, dtype, "auto", True, direction)
            meta = dict(BLOCK_N=plan.block_n, SPLITS_POW2=triton.next_power_of_2(plan.splits), num_warps=plan.num_warps)
            sync = torch.zeros(1 + m, dtype=torch.int32, device="cuda")
            parts = torch.empty(2, m * plan.splits, dtype=torch.float32, device="cuda")
            if direction == "forward":
                def before():
                    sync.zero_()  # the memset every launch needed then; timed alone below
                    _before_fwd_split_row_kernel[(plan.grid,)](
                        x, y, parts[0], parts[1], sync, n, plan.splits, x.stride(0), y.stride(0), **meta)
                now = lambda: softmax_fwd(x, plan, out=y)  # noqa: E731
            else:
                def before():
                    sync.zero_()
                    _before_bwd_split_row_kernel[(plan.grid,)](
                        y, dy, dx, parts[0], sync, n, plan.splits, y.stride(0), dy.stride(0), dx.stride(0), **meta)
                now = lambda: softmax_bwd(y, dy, plan, out=dx)  # noqa: E731
            memset = do_bench(sync.zero_, warmup=25, rep=100, return_mode="median")
            t_before = do_bench(before, warmup=25, rep=200, return_mode="median")
            t_now = do_bench(now, warmup=25, rep=200, return_mode="median")
            key = f"{direction} {str(dtype).removeprefix('torch.')} {m}x{n}"
            out[key] = {"before_ms_with_memset": t_before, "memset_ms": memset, "now_ms": t_now,
                        "now_over_before_minus_memset": t_now / max(t_before - memset, 1e-9)}
            print(f"split-row {key:28s} before {t_before:.4f} ms (memset {memset:.4f})  now {t_now:.4f} ms", flush=True)
        del x, dy, y, dx
        torch.cuda.empty_cache()
    return out


def route_modes() -> dict:
    import importlib

    routes = importlib.import_module("kernels.softmax")._ROUTES
    return {f"{key[1]} {key[3]} {key[4]}": (route.plan.impl, route.launch.mode) for key, route in routes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT", "."))
    parser.add_argument("--cpu-stub", action="store_true", help="profile the Python on the CPU, kernels stubbed")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    versions = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    if args.cpu_stub:
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = lambda self, *a, grid, warmup, **k: None  # launches do nothing
        result = {"where": "CPU, Triton interpreter with kernel bodies stubbed: the Python host code only, "
                           "not a timing of any launch", **versions, "host": host_table("cpu"),
                  "cprofile": profiles("cpu")}
        name = "host-overhead-cpu-stub.json"
    else:
        faulthandler.dump_traceback_later(300, exit=True)  # a split-row wait that never ends ends the probe
        from probes.harness import probe_header

        header = probe_header(**versions)
        rows = host_table("cuda")
        result = {"where": header.pop("gpu"), **header, "host": rows, "targets": targets(rows),
                  "cprofile": profiles("cuda"), "routes": route_modes()}
        print(json.dumps(result["targets"]), flush=True)
        result.update(correctness=correctness(), split_row_gpu_time=split_row_gpu_time())
        faulthandler.cancel_dump_traceback_later()
        name = "host-overhead.json"
    for label, text in result["cprofile"].items():
        print(f"\ncProfile, {label}:\n" + "\n".join(text.splitlines()[:22]))
    (out_dir / name).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {out_dir / name}")


if __name__ == "__main__":
    main()
