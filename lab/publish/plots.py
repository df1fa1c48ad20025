"""Plots as deterministic SVG text: one run at one dtype (render_plot), and every GPU's speedup side by side
(render_speedup_plot).

* A sweep (experiment.x_axis set): model throughput (GB/s) against the swept dimension, one line per
  profile at its median, a band from its p80 to its p20 time, and the ceiling matching the experiment's
  traffic measured in the same run (lab.publish.ceilings; the copy ceiling in runs that predate it) as a
  dashed line.
* Single cases: median latency bars per profile (grouped by case), error bars from p20 to p80; a profile
  that did not run correctly shows its status in place of a bar.
* Speedup: the subject's speedup over the best baseline at each point with its 95% interval, one colour per
  GPU, over the grey band of the claim's margin (a tie) — against the swept dimension for a sweep, per case
  otherwise. Points against the claim are marked.

The claim's subject is drawn last, on top, in SUBJECT_COLOUR on every page; the other profiles take the
palette in declaration order. Text is set large enough to read on a phone once the SVG scales to the
column. Determinism: a fixed hash salt for SVG ids, no date in the metadata, text kept as text (no glyph
paths that depend on the installed fonts), a fixed size. Unchanged records give byte-identical files.
"""

from __future__ import annotations

import io
from typing import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from experiments.spec import COPY, Experiment  # noqa: E402
from lab.evidence.records import CPU_EVIDENCE, RunRecord  # noqa: E402
from lab.evidence.verdict import AGAINST, CLOCK_NAMES, GPU_TIME, PointJudgement, tie_band  # noqa: E402
from lab.publish.ceilings import CEILING_NAMES, moved_bytes, run_ceiling  # noqa: E402

STYLE = {
    "svg.hashsalt": "kernel-lab",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 12,
    "axes.titlesize": 12.5,
    "axes.labelsize": 12,
    "xtick.labelsize": 11.5,
    "ytick.labelsize": 11.5,
    "legend.fontsize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
}
FIGSIZE = (5.6, 4.3)  # inches; with 11-12 pt text, at least 9 CSS px once scaled to a phone's column
SUBJECT_COLOUR = "#e8590c"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2", "#d62728")
GPU_PALETTE = ("#1864ab", "#862e9c", "#2b8a3e", "#c92a2a", "#495057")
CEILING_COLOUR = "#444444"
MARGIN_COLOUR = "#adb5bd"
# Axis numbers with thousands separators ("3,000"), small ones as they are ("12.5").
NUMBER_FORMAT = FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}")


def plot_filename(slug: str, gpu_key: str, dtype: str) -> str:
    return f"{slug}--{gpu_key}--{dtype}.svg"


def speedup_plot_filename(slug: str, dtype: str, clock: str = GPU_TIME) -> str:
    return f"{slug}--speedup--{dtype}.svg" if clock == GPU_TIME else f"{slug}--speedup-{clock}--{dtype}.svg"


def _profile_order(experiment: Experiment, run: RunRecord) -> list[str]:
    """Declared profiles, then any others recorded, with the claim's subject moved to the end (drawn last)."""
    declared = [p.name for p in experiment.profiles]
    recorded = sorted({name for point in run.points for name in point.results} - set(declared))
    order = [n for n in declared + recorded if n != experiment.claim.subject]
    return order + [experiment.claim.subject]


def _colours(experiment: Experiment, order: Sequence[str]) -> dict[str, str]:
    others = [n for n in order if n != experiment.claim.subject]
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(others)}
    colours[experiment.claim.subject] = SUBJECT_COLOUR
    return colours


def _svg(fig) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def _is_sweep(experiment: Experiment, points) -> bool:
    return bool(experiment.x_axis) and all(experiment.x_axis in p.shape for p in points)


def plain(text: str) -> str:
    """A record's text as a plot shows it: as it is, never as mathtext (matplotlib reads $...$ as TeX)."""
    return text.replace("$", r"\$")


def render_plot(experiment: Experiment, run: RunRecord, dtype: str, gpu_label: str | None = None) -> str:
    """The SVG of `run`'s points at `dtype`: a throughput sweep or latency bars (see the module docstring)."""
    points = [p for p in run.points if p.dtype == dtype]
    if not points:
        raise ValueError(f"run {run.run_id} has no points at dtype {dtype!r}")
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
        try:
            if _is_sweep(experiment, points):
                _sweep(ax, experiment, run, points)
            else:
                _bars(ax, experiment, run, points)
            ax.set_title(f"{plain(gpu_label or run.gpu_name)} · {dtype} · GPU time", loc="left")
            if not run.is_performance_evidence:
                fig.text(0.5, 0.5, CPU_EVIDENCE, ha="center", va="center", fontsize=14, color="#b71c1c",
                         alpha=0.6, rotation=12)
            return _svg(fig)
        finally:
            plt.close(fig)


