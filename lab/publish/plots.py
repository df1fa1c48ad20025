"""Plots as deterministic SVG text: one run at one dtype (render_plot), and every GPU's speedup side by side
(render_speedup_plot). Size, text, colours and determinism: lab.publish.plot_style.

* A sweep (experiment.x_axis set): model throughput (GB/s) against the swept dimension (log 2 with ticks
  "1k" … "256k" where it spans 32× or more), one line per profile at its median, a band from its p80 to
  its p20 time, and the ceiling matching the experiment's traffic measured in the same run
  (lab.publish.ceilings; the copy ceiling in runs that predate it) as a dashed line; a log axis where the
  profiles lie ten times apart.
* Single cases: the cases as rows, each profile's median time with its p20–p80 range (lab.publish.plot_cases).
* Speedup: the subject's speedup over the best baseline at each point with its 95% interval, one colour per
  GPU, over the grey band of the claim's margin (a tie) — against the swept dimension for a sweep, per case
  (rows) otherwise. Points against the claim are marked.

The claim's subject is drawn last, on top, in SUBJECT_COLOUR on every page; the other profiles take the
palette in declaration order. Every series is in the legend, which sits above the axes; a profile that is
not timed somewhere ("unsupported", "unavailable", "error") says where in its legend entry, never over the
data. A result that failed its accuracy check is no series (the page's tables say so).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from experiments.spec import COPY, Experiment  # noqa: E402
from lab.evidence.records import CPU_EVIDENCE, RunRecord  # noqa: E402
from lab.evidence.verdict import AGAINST, CLOCK_NAMES, GPU_TIME, PointJudgement, tie_band  # noqa: E402
from lab.publish.ceilings import CEILING_NAMES, moved_bytes, run_ceiling  # noqa: E402
from lab.publish.plot_cases import AGAINST_MARKER, NOT_SHOWN, speedup_rows, time_rows, timed  # noqa: E402
from lab.publish.plot_style import (  # noqa: E402,F401 - GPU_PALETTE and PALETTE are read from here too
    CEILING_COLOUR,
    PLOT_IN,
    GPU_PALETTE,
    MARGIN_COLOUR,
    PALETTE,
    STYLE,
    SUBJECT_COLOUR,
    figure,
    header,
    number,
    plain,
    size_axis,
    status_note,
    svg,
    red_note,
    value_axis,
)


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


def _is_sweep(experiment: Experiment, points) -> bool:
    return bool(experiment.x_axis) and all(experiment.x_axis in p.shape for p in points)


def _rendered(draw) -> str:
    """The SVG of the figure `draw()` returns, drawn under the house style and closed after."""
    with plt.rc_context(STYLE):
        fig = draw()
        try:
            return svg(fig)
        finally:
            plt.close(fig)


def render_plot(experiment: Experiment, run: RunRecord, dtype: str, gpu_label: str | None = None) -> str:
    """The SVG of `run`'s points at `dtype`: a throughput sweep or times per case (see the module docstring)."""
    points = [p for p in run.points if p.dtype == dtype]
    if not points:
        raise ValueError(f"run {run.run_id} has no points at dtype {dtype!r}")
    heading = f"{gpu_label or run.gpu_name} · {dtype} · GPU time"
    note = None if run.is_performance_evidence else CPU_EVIDENCE
    order = [n for n in _profile_order(experiment, run) if any(n in p.results for p in points)]
    colours = _colours(experiment, order)
    if _is_sweep(experiment, points):
        declared = run_ceiling(run, experiment.traffic)  # the ceiling matching the traffic, else the copy one
        ceiling = (CEILING_NAMES[experiment.traffic if declared is not None else COPY], (declared or run.copy_ceiling).gbps)
        return _rendered(lambda: _sweep(experiment, points, order, colours, heading, note, ceiling))
    return _rendered(lambda: time_rows(points, order, colours, experiment.claim.subject, heading, note))


def _where_missing(axis: str, timed_at: Sequence[float], missing_at: Sequence[float]) -> str | None:
    """Where a sweep's series stops: "for N > 65,536" (or below its first point); None if it has gaps."""
    if not timed_at or not missing_at:
        return None
    if min(missing_at) > max(timed_at):
        return f"for {axis} > {number(max(timed_at))}"
    if max(missing_at) < min(timed_at):
        return f"for {axis} < {number(min(timed_at))}"
    return None


