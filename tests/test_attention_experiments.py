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
from lab.evidence.checks import CASE, DIMENSION
from lab.measure.runner import measure_point
from lab.measure.timing import TimingParams, WallClock

FEW = TimingParams(warmup_rounds=1, min_samples=2, max_samples=2, target_seconds=0.0, copy_bytes=1 << 20,
                   copy_repeats=2)


def _case(name: str) -> Case:
    return next(c for c in at.cases() if c.name == name)


def test_cases_hold_the_anchor_shapes():
    cases = at.cases()
    assert len(cases) == len(at.SEQS) * len(at.HEAD_DIMS) * 2 + len(at.GQA_SEQS) * 2
    assert len({c.name for c in cases}) == len(cases)
    for case in cases:
        assert CASE.fullmatch(case.name), f"{case.name!r} is no valid case name in a record"
        assert all(DIMENSION.fullmatch(d) for d in case.shape)
        assert case["H"] * case["D"] == at.WIDTH
        assert case["B"] * case["S"] == (15000 if case["S"] == 3000 else at.TOKENS)
        assert f"{case['B'] * case['S']:,} tokens" in case.description
        assert f"{at.scores(case):,} scores" in case.description
    assert min(at.SEQS) == 512 and _case("d128-full-s512")["B"] == 32 and _case("d64-causal-s512")["H"] == 32


def test_grouped_query_cases():
    grouped = [c for c in at.cases() if at.kv_heads(c) != c["H"]]
    assert [c.name for c in grouped] == [f"d128-h16kv4-{mask}-s{seq}" for mask in ("full", "causal")
                                         for seq in at.GQA_SEQS]
    for case in grouped:
        assert (case["H"], case["Hkv"], case["D"]) == (16, 4, 128)
        assert "16 query heads over 4 key/value heads" in case.description
    assert all("Hkv" not in c.shape for c in at.cases() if c not in grouped), "Hkv named only where it differs"


def test_flop_and_byte_models():
    full, causal = _case("d128-full-s2048"), _case("d128-causal-s2048")
    assert at.flops(full, torch.bfloat16) == 4 * 8 * 16 * 2048**2 * 128
    assert at.flops(causal, torch.bfloat16) == at.flops(full, torch.bfloat16) // 2
    assert at.backward_flops(full, torch.bfloat16) == 5 * at.flops(full, torch.bfloat16) // 2
    tokens = 8 * 16 * 2048
    assert at.forward_bytes(full, torch.bfloat16) == 4 * tokens * 128 * 2 + 4 * tokens
    assert at.backward_bytes(full, torch.bfloat16) == 8 * tokens * 128 * 2 + 4 * tokens
    assert at.unfused_bytes(full, "forward") == 12 * 8 * 16 * 2048**2


def test_grouped_query_models_count_kv_bytes_at_the_kv_heads():
    grouped, equal = _case("d128-h16kv4-causal-s2048"), _case("d128-causal-s2048")
    rows, kv_rows, size = 8 * 16 * 2048, 8 * 4 * 2048, 2
    assert at.forward_bytes(grouped, torch.bfloat16) == (2 * rows + 2 * kv_rows) * 128 * size + 4 * rows
    assert at.backward_bytes(grouped, torch.bfloat16) == (4 * rows + 4 * kv_rows) * 128 * size + 4 * rows
    assert at.forward_bytes(grouped, torch.bfloat16) < at.forward_bytes(equal, torch.bfloat16)
    # FLOPs and the unfused path's scores follow the query heads: the same as with 16 K/V heads.
    assert at.flops(grouped, torch.bfloat16) == at.flops(equal, torch.bfloat16) == 2 * 8 * 16 * 2048**2 * 128
    assert at.backward_flops(grouped, torch.bfloat16) == at.backward_flops(equal, torch.bfloat16)
    assert at.unfused_bytes(grouped, "backward") == at.unfused_bytes(equal, "backward") == 24 * 8 * 16 * 2048**2
    # An older record's shape names no Hkv: the models read it as H.
    old = Case("d128-causal-s2048", {k: v for k, v in equal.shape.items()})
    assert at.forward_bytes(old, torch.bfloat16) == at.forward_bytes(equal, torch.bfloat16)
    assert at.forward_bytes(equal, torch.bfloat16) == 4 * rows * 128 * size + 4 * rows


