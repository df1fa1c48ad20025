"""Where a call's time goes, op by op: the view and the chart of the records' `breakdown` blocks
(lab.measure.breakdown).

Per GPU run and dtype: one chart with a panel per case (each on its own µs scale, two or three panels to a
row under one legend) and, in each, a row per profile on the GPU-time clock: its ops' kernel time in launch
order, then the GPU's time between kernels (hatched; the host kept out of the way by the device hold), which
together make the call's GPU span. Where the record has the same call on the eager-call clock (the
breakdown's "eager" part), a second bar under it shows that: the host's gap before the call's first kernel,
then per op the GPU's idle time before its kernels (the host's gap as the program pays it) and its kernel
time; the eager-call median is marked on it. Older records without that part keep one bar, with the
eager-call median minus the span (dotted) as the host's wait. Many cases make thinner bars, never a figure
taller than lab.publish.plot_style.MAX_HEIGHT_IN. The tables under it give each op's
provenance (the lab's kernels or torch's, as measured from kernel names and as the launch plan declares),
time, share of the span and host gap, and how close each span lies to its clock's median (`coverage`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from experiments.spec import Experiment  # noqa: E402
from lab.evidence.records import Point, RunRecord  # noqa: E402
from lab.evidence.verdict import EAGER_CALL, SLOWER, PointJudgement, judge_point  # noqa: E402
from lab.publish import formatting as fmt  # noqa: E402
from lab.publish.plot_style import (  # noqa: E402
    MAX_HEIGHT_IN, STYLE, figure, header, header_height, number_format, plain, svg,
)

# Twenty paired hues and twenty more: a layer's ops, fused ones and torch.compile's kernel classes together,
# stay apart (more than forty ops would reuse colours, in order).
OP_PALETTE = tuple(matplotlib.colormaps["tab20"].colors) + tuple(matplotlib.colormaps["tab20b"].colors)
GAP_COLOUR = "#dee2e6"
HOST_EDGE = "#adb5bd"
COVERAGE_BOUND = 0.05  # the breakdown's span within 5% of the GPU-time clock's median
KERNEL_SHOWN = 48  # characters of a kernel's name a table cell shows
BETWEEN_CALLS = "before the call's first kernel"


def breakdown_filename(slug: str, gpu_key: str, dtype: str) -> str:
    """Four '--'-separated parts: never one of the three-part names of the other plots (identifiers hold no
    '--')."""
    return f"{slug}--breakdown--{gpu_key}--{dtype}.svg"


def _usable(result) -> bool:
    return result.status == "ok" and isinstance(result.breakdown, Mapping) and "ops" in result.breakdown


def _eager(result) -> Mapping | None:
    """The breakdown's eager-call part, where the record has one that was measured."""
    block = result.breakdown.get("eager") if _usable(result) else None
    return block if isinstance(block, Mapping) and "ops" in block else None


def has_breakdown(run: RunRecord, dtype: str) -> bool:
    return any(_usable(r) for p in run.points if p.dtype == dtype for r in p.results.values())


def _op_order(points: Sequence[Point]) -> list[str]:
    order: dict[str, None] = {}
    for point in points:
        for result in point.results.values():
            if _usable(result):
                order.update(dict.fromkeys(op["op"] for op in result.breakdown["ops"]))
                order.update(dict.fromkeys(op["op"] for op in (_eager(result) or {}).get("ops", ())))
    return list(order)


def _host_wait_ms(result) -> float | None:
    """The eager-call median minus the GPU span: what the host adds per call (None without an eager figure)."""
    eager = result.eager
    if eager is None or eager.p50_ms is None:
        return None
    return max(0.0, eager.p50_ms - result.breakdown["span_ms"])


def _eager_period_ms(block: Mapping) -> float:
    """One back-to-back call as the GPU saw it: the gap before its first kernel plus its span."""
    return block["lead_ms"] + block["span_ms"]


def provenance(result, op: Mapping) -> str:
    """Where an op's kernels come from: measured (how many of them carry a lab kernel's name; newer records)
    and declared (the launch plan's entry for an op of that name); a dash where the record says neither."""
    plan = result.plan if isinstance(result.plan, Mapping) else {}
    declared = plan.get(op["op"]) if isinstance(plan.get(op["op"]), str) else None
    lab, kernels = op.get("lab_kernels"), op["kernels"]
    if lab is None:
        return declared or fmt.DASH
    measured = "torch" if lab == 0 else "lab" if lab >= kernels else f"lab ({lab} of {kernels} kernels) + torch"
    if declared is None:
        return measured
    return declared if declared.split(":", 1)[0] == measured else f"{measured} (plan: {declared})"


