"""The L2 flush before every timed call, old against new, on the lab's own GPU-time clock.

    python checks/flush_compare.py OUT_DIR

The old flush zeroed a buffer twice the L2 (the L2 is left full of dirty lines, which the timed call must
write back to DRAM before its own lines fit); the new one sums that buffer into one scalar (the L2 is left
holding clean lines, dropped for free). Both are lab.measure.timing.L2Flush, on two CudaEventClocks that
differ only in it. For each point (a small case of one of the lab's experiments, and one large case as a
control) every quick profile is checked against the float64 reference, then timed in interleaved rounds
(lab.measure.timing.time_interleaved) on one clock, then the other, then again in the other order: each
flush gets two sets of samples, pooled. The three bandwidth ceilings are measured too (with the new flush).

Writes OUT_DIR/flush_compare.json (per point and profile: median µs under each flush and their ratio) and
OUT_DIR/flush_compare.txt (the same as a table). Exits 1 if a profile fails its accuracy check or raises,
after writing what it has. Needs one CUDA GPU; about a minute on an H100 (Triton compiles included).
"""

from __future__ import annotations

import functools
import importlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.evidence.records import FLUSH_READ, FLUSH_ZERO  # noqa: E402
from lab.measure.environment import capture_environment  # noqa: E402
from lab.measure.inputs import as_float64, draw_inputs, dtype_name, input_seed, relative_error, select_rows  # noqa: E402
from lab.measure.timing import (GPU_TIMING, CudaEventClock, TimingParams, measure_copy_ceiling,  # noqa: E402
                                measure_read2_write_ceiling, measure_read_ceiling, time_interleaved)

# (experiment module, case, dtype): small points, where a fixed cost per call shows, and a large control.
POINTS = (
    ("softmax_fwd_sweep", "4096x1024", torch.float32),
    ("softmax_fwd_sweep", "4096x1024", torch.bfloat16),
    ("softmax_bwd_sweep", "4096x1024", torch.float32),
    ("add_rmsnorm_fwd", "32x4096", torch.bfloat16),
    ("add_rmsnorm_fwd", "4096x4096", torch.bfloat16),
    ("swiglu_fwd", "64x14336", torch.bfloat16),
    ("swiglu_fwd", "4096x4096", torch.bfloat16),
    ("rmsnorm_linear_decode", "m1-n4096-k4096", torch.bfloat16),
    ("attention_fwd", "d128-causal-s512", torch.bfloat16),
    ("add_rmsnorm_fwd", "16384x8192", torch.bfloat16),  # the control: a call long enough that a fixed cost fades
)
SKIP = ("torch.compile", "liger")  # compile time and optional peers: not what this compares
PARAMS = TimingParams(warmup_rounds=3, min_samples=40, max_samples=60, target_seconds=0.05, copy_bytes=1 << 30,
                      copy_repeats=15)
FALLBACK_TOLERANCE = 3e-2  # a dtype the experiment does not declare (bf16 softmax)


def _profiles(experiment, case, dtype):
    for p in experiment.profiles:
        if p.name in SKIP or p.requires is not None:
            continue
        if p.unsupported is not None and p.unsupported(case, dtype) is not None:
            continue
        yield p


