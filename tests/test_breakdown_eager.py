"""The breakdown on the eager-call clock (the host's gaps before each op's kernels), each op's provenance (the
lab's kernels or torch's), and how the pages show both: from synthetic traces and records, on the CPU."""

import functools
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lab.evidence.checks import RecordError
from lab.evidence.record_parts import breakdown
from lab.evidence.records import EagerResult
from lab.evidence.stats import summarize
from lab.measure.breakdown import CALL, breakdown_from_trace, eager_breakdown_from_trace
from labtools import FakeProfiler, annotation_event, kernel_event, launch_event, records_with_breakdowns

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))
import lab_fixture_experiments as fx  # noqa: E402
import lab_synthetic as syn  # noqa: E402


class _Classify:
    """Labels first, else "matmul" for gemm kernels; the lab's kernels are those named "_lab_*"."""

    def __call__(self, kernel, labels):
        return labels[-1] if labels else ("matmul" if "gemm" in kernel else "other")

    def is_lab(self, kernel):
        return kernel.startswith("_lab_")


def _back_to_back(late=(30.0, 30.0, 30.0)):
    """A warm-up call outside any CALL, then three calls back to back, each: `norm` (a lab kernel), a gemm
    launched `late[i]` us after norm's kernel ended (the host late), `attention` (a lab kernel, then a torch
    copy, 2 us apart). The calls start 50, 40 and 40 us after the previous call's last kernel ended."""
    events, corr, gpu = [], 0, 0.0
    leads = (50.0, 40.0, 40.0)
    corr += 1
    events += [launch_event(corr, 0), kernel_event("warm", corr, 0, 10)]
    gpu = 10.0
    for i, lead in enumerate(leads):
        host = 1000.0 * (i + 1)
        events.append(annotation_event(CALL, host, 500))
        events.append(annotation_event("norm", host + 10, 10))
        events.append(annotation_event("attention", host + 60, 30))
        gpu += lead
        for name, host_ts, dur, gap_after in (("_lab_norm", host + 12, 5, late[i]), ("sm90_gemm", host + 40, 20, 0),
                                               ("_lab_attn", host + 65, 10, 2), ("copy", host + 70, 4, 0)):
            corr += 1
            events += [launch_event(corr, host_ts), kernel_event(name, corr, gpu, dur)]
            gpu += dur + gap_after
    return events


def test_the_eager_breakdown_charges_each_idle_gap_to_the_op_after_it():
    result = eager_breakdown_from_trace(_back_to_back(), _Classify())
    ops = {o["op"]: o for o in result["ops"]}
    assert [o["op"] for o in result["ops"]] == ["norm", "matmul", "attention"]
    assert ops["norm"]["gap_ms"] == 0.0  # the call's first kernel: its gap is the call's lead
    assert ops["matmul"]["gap_ms"] == pytest.approx(0.030)
    assert ops["attention"]["gap_ms"] == pytest.approx(0.002)
    assert ops["attention"]["kernels"] == 2
    assert result["gap_ms"] == pytest.approx(0.032)
    assert result["lead_ms"] == pytest.approx(0.040)  # median of 50, 40, 40
    assert result["kernel_ms"] == pytest.approx(0.039)
    assert result["span_ms"] == pytest.approx(0.071)
    assert breakdown(dict(_gpu_block(), eager=dict(result, method="m")), "b")["eager"]["lead_ms"] == result["lead_ms"]


def test_one_stalled_call_does_not_set_an_ops_gap():
    result = eager_breakdown_from_trace(_back_to_back(late=(30.0, 900.0, 30.0)), _Classify())
    ops = {o["op"]: o for o in result["ops"]}
    assert ops["matmul"]["gap_ms"] == pytest.approx(0.030)  # the median call's gap, not the mean's 320 us
    assert result["gap_ms"] == pytest.approx(0.032)


def test_a_call_with_nothing_before_it_has_no_lead_and_overlaps_never_count_as_idle():
    events = [e for e in _back_to_back() if e.get("name") != "warm"]
    result = eager_breakdown_from_trace(events, _Classify())
    assert result["lead_ms"] == pytest.approx(0.040)  # the first call (no predecessor) is left out
    # Two kernels on two streams overlapping: the second starts before the first ends, no idle time.
    overlap = [annotation_event(CALL, 0, 100), launch_event(1, 1), kernel_event("a", 1, 10, 50),
               launch_event(2, 2), kernel_event("b", 2, 30, 10)]
    result = eager_breakdown_from_trace(overlap, _Classify())
    assert result["gap_ms"] == 0.0 and all(o["gap_ms"] == 0.0 for o in result["ops"])


