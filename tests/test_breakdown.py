"""The op-by-op breakdown: kernels attributed to calls and ops through the profiler trace's correlation ids,
per-call kernel time, span and gap; and the record's check of the stored block."""

import time

import pytest

from lab.evidence.checks import RecordError
from lab.evidence.record_parts import breakdown
from lab.measure.breakdown import CALL, breakdown_from_trace
from labtools import FakeProfiler, annotation_event, kernel_event, launch_event, records_with_breakdowns


def _classify(kernel: str, labels: tuple[str, ...]) -> str:
    return labels[-1] if labels else ("matmul" if "gemm" in kernel else "other")


def _two_calls():
    """Two calls of: norm (one kernel), proj (a gemm, unlabelled), attention (two kernels under a label
    nested in an outer one). Call 2's kernels are twice as long; a kernel launched outside any call is
    ignored."""
    events = []
    corr = 0
    for i, scale in enumerate((1, 2)):
        base = 1000 * i
        events.append(annotation_event(CALL, base, 500))
        events.append(annotation_event("norm", base + 10, 20))
        events.append(annotation_event("block", base + 60, 100))
        events.append(annotation_event("attention", base + 70, 50))
        gpu = base + 100
        for name, host_ts, dur in (("rms_kernel", base + 15, 10), ("sm90_gemm", base + 40, 40),
                                   ("attn_a", base + 80, 20), ("attn_b", base + 90, 30)):
            corr += 1
            events.append(launch_event(corr, host_ts))
            events.append(kernel_event(name, corr, gpu, dur * scale))
            gpu += dur * scale + 5  # a 5 us gap after each kernel
    events.append(launch_event(99, 5000))
    events.append(kernel_event("stray", 99, 5100, 1000))
    return events


def test_kernels_go_to_their_op_and_call():
    result = breakdown_from_trace(_two_calls(), _classify)
    assert result["calls"] == 2
    ops = {o["op"]: o for o in result["ops"]}
    assert [o["op"] for o in result["ops"]] == ["norm", "matmul", "attention"]  # in launch order
    # Mean over the two calls (scale 1 and 2): 1.5 x the unit durations, in ms.
    assert ops["norm"]["ms"] == pytest.approx(15e-3)
    assert ops["matmul"]["ms"] == pytest.approx(60e-3)
    assert ops["attention"]["ms"] == pytest.approx(75e-3)
    assert ops["attention"]["kernels"] == 2
    assert "stray" not in ops and "other" not in ops
    # Per call: kernels 100 or 200 us, three 5 us gaps between four kernels; medians of two values.
    assert result["kernel_ms"] == pytest.approx(0.150)
    assert result["gap_ms"] == pytest.approx(0.015)
    assert result["span_ms"] == pytest.approx(0.165)


class _FakeProfiler(FakeProfiler):
    """Stands in for torch.profiler on the CPU: while it is on, each call of the code under test takes longer
    to queue (as under the real profiler) and leaves a launch and a kernel in the trace; record_function leaves
    an annotation around what it wraps. The profiling sessions' events pile up in one trace."""

    def __init__(self, slowdown_s: float):
        super().__init__(fresh_sessions=False, kernel_spacing=1)
        self.slowdown_s = slowdown_s

    def call(self):
        if self.on:
            time.sleep(self.slowdown_s)
            self.kernel("k")


class _FakeClock:
    def __init__(self):
        self.holds = []

    def hold(self, ms):
        self.holds.append(ms)

    def flush(self):
        pass


def test_the_hold_outlasts_the_profiled_queueing_and_the_warm_up_is_left_out(monkeypatch):
    from lab.measure import breakdown as bd

    fake = _FakeProfiler(slowdown_s=0.02)  # 20 ms to queue a call under the profiler, ~0 without it
    fake.install(monkeypatch)
    monkeypatch.setattr(bd, "measure_eager_breakdown", lambda calls, classify: {"error": "not here"})
    clock = _FakeClock()
    result = bd.measure_breakdown(fake.call, _classify, clock, calls=3, warmup=2)
    assert len(clock.holds) == 3 and len(set(clock.holds)) == 1
    assert clock.holds[0] >= bd.HOLD_MARGIN * 20  # sized from the profiled warm-up, not the unprofiled ones
    assert result["calls"] == 3  # the profiled warm-up's kernel lies outside every CALL: not counted
    assert f"{clock.holds[0]:.1f} ms" in result["method"]
    assert bd.hold_ms(0.1) == bd.MIN_HOLD_MS and bd.hold_ms(10.0) == 10.0 * bd.HOLD_MARGIN


def test_a_trace_without_calls_is_refused():
    events = [e for e in _two_calls() if e.get("name") != CALL]
    with pytest.raises(ValueError, match="no GPU activity"):
        breakdown_from_trace(events, _classify)


def _stored(**change):
    block = {"method": "m", "calls": 5, "ops": [{"op": "attention", "ms": 0.1, "kernels": 2}],
             "kernel_ms": 0.1, "span_ms": 0.12, "gap_ms": 0.02}
    block.update(change)
    return block


