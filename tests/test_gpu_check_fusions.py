"""checks/fusions.py's own logic on small shapes: its correctness checks pass on correct kernels and
fail on a broken one, and its timing rows are shaped as the JSON promises. On a machine without CUDA the
kernels run through the interpreter and the figures mean nothing; only the code paths are exercised."""

from __future__ import annotations

import pytest
import torch
from sitetools import load_check

from experiments.spec import Case
from lab.measure.timing import CPU_TIMING, GPU_TIMING, make_clock

tool = load_check("fusions")


def test_correctness_checks_pass_on_small_shapes(device):
    rows = tool.correctness(((3, 40), (5, 130)), ((2, 21, "flat"), (3, 10, "packed")), device=device)
    assert len(rows) == 3 * 4
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    assert {row["op"] for row in rows} == {"add_rmsnorm", "swiglu (flat)", "swiglu (packed)"}


def test_correctness_check_fails_on_a_broken_kernel(device, monkeypatch):
    real = tool.add_rmsnorm_bwd

    def forgets_the_last_row(dy, dh, h, gamma, rstd, plan, dx_out, dgamma_out, partials_out):
        dx, dgamma = real(dy, dh, h, gamma, rstd, plan, dx_out=dx_out, dgamma_out=dgamma_out, partials_out=partials_out)
        dx[-1] = float("nan")
        return dx, dgamma

    monkeypatch.setattr(tool, "add_rmsnorm_bwd", forgets_the_last_row)
    row = tool.check_add_rmsnorm(4, 24, torch.float32, device)
    assert row["nan"] and not row["ok"]


def test_timing_rows_have_every_provider_and_the_byte_model(device):
    clock = make_clock(device)
    params = CPU_TIMING if device == "cpu" else GPU_TIMING
    rows = tool.time_point(clock, 100.0, "add_rmsnorm", tool.ar, Case("s", {"T": 4, "H": 32}), torch.float32,
                           "backward", False, False, device=device, params=params)
    assert [r["provider"] for r in rows] == ["triton", "torch"]
    for r in rows:
        assert "error" not in r, r
        assert r["bytes"] == tool.ar.backward_bytes(Case("s", {"T": 4, "H": 32}), torch.float32)
        assert r["us"] > 0 and r["pct"] == 100 * r["gbps"] / 100.0


@pytest.mark.slow
def test_variants_time_every_plan(device):
    clock = make_clock(device)
    params = CPU_TIMING if device == "cpu" else GPU_TIMING
    rows = tool.variants(clock, 100.0, add_points=((6, 40, torch.float32),), swiglu_shape=(3, 50), device=device,
                         params=params)
    assert rows and all("error" not in r for r in rows), [r for r in rows if "error" in r]
    add = [r for r in rows if r["point"].startswith("add_rmsnorm")]
    assert {r["variant"] for r in add} >= {f"pps{p} st{s}" for p in (1, 2, 4) for s in (1, 2, 3)}
    assert len([r for r in rows if r["point"].startswith("swiglu")]) == 2 * 2 * 8
