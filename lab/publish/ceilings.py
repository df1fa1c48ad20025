"""What a point's throughput is a share of, and that share as the pages write it.

A memory-bound point is a share of the bandwidth ceiling, measured in the same run, that matches the traffic
its byte model counts (experiments.spec.Experiment.traffic): a copy (as many bytes read as written), reads
alone, or two reads to one write. A compute-bound point (experiments.spec.Experiment.bound) is a share of
the bf16 matmul peak measured in the same run, in TFLOP/s. Each figure names its roof ("87% of read"), so a
reader never meets an unnamed percentage.

Old records lack what later runs measure: a run without the declared ceiling falls back to its copy ceiling
and says so; a run without a matmul peak gives its TFLOP/s alone. A figure above its ceiling is marked
(ABOVE_MARK) and the page says why beside the table: the experiment's declared reason; else, where the copy
ceiling stands in for a ceiling of more reads than writes, that such traffic streams faster than a copy;
else, within SPREAD_PCT, the spread of the ceiling's own measurement; else that a byte model can count
bytes the L2 serves. A measured ceiling is what a plain operation reaches, not a law.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from experiments.spec import COMPUTE, COPY, MEMORY, READ, READ2_WRITE, Case, Experiment
from lab.evidence.records import CopyCeiling, Point, ProfileResult, RunRecord
from lab.publish import formatting as fmt

CEILING_NAMES = {COPY: "copy", READ: "read", READ2_WRITE: "2:1"}  # "<pct> of read", "the read ceiling"
CEILING_TRAFFIC = {COPY: "a device-to-device copy: read + write", READ: "a sum into one scalar: reads alone",
                   READ2_WRITE: "an elementwise add: two reads to one write"}
PEAK_NAME = "matmul peak"
ABOVE_MARK = "‡"
GENERIC_ABOVE = ("part of the traffic its byte model counts is served by the L2 rather than DRAM (operands small "
                 "enough to stay there between calls, or lines re-read by neighbouring blocks), so model bytes "
                 "over time can pass a ceiling measured on buffers far larger than the L2")

SPREAD_PCT = 3  # a figure this close above its ceiling is within the spread of the ceiling's own measurement
SPREAD_ABOVE = (f"by at most {SPREAD_PCT}%, within the spread of the ceiling's own measurement: the kernel streams "
                "as well as the plain operation timed for the ceiling")
STAND_IN_ABOVE = ("the copy ceiling stands in for the ceiling matching this traffic, and traffic with more reads "
                  "than writes streams faster than a copy")


@dataclass(frozen=True)
class Roof:
    """What a point is a share of: `bound` MEMORY (GB/s against the ceiling named `name`) or COMPUTE (TFLOP/s
    against the matmul peak); `value` None where the run did not measure it; `stand_in` where the copy
    ceiling stands in for a declared ceiling the run predates."""

    bound: str
    name: str
    value: float | None
    stand_in: bool = False


def run_ceiling(run: RunRecord, traffic: str) -> CopyCeiling | None:
    """The run's ceiling for `traffic` (None where the run predates it)."""
    return {COPY: run.copy_ceiling, READ: run.read_ceiling, READ2_WRITE: run.read2_write_ceiling}.get(traffic)


def point_bound(experiment: Experiment, point: Point) -> str:
    return experiment.bound_of(Case(point.case, dict(point.shape)))


def roof(experiment: Experiment, point: Point, run: RunRecord) -> Roof:
    if point_bound(experiment, point) == COMPUTE:
        return Roof(COMPUTE, PEAK_NAME, run.matmul_peak.tflops if run.matmul_peak is not None else None)
    ceiling = run_ceiling(run, experiment.traffic)
    if ceiling is None:
        return Roof(MEMORY, CEILING_NAMES[COPY], run.copy_ceiling.gbps, stand_in=True)
    return Roof(MEMORY, CEILING_NAMES[experiment.traffic], ceiling.gbps)


