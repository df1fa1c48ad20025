"""The attention experiments' declarations: shapes, FLOP and byte models, what is declined and why, and one
tiny point through the runner (forward and backward profiles, gradients checked part by part)."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from conftest import DEVICE

from experiments import _attention as at
from experiments import get_experiment
from experiments.spec import Case
from lab.measure.runner import measure_point
from lab.measure.timing import TimingParams, WallClock

FEW = TimingParams(warmup_rounds=1, min_samples=2, max_samples=2, target_seconds=0.0, copy_bytes=1 << 20,
                   copy_repeats=2)


def _case(name: str) -> Case:
    return next(c for c in at.cases() if c.name == name)


def test_cases_hold_the_anchor_shapes():
    cases = at.cases()
    assert len(cases) == len(at.SEQS) * len(at.HEAD_DIMS) * 2
    for case in cases:
        assert case["H"] * case["D"] == at.WIDTH
        assert case["B"] * case["S"] == (15000 if case["S"] == 3000 else at.TOKENS)
        assert f"{case['B'] * case['S']:,} tokens" in case.description
        assert f"{at.scores(case):,} scores" in case.description


def test_flop_and_byte_models():
    full, causal = _case("d128-full-s2048"), _case("d128-causal-s2048")
    assert at.flops(full, torch.bfloat16) == 4 * 8 * 16 * 2048**2 * 128
    assert at.flops(causal, torch.bfloat16) == at.flops(full, torch.bfloat16) // 2
    assert at.backward_flops(full, torch.bfloat16) == 5 * at.flops(full, torch.bfloat16) // 2
    tokens = 8 * 16 * 2048
    assert at.forward_bytes(full, torch.bfloat16) == 4 * tokens * 128 * 2 + 4 * tokens
    assert at.backward_bytes(full, torch.bfloat16) == 8 * tokens * 128 * 2 + 4 * tokens
    assert at.unfused_bytes(full, "forward") == 12 * 8 * 16 * 2048**2


@pytest.mark.parametrize("direction,fits,too_big", [
    ("forward", "d128-full-s4096", "d128-full-s8192"),  # 12 GiB, 24 GiB
    ("backward", "d128-full-s2048", "d128-full-s3000"),  # 12 GiB, 16.1 GiB
])
def test_unfused_profiles_decline_past_16_gib_of_scores(direction, fits, too_big):
    experiment = get_experiment({"forward": "attention-fwd", "backward": "attention-bwd"}[direction])
    for name in ("torch.compile", "unfused"):
        unsupported = experiment.profile(name).unsupported
        assert unsupported(_case(fits), torch.bfloat16) is None
        reason = unsupported(_case(too_big), torch.bfloat16)
        assert reason is not None and "GiB" in reason and "more than 16 GiB" in reason
    assert experiment.profile("triton-fused").unsupported is None


@pytest.mark.parametrize("slug", ["attention-fwd", "attention-bwd"])
def test_one_tiny_point_through_the_runner(slug):
    experiment = get_experiment(slug)
    case = Case("tiny", {"B": 1, "H": 2, "S": 40, "D": 64, "causal": 1})
    keep = ("triton-fused", "sdpa-flash", "unfused")  # no compiler run here; flash is torch's CPU kernel too
    experiment = dataclasses.replace(experiment, profiles=tuple(p for p in experiment.profiles if p.name in keep))
    point = measure_point(experiment, case, torch.bfloat16, device=DEVICE, clock=WallClock(1 << 12), params=FEW,
                          ceiling_gbps=1.0)
    lab = point.results["triton-fused"]
    assert lab.status == "ok", lab
    assert lab.rel_error < experiment.tolerance[torch.bfloat16]
    if slug == "attention-bwd":
        assert set(lab.plan) == {"backward_kv", "backward_q"}
        assert point.results["unfused"].status == "ok"
    else:
        assert lab.plan["direction"] == "forward"
    gc.collect()
    assert not at._SAVED, "the saved forward graphs must go with the point's inputs"
