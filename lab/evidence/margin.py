"""The margin of a claim, measured: how far one kernel's median moves when the same code is timed twice.

A speedup interval that lies within 1 ± margin is a tie (Level). The margin is not a matter of taste: it is
the spread the lab's own clock shows between two runs of unchanged code, which no confidence interval of a
single run can see (the clock, the GPU's state and the neighbouring allocations differ from run to run).

Two results are "one kernel timed twice" when they are the same profile at the same case and dtype, both
timed correctly, in two runs of one experiment on the same GPU model with

* the same recorded hash of every file that defines that profile's work (lab.evidence.hashing's
  profile_source_files: its declared sources, what it runs, its plan and its inputs),
* the same software (torch, Triton, CUDA, the driver and every recorded package version), and
* the same timing method.

Each such pair gives |ln(p50 in one run / p50 in the other)| on the GPU-time clock. An experiment's margin is
the 95th percentile of its pairs, pooled over its GPUs, when it has at least MIN_COMPARISONS of them;
otherwise the same percentile pooled over every experiment. It is written as exp(q) − 1 rounded up to 0.1%.
The eager-call clock is judged with the same margin until the records hold enough of its own pairs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from experiments.spec import Experiment
from lab.evidence.hashing import profile_source_files
from lab.evidence.records import RunRecord

PERCENTILE = 95
MIN_COMPARISONS = 200
ROUND_UP_TO = 0.001


@dataclass(frozen=True)
class Comparison:
    """One profile at one point, timed in two runs of unchanged code: the distance of their medians."""

    experiment: str
    gpu_key: str
    profile: str
    case: str
    dtype: str
    runs: tuple[str, str]
    log_ratio: float  # |ln(p50 in runs[0] / p50 in runs[1])|


def _software(run: RunRecord) -> tuple:
    env = run.environment
    smi = env.get("nvidia_smi") or {}
    return (env.get("torch"), env.get("triton"), env.get("cuda"), smi.get("driver"),
            tuple(sorted((env.get("packages") or {}).items())))


def _comparable(a: RunRecord, b: RunRecord) -> bool:
    return (a.is_performance_evidence and b.is_performance_evidence and a.gpu_key == b.gpu_key
            and a.timing == b.timing and _software(a) == _software(b))


def same_kernel_comparisons(experiment: Experiment, runs: Iterable[RunRecord], root: Path) -> list[Comparison]:
    """Every pair (profile, point) timed correctly in two comparable runs of unchanged code for that profile."""
    files = {p.name: profile_source_files(experiment, p.name, root) for p in experiment.profiles}
    runs = sorted((r for r in runs if r.experiment == experiment.slug), key=lambda r: (r.started_utc, r.run_id))
    found = []
    for a, b in itertools.combinations(runs, 2):
        if not _comparable(a, b):
            continue
        unchanged = [name for name, paths in files.items()
                     if all(a.hashes.get(p) is not None and a.hashes.get(p) == b.hashes.get(p) for p in paths)]
        points_b = {(p.case, p.dtype): p for p in b.points}
        for pa in a.points:
            pb = points_b.get((pa.case, pa.dtype))
            if pb is None or pb.shape != pa.shape:
                continue
            for name in unchanged:
                ra, rb = pa.results.get(name), pb.results.get(name)
                if ra is None or rb is None or ra.status != "ok" or rb.status != "ok":
                    continue
                found.append(Comparison(experiment.slug, a.gpu_key, name, pa.case, pa.dtype, (a.run_id, b.run_id),
                                        abs(math.log(ra.p50_ms / rb.p50_ms))))
    return found


def margin_fraction(comparisons: list[Comparison]) -> float:
    """exp(the PERCENTILE-th percentile of the log distances) − 1, rounded up to ROUND_UP_TO."""
    q = float(np.percentile([c.log_ratio for c in comparisons], PERCENTILE))
    steps = math.expm1(q) / ROUND_UP_TO
    return round(math.ceil(round(steps, 6)) * ROUND_UP_TO, 6)


def _summary(comparisons: list[Comparison]) -> dict:
    return {
        "comparisons": len(comparisons),
        "run_pairs": len({(c.gpu_key, c.runs) for c in comparisons}),
        "gpus": sorted({c.gpu_key for c in comparisons}),
        "profiles": sorted({c.profile for c in comparisons}),
    }


def derive_margins(experiments: Mapping[str, Experiment], runs: Iterable[RunRecord], root: Path) -> dict:
    """The margins file's content: the rule, the pooled value and each experiment's margin with its basis."""
    runs = list(runs)
    per_experiment = {slug: same_kernel_comparisons(e, runs, root) for slug, e in sorted(experiments.items())}
    pooled = [c for found in per_experiment.values() for c in found]
    if not pooled:
        raise ValueError("no profile was timed twice with unchanged code on the same GPU: the records hold "
                         "nothing to derive a margin from (run an experiment twice without changing it)")
    pooled_fraction = margin_fraction(pooled)
    pooled_facts = _summary(pooled)
    entries = {}
    for slug, found in per_experiment.items():
        own = len(found) >= MIN_COMPARISONS
        fraction = margin_fraction(found) if own else pooled_fraction
        facts = _summary(found)
        entries[slug] = {"fraction": fraction, "source": "own" if own else "pooled", **facts,
                         "basis": _basis(own, facts, pooled_facts)}
    return {
        "rule": (f"the {PERCENTILE}th percentile of |ln(p50 in run A / p50 in run B)|, GPU time, over every profile timed "
                 "correctly at the same case and dtype in two runs of one experiment on the same GPU model, with "
                 "the same hashes of the files defining that profile's work, the same software versions and "
                 f"the same timing method; an experiment with fewer than {MIN_COMPARISONS} such comparisons takes "
                 f"the value pooled over all experiments; written as exp(q) - 1, rounded up to "
                 f"{ROUND_UP_TO:.1%}"),
        "pooled": {"fraction": pooled_fraction, **pooled_facts,
                   "basis": _basis(False, pooled_facts, pooled_facts, pooled_only=True)},
        "experiments": entries,
    }


def _basis(own: bool, facts: dict, pooled: dict, pooled_only: bool = False) -> str:
    def pairs(f: dict) -> str:
        n, p = f["comparisons"], f["run_pairs"]
        return f"{n:,} comparison{'s' if n != 1 else ''} in {p:,} pair{'s' if p != 1 else ''} of runs"

    what = (f"the {PERCENTILE}th percentile of how far one kernel's median GPU time moved when unchanged code was "
            "timed twice")
    if own:
        return f"{what} on the same GPU: {pairs(facts)} of this experiment"
    if pooled_only:
        return f"{what} on the same GPU: {pairs(pooled)} over every experiment"
    mine = f"this experiment has {facts['comparisons']:,}" if facts["comparisons"] else "this experiment has none"
    return (f"{what} on the same GPU, pooled over every experiment ({pairs(pooled)}): {mine}, fewer than the "
            f"{MIN_COMPARISONS} its own value needs")
