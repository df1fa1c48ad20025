"""Where a call's time goes, op by op: the view and the chart of the records' `breakdown` blocks
(lab.measure.breakdown).

Per GPU run and dtype: one chart with a panel per case and, in each, one stacked bar per profile: its ops'
kernel time in launch order, then the GPU's time between kernels (hatched; the host kept out of the way by
the device hold), which together make the call's GPU span, then, where the eager-call clock has a figure,
the time a program calling eagerly waits on the host on top of that (dotted: the eager-call median minus
the span). The profile's median on the GPU-time clock is marked. The tables under it give each op's time and
share of the span, and how close the span lies to the GPU-time clock's median (`coverage`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.spec import Experiment  # noqa: E402
from lab.evidence.records import Point, RunRecord  # noqa: E402
from lab.evidence.verdict import SLOWER, PointJudgement  # noqa: E402
from lab.publish import formatting as fmt  # noqa: E402
from lab.publish.plots import FIGSIZE, STYLE, _svg, plain  # noqa: E402

# Twenty paired hues and twenty more: a layer's ops, fused ones and torch.compile's kernel classes together,
# stay apart (more than forty ops would reuse colours, in order).
OP_PALETTE = tuple(matplotlib.colormaps["tab20"].colors) + tuple(matplotlib.colormaps["tab20b"].colors)
GAP_COLOUR = "#dee2e6"
COVERAGE_BOUND = 0.05  # the breakdown's span within 5% of the GPU-time clock's median


def breakdown_filename(slug: str, gpu_key: str, dtype: str) -> str:
    """Four '--'-separated parts: never one of the three-part names of the other plots (identifiers hold no
    '--')."""
    return f"{slug}--breakdown--{gpu_key}--{dtype}.svg"


def _usable(result) -> bool:
    return result.status == "ok" and isinstance(result.breakdown, Mapping) and "ops" in result.breakdown


def has_breakdown(run: RunRecord, dtype: str) -> bool:
    return any(_usable(r) for p in run.points if p.dtype == dtype for r in p.results.values())


def _op_order(points: Sequence[Point]) -> list[str]:
    order: dict[str, None] = {}
    for point in points:
        for result in point.results.values():
            if _usable(result):
                order.update(dict.fromkeys(op["op"] for op in result.breakdown["ops"]))
    return list(order)


def _host_wait_ms(result) -> float | None:
    """The eager-call median minus the GPU span: what the host adds per call (None without an eager figure)."""
    eager = result.eager
    if eager is None or eager.p50_ms is None:
        return None
    return max(0.0, eager.p50_ms - result.breakdown["span_ms"])


def breakdown_view(experiment: Experiment, run: RunRecord, dtype: str) -> list[dict]:
    """Per case: each profile's ops (ms, share of its span), kernel time, gap, span against the GPU-time
    median, and the host's wait on the eager-call clock."""
    cases = []
    for point in (p for p in run.points if p.dtype == dtype):
        profiles = []
        for name, result in point.results.items():
            if not _usable(result):
                continue
            b = result.breakdown
            span = b["span_ms"]
            coverage = span / result.p50_ms if result.p50_ms else None
            wait = _host_wait_ms(result)
            profiles.append({
                "name": name,
                "ops": [{"op": op["op"], "ms": fmt.latency_us(op["ms"]), "kernels": op["kernels"],
                         "share": f"{100 * op['ms'] / span:.0f}%" if span > 0 else fmt.DASH}
                        for op in b["ops"]],
                "top": max(b["ops"], key=lambda op: op["ms"])["op"],
                "kernel": fmt.latency_us(b["kernel_ms"]),
                "gap": fmt.latency_us(b["gap_ms"]),
                "span": fmt.latency_us(span),
                "layer": fmt.latency_us(result.p50_ms),
                "coverage": f"{100 * coverage:.1f}%" if coverage is not None else fmt.DASH,
                "within": coverage is not None and abs(coverage - 1) <= COVERAGE_BOUND,
                "eager": fmt.latency_us(result.eager.p50_ms) if wait is not None else fmt.DASH,
                "wait": fmt.latency_us(wait) if wait is not None else fmt.DASH,
            })
        if profiles:
            cases.append({"case": point.case, "profiles": profiles})
    return cases


