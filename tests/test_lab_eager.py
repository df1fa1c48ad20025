"""The eager-call clock: input copies past the L2, batches that cycle through them, errors kept per profile, and
the eager block every timed profile of a run carries (on the CPU through the interpreter; on a GPU unchanged)."""

from __future__ import annotations


import pytest
import torch
from conftest import DEVICE, HAS_CUDA
from test_lab_runner import FEW, tiny_experiment

from lab.evidence.records import RunRecord
from lab.evidence.store import load_records, read_json
from lab.measure.eager import (
    CPU_EAGER,
    EagerClock,
    EagerParams,
    calls_for,
    copies_needed,
    input_bytes,
    input_copies,
    time_eager,
)
from lab.measure.runner import run_experiment
from lab.publish.collect import collect_evidence
from lab.publish.render import render_outputs

FAST = EagerParams(warmup_rounds=1, samples=4, batch_seconds=0.0, min_calls=3, max_calls=3)


@pytest.mark.parametrize(("nbytes", "past", "expected"), [
    (1 << 10, 0, 1),            # the CPU path: nothing to keep out of a cache
    (1 << 30, 100 << 20, 1),    # one copy already past twice the L2
    (100 << 20, 100 << 20, 1),  # exactly at the bound
    (40 << 20, 100 << 20, 4),   # ceil(100 / 40) + 1
    (4096, 100 << 20, 25601),   # a one-row input: tens of thousands of small copies
])
def test_copies_together_pass_the_bound(nbytes, past, expected):
    count = copies_needed(nbytes, past)
    assert count == expected
    if count > 1:
        assert (count - 1) * nbytes >= past


def test_copies_keep_strides_and_grad_flags_and_own_their_storage():
    x = torch.randn(8, 6).t()  # a transposed view: strides (1, 6)
    w = torch.randn(3, requires_grad=True)
    sets = input_copies({"x": x, "w": w, "eps": 1e-6}, 3)
    assert sets[0]["x"] is x and len(sets) == 3
    for copy in sets[1:]:
        assert copy["x"].stride() == x.stride() and torch.equal(copy["x"], x)
        assert copy["x"].data_ptr() != x.data_ptr()
        assert copy["w"].requires_grad and copy["w"].is_leaf
        assert copy["eps"] == 1e-6
    assert input_bytes({"x": x, "w": w, "eps": 1e-6}) == (48 + 3) * 4


def test_batches_cycle_through_every_copy_and_a_failing_profile_keeps_its_error():
    seen: list[int] = []
    calls = {
        "good": [lambda i=i: seen.append(i) for i in range(5)],
        "bad": [lambda: (_ for _ in ()).throw(RuntimeError("boom"))],
    }
    times = time_eager(calls, EagerClock("cpu", 0), FAST)
    assert set(seen) == set(range(5)), "every copy is read"
    assert len(times.eager_ms["good"]) == FAST.samples and len(times.host_ms["good"]) == FAST.samples
    assert times.calls["good"] == 3
    assert all(host <= eager * 1.5 + 1e-3 for host, eager in zip(times.host_ms["good"], times.eager_ms["good"]))
    assert "boom" in times.errors["bad"] and times.eager_ms["bad"] == []


@pytest.mark.parametrize(("per_call_ms", "expected"), [(0.01, 400), (1.0, 4), (100.0, 4), (0.0, 400)])
def test_batch_size_fills_the_time_it_aims_for_within_bounds(per_call_ms, expected):
    params = EagerParams(warmup_rounds=1, samples=5, batch_seconds=0.004, min_calls=4, max_calls=400)
    assert calls_for(per_call_ms, params) == expected


def test_a_run_records_both_clocks_and_the_page_shows_the_eager_figures(tmp_path):
    experiment = tiny_experiment()
    record, path = run_experiment(experiment, device=DEVICE, records_dir=tmp_path, params=FEW, progress=False,
                                  eager_params=CPU_EAGER if not HAS_CUDA else None)
    assert record.eager is not None and record.eager.samples == (CPU_EAGER.samples if not HAS_CUDA else record.eager.samples)
    for point in record.points:
        assert point.eager_copies is not None and point.eager_copies >= 1
        for name in ("torch", "kernel"):
            eager = point.results[name].eager
            assert eager is not None and eager.error is None
            assert len(eager.samples_ms) == len(eager.host_samples_ms) == record.eager.samples
            assert eager.p20_ms <= eager.p50_ms <= eager.p80_ms
            assert eager.gbps == pytest.approx(point.bytes_moved / (eager.p50_ms * 1e-3) / 1e9)
        for name in ("wrong", "raises", "declines", "absent-peer"):
            assert point.results[name].eager is None, "only profiles timed on the GPU-time clock are timed again"
    (loaded,), problems = load_records(tmp_path)
    assert problems == [] and loaded == record
    assert RunRecord.from_dict(read_json(path)).points[0].results["kernel"].eager == \
        record.points[0].results["kernel"].eager

    evidence = collect_evidence({experiment.slug: experiment}, (), tmp_path, {experiment.slug: record.hashes})
    page = render_outputs(evidence)[f"experiments/{experiment.slug}.md"]
    assert "Eager call" in page
