"""The shape of a declared experiment. Declarations are data: the lab machinery runs and judges them.

An experiment asks one question and tests one claim: "<subject> is at least as fast as <baselines>" (a
parity claim) or "<subject> is faster than <baselines>" (a win claim). Each case is an input shape; each
profile an implementation timed doing the same work on the same inputs. The byte model turns a median time
into model throughput (GB/s); the decision rule (lab.evidence.verdict) turns speedups into a verdict, with
the claim's margin saying how close to 1 a speedup must be to count as a tie.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

Inputs = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Case:
    """One input shape. `shape` names its dimensions, e.g. {"M": 4096, "N": 1024}."""

    name: str
    shape: Mapping[str, int]
    description: str = ""

    def __getitem__(self, dim: str) -> int:
        return self.shape[dim]


@dataclass(frozen=True)
class Profile:
    """One implementation under test.

    run: called with the experiment's inputs as keyword arguments; returns the output tensor, or a tuple of
        tensors when the operation has several outputs (the reference then returns as many).
    sources: repository paths whose contents define this profile (hashed into every record: a change
        marks old evidence stale).
    plan: the launch plan it will use for a case and dtype, recorded beside the timing (None if opaque).
    unsupported: a reason this profile cannot run a case and dtype (e.g. a peer's size limit), or None.
    requires: an importable module the profile needs (an optional peer); missing means "unavailable".
    requires_note: what a reader needs to know when `requires` does not import (how the peer is installed,
        what it depends on); added to the "unavailable" reason.
    tolerance: this profile's own accepted error per dtype, for a profile that computes a declared
        approximation (weight-only quantisation); None: the experiment's.
    warm: called once with each set of inputs the eager-call clock will cycle through, before any of them is
        timed (e.g. to capture a CUDA graph per input set); None: nothing to prepare.
    bytes_moved: this profile's own byte model, for a profile that moves other bytes than the experiment's
        model counts for the same work (weight-only quantisation reads int8 or int4 weights and their scales);
        None: the experiment's.
    """

    name: str
    description: str
    run: Callable[..., torch.Tensor]
    sources: tuple[str, ...] = ()
    plan: Callable[[Case, torch.dtype], Mapping[str, Any] | None] | None = None
    unsupported: Callable[[Case, torch.dtype], str | None] | None = None
    requires: str | None = None
    requires_note: str | None = None
    tolerance: Mapping[torch.dtype, float] | None = None
    warm: Callable[..., None] | None = None
    bytes_moved: Callable[[Case, torch.dtype], int] | None = None


POINT_COLUMN_UNITS = ("bytes", "count")


@dataclass(frozen=True)
class PointColumn:
    """A model quantity an experiment's points tables show in a column of its own, one value a point (e.g. the
    bytes an unfused path writes for its intermediate, beside the byte model of the fused one).

    value: the quantity at a case and dtype, or None where it does not apply. The page computes it when it
        renders, from each point's recorded shape and dtype, so the figure follows from the record; a shape
        the function cannot read (an older record's) shows a dash. value=None: the point's recorded byte
        model (bytes_moved), the bytes its GB/s figures divide.
    meaning: one line under the table saying what the column counts.
    unit: "bytes" (written in KiB, MiB or GiB) or "count" (a whole number).
    """

    title: str
    meaning: str
    value: Callable[[Case, torch.dtype], int | None] | None = None
    unit: str = "bytes"

    def __post_init__(self):
        if self.unit not in POINT_COLUMN_UNITS:
            raise ValueError(f"PointColumn.unit {self.unit!r}: expected one of {', '.join(POINT_COLUMN_UNITS)}")


# A margin is a measured spread of log ratios: the tie band runs from 1/(1 + m) to 1 + m. The eager-call clock of
# microsecond calls can move by a factor of two between runs; a margin past this many times 1 is a typo.
MAX_MARGIN = 4.0


@dataclass(frozen=True)
class Margin:
    """How close to 1 a speedup must lie to count as a tie: ± `fraction` (0.015 is ±1.5%).

    Measured, not chosen: the run-to-run spread of the claim's speedup when unchanged code is timed twice
    (tools/derive_margin.py writes it, with `basis` saying what it was derived from, to experiments/margins.json).
    `fraction` and `basis` are the GPU-time clock's; `eager` is the eager-call clock's own margin, measured from
    that clock's spread (None: the eager-call clock is judged with this one).
    """

    fraction: float
    basis: str
    eager: "Margin | None" = None

    def __post_init__(self):
        if not 0 <= self.fraction < MAX_MARGIN:
            raise ValueError(f"Margin.fraction {self.fraction!r}: expected a fraction in [0, {MAX_MARGIN:g}), e.g. 0.015 "
                             "for ±1.5%")
        if self.eager is not None and self.eager.eager is not None:
            raise ValueError("Margin.eager is one clock's margin: it holds no margin of its own")


NO_MARGIN = Margin(0.0, "no margin declared: only an interval of exactly 1 counts as a tie")

# The two clocks a claim can be judged on (lab.measure.timing and lab.measure.eager). A claim names the one its
# statement speaks of; pages show the verdict on that clock first, the other beside it, labelled.
GPU_TIME = "gpu-time"  # what the GPU spends per call, host work hidden: how good the kernel is
EAGER_CALL = "eager-call"  # what a Python program calling the op back to back pays per call, host included
CLOCKS = (GPU_TIME, EAGER_CALL)

PARITY = "parity"  # "<subject> is at least as fast as <baselines>": a tie within the margin meets it
WIN = "win"  # "<subject> is faster than <baselines>" (by `threshold` or more): a tie does not
CLAIM_KINDS = (PARITY, WIN)


@dataclass(frozen=True)
class Claim:
    """The claim about speedup = best baseline's median / subject's median, at every case and dtype.

    kind: PARITY ("at least as fast": every point Faster or Level supports it) or WIN ("faster", by at
        least `threshold`: every point must be Faster with its interval's lower bound >= threshold).
    clock: the clock the statement speaks of, GPU_TIME or EAGER_CALL: the verdict that stands for the claim
        wherever one verdict is shown (home page, indexes, decisions, snippets) is the verdict on this clock.
    margin: the measured margin within which a speedup counts as Level (a tie), with the eager-call clock's
        own in `margin.eager` (margin_on gives a clock's).
    """

    subject: str
    baselines: tuple[str, ...]
    threshold: float = 1.0
    statement: str = ""
    short: str = ""  # e.g. "softmax win claim", as in "Rejected: softmax win claim"
    kind: str = WIN
    margin: Margin = NO_MARGIN
    clock: str = GPU_TIME

    def __post_init__(self):
        if self.clock not in CLOCKS:
            raise ValueError(f"Claim.clock {self.clock!r}: expected one of {', '.join(CLOCKS)}")
        if self.kind not in CLAIM_KINDS:
            raise ValueError(f"Claim.kind {self.kind!r}: expected one of {', '.join(CLAIM_KINDS)}")
        if self.threshold < 1:
            raise ValueError(f"Claim.threshold {self.threshold!r}: expected 1 or more (a speedup the subject must reach)")
        if self.kind == PARITY and self.threshold != 1:
            raise ValueError(f"a parity claim compares with 1, got threshold {self.threshold!r}; "
                             "declare kind=WIN for 'at least t x faster'")

    def margin_on(self, clock: str) -> Margin:
        """The margin a speedup on `clock` is judged with."""
        if clock not in CLOCKS:
            raise ValueError(f"clock {clock!r}: expected one of {', '.join(CLOCKS)}")
        if clock == EAGER_CALL and self.margin.eager is not None:
            return self.margin.eager
        return self.margin


# The traffic a byte model counts, and the ceiling measured in the same run that matches it
# (lab.measure.timing): as many bytes read as written (a copy), reads alone, or two reads to one write.
COPY, READ, READ2_WRITE = "copy", "read", "read2-write"
TRAFFICS = (COPY, READ, READ2_WRITE)
# What limits a case: DRAM traffic (pages give % of the traffic's ceiling) or arithmetic (% of the matmul peak).
MEMORY, COMPUTE = "memory", "compute"
BOUNDS = (MEMORY, COMPUTE)


@dataclass(frozen=True)
class Experiment:
    slug: str
    title: str
    question: str
    focus: str
    why: str
    claim: Claim
    cases: tuple[Case, ...]
    dtypes: tuple[torch.dtype, ...]
    profiles: tuple[Profile, ...]
    make_inputs: Callable[[Case, torch.dtype, str, torch.Generator], Inputs]
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]  # float64 result(s) from the same inputs
    bytes_moved: Callable[[Case, torch.dtype], int]  # the byte model (model throughput = bytes / time)
    byte_model: str  # the same model in words, for the page: "forward: 2·M·N·size"
    evidence_boundary: str
    tolerance: Mapping[torch.dtype, float]  # accepted ‖out − ref‖ / ‖ref‖ per dtype
    flops: Callable[[Case, torch.dtype], int] | None = None
    # Tokens one call processes, from a case's shape (a model layer's experiments): pages then give each
    # profile's tokens per second on both clocks, derived from the recorded medians.
    tokens: Callable[[Mapping[str, int]], int] | None = None
    metrics: tuple[str, ...] = ("latency", "throughput")
    x_axis: str | None = None  # the shape dimension a sweep plots against (None: a bar chart per case)
    decisions: tuple[str, ...] = ()  # slugs of decision records this experiment informs
    adhoc_command: str = ""  # the console command for a quick check of one case
    source_file: str = ""  # this declaration's path, hashed into every record
    # Inputs whose row i alone decides output row i. Naming them lets the runner check a huge case on its
    # first and last rows only (the float64 reference of every row would cost more than the run).
    row_inputs: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Op-by-op breakdown (lab.measure.breakdown): (kernel name, enclosing op labels) -> op name. Declared, every
    # correct profile's call is also profiled op by op and the record keeps each op's kernel time.
    breakdown: Callable[[str, tuple[str, ...]], str] | None = None
    # Model quantities shown as columns of the points tables, beside each point's timings (none: no columns).
    point_columns: tuple[PointColumn, ...] = ()
    # Which measured ceiling the byte model's traffic matches (TRAFFICS), and what bounds a case: MEMORY or
    # COMPUTE for every case, or a function of the case (a layer is compute-bound at prefill, memory-bound at
    # decode). Pages give memory-bound points as % of that ceiling, compute-bound ones as % of the matmul peak.
    traffic: str = COPY
    bound: str | Callable[[Case], str] = MEMORY
    # Why a memory-bound figure can exceed its ceiling, said on the page wherever one does (empty: the
    # generic reason, traffic the byte model counts that the L2 serves).
    above_ceiling: str = ""

    def __post_init__(self):
        if self.traffic not in TRAFFICS:
            raise ValueError(f"Experiment.traffic {self.traffic!r}: expected one of {', '.join(TRAFFICS)}")
        if not callable(self.bound) and self.bound not in BOUNDS:
            raise ValueError(f"Experiment.bound {self.bound!r}: expected one of {', '.join(BOUNDS)} or a function of "
                             "the case")

    def bound_of(self, case: Case) -> str:
        """MEMORY or COMPUTE at `case` (MEMORY where a declared function cannot read the case)."""
        if not callable(self.bound):
            return self.bound
        try:
            bound = self.bound(case)
        except (KeyError, TypeError, ValueError, ArithmeticError):
            return MEMORY
        return bound if bound in BOUNDS else MEMORY

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(f"experiment {self.slug!r} has no profile {name!r}")


@dataclass(frozen=True)
class Decision:
    """A conclusion the project draws, owned by a decision record and fed by experiments' live verdicts.

    `if_supported` / `if_rejected` / `otherwise` are the calls made for each state of the evidence: the
    page shows the one the current verdicts select, so a decision can never outlive its evidence.
    """

    slug: str
    title: str
    question: str
    experiments: tuple[str, ...]
    if_supported: str
    if_rejected: str
    otherwise: str