def test_each_op_records_its_lab_kernels_its_longest_kernel_and_its_class():
    result = breakdown_from_trace(_back_to_back(), _Classify())
    ops = {o["op"]: o for o in result["ops"]}
    assert (ops["norm"]["lab_kernels"], ops["norm"]["kernels"]) == (1, 1)
    assert (ops["matmul"]["lab_kernels"], ops["matmul"]["kernel"], ops["matmul"]["group"]) == (0, "sm90_gemm", "matmul")
    assert (ops["attention"]["lab_kernels"], ops["attention"]["kernels"]) == (1, 2)
    assert ops["attention"]["kernel"] == "_lab_attn"  # 10 us against the copy's 4
    # A classifier that cannot tell the lab's kernels leaves the count out (the pages then read the plan).
    plain = breakdown_from_trace(_back_to_back(), lambda kernel, labels: labels[-1] if labels else "other")
    assert all("lab_kernels" not in o for o in plain["ops"])


class _Clock:
    flush_bytes = 1 << 20

    def hold(self, ms):
        pass

    def flush(self):
        pass


def _fake_profiler(monkeypatch):
    """torch.profiler on the CPU, each profiling session exporting its own trace; the code under test leaves a
    launch and a kernel in it through the fake's `kernel`."""
    fake = FakeProfiler(fresh_sessions=True, kernel_spacing=10)
    fake.install(monkeypatch)

    def no_kineto(*args, **kwargs):  # the annotations-only profiler falls back to torch.profiler.profile
        raise TypeError("no Kineto here")

    monkeypatch.setattr(torch.autograd.profiler, "profile", no_kineto)
    return fake


def test_the_eager_part_cycles_the_input_copies_the_eager_clock_uses(monkeypatch):
    from lab.measure import breakdown as bd
    from lab.measure.eager import copies_needed

    fake = _fake_profiler(monkeypatch)
    seen = []

    def op(x):
        seen.append(x.data_ptr())
        fake.kernel("_lab_k")

    x = torch.zeros(1024)  # 4 KiB: the eager-call clock cycles 257 copies past 1 MiB
    result = bd.measure_breakdown(functools.partial(op, x=x), _Classify(), _Clock(), calls=2, warmup=1)
    copies = copies_needed(4096, _Clock.flush_bytes)
    assert result["eager"]["calls"] == bd.EAGER_CALLS
    assert f"{copies} copies" in result["eager"]["method"] and "every torch op" in result["eager"]["method"]
    assert len(set(seen)) == copies  # each copy called once unprofiled, then the profiled calls cycle them
    assert result["ops"][0]["lab_kernels"] == 1
    breakdown(result, "b")  # what the runner records passes the record's check


def test_an_eager_part_that_fails_leaves_the_gpu_time_breakdown_standing(monkeypatch):
    from lab.measure import breakdown as bd

    fake = _fake_profiler(monkeypatch)

    def failing(*args, **kwargs):
        raise RuntimeError("no memory for the copies")

    monkeypatch.setattr(bd, "measure_eager_breakdown", failing)
    result = bd.measure_breakdown(lambda: fake.kernel("k"), _Classify(), _Clock(), calls=2, warmup=1)
    assert result["calls"] == 2
    assert result["eager"] == {"error": "RuntimeError: no memory for the copies"}
    assert breakdown(result, "b")["eager"]["error"].startswith("RuntimeError")


def _gpu_block(**change):
    block = {"method": "m", "calls": 5, "ops": [{"op": "attention", "ms": 0.1, "kernels": 2}],
             "kernel_ms": 0.1, "span_ms": 0.12, "gap_ms": 0.02}
    block.update(change)
    return block


def _eager_block(**change):
    block = {"method": "m", "calls": 10, "ops": [{"op": "attention", "ms": 0.1, "kernels": 2, "gap_ms": 0.01}],
             "kernel_ms": 0.1, "span_ms": 0.12, "gap_ms": 0.02, "lead_ms": 0.05}
    block.update(change)
    return block


@pytest.mark.parametrize("block, field", [
    (_gpu_block(ops=[{"op": "a", "ms": 0.1, "kernels": 1, "lab_kernels": 2}]), "lab_kernels"),
    (_gpu_block(ops=[{"op": "a", "ms": 0.1, "kernels": 1, "kernel": "k\nx"}]), "kernel"),
    (_gpu_block(ops=[{"op": "a", "ms": 0.1, "kernels": 1, "group": 3}]), "group"),
    (_gpu_block(eager=_eager_block(gap_ms=1.0)), "gap_ms"),
    (_gpu_block(eager=_eager_block(lead_ms=-1.0)), "lead_ms"),
    (_gpu_block(eager=_eager_block(ops=[{"op": "a", "ms": 0.1, "kernels": 1}])), "gap_ms"),
    (_gpu_block(eager=_eager_block(extra=1)), "extra"),
    (_gpu_block(eager="later"), "eager"),
])
def test_the_record_check_refuses_bad_new_fields(block, field):
    with pytest.raises(RecordError, match=field):
        breakdown(block, "b")


