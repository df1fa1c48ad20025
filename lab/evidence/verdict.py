"""Verdicts: what an experiment's newest run on each GPU says about its claim.

The rule (RULE_TEXT: every experiment page states it in these words, with its own numbers, before any data):

* At every case × dtype, the speedup is the best baseline's median time over the subject's median time,
  where the best baseline is the claim's baseline with the fastest median among those that passed the
  accuracy check. Its 95% confidence interval comes from a bootstrap of both sets of raw samples.
* Each point gets one word against the claim's measured margin m on that clock: Faster (lower bound above 1 + m), Slower
  (upper bound below 1/(1 + m)), Level (the whole interval within that band) or Undecided (none of these); Failed
  where the subject was incorrect, errored, unsupported or unavailable. A point with no correct baseline is
  Undecided.
* The experiment's verdict follows from its points. Rejected: some point is Slower or Failed. Supported: a
  parity claim ("at least as fast") when every point is Faster or Level; a win claim ("faster", by at least
  t) when every point is Faster with its lower bound at or above t. Inconclusive: anything else. A tie is
  never Rejected: for a win claim it leaves the verdict Inconclusive.
* A claim names the clock its statement speaks of (GPU time or eager call): wherever one verdict stands for
  the claim, it is the verdict on that clock.
* Stale: a file hashed into the newest run has changed since; the old data is still shown, marked.
* No evidence: no run on that GPU, or only runs through the CPU interpreter, whose times are not
  performance evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from experiments.spec import CLOCKS, EAGER_CALL, GPU_TIME, PARITY, Claim, Decision, Experiment  # noqa: F401
from lab.evidence.hashing import changed_sources
from lab.evidence.records import CPU_EVIDENCE, Point, RunRecord
from lab.evidence.stats import SpeedupInterval, bootstrap_speedup

SUPPORTED = "Supported"
REJECTED = "Rejected"
INCONCLUSIVE = "Inconclusive"
NO_EVIDENCE = "No evidence"
STALE = "Stale"
STATES = (SUPPORTED, REJECTED, INCONCLUSIVE, STALE, NO_EVIDENCE)

# A point's word: how the subject compares with the best correct baseline there.
FASTER = "Faster"
LEVEL = "Level"
SLOWER = "Slower"
UNDECIDED = "Undecided"
FAILED = "Failed"
WORDS = (FASTER, LEVEL, SLOWER, UNDECIDED, FAILED)

# What a point does to the claim: meets it, counts against it, or neither.
MEETS = "meets"
AGAINST = "against"
NEITHER = "neither"

RULE_TEXT = (
    "At every case and dtype the **speedup** is the best baseline's median time divided by the subject's "
    "median time, where the best baseline is the fastest (by median) of the claim's baselines that passed "
    "the accuracy check. Its 95% confidence interval comes from a bootstrap of both sets of raw samples "
    "(2,000 resamples, fixed seed).",
    "Each experiment declares a **margin** m per clock, measured rather than chosen: how far the speedup "
    "moves on that clock when unchanged code is timed twice on the same GPU (never less on the eager-call "
    "clock than on GPU time). Each point gets one word: **Faster** when the "
    "interval's lower bound is above 1 + m; **Slower** when its upper bound is below 1/(1 + m), the same "
    "distance on the other side in ratio terms (about 1 − m for a small m); **Level** when the whole interval "
    "lies between the two (a tie); **Undecided** otherwise. **Failed** where the subject "
    "itself was incorrect, errored, unsupported or unavailable; a point with no correct baseline is "
    "Undecided.",
    "**Rejected** when some point is Slower or Failed. **Supported**, for a parity claim (\"at least as "
    "fast\"), when every point is Faster or Level; for a win claim (\"faster\", by at least t), when every "
    "point is Faster with its lower bound at or above t. **Inconclusive** otherwise: a tie is never "
    "Rejected. **Stale** when a source file hashed into the newest run has changed since (the old data stays "
    "on the page, marked); an experiment declaration whose words alone changed, checked against the run's "
    "commit, does not count. **No evidence** without a GPU run: runs through the CPU interpreter check the "
    "machinery, not performance.",
    "Each claim names the clock its statement speaks of: **GPU time** (what the GPU spends per call) or the "
    "**eager call** (what a Python program calling the op back to back pays, host work included). Wherever "
    "one verdict stands for a claim (the home page, the indexes, the decisions), it is the verdict on that "
    "clock, named; the other clock's verdict stands beside it on the experiment's page, labelled.",
)


# The two clocks a claim is judged on (experiments.spec: GPU_TIME, EAGER_CALL), each with its own verdict and its
# own margin; the claim names the one that stands for it (Claim.clock).
CLOCK_NAMES = {GPU_TIME: "GPU time", EAGER_CALL: "Eager call"}
CLOCK_WORDS = {GPU_TIME: "GPU-time", EAGER_CALL: "eager-call"}  # in a sentence: "on the eager-call clock"
CLOCK_MEANINGS = {
    GPU_TIME: "what the GPU spends per call, host work hidden: how good the kernel is",
    EAGER_CALL: "what a Python program calling the op back to back pays per call, host work included",
}
GPU_TIME_ONLY = "This record predates the eager-call clock: it holds GPU time only."


def clock_timing(result, clock: str) -> tuple[float, tuple[float, ...]] | None:
    """(median ms, raw samples) of a correct, timed result on `clock`; None where it has none there."""
    if result is None or result.status != "ok":
        return None
    if clock == GPU_TIME:
        return result.p50_ms, result.samples_ms
    eager = result.eager
    if eager is None or eager.error is not None or eager.p50_ms is None:
        return None
    return eager.p50_ms, eager.samples_ms


def claim_rule(claim: Claim, clock: str | None = None) -> str:
    """The rule with this claim's numbers on `clock` (default: the claim's own) in it, one sentence per word."""
    m = claim.margin_on(clock or claim.clock).fraction
    down, up = tie_band(m)
    if claim.kind == PARITY:
        supported = "every point is Faster or Level"
    elif claim.threshold > 1:
        supported = f"every point is Faster with its lower bound at or above {claim.threshold:g}"
    else:
        supported = "every point is Faster"
    return (f"Margin ±{m:.1%}: Faster when the 95% interval lies above {up:.3f}, Slower when it lies below "
            f"{down:.3f}, Level when it lies within {down:.3f}–{up:.3f}, Undecided otherwise. "
            f"Supported when {supported}; Rejected when any point is Slower or Failed; Inconclusive otherwise.")


@dataclass(frozen=True)
class PointJudgement:
    """The claim judged at one case and dtype."""

    case: str
    dtype: str
    word: str  # FASTER, LEVEL, SLOWER, UNDECIDED or FAILED
    effect: str  # MEETS, AGAINST or NEITHER
    baseline: str | None  # the best correct baseline, if any
    speedup: SpeedupInterval | None
    reason: str


@dataclass(frozen=True)
class Verdict:
    """One experiment on one GPU: the state, the run it rests on and the per-point judgements.

    `data_state` is what the run's data says under the rule (Supported / Rejected / Inconclusive), kept
    for a stale run so the page can say what the old evidence showed; None when there is no evidence.
    """

    state: str
    gpu_key: str | None
    run: RunRecord | None
    data_state: str | None
    points: tuple[PointJudgement, ...]
    changed: tuple[str, ...]
    summary: str


def badge(experiment: Experiment, verdict: Verdict | None) -> str:
    """The badge text, e.g. "Rejected: softmax win claim" ("No evidence: ..." without a verdict)."""
    state = verdict.state if verdict is not None else NO_EVIDENCE
    return f"{state}: {experiment.claim.short}" if experiment.claim.short else state


def _status_text(result) -> str:
    detail = result.reason or result.error
    return f"{result.status} ({detail})" if detail else result.status


def tie_band(margin: float) -> tuple[float, float]:
    """(1/(1 + margin), 1 + margin): the speedups a margin counts as a tie. The margin is a spread of log
    ratios, so its edges lie the same distance from 1 on both sides in ratio terms (a margin of 100% spans
    0.5–2, where 1 − margin would reach 0)."""
    return 1 / (1 + margin), 1 + margin


def word_for(interval: SpeedupInterval, margin: float) -> str:
    """Faster, Slower, Level or Undecided: where the interval lies against the tie band of `margin`."""
    down, up = tie_band(margin)
    if interval.low > up:
        return FASTER
    if interval.high < down:
        return SLOWER
    if interval.low >= down and interval.high <= up:
        return LEVEL
    return UNDECIDED


def judge_point(experiment: Experiment, point: Point, clock: str = GPU_TIME) -> PointJudgement:
    """Apply the rule at one point of a run, on `clock`'s samples."""
    claim = experiment.claim
    subject = point.results.get(claim.subject)
    if subject is None or subject.status != "ok":
        what = "absent from the run" if subject is None else _status_text(subject)
        return PointJudgement(point.case, point.dtype, FAILED, AGAINST, None, None, f"{claim.subject} is {what}")
    subject_timing = clock_timing(subject, clock)
    if subject_timing is None:
        why = subject.eager.error if subject.eager is not None and subject.eager.error else "no samples"
        return PointJudgement(point.case, point.dtype, FAILED, AGAINST, None, None,
                              f"{claim.subject} has no {CLOCK_NAMES[clock]} figure ({why})")
    correct = [(timing[0], name) for name in claim.baselines
               if (timing := clock_timing(point.results.get(name), clock)) is not None]
    if not correct:
        return PointJudgement(point.case, point.dtype, UNDECIDED, NEITHER, None, None,
                              "no baseline ran correctly here")
    _, best = min(correct)
    interval = bootstrap_speedup(clock_timing(point.results[best], clock)[1], subject_timing[1])
    m = claim.margin_on(clock).fraction
    word = word_for(interval, m)
    down, up = tie_band(m)
    bounds = f"[{interval.low:.3f}, {interval.high:.3f}]"
    if word == SLOWER:
        effect, why = AGAINST, f"{best} is faster: {bounds} lies below {down:.3f}"
    elif claim.kind == PARITY and word in (FASTER, LEVEL):
        effect = MEETS
        why = (f"{bounds} lies above {up:.3f}" if word == FASTER
               else f"level with {best}: {bounds} lies within {down:.3f}–{up:.3f}")
    elif word == FASTER and interval.low >= claim.threshold:
        effect, why = MEETS, f"{bounds} lies above {max(up, claim.threshold):.3f}"
    elif word == FASTER:
        effect, why = NEITHER, f"faster than {best}, but {bounds} does not clear the threshold {claim.threshold:g}"
    elif word == LEVEL:
        effect, why = NEITHER, f"level with {best}: {bounds} lies within {down:.3f}–{up:.3f}, a tie, not a win"
    else:
        effect, why = NEITHER, f"{bounds} crosses an edge of the tie band {down:.3f}–{up:.3f}"
    return PointJudgement(point.case, point.dtype, word, effect, best, interval, why)


