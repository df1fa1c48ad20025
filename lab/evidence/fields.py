"""Field checks for run records: each takes the field's path in the record (e.g. "record.points[3].dtype") and
raises a RecordError naming that path and what the field accepts."""

from __future__ import annotations

import math
from typing import Any, Mapping


class RecordError(ValueError):
    """A record's content does not match the schema; the message names the field and what was expected."""


def required(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise RecordError(f"{where}: missing field {key!r}")
    return data[key]


def checked(data, key, where, accepts, expected: str, *, optional=False) -> Any:
    """data[key] when `accepts` it (None too when optional), else a RecordError naming what was expected."""
    value = required(data, key, where)
    if value is None and optional:
        return None
    if not accepts(value):
        raise RecordError(f"{where}.{key}: expected {expected}, got {type(value).__name__}")
    return value


def expect_object(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {type(data).__name__}")


def text(data, key, where, *, optional=False) -> str | None:
    return checked(data, key, where, lambda v: isinstance(v, str), "a string", optional=optional)


def integer(data, key, where, *, optional=False) -> int | None:
    return checked(data, key, where, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer",
                    optional=optional)


def number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def real(data, key, where, *, optional=False) -> float | None:
    value = required(data, key, where)
    if value is None and optional:
        return None
    return number(value, f"{where}.{key}")


def samples(data, key, where) -> tuple[float, ...]:
    value = checked(data, key, where, lambda v: isinstance(v, list), "a list of times in ms")
    samples = tuple(number(v, f"{where}.{key}[{i}]") for i, v in enumerate(value))
    if any(s < 0 for s in samples):
        raise RecordError(f"{where}.{key}: times cannot be negative")
    return samples


def mapping(data, key, where, *, optional=False) -> dict | None:
    return checked(data, key, where, lambda v: isinstance(v, dict), "an object", optional=optional)


def listing(data, key, where) -> list:
    return checked(data, key, where, lambda v: isinstance(v, list), "a list")


def optional_number(value: Any, where: str) -> float | None:
    return None if value is None else number(value, where)


def point_profiling(value: Any, where: str) -> dict | None:
    """A profile result's profiler facts: null, {"error": why}, or {"kernels": [...], "totals": {...}}.

    Each kernel is {"id": ncu's launch id, "name": short name, "metrics": {metric: {"value": number,
    "unit": text}}}; totals are numbers or null (null where a metric was not reported).
    """
    if value is None:
        return None
    expect_object(value, where)
    if "error" in value:
        text(value, "error", where)
        if "kernels" in value:
            raise RecordError(f"{where}: holds both an error and kernels; expected one or the other")
        return dict(value)
    kernels = listing(value, "kernels", where)
    for i, kernel in enumerate(kernels):
        at = f"{where}.kernels[{i}]"
        expect_object(kernel, at)
        integer(kernel, "id", at)
        text(kernel, "name", at)
        for metric, reading in mapping(kernel, "metrics", at).items():
            expect_object(reading, f"{at}.metrics[{metric!r}]")
            number(required(reading, "value", f"{at}.metrics[{metric!r}]"), f"{at}.metrics[{metric!r}].value")
            text(reading, "unit", f"{at}.metrics[{metric!r}]")
    for key, total in mapping(value, "totals", where).items():
        optional_number(total, f"{where}.totals.{key}")
    return dict(value)


def run_profiling(value: Any, where: str) -> dict | None:
    """The run-level profiler block: null (not profiled) or an object whose `error` is null when the
    profiler gave data, else the reason it gave none; `command` and `ncu_version` say what was run."""
    if value is None:
        return None
    expect_object(value, where)
    error = text(value, "error", where, optional=True)
    command = listing(value, "command", where)
    if not all(isinstance(arg, str) for arg in command):
        raise RecordError(f"{where}.command: expected a list of strings")
    text(value, "ncu_version", where, optional=True)
    if error is None:
        metrics = listing(value, "metrics", where)
        if not all(isinstance(m, str) for m in metrics):
            raise RecordError(f"{where}.metrics: expected a list of metric names")
        integer(value, "calls", where)
        integer(value, "kernels", where)
    return dict(value)


