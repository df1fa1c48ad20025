"""How numbers appear on the pages: one function per kind of number, so every page writes them alike.

Latency in µs to at least 3 significant figures (whole µs with thousands separated from 100 µs up),
throughput in GB/s as an integer from 100 up and to one decimal below, percentages as integers, speedups
and their bounds to 3 decimals, relative errors in scientific notation to 2 significant figures, sizes in
binary units (KiB, MiB, GiB) to one decimal. A missing value is an en dash.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from typing import Mapping

from lab.publish.escape import Md

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


def point_tflops(flops: int | None, value: float | None) -> str:
    """A result's recorded TFLOP/s at a point: a dash where the point has no FLOP count (nothing to divide)."""
    return tflops(value) if flops else DASH


def ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}×"


def interval(low: float | None, high: float | None) -> str:
    """"[low, high]" (Markdown of the project's own, so its brackets are not escaped as a record's would be)."""
    return DASH if low is None or high is None else Md(f"[{low:.3f}, {high:.3f}]")


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


def model_value(value: int | None, unit: str) -> str:
    """A declared model quantity of a point (experiments.spec.PointColumn): bytes in KiB, MiB or GiB, a count
    as a whole number; a dash where there is none."""
    if value is None:
        return DASH
    return size_bytes(value) if unit == "bytes" else f"{value:,}"


SHOW_HOSTS = "KERNEL_LAB_SHOW_HOSTS"  # set to 1 to print hosts' real names on the pages (the records keep them)


def host_label(name: str | None) -> str:
    """How a page names the host a run came from: a stable alias ("host-" and the first 6 hex digits of the
    name's sha256), never the name itself, unless KERNEL_LAB_SHOW_HOSTS=1 asks for real names. Runs from one
    host share an alias, so a reader can still tell hosts apart. Empty for no name."""
    if not name:
        return ""
    if os.environ.get(SHOW_HOSTS) == "1":
        return name
    return "host-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:6]


def short_commit(commit: str | None, dirty: bool | None) -> str:
    if not commit:
        return "unknown"
    return f"{commit[:10]}{' (dirty)' if dirty else ''}"


def describe_command(command: list[str] | tuple[str, ...]) -> str:
    """A recorded command line as one shell-quoted string."""
    return shlex.join(command)


# Options that say where this host keeps its files: meaningless to a reader, who runs with the defaults.
HOST_OPTIONS = {"--records-dir": 1, "--docs-dir": 1, "--no-progress": 0}


def reader_command(command: list[str] | tuple[str, ...]) -> str:
    """A recorded command line as a reader can run it from the repository root: the host's own paths and
    progress switch dropped, an absolute executable named by its file name, a script run through python."""
    args = list(command)
    kept: list[str] = []
    skip = 0
    for arg in args:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in HOST_OPTIONS:
            skip = HOST_OPTIONS[name] if "=" not in arg else 0
            continue
        kept.append(arg.rsplit("/", 1)[-1] if arg.startswith("/") and _executable(arg) else arg)
    if kept and kept[0].endswith(".py"):
        kept.insert(0, "python")
    return shlex.join(kept)


def _executable(path: str) -> bool:
    """An absolute path to a program (…/bin/ncu, …/.venv/bin/python3), not a data file."""
    return "/bin/" in path


def short_run_id(run_id: str) -> str:
    """The run id's last part ("…-bb4c4d" -> "bb4c4d"): unique enough beside its date and GPU."""
    return run_id.rsplit("-", 1)[-1]


def gpu_short(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3": the vendor is the same on every row."""
    return name.removeprefix("NVIDIA ").strip() or name


def gpu_labels(names: Mapping[str, str]) -> dict[str, str]:
    """Key -> the fewest leading words of each name, vendor dropped, that still tell every name apart
    ("NVIDIA H100 80GB HBM3" and "NVIDIA H200" -> "H100" and "H200")."""
    words = {key: gpu_short(name).split() or [name] for key, name in names.items()}
    for n in range(1, max((len(w) for w in words.values()), default=0) + 1):
        labels = {key: " ".join(w[:n]) for key, w in words.items()}
        if len(set(labels.values())) == len(labels):
            return labels
    return {key: " ".join(w) for key, w in words.items()}


def utc_date(stamp: str) -> str:
    """"2026-11-23T11:16:43Z" -> "2026-11-23 11:16"."""
    return stamp.replace("T", " ")[:16] if "T" in stamp else stamp


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def tokens_per_s(value: float | None) -> str:
    """Tokens per second: whole tokens up to a million, then millions to two decimals."""
    if value is None:
        return DASH
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    return f"{value:,.0f}"
