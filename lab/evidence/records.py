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

The environment's `host` (runs since it was added) and `worker` (runs made by a cluster worker,
lab.measure.cluster: where the scheduler placed it) are optional too, and checked when present.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.evidence.fields import (
    RecordError,
    required,
    checked,
    expect_object,
    text,
    integer,
    number,
    real,
    samples,
    mapping,
    listing,
    optional_number,
    point_profiling,
    run_profiling,
)

SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = (1,)

STATUSES = ("ok", "incorrect", "error", "unsupported", "unavailable")
GPU_EVIDENCE = "gpu"
CPU_EVIDENCE = "cpu-interpreter: not performance evidence"
CPU_GPU_KEY = "cpu-interpreter"  # the GPU key of records made on the CPU through Triton's interpreter


def worker_placement(value: Any, where: str) -> dict:
    """A cluster worker's placement: {"scheduler": name, "version": text, "node_id": text or null,
    "gpu_ids": [text, ...]}."""
    expect_object(value, where)
    text(value, "scheduler", where)
    text(value, "version", where)
    text(value, "node_id", where, optional=True)
    if not all(isinstance(i, str) for i in listing(value, "gpu_ids", where)):
        raise RecordError(f"{where}.gpu_ids: expected a list of strings")
    return dict(value)


# --------------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EagerResult:
    """One profile at one point on the eager-call clock (lab.measure.eager): what a Python program calling it
    back to back pays per call, host work included.

    samples_ms: eager ms per call, one value per batch of `calls_per_sample` calls; host_samples_ms: host ms
    per call to issue the same batches (the GPU never the limit). p20/p50/p80 and the throughput figures
    derive from samples_ms. `error` holds why a profile that ran on the GPU-time clock failed on this one
    (then the samples are empty).
    """

    samples_ms: tuple[float, ...]
    host_samples_ms: tuple[float, ...]
    calls_per_sample: int
    p20_ms: float | None = None
    p50_ms: float | None = None
    p80_ms: float | None = None
    host_p50_ms: float | None = None
    gbps: float | None = None
    pct_of_ceiling: float | None = None
    tflops: float | None = None
    error: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "EagerResult":
        expect_object(data, where)
        result = cls(
            samples_ms=samples(data, "samples_ms", where),
            host_samples_ms=samples(data, "host_samples_ms", where),
            calls_per_sample=integer(data, "calls_per_sample", where),
            p20_ms=real(data, "p20_ms", where, optional=True),
            p50_ms=real(data, "p50_ms", where, optional=True),
            p80_ms=real(data, "p80_ms", where, optional=True),
            host_p50_ms=real(data, "host_p50_ms", where, optional=True),
            gbps=real(data, "gbps", where, optional=True),
            pct_of_ceiling=real(data, "pct_of_ceiling", where, optional=True),
            tflops=real(data, "tflops", where, optional=True),
            error=text(data, "error", where, optional=True),
        )
        if result.error is None and (not result.samples_ms or result.p50_ms is None):
            raise RecordError(f"{where}: an eager result without an error needs samples_ms and p50_ms")
        return result