def judge_run(experiment: Experiment, run: RunRecord,
              clock: str = GPU_TIME) -> tuple[str, tuple[PointJudgement, ...], str]:
    """The state a run's data supports (Supported / Rejected / Inconclusive), its judgements and a summary."""
    points = tuple(judge_point(experiment, p, clock) for p in run.points)
    if not points:
        return INCONCLUSIVE, points, "The run holds no points."
    against = [p for p in points if p.effect == AGAINST]
    if against:
        return REJECTED, points, _summary("Against the claim", against, len(points))
    short = [p for p in points if p.effect != MEETS]
    if not short:
        return SUPPORTED, points, f"Every point meets the claim: {word_counts(points)}."
    return INCONCLUSIVE, points, _summary("Short of the claim", short, len(points))


def word_counts(points: Iterable[PointJudgement]) -> str:
    """"3 Faster, 95 Level" in the order of WORDS, words with no point left out."""
    points = list(points)
    counts = [(w, sum(p.word == w for p in points)) for w in WORDS]
    return ", ".join(f"{n} {w}" for w, n in counts if n)


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def point_label(judgement: PointJudgement) -> str:
    return f"{judgement.case} ({judgement.dtype})"


def _summary(what: str, judged: list[PointJudgement], total: int, shown: int = 3) -> str:
    """"Against the claim at 2 of 98 points (2 Slower): a (dtype), b (dtype)", the first few named."""
    names = ", ".join(point_label(j) for j in judged[:shown])
    more = f" and {len(judged) - shown:,} more" if len(judged) > shown else ""
    first = judged[0]
    return (f"{what} at {len(judged):,} of {plural(total, 'point')} ({word_counts(judged)}): {names}{more}. "
            f"At {point_label(first)}: {first.reason}.")


