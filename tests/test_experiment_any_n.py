"""softmax-any-n and softmax-any-n-bwd draw their row lengths from a declared seed: the draw meets the
declaration, and a case of each direction and dtype runs through every profile on a tiny shape."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import DEVICE

from experiments import _any_n as any_n
from experiments import softmax_any_n, softmax_any_n_bwd
from experiments.spec import Case
from lab.evidence.hashing import source_files
from lab.measure.runner import measure_point
from lab.measure.timing import TimingParams, WallClock

FEW = TimingParams(warmup_rounds=1, min_samples=2, max_samples=2, target_seconds=0.0, copy_bytes=1 << 20,
                   copy_repeats=2)
EXPERIMENTS = {0: softmax_any_n.EXPERIMENT, 1: softmax_any_n_bwd.EXPERIMENT}
ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("backward", [0, 1])
def test_every_case_passes_the_byte_floor_and_names_its_direction(backward):
    experiment = EXPERIMENTS[backward]
    assert [c["N"] for c in experiment.cases] == any_n.draw_row_lengths()
    assert len(experiment.dtypes) == 3
    for case in experiment.cases:
        assert case["M"] * case["N"] * 2 >= any_n.MIN_BYTES
        assert case.name == f"{'bwd' if backward else 'fwd'}-{case['N']}"
    assert "experiments/_any_n.py" in source_files(experiment, ROOT), "the shared draw is hashed into records"


def test_inputs_reproduce_from_the_point_seed():
    case = Case("tiny", {"M": 3, "N": 257})
    draw = lambda seed: any_n.backward_inputs(case, torch.float32, DEVICE, torch.Generator().manual_seed(seed))  # noqa: E731
    first, again, other = draw(7), draw(7), draw(8)
    assert torch.equal(first["y"], again["y"]) and torch.equal(first["dy"], again["dy"])
    assert not torch.equal(first["dy"], other["dy"])
    torch.testing.assert_close(first["y"].sum(-1), torch.ones(3, device=DEVICE))


@pytest.mark.parametrize("backward", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tiny_case_of_each_direction_runs_every_profile(backward, dtype):
    case = Case("tiny", {"M": 3, "N": 257})
    experiment = dataclasses.replace(EXPERIMENTS[backward], cases=(case,))
    point = measure_point(experiment, case, dtype, device=DEVICE, clock=WallClock(1 << 12), params=FEW,
                          ceiling_gbps=1.0)
    assert point.results["triton-auto"].status == "ok", point.results["triton-auto"]
    assert point.results["torch" if backward else "torch.softmax"].status == "ok"
    assert point.bytes_moved == (3 if backward else 2) * 3 * 257 * torch.empty((), dtype=dtype).element_size()
