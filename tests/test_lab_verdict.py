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
    FAILED,
    FASTER,
    INCONCLUSIVE,
    LEVEL,
    MEETS,
    NEITHER,
    NO_EVIDENCE,
    OPEN,
    REJECTED,
    SLOWER,
    STALE,
    SUPPORTED,
    UNDECIDED,
    Verdict,
    badge,
    claim_rule,
    decide,
    judge_point,
    verdict_for_gpu,
    verdicts_by_gpu,
    tie_band,
    word_for,
)
from experiments.spec import EAGER_CALL, GPU_TIME, PARITY, WIN, Claim, Margin  # noqa: E402
from lab.evidence.stats import SpeedupInterval  # noqa: E402

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


def at(ratio, **exp):
    """A one-point verdict whose interval collapses onto `ratio` (constant samples): baseline / subject."""
    return verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(ratio))}], **exp)


# ---- the point words against the margin -----------------------------------------------------------------


@pytest.mark.parametrize("low, high, word", [
    (1.021, 1.05, FASTER),  # the lower bound clears 1 + m
    (1.02, 1.05, UNDECIDED),  # exactly at 1 + m is not above it, and the interval leaves the band
    (0.95, 0.98, SLOWER),  # below 1/(1 + m) = 0.98039
    (0.95, 0.981, UNDECIDED),
    (1 / 1.02, 1.02, LEVEL),  # the whole interval within 1/(1 + m) – 1 + m, edges included
    (0.98, 1.02, UNDECIDED),  # 0.98 is 1 − m, past the band's lower edge
    (0.99, 1.01, LEVEL),
    (0.97, 1.01, UNDECIDED),  # reaches below the band
    (0.99, 1.03, UNDECIDED),  # reaches above it
    (0.9, 1.1, UNDECIDED),
])
def test_a_point_word_places_its_interval_against_the_margin(low, high, word):
    assert word_for(SpeedupInterval((low + high) / 2, low, high, 0.95), 0.02) == word


def test_a_tie_is_level_not_rejected_for_a_parity_claim():
    # The softmax sweep's case: both kernels at the ceiling, the subject 0.2-0.6% behind.
    v = verdict([{"subject": syn.timed(noisy(1.0, 1, spread=0.002)), "base": syn.timed(noisy(0.996, 2, spread=0.002))}],
                kind=PARITY, margin=0.015)
    (p,) = v.points
    assert p.speedup.high < 1 and p.word == LEVEL and p.effect == MEETS
    assert v.state == SUPPORTED
    without_margin = verdict([{"subject": syn.timed(noisy(1.0, 1, spread=0.002)),
                               "base": syn.timed(noisy(0.996, 2, spread=0.002))}], kind=PARITY, margin=0.0)
    assert without_margin.state == REJECTED, "the same data with no margin: the margin is what makes it a tie"


# ---- the experiment's verdict from its points -------------------------------------------------------------


