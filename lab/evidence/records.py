"""Run records: the schema, and the checks that turn a record's JSON into these dataclasses.

One run of one experiment on one device is one JSON file, records/<slug>/<run-id>.json, written once and
never changed. The file holds everything a page needs and everything a reader needs to judge it: raw
samples, the environment, the source hashes that tell whether the evidence is still current.

Reading never trusts a file: a record that misses a field, has a field of the wrong type or carries an
unknown schema version raises a RecordError naming the field; lab.evidence.store turns it into a
RecordProblem (file + problem) and skips the file, so one bad file cannot hide the others.

Profiler facts (lab.measure.profiling) are optional in schema version 1: a run-level `profiling` block (absent or
null when the run was not profiled; records written before it existed simply lack the key) and, per
profile result, `profiling` (null where that point was not profiled). Both are checked as strictly as the
rest when present.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = (1,)

STATUSES = ("ok", "incorrect", "error", "unsupported", "unavailable")
GPU_EVIDENCE = "gpu"
CPU_EVIDENCE = "cpu-interpreter: not performance evidence"
CPU_GPU_KEY = "cpu-interpreter"  # the GPU key of records made on the CPU through Triton's interpreter


class RecordError(ValueError):
    """A record's content does not match the schema; the message names the field and what was expected."""


# --------------------------------------------------------------------------------------------------------
# Field checks: each names the field's path in the record and what it accepts
# --------------------------------------------------------------------------------------------------------


