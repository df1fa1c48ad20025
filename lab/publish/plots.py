"""Plots of one run at one dtype, as deterministic SVG text.

* A sweep (experiment.x_axis set): model throughput (GB/s) against the swept dimension, one line per
  profile at its median, a band from its p80 to its p20 time, and the copy ceiling measured in the same run
  as a dashed line.
* Single cases: median latency bars per profile (grouped by case), error bars from p20 to p80; a profile
  that did not run correctly shows its status in place of a bar.

Determinism: a fixed hash salt for SVG ids, no date in the metadata, text kept as text (no glyph paths
that depend on the installed fonts), a fixed size and fixed colours per profile. Unchanged records give
byte-identical files.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from experiments.spec import Experiment  # noqa: E402
from lab.evidence.records import CPU_EVIDENCE, RunRecord  # noqa: E402

STYLE = {
    "svg.hashsalt": "kernel-lab",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
}
FIGSIZE = (8.0, 5.0)
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
CEILING_COLOUR = "#444444"
# Axis numbers with thousands separators ("3,000"), small ones as they are ("12.5").
NUMBER_FORMAT = FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}")


def plot_filename(slug: str, gpu_key: str, dtype: str) -> str:
    return f"{slug}--{gpu_key}--{dtype}.svg"


def _profile_order(experiment: Experiment, run: RunRecord) -> list[str]:
    declared = [p.name for p in experiment.profiles]
    recorded = sorted({name for point in run.points for name in point.results} - set(declared))
    return declared + recorded


def render_plot(experiment: Experiment, run: RunRecord, dtype: str) -> str:
    """The SVG of `run`'s points at `dtype`: a throughput sweep or latency bars (see the module docstring)."""
    points = [p for p in run.points if p.dtype == dtype]
    if not points:
        raise ValueError(f"run {run.run_id} has no points at dtype {dtype!r}")
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=FIGSIZE)
        try:
            if experiment.x_axis and all(experiment.x_axis in p.shape for p in points):
                _sweep(ax, experiment, run, points)
            else:
                _bars(ax, experiment, run, points)
            ax.set_title(f"{experiment.title} · {run.gpu_name} · {dtype}", loc="left")
            if not run.is_performance_evidence:
                fig.text(0.5, 0.5, CPU_EVIDENCE, ha="center", va="center", fontsize=14, color="#b71c1c",
                         alpha=0.6, rotation=12)
            fig.tight_layout()
            out = io.StringIO()
            fig.savefig(out, format="svg", metadata={"Date": None})
        finally:
            plt.close(fig)
    return out.getvalue()


def _sweep(ax, experiment: Experiment, run: RunRecord, points) -> None:
    axis = experiment.x_axis
    points = sorted(points, key=lambda p: p.shape[axis])
    order = _profile_order(experiment, run)
    for index, name in enumerate(order):
        xs, mid, low, high = [], [], [], []
        for point in points:
            result = point.results.get(name)
            if result is None or result.status != "ok":
                continue
            xs.append(point.shape[axis])
            mid.append(point.bytes_moved / (result.p50_ms * 1e-3) / 1e9)
            low.append(point.bytes_moved / (result.p80_ms * 1e-3) / 1e9)
            high.append(point.bytes_moved / (result.p20_ms * 1e-3) / 1e9)
        if not xs:
            continue
        colour = PALETTE[index % len(PALETTE)]
        ax.plot(xs, mid, color=colour, linewidth=1.4, marker="." if len(xs) < 40 else None, label=name)
        ax.fill_between(xs, low, high, color=colour, alpha=0.18, linewidth=0)
    ceiling = run.copy_ceiling.gbps
    ax.axhline(ceiling, color=CEILING_COLOUR, linestyle="--", linewidth=1.0,
               label=f"copy ceiling ({ceiling:,.0f} GB/s)")
    values = [p.shape[axis] for p in points]
    if min(values) > 0 and max(values) / min(values) >= 32:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(NUMBER_FORMAT)
    ax.yaxis.set_major_formatter(NUMBER_FORMAT)
    ax.set_xlabel(axis)
    ax.set_ylabel("model throughput (GB/s); band: p20–p80")
    ax.set_ylim(bottom=0, top=max(ceiling * 1.12, ax.get_ylim()[1]))
    _legend_below(ax)


def _bars(ax, experiment: Experiment, run: RunRecord, points) -> None:
    order = _profile_order(experiment, run)
    names = [n for n in order if any(n in p.results for p in points)]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        for j, point in enumerate(points):
            x = j + (i - (len(names) - 1) / 2) * width
            result = point.results.get(name)
            if result is None:
                continue
            if result.status != "ok":
                ax.text(x, 0, result.status, rotation=90, ha="center", va="bottom", fontsize=7, color="#b71c1c")
                continue
            p50, p20, p80 = (1e3 * result.p50_ms, 1e3 * result.p20_ms, 1e3 * result.p80_ms)
            ax.bar(x, p50, width * 0.9, color=PALETTE[order.index(name) % len(PALETTE)], label=name if j == 0 else None)
            ax.errorbar(x, p50, yerr=[[p50 - p20], [p80 - p50]], color="#222222", capsize=3, linewidth=1)
    ax.set_xticks(range(len(points)), [p.case for p in points])
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_ylabel("latency, median (µs); error bars: p20–p80")
    ax.yaxis.set_major_formatter(NUMBER_FORMAT)
    ax.set_ylim(bottom=0)
    ax.grid(axis="x", visible=False)
    _legend_below(ax)


def _legend_below(ax) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=min(4, len(handles)), fontsize=8,
                  frameon=False)