def newest(runs: Iterable[RunRecord]) -> RunRecord | None:
    return max(runs, key=lambda r: (r.started_utc, r.run_id), default=None)


def verdict_for_gpu(experiment: Experiment, runs: Iterable[RunRecord], current_hashes: Mapping[str, str],
                    gpu_key: str | None = None, clock: str = GPU_TIME) -> Verdict:
    """The verdict of `experiment` on one GPU from that GPU's runs (any order), on `clock`."""
    run = newest(runs)
    if run is None:
        return Verdict(NO_EVIDENCE, gpu_key, None, None, (), (), "No run on this GPU yet.")
    if not run.is_performance_evidence:
        return Verdict(NO_EVIDENCE, run.gpu_key, run, None, (), (), CPU_EVIDENCE)
    if clock == EAGER_CALL and run.eager is None:
        return Verdict(NO_EVIDENCE, run.gpu_key, run, None, (), (), GPU_TIME_ONLY)
    data_state, points, summary = judge_run(experiment, run, clock)
    changed = tuple(changed_sources(run.hashes, current_hashes, run.git.get("commit")))
    if changed:
        summary = f"Changed since run {run.run_id}: {', '.join(changed)}; that run said {data_state}. {summary}"
        return Verdict(STALE, run.gpu_key, run, data_state, points, changed, summary)
    return Verdict(data_state, run.gpu_key, run, data_state, points, (), summary)


