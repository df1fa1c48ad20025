"""The parts of a run record that say how it measured: the ceilings and the matmul peak measured in the same
run, and the two clocks' methods (lab.measure.timing, lab.measure.eager). lab.evidence.records reads them
as part of a record, and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.evidence.checks import Absent, RecordError, fields, integer, identifier, list_of, number, one_of, time_ms
from lab.evidence.record_parts import MAX_SAMPLES, short_text

# How the L2 was emptied before each timed call (lab.measure.timing). "zero": a buffer twice the L2 written with
# zeros, which leaves the L2 full of dirty lines the timed call must write back first (every record made before
# the field existed). "read": that buffer only read (a sum into one scalar), which leaves clean lines.
FLUSH_ZERO = "zero"
FLUSH_READ = "read"
L2_FLUSHES = (FLUSH_ZERO, FLUSH_READ)


def _build(cls, table, data: Any, where: str):
    return cls(**table(data, where))


@dataclass(frozen=True)
class CopyCeiling:
    """A bandwidth ceiling measured in the same run: the bytes one call moves over the median sample.

    The copy ceiling is a device-to-device copy (read + write); the read ceiling a sum of a large buffer into
    one scalar (reads alone); the 2:1 ceiling an elementwise add (two reads, one write). `bytes_copied` is
    the size of the one buffer each reads or writes.
    """

    gbps: float
    bytes_copied: int
    samples_ms: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "CopyCeiling":
        return _build(cls, CEILING_FIELDS, data, where)


CEILING_FIELDS = fields({
    "gbps": number(0.0, 1e9, above=True),
    "bytes_copied": integer(1),
    "samples_ms": list_of(time_ms, min_length=1, max_length=MAX_SAMPLES),
})


@dataclass(frozen=True)
class MatmulPeak:
    """A dense matmul's TFLOP/s in the same run (the roofline's flat roof): 2·m·n·k over the median sample."""

    tflops: float
    m: int
    n: int
    k: int
    dtype: str
    samples_ms: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "MatmulPeak":
        peak = _build(cls, PEAK_FIELDS, data, where)
        implied = 2 * peak.m * peak.n * peak.k / (sorted(peak.samples_ms)[len(peak.samples_ms) // 2] * 1e-3) / 1e12
        if not 0.5 * implied <= peak.tflops <= 2 * implied:
            raise RecordError(f"{where}.tflops: {peak.tflops!r} does not follow from 2·m·n·k over the samples' median "
                              f"(about {implied:.4g})")
        return peak


PEAK_FIELDS = fields({
    "tflops": number(0.0, 1e6, above=True),
    "m": integer(1, 1 << 20),
    "n": integer(1, 1 << 20),
    "k": integer(1, 1 << 20),
    "dtype": identifier,
    "samples_ms": list_of(time_ms, min_length=1, max_length=MAX_SAMPLES),
})


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
    l2_flush: str = FLUSH_ZERO  # FLUSH_ZERO or FLUSH_READ; records made before the field existed zeroed the buffer

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "TimingMethod":
        timing = _build(cls, TIMING_FIELDS, data, where)
        if timing.min_samples > timing.max_samples:
            raise RecordError(f"{where}: min_samples {timing.min_samples} exceeds max_samples {timing.max_samples}")
        return timing


TIMING_FIELDS = fields({
    "clock": short_text,
    "l2_flush_bytes": integer(),
    "warmup_rounds": integer(0, 1_000_000),
    "min_samples": integer(1, MAX_SAMPLES),
    "max_samples": integer(1, MAX_SAMPLES),
    "target_seconds": number(0.0, 1e6),
    "order": short_text,
    "l2_flush": Absent(one_of(*L2_FLUSHES), FLUSH_ZERO),
})


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
        method = _build(cls, EAGER_METHOD_FIELDS, data, where)
        if method.min_calls > method.max_calls:
            raise RecordError(f"{where}: min_calls {method.min_calls} exceeds max_calls {method.max_calls}")
        return method


EAGER_METHOD_FIELDS = fields({
    "clock": short_text,
    "copies_past_bytes": integer(),
    "warmup_rounds": integer(0, 1_000_000),
    "samples": integer(0, MAX_SAMPLES),
    "batch_seconds": number(0.0, 1e6),
    "min_calls": integer(0, 1 << 32),
    "max_calls": integer(0, 1 << 32),
    "host_batch_max": integer(0, 1 << 32),
})
