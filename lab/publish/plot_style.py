"""What every plot shares: its size for the page's column, its text, colours and axes, the legend above the
axes, and deterministic SVG.

Size: drawn for the site's content column (about 900 CSS px on a desktop) at FIG_WIDTH inches, and scaled by
the page (max-width: 100%); an SVG inch is 96 CSS px, so the text's 15-15.5 pt is 20 px at full width and
still at least 9 px once a phone narrows the figure to about 350 px. Text stays text (svg.fonttype none): it scales,
and a reader can search and copy it.

Determinism: a fixed hash salt for SVG ids, no date in the metadata, no glyph paths that depend on the
installed fonts. Unchanged records give byte-identical files.
"""

from __future__ import annotations

import io
import math
from typing import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

STYLE = {
    "svg.hashsalt": "kernel-lab",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 15,
    "axes.titlesize": 15,
    "axes.labelsize": 15,
    "xtick.labelsize": 15,
    "ytick.labelsize": 15,
    "legend.fontsize": 15,
    "figure.titlesize": 15.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
}
FIG_WIDTH = 7.5  # inches: 720 CSS px, inside the ~900 px column; see the module docstring for the phone
PLOT_IN = 3.7  # inches of a chart against a swept dimension under its header: axes, ticks and labels
ROW_IN = 0.3  # inches per case where the cases are the rows of a chart (one line of 14 pt text and air)
MAX_HEIGHT_IN = 16.0  # 1,536 CSS px at full width: the tallest figure a page shows
SUBJECT_COLOUR = "#e8590c"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2", "#d62728")
GPU_PALETTE = ("#1864ab", "#862e9c", "#2b8a3e", "#c92a2a", "#495057")
CEILING_COLOUR = "#444444"
MARGIN_COLOUR = "#adb5bd"
NOTE_COLOUR = "#b71c1c"
WIDE = 10.0  # values this many times apart go on a log axis, so that the smallest stays visible


def plain(text: str) -> str:
    """A record's text as a plot shows it: as it is, never as mathtext (matplotlib reads $...$ as TeX)."""
    return text.replace("$", r"\$")


def number(v: float) -> str:
    """An axis number: thousands separated ("3,000"), small ones as they are ("12.5", "0.25")."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"


def size_tick(v: float) -> str:
    """A size on a log-2 axis: multiples of 1,024 as "1k" … "256k", of 1,048,576 as "1M"; others in full."""
    v = round(v)
    for unit, suffix in ((1 << 20, "M"), (1 << 10, "k")):
        if v >= unit and v % unit == 0:
            return f"{v // unit}{suffix}"
    return f"{v:,}"


def _number_tick(v, _position) -> str:
    return number(v)


def _size_tick(v, _position) -> str:
    return size_tick(v)


# A formatter of its own for every axis (a formatter keeps its axis and the last ticks it labelled), made
# from named functions, not lambdas: a figure that uses them pickles, which is how svg() knows it drew the
# same figure before.
def number_format() -> FuncFormatter:
    return FuncFormatter(_number_tick)


def size_format() -> FuncFormatter:
    return FuncFormatter(_size_tick)


def wide(values: Iterable[float]) -> bool:
    values = [v for v in values if v is not None and v > 0]
    return bool(values) and max(values) / min(values) >= WIDE


def size_axis(ax, which: str, values: Sequence[float]) -> None:
    """The `which` ("x" or "y") axis of `ax` holds a swept size: log 2 with one labelled tick per power of two (every other one past ten of them, every
    fourth past twenty) where the sizes span 32× or more, linear otherwise; minor ticks unlabelled."""
    axis = getattr(ax, f"{which}axis")
    lo, hi = min(values), max(values)
    if lo > 0 and hi / lo >= 32:
        getattr(ax, f"set_{which}scale")("log", base=2)
        octaves = math.log2(hi / lo)
        step = 1 if octaves <= 10 else 2 if octaves <= 20 else 4
        axis.set_major_locator(LogLocator(base=2 ** step))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(size_format())
        # From a third of an octave below the labelled tick at or below the smallest size to a third above the
        # largest: no tick sits on the other axis's corner, where its label would run into that axis's first.
        first = 2.0 ** (step * math.floor(math.log2(lo) / step))
        getattr(ax, f"set_{which}lim")(first / 2 ** (1 / 3), hi * 2 ** (1 / 3))
    else:
        axis.set_major_formatter(number_format())
    axis.set_minor_formatter(NullFormatter())


def value_axis(ax, which: str, values: Sequence[float]) -> bool:
    """The `which` axis of `ax` holds times or throughputs: a log-10 axis when they lie WIDE apart (True), linear otherwise; numbers in full,
    minor ticks unlabelled except across less than two decades, where 2 and 5 are labelled too."""
    axis = getattr(ax, f"{which}axis")
    logged = wide(values)
    if logged:
        getattr(ax, f"set_{which}scale")("log")
        positive = [v for v in values if v > 0]
        if max(positive) / min(positive) < 100:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(number_format())
    axis.set_minor_formatter(NullFormatter())
    return logged


def figure(height: float, rows: int = 1, cols: int = 1, max_height: float = MAX_HEIGHT_IN, **kwargs):
    """A figure FIG_WIDTH wide and `height` tall (at most max_height), laid out by the constrained layout."""
    return plt.subplots(rows, cols, figsize=(FIG_WIDTH, min(height, max_height)), layout="constrained",
                        squeeze=False, **kwargs)


LEGEND_CHARS = round(FIG_WIDTH * 72 / 7.5) - 2  # 15 pt characters (about 7.5 pt each) across the figure;
# a handle and its spacing take 8


def _column_sizes(entries: int, columns: int) -> list[int]:
    """How matplotlib's legend shares `entries` among `columns`, filling each top to bottom."""
    rows, large = divmod(entries, columns)
    return [rows + 1] * large + [rows] * (columns - large)