def moved_bytes(experiment: Experiment, point: Point, name: str | None, result: ProfileResult | None) -> int:
    """The bytes profile `name`'s GB/s divide: its own byte model where it has one (as recorded; else, for a
    record made before profiles recorded their own, as its declaration computes it from the point's shape
    and dtype), otherwise the point's."""
    own = getattr(result, "bytes_moved", None)
    if own:
        return own
    declared = next((p.bytes_moved for p in experiment.profiles if p.name == name), None)
    dtype = getattr(torch, point.dtype, None)
    if declared is None or not isinstance(dtype, torch.dtype):
        return point.bytes_moved
    try:
        value = declared(Case(point.case, dict(point.shape)), dtype)
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return point.bytes_moved
    valid = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if valid else point.bytes_moved


@dataclass(frozen=True)
class Share:
    """A figure and its share of its roof, as the page writes them: `rate` ("3,120 GB/s" or "512 TFLOP/s"),
    `pct` ("87% of read", "61% of matmul peak", a dash); `above` where the share passes 100%."""

    rate: str
    pct: str
    above: bool = False
    value: float | None = None  # the share in %, unrounded

    @property
    def cell(self) -> str:
        return f"{self.rate} ({self.pct})"


def share(experiment: Experiment, point: Point, run: RunRecord, name: str | None, result: ProfileResult | None,
          p50_ms: float | None) -> Share:
    """Profile `name`'s throughput at median `p50_ms` against its roof (see the module docstring)."""
    if result is None or p50_ms is None or p50_ms <= 0:
        return Share(fmt.DASH, fmt.DASH)
    top = roof(experiment, point, run)
    if top.bound == COMPUTE:
        if not point.flops:
            return Share(fmt.DASH, fmt.DASH)
        tflops = point.flops / (p50_ms * 1e-3) / 1e12
        rate = f"{fmt.tflops(tflops)} TFLOP/s"
        if top.value is None:
            return Share(rate, f"no {PEAK_NAME} in this run")
        return _share(rate, 100 * tflops / top.value, top.name)
    gbps = moved_bytes(experiment, point, name, result) / (p50_ms * 1e-3) / 1e9
    return _share(f"{fmt.gbps(gbps)} GB/s", 100 * gbps / top.value, top.name)


def _share(rate: str, pct: float, name: str) -> Share:
    above = pct > 100
    return Share(rate, f"{fmt.percent(pct)} of {name}{ABOVE_MARK if above else ''}", above, pct)


def notes(experiment: Experiment, run: RunRecord, shares: list[Share], points: list[Point]) -> str:
    """The sentences a table of `shares` needs under it: why a figure is above its ceiling, and which roof
    stands in where the run predates the declared one. Empty when nothing needs saying."""
    said = []
    memory = [p for p in points if point_bound(experiment, p) == MEMORY]
    stand_in = bool(memory) and experiment.traffic != COPY and run_ceiling(run, experiment.traffic) is None
    above = [s.value for s in shares if s.above]
    if above:
        close = max(above) <= 100 + SPREAD_PCT
        why = experiment.above_ceiling or (STAND_IN_ABOVE if stand_in else SPREAD_ABOVE if close else GENERIC_ABOVE)
        said.append(f"{ABOVE_MARK} Above its ceiling: {why}.")
    if stand_in:
        said.append(f"This run predates the {CEILING_NAMES[experiment.traffic]} ceiling that matches this "
                    f"experiment's traffic ({CEILING_TRAFFIC[experiment.traffic]}): its memory-bound figures are "
                    "shares of its copy ceiling.")
    return " ".join(said)


def ceilings_text(run: RunRecord) -> str:
    """Every ceiling and peak the run measured, for its run facts."""
    parts = []
    for traffic in (COPY, READ, READ2_WRITE):
        c = run_ceiling(run, traffic)
        if c is not None:
            parts.append(f"{CEILING_NAMES[traffic]} {fmt.gbps(c.gbps)} GB/s ({CEILING_TRAFFIC[traffic]}, "
                         f"{fmt.size_bytes(c.bytes_copied)} buffers, median of {len(c.samples_ms)})")
    if run.matmul_peak is not None:
        p = run.matmul_peak
        parts.append(f"{PEAK_NAME} {fmt.tflops(p.tflops)} TFLOP/s ({p.dtype} {p.m}×{p.n}×{p.k}, "
                     f"median of {len(p.samples_ms)})")
    return "; ".join(parts)
