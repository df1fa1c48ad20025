"""How numbers appear on the pages: one function per kind of number, so every page writes them alike.

Latency in µs to at least 3 significant figures (whole µs with thousands separated from 100 µs up),
throughput in GB/s as an integer from 100 up and to one decimal below, percentages as integers, speedups
and their bounds to 3 decimals, relative errors in scientific notation to 2 significant figures. A missing
value is an en dash.
"""

from __future__ import annotations

import shlex

DASH = "–"


def latency_us(ms: float | None) -> str:
    if ms is None:
        return DASH
    us = ms * 1e3
    if us >= 100:
        return f"{us:,.0f}"
    if us >= 10:
        return f"{us:.1f}"
    if us >= 1:
        return f"{us:.2f}"
    return f"{us:.3f}"


def latency_range_us(low_ms: float | None, high_ms: float | None) -> str:
    if low_ms is None or high_ms is None:
        return DASH
    return f"{latency_us(low_ms)}–{latency_us(high_ms)}"


def gbps(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def percent(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}%"


def tflops(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}×"


def interval(low: float | None, high: float | None) -> str:
    return DASH if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def rel_error(value: float | None) -> str:
    return DASH if value is None else f"{value:.1e}"


def size_bytes(value: int | None) -> str:
    if value is None:
        return DASH
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            amount = value / scale
            return f"{amount:.0f} {unit}" if amount == int(amount) else f"{amount:.1f} {unit}"
    return f"{value} B"


def short_commit(commit: str | None, dirty: bool | None) -> str:
    if not commit:
        return "unknown"
    return f"{commit[:10]}{' (dirty)' if dirty else ''}"


def table_cell(text: object) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, line breaks flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def describe_command(command: list[str] | tuple[str, ...]) -> str:
    """A recorded command line as one shell-quoted string."""
    return shlex.join(command)