def _sweep(experiment: Experiment, points, order, colours, heading: str, note: str | None,
           named_ceiling: tuple[str, float]):
    ceiling_name, ceiling = named_ceiling
    axis = experiment.x_axis
    points = sorted(points, key=lambda p: p.shape[axis])
    fig, axes = figure(PLOT_IN)
    ax = axes[0][0]
    handles, labels, values = [], [], [ceiling]
    for name in order:
        xs, mid, low, high, missing, statuses = [], [], [], [], [], []
        for point in points:
            result = point.results.get(name)
            if result is None or result.status == NOT_SHOWN:
                continue
            if not timed(result):
                missing.append(point.shape[axis])
                statuses.append(result.status)
                continue
            xs.append(point.shape[axis])
            moved = moved_bytes(experiment, point, name, result)
            mid.append(moved / (result.p50_ms * 1e-3) / 1e9)
            low.append(moved / (result.p80_ms * 1e-3) / 1e9)
            high.append(moved / (result.p20_ms * 1e-3) / 1e9)
        if not xs and not missing:
            continue
        subject = name == experiment.claim.subject
        words = ["subject"] if subject else []
        status = status_note(statuses, len(xs) + len(missing), _where_missing(axis, xs, missing))
        if status:
            words.append(status)
        line, = ax.plot(xs, mid, color=colours[name], linewidth=2.6 if subject else 1.4, zorder=5 if subject else 2,
                        marker="." if 0 < len(xs) < 40 else None)
        if xs:
            ax.fill_between(xs, low, high, color=colours[name], alpha=0.18, linewidth=0, zorder=4 if subject else 1)
        values += mid
        handles.append(line)
        labels.append(plain(name) + (f" ({'; '.join(words)})" if words else ""))
    handles.append(ax.axhline(ceiling, color=CEILING_COLOUR, linestyle="--", linewidth=1.1))
    labels.append(f"{ceiling_name} ceiling ({ceiling:,.0f} GB/s)")
    size_axis(ax, "x", [p.shape[axis] for p in points])
    if not value_axis(ax, "y", values):
        ax.set_ylim(bottom=0, top=max(ceiling * 1.1, ax.get_ylim()[1]))
    ax.set_xlabel(axis)
    ax.set_ylabel("GB/s (median; band p20–p80)")
    red_note(ax, note)
    header(fig, heading, handles, labels, PLOT_IN + (0.3 if note else 0))
    return fig


def render_speedup_plot(experiment: Experiment, dtype: str,
                        series: Sequence[tuple[str, str, Sequence[PointJudgement], RunRecord]],
                        clock: str = GPU_TIME) -> str:
    """Each GPU's speedup at `dtype` on `clock`: series are (GPU label, colour, that run's judgements, the run)."""
    claim = experiment.claim
    heading = f"{claim.subject} · {dtype} · {CLOCK_NAMES[clock]}"
    points = [p for _, _, _, run in series for p in run.points if p.dtype == dtype]
    if points and _is_sweep(experiment, points):
        return _rendered(lambda: _speedup_sweep(experiment, dtype, series, heading, clock))
    return _rendered(lambda: speedup_rows(dtype, series, claim.margin_on(clock).fraction, claim.threshold, heading))


def _speedup_sweep(experiment: Experiment, dtype: str, series, heading: str, clock: str):
    axis, m, threshold = experiment.x_axis, experiment.claim.margin_on(clock).fraction, experiment.claim.threshold
    fig, axes = figure(PLOT_IN)
    ax = axes[0][0]
    handles = [ax.axhspan(*tie_band(m), color=MARGIN_COLOUR, alpha=0.45, linewidth=0, zorder=0)]
    labels = [f"tie: margin ±{m:.1%} (Level)"]
    ax.axhline(1, color="#495057", linewidth=0.9, zorder=1)
    if threshold > 1:
        handles.append(ax.axhline(threshold, color="#495057", linestyle="--", linewidth=1.1))
        labels.append(f"target {threshold:g}×")
    values, against = [], None
    for label, colour, judgements, run in series:
        at = {(p.case, p.dtype): p.shape[axis] for p in run.points}
        timed_at = sorted((at[(j.case, j.dtype)], j) for j in judgements
                          if j.dtype == dtype and j.speedup is not None and (j.case, j.dtype) in at)
        if not timed_at:
            continue
        xs = [x for x, _ in timed_at]
        values += xs
        handles.append(ax.plot(xs, [j.speedup.ratio for _, j in timed_at], color=colour, linewidth=1.8,
                               zorder=3)[0])
        labels.append(plain(label))
        ax.fill_between(xs, [j.speedup.low for _, j in timed_at], [j.speedup.high for _, j in timed_at],
                        color=colour, alpha=0.22, linewidth=0, zorder=2)
        worse = [(x, j.speedup.ratio) for x, j in timed_at if j.effect == AGAINST]
        if worse:
            against = ax.scatter([x for x, _ in worse], [y for _, y in worse], color=colour, **AGAINST_MARKER)
    if against is not None:
        handles.append(against)
        labels.append("against the claim (▼)")
    if values:
        size_axis(ax, "x", values)
    ax.set_xlabel(axis)
    ax.set_ylabel("speedup over the best baseline\n(95% interval)")
    header(fig, heading, handles, labels, PLOT_IN)
    return fig