@dataclass(frozen=True)
class ProfileResult:
    """One profile at one case and dtype.

    status: "ok" (correct and timed), "incorrect" (failed the accuracy check: not timed, never in a
    verdict), "error" (raised: `error` holds the exception), "unsupported" (the profile declines the
    case: `reason`), "unavailable" (an optional peer that does not import: `reason`).
    samples_ms are the raw per-call times; p20/p50/p80 and the throughput figures derive from them.
    `profiling` holds this point's profiler facts (lab.measure.profiling: Nsight Compute's kernels and their
    totals, or why there are none) and is None where the point was not profiled. `eager` holds the same
    profile on the eager-call clock; None in records made before that clock existed (GPU time only).
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
    eager: EagerResult | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "ProfileResult":
        expect_object(data, where)
        status = text(data, "status", where)
        if status not in STATUSES:
            raise RecordError(f"{where}.status: {status!r} is not one of {', '.join(STATUSES)}")
        result = cls(
            status=status,
            plan=mapping(data, "plan", where, optional=True),
            samples_ms=samples(data, "samples_ms", where),
            p20_ms=real(data, "p20_ms", where, optional=True),
            p50_ms=real(data, "p50_ms", where, optional=True),
            p80_ms=real(data, "p80_ms", where, optional=True),
            gbps=real(data, "gbps", where, optional=True),
            pct_of_ceiling=real(data, "pct_of_ceiling", where, optional=True),
            tflops=real(data, "tflops", where, optional=True),
            rel_error=real(data, "rel_error", where, optional=True),
            error=text(data, "error", where, optional=True),
            reason=text(data, "reason", where, optional=True),
            profiling=point_profiling(data.get("profiling"), f"{where}.profiling"),
            eager=(EagerResult.from_dict(data["eager"], f"{where}.eager") if data.get("eager") is not None
                   else None),
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
    eager_copies: int | None = None  # input copies the eager-call clock cycled through (None: not measured)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Point":
        expect_object(data, where)
        shape = mapping(data, "shape", where)
        for dim, size in shape.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise RecordError(f"{where}.shape.{dim}: expected an integer, got {size!r}")
        results = mapping(data, "results", where)
        return cls(
            case=text(data, "case", where),
            shape=dict(shape),
            dtype=text(data, "dtype", where),
            bytes_moved=integer(data, "bytes_moved", where),
            flops=integer(data, "flops", where, optional=True),
            tolerance=real(data, "tolerance", where),
            input_seed=integer(data, "input_seed", where),
            checked_rows=mapping(data, "checked_rows", where, optional=True),
            results={
                name: ProfileResult.from_dict(result, f"{where}.results[{name!r}]")
                for name, result in results.items()
            },
            eager_copies=integer(data, "eager_copies", where, optional=True) if "eager_copies" in data else None,
        )


@dataclass(frozen=True)
class CopyCeiling:
    """The device-to-device copy bandwidth measured in the same run: read + write bytes over the median."""

    gbps: float
    bytes_copied: int
    samples_ms: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "CopyCeiling":
        expect_object(data, where)
        return cls(
            gbps=real(data, "gbps", where),
            bytes_copied=integer(data, "bytes_copied", where),
            samples_ms=samples(data, "samples_ms", where),
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
        expect_object(data, where)
        return cls(
            clock=text(data, "clock", where),
            l2_flush_bytes=integer(data, "l2_flush_bytes", where),
            warmup_rounds=integer(data, "warmup_rounds", where),
            min_samples=integer(data, "min_samples", where),
            max_samples=integer(data, "max_samples", where),
            target_seconds=real(data, "target_seconds", where),
            order=text(data, "order", where),
        )


@dataclass(frozen=True)
class EagerMethod:
    """How the eager-call clock took its samples (lab.measure.eager): calls per batch between `min_calls` and
    `max_calls` (as many as fill about `batch_seconds`), `samples` batches per profile after `warmup_rounds`,
    inputs cycled through copies past `copies_past_bytes`, host time over the first `host_batch_max` calls."""

    clock: str
    copies_past_bytes: int
    warmup_rounds: int
    samples: int
    batch_seconds: float
    min_calls: int
    max_calls: int
    host_batch_max: int

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "EagerMethod":
        expect_object(data, where)
        return cls(
            clock=text(data, "clock", where),
            copies_past_bytes=integer(data, "copies_past_bytes", where),
            warmup_rounds=integer(data, "warmup_rounds", where),
            samples=integer(data, "samples", where),
            batch_seconds=real(data, "batch_seconds", where),
            min_calls=integer(data, "min_calls", where),
            max_calls=integer(data, "max_calls", where),
            host_batch_max=integer(data, "host_batch_max", where),
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
    eager: EagerMethod | None = None  # the eager-call clock's method; None in records made before it existed
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
        version = required(data, "schema_version", where)
        if version not in KNOWN_SCHEMA_VERSIONS:
            known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
            raise RecordError(f"unknown schema_version {version!r}; this lab reads version(s) {known}")
        command = listing(data, "command", where)
        if not all(isinstance(arg, str) for arg in command):
            raise RecordError(f"{where}.command: expected a list of strings")
        hashes = mapping(data, "hashes", where)
        if not all(isinstance(v, str) for v in hashes.values()):
            raise RecordError(f"{where}.hashes: expected path -> sha256 strings")
        environment = mapping(data, "environment", where)
        text(environment, "gpu_key", f"{where}.environment")
        text(environment, "gpu_name", f"{where}.environment")
        if "host" in environment:
            text(environment, "host", f"{where}.environment")
        if "worker" in environment:
            worker_placement(environment["worker"], f"{where}.environment.worker")
        evidence = text(data, "evidence", where)
        if evidence not in (GPU_EVIDENCE, CPU_EVIDENCE):
            raise RecordError(f"{where}.evidence: expected {GPU_EVIDENCE!r} or {CPU_EVIDENCE!r}, got {evidence!r}")
        git = mapping(data, "git", where)
        text(git, "commit", f"{where}.git", optional=True)
        return cls(
            schema_version=version,
            run_id=text(data, "run_id", where),
            experiment=text(data, "experiment", where),
            started_utc=text(data, "started_utc", where),
            finished_utc=text(data, "finished_utc", where),
            command=tuple(command),
            git=dict(git),
            hashes=dict(hashes),
            environment=dict(environment),
            evidence=evidence,
            copy_ceiling=CopyCeiling.from_dict(required(data, "copy_ceiling", where), f"{where}.copy_ceiling"),
            timing=TimingMethod.from_dict(required(data, "timing", where), f"{where}.timing"),
            points=tuple(
                Point.from_dict(p, f"{where}.points[{i}]") for i, p in enumerate(listing(data, "points", where))
            ),
            profiling=run_profiling(data.get("profiling"), f"{where}.profiling"),
            eager=(EagerMethod.from_dict(data["eager"], f"{where}.eager") if data.get("eager") is not None
                   else None),
            path=path,
        )
