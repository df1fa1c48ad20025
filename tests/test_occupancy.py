"""probes/occupancy.py: the SM's limits applied to a compiled kernel's registers, warps and shared memory, the
launch's specialisation, and one plan compiled for sm_90 without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from labtools import run_compiled

ROOT = Path(__file__).resolve().parents[1]

from probes import occupancy as occ  # noqa: E402


@pytest.mark.parametrize("registers,warps,shared,programs,limit", [
    (128, 16, 98368, 1, "registers"),  # 128 x 32 x 16 = 65,536 registers: one program
    (64, 16, 98368, 2, "registers"),
    (24, 8, 32, 8, "warps"),  # 64 warps an SM
    (32, 1, 0, 32, "programs"),
    (40, 4, 80 * 1024, 2, "shared memory"),  # 228 KiB / (80 + 1) KiB
    (90, 4, 16, 5, "registers"),  # 90 registers round up to 96 a thread: 12,288 a program
])
def test_programs_an_sm_follow_the_limit_that_binds(registers, warps, shared, programs, limit):
    fit = occ.occupancy(registers, warps, shared)
    assert (fit.programs, fit.limit) == (programs, limit)
    assert fit.programs == min(fit.by_limit.values())


def test_the_signature_is_specialised_as_a_launch_specialises_it():
    from kernels.softmax import _fwd_launch, _fresh_workspace, plan_softmax

    x = torch.empty(1000, 4096 + 48, dtype=torch.bfloat16, device="meta")
    plan = plan_softmax(1000, x.shape[1], x.dtype, "auto", True, sms=132)
    kernel, _, args, meta = _fwd_launch(x, torch.empty_like(x), plan, _fresh_workspace)
    sig, constexprs, attrs = occ.signature(kernel, args, meta)
    assert sig["x_ptr"] == "*bf16" and sig["y_ptr"] == "*bf16"
    assert sig["n_cols"] == "i32" and (kernel.arg_names.index("n_cols"),) in attrs  # 4144 = 16 x 259
    assert all(sig[name] == "constexpr" for name in constexprs)
    assert "num_warps" not in sig and constexprs["BLOCK_N"] == plan.block_n


def test_a_pipelined_plan_reports_the_programs_its_grid_asks_for(tmp_path):
    """Compiled for sm_90 outside the interpreter: the 2-byte forward's pipelined plan at N = 21,439 runs on a
    persistent grid of two programs an SM; the report says how many fit and which limit binds."""
    report = json.loads(run_compiled([str(ROOT / "probes" / "occupancy.py"), "--n", "21439", "--m", "4096"], tmp_path))
    assert report["kernel"] == "_softmax_fwd_rows_pipelined_kernel" and report["plan"]["stages"] > 1
    assert report["planned_programs_an_sm"] == 2
    assert 1 <= report["programs_an_sm"] <= 2 and report["limit"] in report["by_limit"]
    assert 0 < report["registers"] <= 255 and report["shared_bytes"] > 0


def test_a_record_s_points_are_read_with_the_plans_they_recorded(tmp_path):
    """--record: every point of a softmax run record from --min-n up, its recorded plan compiled, one line of
    JSON each, beside the % of the ceiling the record holds for it."""
    from lab.evidence.store import load_record

    path = sorted((ROOT / "records" / "softmax-any-n").glob("*-nvidia-h100-*.json.gz"))[-1]
    record = load_record(path)
    want = {(p.case, p.dtype): p.results["triton-auto"] for p in record.points if p.shape["N"] >= 200000}
    out = run_compiled([str(ROOT / "probes" / "occupancy.py"), "--record", str(path), "--min-n", "200000"], tmp_path)
    rows = [json.loads(line) for line in out.splitlines()]
    assert want and {(r["case"], r["dtype"]) for r in rows} == set(want)
    for row in rows:
        result = want[row["case"], row["dtype"]]
        assert row["plan"] == result.plan and row["pct_of_ceiling"] == round(result.pct_of_ceiling, 1)
        assert row["programs_an_sm"] >= 1 and row["held_kib"] > 0


@pytest.mark.parametrize("n,dtype,cap,programs", [(40_001, "bfloat16", 80, 6), (40_001, "float32", 96, 5)])
def test_a_capped_split_row_plan_compiles_within_its_cap(n, dtype, cap, programs, tmp_path):
    """Compiled for sm_90 outside the interpreter: the split-row forward's register cap (the plan's
    max_registers) reaches the compiler, and the programs an SM it was chosen for fit."""
    report = json.loads(run_compiled([str(ROOT / "probes" / "occupancy.py"), "--n", str(n), "--m", "64",
                                      "--dtype", dtype], tmp_path))
    assert report["kernel"] == "_softmax_fwd_split_row_kernel" and report["plan"]["max_registers"] == cap
    assert report["registers"] <= cap and report["programs_an_sm"] == programs
