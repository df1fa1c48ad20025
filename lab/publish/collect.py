"""The evidence a render starts from: every declared experiment and decision, the valid records of each
(newest first) and their verdicts per GPU, and the problems of every record that could not be used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from experiments.spec import Decision, Experiment
from lab.evidence.records import Point, RunRecord
from lab.evidence.store import RecordProblem, load_records
from lab.evidence.verdict import EAGER_CALL, GPU_TIME, Verdict, verdicts_by_gpu
from lab.publish.formatting import gpu_labels


@dataclass
class Evidence:
    """Experiments, decisions, valid runs (newest first per experiment) and their verdicts per GPU: on the
    GPU-time clock (`verdicts`) and on the eager-call clock (`eager_verdicts`)."""

    experiments: dict[str, Experiment]
    decisions: tuple[Decision, ...]
    runs: dict[str, list[RunRecord]]
    verdicts: dict[str, dict[str, Verdict]]
    current_hashes: dict[str, dict[str, str]]
    problems: list[RecordProblem] = field(default_factory=list)
    eager_verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)

    def on_clock(self, slug: str, clock: str) -> dict[str, Verdict]:
        """`slug`'s verdicts per GPU on `clock`."""
        return self.verdicts[slug] if clock == GPU_TIME else self.eager_verdicts.get(slug, {})

    def claim_verdicts(self, slug: str) -> dict[str, Verdict]:
        """`slug`'s verdicts per GPU on the clock its claim speaks of: the verdict that stands for the claim
        wherever one is shown alone (home page, indexes, decisions, snippets)."""
        return self.on_clock(slug, self.experiments[slug].claim.clock)

    @property
    def gpu_names(self) -> dict[str, str]:
        """GPU key -> the device name of the newest run with that key."""
        names: dict[str, tuple[str, str]] = {}
        for runs in self.runs.values():
            for run in runs:
                stamp = (run.started_utc, run.run_id)
                if run.gpu_key not in names or names[run.gpu_key][0] < stamp:
                    names[run.gpu_key] = (stamp, run.gpu_name)
        return {key: name for key, (_, name) in sorted(names.items())}

    @property
    def gpu_labels(self) -> dict[str, str]:
        """GPU key -> the short label tables and plots use ("H100", "H200"; formatting.gpu_labels)."""
        return gpu_labels(self.gpu_names)

    @property
    def evidence_gpus(self) -> list[str]:
        """Keys of the GPUs with at least one performance run (the CPU interpreter never is one)."""
        return sorted({run.gpu_key for runs in self.runs.values() for run in runs if run.is_performance_evidence})


def collect_evidence(
    experiments: Mapping[str, Experiment],
    decisions: Sequence[Decision],
    records_dir: Path,
    current_hashes: Mapping[str, Mapping[str, str]],
    *,
    missing_ok: bool = False,
) -> Evidence:
    """Load every record under records_dir and judge it against the experiments' current source hashes.

    Invalid records, and records of experiments that are no longer declared, become problems. A records_dir
    that is missing raises RecordsFolderError (lab.evidence.store), unless `missing_ok` (before any run).
    """
    records, problems = load_records(records_dir, missing_ok=missing_ok)
    runs: dict[str, list[RunRecord]] = {slug: [] for slug in sorted(experiments)}
    for record in records:
        if record.experiment in runs:
            runs[record.experiment].append(record)
        else:
            problems.append(RecordProblem(record.path, f"no declared experiment is named {record.experiment!r}"))
    for slug in runs:
        runs[slug].sort(key=lambda r: (r.started_utc, r.run_id), reverse=True)
    verdicts = {slug: verdicts_by_gpu(experiments[slug], runs[slug], current_hashes[slug]) for slug in runs}
    eager_verdicts = {slug: verdicts_by_gpu(experiments[slug], runs[slug], current_hashes[slug], EAGER_CALL)
                      for slug in runs}
    return Evidence(
        experiments={slug: experiments[slug] for slug in sorted(experiments)},
        decisions=tuple(sorted(decisions, key=lambda d: d.slug)),
        runs=runs,
        verdicts=verdicts,
        current_hashes={slug: dict(current_hashes[slug]) for slug in sorted(experiments)},
        problems=sorted(problems, key=lambda p: str(p.path)),
        eager_verdicts=eager_verdicts,
    )


def profile_names(experiment: Experiment, points: Iterable[Point]) -> list[str]:
    """Declared profiles in declaration order that appear in `points`, then any others, sorted."""
    seen = {name for p in points for name in p.results}
    declared = [p.name for p in experiment.profiles if p.name in seen]
    return declared + sorted(seen - set(declared))


def dtypes_in(run: RunRecord) -> list[str]:
    """The run's dtypes in the order its points first use them."""
    return list(dict.fromkeys(point.dtype for point in run.points))
