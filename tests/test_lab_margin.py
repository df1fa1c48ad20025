"""The measured margins: which pairs of points count as one speedup measured twice on each clock, how each clock's
value is taken and pooled, and that every declared experiment carries one per clock with its basis."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from experiments import _margins, all_experiments  # noqa: E402
from experiments.spec import NO_MARGIN  # noqa: E402
from lab import REPO_ROOT  # noqa: E402
from lab.evidence import margin  # noqa: E402
from lab.evidence.hashing import profile_source_files  # noqa: E402
from lab.evidence.records import EagerMethod, EagerResult, ProfileResult  # noqa: E402

EXPERIMENT = syn.experiment(sources=("kernels/k.py",), others=("other",))
PEER_FILES = profile_source_files(EXPERIMENT, "base", REPO_ROOT)
GPU = margin.GPU_TIME
EAGER = margin.EAGER_CALL


def _hashes(subject="a", peer="p"):
    hashes = {"kernels/k.py": subject * 64}
    hashes.update({path: peer * 64 for path in PEER_FILES})
    return hashes


def _eager(ms):
    return EagerResult(samples_ms=(ms,) * 5, host_samples_ms=(ms / 2,) * 5, calls_per_sample=10, p20_ms=ms,
                       p50_ms=ms, p80_ms=ms, host_p50_ms=ms / 2)


def _result(ms, eager_ms=None):
    return syn.timed([ms] * 5, eager=_eager(eager_ms) if eager_ms is not None else None)


EAGER_METHOD = EagerMethod("perf_counter", 1 << 28, 2, 5, 0.005, 10, 1000, 16)


def _run(subject_ms, base_ms, *, started, subject_hash="a", peer_hash="p", gpu=syn.GPU_A, env=None, timing=None,
         other_ms=None, eager=None, slug="exp", case="c"):
    """A run of one point; `eager` = (subject, base, other) eager ms gives it the eager-call clock too."""
    eager = eager or (None, None, None)
    results = {"subject": _result(subject_ms, eager[0]), "base": _result(base_ms, eager[1])}
    if other_ms is not None:
        results["other"] = _result(other_ms, eager[2])
    run = syn.run([syn.point(results, case=case)], gpu=gpu, hashes=_hashes(subject_hash, peer_hash), started=started,
                  slug=slug)
    if eager[0] is not None:
        run = replace(run, eager=EAGER_METHOD)
    if env:
        run = replace(run, environment={**run.environment, **env})
    if timing:
        run = replace(run, timing=replace(run.timing, **timing))
    return run


def test_the_claims_speedup_is_compared_across_runs_of_unchanged_code():
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z")
    b = _run(1.0, 2.02, started="2026-01-02T00:00:00Z")
    (c,) = margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT)
    assert (c.numerator, c.baselines, c.case, c.gpu_key) == ("subject", ("base", "base"), "c", "nvidia-test-gpu-a")
    assert c.log_ratio == pytest.approx(abs(math.log(2.0 / 2.02)))


def test_a_ratio_of_two_kernels_that_drift_together_does_not_move():
    # Both medians moved 10% between the runs (a slower clock that day): the speedup did not.
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z")
    b = _run(1.1, 2.2, started="2026-01-02T00:00:00Z")
    (c,) = margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT)
    assert c.log_ratio == pytest.approx(0.0, abs=1e-12)


def test_an_unchanged_profile_stands_in_for_a_subject_whose_code_changed():
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z", subject_hash="a", other_ms=4.0)
    b = _run(0.5, 2.0, started="2026-01-02T00:00:00Z", subject_hash="b", other_ms=4.4)
    (c,) = margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT)
    assert c.numerator == "other" and c.log_ratio == pytest.approx(math.log(1.1))


def test_a_compiled_profile_stands_in_on_gpu_time_but_never_on_the_eager_clock():
    compiled = syn.experiment(sources=("kernels/k.py",), others=("torch.compile",))

    def run(subject_hash, compiled_eager, day):
        results = {"subject": _result(1.0, 10.0), "base": _result(2.0, 12.0),
                   "torch.compile": _result(1.5, compiled_eager)}
        return replace(syn.run([syn.point(results)], hashes=_hashes(subject_hash), started=f"2026-01-0{day}T00:00:00Z"),
                       eager=EAGER_METHOD)

    a, b = run("a", 40.0, 1), run("b", 120.0, 2)  # the subject changed; the compiled call's host time tripled
    (g,) = margin.same_code_comparisons(compiled, [a, b], REPO_ROOT, GPU)
    assert g.numerator == "torch.compile" and g.log_ratio == pytest.approx(0.0, abs=1e-12)
    assert margin.same_code_comparisons(compiled, [a, b], REPO_ROOT, EAGER) == []


def test_a_peer_that_times_its_kernels_at_run_time_never_stands_in_but_still_counts_as_a_baseline():
    tuned = syn.experiment(baselines=("base", "gemlite-int8"), sources=("kernels/k.py",), others=("other",))

    def run(subject_hash, gemlite_ms, base_ms, day):
        results = {"subject": _result(1.0), "base": _result(base_ms), "gemlite-int8": _result(gemlite_ms),
                   "other": _result(3.0)}
        return syn.run([syn.point(results)], hashes=_hashes(subject_hash), started=f"2026-01-0{day}T00:00:00Z")

    # The subject changed and gemlite's autotuner picked a slower kernel the second time (it is not the
    # fastest baseline in either run): only the plain profile stands in, and its ratio did not move.
    a, b = run("a", 2.5, 2.0, 1), run("b", 4.0, 2.0, 2)
    (c,) = margin.same_code_comparisons(tuned, [a, b], REPO_ROOT, GPU)
    assert c.numerator == "other" and c.log_ratio == pytest.approx(0.0, abs=1e-12)
    # Where it is the fastest baseline, its move is part of the claim's speedup and is counted.
    a, b = run("a", 1.5, 2.0, 1), run("a", 1.65, 2.0, 2)
    (c,) = margin.same_code_comparisons(tuned, [a, b], REPO_ROOT, GPU)
    assert c.numerator == "subject" and c.baselines == ("gemlite-int8", "gemlite-int8")
    assert c.log_ratio == pytest.approx(math.log(1.1))


@pytest.mark.parametrize("change", [
    {"gpu": ("nvidia-test-gpu-b", "NVIDIA Test GPU B")},
    {"env": {"torch": "2.99.0"}},
    {"env": {"packages": {"liger-kernel": "9.9"}}},
    {"timing": {"l2_flush_bytes": 1}},
    {"peer_hash": "q"},
])
def test_runs_that_differ_in_gpu_software_timing_or_baseline_code_are_not_compared(change):
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z", other_ms=3.0)
    b = _run(1.0, 2.0, started="2026-01-02T00:00:00Z", other_ms=3.0, **change)
    assert margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT) == []


def test_results_that_were_not_timed_correctly_are_left_out():
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z")
    b = syn.run([syn.point({"subject": syn.timed([1.0] * 5), "base": ProfileResult("incorrect", reason="wrong")})],
                hashes=_hashes(), started="2026-01-02T00:00:00Z")
    assert margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT) == []


def test_cpu_interpreter_runs_are_never_compared():
    a = syn.run([syn.point({"subject": syn.timed([1.0] * 5), "base": syn.timed([2.0] * 5)})], hashes=_hashes(),
                cpu=True, started="2026-01-01T00:00:00Z")
    b = replace(a, run_id="other", started_utc="2026-01-02T00:00:00Z")
    assert margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT) == []


def test_the_eager_clock_compares_eager_medians_and_only_runs_that_measured_it():
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z", eager=(10.0, 12.0, None))
    b = _run(1.0, 2.0, started="2026-01-02T00:00:00Z", eager=(10.0, 18.0, None))
    (c,) = margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT, EAGER)
    assert c.clock == EAGER and c.log_ratio == pytest.approx(math.log(1.5))
    (g,) = margin.same_code_comparisons(EXPERIMENT, [a, b], REPO_ROOT, GPU)
    assert g.log_ratio == 0
    gpu_only = _run(1.0, 2.0, started="2026-01-03T00:00:00Z")
    assert margin.same_code_comparisons(EXPERIMENT, [a, gpu_only], REPO_ROOT, EAGER) == []


def _comparisons(values):
    return [margin.Comparison("exp", GPU, "g", f"c{i}", "float32", ("r1", "r2"), "subject", ("b", "b"), v)
            for i, v in enumerate(values)]


def test_the_margin_is_the_95th_percentile_rounded_up_to_a_tenth_of_a_percent():
    values = [i / 10000 for i in range(101)]  # 0 .. 1%: the 95th percentile is 0.95% in log terms
    assert margin.margin_fraction(_comparisons(values)) == pytest.approx(0.010)  # expm1(0.0095) = 0.954% -> 1.0%
    assert margin.margin_fraction(_comparisons([0.02] * 10)) == pytest.approx(0.021)  # expm1(0.02) = 2.02% -> 2.1%
    assert margin.margin_fraction(_comparisons([0.0] * 10)) == 0.0


def _series(slug, n, gpu_wobble, eager_wobble, start_day=1):
    """n runs of unchanged code of `slug`, one point each: the speedup wobbles by `gpu_wobble` on GPU time and by
    `eager_wobble` on the eager-call clock from run to run."""
    runs = []
    for i in range(n):
        sign = 1 if i % 2 else -1
        runs.append(_run(1.0, 2.0 * (1 + sign * gpu_wobble), eager=(10.0, 20.0 * (1 + sign * eager_wobble), None),
                         started=f"2026-01-{start_day + i:02d}T00:00:00Z", slug=slug))
    return runs


def test_each_clock_gets_its_own_margin_from_its_own_spread():
    runs = _series("exp", 16, 0.005, 0.10)  # 120 pairs of runs
    data = margin.derive_margins({"exp": EXPERIMENT}, runs, REPO_ROOT)
    gpu, eager = data["experiments"]["exp"][GPU], data["experiments"]["exp"][EAGER]
    assert gpu["source"] == eager["source"] == "own" and gpu["comparisons"] == eager["comparisons"] == 120
    assert gpu["fraction"] == pytest.approx(0.011)  # 1.005 / 0.995 - 1 = 1.005%, rounded up
    assert eager["fraction"] == pytest.approx(0.223)  # 1.10 / 0.90 - 1 = 22.2%, rounded up
    assert "eager-call clock" in eager["basis"] and "GPU-time clock" in gpu["basis"]


def test_an_eager_margin_is_never_below_the_gpu_time_margin():
    runs = _series("exp", 16, 0.02, 0.0)  # the eager ratio never moves
    entry = margin.derive_margins({"exp": EXPERIMENT}, runs, REPO_ROOT)["experiments"]["exp"]
    assert entry[EAGER]["spread"] == 0.0
    assert entry[EAGER]["fraction"] == entry[GPU]["fraction"] > 0.04
    assert "GPU-time floor" in entry[EAGER]["source"] and "raised to the GPU-time margin" in entry[EAGER]["basis"]


def test_too_few_pairs_pool_over_experiments_of_the_same_kind_only():
    experiments = {slug: syn.experiment(slug=slug, sources=("kernels/k.py",), others=("other",))
                   for slug in ("softmax-a", "softmax-b", "swiglu-a", "add-rmsnorm-a")}
    runs = (_series("softmax-a", 16, 0.005, 0.05) + _series("softmax-b", 3, 0.3, 0.3)
            + _series("swiglu-a", 11, 0.03, 0.2) + _series("add-rmsnorm-a", 3, 0.0, 0.0))
    data = margin.derive_margins(experiments, runs, REPO_ROOT)
    entries = data["experiments"]
    assert data["kinds"] == {"fusion": ["add-rmsnorm-a", "swiglu-a"], "softmax": ["softmax-a", "softmax-b"]}
    assert entries["softmax-a"][GPU]["source"] == "own"
    # softmax-b has 3 pairs of its own: it takes the softmax pool (dominated by softmax-a), not the fusion one.
    assert entries["softmax-b"][GPU]["source"] == "kind" and entries["softmax-b"][GPU]["kind"] == "softmax"
    assert entries["softmax-b"][GPU]["fraction"] == data["pooled"][GPU]["softmax"]["fraction"] < 0.02
    assert "pooled over the softmax experiments" in entries["softmax-b"][GPU]["basis"]
    assert "fewer than the 100" in entries["softmax-b"][GPU]["basis"]
    # add-rmsnorm-a never moved; it takes the fusion pool, which swiglu-a's wobble dominates.
    assert entries["add-rmsnorm-a"][GPU]["fraction"] == data["pooled"][GPU]["fusion"]["fraction"] > 0.05
    assert entries["add-rmsnorm-a"][EAGER]["fraction"] >= entries["add-rmsnorm-a"][GPU]["fraction"]
    assert "95th percentile" in data["rule"]


def test_a_kind_with_too_few_pairs_pools_over_every_experiment():
    experiments = {slug: syn.experiment(slug=slug, sources=("kernels/k.py",)) for slug in ("softmax-a", "attention-a")}
    runs = _series("softmax-a", 16, 0.01, 0.05) + _series("attention-a", 2, 0.0, 0.0)
    entry = margin.derive_margins(experiments, runs, REPO_ROOT)["experiments"]["attention-a"][GPU]
    assert entry["source"] == "all" and "pooled over every experiment" in entry["basis"]


def test_kinds_come_from_the_slug_and_every_declared_experiment_has_one():
    assert [margin.experiment_kind(s) for s in ("softmax-fwd-sweep", "swiglu-bwd", "add-rmsnorm-fwd",
                                                "rmsnorm-linear-decode", "dequant-linear-decode", "attention-fwd",
                                                "decoder-block-graphed", "new-thing")] == \
        ["softmax", "fusion", "fusion", "linear", "linear", "attention", "block", margin.OTHER_KIND]
    assert all(margin.experiment_kind(slug) != margin.OTHER_KIND for slug in all_experiments())


def test_no_comparison_at_all_is_an_error_naming_the_way_out():
    with pytest.raises(ValueError, match="run an experiment twice"):
        margin.derive_margins({"exp": EXPERIMENT}, [_run(1.0, 2.0, started="2026-01-01T00:00:00Z")], REPO_ROOT)


def test_a_declaration_reads_its_margins_or_the_pooled_ones(tmp_path, monkeypatch):
    data = {"rule": "r",
            "pooled": {GPU: {"all": {"fraction": 0.02, "basis": "pooled basis"}},
                       EAGER: {"all": {"fraction": 0.3, "basis": "pooled eager basis"}}},
            "experiments": {"x": {GPU: {"fraction": 0.011, "basis": "own basis"},
                                  EAGER: {"fraction": 0.2, "basis": "own eager basis"}}}}
    path = tmp_path / "margins.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setattr(_margins, "MARGINS_FILE", path)
    m = _margins.measured_margin("x")
    assert (m.fraction, m.basis, m.eager.fraction, m.eager.basis) == (0.011, "own basis", 0.2, "own eager basis")
    new = _margins.measured_margin("not-yet-derived")
    assert new.fraction == 0.02 and new.basis.startswith("pooled basis")
    assert new.eager.fraction == 0.3 and new.eager.basis.startswith("pooled eager basis")
    monkeypatch.setattr(_margins, "MARGINS_FILE", tmp_path / "absent.json")
    assert _margins.measured_margin("x") is NO_MARGIN


def test_every_declared_experiment_has_a_measured_margin_per_clock():
    data = json.loads(_margins.MARGINS_FILE.read_text(encoding="utf-8"))
    for slug, experiment in all_experiments().items():
        assert slug in data["experiments"], f"experiments/margins.json lacks {slug}: run tools/derive_margin.py"
        for clock in (GPU, EAGER):
            entry = data["experiments"][slug][clock]
            declared = experiment.claim.margin_on(clock)
            assert declared.fraction == entry["fraction"] > 0 and declared.basis == entry["basis"], (slug, clock)
            assert {"fraction", "source", "basis", "comparisons"} <= set(entry)
        assert experiment.claim.margin_on(EAGER).fraction >= experiment.claim.margin_on(GPU).fraction


def test_claim_kinds_match_their_statements():
    # "at least as fast" and "no more than" are parity claims (a tie meets them); "faster than" alone is a win.
    for slug, experiment in all_experiments().items():
        statement = experiment.claim.statement
        parity = "at least as fast" in statement or "no more than" in statement
        assert (experiment.claim.kind == "parity") == parity, (slug, experiment.claim.kind, statement)


def test_claim_clocks_match_their_statements():
    # A statement that names the eager-call clock is judged on it; every other on GPU time. decoder-block-graphed
    # compares replayed graphs, whose cost the GPU-time clock measures (its statement names no clock).
    for slug, experiment in all_experiments().items():
        eager = "eager-call clock" in experiment.claim.statement
        assert experiment.claim.clock == (EAGER if eager else GPU), (slug, experiment.claim.statement)
    assert all_experiments()["softmax-call-overhead"].claim.clock == EAGER
    assert all_experiments()["decoder-block-graphed"].claim.clock == GPU
