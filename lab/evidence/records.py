"""Run records: the schema, and the checks that turn a record's JSON into these dataclasses.

One run of one experiment on one device is one file, records/<slug>/<run-id>.json.gz (gzip-compressed
JSON; records/<slug>/<run-id>.json, the form before compression, reads alike), written once and never
changed. The file holds everything a page needs and everything a reader needs to judge it: raw samples,
the environment, the source hashes that tell whether the evidence is still current.

Reading never trusts a file: records come from machines the site does not control, and the site publishes
what they say. Each object of the schema is a table, field -> check (lab.evidence.checks), applied before
anything renders: types, ranges (finite, positive times; p20 <= p50 <= p80 within the samples), known
statuses, and names that reach file names and links (slugs, GPU keys, dtypes, profile and case names, run
ids) of one safe pattern. A record that fails raises a RecordError naming the field; lab.evidence.store
turns it into a RecordProblem (file + problem) and skips the file, so one bad file cannot hide the others.

A field added later is one line in its table: Absent(check, default) for a field that older records lack.
Profiler facts (lab.measure.profiling) are such optional fields: a run-level `profiling` block (absent or
null when the run was not profiled) and, per profile result, `profiling` (null where that point was not
profiled); so is the eager-call clock (lab.measure.eager): per profile result `eager`, per point
`eager_copies`, per run `eager` (the method), all absent or null in records made before it existed; and so
are the environment's `host` (runs since it was added), `worker` (runs made by a cluster worker,
lab.measure.cluster: where the scheduler placed it) and a profile result's `breakdown` (its kernel time op by
op, lab.measure.breakdown; experiments that declare a classifier only). Added with the clean L2 flush: the
timing's `l2_flush` ("zero" where absent: older runs zeroed the flush buffer), the run's `read_ceiling` and
`read2_write_ceiling` (null where absent), and a profile result's own `bytes_moved` (null: the point's).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from lab.evidence.checks import (MAX_MS, Absent, RecordError, case_name, dimension, fields, got, identifier, integer,
                                 list_of, mapping, number, one_of, optional, run_id, text, time_ms, utc_time)
from lab.evidence.record_parts import (ENVIRONMENT, GIT, HASHES, MAX_SAMPLES, breakdown, figure, plan, point_profiling,
                                       run_profiling, samples_ms)

from lab.evidence.methods import (  # noqa: F401 - re-exported: a record's parts are read from here
    CEILING_FIELDS, EAGER_METHOD_FIELDS, FLUSH_READ, FLUSH_ZERO, L2_FLUSHES, PEAK_FIELDS, TIMING_FIELDS, CopyCeiling,
    EagerMethod, MatmulPeak, TimingMethod)

SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = (1,)

STATUSES = ("ok", "incorrect", "error", "unsupported", "unavailable")
GPU_EVIDENCE = "gpu"
CPU_EVIDENCE = "cpu-interpreter: not performance evidence"
CPU_GPU_KEY = "cpu-interpreter"  # the GPU key of records made on the CPU through Triton's interpreter


def _build(cls, table, data: Any, where: str):
    """`cls` from the fields `table` reads out of `data`."""
    return cls(**table(data, where))


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
        result = _build(cls, EAGER_RESULT_FIELDS, data, where)
        if result.error is None:
            if not result.samples_ms or result.p50_ms is None:
                raise RecordError(f"{where}: an eager result without an error needs samples_ms and p50_ms")
            _percentiles_within(result, where)
        return result


EAGER_RESULT_FIELDS = fields({
    "samples_ms": samples_ms,
    "host_samples_ms": list_of(number(0.0, MAX_MS), max_length=MAX_SAMPLES),
    "calls_per_sample": integer(0, 1 << 32),
    "p20_ms": optional(time_ms),
    "p50_ms": optional(time_ms),
    "p80_ms": optional(time_ms),
    "host_p50_ms": optional(number(0.0, MAX_MS)),
    "gbps": optional(figure),
    "pct_of_ceiling": optional(figure),
    "tflops": optional(figure),
    "error": optional(text()),
})


def _percentiles_within(result, where: str) -> None:
    """p20 <= p50 <= p80 (those given), all within the samples: percentiles interpolate between them."""
    given = [p for p in (result.p20_ms, result.p50_ms, result.p80_ms) if p is not None]
    low, high = min(result.samples_ms), max(result.samples_ms)
    slack = 1e-9 * high
    if not all(low - slack <= a <= b <= high + slack for a, b in zip(given, given[1:] + given[-1:])):
        raise RecordError(f"{where}: expected min(samples_ms) <= p20_ms <= p50_ms <= p80_ms <= max(samples_ms), "
                          f"got {low!r}, {(result.p20_ms, result.p50_ms, result.p80_ms)}, {high!r}")


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
    `breakdown` holds its kernel time op by op (lab.measure.breakdown), None unless the experiment asks.
    `bytes_moved` is this profile's own byte model where the profile declares one (a quantised profile reads
    fewer weight bytes than the point's model counts); None: the point's `bytes_moved` (every older record).
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
    breakdown: dict | None = None
    bytes_moved: int | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "ProfileResult":
        result = _build(cls, RESULT_FIELDS, data, where)
        if result.status == "ok":
            if not result.samples_ms or None in (result.p20_ms, result.p50_ms, result.p80_ms):
                raise RecordError(f"{where}: status 'ok' needs samples_ms and p20_ms, p50_ms, p80_ms")
            _percentiles_within(result, where)
        return result


RESULT_FIELDS = fields({
    "status": one_of(*STATUSES),
    "plan": optional(plan),
    "samples_ms": samples_ms,
    "p20_ms": optional(time_ms),
    "p50_ms": optional(time_ms),
    "p80_ms": optional(time_ms),
    "gbps": optional(figure),
    "pct_of_ceiling": optional(figure),
    "tflops": optional(figure),
    "rel_error": optional(number(0.0, math.inf)),
    "error": optional(text()),
    "reason": optional(text()),
    "profiling": Absent(point_profiling),
    "eager": Absent(optional(EagerResult.from_dict)),
    "breakdown": Absent(breakdown),
    "bytes_moved": Absent(optional(integer(1))),
})


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
        point = _build(cls, POINT_FIELDS, data, where)
        rows = point.checked_rows
        if rows is not None and max(rows["first"], rows["last"]) > rows["of"]:
            raise RecordError(f"{where}.checked_rows: expected first and last within of, got {got(rows)}")
        return point


POINT_FIELDS = fields({
    "case": case_name,
    "shape": mapping(dimension, integer(0, 1 << 48), max_length=16),
    "dtype": identifier,
    "bytes_moved": integer(1),
    "flops": optional(integer()),
    "tolerance": number(0.0, 1e6, above=True),
    "input_seed": integer(0, 1 << 64),
    "checked_rows": optional(fields({"first": integer(), "last": integer(), "of": integer(1)})),
    "results": mapping(identifier, ProfileResult.from_dict, max_length=1000),
    "eager_copies": Absent(optional(integer(1, 1 << 32))),
})


def run_seconds(started_utc: str, finished_utc: str) -> float | None:
    """How long a run took, from its record's start and finish times (UTC, "...Z"); None if either is not
    such a time."""
    try:
        started, finished = (datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (started_utc, finished_utc))
    except (AttributeError, TypeError, ValueError):
        return None
    return max(0.0, (finished - started).total_seconds())


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
    matmul_peak: MatmulPeak | None = None  # measured on GPU runs since the roofline; None before, and on the CPU
    # Ceilings for other traffic than a copy's, measured since the clean flush; None in older records.
    read_ceiling: CopyCeiling | None = None  # reads alone (a large sum)
    read2_write_ceiling: CopyCeiling | None = None  # two reads to one write (an elementwise add)
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
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object at the top level, got {got(data)}")
        version = data.get("schema_version")
        if isinstance(version, bool) or version not in KNOWN_SCHEMA_VERSIONS:  # true == 1, but is no version
            known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
            raise RecordError(f"unknown schema_version {got(version)}; this lab reads version(s) {known}")
        record = cls(**RECORD_FIELDS(data, "record"), path=path)
        where = "record"
        if record.finished_utc < record.started_utc:
            raise RecordError(f"{where}: finished_utc {record.finished_utc} precedes started_utc {record.started_utc}")
        if (record.evidence == CPU_EVIDENCE) != (record.gpu_key == CPU_GPU_KEY):
            raise RecordError(f"{where}.evidence: {record.evidence!r} does not go with the GPU key {record.gpu_key!r} "
                              f"(runs on {CPU_GPU_KEY!r}, and only those, are {CPU_EVIDENCE!r})")
        seen = set()
        for i, point in enumerate(record.points):
            if (point.case, point.dtype) in seen:
                raise RecordError(f"{where}.points[{i}]: a second point at case {point.case!r}, dtype {point.dtype!r}")
            seen.add((point.case, point.dtype))
        return record


RECORD_FIELDS = fields({
    "schema_version": integer(),
    "run_id": run_id,
    "experiment": identifier,
    "started_utc": utc_time,
    "finished_utc": utc_time,
    "command": list_of(text(10_000), max_length=10_000),
    "git": GIT,
    "hashes": HASHES,
    "environment": ENVIRONMENT,
    "evidence": one_of(GPU_EVIDENCE, CPU_EVIDENCE),
    "copy_ceiling": CopyCeiling.from_dict,
    "timing": TimingMethod.from_dict,
    "points": list_of(Point.from_dict, max_length=100_000),
    "profiling": Absent(run_profiling),
    "eager": Absent(optional(EagerMethod.from_dict)),
    "matmul_peak": Absent(optional(MatmulPeak.from_dict)),
    "read_ceiling": Absent(optional(CopyCeiling.from_dict)),
    "read2_write_ceiling": Absent(optional(CopyCeiling.from_dict)),
})

SCHEMA_TABLES = {EagerResult: EAGER_RESULT_FIELDS, ProfileResult: RESULT_FIELDS, Point: POINT_FIELDS,
                 CopyCeiling: CEILING_FIELDS, MatmulPeak: PEAK_FIELDS, TimingMethod: TIMING_FIELDS, EagerMethod: EAGER_METHOD_FIELDS,
                 RunRecord: RECORD_FIELDS}