def test_the_record_check_accepts_old_and_new_blocks():
    assert breakdown(_gpu_block(), "b") == _gpu_block()  # an older record: no eager part, no provenance
    new = _gpu_block(ops=[{"op": "a", "ms": 0.1, "kernels": 2, "lab_kernels": 1, "kernel": "_k", "group": "g"}],
                     eager=_eager_block())
    assert breakdown(new, "b")["eager"]["lead_ms"] == 0.05
    assert breakdown(_gpu_block(eager={"error": "no CUPTI"}), "b")["eager"] == {"error": "no CUPTI"}


# --------------------------------------------------------------------------------------------------------
# On the page
# --------------------------------------------------------------------------------------------------------

from lab.evidence.verdict import SLOWER, PointJudgement  # noqa: E402
from lab.publish.breakdown import breakdown_view, provenance, slower_ops  # noqa: E402


def test_provenance_reads_the_measured_count_and_the_plan():
    planned = syn.timed([1.0], plan={"attention": "lab: kernels/attention.py", "o_proj": "torch: F.linear"})
    assert provenance(planned, {"op": "attention", "kernels": 2, "lab_kernels": 2}) == "lab: kernels/attention.py"
    assert provenance(planned, {"op": "o_proj", "kernels": 1, "lab_kernels": 0}) == "torch: F.linear"
    # The measurement disagreeing with the plan shows both; a mixed op says how many kernels are the lab's.
    assert provenance(planned, {"op": "o_proj", "kernels": 1, "lab_kernels": 1}) == "lab (plan: torch: F.linear)"
    assert provenance(planned, {"op": "x", "kernels": 3, "lab_kernels": 1}) == "lab (1 of 3 kernels) + torch"
    # An older record: the plan alone, else nothing.
    assert provenance(planned, {"op": "attention", "kernels": 2}) == "lab: kernels/attention.py"
    assert provenance(syn.timed([1.0]), {"op": "attention", "kernels": 2}) == "–"


def _eager_result(ms):
    s = summarize(ms)
    return EagerResult(samples_ms=tuple(ms), host_samples_ms=tuple(0.01 for _ in ms), calls_per_sample=10,
                       p20_ms=s.p20, p50_ms=s.p50, p80_ms=s.p80, host_p50_ms=0.01)


def _profiled(gpu_ms, eager_ms, ops, gaps, lead):
    """A result whose breakdown has `ops` (op -> (ms, group)) and an eager part with `gaps` (op -> gap ms)."""
    span = sum(ms for ms, _ in ops.values())
    block = {"method": "t", "calls": 3, "kernel_ms": span, "span_ms": span, "gap_ms": 0.0,
             "ops": [{"op": op, "ms": ms, "kernels": 1, "lab_kernels": 0, "kernel": "k|<b>", "group": group}
                     for op, (ms, group) in ops.items()],
             "eager": {"method": "t", "calls": 10, "kernel_ms": span, "span_ms": span + sum(gaps.values()),
                       "gap_ms": sum(gaps.values()), "lead_ms": lead,
                       "ops": [{"op": op, "ms": ms, "kernels": 1, "gap_ms": gaps.get(op, 0.0)}
                               for op, (ms, _) in ops.items()]}}
    return replace(syn.timed(gpu_ms), eager=_eager_result(eager_ms), breakdown=block)


def _slower_point():
    subject = _profiled([1.0] * 5, [2.0, 2.0, 2.02, 2.0, 2.01],
                        {"qkv": (0.4, "proj"), "attention": (0.3, "attn"), "mlp": (0.3, "proj")},
                        {"attention": 0.5, "mlp": 0.1}, lead=0.3)
    base = _profiled([1.0] * 5, [1.0, 1.01, 1.0, 1.02, 1.0],
                     {"projections": (0.7, "proj"), "attention": (0.3, "attn")}, {"attention": 0.05}, lead=0.1)
    return syn.point({"subject": subject, "base": base})


