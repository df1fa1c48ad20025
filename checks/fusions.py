"""GPU check of the fused residual add + RMSNorm and SwiGLU kernels: correctness at real sizes, then GPU time.

    python checks/fusions.py [OUT_DIR] [--no-compile] [--no-variants]

1. Correctness: the lab's launchers write into NaN-filled outputs (and NaN-filled dgamma partials) at a few
   real sizes, odd ones included, in bf16, fp16 and fp32; every output is compared with float64 against the
   experiments' tolerances. Any failure makes the exit status 1.
2. Timing: forward and backward of the lab's kernel, eager torch, torch.compile and Liger (when it imports)
   at 4096x4096 and 16384x4096 (add + RMSNorm) and 4096x14336 (SwiGLU), bf16 and fp32, with the lab's own
   GPU-time clock (lab.measure.timing: L2 flushed before every call, device held while the host queues a round, so
   launch overhead stays off the clock). Backward calls are torch.autograd.grad over each provider's own
   retained forward graph, as in the experiments. Percentages are of the copy ceiling measured here.
3. Variants (tuning, not evidence): the backward plan's programs per SM, load stages and warps, and SwiGLU's
   block and warps, timed on the lab's launchers directly.

Prints compact tables and writes fusions.json to OUT_DIR (default $OUT, else the working directory).
Under two minutes on an H100 with a warm Triton cache; torch.compile's first compiles dominate otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import _add_rmsnorm as ar  # noqa: E402
from experiments import _swiglu as sw  # noqa: E402
from experiments._backward import retained_backward  # noqa: E402
from experiments.spec import Case  # noqa: E402
from kernels import reference_fusions as ref  # noqa: E402
from kernels.add_rmsnorm import add_rmsnorm_bwd, add_rmsnorm_fwd, plan_add_rmsnorm, sm_count  # noqa: E402
from kernels.swiglu import plan_swiglu, swiglu_bwd, swiglu_fwd  # noqa: E402
from lab.measure.runner import allow_a_compile_per_point  # noqa: E402
from lab.measure.timing import CudaEventClock, TimingParams, measure_copy_ceiling, time_interleaved  # noqa: E402

PARAMS = TimingParams(warmup_rounds=3, min_samples=15, max_samples=40, target_seconds=0.04, copy_bytes=1 << 30,
                      copy_repeats=15)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EPS = ar.EPS


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


# --------------------------------------------------------------------------------------------------------
# 1. Correctness
# --------------------------------------------------------------------------------------------------------


def check_add_rmsnorm(t: int, h: int, dtype: torch.dtype, device: str = "cuda") -> dict:
    gen = torch.Generator().manual_seed(t * 131 + h)
    inputs = ar.backward_inputs(Case("c", {"T": t, "H": h}), dtype, device, gen)
    x, r, gamma, dh, dy = (inputs[k] for k in ("x", "residual", "gamma", "dh", "dy"))
    fplan = plan_add_rmsnorm(t, h, dtype, "forward")
    h_out, y_out, rstd = add_rmsnorm_fwd(x, r, gamma, EPS, fplan, h_out=nan_like(x), y_out=nan_like(x),
                                         rstd_out=torch.full((t,), float("nan"), device=device))
    bplan = plan_add_rmsnorm(t, h, dtype, "backward", sm_count(x.device))
    partials = torch.full((bplan.grid, h), float("nan"), device=device)
    dx, dgamma = add_rmsnorm_bwd(dy, dh, h_out, gamma, rstd, bplan, dx_out=nan_like(x), dgamma_out=nan_like(gamma),
                                 partials_out=partials)
    h64, y64 = ref.add_rmsnorm_float64(x, r, gamma, EPS)
    dx64, dgamma64 = ref.add_rmsnorm_backward_float64(x, r, gamma, dy, dh, EPS)
    errors = {"h": rel_err(h_out, h64), "y": rel_err(y_out, y64), "dx": rel_err(dx, dx64),
              "dgamma": rel_err(dgamma, dgamma64)}
    nan = any(torch.isnan(v).any().item() for v in (h_out, y_out, rstd, dx, dgamma, partials))
    tol_f, tol_b = ar.FORWARD_TOLERANCE[dtype], ar.BACKWARD_TOLERANCE[dtype]
    ok = not nan and errors["h"] <= tol_f and errors["y"] <= tol_f and errors["dx"] <= tol_b and errors["dgamma"] <= tol_b
    return {"op": "add_rmsnorm", "shape": [t, h], "dtype": str(dtype).removeprefix("torch."), "errors": errors,
            "nan": nan, "ok": ok, "plans": [fplan.as_dict(), bplan.as_dict()]}


def check_swiglu(t: int, i: int, dtype: torch.dtype, layout: str, device: str = "cuda") -> dict:
    gen = torch.Generator().manual_seed(t * 7 + i)
    inputs = sw.backward_inputs(Case("c", {"T": t, "I": i}), dtype, device, gen)
    a, b, dc = inputs["a"], inputs["b"], inputs["dc"]
    if layout == "packed":  # halves of one [T, 2I] tensor: rows of stride 2I
        ab = torch.cat([a, b], dim=1)
        a, b = ab[:, :i], ab[:, i:]
        rows = (a, b)
    else:  # contiguous: one flat launch
        rows = (a.view(1, -1), b.view(1, -1))
    n_rows, n_cols = rows[0].shape
    fplan = plan_swiglu(n_rows, n_cols, "forward")
    bplan = plan_swiglu(n_rows, n_cols, "backward")
    c = swiglu_fwd(*rows, fplan, out=torch.full((n_rows, n_cols), float("nan"), dtype=dtype, device=device))
    dc_rows = dc.view(n_rows, n_cols)
    da, db = swiglu_bwd(dc_rows, *rows, bplan, nan_like(dc_rows), nan_like(dc_rows))
    da64, db64 = ref.swiglu_backward_float64(a, b, dc)
    errors = {"c": rel_err(c.view(t, i), ref.swiglu_float64(a, b)), "da": rel_err(da.view(t, i), da64),
              "db": rel_err(db.view(t, i), db64)}
    nan = any(torch.isnan(v).any().item() for v in (c, da, db))
    ok = not nan and errors["c"] <= sw.FORWARD_TOLERANCE[dtype] and max(errors["da"], errors["db"]) <= sw.BACKWARD_TOLERANCE[dtype]
    return {"op": f"swiglu ({layout})", "shape": [t, i], "dtype": str(dtype).removeprefix("torch."), "errors": errors,
            "nan": nan, "ok": ok, "plans": [fplan.as_dict(), bplan.as_dict()]}


# (T, H): a timed shape; 1000 rows of a non-power-of-two H; an odd H on a few rows; many short rows.
ADD_RMSNORM_CHECKS = ((4096, 4096), (1000, 5120), (7, 4097), (16384, 2048))
# (T, I, layout): a timed shape flat and packed; an odd element count (the flat tail); odd rows, packed.
SWIGLU_CHECKS = ((4096, 14336, "flat"), (4097, 11007, "flat"), (4096, 14336, "packed"), (3, 11007, "packed"))


def correctness(add_rmsnorm_checks=ADD_RMSNORM_CHECKS, swiglu_checks=SWIGLU_CHECKS, device: str = "cuda") -> list[dict]:
    rows = []
    for dtype in DTYPES.values():
        for t, h in add_rmsnorm_checks:
            rows.append(check_add_rmsnorm(t, h, dtype, device))
        for t, i, layout in swiglu_checks:
            rows.append(check_swiglu(t, i, dtype, layout, device))
    print("\ncorrectness (NaN-poisoned outputs, rel. error against float64)")
    for row in rows:
        errs = " ".join(f"{k}={v:.1e}" for k, v in row["errors"].items())
        print(f"  {'ok  ' if row['ok'] else 'FAIL'} {row['op']:<16} {str(tuple(row['shape'])):<14} {row['dtype']:<9} {errs}"
              f"{'  NaN left' if row['nan'] else ''}")
    return rows


# --------------------------------------------------------------------------------------------------------
# 2. Timing: the lab's kernel against the peers, forward and backward
# --------------------------------------------------------------------------------------------------------


def _liger_available() -> bool:
    try:
        import liger_kernel  # noqa: F401
    except Exception:  # noqa: BLE001 - an optional peer may fail to import in any way
        return False
    return True


def _providers(module, with_compile: bool, with_liger: bool, direction: str) -> dict:
    profiles = module.FORWARD_PROFILES if direction == "forward" else module.BACKWARD_PROFILES
    keep = {"triton", "torch"} | ({"torch.compile"} if with_compile else set()) | ({"liger"} if with_liger else set())
    return {p.name: p.run for p in profiles if p.name in keep}


def time_point(clock, ceiling_gbps, op, module, case, dtype, direction, with_compile, with_liger, device="cuda",
               params=PARAMS) -> list[dict]:
    gen = torch.Generator().manual_seed(11)
    make = module.forward_inputs if direction == "forward" else module.backward_inputs
    inputs = make(case, dtype, device, gen)
    bytes_moved = (module.forward_bytes if direction == "forward" else module.backward_bytes)(case, dtype)
    calls, rows = {}, []
    for name, run in _providers(module, with_compile, with_liger, direction).items():
        try:
            run(**inputs)  # compiles, builds the retained graph
            clock.settle()
            calls[name] = lambda run=run: run(**inputs)
        except Exception as exc:  # noqa: BLE001 - one provider's failure is its own row
            rows.append({"provider": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
    timed = time_interleaved(calls, clock, params)
    for name in calls:
        if name in timed.errors:
            rows.append({"provider": name, "error": timed.errors[name]})
            continue
        samples = sorted(timed.samples_ms[name])
        ms = samples[len(samples) // 2]
        gbps = bytes_moved / (ms * 1e-3) / 1e9
        rows.append({"provider": name, "us": ms * 1e3, "gbps": gbps, "pct": 100 * gbps / ceiling_gbps})
    for row in rows:
        row.update(op=op, direction=direction, dtype=str(dtype).removeprefix("torch."), shape=dict(case.shape),
                   bytes=bytes_moved)
    del inputs, calls
    clock.release()
    return rows


def timing(clock, ceiling_gbps, with_compile: bool) -> list[dict]:
    with_liger = _liger_available()
    points = [("add_rmsnorm", ar, Case("4096x4096", {"T": 4096, "H": 4096})),
              ("add_rmsnorm", ar, Case("16384x4096", {"T": 16384, "H": 4096})),
              ("swiglu", sw, Case("4096x14336", {"T": 4096, "I": 14336}))]
    rows = []
    print(f"\ntiming (GPU time, median; % of the copy ceiling {ceiling_gbps:.0f} GB/s){'' if with_liger else '; Liger not installed'}")
    for op, module, case in points:
        for dtype in (torch.bfloat16, torch.float32):
            for direction in ("forward", "backward"):
                point = time_point(clock, ceiling_gbps, op, module, case, dtype, direction, with_compile, with_liger)
                rows += point
                cells = [f"{r['provider']} {r['us']:.1f}us {r['pct']:.1f}%" if "us" in r else f"{r['provider']} ERROR"
                         for r in point]
                print(f"  {op:<12} {case.name:<11} {str(dtype).removeprefix('torch.'):<9} {direction:<8} " + " | ".join(cells),
                      flush=True)
    return rows


# --------------------------------------------------------------------------------------------------------
# 3. Variants of the lab's launch plans (tuning)
# --------------------------------------------------------------------------------------------------------


def _bwd_plan(t, h, dtype, programs_per_sm, stages, warps, device):
    base = plan_add_rmsnorm(t, h, dtype, "backward", sm_count(torch.device(device)))
    programs = max(1, min(t, sm_count(torch.device(device)) * programs_per_sm))
    rows = triton.cdiv(t, programs)
    return replace(base, grid=triton.cdiv(t, rows), rows_per_program=rows, load_stages=stages,
                   num_warps=warps or base.num_warps)


ADD_RMSNORM_VARIANT_POINTS = ((16384, 4096, torch.bfloat16), (16384, 4096, torch.float32), (4096, 8192, torch.bfloat16))
SWIGLU_VARIANT_SHAPE = (4096, 14336)


def variants(clock, ceiling_gbps, add_points=ADD_RMSNORM_VARIANT_POINTS, swiglu_shape=SWIGLU_VARIANT_SHAPE,
             device="cuda", params=PARAMS) -> list[dict]:
    rows = []
    print("\nvariants (the lab's launchers called directly; tuning, not evidence)")
    for t, h, dtype in add_points:
        case = Case("v", {"T": t, "H": h})
        inp = ar.backward_inputs(case, dtype, device, torch.Generator().manual_seed(5))
        hs, _, rstd = add_rmsnorm_fwd(inp["x"], inp["residual"], inp["gamma"], EPS, plan_add_rmsnorm(t, h, dtype))
        default = plan_add_rmsnorm(t, h, dtype, "backward", sm_count(torch.device(device)))
        calls, plans = {}, {}
        for pps in (1, 2, 4):
            for stages in (1, 2, 3):
                plans[f"pps{pps} st{stages}"] = _bwd_plan(t, h, dtype, pps, stages, None, device)
        for warps in (default.num_warps // 2, default.num_warps * 2):
            if 1 <= warps <= 32:
                plans[f"pps2 st2 w{warps}"] = _bwd_plan(t, h, dtype, 2, 2, warps, device)
        for name, plan in plans.items():
            calls[name] = lambda plan=plan: add_rmsnorm_bwd(inp["dy"], inp["dh"], hs, inp["gamma"], rstd, plan)
        rows += _time_variants(clock, ceiling_gbps, f"add_rmsnorm bwd {t}x{h} {str(dtype).removeprefix('torch.')}",
                               calls, {k: p.as_dict() for k, p in plans.items()}, ar.backward_bytes(case, dtype),
                               default.as_dict(), params)
        del inp, hs, rstd
    t, i = swiglu_shape
    for dtype in (torch.bfloat16, torch.float32):
        case = Case("v", {"T": t, "I": i})
        inp = sw.backward_inputs(case, dtype, device, torch.Generator().manual_seed(5))
        a, b, dc = (inp[k].view(1, -1) for k in ("a", "b", "dc"))
        for direction in ("forward", "backward"):
            default = plan_swiglu(1, a.shape[1], direction)
            plans = {}
            for block in (1024, 2048, 4096, 8192):
                for warps in (4, 8):
                    plans[f"block{block} w{warps}"] = replace(default, block=block, num_warps=warps,
                                                              col_blocks=triton.cdiv(a.shape[1], block),
                                                              grid=triton.cdiv(a.shape[1], block))
            if direction == "forward":
                calls = {k: (lambda p=p: swiglu_fwd(a, b, p)) for k, p in plans.items()}
            else:
                calls = {k: (lambda p=p: swiglu_bwd(dc, a, b, p)) for k, p in plans.items()}
            nbytes = (sw.forward_bytes if direction == "forward" else sw.backward_bytes)(case, dtype)
            rows += _time_variants(clock, ceiling_gbps, f"swiglu {direction} {t}x{i} {str(dtype).removeprefix('torch.')}",
                                   calls, {k: p.as_dict() for k, p in plans.items()}, nbytes, default.as_dict(), params)
        del inp, a, b, dc
    clock.release()
    return rows


def _time_variants(clock, ceiling_gbps, label, calls, plans, nbytes, default, params) -> list[dict]:
    for fn in calls.values():
        fn()
    clock.settle()
    timed = time_interleaved(calls, clock, params)
    rows = []
    for name in calls:
        if name in timed.errors:
            rows.append({"point": label, "variant": name, "plan": plans[name], "error": timed.errors[name]})
            continue
        samples = sorted(timed.samples_ms[name])
        ms = samples[len(samples) // 2]
        pct = 100 * nbytes / (ms * 1e-3) / 1e9 / ceiling_gbps
        rows.append({"point": label, "variant": name, "plan": plans[name], "us": ms * 1e3, "pct": pct})
    best = max((r for r in rows if "pct" in r), key=lambda r: r["pct"], default=None)
    cells = " | ".join(f"{r['variant']} {r['pct']:.1f}%" if "pct" in r else f"{r['variant']} ERROR" for r in rows)
    print(f"  {label}: {cells}")
    if best is not None:
        print(f"    best: {best['variant']} {best['pct']:.1f}%; default plan {default}")
    return rows


# --------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the timing")
    parser.add_argument("--no-variants", action="store_true", help="skip the tuning variants")
    args = parser.parse_args()
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_check_fusions: needs a CUDA GPU and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    started = time.time()
    allow_a_compile_per_point(16)  # one compiled graph per shape, dtype and direction, never an eager fallback
    clock = CudaEventClock("cuda")
    ceiling = measure_copy_ceiling(clock, "cuda", PARAMS)
    liger_version = None
    if _liger_available():
        import importlib.metadata

        liger_version = importlib.metadata.version("liger-kernel")
    out = {"gpu": torch.cuda.get_device_name(), "sms": sm_count(torch.device("cuda")), "torch": torch.__version__,
           "triton": triton.__version__, "liger_kernel": liger_version, "python": platform.python_version(),
           "timing": clock.name, "copy_ceiling_gbps": ceiling.gbps}
    print(f"{out['gpu']} ({out['sms']} SMs): copy ceiling {ceiling.gbps:.0f} GB/s; torch {torch.__version__}, "
          f"Triton {triton.__version__}, Liger {liger_version}")
    path = Path(args.out_dir) / "fusions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    sections = [("correctness", correctness, ()), ("timing_rows", timing, (clock, ceiling.gbps, not args.no_compile))]
    if not args.no_variants:
        sections.append(("variants", variants, (clock, ceiling.gbps)))
    for key, section, section_args in sections:
        try:
            out[key] = section(*section_args)
        except Exception as exc:  # noqa: BLE001 - keep what the earlier sections measured
            out[key] = [{"error": f"{type(exc).__name__}: {exc}"[:600]}]
            print(f"  {key} failed: {out[key][0]['error']}")
            clock.release()
        print(f"  ({time.time() - started:.0f} s)", flush=True)
        path.write_text(json.dumps(out, indent=1), encoding="utf-8")
    out["elapsed_s"] = time.time() - started
    path.write_text(json.dumps(out, indent=1), encoding="utf-8")
    failed = [r for r in out["correctness"] if not r.get("ok")]
    print(f"\n{len(out['correctness']) - len(failed)}/{len(out['correctness'])} correctness checks passed; "
          f"{out['elapsed_s']:.0f} s; wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