def verdicts_by_gpu(experiment: Experiment, runs: Iterable[RunRecord],
                    current_hashes: Mapping[str, str], clock: str = GPU_TIME) -> dict[str, Verdict]:
    """Verdicts of `experiment` per GPU key that has a run of it, in key order."""
    by_gpu: dict[str, list[RunRecord]] = {}
    for run in runs:
        if run.experiment == experiment.slug:
            by_gpu.setdefault(run.gpu_key, []).append(run)
    return {key: verdict_for_gpu(experiment, by_gpu[key], current_hashes, key, clock) for key in sorted(by_gpu)}


# --------------------------------------------------------------------------------------------------------
# Decisions: several experiments' verdicts on one GPU select one of a decision's calls
# --------------------------------------------------------------------------------------------------------

OPEN = "Open"  # a decision's call when the evidence is neither all Supported nor any Rejected
DECISION_RULE = (
    "On each GPU, a decision takes its experiments' verdicts there together: if any is Rejected, the "
    "rejected call holds; if every one is Supported, the supported call holds; otherwise (Inconclusive, "
    "Stale or No evidence anywhere among them) the open call holds."
)


@dataclass(frozen=True)
class DecisionCall:
    """The call a decision makes on one GPU, and the verdicts that select it."""

    outcome: str  # SUPPORTED, REJECTED or OPEN
    text: str
    states: dict[str, str]  # experiment slug -> verdict state on this GPU


def decide(decision: Decision, verdicts: Mapping[str, Verdict]) -> DecisionCall:
    """Select `decision`'s call from its experiments' verdicts on one GPU (missing: No evidence)."""
    states = {slug: verdicts[slug].state if slug in verdicts else NO_EVIDENCE for slug in decision.experiments}
    if any(state == REJECTED for state in states.values()):
        return DecisionCall(REJECTED, decision.if_rejected, states)
    if states and all(state == SUPPORTED for state in states.values()):
        return DecisionCall(SUPPORTED, decision.if_supported, states)
    return DecisionCall(OPEN, decision.otherwise, states)