def test_the_view_names_where_the_host_stalls_and_the_op_that_loses_on_the_eager_clock():
    run = syn.run([_slower_point()])
    (case,) = breakdown_view(syn.experiment(), run, "float32")
    assert case["stall_names"] == ["subject", "base"]
    stall = case["stalls"][0]
    assert (stall["where"], stall["ms"], stall["host"]) == ("attention", "500", "900")
    w = case["eager_slower"]
    assert (w["baseline"], w["call"], w["measured"]) == ("base", "1,000", True)
    # attention: 300 + 500 us against 300 + 50; by class, proj: 400 + 300 + 100 against 700.
    assert (w["op"], w["op_excess"], w["group"], w["group_excess"]) == ("attention", "450", "attn", "450")
    assert (w["host"], w["their_host"]) == ("900", "150")
    # An older record (no eager-call part): the GPU-time breakdown's answer, said to be that.
    old = syn.point({name: replace(r, breakdown={k: v for k, v in r.breakdown.items() if k != "eager"})
                     for name, r in _slower_point().results.items()})
    (old_case,) = breakdown_view(syn.experiment(), syn.run([old]), "float32")
    w = old_case["eager_slower"]
    assert (w["measured"], w["op"], w["group"], w["call"]) == (False, None, None, "1,000")
    assert old_case["stalls"] == [] and old_case["stall_names"] == []
    # The CPU interpreter's runs judge nothing.
    (cpu_case,) = breakdown_view(syn.experiment(), syn.run([_slower_point()], cpu=True), "float32")
    assert cpu_case["eager_slower"] is None


def test_slower_on_gpu_time_compares_by_class_where_names_differ():
    subject = _profiled([1.1] * 5, [1.0] * 5, {"qkv": (0.5, "proj"), "attention": (0.3, "attn"), "mlp": (0.3, "proj")},
                        {}, lead=0.0)
    base = _profiled([1.0] * 5, [1.0] * 5, {"projections": (0.7, "proj"), "attention": (0.3, "attn")}, {}, lead=0.0)
    run = syn.run([syn.point({"subject": subject, "base": base})])
    judged = {("c", "float32"): PointJudgement("c", "float32", SLOWER, "against", "base", None, "")}
    (row,) = slower_ops(syn.experiment(), run, "float32", judged)
    assert row["op"] is None  # attention takes as long in both; no other op shares a name
    assert (row["group"], row["group_excess"]) == ("proj", "100")  # 500 + 300 us against 700


from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.render import render_outputs  # noqa: E402

HOSTILE = "<script>alert(1)</script>|x"


def _records(tmp_path: Path, with_eager: bool) -> Path:
    def block_of(p50):
        ops = [{"op": "norm", "ms": 0.3 * p50, "kernels": 1},
               {"op": HOSTILE, "ms": 0.6 * p50, "kernels": 2}]
        if with_eager:
            ops[0].update(lab_kernels=1, kernel=HOSTILE, group="norms")
            ops[1].update(lab_kernels=0, kernel="nvjet_tst", group=HOSTILE)
        block = {"method": "synthetic", "calls": 5, "kernel_ms": 0.9 * p50, "span_ms": p50,
                 "gap_ms": 0.1 * p50, "ops": ops}
        if with_eager:
            block["eager"] = {"method": "synthetic", "calls": 10, "kernel_ms": 0.9 * p50,
                              "span_ms": 1.2 * p50, "gap_ms": 0.3 * p50, "lead_ms": 0.2 * p50,
                              "ops": [{"op": "norm", "ms": 0.3 * p50, "kernels": 1, "gap_ms": 0.0},
                                      {"op": HOSTILE, "ms": 0.6 * p50, "kernels": 2, "gap_ms": 0.3 * p50}]}
        return block

    return records_with_breakdowns(tmp_path, block_of)


@pytest.mark.parametrize("with_eager", [True, False])
def test_pages_render_the_eager_breakdown_and_older_records_as_before(tmp_path, with_eager):
    evidence = collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, _records(tmp_path, with_eager), fx.CURRENT_HASHES)
    assert not any("b2b2b2" in p.path.name for p in evidence.problems)
    outputs = render_outputs(evidence)
    page = outputs["experiments/fixture-single.md"]
    # Record text is escaped, or shown verbatim inside a code span (which Markdown never reads as HTML).
    assert "<script" not in re.sub(r"(`+).*?\1", "", page) and "&lt;script" in page
    chart = next(v for k, v in outputs.items() if "--breakdown--nvidia-test-gpu-b--" in k)
    assert "<script" not in chart
    if with_eager:
        assert "Where the host stalls on the eager-call clock" in page
        assert "Host gap before, µs (eager)" in page and "Longest kernel" in page
        assert "Period / median" in page
        assert "| lab |" in page or " lab |" in page  # the measured provenance of a lab kernel
        assert "eager-call median" in chart
    else:
        assert "Where the host stalls" not in page and "Longest kernel" not in page
        assert "the eager-call median minus the span" in page
        assert ", eager" not in chart
