"""The runner end to end on a tiny experiment declared here: record written, statuses right, pages rendered.

On a machine without CUDA this runs through Triton's interpreter (conftest sets TRITON_INTERPRET=1) and the
record must say "cpu-interpreter: not performance evidence"; on a GPU the same test times compiled kernels.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

from experiments import _softmax as sm
from experiments.spec import Case, Claim, Experiment, Profile
from kernels.softmax import softmax
from lab import REPO_ROOT
from lab.evidence.hashing import source_hashes
from lab.evidence.records import CPU_EVIDENCE, GPU_EVIDENCE
from lab.evidence.store import load_records
from lab.publish.collect import collect_evidence
from lab.publish.render import render_outputs
from lab.measure.inputs import input_seed, select_rows
from lab.measure.runner import allow_a_compile_per_point, check_declaration, measure_point, run_experiment
from lab.measure.timing import SAMPLE_DIGITS, CudaEventClock, TimingParams, WallClock, kept_sample
from lab.evidence.verdict import NO_EVIDENCE

FEW = TimingParams(warmup_rounds=1, min_samples=3, max_samples=3, target_seconds=0.0, copy_bytes=1 << 20,
                   copy_repeats=2)


def wrong_softmax(x):
    return torch.softmax(x, -1).flip(-1)


def last_row_broken(x):
    y = torch.softmax(x, -1)
    y[-1] = 0
    return y


def raising(x):
    raise RuntimeError("deliberate failure inside a profile")


def _never(case, dtype):
    return "declines every case (test)"


def tiny_experiment(**overrides) -> Experiment:
    fields = dict(
        slug="tiny-softmax",
        title="Tiny softmax",
        question="Does the runner record every status?",
        focus="runner",
        why="end-to-end test of the machinery",
        claim=Claim("kernel", ("torch",), 1.0, "kernel is faster than torch", "tiny claim"),
        cases=(Case("4x64", {"M": 4, "N": 64}), Case("4x48", {"M": 4, "N": 48})),
        dtypes=(torch.float32,),
        profiles=(
            Profile("torch", "torch.softmax", lambda x: torch.softmax(x, -1)),
            Profile("kernel", "the lab's softmax", lambda x: softmax(x, -1), sm.SOFTMAX_SOURCES,
                    plan=lambda case, dtype: {"rows": case["M"], "dtype": dtype}),
            Profile("wrong", "a wrong result", wrong_softmax),
            Profile("raises", "raises", raising),
            Profile("declines", "declines", lambda x: x, unsupported=_never),
            Profile("absent-peer", "needs a module that is not installed", lambda x: x,
                    requires="kernel_lab_test_module_that_does_not_exist"),
        ),
        make_inputs=sm.forward_inputs,
        reference=sm.forward_reference,
        bytes_moved=sm.forward_bytes,
        byte_model="forward: 2·M·N·size bytes",
        evidence_boundary="a test",
        tolerance=sm.FORWARD_TOLERANCE,
        x_axis="N",
        source_file="tests/test_lab_runner.py",
    )
    fields.update(overrides)
    return Experiment(**fields)


def test_run_records_every_status_and_renders_the_evidence_note(tmp_path):
    experiment = tiny_experiment()
    record, path = run_experiment(experiment, device=DEVICE, records_dir=tmp_path, params=FEW, progress=False)

    assert path == tmp_path / experiment.slug / f"{record.run_id}.json.gz"
    (loaded,), problems = load_records(tmp_path)
    assert problems == [] and loaded == record
    assert record.evidence == (GPU_EVIDENCE if HAS_CUDA else CPU_EVIDENCE)
    assert f"-{record.gpu_key}-" in record.run_id
    assert record.hashes == source_hashes(experiment, REPO_ROOT)
    assert "kernels/softmax.py" in record.hashes and "tests/test_lab_runner.py" in record.hashes
    assert record.copy_ceiling.gbps > 0 and len(record.copy_ceiling.samples_ms) == FEW.copy_repeats
    assert record.timing.min_samples == 3 and record.timing.clock == (CudaEventClock.name if HAS_CUDA else WallClock.name)
    assert record.timing.l2_flush == "read"  # the clean flush, said in the record
    for ceiling in (record.read_ceiling, record.read2_write_ceiling):
        assert ceiling.gbps > 0 and len(ceiling.samples_ms) == FEW.copy_repeats
    kept = [*record.copy_ceiling.samples_ms, *record.read_ceiling.samples_ms,
            *record.read2_write_ceiling.samples_ms, *(record.matmul_peak.samples_ms if record.matmul_peak else ())]
    kept += [x for p in record.points for r in p.results.values() for x in r.samples_ms]
    assert len(kept) > 4 * FEW.copy_repeats
    assert all(x == float(f"{x:.{SAMPLE_DIGITS}g}") for x in kept), "a sample keeps more digits than the record's"

    assert [(p.case, p.dtype) for p in record.points] == [("4x64", "float32"), ("4x48", "float32")]
    for case, point in zip(experiment.cases, record.points, strict=True):
        r = point.results
        assert point.input_seed == input_seed(experiment.slug, case, torch.float32)
        for name in ("torch", "kernel"):
            assert r[name].status == "ok", r[name]
            assert len(r[name].samples_ms) == 3
            assert r[name].p20_ms <= r[name].p50_ms <= r[name].p80_ms
            assert r[name].gbps == pytest.approx(point.bytes_moved / (r[name].p50_ms * 1e-3) / 1e9)
            assert r[name].rel_error < sm.FORWARD_TOLERANCE[torch.float32]
        assert r["kernel"].plan == {"rows": 4, "dtype": "float32"}
        assert r["wrong"].status == "incorrect" and r["wrong"].rel_error > 0.1 and not r["wrong"].samples_ms
        assert "exceeds the tolerance" in r["wrong"].reason
        assert r["raises"].status == "error" and "deliberate failure inside a profile" in r["raises"].error
        assert r["declines"].status == "unsupported" and r["declines"].reason == "declines every case (test)"
        assert r["absent-peer"].status == "unavailable"
        assert "kernel_lab_test_module_that_does_not_exist" in r["absent-peer"].reason

    evidence = collect_evidence({experiment.slug: experiment}, (), tmp_path,
                                {experiment.slug: record.hashes})
    page = render_outputs(evidence)[f"experiments/{experiment.slug}.md"]
    assert record.run_id in page and "✗ incorrect" in page and "deliberate failure" in page
    if not HAS_CUDA:
        assert evidence.verdicts[experiment.slug]["cpu-interpreter"].state == NO_EVIDENCE
        assert page.count("cpu-interpreter: not performance evidence") >= 2


def test_a_huge_case_is_checked_on_its_first_and_last_rows(tmp_path):
    experiment = tiny_experiment(
        cases=(Case("16x32", {"M": 16, "N": 32}),),
        profiles=(Profile("torch", "torch.softmax", lambda x: torch.softmax(x, -1)),
                  Profile("last-row-broken", "zeroes the last row", last_row_broken)),
        row_inputs=("x",),
    )
    inputs = experiment.make_inputs(experiment.cases[0], torch.float32, DEVICE, torch.Generator().manual_seed(0))
    assert select_rows(experiment, inputs, budget=16 * 32).index is None
    rows = select_rows(experiment, inputs, budget=4 * 32)
    assert rows.describe() == {"first": 2, "last": 2, "of": 16}
    assert rows.index.tolist() == [0, 1, 14, 15]

    point = measure_point(experiment, experiment.cases[0], torch.float32, device=DEVICE, clock=WallClock(1 << 12),
                          params=FEW, ceiling_gbps=1.0, check_budget=4 * 32)
    assert point.checked_rows == {"first": 2, "last": 2, "of": 16}
    assert point.results["torch"].status == "ok"
    assert point.results["last-row-broken"].status == "incorrect", "the last rows are among those checked"


def _softmax_and_row_max(x):
    return torch.softmax(x, -1), x.amax(-1)


def _softmax_and_wrong_row_max(x):
    return torch.softmax(x, -1), x.amax(-1) * 1.01  # the small output alone is wrong


def _softmax_and_a_nan(x):
    m = x.amax(-1)
    m[0] = float("nan")
    return torch.softmax(x, -1), m


def test_several_outputs_are_checked_one_by_one_and_the_largest_error_counts(tmp_path):
    experiment = tiny_experiment(
        cases=(Case("16x32", {"M": 16, "N": 32}),),
        profiles=(Profile("pair", "softmax and row max", _softmax_and_row_max),
                  Profile("wrong-max", "row max 1% high", _softmax_and_wrong_row_max),
                  Profile("nan-max", "one NaN in the row max", _softmax_and_a_nan),
                  Profile("one-output", "softmax alone", lambda x: torch.softmax(x, -1)),
                  Profile("three-outputs", "one output too many", lambda x: (x, x, x))),
        claim=Claim("pair", ("wrong-max",), 1.0, "pair is faster", "pair claim"),
        reference=lambda x: _softmax_and_row_max(x.double()),
        row_inputs=("x",),
    )
    for budget in (1 << 22, 4 * 32):  # every row, then the first and last two
        point = measure_point(experiment, experiment.cases[0], torch.float32, device=DEVICE,
                              clock=WallClock(1 << 12), params=FEW, ceiling_gbps=1.0, check_budget=budget)
        r = point.results
        assert r["pair"].status == "ok" and r["pair"].rel_error < 1e-6
        assert r["wrong-max"].status == "incorrect" and r["wrong-max"].rel_error == pytest.approx(0.01, rel=1e-3)
        assert r["nan-max"].status == "incorrect" and "output 1: output holds NaN" in r["nan-max"].reason
        assert r["one-output"].status == "incorrect" and "returned Tensor, not the reference's 2 outputs" in r["one-output"].reason
        assert "returned 3 outputs" in r["three-outputs"].reason


def test_a_failing_input_builder_marks_every_profile_of_that_point_and_the_run_goes_on():
    def inputs(case, dtype, device, gen):
        if case["N"] == 48:
            raise MemoryError("no room for the inputs")
        return sm.forward_inputs(case, dtype, device, gen)

    experiment = tiny_experiment(make_inputs=inputs, profiles=tiny_experiment().profiles[:1])
    points = [measure_point(experiment, case, torch.float32, device=DEVICE, clock=WallClock(1 << 12), params=FEW,
                            ceiling_gbps=1.0) for case in experiment.cases]
    assert points[0].results["torch"].status == "ok"
    assert points[1].results["torch"].status == "error"
    assert "inputs or reference failed: MemoryError: no room for the inputs" == points[1].results["torch"].error


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
def test_runner_refuses_cuda_without_a_gpu(tmp_path):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        run_experiment(tiny_experiment(), device="cuda", records_dir=tmp_path, params=FEW, progress=False)
    assert not any(tmp_path.iterdir())


def test_compile_limits_cover_every_point_of_every_run_in_one_process():
    # The compiled references are shared across experiments in one process: 20 points already compiled by
    # earlier runs plus the 98 of this one must all fit, or the last points silently time eager PyTorch.
    import torch._dynamo

    config = torch._dynamo.config
    # config.patch restores both limits on exit (monkeypatch's undo leaves torch's config module without them).
    with config.patch(recompile_limit=8, accumulated_recompile_limit=config.accumulated_recompile_limit):
        allow_a_compile_per_point(20)
        allow_a_compile_per_point(98)
        assert config.recompile_limit >= 8 + 20 + 98
        before = config.recompile_limit
        allow_a_compile_per_point(2)
        assert config.recompile_limit >= before + 2, "never lowered"


def test_compile_limits_granted_before_dynamo_loads_are_added_as_it_loads(tmp_path, monkeypatch):
    # A process that has not imported torch._dynamo keeps the grants and adds them when its configuration module
    # finishes loading, before anything can compile; here a stand-in module plays that part.
    from lab.measure import compile_limits

    (tmp_path / "fake_dynamo_config.py").write_text("recompile_limit = 8\naccumulated_recompile_limit = 256\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compile_limits, "CONFIG", "fake_dynamo_config")
    monkeypatch.setattr(compile_limits, "_loaded", False)
    monkeypatch.setattr(compile_limits, "_pending", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "fake_dynamo_config", raising=False)
    compile_limits.allow_a_compile_per_point(20)
    compile_limits.allow_a_compile_per_point(98)
    assert "fake_dynamo_config" not in sys.modules
    assert compile_limits.granted_before_import() == {"recompile_limit": 28 + 106,
                                                      "accumulated_recompile_limit": 8 * 118 + 2 * 256}
    import fake_dynamo_config as config

    assert (config.recompile_limit, config.accumulated_recompile_limit) == (8 + 28 + 106, 256 + 8 * 118 + 2 * 256)
    assert compile_limits.granted_before_import() == {}
    compile_limits.allow_a_compile_per_point(2)  # once loaded, at once
    assert config.recompile_limit == 8 + 28 + 106 + 10


GRANT_THEN_IMPORT = """
import json, sys
from lab.measure.runner import allow_a_compile_per_point
allow_a_compile_per_point(20)
allow_a_compile_per_point(98)
before = "torch._dynamo" in sys.modules
import torch._dynamo
config = torch._dynamo.config
print(json.dumps({"before": before, **{name: [getattr(config, name), config._config[name].default]
                                       for name in ("recompile_limit", "accumulated_recompile_limit")}}))