def _log_axis_if_wide(ax, values) -> None:
    if min(values) > 0 and max(values) / min(values) >= 32:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(NUMBER_FORMAT)


def _timed(result) -> bool:
    return result is not None and result.status == "ok" and result.p50_ms is not None


def _sweep(ax, experiment: Experiment, run: RunRecord, points) -> None:
    axis = experiment.x_axis
    points = sorted(points, key=lambda p: p.shape[axis])
    order = _profile_order(experiment, run)
    colours = _colours(experiment, order)
    for name in order:
        xs, mid, low, high = [], [], [], []
        for point in points:
            result = point.results.get(name)
            if not _timed(result):
                continue
            xs.append(point.shape[axis])
            moved = moved_bytes(experiment, point, name, result)
            mid.append(moved / (result.p50_ms * 1e-3) / 1e9)
            low.append(moved / (result.p80_ms * 1e-3) / 1e9)
            high.append(moved / (result.p20_ms * 1e-3) / 1e9)
        if not xs:
            continue
        subject = name == experiment.claim.subject
        ax.plot(xs, mid, color=colours[name], linewidth=2.4 if subject else 1.3, zorder=5 if subject else 2,
                marker="." if len(xs) < 40 else None, label=f"{name} (subject)" if subject else name)
        ax.fill_between(xs, low, high, color=colours[name], alpha=0.18, linewidth=0, zorder=4 if subject else 1)
    declared = run_ceiling(run, experiment.traffic)  # the ceiling matching the traffic, else the copy ceiling
    name = CEILING_NAMES[experiment.traffic] if declared is not None else CEILING_NAMES[COPY]
    ceiling = (declared or run.copy_ceiling).gbps
    ax.axhline(ceiling, color=CEILING_COLOUR, linestyle="--", linewidth=1.0,
               label=f"{name} ceiling ({ceiling:,.0f} GB/s)")
    _log_axis_if_wide(ax, [p.shape[axis] for p in points])
    ax.yaxis.set_major_formatter(NUMBER_FORMAT)
    ax.set_xlabel(axis)
    ax.set_ylabel("GB/s (median; band p20–p80)")
    ax.set_ylim(bottom=0, top=max(ceiling * 1.12, ax.get_ylim()[1]))
    _legend_below(ax)


def case_tick(name: str) -> str:
    """A case name broken at its hyphens, so that neighbouring tick labels never run into each other."""
    return name.replace("-", "\n") if len(name) > 9 else name


def _bars(ax, experiment: Experiment, run: RunRecord, points) -> None:
    order = [n for n in _profile_order(experiment, run) if any(n in p.results for p in points)]
    colours = _colours(experiment, order)
    width = 0.8 / max(1, len(order))
    for i, name in enumerate(order):
        subject = name == experiment.claim.subject
        for j, point in enumerate(points):
            x = j + (i - (len(order) - 1) / 2) * width
            result = point.results.get(name)
            if result is None:
                continue
            if not _timed(result):
                ax.text(x, 0, result.status, rotation=90, ha="center", va="bottom", fontsize=11, color="#b71c1c")
                continue
            p50, p20, p80 = (1e3 * result.p50_ms, 1e3 * result.p20_ms, 1e3 * result.p80_ms)
            label = (f"{name} (subject)" if subject else name) if j == 0 else None
            ax.bar(x, p50, width * 0.9, color=colours[name], label=label, zorder=3 if subject else 2,
                   edgecolor="#222222" if subject else "none", linewidth=0.8)
            ax.errorbar(x, p50, yerr=[[p50 - p20], [p80 - p50]], color="#222222", capsize=3, linewidth=1, zorder=4)
    ax.set_xticks(range(len(points)), [case_tick(p.case) for p in points])
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_ylabel("µs (median; bars p20–p80)")
    ax.yaxis.set_major_formatter(NUMBER_FORMAT)
    ax.set_ylim(bottom=0)
    ax.grid(axis="x", visible=False)
    _legend_below(ax)


