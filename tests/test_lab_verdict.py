"""The verdict rule on synthetic records: every verdict reached, the bounds' edge cases, decisions, statistics."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from experiments.spec import Decision  # noqa: E402
from lab.evidence.records import ProfileResult  # noqa: E402
from lab.evidence.stats import bootstrap_speedup, summarize  # noqa: E402
from lab.evidence.verdict import (  # noqa: E402
    AGAINST,
    INCONCLUSIVE,
    NO_EVIDENCE,
    OPEN,
    REJECTED,
    STALE,
    SUPPORTED,
    SUPPORTS,
    UNDECIDED,
    Verdict,
    badge,
    decide,
    judge_point,
    verdict_for_gpu,
    verdicts_by_gpu,
)

HASHES = {"kernels/k.py": "a" * 64}


def constant(ms, n=30):
    return [ms] * n


def noisy(ms, seed, n=40, spread=0.05):
    rng = np.random.default_rng(seed)
    return list(ms * (1 + spread * rng.standard_normal(n)))


def verdict(results_by_point, threshold=1.0, hashes=HASHES, current=HASHES, **exp):
    experiment = syn.experiment(threshold=threshold, **exp)
    points = [syn.point(results, case=f"c{i}") for i, results in enumerate(results_by_point)]
    return verdict_for_gpu(experiment, [syn.run(points, hashes=hashes)], current)


# ---- the five verdicts --------------------------------------------------------------------------------


def test_supported_when_every_lower_bound_reaches_the_threshold():
    v = verdict([{"subject": syn.timed(noisy(1.0, 1)), "base": syn.timed(noisy(1.5, 2))},
                 {"subject": syn.timed(noisy(2.0, 3)), "base": syn.timed(noisy(2.6, 4))}])
    assert v.state == SUPPORTED and v.data_state == SUPPORTED
    assert all(p.outcome == SUPPORTS and p.speedup.low >= 1.0 for p in v.points)


def test_rejected_when_one_upper_bound_is_below_one():
    v = verdict([{"subject": syn.timed(noisy(1.0, 1)), "base": syn.timed(noisy(1.5, 2))},
                 {"subject": syn.timed(noisy(1.0, 3)), "base": syn.timed(noisy(0.7, 4))}])
    assert v.state == REJECTED
    assert [p.outcome for p in v.points] == [SUPPORTS, AGAINST]
    assert "c1" in v.summary and "base is faster" in v.summary


def test_inconclusive_when_the_interval_straddles_one():
    same = noisy(1.0, 5, spread=0.2)  # one distribution for both: the ratio is exactly 1, the interval wide
    v = verdict([{"subject": syn.timed(same), "base": syn.timed(same)}])
    (p,) = v.points
    assert p.speedup.low < 1.0 < p.speedup.high
    assert v.state == INCONCLUSIVE and p.outcome == UNDECIDED


def test_stale_when_a_hashed_source_changed_and_the_old_data_is_kept():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(2.0))}],
                current={"kernels/k.py": "b" * 64})
    assert v.state == STALE
    assert v.data_state == SUPPORTED, "the page still says what the old evidence showed"
    assert v.changed == ("kernels/k.py",) and v.points


def test_stale_when_a_source_is_added_or_removed():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(2.0))}],
                current={**HASHES, "experiments/_helpers.py": "c" * 64})
    assert v.state == STALE and v.changed == ("experiments/_helpers.py",)


def test_no_evidence_without_runs_and_for_cpu_interpreter_runs():
    experiment = syn.experiment()
    assert verdict_for_gpu(experiment, [], HASHES).state == NO_EVIDENCE
    cpu_run = syn.run([syn.point({"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(9.0))})],
                      hashes=HASHES, cpu=True)
    v = verdict_for_gpu(experiment, [cpu_run], HASHES)
    assert v.state == NO_EVIDENCE and v.data_state is None and v.points == ()
    assert "not performance evidence" in v.summary


# ---- the bounds' edge cases -------------------------------------------------------------------------


def test_lower_bound_exactly_at_the_threshold_supports():
    # Constant samples make the interval collapse onto the ratio: exactly 1.0 here.
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(1.0))}])
    (p,) = v.points
    assert (p.speedup.low, p.speedup.ratio, p.speedup.high) == (1.0, 1.0, 1.0)
    assert v.state == SUPPORTED


def test_upper_bound_exactly_one_is_not_a_rejection():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(1.0))}], threshold=1.1)
    assert v.points[0].speedup.high == 1.0
    assert v.state == INCONCLUSIVE


def test_upper_bound_just_below_one_rejects():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(0.999))}], threshold=1.1)
    assert v.state == REJECTED


def test_threshold_above_one_needs_the_lower_bound_to_clear_it():
    samples = {"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(1.05))}
    assert verdict([samples], threshold=1.1).state == INCONCLUSIVE
    assert verdict([samples], threshold=1.05).state == SUPPORTED


# ---- the subject and the baselines ------------------------------------------------------------------


@pytest.mark.parametrize("status, detail", [
    ("incorrect", {"rel_error": 0.3, "reason": "relative error 0.3 exceeds the tolerance 1e-05"}),
    ("error", {"error": "OutOfResources: shared memory"}),
    ("unsupported", {"reason": "declines this shape"}),
])
def test_a_subject_that_did_not_run_correctly_counts_against_the_claim(status, detail):
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(2.0))},
                 {"subject": ProfileResult(status, **detail), "base": syn.timed(constant(2.0))}])
    assert v.state == REJECTED
    assert v.points[1].outcome == AGAINST and status in v.points[1].reason
    assert (detail.get("reason") or detail["error"]) in v.points[1].reason


def test_the_best_baseline_is_the_fastest_correct_claimed_one():
    experiment = syn.experiment(baselines=("slow", "fast", "wrong"), others=("faster-but-not-a-baseline",))
    p = syn.point({
        "subject": syn.timed(constant(1.0)),
        "slow": syn.timed(constant(3.0)),
        "fast": syn.timed(constant(1.5)),
        "wrong": ProfileResult("incorrect", rel_error=1.0, reason="wrong"),
        "faster-but-not-a-baseline": syn.timed(constant(0.1)),
    })
    j = judge_point(experiment, p)
    assert j.baseline == "fast" and j.speedup.ratio == pytest.approx(1.5) and j.outcome == SUPPORTS


def test_a_point_without_a_correct_baseline_decides_nothing():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": ProfileResult("unavailable", reason="absent")}])
    assert v.points[0].outcome == UNDECIDED and v.state == INCONCLUSIVE


def test_the_newest_run_on_a_gpu_decides_and_gpus_are_judged_apart():
    experiment = syn.experiment()
    win = syn.point({"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(2.0))})
    loss = syn.point({"subject": syn.timed(constant(2.0)), "base": syn.timed(constant(1.0))})
    runs = [
        syn.run([win], hashes=HASHES, started="2026-01-01T00:00:00Z"),
        syn.run([loss], hashes=HASHES, started="2026-02-01T00:00:00Z"),
        syn.run([win], hashes=HASHES, gpu=("nvidia-test-gpu-b", "NVIDIA Test GPU B")),
    ]
    verdicts = verdicts_by_gpu(experiment, runs, HASHES)
    assert list(verdicts) == ["nvidia-test-gpu-a", "nvidia-test-gpu-b"]
    assert verdicts["nvidia-test-gpu-a"].state == REJECTED
    assert verdicts["nvidia-test-gpu-a"].run.started_utc == "2026-02-01T00:00:00Z"
    assert verdicts["nvidia-test-gpu-b"].state == SUPPORTED
    assert badge(experiment, verdicts["nvidia-test-gpu-a"]) == "Rejected: synthetic claim"
    assert badge(experiment, None) == "No evidence: synthetic claim"


# ---- decisions ---------------------------------------------------------------------------------------


def _verdict_with(state):
    return Verdict(state, "nvidia-test-gpu-a", None, None, (), (), "")


@pytest.mark.parametrize("states, outcome", [
    ((SUPPORTED, SUPPORTED), SUPPORTED),
    ((SUPPORTED, REJECTED), REJECTED),
    ((STALE, REJECTED), REJECTED),
    ((SUPPORTED, INCONCLUSIVE), OPEN),
    ((SUPPORTED, STALE), OPEN),
    ((SUPPORTED, None), OPEN),  # one experiment has no verdict on this GPU
])
def test_decision_combines_its_experiments(states, outcome):
    decision = Decision("d", "D", "?", ("e1", "e2"), "yes", "no", "open")
    verdicts = {slug: _verdict_with(s) for slug, s in zip(("e1", "e2"), states, strict=True) if s is not None}
    call = decide(decision, verdicts)
    assert call.outcome == outcome
    assert call.text == {SUPPORTED: "yes", REJECTED: "no", OPEN: "open"}[outcome]
    assert call.states["e2"] == (states[1] or NO_EVIDENCE)


# ---- statistics ---------------------------------------------------------------------------------------


def test_percentiles_interpolate_between_order_statistics():
    s = summarize([5.0, 1.0, 2.0, 4.0, 3.0])
    assert (s.p20, s.p50, s.p80) == pytest.approx((1.8, 3.0, 4.2))
    with pytest.raises(ValueError):
        summarize([])


def test_bootstrap_is_deterministic_and_brackets_the_ratio():
    base, subject = noisy(2.0, 11), noisy(1.0, 12)
    first, second = bootstrap_speedup(base, subject), bootstrap_speedup(base, subject)
    assert first == second
    assert first.low <= first.ratio <= first.high
    assert first.ratio == pytest.approx(np.median(base) / np.median(subject))
    wide = bootstrap_speedup(noisy(2.0, 11, n=10, spread=0.3), noisy(1.0, 12, n=10, spread=0.3))
    assert wide.high - wide.low > first.high - first.low, "fewer, noisier samples give a wider interval"


@pytest.mark.parametrize("args, message", [
    (([], [1.0]), "non-empty"),
    (([1.0], [1.0], 1.5), "confidence"),
])
def test_bootstrap_rejects_bad_input(args, message):
    baseline, subject, *confidence = args
    with pytest.raises(ValueError, match=message):
        bootstrap_speedup(baseline, subject, **({"confidence": confidence[0]} if confidence else {}))
