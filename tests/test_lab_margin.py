"""The measured margin: which pairs of results count as one kernel timed twice, how the value is taken, and
that every declared experiment carries one with its basis."""

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
from lab.evidence.records import ProfileResult  # noqa: E402

EXPERIMENT = syn.experiment(sources=("kernels/k.py",))
PEER_FILES = profile_source_files(EXPERIMENT, "base", REPO_ROOT)


def _hashes(subject="a", peer="p"):
    hashes = {"kernels/k.py": subject * 64}
    hashes.update({path: peer * 64 for path in PEER_FILES})
    return hashes


def _run(subject_ms, base_ms, *, started, subject_hash="a", peer_hash="p", gpu=syn.GPU_A, env=None, timing=None):
    run = syn.run([syn.point({"subject": syn.timed([subject_ms] * 5), "base": syn.timed([base_ms] * 5)})],
                  gpu=gpu, hashes=_hashes(subject_hash, peer_hash), started=started)
    if env:
        run = replace(run, environment={**run.environment, **env})
    if timing:
        run = replace(run, timing=replace(run.timing, **timing))
    return run


def test_a_profile_whose_code_is_unchanged_is_compared_across_runs():
    # The subject's kernel changed between the runs (its own hash differs), the baseline's did not: only the
    # baseline was timed twice.
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z", subject_hash="a")
    b = _run(0.5, 2.02, started="2026-01-02T00:00:00Z", subject_hash="b")
    (c,) = margin.same_kernel_comparisons(EXPERIMENT, [a, b], REPO_ROOT)
    assert (c.profile, c.case, c.gpu_key) == ("base", "c", "nvidia-test-gpu-a")
    assert c.log_ratio == pytest.approx(abs(math.log(2.0 / 2.02)))


def test_both_profiles_count_when_nothing_changed():
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z")
    b = _run(1.01, 2.0, started="2026-01-02T00:00:00Z")
    assert sorted(c.profile for c in margin.same_kernel_comparisons(EXPERIMENT, [a, b], REPO_ROOT)) == ["base", "subject"]


@pytest.mark.parametrize("change", [
    {"gpu": ("nvidia-test-gpu-b", "NVIDIA Test GPU B")},
    {"env": {"torch": "2.99.0"}},
    {"env": {"packages": {"liger-kernel": "9.9"}}},
    {"timing": {"l2_flush_bytes": 1}},
    {"peer_hash": "q", "subject_hash": "b"},
])
def test_runs_that_differ_in_gpu_software_timing_or_code_are_not_compared(change):
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z")
    b = _run(1.0, 2.0, started="2026-01-02T00:00:00Z", **change)
    assert margin.same_kernel_comparisons(EXPERIMENT, [a, b], REPO_ROOT) == []


def test_results_that_were_not_timed_correctly_are_left_out():
    a = _run(1.0, 2.0, started="2026-01-01T00:00:00Z")
    b = syn.run([syn.point({"subject": syn.timed([1.0] * 5), "base": ProfileResult("incorrect", reason="wrong")})],
                hashes=_hashes(), started="2026-01-02T00:00:00Z")
    assert [c.profile for c in margin.same_kernel_comparisons(EXPERIMENT, [a, b], REPO_ROOT)] == ["subject"]


def test_cpu_interpreter_runs_are_never_compared():
    a = syn.run([syn.point({"subject": syn.timed([1.0] * 5), "base": syn.timed([2.0] * 5)})], hashes=_hashes(),
                cpu=True, started="2026-01-01T00:00:00Z")
    b = replace(a, run_id="other", started_utc="2026-01-02T00:00:00Z")
    assert margin.same_kernel_comparisons(EXPERIMENT, [a, b], REPO_ROOT) == []


def _comparisons(values):
    return [margin.Comparison("exp", "g", "p", f"c{i}", "float32", ("r1", "r2"), v) for i, v in enumerate(values)]


def test_the_margin_is_the_95th_percentile_rounded_up_to_a_tenth_of_a_percent():
    values = [i / 10000 for i in range(101)]  # 0 .. 1%: the 95th percentile is 0.95% in log terms
    assert margin.margin_fraction(_comparisons(values)) == pytest.approx(0.010)  # expm1(0.0095) = 0.954% -> 1.0%
    assert margin.margin_fraction(_comparisons([0.02] * 10)) == pytest.approx(0.021)  # expm1(0.02) = 2.02% -> 2.1%
    assert margin.margin_fraction(_comparisons([0.0] * 10)) == 0.0


def test_an_experiment_with_too_few_comparisons_takes_the_pooled_value():
    many = [_run(1.0, 2.0 + i / 1000, started=f"2026-01-{i + 1:02d}T00:00:00Z") for i in range(25)]
    other = syn.experiment(slug="other", sources=("kernels/k.py",))
    few = [replace(_run(1.0, 2.0, started="2026-01-01T00:00:00Z"), experiment="other", run_id="o1"),
           replace(_run(1.0, 2.1, started="2026-01-02T00:00:00Z"), experiment="other", run_id="o2")]
    data = margin.derive_margins({"exp": EXPERIMENT, "other": other}, many + few, REPO_ROOT)
    assert data["experiments"]["exp"]["source"] == "own" and data["experiments"]["exp"]["comparisons"] >= 200
    assert data["experiments"]["other"]["source"] == "pooled"
    assert data["experiments"]["other"]["fraction"] == data["pooled"]["fraction"]
    assert "fewer than the 200" in data["experiments"]["other"]["basis"]
    assert "95th percentile" in data["rule"]


def test_no_comparison_at_all_is_an_error_naming_the_way_out():
    with pytest.raises(ValueError, match="run an experiment twice"):
        margin.derive_margins({"exp": EXPERIMENT}, [_run(1.0, 2.0, started="2026-01-01T00:00:00Z")], REPO_ROOT)


def test_a_declaration_reads_its_margin_or_the_pooled_one(tmp_path, monkeypatch):
    data = {"rule": "r", "pooled": {"fraction": 0.02, "basis": "pooled basis"},
            "experiments": {"x": {"fraction": 0.011, "basis": "own basis"}}}
    path = tmp_path / "margins.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setattr(_margins, "MARGINS_FILE", path)
    assert (_margins.measured_margin("x").fraction, _margins.measured_margin("x").basis) == (0.011, "own basis")
    new = _margins.measured_margin("not-yet-derived")
    assert new.fraction == 0.02 and new.basis.startswith("pooled basis")
    monkeypatch.setattr(_margins, "MARGINS_FILE", tmp_path / "absent.json")
    assert _margins.measured_margin("x") is NO_MARGIN


def test_every_declared_experiment_has_a_measured_margin():
    data = json.loads(_margins.MARGINS_FILE.read_text(encoding="utf-8"))
    for slug, experiment in all_experiments().items():
        assert slug in data["experiments"], f"experiments/margins.json lacks {slug}: run tools/derive_margin.py"
        entry = data["experiments"][slug]
        assert experiment.claim.margin.fraction == entry["fraction"] > 0
        assert experiment.claim.margin.basis == entry["basis"]


def test_claim_kinds_match_their_statements():
    # "at least as fast" and "no more than" are parity claims (a tie meets them); "faster than" alone is a win.
    for slug, experiment in all_experiments().items():
        statement = experiment.claim.statement
        parity = "at least as fast" in statement or "no more than" in statement
        assert (experiment.claim.kind == "parity") == parity, (slug, experiment.claim.kind, statement)