"""


def test_torch_dynamo_is_imported_only_to_compile_and_then_gets_every_grant():
    # The runner imports no torch._dynamo (2.4 CPU seconds) for a run that compiles nothing; torch.compile's
    # first import of it gets every grant made before.
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", GRANT_THEN_IMPORT], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["before"] is False
    limit, default = seen["recompile_limit"]
    assert limit == default + 28 + 106
    limit, default = seen["accumulated_recompile_limit"]
    assert limit == default + 8 * 118 + 2 * 256


@pytest.mark.parametrize("change, message", [
    (lambda e: {"claim": Claim("nope", ("torch",))}, "claim subject 'nope' is not a profile"),
    (lambda e: {"claim": Claim("kernel", ("torch", "peer"))}, "claim baseline 'peer' is not a profile"),
    (lambda e: {"profiles": e.profiles + e.profiles[:1]}, "profile names repeat: torch"),
    (lambda e: {"dtypes": (torch.float32, torch.float64)}, "no tolerance for dtype(s) float64"),
    (lambda e: {"cases": ()}, "at least one case"),
    (lambda e: {"slug": "Tiny/../x"}, "names a run record refuses: 'Tiny/../x'"),
    (lambda e: {"cases": (Case("a b", {"M": 2, "N": 8}),)}, "names a run record refuses: 'a b'"),
])
def test_a_declaration_that_cannot_run_is_refused_before_anything_runs(tmp_path, change, message):
    experiment = tiny_experiment()
    bad = tiny_experiment(**change(experiment))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_experiment(bad, device=DEVICE, records_dir=tmp_path, params=FEW, progress=False)
    assert not any(tmp_path.iterdir())
    check_declaration(experiment)


def test_every_declared_experiment_is_runnable_as_declared():
    from experiments import all_experiments

    for experiment in all_experiments().values():
        check_declaration(experiment)


def test_a_profile_with_its_own_byte_model_records_it_and_its_rates_divide_it():
    half = lambda case, dtype: sm.forward_bytes(case, dtype) // 2  # noqa: E731
    experiment = tiny_experiment(profiles=(
        Profile("torch", "torch.softmax", lambda x: torch.softmax(x, -1)),
        Profile("kernel", "the lab's softmax", lambda x: softmax(x, -1), sm.SOFTMAX_SOURCES, bytes_moved=half),
    ))
    case = experiment.cases[0]
    point = measure_point(experiment, case, torch.float32, device=DEVICE, clock=WallClock(), params=FEW,
                          ceiling_gbps=1.0)
    own, other = point.results["kernel"], point.results["torch"]
    assert own.status == other.status == "ok"
    assert own.bytes_moved == point.bytes_moved // 2 and other.bytes_moved is None
    assert own.gbps == pytest.approx(own.bytes_moved / (own.p50_ms * 1e-3) / 1e9)
    assert other.gbps == pytest.approx(point.bytes_moved / (other.p50_ms * 1e-3) / 1e9)


def test_a_sample_keeps_seven_significant_digits_and_infinities_stay():
    assert SAMPLE_DIGITS == 7
    assert kept_sample(0.05752299999961036) == 0.057523
    assert kept_sample(0.010460123456) == 0.01046012
    assert kept_sample(123456789.0) == 123456800.0
    assert kept_sample(1.0) == 1.0 and kept_sample(0.0) == 0.0
    assert kept_sample(float("inf")) == float("inf") and math.isnan(kept_sample(float("nan")))
    assert repr(kept_sample(2 / 3)) == "0.6666667"