def slower_ops(experiment: Experiment, run: RunRecord, dtype: str,
               judgements: Mapping[tuple[str, str], PointJudgement]) -> list[dict]:
    """At each point where the subject is Slower than its best baseline and both have a breakdown: how much
    longer the subject's call takes (GPU-time medians) and, of the ops both name alike, the one whose kernels
    take the most longer (None where they share no op name, or none takes longer)."""
    subject = experiment.claim.subject
    out = []
    for point in (p for p in run.points if p.dtype == dtype):
        j = judgements.get((point.case, dtype))
        if j is None or j.word != SLOWER or not j.baseline:
            continue
        ours, theirs = point.results.get(subject), point.results.get(j.baseline)
        if ours is None or theirs is None or not (_usable(ours) and _usable(theirs)):
            continue
        their_ops = {op["op"]: op["ms"] for op in theirs.breakdown["ops"]}
        excess = {op["op"]: op["ms"] - their_ops[op["op"]] for op in ours.breakdown["ops"] if op["op"] in their_ops}
        worst = max(excess, key=excess.get, default=None)
        if worst is not None and excess[worst] <= 0:
            worst = None
        out.append({"case": point.case, "subject": subject, "baseline": j.baseline,
                    "call": fmt.latency_us(ours.p50_ms - theirs.p50_ms), "op": worst,
                    "op_excess": fmt.latency_us(excess[worst]) if worst is not None else fmt.DASH})
    return out


def render_breakdown_plot(experiment: Experiment, run: RunRecord, dtype: str, gpu_label: str) -> str:
    points = [p for p in run.points if p.dtype == dtype and any(_usable(r) for r in p.results.values())]
    ops = _op_order(points)
    colours = {op: OP_PALETTE[i % len(OP_PALETTE)] for i, op in enumerate(ops)}
    names = [p.name for p in experiment.profiles]
    with plt.rc_context(STYLE):
        # One column at the site's plot width, so the text keeps its size on a phone (as every other plot).
        columns, rows = 1, len(points)
        legend_rows = len(ops) + 3
        legend_in = 0.24 * legend_rows + 0.3  # inches under the panels for the legend
        height = 0.34 * len(names) * rows + 1.0 * rows + 0.6 + legend_in
        fig, axes = plt.subplots(rows, columns, figsize=(FIGSIZE[0], height), squeeze=False)
        for ax, point in zip(axes.flat, points):
            shown = [n for n in names if n in point.results and _usable(point.results[n])]
            for row, name in enumerate(shown):
                result = point.results[name]
                left = 0.0
                for op in result.breakdown["ops"]:
                    ms = op["ms"] * 1e3
                    ax.barh(row, ms, left=left, color=colours[op["op"]], height=0.7)
                    left += ms
                gap = result.breakdown["gap_ms"] * 1e3
                ax.barh(row, gap, left=left, color=GAP_COLOUR, hatch="//", edgecolor="#868e96", height=0.7)
                wait = _host_wait_ms(result)
                if wait:
                    ax.barh(row, wait * 1e3, left=left + gap, color="white", hatch="..", edgecolor="#adb5bd",
                            height=0.7)
                ax.plot([result.p50_ms * 1e3] * 2, [row - 0.42, row + 0.42], color="#212529", linewidth=1.6)
            ax.set_yticks(range(len(shown)), [plain(n) for n in shown])
            ax.invert_yaxis()
            ax.set_title(plain(point.case))
            ax.set_xlabel("µs per call")
            ax.grid(axis="y", visible=False)
        for ax in list(axes.flat)[len(points):]:
            ax.set_visible(False)
        handles = [plt.Rectangle((0, 0), 1, 1, color=colours[op]) for op in ops]
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor=GAP_COLOUR, hatch="//", edgecolor="#868e96"))
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", hatch="..", edgecolor="#adb5bd"))
        handles.append(plt.Line2D([0], [0], color="#212529", linewidth=1.6))
        labels = [plain(op) for op in ops] + ["between kernels (GPU)", "host wait (eager-call clock)",
                                             "GPU-time clock median"]
        fig.legend(handles, labels, loc="lower center", ncol=1, frameon=False, bbox_to_anchor=(0.5, 0.0))
        fig.suptitle(plain(f"Time per call, op by op\n{gpu_label}, {dtype}"))
        fig.tight_layout(rect=(0, legend_in / height, 1, 1 - 0.35 / height))
        svg = _svg(fig)
        plt.close(fig)
    return svg