def test_grouped_query_inputs_carry_the_kv_heads():
    case = Case("tiny", {"B": 2, "H": 6, "Hkv": 2, "S": 5, "D": 64, "causal": 0})
    inputs = at.backward_inputs(case, torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    assert inputs["q"].shape == inputs["do"].shape == (2, 6, 5, 64)
    assert inputs["k"].shape == inputs["v"].shape == (2, 2, 5, 64)


def test_point_columns_give_the_unfused_scores_beside_the_fused_bytes():
    for slug, direction in (("attention-fwd", "forward"), ("attention-bwd", "backward")):
        unfused, fused = get_experiment(slug).point_columns
        assert fused.value is None, "the fused bytes are the byte model recorded with each point"
        case = _case("d128-h16kv4-full-s8192")
        assert unfused.value(case, torch.bfloat16) == at.unfused_bytes(case, direction)
        assert unfused.unit == fused.unit == "bytes" and "S²" in unfused.title


@pytest.mark.parametrize("backward", [False, True])
def test_sdpa_profiles_run_grouped_heads_or_say_why_not(backward):
    """On this machine's torch: the CPU flash kernel takes enable_gqa=True; the other backends refuse (on the
    CPU, everything), each with a reason; heads that do not divide are refused before torch is asked."""
    experiment = get_experiment("attention-bwd" if backward else "attention-fwd")
    case = Case("tiny", {"B": 1, "H": 4, "Hkv": 2, "S": 40, "D": 64, "causal": 1})
    for name in at.SDPA_BACKENDS:
        reason = experiment.profile(name).unsupported(case, torch.bfloat16)
        if DEVICE == "cpu" and name != "sdpa-flash":
            assert reason and "refuses it" in reason
        assert reason is None or f"torch's {name.removeprefix('sdpa-')} backend refuses it" in reason
    if DEVICE == "cpu":
        assert experiment.profile("sdpa-flash").unsupported(case, torch.bfloat16) is None
    uneven = Case("uneven", {"B": 1, "H": 4, "Hkv": 3, "S": 40, "D": 64, "causal": 1})
    assert "evenly" in experiment.profile("sdpa-flash").unsupported(uneven, torch.bfloat16)


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
@pytest.mark.parametrize("kv", [None, 1])
def test_one_tiny_point_through_the_runner(slug, kv):
    experiment = get_experiment(slug)
    case = Case("tiny", {"B": 1, "H": 2, **({"Hkv": kv} if kv else {}), "S": 40, "D": 64, "causal": 1})
    keep = ("triton-fused", "sdpa-flash", "unfused")  # no compiler run here; flash is torch's CPU kernel too
    experiment = dataclasses.replace(experiment, profiles=tuple(p for p in experiment.profiles if p.name in keep))
    point = measure_point(experiment, case, torch.bfloat16, device=DEVICE, clock=WallClock(1 << 12), params=FEW,
                          ceiling_gbps=1.0)
    lab = point.results["triton-fused"]
    assert lab.status == "ok", lab
    assert lab.rel_error < experiment.tolerance[torch.bfloat16]
    for name in keep[1:]:  # grouped heads included: torch's CPU flash kernel takes enable_gqa=True
        assert point.results[name].status == "ok", point.results[name]
        assert point.results[name].rel_error < experiment.tolerance[torch.bfloat16]
    if slug == "attention-bwd":
        assert set(lab.plan) == {"backward_kv", "backward_q"}
    else:
        assert lab.plan["direction"] == "forward"
    gc.collect()
    assert not at._SAVED, "the saved forward graphs must go with the point's inputs"
