"""The roofline of a run's profiled calls: intensity and achieved TFLOP/s from the FLOP model and the profiler's
totals, the roof from the copy ceiling and the matmul peak measured in the run, and what is left out."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from lab.evidence.records import MatmulPeak  # noqa: E402
from lab.publish.roofline import render_roofline_plot, roofline_filename, roofline_points, roofline_view  # noqa: E402

FLOPS = 10**12  # per call, from the declared model


def _facts(dram_bytes, duration_ns):
    return {"kernels": [], "totals": {"dram_bytes": dram_bytes, "duration_ns": duration_ns}}


def _run(peak: float | None, facts: dict):
    point = replace(syn.point({name: syn.timed([1.0, 1.1], profiling=f) for name, f in facts.items()}), flops=FLOPS)
    run = syn.run([point])
    run = replace(run, profiling={"error": None, "command": ["ncu"]})
    if peak is not None:
        # 2 * 8192^3 FLOPs at `peak` TFLOP/s
        ms = 2 * 8192**3 / (peak * 1e12) * 1e3
        run = replace(run, matmul_peak=MatmulPeak(peak, 8192, 8192, 8192, "bfloat16", (ms,)))
    return run


def _experiment():
    return replace(syn.experiment(others=("third",)), flops=lambda case, dtype: FLOPS)


def test_a_call_sits_under_the_nearer_roof():
    # 1e12 FLOPs over 1e10 bytes: 100 FLOP/byte; the memory roof there is 3000 GB/s * 100 = 300 TFLOP/s, under
    # an 800 TFLOP/s peak. 1e12 FLOPs in 5 ms: 200 TFLOP/s, 67% of the roof.
    run = _run(800.0, {"subject": _facts(1e10, 5e6), "base": _facts(1e9, 2e6)})
    points, left_out = roofline_points(_experiment(), run)
    by = {p["profile"]: p for p in points}
    assert left_out == 0
    assert by["subject"]["intensity"] == pytest.approx(100.0)
    assert by["subject"]["tflops"] == pytest.approx(200.0)
    assert by["subject"]["roof"] == pytest.approx(300.0) and by["subject"]["bound"] == "memory"
    assert by["subject"]["of_roof"] == pytest.approx(200 / 3)
    # 1,000 FLOP/byte: past the knee (800e12 / 3000e9 ≈ 267), under the flat roof; 500 TFLOP/s.
    assert by["base"]["roof"] == pytest.approx(800.0) and by["base"]["bound"] == "compute"
    assert by["base"]["tflops"] == pytest.approx(500.0)


def test_without_a_matmul_peak_only_the_memory_roof_counts_and_the_page_says_so():
    run = _run(None, {"subject": _facts(1e9, 2e6)})
    view = roofline_view(_experiment(), run)
    assert view["peak"] is None
    assert view["rows"][0]["roof"] == "3,000.0" and view["rows"][0]["bound"] == "memory"
    assert render_roofline_plot(_experiment(), run, "GPU A").lstrip().startswith("<?xml")


def test_calls_without_bytes_or_duration_are_left_out_and_counted():
    run = _run(800.0, {"subject": _facts(1e10, 5e6), "base": _facts(None, 5e6), "third": _facts(1e10, 0)})
    points, left_out = roofline_points(_experiment(), run)
    assert [p["profile"] for p in points] == ["subject"] and left_out == 2
    assert roofline_view(_experiment(), run)["left_out"] == 2


def test_no_flop_model_or_no_profiler_means_no_roofline():
    run = _run(800.0, {"subject": _facts(1e10, 5e6)})
    assert roofline_view(syn.experiment(), run) is None  # no FLOP model declared
    assert roofline_view(_experiment(), replace(run, profiling=None)) is None


def test_without_a_flop_model_the_counted_fp_instructions_place_the_call():
    # A memory-bound op: 2e8 FLOPs counted over 4e9 bytes in 2 ms (2,000 GB/s of a 3,000 GB/s ceiling).
    facts = {"kernels": [], "totals": {"dram_bytes": 4e9, "duration_ns": 2e6, "fp_flops": 2e8}}
    run = _run(800.0, {"subject": facts, "base": _facts(4e9, 2e6)})  # the baseline has no count: left out
    points, left_out = roofline_points(syn.experiment(), run)
    (p,) = points
    assert left_out == 1 and p["bound"] == "memory"
    assert p["intensity"] == pytest.approx(0.05) and p["tflops"] == pytest.approx(0.1)
    assert p["of_roof"] == pytest.approx(100 * 2000 / 3000)  # its share of the copy ceiling
    view = roofline_view(syn.experiment(), run)
    assert view["measured_flops"] and view["rows"][0]["intensity"] == "0.05"
    assert not roofline_view(_experiment(), _run(800.0, {"subject": _facts(1e10, 5e6)}))["measured_flops"]


def test_the_file_name_cannot_meet_another_plot():
    assert roofline_filename("exp", "nvidia-test-gpu-a") == "exp--roofline--nvidia-test-gpu-a--calls.svg"