def test_parity_is_supported_when_every_point_is_faster_or_level():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(1.5))},
                 {"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(1.01))}], kind=PARITY, margin=0.02)
    assert [p.word for p in v.points] == [FASTER, LEVEL]
    assert v.state == SUPPORTED and v.data_state == SUPPORTED


def test_parity_is_supported_even_when_every_point_is_level():
    assert at(1.0, kind=PARITY, margin=0.02).state == SUPPORTED
    assert at(0.985, kind=PARITY, margin=0.02).state == SUPPORTED


def test_a_win_claim_needs_every_point_faster():
    assert at(1.05, kind=WIN, margin=0.02).state == SUPPORTED
    tie = at(1.0, kind=WIN, margin=0.02)
    assert tie.points[0].word == LEVEL and tie.points[0].effect == NEITHER
    assert tie.state == INCONCLUSIVE, "a tie is not a win, and not a loss either"
    assert "a tie, not a win" in tie.summary


def test_a_win_claim_with_a_threshold_needs_the_lower_bound_at_the_threshold():
    assert at(1.12, kind=WIN, threshold=1.1, margin=0.02).state == SUPPORTED
    short = at(1.05, kind=WIN, threshold=1.1, margin=0.02)
    assert short.points[0].word == FASTER and short.points[0].effect == NEITHER
    assert short.state == INCONCLUSIVE and "threshold 1.1" in short.summary


def test_rejected_when_one_point_is_slower():
    v = verdict([{"subject": syn.timed(noisy(1.0, 1)), "base": syn.timed(noisy(1.5, 2))},
                 {"subject": syn.timed(noisy(1.0, 3)), "base": syn.timed(noisy(0.7, 4))}], kind=PARITY, margin=0.02)
    assert v.state == REJECTED
    assert [p.word for p in v.points] == [FASTER, SLOWER]
    assert [p.effect for p in v.points] == [MEETS, AGAINST]
    assert "c1" in v.summary and "base is faster" in v.summary


def test_just_outside_the_margin_below_is_slower_and_rejects():
    v = at(0.979, kind=PARITY, margin=0.02)
    assert v.points[0].word == SLOWER and v.state == REJECTED


def test_inconclusive_when_the_interval_is_too_wide():
    same = noisy(1.0, 5, spread=0.2)  # one distribution for both: the ratio is exactly 1, the interval wide
    v = verdict([{"subject": syn.timed(same), "base": syn.timed(same)}], kind=PARITY, margin=0.02)
    (p,) = v.points
    assert p.speedup.low < 0.98 and 1.02 < p.speedup.high
    assert v.state == INCONCLUSIVE and p.word == UNDECIDED


def test_the_summary_names_the_points_against_the_claim_and_counts_the_rest():
    loss = {"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(0.9))}
    v = verdict([loss] * 5, kind=PARITY, margin=0.02)
    assert v.summary.startswith("Against the claim at 5 of 5 points (5 Slower): c0 (float32), c1 (float32), "
                                "c2 (float32) and 2 more.")
    assert "point(s)" not in v.summary


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


def test_the_rule_with_its_numbers():
    text = claim_rule(Claim("s", ("b",), kind=PARITY, margin=Margin(0.015, "measured")))
    assert "Margin ±1.5%" in text and "above 1.015" in text and "below 0.985" in text
    assert "Faster or Level" in text
    assert "lower bound at or above 1.1" in claim_rule(Claim("s", ("b",), 1.1, kind=WIN, margin=Margin(0.01, "m")))


@pytest.mark.parametrize("fields, message", [
    ({"kind": "tie"}, "Claim.kind"),
    ({"threshold": 0.9}, "Claim.threshold"),
    ({"kind": PARITY, "threshold": 1.1}, "parity claim"),
])
def test_a_claim_that_makes_no_sense_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Claim("s", ("b",), **fields)


@pytest.mark.parametrize("fraction", [-0.01, 4.0, 15])
def test_a_margin_outside_its_range_is_refused(fraction):
    with pytest.raises(ValueError, match="Margin.fraction"):
        Margin(fraction, "out of range")


def test_a_wide_margin_keeps_its_band_above_zero():
    # A margin of 100% (the eager-call clock of microsecond calls can move that far): 0.5–2, never 1 − m = 0.
    assert tie_band(1.0) == (0.5, 2.0)
    assert word_for(SpeedupInterval(0.8, 0.76, 0.81, 0.95), 1.0) == LEVEL
    assert word_for(SpeedupInterval(0.4, 0.38, 0.45, 0.95), 1.0) == SLOWER


@pytest.mark.parametrize("clock", ["gpu", "eager", "GPU time", ""])
def test_a_claim_names_one_of_the_two_clocks(clock):
    with pytest.raises(ValueError, match="Claim.clock"):
        Claim("s", ("b",), clock=clock)
    assert Claim("s", ("b",)).clock == GPU_TIME and Claim("s", ("b",), clock=EAGER_CALL).clock == EAGER_CALL


def test_each_clock_is_judged_with_its_own_margin():
    eager = Margin(0.2, "eager spread")
    claim = Claim("s", ("b",), kind=PARITY, margin=Margin(0.01, "gpu spread", eager), clock=EAGER_CALL)
    assert claim.margin_on(GPU_TIME).fraction == 0.01 and claim.margin_on(EAGER_CALL) is eager
    assert Claim("s", ("b",), margin=Margin(0.01, "m")).margin_on(EAGER_CALL).fraction == 0.01, "none of its own"
    with pytest.raises(ValueError, match="clock"):
        claim.margin_on("wall")
    assert "Margin ±20.0%" in claim_rule(claim) and "Margin ±1.0%" in claim_rule(claim, GPU_TIME)
    with pytest.raises(ValueError, match="one clock's margin"):
        Margin(0.01, "m", Margin(0.2, "e", Margin(0.3, "nested")))


# ---- the subject and the baselines ------------------------------------------------------------------


@pytest.mark.parametrize("status, detail", [
    ("incorrect", {"rel_error": 0.3, "reason": "relative error 0.3 exceeds the tolerance 1e-05"}),
    ("error", {"error": "OutOfResources: shared memory"}),
    ("unsupported", {"reason": "declines this shape"}),
])
def test_a_subject_that_did_not_run_correctly_fails_the_point(status, detail):
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": syn.timed(constant(2.0))},
                 {"subject": ProfileResult(status, **detail), "base": syn.timed(constant(2.0))}])
    assert v.state == REJECTED
    assert v.points[1].word == FAILED and v.points[1].effect == AGAINST and status in v.points[1].reason
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
    assert j.baseline == "fast" and j.speedup.ratio == pytest.approx(1.5) and j.word == FASTER and j.effect == MEETS