def _legend_below(ax) -> None:
    """The legend under the axes, outside them; the constrained layout makes room for it and the ticks."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.figure.legend(handles, labels, loc="outside lower center", ncols=min(2, len(handles)), frameon=False)


def render_speedup_plot(experiment: Experiment, dtype: str,
                        series: Sequence[tuple[str, str, Sequence[PointJudgement], RunRecord]],
                        clock: str = GPU_TIME) -> str:
    """Each GPU's speedup at `dtype` on `clock`: series are (GPU label, colour, that run's judgements, the run)."""
    m = experiment.claim.margin_on(clock).fraction
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
        try:
            ax.axhspan(*tie_band(m), color=MARGIN_COLOUR, alpha=0.45, linewidth=0, zorder=0,
                       label=f"tie: margin ±{m:.1%} (Level)")
            ax.axhline(1, color="#495057", linewidth=0.8, zorder=1)
            if experiment.claim.threshold > 1:
                ax.axhline(experiment.claim.threshold, color="#495057", linestyle="--", linewidth=1,
                           label=f"target {experiment.claim.threshold:g}×")
            points = [p for _, _, _, run in series for p in run.points if p.dtype == dtype]
            if points and _is_sweep(experiment, points):
                _speedup_sweep(ax, experiment, dtype, series)
            else:
                _speedup_cases(ax, experiment, dtype, series)
            ax.set_ylabel("speedup over the best baseline\n(95% CI)")
            ax.set_title(f"{experiment.claim.subject} · {dtype} · {CLOCK_NAMES[clock]}", loc="left")
            _legend_below(ax)
            return _svg(fig)
        finally:
            plt.close(fig)


AGAINST_MARKER = {"marker": "v", "s": 60, "edgecolor": "#000000", "linewidth": 0.8, "zorder": 5}


def _mark_against(ax, xs, ys, colour, labelled: list) -> None:
    """Points against the claim, drawn as a downward triangle on top of their GPU's colour."""
    if xs:
        ax.scatter(xs, ys, color=colour, label=None if labelled else "against the claim (▼)", **AGAINST_MARKER)
        labelled.append(True)


def _speedup_sweep(ax, experiment: Experiment, dtype: str, series) -> None:
    axis = experiment.x_axis
    values, labelled = [], []
    for label, colour, judgements, run in series:
        label = plain(label)
        at = {(p.case, p.dtype): p.shape[axis] for p in run.points}
        timed = sorted((at[(j.case, j.dtype)], j) for j in judgements
                       if j.dtype == dtype and j.speedup is not None and (j.case, j.dtype) in at)
        if not timed:
            continue
        xs = [x for x, _ in timed]
        values += xs
        ax.plot(xs, [j.speedup.ratio for _, j in timed], color=colour, linewidth=1.6, label=label, zorder=3)
        ax.fill_between(xs, [j.speedup.low for _, j in timed], [j.speedup.high for _, j in timed], color=colour,
                        alpha=0.22, linewidth=0, zorder=2)
        against = [(x, j.speedup.ratio) for x, j in timed if j.effect == AGAINST]
        _mark_against(ax, [x for x, _ in against], [y for _, y in against], colour, labelled)
    if values:
        _log_axis_if_wide(ax, values)
    ax.set_xlabel(axis)


def _speedup_cases(ax, experiment: Experiment, dtype: str, series) -> None:
    cases = list(dict.fromkeys(j.case for _, _, judgements, _ in series for j in judgements if j.dtype == dtype))
    width = 0.6 / max(1, len(series))
    labelled: list = []
    for i, (label, colour, judgements, _) in enumerate(series):
        by_case = {j.case: j for j in judgements if j.dtype == dtype and j.speedup is not None}
        xs = [k + (i - (len(series) - 1) / 2) * width for k, case in enumerate(cases) if case in by_case]
        js = [by_case[case] for case in cases if case in by_case]
        if not js:
            continue
        ratios = [j.speedup.ratio for j in js]
        ax.errorbar(xs, ratios, yerr=[[j.speedup.ratio - j.speedup.low for j in js],
                                      [j.speedup.high - j.speedup.ratio for j in js]],
                    fmt="o", color=colour, capsize=4, linewidth=1.4, markersize=6, label=plain(label), zorder=3)
        against = [(x, j.speedup.ratio) for x, j in zip(xs, js) if j.effect == AGAINST]
        _mark_against(ax, [x for x, _ in against], [y for _, y in against], colour, labelled)
    ax.set_xticks(range(len(cases)), [case_tick(c) for c in cases])
    ax.set_xlim(-0.5, len(cases) - 0.5)
    ax.grid(axis="x", visible=False)