def _point(module: str, case_name: str, dtype: torch.dtype, clocks: dict) -> dict:
    experiment = importlib.import_module(f"experiments.{module}").EXPERIMENT
    case = next(c for c in experiment.cases if c.name == case_name)
    inputs = draw_inputs(experiment, case, dtype, "cuda", input_seed(experiment.slug, case, dtype))
    rows = select_rows(experiment, inputs, 1 << 22)
    ref_inputs = {n: (t.index_select(0, rows.index) if rows.index is not None and n in experiment.row_inputs else t)
                  for n, t in inputs.items()}
    ref = as_float64(experiment.reference(**ref_inputs))
    tolerance = float(experiment.tolerance.get(dtype, FALLBACK_TOLERANCE))
    calls, errors = {}, {}
    for p in _profiles(experiment, case, dtype):
        bound = float(p.tolerance[dtype]) if p.tolerance and dtype in p.tolerance else tolerance
        try:
            error, why = relative_error(p.run(**inputs), ref, rows)
        except Exception as exc:  # noqa: BLE001 - reported, the others go on
            errors[p.name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        if error is None or error > bound:
            errors[p.name] = why or f"relative error {error:.3g} over {bound:.3g}"
            continue
        calls[p.name] = functools.partial(p.run, **inputs)
    samples = {flush: {name: [] for name in calls} for flush in clocks}
    for order in ((FLUSH_ZERO, FLUSH_READ), (FLUSH_READ, FLUSH_ZERO)):
        for flush in order:
            timed = time_interleaved(calls, clocks[flush], PARAMS)
            errors.update(timed.errors)
            for name, values in timed.samples_ms.items():
                samples[flush][name].extend(values)
    profiles = {}
    for name in calls:
        if name in errors:
            continue
        zero = statistics.median(samples[FLUSH_ZERO][name]) * 1e3
        read = statistics.median(samples[FLUSH_READ][name]) * 1e3
        profiles[name] = {"zero_us": zero, "read_us": read, "zero_over_read": zero / read,
                          "samples": {f: len(samples[f][name]) for f in samples}}
    del inputs, ref_inputs, ref, calls
    torch.cuda.empty_cache()
    return {"experiment": experiment.slug, "case": case_name, "dtype": dtype_name(dtype),
            "bytes_moved": int(experiment.bytes_moved(case, dtype)), "profiles": profiles, "errors": errors}


def _table(out: dict) -> str:
    lines = [f"{out['gpu']}: L2 {out['l2_bytes'] / 2**20:.0f} MiB, flush buffer {out['flush_bytes'] / 2**20:.0f} MiB; "
             + ", ".join(f"{k} ceiling {v['gbps']:.0f} GB/s" for k, v in out["ceilings"].items()), "",
             f"{'experiment':24} {'case':18} {'dtype':9} {'profile':22} {'zero µs':>9} {'read µs':>9} {'zero/read':>9}"]
    for point in out["points"]:
        for name, p in point["profiles"].items():
            lines.append(f"{point['experiment']:24} {point['case']:18} {point['dtype']:9} {name:22} "
                         f"{p['zero_us']:9.2f} {p['read_us']:9.2f} {p['zero_over_read']:9.3f}")
        for name, why in point["errors"].items():
            lines.append(f"{point['experiment']:24} {point['case']:18} {point['dtype']:9} {name:22} FAILED: {why}")
    return "\n".join(lines) + "\n"


def main(out_dir: Path) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    clocks = {flush: CudaEventClock("cuda", flush_method=flush) for flush in (FLUSH_ZERO, FLUSH_READ)}
    read_clock = clocks[FLUSH_READ]
    env = capture_environment("cuda")
    out = {"gpu": env.get("gpu_name"), "torch": torch.__version__, "l2_bytes": env.get("l2_cache_bytes"),
           "flush_bytes": read_clock.flush_bytes, "params": PARAMS.__dict__, "ceilings": {}, "points": [],
           "failures": []}
    for name, measure in (("copy", measure_copy_ceiling), ("read", measure_read_ceiling),
                          ("read2-write", measure_read2_write_ceiling)):
        c = measure(read_clock, "cuda", GPU_TIMING)
        out["ceilings"][name] = {"gbps": c.gbps, "bytes": c.bytes_copied, "median_ms": statistics.median(c.samples_ms)}
    for module, case, dtype in POINTS:
        try:
            point = _point(module, case, dtype, clocks)
        except Exception:  # noqa: BLE001 - one point's failure is reported, the rest still run
            out["failures"].append(f"{module} {case} {dtype_name(dtype)}: {traceback.format_exc(limit=3)}")
            continue
        out["points"].append(point)
        out["failures"].extend(f"{module} {case} {dtype_name(dtype)} {n}: {why}" for n, why in point["errors"].items())
        (out_dir / "flush_compare.json").write_text(json.dumps(out, indent=2, default=str))
    out["seconds"] = time.perf_counter() - started
    (out_dir / "flush_compare.json").write_text(json.dumps(out, indent=2, default=str))
    table = _table(out)
    (out_dir / "flush_compare.txt").write_text(table)
    print(table + f"{out['seconds']:.0f} s; failures: {len(out['failures'])}")
    for failure in out["failures"]:
        print(failure)
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