def test_a_point_without_a_correct_baseline_decides_nothing():
    v = verdict([{"subject": syn.timed(constant(1.0)), "base": ProfileResult("unavailable", reason="absent")}])
    assert v.points[0].word == UNDECIDED and v.points[0].effect == NEITHER and v.state == INCONCLUSIVE


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


def test_bootstrap_is_the_percentile_bootstrap_of_medians_and_ignores_sample_order():
    from lab.evidence.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED

    base, subject = noisy(2.0, 21, n=37), noisy(1.0, 22, n=50)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws_b = rng.integers(0, len(base), (BOOTSTRAP_RESAMPLES, len(base)))
    draws_s = rng.integers(0, len(subject), (BOOTSTRAP_RESAMPLES, len(subject)))
    ratios = np.median(np.sort(base)[draws_b], axis=1) / np.median(np.sort(subject)[draws_s], axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    got = bootstrap_speedup(base, subject)
    assert (got.low, got.high) == pytest.approx((min(low, got.ratio), max(high, got.ratio)), rel=1e-12)
    assert bootstrap_speedup(base[::-1], subject[::-1]) == got


@pytest.mark.parametrize("args, message", [
    (([], [1.0]), "non-empty"),
    (([1.0], [1.0], 1.5), "confidence"),
])
def test_bootstrap_rejects_bad_input(args, message):
    baseline, subject, *confidence = args
    with pytest.raises(ValueError, match=message):
        bootstrap_speedup(baseline, subject, **({"confidence": confidence[0]} if confidence else {}))


def test_the_bootstraps_quantiles_and_medians_are_numpys_bit_for_bit():
    from lab.evidence.stats import _quantiles, _sorted_median

    rng = np.random.default_rng(20261127)
    for trial in range(400):
        n = int(rng.integers(1, 2500))
        values = rng.random(n) * float(rng.choice([1e-3, 1.0, 1e3])) + float(rng.random())
        if trial % 5 == 0:
            values = np.round(values, 2)  # ties
        qs = (0.025, 0.975) if trial % 2 else (0.0, float(rng.random()), 1.0)  # the ends go to numpy itself
        assert _quantiles(values, qs) == np.quantile(values, qs).tolist(), (n, qs)
        ordered = np.sort(values)
        assert _sorted_median(ordered) == float(np.median(ordered)), n
    with_nan = np.array([1.0, float("nan"), 2.0, 3.0])
    assert np.isnan(_quantiles(with_nan, (0.5,))[0])
