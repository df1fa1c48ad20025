"""The margin of a claim, measured per clock: how far the claim's speedup moves when unchanged code is timed twice.

A speedup interval that lies within 1 ± margin is a tie (Level). The margin is not a matter of taste: it is
the spread the lab's own clocks show between two runs of unchanged code, which no confidence interval of a
single run can see (the clock, the GPU's state, the host's state and the neighbouring allocations differ from
run to run). A verdict judges a speedup, so the margin is taken from the speedup too: the subject's median
over the best baseline's, which moves less than either median when both drift together, and more when they
drift apart.

Two points are "one speedup measured twice" when they are the same case and dtype, with the subject and the
best baseline (on that clock, in each run) timed correctly, in two runs of one experiment on the same GPU
model with

* the same recorded hash of every file that defines the subject's and those baselines' work
  (lab.evidence.hashing's profile_source_files: declared sources, what they run, their plans and inputs),
* the same software (torch, Triton, CUDA, the driver and every recorded package version),
* the same timing method, and on the eager-call clock the same eager method too.

Where the subject's own code changed between the two runs (a kernel under development, the usual case in the
records), every other profile whose code did not change stands in for it: the ratio of its median to the best
baseline's is a speedup of unchanged code, and moves as the claim's would have. On the eager-call clock a
compiled profile (torch.compile: a name holding "compile") never stands in: its call runs Dynamo's guards and
can take its recompile path, so its host time moves for reasons of its own (144 against 419 µs a call at one
point of two runs of unchanged code), not as a launcher's does. Nor, on either clock, does a peer that chooses its kernels by timing them when first
called (gemlite's layers, built on triton.autotune): two runs of its unchanged code can time different kernels,
and its ratio then moves with that choice, not with the clock (its int8 decode layers moved by up to 28%
between two H100 runs of unchanged code, where every other stand-in of that experiment stayed within 3%).
Such a peer still counts as a baseline: as the denominator its choice is part of the speedup the claim judges.
Each such pair gives
|ln(speedup in one run / speedup in the other)| on that clock. A (experiment, clock)
margin is the PERCENTILE-th percentile of its own pairs, pooled over its GPUs, when it has at least
MIN_COMPARISONS of them; otherwise the same percentile of the pairs of every experiment of its kind (KINDS:
softmax, fusion, linear, attention, block) on that clock when they are enough; otherwise of every experiment's
on that clock. It is written as exp(q) − 1 rounded up to 0.1%. An eager-call margin is never smaller than the
same experiment's GPU-time margin (the eager clock adds the host's noise to the GPU's), and an experiment with
no eager-call pairs anywhere to draw on takes its GPU-time margin there.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from experiments.spec import CLOCKS, EAGER_CALL, GPU_TIME, Experiment
from lab.evidence.hashing import profile_source_files
from lab.evidence.records import Point, RunRecord
from lab.evidence.verdict import CLOCK_WORDS, clock_timing

PERCENTILE = 95
MIN_COMPARISONS = 100
ROUND_UP_TO = 0.001

# An experiment's kind, by the first prefix its slug starts with: pooling draws only on experiments whose
# speedups move alike (one-kernel softmaxes, elementwise fusions, projections, attention, whole layers).
KINDS = (
    ("softmax-", "softmax"),
    ("add-rmsnorm-", "fusion"),
    ("swiglu-", "fusion"),
    ("rmsnorm-linear-", "linear"),
    ("dequant-linear-", "linear"),
    ("attention-", "attention"),
    ("decoder-block", "block"),
)
OTHER_KIND = "other"
COMPILED = "compile"  # in a profile's name: a compiled call, which never stands in on the eager-call clock
RUN_TIME_TUNED = ("gemlite",)  # in a profile's name: kernels chosen by timing at run time; never a stand-in


def experiment_kind(slug: str) -> str:
    """The kind of the experiment named `slug` (KINDS), OTHER_KIND for a slug no prefix names."""
    return next((kind for prefix, kind in KINDS if slug.startswith(prefix)), OTHER_KIND)


@dataclass(frozen=True)
class Comparison:
    """One point's speedup on one clock, measured in two runs of unchanged code: the distance between them."""

    experiment: str
    clock: str
    gpu_key: str
    case: str
    dtype: str
    runs: tuple[str, str]
    numerator: str  # the subject, or the unchanged profile that stands in for it
    baselines: tuple[str, str]  # the best baseline in each run
    log_ratio: float  # |ln(speedup in runs[0] / speedup in runs[1])|