def legend_columns(labels: Sequence[str]) -> int:
    """The most columns (at most 4) whose entries fit across the figure."""
    for columns in range(min(4, len(labels)), 1, -1):
        widths, start = [], 0
        for size in _column_sizes(len(labels), columns):
            widths.append(max(len(label) for label in labels[start:start + size]))
            start += size
        if sum(w + 8 for w in widths) <= LEGEND_CHARS:
            return columns
    return 1


def legend_rows(labels: Sequence[str]) -> int:
    """How many rows the legend of `header` takes for these labels (to size a figure before drawing it)."""
    return math.ceil(len(labels) / legend_columns(labels)) if labels else 0


TITLE_IN = 0.48  # inches from the figure's top to the legend's first row, the title's line included
LEGEND_ROW_IN = 0.30


def header_height(labels: Sequence[str]) -> float:
    """Inches the title and the legend take at the figure's top (see header)."""
    return TITLE_IN + LEGEND_ROW_IN * legend_rows(labels) + 0.08


def header(fig, heading: str, handles, labels, body_in: float | None = None) -> None:
    """The title at the top left, the legend under it across the figure, both outside the axes: the layout
    keeps the axes below header_height(labels). With `body_in`, the figure is made that much taller than its
    header (at most MAX_HEIGHT_IN)."""
    if body_in is not None:
        fig.set_figheight(min(MAX_HEIGHT_IN, header_height(labels if handles else []) + body_in))
    height = fig.get_figheight()
    fig.text(0.01, 1 - 0.08 / height, plain(heading), ha="left", va="top", fontsize=STYLE["figure.titlesize"])
    if handles:
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - TITLE_IN / height),
                   ncols=legend_columns(labels), frameon=False, handlelength=1.8, columnspacing=1.4,
                   borderaxespad=0, borderpad=0)
    fig.get_layout_engine().set(rect=(0, 0, 1, 1 - header_height(labels if handles else []) / height))


def red_note(ax, text: str | None) -> None:
    """A note over the axes, in red (such as "not performance evidence")."""
    if text:
        ax.set_title(plain(text), loc="left", color=NOTE_COLOUR, fontsize=STYLE["font.size"])


def _draw(fig) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def svg(fig) -> str:
    """The figure as SVG text: drawn, or kept from drawing the same figure before (lab.publish.svg_cache)."""
    from lab.publish import svg_cache

    return svg_cache.drawn(fig, _draw)


def status_note(statuses: Sequence[str], total: int, where: str | None = None) -> str | None:
    """What a legend says of a series that is missing somewhere: "unsupported in 4 of 9 cases", "unsupported
    for N > 65,536" (`where`); None where it is timed everywhere. Statuses are the non-timed results' words."""
    if not statuses:
        return None
    word = " / ".join(dict.fromkeys(statuses))
    if where:
        return f"{word} {where}"
    return word if len(statuses) == total else f"{word} in {len(statuses)} of {total} cases"