def _field(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise RecordError(f"{where}: missing field {key!r}")
    return data[key]


def _checked(data, key, where, accepts, expected: str, *, optional=False) -> Any:
    """data[key] when `accepts` it (None too when optional), else a RecordError naming what was expected."""
    value = _field(data, key, where)
    if value is None and optional:
        return None
    if not accepts(value):
        raise RecordError(f"{where}.{key}: expected {expected}, got {type(value).__name__}")
    return value


def _object(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object, got {type(data).__name__}")


def _str(data, key, where, *, optional=False) -> str | None:
    return _checked(data, key, where, lambda v: isinstance(v, str), "a string", optional=optional)


def _int(data, key, where, *, optional=False) -> int | None:
    return _checked(data, key, where, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer",
                    optional=optional)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _float(data, key, where, *, optional=False) -> float | None:
    value = _field(data, key, where)
    if value is None and optional:
        return None
    return _number(value, f"{where}.{key}")


def _samples(data, key, where) -> tuple[float, ...]:
    value = _checked(data, key, where, lambda v: isinstance(v, list), "a list of times in ms")
    samples = tuple(_number(v, f"{where}.{key}[{i}]") for i, v in enumerate(value))
    if any(s < 0 for s in samples):
        raise RecordError(f"{where}.{key}: times cannot be negative")
    return samples


def _dict(data, key, where, *, optional=False) -> dict | None:
    return _checked(data, key, where, lambda v: isinstance(v, dict), "an object", optional=optional)


def _list(data, key, where) -> list:
    return _checked(data, key, where, lambda v: isinstance(v, list), "a list")


def _optional_number(value: Any, where: str) -> float | None:
    return None if value is None else _number(value, where)


def _point_profiling(value: Any, where: str) -> dict | None:
    """A profile result's profiler facts: null, {"error": why}, or {"kernels": [...], "totals": {...}}.

    Each kernel is {"id": ncu's launch id, "name": short name, "metrics": {metric: {"value": number,
    "unit": text}}}; totals are numbers or null (null where a metric was not reported).
    """
    if value is None:
        return None
    _object(value, where)
    if "error" in value:
        _str(value, "error", where)
        if "kernels" in value:
            raise RecordError(f"{where}: holds both an error and kernels; expected one or the other")
        return dict(value)
    kernels = _list(value, "kernels", where)
    for i, kernel in enumerate(kernels):
        at = f"{where}.kernels[{i}]"
        _object(kernel, at)
        _int(kernel, "id", at)
        _str(kernel, "name", at)
        for metric, reading in _dict(kernel, "metrics", at).items():
            _object(reading, f"{at}.metrics[{metric!r}]")
            _number(_field(reading, "value", f"{at}.metrics[{metric!r}]"), f"{at}.metrics[{metric!r}].value")
            _str(reading, "unit", f"{at}.metrics[{metric!r}]")
    for key, total in _dict(value, "totals", where).items():
        _optional_number(total, f"{where}.totals.{key}")
    return dict(value)


def _run_profiling(value: Any, where: str) -> dict | None:
    """The run-level profiler block: null (not profiled) or an object whose `error` is null when the
    profiler gave data, else the reason it gave none; `command` and `ncu_version` say what was run."""
    if value is None:
        return None
    _object(value, where)
    error = _str(value, "error", where, optional=True)
    command = _list(value, "command", where)
    if not all(isinstance(arg, str) for arg in command):
        raise RecordError(f"{where}.command: expected a list of strings")
    _str(value, "ncu_version", where, optional=True)
    if error is None:
        metrics = _list(value, "metrics", where)
        if not all(isinstance(m, str) for m in metrics):
            raise RecordError(f"{where}.metrics: expected a list of metric names")
        _int(value, "calls", where)
        _int(value, "kernels", where)
    return dict(value)


# --------------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileResult:
    """One profile at one case and dtype.

    status: "ok" (correct and timed), "incorrect" (failed the accuracy check: not timed, never in a
    verdict), "error" (raised: `error` holds the exception), "unsupported" (the profile declines the
    case: `reason`), "unavailable" (an optional peer that does not import: `reason`).
    samples_ms are the raw per-call times; p20/p50/p80 and the throughput figures derive from them.
    `profiling` holds this point's profiler facts (lab.measure.profiling: Nsight Compute's kernels and their
    totals, or why there are none) and is None where the point was not profiled.
    """

    status: str
    plan: dict | None = None
    samples_ms: tuple[float, ...] = ()
    p20_ms: float | None = None
    p50_ms: float | None = None
    p80_ms: float | None = None
    gbps: float | None = None
    pct_of_ceiling: float | None = None
    tflops: float | None = None
    rel_error: float | None = None
    error: str | None = None
    reason: str | None = None
    profiling: dict | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "ProfileResult":
        _object(data, where)
        status = _str(data, "status", where)
        if status not in STATUSES:
            raise RecordError(f"{where}.status: {status!r} is not one of {', '.join(STATUSES)}")
        result = cls(
            status=status,
            plan=_dict(data, "plan", where, optional=True),
            samples_ms=_samples(data, "samples_ms", where),
            p20_ms=_float(data, "p20_ms", where, optional=True),
            p50_ms=_float(data, "p50_ms", where, optional=True),
            p80_ms=_float(data, "p80_ms", where, optional=True),
            gbps=_float(data, "gbps", where, optional=True),
            pct_of_ceiling=_float(data, "pct_of_ceiling", where, optional=True),
            tflops=_float(data, "tflops", where, optional=True),
            rel_error=_float(data, "rel_error", where, optional=True),
            error=_str(data, "error", where, optional=True),
            reason=_str(data, "reason", where, optional=True),
            profiling=_point_profiling(data.get("profiling"), f"{where}.profiling"),
        )
        if status == "ok" and (not result.samples_ms or result.p50_ms is None):
            raise RecordError(f"{where}: status 'ok' needs samples_ms and p50_ms")
        return result


@dataclass(frozen=True)
class Point:
    """One case at one dtype: the inputs every profile shared and each profile's result.

    checked_rows: None when the accuracy check covered every row, else {"first": k, "last": k, "of": M}.
    """

    case: str
    shape: dict[str, int]
    dtype: str
    bytes_moved: int
    flops: int | None
    tolerance: float
    input_seed: int
    checked_rows: dict | None
    results: dict[str, ProfileResult]

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Point":
        _object(data, where)
        shape = _dict(data, "shape", where)
        for dim, size in shape.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise RecordError(f"{where}.shape.{dim}: expected an integer, got {size!r}")
        results = _dict(data, "results", where)
        return cls(
            case=_str(data, "case", where),
            shape=dict(shape),
            dtype=_str(data, "dtype", where),
            bytes_moved=_int(data, "bytes_moved", where),
            flops=_int(data, "flops", where, optional=True),
            tolerance=_float(data, "tolerance", where),
            input_seed=_int(data, "input_seed", where),
            checked_rows=_dict(data, "checked_rows", where, optional=True),
            results={
                name: ProfileResult.from_dict(result, f"{where}.results[{name!r}]")
                for name, result in results.items()
            },
        )


@dataclass(frozen=True)
class CopyCeiling:
    """The device-to-device copy bandwidth measured in the same run: read + write bytes over the median."""

    gbps: float
    bytes_copied: int
    samples_ms: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "CopyCeiling":
        _object(data, where)
        return cls(
            gbps=_float(data, "gbps", where),
            bytes_copied=_int(data, "bytes_copied", where),
            samples_ms=_samples(data, "samples_ms", where),
        )


@dataclass(frozen=True)
class TimingMethod:
    """How the samples were taken, so a reader can judge (and a later run can repeat) them."""

    clock: str  # the clock's name in lab.measure.timing, e.g. "wall-clock" or "cuda-events, device held while ..."
    l2_flush_bytes: int
    warmup_rounds: int
    min_samples: int
    max_samples: int
    target_seconds: float
    order: str

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "TimingMethod":
        _object(data, where)
        return cls(
            clock=_str(data, "clock", where),
            l2_flush_bytes=_int(data, "l2_flush_bytes", where),
            warmup_rounds=_int(data, "warmup_rounds", where),
            min_samples=_int(data, "min_samples", where),
            max_samples=_int(data, "max_samples", where),
            target_seconds=_float(data, "target_seconds", where),
            order=_str(data, "order", where),
        )


@dataclass(frozen=True)
class RunRecord:
    """One run of one experiment on one device (the whole file).

    `profiling` is the run-level block of a run made with the profiler (lab.measure.profiling), None otherwise.
    """

    schema_version: int
    run_id: str
    experiment: str
    started_utc: str
    finished_utc: str
    command: tuple[str, ...]
    git: dict
    hashes: dict[str, str]
    environment: dict
    evidence: str
    copy_ceiling: CopyCeiling
    timing: TimingMethod
    points: tuple[Point, ...]
    profiling: dict | None = None
    path: Path | None = field(default=None, compare=False)

    @property
    def gpu_key(self) -> str:
        return self.environment["gpu_key"]

    @property
    def gpu_name(self) -> str:
        return self.environment["gpu_name"]

    @property
    def is_performance_evidence(self) -> bool:
        return self.evidence == GPU_EVIDENCE

    def to_json(self) -> str:
        """The file's text: sorted keys and an indent, so a diff of two records reads line by line."""
        data = asdict(self)
        del data["path"]
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, path: Path | None = None) -> "RunRecord":
        where = "record"
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object at the top level, got {type(data).__name__}")
        version = _field(data, "schema_version", where)
        if version not in KNOWN_SCHEMA_VERSIONS:
            known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
            raise RecordError(f"unknown schema_version {version!r}; this lab reads version(s) {known}")
        command = _list(data, "command", where)
        if not all(isinstance(arg, str) for arg in command):
            raise RecordError(f"{where}.command: expected a list of strings")
        hashes = _dict(data, "hashes", where)
        if not all(isinstance(v, str) for v in hashes.values()):
            raise RecordError(f"{where}.hashes: expected path -> sha256 strings")
        environment = _dict(data, "environment", where)
        _str(environment, "gpu_key", f"{where}.environment")
        _str(environment, "gpu_name", f"{where}.environment")
        evidence = _str(data, "evidence", where)
        if evidence not in (GPU_EVIDENCE, CPU_EVIDENCE):
            raise RecordError(f"{where}.evidence: expected {GPU_EVIDENCE!r} or {CPU_EVIDENCE!r}, got {evidence!r}")
        git = _dict(data, "git", where)
        _str(git, "commit", f"{where}.git", optional=True)
        return cls(
            schema_version=version,
            run_id=_str(data, "run_id", where),
            experiment=_str(data, "experiment", where),
            started_utc=_str(data, "started_utc", where),
            finished_utc=_str(data, "finished_utc", where),
            command=tuple(command),
            git=dict(git),
            hashes=dict(hashes),
            environment=dict(environment),
            evidence=evidence,
            copy_ceiling=CopyCeiling.from_dict(_field(data, "copy_ceiling", where), f"{where}.copy_ceiling"),
            timing=TimingMethod.from_dict(_field(data, "timing", where), f"{where}.timing"),
            points=tuple(
                Point.from_dict(p, f"{where}.points[{i}]") for i, p in enumerate(_list(data, "points", where))
            ),
            profiling=_run_profiling(data.get("profiling"), f"{where}.profiling"),
            path=path,
        )
