"""softmax-any-n draws its row lengths from a declared seed: the draw meets the declaration, and a case of every
kind (forward, backward, each dtype) runs through the same profiles on a tiny shape."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import DEVICE

from experiments import softmax_any_n as any_n
from experiments.spec import Case
from lab.measure.runner import measure_point
from lab.measure.timing import TimingParams, WallClock

FEW = TimingParams(warmup_rounds=1, min_samples=2, max_samples=2, target_seconds=0.0, copy_bytes=1 << 20,
                   copy_repeats=2)


def test_the_draw_meets_the_declaration():
    lengths = any_n.draw_row_lengths()
    assert len(lengths) == len(set(lengths)) == any_n.COUNT >= 64
    assert all(any_n.LOW <= n <= any_n.HIGH for n in lengths)
    assert sum(n % 2 for n in lengths) >= any_n.COUNT // 4
    assert lengths == any_n.draw_row_lengths(), "the same seed draws the same lengths"
    assert lengths != any_n.draw_row_lengths(seed=any_n.SEED + 1)
    # log-uniform: about half the draws below the geometric midpoint of the range
    middle = math.sqrt(any_n.LOW * any_n.HIGH)
    assert 0.3 < sum(n < middle for n in lengths) / len(lengths) < 0.7


def test_every_case_passes_the_byte_floor_and_names_its_direction():
    cases = any_n.EXPERIMENT.cases
    assert len(cases) == 2 * any_n.COUNT
    for case in cases:
        assert case["M"] * case["N"] * 2 >= any_n.MIN_BYTES
        assert case.name == f"{'bwd' if case['backward'] else 'fwd'}-{case['N']}"


@pytest.mark.parametrize("backward", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tiny_case_of_each_direction_runs_every_profile(backward, dtype):
    case = Case(f"tiny-{backward}", {"M": 3, "N": 257, "backward": backward})
    experiment = dataclasses.replace(any_n.EXPERIMENT, cases=(case,))
    point = measure_point(experiment, case, dtype, device=DEVICE, clock=WallClock(1 << 12), params=FEW,
                          ceiling_gbps=1.0)
    assert point.results["triton-auto"].status == "ok", point.results["triton-auto"]
    assert point.results["torch"].status == "ok"
    assert point.bytes_moved == (3 if backward else 2) * 3 * 257 * torch.empty((), dtype=dtype).element_size()
