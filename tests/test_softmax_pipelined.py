"""The single-block forward and backward on a persistent grid with the next rows' loads pipelined
(SoftmaxPlan.stages): which plans take it, and that it gives the float64 answer for any row count, programs
fewer than rows, cut and uncut rows, odd strides and offsets. Float64 references and NaN-poisoned outputs; the bounds are
test_softmax.py's. The kernel is generic in its lanes, so the interpreter runs it on short rows."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from kernels import reference
from kernels.softmax import plan_softmax, softmax, softmax_bwd, softmax_fwd
from kernels.softmax_plan import device_sms
from test_softmax import BOUNDS, DTYPES, _assert_close_to_float64, _draw, rel_err
from test_softmax_edges import _strided

softmax_module = importlib.import_module("kernels.softmax")
NAN = float("nan")
SMS = 132
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="the public functions plan a persistent grid only for a CUDA device")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [17409, 17523, 18432, 19999, 20480, 21439, 22000, 24576])
def test_two_byte_rows_past_a_16384_head_take_the_pipelined_grid(dtype, n):
    plan = plan_softmax(100_000, n, dtype, "auto", True, sms=SMS)
    assert plan.impl == "single_block" and plan.stages == 3 and plan.grid == 2 * SMS
    assert plan.block_n == 16384 and n - 16384 <= plan.tail_n < 2 * (n - 16384)
    assert plan.num_warps == (8 if plan.tail_n <= 4096 else 16)
    assert plan_softmax(100, n, dtype, "auto", True, sms=SMS).grid == 100  # never more programs than rows


@pytest.mark.parametrize("n", [16384, 16385, 17408, 24577, 30000, 12345, 10000, 9001, 4500])
def test_other_two_byte_lengths_keep_one_row_a_program(n):
    assert plan_softmax(100_000, n, torch.bfloat16, "auto", True, sms=SMS).stages == 1


def test_cut_rows_with_an_8192_head_and_a_wide_tail_take_it_uncut_ones_do_not():
    assert plan_softmax(9000, 10039, torch.bfloat16, "auto", True, sms=SMS).stages == 3
    assert plan_softmax(9000, 10000, torch.bfloat16, "auto", True, sms=SMS).stages == 1
    assert plan_softmax(9000, 10000, torch.bfloat16, "auto", True, row_stride=10001, sms=SMS).stages == 3


@pytest.mark.parametrize("n", [17523, 22000])
def test_fp32_the_backward_and_no_multiprocessors_keep_one_row_a_program(n):
    assert plan_softmax(9000, n, torch.float32, "auto", True, sms=SMS).stages == 1
    assert plan_softmax(9000, n, torch.bfloat16, "auto", True, direction="backward", sms=SMS).stages == 1
    assert plan_softmax(9000, n, torch.bfloat16, "auto", True, sms=0).stages == 1


def test_device_sms_is_zero_off_cuda():
    assert device_sms(torch.device("cpu")) == 0


def _pipelined(m: int, n: int, dtype, programs: int, block_n: int, tail_n: int, row_stride: int):
    base = plan_softmax(m, n, dtype, "single_block", row_stride=row_stride, sms=0)
    return dataclasses.replace(base, block_n=block_n, tail_n=tail_n, rows_per_program=1, num_warps=4,
                               grid=programs, stages=3, edges=n % 16 != 0 or row_stride % 16 != 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,programs", [(7, 3), (5, 5), (1, 1), (9, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "odd-stride", "offset-rows"])
@pytest.mark.parametrize("n", [90, 96, 61])
def test_pipelined_forward_matches_float64(dtype, m, programs, layout, n, device, gen):
    x = {
        "contiguous": lambda: _draw((m, n), dtype, device, gen),
        "odd-stride": lambda: _strided((m, n), dtype, device, gen, pad=3),
        "offset-rows": lambda: _strided((m, n), dtype, device, gen, pad=5, offset=16),
    }[layout]()
    plan = _pipelined(m, n, dtype, programs, 64, 32, x.stride(0))
    kernel, grid, _, meta = softmax_module._fwd_launch(x, torch.empty_like(x), plan, softmax_module._fresh_workspace)
    assert kernel is softmax_module._softmax_fwd_rows_pipelined_kernel and grid == (programs,)
    assert meta["STAGES"] == 3 and meta["EDGES"] == plan.edges
    y = softmax_fwd(x, plan, out=torch.full((m, n), NAN, dtype=dtype, device=device))
    _assert_close_to_float64(y, x)


def test_pipelined_forward_writes_every_row_and_nothing_past_them(device, gen):
    m, n = 11, 61
    x = _draw((m, n), torch.bfloat16, device, gen)
    buf = torch.full((m + 1, n), NAN, dtype=x.dtype, device=device)
    softmax_fwd(x, _pipelined(m, n, x.dtype, 4, 32, 32, n), out=buf[:m])
    assert not buf[:m].isnan().any(), "a row was skipped"
    assert buf[m].isnan().all(), "a program wrote past the last row"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,programs", [(7, 3), (1, 1), (9, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "odd-stride", "offset-rows"])
@pytest.mark.parametrize("n", [90, 61])
def test_pipelined_backward_matches_float64(dtype, m, programs, layout, n, device, gen):
    draw = {
        "contiguous": lambda scale: _draw((m, n), dtype, device, gen, scale),
        "odd-stride": lambda scale: _strided((m, n), dtype, device, gen, pad=3),
        "offset-rows": lambda scale: _strided((m, n), dtype, device, gen, pad=5, offset=16),
    }[layout]
    y = torch.softmax(draw(3.0).double(), -1).to(dtype)
    dy = draw(1.0)
    plan = _pipelined(m, n, dtype, programs, 64, 32, dy.stride(0))
    dx = torch.full((m, n), NAN, dtype=dtype, device=device)
    kernel, grid, _, meta = softmax_module._bwd_launch(y, dy, dx, plan, softmax_module._fresh_workspace)
    assert kernel is softmax_module._softmax_bwd_rows_pipelined_kernel and grid == (programs,)
    assert meta["STAGES"] == 3
    softmax_bwd(y, dy, plan, out=dx)
    assert not dx.isnan().any()
    assert rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUNDS[dtype][2]


def test_pipelined_backward_writes_every_row_and_nothing_past_them(device, gen):
    m, n = 11, 61
    y = torch.softmax(_draw((m, n), torch.float32, device, gen), -1).to(torch.bfloat16)
    dy = _draw((m, n), torch.bfloat16, device, gen, 1.0)
    buf = torch.full((m + 1, n), NAN, dtype=y.dtype, device=device)
    softmax_bwd(y, dy, _pipelined(m, n, y.dtype, 4, 32, 32, n), out=buf[:m])
    assert not buf[:m].isnan().any(), "a row was skipped"
    assert buf[m].isnan().all(), "a program wrote past the last row"


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [17523, 20480, 22000])
def test_public_softmax_on_the_pipelined_grid(dtype, n, gen):
    x = _draw((300, n), dtype, "cuda", gen)
    route_plan = plan_softmax(300, n, dtype, row_stride=n)
    assert route_plan.stages == 3
    y = softmax(x, dim=-1)
    _assert_close_to_float64(y, x)
    x.requires_grad_(True)
    y = softmax(x, dim=-1)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert g.abs().max().item() < 1e-2  # the gradient of a row's sum is zero