def _software(run: RunRecord) -> tuple:
    env = run.environment
    smi = env.get("nvidia_smi") or {}
    return (env.get("torch"), env.get("triton"), env.get("cuda"), smi.get("driver"),
            tuple(sorted((env.get("packages") or {}).items())))


def _comparable(a: RunRecord, b: RunRecord, clock: str) -> bool:
    same = (a.is_performance_evidence and b.is_performance_evidence and a.gpu_key == b.gpu_key
            and a.timing == b.timing and _software(a) == _software(b))
    if clock == EAGER_CALL:
        return same and a.eager is not None and a.eager == b.eager
    return same


def same_code_comparisons(experiment: Experiment, runs: Iterable[RunRecord], root: Path,
                          clock: str = GPU_TIME) -> list[Comparison]:
    """Every point whose speedup on `clock` was measured in two comparable runs of unchanged code.

    The speedup's denominator is the best baseline on `clock` in each run, whose code must be unchanged. Its
    numerator is the subject where the subject's code is unchanged too; where the subject changed between
    the runs (a kernel under development), every other profile whose code is unchanged and that was timed
    correctly in both stands in for it: the ratio of two unchanged kernels' medians moves as the claim's
    speedup would, had the subject held still.
    """
    claim = experiment.claim
    files = {p.name: profile_source_files(experiment, p.name, root) for p in experiment.profiles}
    runs = sorted((r for r in runs if r.experiment == experiment.slug), key=lambda r: (r.started_utc, r.run_id))
    found = []
    for a, b in itertools.combinations(runs, 2):
        if not _comparable(a, b, clock):
            continue
        unchanged = {name for name, paths in files.items()
                     if all(a.hashes.get(p) is not None and a.hashes.get(p) == b.hashes.get(p) for p in paths)}
        points_b = {(p.case, p.dtype): p for p in b.points}
        for pa in a.points:
            pb = points_b.get((pa.case, pa.dtype))
            if pb is None or pb.shape != pa.shape:
                continue
            base_a, base_b = _best_baseline(claim, pa, clock), _best_baseline(claim, pb, clock)
            if base_a is None or base_b is None or base_a[1] not in unchanged or base_b[1] not in unchanged:
                continue
            numerators = [claim.subject] if claim.subject in unchanged else sorted(
                name for name in unchanged - {claim.subject, base_a[1], base_b[1]}
                if (clock != EAGER_CALL or COMPILED not in name) and not any(t in name for t in RUN_TIME_TUNED))
            for name in numerators:
                ta, tb = clock_timing(pa.results.get(name), clock), clock_timing(pb.results.get(name), clock)
                if ta is None or tb is None or ta[0] <= 0 or tb[0] <= 0:
                    continue
                found.append(Comparison(experiment.slug, clock, a.gpu_key, pa.case, pa.dtype, (a.run_id, b.run_id),
                                        name, (base_a[1], base_b[1]),
                                        abs(math.log((base_a[0] / ta[0]) / (base_b[0] / tb[0])))))
    return found


def _best_baseline(claim, point: Point, clock: str) -> tuple[float, str] | None:
    """(median ms, name) of the claim's fastest correctly timed baseline at `point` on `clock`."""
    timed = [(t[0], name) for name in claim.baselines if (t := clock_timing(point.results.get(name), clock)) is not None]
    return min(timed) if timed else None


def margin_fraction(comparisons: list[Comparison]) -> float:
    """exp(the PERCENTILE-th percentile of the log distances) − 1, rounded up to ROUND_UP_TO."""
    q = float(np.percentile([c.log_ratio for c in comparisons], PERCENTILE))
    steps = math.expm1(q) / ROUND_UP_TO
    return round(math.ceil(round(steps, 6)) * ROUND_UP_TO, 6)


def _facts(comparisons: list[Comparison]) -> dict:
    return {
        "comparisons": len(comparisons),
        "run_pairs": len({(c.experiment, c.gpu_key, c.runs) for c in comparisons}),
        "gpus": sorted({c.gpu_key for c in comparisons}),
    }


def _pairs(facts: dict) -> str:
    n, p = facts["comparisons"], facts["run_pairs"]
    return f"{n:,} comparison{'s' if n != 1 else ''} in {p:,} pair{'s' if p != 1 else ''} of runs"


def _what(clock: str) -> str:
    return (f"the {PERCENTILE}th percentile of how far the speedup over the best baseline moved on the "
            f"{CLOCK_WORDS[clock]} clock when unchanged code was timed twice on the same GPU")


