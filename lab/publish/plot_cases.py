"""Charts whose rows are an experiment's cases (no swept dimension): the case names read across, one per row,
so that no two ever meet however many cases there are.

* time_rows: one run at one dtype; per case, each profile's median time per call with its p20-p80 range,
  on a log axis where the times lie ten times apart or more (the subject stays visible beside a slow peer).
* speedup_rows: per case, the subject's speedup over its best baseline with the 95% interval, one marker
  per GPU, over the grey band of the claim's margin around 1 (a tie).

Cases of one family (a name that differs only in its last '-' part, "d128-full-s512" and "d128-full-s1024")
sit between thin rules. A profile that is not timed at some case says so once, in its legend entry.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import LogLocator, NullFormatter

from lab.evidence.verdict import AGAINST, tie_band
from lab.publish.plot_style import (
    MARGIN_COLOUR,
    ROW_IN,
    figure,
    header,
    header_height,
    number_format,
    plain,
    status_note,
    red_note,
    value_axis,
)

RULE_COLOUR = "#adb5bd"
NOT_SHOWN = "incorrect"  # a result that failed its accuracy check is no series (the page's table says so)
AGAINST_MARKER = {"marker": "v", "s": 64, "edgecolor": "#000000", "linewidth": 0.8, "zorder": 6}


def timed(result) -> bool:
    return result is not None and result.status == "ok" and result.p50_ms is not None


def rows_height(cases: int, labels: Sequence[str], note: bool = False) -> float:
    """Inches for a chart of `cases` rows under a legend of `labels`: title, legend, rows, axis and its label."""
    return max(3.0, header_height(labels) + 0.85 + ROW_IN * cases + (0.3 if note else 0))


def _runs(labels: Sequence[str]) -> list[int]:
    """Lengths of the runs of equal neighbours in `labels`."""
    runs: list[int] = []
    for k, label in enumerate(labels):
        if k and label == labels[k - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def families(cases: Sequence[str]) -> list[str] | None:
    """Each case's family, where the cases fall into runs of two or more: the name less its last '-' part
    ("d128-full" of "d128-full-s512"), else its first part ("int8" of "int8-m1-n4096-k4096"); None where
    neither groups them so."""
    for family in (lambda c: c.rsplit("-", 1)[0], lambda c: c.split("-", 1)[0]):
        named = [family(c) if "-" in c else c for c in cases]
        runs = _runs(named)
        if 1 < len(runs) and min(runs) >= 2 and len(runs) == len(set(named)):
            return named
    return None


def case_rows(ax, cases: Sequence[str]) -> None:
    """The cases as the rows of `ax`, first at the top, with a rule between families (see families)."""
    ax.set_yticks(range(len(cases)), [plain(c) for c in cases])
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.tick_params(axis="y", length=0)
    named = families(cases)
    for k in range(1, len(cases)) if named else ():
        if named[k] != named[k - 1]:
            ax.axhline(k - 0.5, color=RULE_COLOUR, linewidth=0.9, zorder=0)


def _offsets(count: int, spread: float = 0.62) -> list[float]:
    """Where `count` markers sit within one row (row units), apart and centred."""
    if count == 1:
        return [0.0]
    return [spread * (i / (count - 1) - 0.5) for i in range(count)]


def time_rows(points, order: Sequence[str], colours: dict, subject: str, title_text: str, note: str | None):
    """The figure of each profile's time per case (see the module docstring). `order` ends with the subject."""
    cases = [p.case for p in points]
    labels, series = [], []
    for name in order:
        results = [p.results.get(name) for p in points]
        statuses = [r.status for r in results if r is not None and not timed(r) and r.status != NOT_SHOWN]
        shown = sum(1 for r in results if r is not None and r.status != NOT_SHOWN)
        if not shown:
            continue
        words = ["subject"] if name == subject else []
        status = status_note(statuses, shown)
        if status:
            words.append(status)
        labels.append(plain(name) + (f" ({'; '.join(words)})" if words else ""))
        series.append((name, results))
    medians = [1e3 * r.p50_ms for _, rs in series for r in rs if timed(r)]
    fig, axes = figure(rows_height(len(cases), labels, note is not None))
    ax = axes[0][0]
    handles = []
    offsets = _offsets(len(series))
    offsets.append(offsets.pop(len(offsets) // 2))  # the subject, last, on the row's line (or nearest it)
    for (name, results), y0 in zip(series, offsets):
        subject_here = name == subject
        rows = [(k + y0, r) for k, r in enumerate(results) if timed(r)]
        style = {"marker": "D" if subject_here else "o", "markersize": 7.5 if subject_here else 6,
                 "markeredgecolor": "#212529" if subject_here else colours[name], "markeredgewidth": 0.8,
                 "color": colours[name], "linestyle": "", "zorder": 5 if subject_here else 3}
        handles.append(plt.Line2D([], [], **style))
        if not rows:
            continue
        ys = [y for y, _ in rows]
        p50 = [1e3 * r.p50_ms for _, r in rows]
        ax.errorbar(p50, ys, xerr=[[1e3 * (r.p50_ms - r.p20_ms) for _, r in rows],
                                   [1e3 * (r.p80_ms - r.p50_ms) for _, r in rows]],
                    elinewidth=1.1, capsize=0, ecolor=colours[name], **style)
    case_rows(ax, cases)
    logged = value_axis(ax, "x", medians) if medians else False
    if medians and not logged:
        ax.set_xlim(left=0, right=max(medians) * 1.08)
    ax.set_xlabel("µs per call: median, line p20–p80" + (" (log scale)" if logged else ""))
    red_note(ax, note)
    header(fig, title_text, handles, labels)
    return fig


def speedup_rows(dtype: str, series, margin: float, threshold: float, title_text: str):
    """Each GPU's speedup per case at `dtype`: series are (GPU label, colour, judgements, run)."""
    cases = list(dict.fromkeys(j.case for _, _, judgements, _ in series for j in judgements if j.dtype == dtype))
    labels = [f"tie: margin ±{margin:.1%} (Level)"] + ([f"target {threshold:g}×"] if threshold > 1 else [])
    drawn = [(label, colour, {j.case: j for j in js if j.dtype == dtype and j.speedup is not None})
             for label, colour, js, _ in series]
    drawn = [(label, colour, by_case) for label, colour, by_case in drawn if by_case]
    any_against = any(j.effect == AGAINST for _, _, by_case in drawn for j in by_case.values())
    legend_labels = labels + [plain(label) for label, _, _ in drawn] + (["against the claim (▼)"] if any_against else [])
    fig, axes = figure(rows_height(len(cases), legend_labels))
    ax = axes[0][0]
    band = ax.axvspan(*tie_band(margin), color=MARGIN_COLOUR, alpha=0.45, linewidth=0, zorder=0)
    ax.axvline(1, color="#495057", linewidth=0.9, zorder=1)
    handles = [band]
    if threshold > 1:
        handles.append(ax.axvline(threshold, color="#495057", linestyle="--", linewidth=1.1, zorder=1))
    ratios = [1.0]
    against = None
    for (label, colour, by_case), y0 in zip(drawn, _offsets(len(drawn), 0.5)):
        rows = [(k + y0, by_case[c]) for k, c in enumerate(cases) if c in by_case]
        ys, js = [y for y, _ in rows], [j for _, j in rows]
        ratios += [j.speedup.low for j in js] + [j.speedup.high for j in js]
        handles.append(ax.errorbar([j.speedup.ratio for j in js], ys,
                                   xerr=[[j.speedup.ratio - j.speedup.low for j in js],
                                         [j.speedup.high - j.speedup.ratio for j in js]],
                                   fmt="o", color=colour, capsize=3, elinewidth=1.3, markersize=6, zorder=3))
        worse = [(j.speedup.ratio, y) for y, j in rows if j.effect == AGAINST]
        if worse:
            against = ax.scatter([x for x, _ in worse], [y for _, y in worse], color=colour, **AGAINST_MARKER)
    if against is not None:
        handles.append(against)
    case_rows(ax, cases)
    if max(ratios) / min(r for r in ratios if r > 0) >= 4:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(number_format())  # plain numbers, never 3×10⁰
        ax.xaxis.set_minor_formatter(NullFormatter())  # unlabelled minor ticks cannot collide
    ax.set_xlabel("speedup over the best baseline (95% interval)")
    header(fig, title_text, handles, legend_labels)
    return fig
