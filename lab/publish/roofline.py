"""The roofline of a run's profiled calls: where each call sits against the GPU's two measured limits.

For every profiled call (a profile at a point, its kernels together, lab.measure.profiling):

    intensity = FLOPs / DRAM bytes        (Nsight Compute's DRAM read + write bytes)
    achieved  = FLOPs / duration          (Nsight Compute's summed kernel durations)

where the FLOPs are the experiment's FLOP model if it declares one, else what Nsight Compute counted: the
executed FP add, multiply and FMA instructions (lab.measure.ncu.FP_INSTRUCTION_FLOPS; tensor-core work is not
among them, so an experiment whose kernels use the tensor cores declares a model). For a memory-bound op the
measured count places the call far left on the slanted roof, and its distance to that roof is its share of
the copy ceiling.

against two roofs measured in the same run: the memory roof, copy ceiling (GB/s) x intensity, and the flat
compute roof, the run's bf16 matmul peak (lab.measure.timing.measure_matmul_peak). A call under the slanted
roof is limited by memory bandwidth, one under the flat roof by the tensor cores; the distance to the
nearer roof is what is left. A run made before the matmul peak was measured draws the memory roof alone and
says so. A call whose facts lack a duration or DRAM bytes is left out and counted.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from experiments.spec import Experiment  # noqa: E402
from lab.evidence.records import RunRecord  # noqa: E402
from lab.publish.collect import profile_names  # noqa: E402
from lab.publish.plot_style import (  # noqa: E402
    PALETTE, STYLE, SUBJECT_COLOUR, figure, header, number_format, plain, svg,
)

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def roofline_filename(slug: str, gpu_key: str) -> str:
    """Four '--'-separated parts, like the breakdown's: never one of the three-part plot names."""
    return f"{slug}--roofline--{gpu_key}--calls.svg"


def roofline_points(experiment: Experiment, run: RunRecord) -> tuple[list[dict], int]:
    """(points, left out): each profiled call with its intensity, achieved TFLOP/s and the roof above it."""
    points, left_out = [], 0
    if run.profiling is None:
        return points, left_out
    peak = run.matmul_peak.tflops if run.matmul_peak is not None else None
    for point in run.points:
        for name in profile_names(experiment, [point]):
            facts = point.results[name].profiling
            if not facts or "totals" not in facts:
                continue
            totals = facts["totals"]
            dram, duration = totals.get("dram_bytes"), totals.get("duration_ns")
            flops = point.flops if experiment.flops is not None else totals.get("fp_flops")
            if not (flops and dram and duration):
                left_out += 1
                continue
            intensity = flops / dram
            achieved = flops / (duration * 1e-9) / 1e12
            memory_roof = run.copy_ceiling.gbps * intensity / 1e3
            roof = min(memory_roof, peak) if peak else memory_roof
            points.append({"profile": name, "case": point.case, "dtype": point.dtype, "intensity": intensity,
                           "tflops": achieved, "roof": roof, "of_roof": 100 * achieved / roof,
                           "bound": "memory" if peak is None or memory_roof < peak else "compute"})
    return points, left_out


def _figure(value: float) -> str:
    """One decimal from 10 up, three significant figures below (a memory-bound op's 0.0312 FLOP/byte)."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def roofline_view(experiment: Experiment, run: RunRecord) -> dict | None:
    points, left_out = roofline_points(experiment, run)
    if not points:
        return None
    peak = run.matmul_peak
    return {
        "rows": [{**p, "intensity": _figure(p["intensity"]), "tflops": _figure(p["tflops"]),
                  "roof": _figure(p["roof"]), "of_roof": f"{p['of_roof']:.0f}%"} for p in points],
        "ceiling": f"{run.copy_ceiling.gbps:,.0f} GB/s",
        "peak": f"{peak.tflops:,.0f} TFLOP/s, a {peak.dtype} {peak.m}×{peak.n}×{peak.k} matmul" if peak else None,
        "left_out": left_out,
        "measured_flops": experiment.flops is None,
    }


def render_roofline_plot(experiment: Experiment, run: RunRecord, gpu_label: str) -> str:
    points, _ = roofline_points(experiment, run)
    peak = run.matmul_peak.tflops if run.matmul_peak is not None else None
    ceiling = run.copy_ceiling.gbps
    names = list(dict.fromkeys(p["profile"] for p in points))
    cases = list(dict.fromkeys(p["case"] for p in points))
    colours = {n: SUBJECT_COLOUR if n == experiment.claim.subject else PALETTE[i % len(PALETTE)]
               for i, n in enumerate(names)}
    xs = [p["intensity"] for p in points]
    lo, hi = min(xs) / 4, max(xs) * 4
    if peak:
        knee = peak * 1e3 / ceiling
        lo, hi = min(lo, knee / 8), max(hi, knee * 8)
    handles = [plt.Line2D([0], [0], color=colours[n], marker="o", linestyle="", markersize=8) for n in names]
    handles += [plt.Line2D([0], [0], color="#495057", marker=MARKERS[i % len(MARKERS)], linestyle="", markersize=8)
                for i in range(len(cases))]
    labels = [plain(n) for n in names] + [plain(c) for c in cases]
    with plt.rc_context(STYLE):
        fig, axes = figure(5.0)
        ax = axes[0][0]
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        memory = [ceiling * x / 1e3 for x in grid]
        roof = [min(m, peak) for m in memory] if peak else memory
        ax.plot(grid, roof, color="#212529", linewidth=1.8)
        ax.annotate(plain(f"copy {ceiling:,.0f} GB/s"), (grid[20], memory[20]), xytext=(4, 6),
                    textcoords="offset points")
        if peak:
            ax.annotate(plain(f"matmul {peak:,.0f} TFLOP/s"), (grid[-1], peak), ha="right",
                        xytext=(0, 6), textcoords="offset points")
        for p in points:
            ax.scatter(p["intensity"], p["tflops"], color=colours[p["profile"]], s=64, zorder=3,
                       marker=MARKERS[cases.index(p["case"]) % len(MARKERS)], edgecolor="white", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # 0.05, 10, 1,000 in full; minor ticks unlabelled
            axis.set_major_formatter(number_format())
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("FLOP per DRAM byte")
        ax.set_ylabel("achieved TFLOP/s")
        header(fig, f"Roofline · {gpu_label}", handles, labels, 5.0)
        try:
            return svg(fig)
        finally:
            plt.close(fig)