def _entry(clock: str, own: list[Comparison], kind: str, pools: dict[str, list[Comparison]],
           floor: dict | None) -> dict:
    """One (experiment, clock) margin: its own pairs, else its kind's, else every experiment's; an eager-call
    margin raised to `floor` (the same experiment's GPU-time entry) when it comes out smaller."""
    mine = _facts(own)
    have = f"this experiment has {mine['comparisons']:,}" if own else "this experiment has none"
    if len(own) >= MIN_COMPARISONS:
        fraction, source, basis = margin_fraction(own), "own", f"{_what(clock)}: {_pairs(mine)} of this experiment"
    elif len(pools[kind]) >= MIN_COMPARISONS:
        fraction, source = margin_fraction(pools[kind]), "kind"
        basis = (f"{_what(clock)}, pooled over the {kind} experiments ({_pairs(_facts(pools[kind]))}): {have}, "
                 f"fewer than the {MIN_COMPARISONS} its own value needs")
    elif pools[""]:
        fraction, source = margin_fraction(pools[""]), "all"
        basis = (f"{_what(clock)}, pooled over every experiment ({_pairs(_facts(pools[''])) }): {have} and its "
                 f"kind ({kind}) {len(pools[kind]):,}, fewer than the {MIN_COMPARISONS} a value needs")
    else:
        fraction, source, basis = None, "none", f"no speedup on the {CLOCK_WORDS[clock]} clock was measured twice"
    entry = {"fraction": fraction, "source": source, "basis": basis, "kind": kind, **mine, "spread": fraction}
    if floor is not None and (fraction is None or fraction < floor["fraction"]):
        raised = f"{basis}; " if fraction is not None else f"{basis}: "
        entry.update(fraction=floor["fraction"], source=f"{source}, GPU-time floor" if fraction is not None else
                     "GPU-time floor",
                     basis=f"{raised}raised to the GPU-time margin ±{floor['fraction']:.1%}, below which no "
                           "eager-call margin goes (that clock adds the host's noise to the GPU's)")
    return entry


def derive_margins(experiments: Mapping[str, Experiment], runs: Iterable[RunRecord], root: Path) -> dict:
    """The margins file's content: the rule, the kinds, the pooled values and each experiment's margin per clock,
    each with what it rests on."""
    runs = list(runs)
    found = {clock: {slug: same_code_comparisons(e, runs, root, clock) for slug, e in sorted(experiments.items())}
             for clock in CLOCKS}
    if not any(found[GPU_TIME].values()):
        raise ValueError("no speedup was measured twice with unchanged code on the same GPU: the records hold "
                         "nothing to derive a margin from (run an experiment twice without changing it)")
    kinds = {slug: experiment_kind(slug) for slug in sorted(experiments)}
    pools = {}
    for clock in CLOCKS:
        pools[clock] = {"": [c for cs in found[clock].values() for c in cs]}
        for kind in sorted(set(kinds.values())):
            pools[clock][kind] = [c for slug, cs in found[clock].items() if kinds[slug] == kind for c in cs]
    entries = {}
    for slug in sorted(experiments):
        gpu = _entry(GPU_TIME, found[GPU_TIME][slug], kinds[slug], pools[GPU_TIME], None)
        eager = _entry(EAGER_CALL, found[EAGER_CALL][slug], kinds[slug], pools[EAGER_CALL], gpu)
        entries[slug] = {GPU_TIME: gpu, EAGER_CALL: eager}
    pooled = {}
    for clock in CLOCKS:
        pooled[clock] = {}
        for name, pool in sorted(pools[clock].items()):
            if pool:
                where = "every experiment" if not name else f"the {name} experiments"
                pooled[clock][name or "all"] = {"fraction": margin_fraction(pool), **_facts(pool),
                                                "basis": f"{_what(clock)}: {_pairs(_facts(pool))} over {where}"}
    return {
        "rule": (f"per clock, the {PERCENTILE}th percentile of |ln(speedup in run A / speedup in run B)|, the "
                 "speedup being the best baseline's median over the subject's on that clock, over every case and "
                 "dtype measured in two runs of one experiment on the same GPU model with the same hashes of the "
                 "files defining the subject's and the best baselines' work, the same software versions and the "
                 f"same timing (and eager) method; an experiment with fewer than {MIN_COMPARISONS} such "
                 "comparisons on a clock takes the value pooled over the experiments of its kind, or over every "
                 "experiment when its kind has too few; an eager-call margin is never below the GPU-time margin; "
                 f"written as exp(q) - 1, rounded up to {ROUND_UP_TO:.1%}"),
        "kinds": {kind: sorted(s for s in kinds if kinds[s] == kind) for kind in sorted(set(kinds.values()))},
        "pooled": pooled,
        "experiments": entries,
    }
