"""The free-form parts of a run record: a launch plan, the environment, the git state, the source hashes
and the profiler's facts. Each is checked for what the pages read from it (types, ranges, one-line names)
and kept as the JSON it was; lab.evidence.records builds the record around them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from lab.evidence.checks import (
    MAX_NAME,
    Absent,
    RecordError,
    boolean,
    case_name,
    fields,
    identifier,
    integer,
    json_value,
    list_of,
    mapping,
    matching,
    number,
    optional,
    source_path,
    text,
    time_ms,
    utc_time,
)

MAX_SAMPLES = 10_000  # per profile and point: the bootstrap resamples each set 2,000 times
# Plot files are <slug>--<gpu-key>--<dtype>.svg, and <slug>--speedup[-<clock>]--<dtype>.svg for the speedup plots:
# a GPU key of that form would write over one.
RESERVED_GPU_KEYS = re.compile(r"speedup(?:-.*)?")

samples_ms = list_of(time_ms, max_length=MAX_SAMPLES)
name_text = text(MAX_NAME, line=True)
short_text = text(1000, line=True)
any_number = number(-math.inf, math.inf)
figure = number()  # GB/s, percentages, TFLOP/s: finite, >= 0, bounded
plan = fields({}, extra=json_value())


def kept(check):
    """`check` for validation only: the value is kept as the JSON it was."""
    def keep(value: Any, where: str) -> Any:
        check(value, where)
        return dict(value)
    return keep


def scalar(value: Any, where: str) -> Any:
    """A string, a number or true/false (nvidia-smi's readings)."""
    if isinstance(value, bool):
        return value
    return any_number(value, where) if isinstance(value, (int, float)) else short_text(value, where)


def gpu_key(value: Any, where: str) -> str:
    if RESERVED_GPU_KEYS.fullmatch(identifier(value, where)):
        raise RecordError(f"{where}: {value!r} is reserved (the speedup plots are named so)")
    return value


ENVIRONMENT = kept(fields({
    "gpu_key": gpu_key,
    "gpu_name": text(200, line=True, empty=False),
    "nvidia_smi": Absent(optional(mapping(name_text, optional(scalar), max_length=100))),
    "memory_bytes": Absent(optional(integer())),
    "l2_cache_bytes": Absent(optional(integer())),
    "sm_count": Absent(optional(integer(0, 1 << 20))),
    "cpu_count": Absent(optional(integer(0, 1 << 20))),
    "packages": Absent(optional(mapping(name_text, optional(short_text), max_length=1000))),
    "triton_interpreter": Absent(optional(boolean)),
    "host": Absent(short_text),
    "worker": Absent(fields({"scheduler": short_text, "version": short_text, "node_id": optional(short_text),
                             "gpu_ids": list_of(short_text, max_length=1000)}, extra=json_value())),
    **{key: Absent(optional(short_text)) for key in
       ("python", "torch", "triton", "cuda", "cpu", "platform", "device", "compute_capability")},
}, extra=json_value()))


GIT = kept(fields({"commit": optional(text(100, line=True)), "dirty": Absent(optional(boolean))},
                  extra=json_value()))
HASHES = kept(mapping(source_path, matching(re.compile(r"[0-9a-f]{64}|missing"), "a sha256 or 'missing'"),
                      max_length=1000))

KERNEL = fields({
    "id": integer(),
    "name": text(10_000, line=True),
    "metrics": mapping(name_text, fields({"value": any_number, "unit": text(100, line=True)}), max_length=1000),
})
POINT_FACTS = fields({"kernels": list_of(KERNEL, max_length=10_000),
                      "totals": fields({}, extra=optional(number(0.0, math.inf)))})


def point_profiling(value: Any, where: str) -> dict | None:
    """A profile result's profiler facts: null, {"error": why}, or {"kernels": [...], "totals": {...}}.

    Each kernel is {"id": ncu's launch id, "name": short name, "metrics": {metric: {"value": number,
    "unit": text}}}; totals are numbers >= 0 or null (null where a metric was not reported).
    """
    if value is None:
        return None
    if isinstance(value, dict) and "error" in value:
        if "kernels" in value:
            raise RecordError(f"{where}: holds both an error and kernels; expected one or the other")
        fields({"error": text()})(value, where)
    else:
        POINT_FACTS(value, where)
    return dict(value)


SELECTION = fields({
    "rule": Absent(optional(short_text)),
    "max_points": Absent(optional(integer())),
    "profiles": Absent(optional(list_of(identifier, max_length=1000))),
    "points": Absent(list_of(fields({"case": case_name, "dtype": identifier}), max_length=100_000)),
}, extra=json_value())
RUN_PROFILING = fields({
    "error": optional(text()),
    "command": list_of(text(10_000), max_length=10_000),
    "ncu_version": Absent(optional(short_text)),
    "tool": Absent(optional(short_text)),
    "metrics": Absent(list_of(name_text, max_length=1000)),
    "calls": Absent(integer()),
    "kernels": Absent(integer()),
    "unattributed_kernels": Absent(optional(integer())),
    "warmup_calls": Absent(optional(integer())),
    "selection": Absent(optional(SELECTION)),
    "started_utc": Absent(optional(utc_time)),
    "finished_utc": Absent(optional(utc_time)),
    "messages": Absent(list_of(text(10_000), max_length=10_000)),
}, extra=json_value())


def run_profiling(value: Any, where: str) -> dict | None:
    """The run-level profiler block: null (not profiled) or an object whose `error` is null when the
    profiler gave data (then `metrics`, `calls` and `kernels` say what it read), else the reason it gave
    none; `command` and `ncu_version` say what was run."""
    if value is None:
        return None
    RUN_PROFILING(value, where)
    if value["error"] is None:
        for key in ("metrics", "calls", "kernels"):
            if key not in value:
                raise RecordError(f"{where}: missing field {key!r}")
    return dict(value)


BREAKDOWN_MS = number(0.0, 1e7)
KERNEL_COUNT = integer(0, 1 << 20)
BREAKDOWN = fields({
    "method": short_text,
    "calls": integer(1, 1 << 20),
    "ops": list_of(fields({"op": name_text, "ms": BREAKDOWN_MS, "kernels": KERNEL_COUNT,
                           # Added later (older records lack them): how many of the op's kernels are the lab's
                           # own, its longest kernel's name, and the class its kernels' names give it.
                           "lab_kernels": Absent(KERNEL_COUNT), "kernel": Absent(name_text),
                           "group": Absent(name_text)}),
                   min_length=1, max_length=64),
    "kernel_ms": BREAKDOWN_MS,
    "span_ms": BREAKDOWN_MS,
    "gap_ms": BREAKDOWN_MS,
    "eager": Absent(lambda value, where: eager_breakdown(value, where)),
})
EAGER_BREAKDOWN = fields({
    "method": short_text,
    "calls": integer(1, 1 << 20),
    "ops": list_of(fields({"op": name_text, "ms": BREAKDOWN_MS, "kernels": KERNEL_COUNT, "gap_ms": BREAKDOWN_MS}),
                   min_length=1, max_length=64),
    "kernel_ms": BREAKDOWN_MS,
    "span_ms": BREAKDOWN_MS,
    "gap_ms": BREAKDOWN_MS,
    "lead_ms": BREAKDOWN_MS,
})


def _gap_within_span(checked: dict, where: str) -> None:
    if checked["gap_ms"] > checked["span_ms"] * (1 + 1e-9):
        raise RecordError(f"{where}: gap_ms {checked['gap_ms']!r} exceeds span_ms {checked['span_ms']!r}")


def breakdown(value: Any, where: str) -> dict | None:
    """A profile result's op-by-op breakdown (lab.measure.breakdown): null, {"error": why}, or per-call figures in ms: each
    op's kernel time and kernel count (and, in newer records, how many of them are the lab's, its longest
    kernel and its class by kernel name), the kernel time in all, the span from first kernel start to last end
    and the gap (span minus kernel time); the gap never exceeds the span, nor an op's lab kernels its kernels.
    Newer records add `eager`, the same call on the eager-call clock (eager_breakdown)."""
    if value is None:
        return None
    if isinstance(value, dict) and "error" in value:
        fields({"error": text()})(value, where)
        return dict(value)
    checked = BREAKDOWN(value, where)
    _gap_within_span(checked, where)
    for i, op in enumerate(checked["ops"]):
        if op["lab_kernels"] is not None and op["lab_kernels"] > op["kernels"]:
            raise RecordError(f"{where}.ops[{i}]: lab_kernels {op['lab_kernels']!r} exceeds kernels {op['kernels']!r}")
    return dict(value)


def eager_breakdown(value: Any, where: str) -> dict:
    """The breakdown's eager-call part: {"error": why}, or per-call figures in ms of back-to-back calls: each op's
    kernel time, kernel count and the GPU's idle time before its kernels (`gap_ms`), the kernel time, span and
    idle time inside a call, and the idle time before a call's first kernel (`lead_ms`)."""
    if isinstance(value, dict) and "error" in value:
        fields({"error": text()})(value, where)
        return dict(value)
    checked = EAGER_BREAKDOWN(value, where)
    _gap_within_span(checked, where)
    return dict(value)
    checked = BREAKDOWN(value, where)
    if checked["gap_ms"] > checked["span_ms"] * (1 + 1e-9):
        raise RecordError(f"{where}: gap_ms {checked['gap_ms']!r} exceeds span_ms {checked['span_ms']!r}")
    return dict(value)