def _shown_kernel(name) -> str:
    if not isinstance(name, str) or not name:
        return fmt.DASH
    return name if len(name) <= KERNEL_SHOWN else name[:KERNEL_SHOWN - 1] + "…"


def _largest_stall(block: Mapping) -> tuple[str, float]:
    """(where, ms): the op whose kernels the GPU waits longest before, or the call's first kernel."""
    op = max(block["ops"], key=lambda o: o["gap_ms"])
    return (op["op"], op["gap_ms"]) if op["gap_ms"] > block["lead_ms"] else (BETWEEN_CALLS, block["lead_ms"])


def _profile_view(name: str, result) -> dict:
    b = result.breakdown
    span = b["span_ms"]
    coverage = span / result.p50_ms if result.p50_ms else None
    wait = _host_wait_ms(result)
    eager = _eager(result)
    gaps = {op["op"]: op["gap_ms"] for op in eager["ops"]} if eager else {}
    view = {
        "name": name,
        "ops": [{"op": op["op"], "source": provenance(result, op), "kernel": _shown_kernel(op.get("kernel")),
                 "named": isinstance(op.get("kernel"), str) and bool(op.get("kernel")),
                 "ms": fmt.latency_us(op["ms"]), "kernels": op["kernels"],
                 "share": f"{100 * op['ms'] / span:.0f}%" if span > 0 else fmt.DASH,
                 "host_gap": fmt.latency_us(gaps[op["op"]]) if op["op"] in gaps else fmt.DASH}
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
        "eager_breakdown": None,
        "eager_error": None,
    }
    if eager is not None:
        period = _eager_period_ms(eager)
        median = result.eager.p50_ms if result.eager is not None else None
        where, ms = _largest_stall(eager)
        view["eager_breakdown"] = {
            "lead": fmt.latency_us(eager["lead_ms"]), "gaps": fmt.latency_us(eager["gap_ms"]),
            "kernel": fmt.latency_us(eager["kernel_ms"]), "period": fmt.latency_us(period),
            "median": fmt.latency_us(median),
            "coverage": f"{100 * period / median:.1f}%" if median else fmt.DASH,
            "stall": where, "stall_ms": fmt.latency_us(ms),
            "host_total": fmt.latency_us(eager["lead_ms"] + eager["gap_ms"]),
        }
    elif isinstance(b.get("eager"), Mapping) and "error" in b["eager"]:
        view["eager_error"] = b["eager"]["error"]
    return view


def breakdown_view(experiment: Experiment, run: RunRecord, dtype: str) -> list[dict]:
    """Per case: each profile's ops (provenance, ms, share of its span, host gap before them on the eager-call
    clock), kernel time, gap, span against the GPU-time median, the eager-call figures (the host's gaps, where
    the host stalls most), and, where the subject is Slower on the eager-call clock, the op that loses there.
    Every case carries `stall_names`, the profiles with an eager-call breakdown anywhere in the run."""
    cases = []
    points = [p for p in run.points if p.dtype == dtype]
    order = [p.name for p in experiment.profiles]
    stall_names = [n for n in order if any(n in p.results and _eager(p.results[n]) for p in points)]
    for point in points:
        profiles = [_profile_view(name, result) for name, result in point.results.items() if _usable(result)]
        if not profiles:
            continue
        by_name = {p["name"]: p for p in profiles}
        stalls = []
        for name in stall_names:
            e = by_name[name]["eager_breakdown"] if name in by_name else None
            stalls.append({"host": e["host_total"], "where": e["stall"], "ms": e["stall_ms"]} if e else None)
        cases.append({"case": point.case, "profiles": profiles, "stall_names": stall_names,
                      "kernels_named": any(o["named"] for p in profiles for o in p["ops"]),
                      "host_gaps": any(p["eager_breakdown"] for p in profiles),
                      "stalls": stalls if any(stalls) else [],
                      "eager_slower": _eager_slower(experiment, run, point)})
    return cases


def _worst(ours: Mapping[str, float], theirs: Mapping[str, float]) -> tuple[str | None, float]:
    """Of the keys both hold, the one whose value is the most larger in `ours` (None where none is)."""
    excess = {k: v - theirs[k] for k, v in ours.items() if k in theirs}
    worst = max(excess, key=excess.get, default=None)
    return (worst, excess[worst]) if worst is not None and excess[worst] > 0 else (None, 0.0)


def _by_group(ops: Sequence[Mapping], value) -> dict[str, float]:
    """`value(op)` summed per kernel class (the ops' `group`); empty where an op has none (older records)."""
    out: dict[str, float] = {}
    for op in ops:
        group = op.get("group")
        if not isinstance(group, str):
            return {}
        out[group] = out.get(group, 0.0) + value(op)
    return out


def _comparison(worst: tuple[str | None, float], worst_group: tuple[str | None, float]) -> dict:
    return {"op": worst[0], "op_excess": fmt.latency_us(worst[1]) if worst[0] is not None else fmt.DASH,
            "group": worst_group[0],
            "group_excess": fmt.latency_us(worst_group[1]) if worst_group[0] is not None else fmt.DASH}


def slower_ops(experiment: Experiment, run: RunRecord, dtype: str,
               judgements: Mapping[tuple[str, str], PointJudgement]) -> list[dict]:
    """At each point where the subject is Slower than its best baseline and both have a breakdown: how much
    longer the subject's call takes (GPU-time medians) and, of the ops both name alike, the one whose kernels
    take the most longer (None where they share no op name, or none takes longer); likewise by kernel class,
    where the record gives each op's class (`group`)."""
    subject = experiment.claim.subject
    out = []
    for point in (p for p in run.points if p.dtype == dtype):
        j = judgements.get((point.case, dtype))
        if j is None or j.word != SLOWER or not j.baseline:
            continue
        ours, theirs = point.results.get(subject), point.results.get(j.baseline)
        if ours is None or theirs is None or not (_usable(ours) and _usable(theirs)):
            continue
        mine, their = ours.breakdown["ops"], theirs.breakdown["ops"]
        named = _worst({op["op"]: op["ms"] for op in mine}, {op["op"]: op["ms"] for op in their})
        grouped = _worst(_by_group(mine, lambda op: op["ms"]), _by_group(their, lambda op: op["ms"]))
        out.append({"case": point.case, "subject": subject, "baseline": j.baseline,
                    "call": fmt.latency_us(ours.p50_ms - theirs.p50_ms), **_comparison(named, grouped)})
    return out


def _eager_costs(result) -> tuple[dict[str, float], dict[str, float]]:
    """Per op (and per kernel class) on the eager-call clock: its kernel time plus the host's gap before its
    kernels; the gap before the call's first kernel counts as one more entry."""
    eager = _eager(result)
    groups = {op["op"]: op.get("group") for op in result.breakdown["ops"]}
    named = {op["op"]: op["ms"] + op["gap_ms"] for op in eager["ops"]}
    grouped: dict[str, float] = {}
    for op in eager["ops"]:
        group = groups.get(op["op"])
        if not isinstance(group, str):
            grouped = {}
            break
        grouped[group] = grouped.get(group, 0.0) + op["ms"] + op["gap_ms"]
    for table in (named, grouped) if grouped else (named,):
        table[BETWEEN_CALLS] = eager["lead_ms"]
    return named, grouped


def _eager_slower(experiment: Experiment, run: RunRecord, point: Point) -> dict | None:
    """Where the subject is Slower on the eager-call clock: its excess there and what loses it (see
    _eager_costs); None elsewhere, and on the CPU interpreter."""
    if not run.is_performance_evidence:
        return None
    subject = experiment.claim.subject
    ours = point.results.get(subject)
    if ours is None or ours.eager is None or ours.eager.p50_ms is None:
        return None
    j = judge_point(experiment, point, EAGER_CALL)
    theirs = point.results.get(j.baseline) if j.baseline else None
    if j.word != SLOWER or theirs is None or theirs.eager is None or theirs.eager.p50_ms is None:
        return None
    row = {"subject": subject, "baseline": j.baseline, "call": fmt.latency_us(ours.eager.p50_ms - theirs.eager.p50_ms),
           "measured": False, **_comparison((None, 0.0), (None, 0.0))}
    if _usable(ours) and _usable(theirs):  # until an eager-call breakdown says more: the GPU-time one's answer
        mine, their = ours.breakdown["ops"], theirs.breakdown["ops"]
        row.update(_comparison(_worst({op["op"]: op["ms"] for op in mine}, {op["op"]: op["ms"] for op in their}),
                               _worst(_by_group(mine, lambda op: op["ms"]), _by_group(their, lambda op: op["ms"]))))
    if _eager(ours) is not None and _usable(theirs) and _eager(theirs) is not None:
        (mine, mine_grouped), (their, their_grouped) = _eager_costs(ours), _eager_costs(theirs)
        row.update(_comparison(_worst(mine, their), _worst(mine_grouped, their_grouped)))
        row.update(measured=True, host=fmt.latency_us(_eager(ours)["lead_ms"] + _eager(ours)["gap_ms"]),
                   their_host=fmt.latency_us(_eager(theirs)["lead_ms"] + _eager(theirs)["gap_ms"]))
    return row


PAIR_IN = 0.34  # inches per profile in a panel: its GPU-time bar over its eager-call bar
SINGLE_IN = 0.26  # inches per profile where no profile has an eager-call breakdown
BAR = 0.4  # a bar's thickness in rows where two share a row
LABEL_IN = STYLE["font.size"] * 1.5 / 72  # the least height of a profile's row: its name's line


def _panel_grid(cases: int) -> tuple[int, int]:
    """(rows, columns) of panels: one column for one or two cases, two up to twelve, three past that."""
    columns = 1 if cases <= 2 else 2 if cases <= 12 else 3
    return -(-cases // columns), columns


def _segments(ax, y: float, height: float, spans, **style) -> None:
    """Bars in one row as one collection: spans (left, width) drawn with `style` (facecolors: one a span). One
    artist a row instead of one a bar: the decoder block's figures hold thousands of bars, and each bar as its
    own patch cost more to build and to key (lab.publish.svg_cache) than the rest of the render's figures."""
    if spans:
        ax.broken_barh(spans, (y - height / 2, height), **style)


def _gpu_time_bar(ax, y: float, height: float, result, colours) -> bool:
    """The call on the GPU-time clock: its ops' kernels, the gaps between kernels, the host's wait where the
    record has no eager-call breakdown, and the median; True where that wait was drawn."""
    left, spans = 0.0, []
    for op in result.breakdown["ops"]:
        spans.append((left, op["ms"] * 1e3))
        left += op["ms"] * 1e3
    _segments(ax, y, height, spans, facecolors=[colours[op["op"]] for op in result.breakdown["ops"]])
    gap = result.breakdown["gap_ms"] * 1e3
    _segments(ax, y, height, [(left, gap)], facecolors=GAP_COLOUR, hatch="//", edgecolor="#868e96", linewidth=0)
    wait = _host_wait_ms(result) if _eager(result) is None else None
    if wait:
        _segments(ax, y, height, [(left + gap, wait * 1e3)], facecolors="white", hatch="..", edgecolor=HOST_EDGE)
    ax.plot([result.p50_ms * 1e3] * 2, [y - 0.55 * height, y + 0.55 * height], color="#212529", linewidth=1.8)
    return bool(wait)


def _eager_bar(ax, y: float, height: float, result, colours) -> None:
    """The call on the eager-call clock: the host's gap before its first kernel, then per op the GPU's idle
    time before its kernels and their time; the eager-call median marked (dashed)."""
    eager = _eager(result)
    _segments(ax, y, height, [(0.0, eager["lead_ms"] * 1e3)], facecolors="white", hatch="xx", edgecolor=HOST_EDGE)
    left, gaps, kernels = eager["lead_ms"] * 1e3, [], []
    for op in eager["ops"]:
        gaps.append((left, op["gap_ms"] * 1e3))
        left += op["gap_ms"] * 1e3
        kernels.append((left, op["ms"] * 1e3))
        left += op["ms"] * 1e3
    _segments(ax, y, height, gaps, facecolors="white", hatch="..", edgecolor=HOST_EDGE)
    _segments(ax, y, height, kernels, facecolors=[colours[op["op"]] for op in eager["ops"]])
    if result.eager is not None and result.eager.p50_ms is not None:
        ax.plot([result.eager.p50_ms * 1e3] * 2, [y - 0.55 * height, y + 0.55 * height], color="#212529",
                linewidth=1.8, linestyle=(0, (2, 1.5)))


def _key(ops, colours, eager: bool, wait: bool) -> tuple[list, list[str]]:
    """The legend: every op's colour, then what the hatches and the median marks mean."""
    swatch = lambda **style: plt.Rectangle((0, 0), 1, 1, **style)  # noqa: E731
    handles = [swatch(color=colours[op]) for op in ops]
    labels = [plain(op) for op in ops]
    handles.append(swatch(facecolor=GAP_COLOUR, hatch="//", edgecolor="#868e96"))
    labels.append("GPU idle between kernels")
    if eager:
        handles += [swatch(facecolor="white", hatch="xx", edgecolor=HOST_EDGE),
                    swatch(facecolor="white", hatch="..", edgecolor=HOST_EDGE)]
        labels += ["host gap before the call", "host gap before an op"]
    if wait:
        handles.append(swatch(facecolor="white", hatch="..", edgecolor=HOST_EDGE))
        labels.append("host wait (eager median − span)")
    handles.append(plt.Line2D([0], [0], color="#212529", linewidth=1.8))
    labels.append("GPU-time median" + (" (upper bar)" if eager else ""))
    if eager:
        handles.append(plt.Line2D([0], [0], color="#212529", linewidth=1.8, linestyle=(0, (2, 1.5))))
        labels.append("eager-call median (lower bar)")
    return handles, labels


def render_breakdown_plot(experiment: Experiment, run: RunRecord, dtype: str, gpu_label: str) -> str:
    """One panel per case (each on its own µs scale), two or three to a row; in each, a row per profile: its
    GPU-time bar, and under it its eager-call bar where the record has one. The legend sits above them."""
    points = [p for p in run.points if p.dtype == dtype and any(_usable(r) for r in p.results.values())]
    ops = _op_order(points)
    colours = {op: OP_PALETTE[i % len(OP_PALETTE)] for i, op in enumerate(ops)}
    names = [n for n in (p.name for p in experiment.profiles)
             if any(n in p.results and _usable(p.results[n]) for p in points)]
    eager = any(_eager(p.results[n]) for p in points for n in names if n in p.results)
    wait = any(_eager(p.results[n]) is None and _host_wait_ms(p.results[n])
               for p in points for n in names if n in p.results and _usable(p.results[n]))
    handles, labels = _key(ops, colours, eager, wait)
    grid_rows, columns = _panel_grid(len(points))
    with plt.rc_context(STYLE):
        per_profile = PAIR_IN if eager else SINGLE_IN
        head = header_height(labels) + 0.45  # title, legend, the shared axis label
        panel = per_profile * len(names) + 0.72  # a panel's rows, its title and its ticks
        if head + grid_rows * panel > MAX_HEIGHT_IN:  # many cases: thinner bars, never thinner than a name
            per_profile = max(LABEL_IN, ((MAX_HEIGHT_IN - head) / grid_rows - 0.72) / len(names))
            panel = per_profile * len(names) + 0.72
        total = head + grid_rows * panel  # past MAX_HEIGHT_IN only where the names need it
        fig, axes = figure(total, grid_rows, columns, max_height=total, sharey=True)
        try:
            for ax, point in zip(axes.flat, points):
                for row, name in enumerate(names):
                    result = point.results.get(name)
                    if result is None or not _usable(result):
                        continue
                    if eager:
                        _gpu_time_bar(ax, row - BAR / 2, BAR, result, colours)
                        if _eager(result) is not None:
                            _eager_bar(ax, row + BAR / 2, BAR, result, colours)
                    else:
                        _gpu_time_bar(ax, row, 0.6, result, colours)
                ax.set_xlim(left=0)  # every bar starts at 0: no margin before it (bars made it sticky)
                ax.set_title(plain(point.case), fontsize=STYLE["font.size"])
                ax.xaxis.set_major_locator(MaxNLocator(4))
                ax.xaxis.set_major_formatter(number_format())
                ax.grid(axis="y", visible=False)
                ax.tick_params(axis="y", length=0)
            for ax in list(axes.flat)[len(points):]:
                ax.set_visible(False)
            first = axes[0][0]
            first.set_yticks(range(len(names)), [plain(n) for n in names])
            first.set_ylim(len(names) - 0.5, -0.5)
            fig.supxlabel("µs per call (each panel on its own scale)", fontsize=STYLE["font.size"])
            header(fig, f"Time per call, op by op · {gpu_label} · {dtype}", handles, labels)
            return svg(fig)
        finally:
            plt.close(fig)