def test_the_record_check_accepts_a_breakdown_and_an_error():
    assert breakdown(_stored(), "b")["ops"][0]["op"] == "attention"
    assert breakdown({"error": "no CUPTI"}, "b") == {"error": "no CUPTI"}
    assert breakdown(None, "b") is None


@pytest.mark.parametrize("change, field", [
    ({"gap_ms": 1.0}, "gap_ms"),
    ({"kernel_ms": -1.0}, "kernel_ms"),
    ({"ops": []}, "ops"),
    ({"ops": [{"op": "a\nb", "ms": 0.1, "kernels": 1}]}, "op"),
    ({"ops": [{"op": "a", "ms": float("nan"), "kernels": 1}]}, "ms"),
    ({"calls": 0}, "calls"),
    ({"extra": 1}, "extra"),
])
def test_the_record_check_refuses_a_bad_breakdown(change, field):
    with pytest.raises(RecordError, match=field):
        breakdown(_stored(**change), "b")


# --------------------------------------------------------------------------------------------------------
# On the page: the chart and the tables, from a fixture record given breakdowns
# --------------------------------------------------------------------------------------------------------

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))
import lab_fixture_experiments as fx  # noqa: E402

from lab.publish.breakdown import breakdown_filename  # noqa: E402
from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.render import render_outputs  # noqa: E402

HOSTILE_OP = "<script>alert(1)</script>|op"


def _records_with_breakdowns(tmp_path: Path) -> Path:
    return records_with_breakdowns(tmp_path, lambda p50: {
        "method": "synthetic", "calls": 5, "kernel_ms": 0.9 * p50, "span_ms": 1.1 * p50, "gap_ms": 0.2 * p50,
        "ops": [{"op": "norm", "ms": 0.3 * p50, "kernels": 1}, {"op": HOSTILE_OP, "ms": 0.6 * p50, "kernels": 2}]})


def test_a_run_with_breakdowns_gets_a_chart_and_escaped_tables(tmp_path):
    evidence = collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, _records_with_breakdowns(tmp_path), fx.CURRENT_HASHES)
    assert not any("b2b2b2" in p.path.name for p in evidence.problems)  # the edited record still reads
    outputs = render_outputs(evidence)
    page = outputs["experiments/fixture-single.md"]
    assert "Where the time goes" in page
    assert "<script" not in page and "&lt;script" in page
    assert "110.0%" in page  # the span over the GPU-time median, flagged as more than 5% off
    assert "(off by more than 5%)" in page
    charts = [rel for rel in outputs if rel.endswith(breakdown_filename("fixture-single", "nvidia-test-gpu-b", "float32"))]
    assert len(charts) == 1 and outputs[charts[0]].lstrip().startswith("<?xml")
    # GPU A's run has no breakdown: no chart and no section for it.
    assert not any(breakdown_filename("fixture-single", "nvidia-test-gpu-a", "float32") in rel for rel in outputs)


# --------------------------------------------------------------------------------------------------------
# Where the subject is Slower: the op that loses, among the ops both profiles name alike
# --------------------------------------------------------------------------------------------------------

from dataclasses import replace  # noqa: E402

import lab_synthetic as syn  # noqa: E402

from lab.evidence.verdict import FASTER, SLOWER, PointJudgement  # noqa: E402
from lab.publish.breakdown import slower_ops  # noqa: E402


def _with_breakdown(ms: float, ops: dict):
    span = sum(ops.values())
    block = {"calls": 3, "ops": [{"op": op, "ms": v, "kernels": 1} for op, v in ops.items()], "kernel_ms": span,
             "gap_ms": 0.0, "span_ms": span, "method": "test"}
    return replace(syn.timed([ms]), breakdown=block)


def test_the_op_that_loses_is_named_where_the_subject_is_slower():
    point = syn.point({"subject": _with_breakdown(1.0, {"norm": 0.1, "attention": 0.5, "proj": 0.4}),
                       "base": _with_breakdown(0.8, {"norm": 0.12, "attention": 0.3, "matmul": 0.38})})
    run = syn.run([point])
    judged = {("c", "float32"): PointJudgement("c", "float32", SLOWER, "against", "base", None, "")}
    (row,) = slower_ops(syn.experiment(), run, "float32", judged)
    # 200 us a call more; of the ops both name (norm, attention), attention takes 200 us more.
    assert (row["baseline"], row["call"], row["op"], row["op_excess"]) == ("base", "200", "attention", "200")
    faster = {("c", "float32"): PointJudgement("c", "float32", FASTER, "meets", "base", None, "")}
    assert slower_ops(syn.experiment(), run, "float32", faster) == []
    unlike = syn.point({"subject": _with_breakdown(1.0, {"a": 1.0}), "base": _with_breakdown(0.5, {"b": 0.5})})
    (row,) = slower_ops(syn.experiment(), syn.run([unlike]), "float32", judged)
    assert row["op"] is None and row["call"] == "500"
