"""Rows cut at 16-byte boundaries (SoftmaxPlan.edges): row lengths and strides that are not multiples of 16
elements, rows that start off a boundary, matrices whose base is misaligned. Float64 references and
NaN-poisoned outputs; the bounds are test_softmax.py's. Split-row cases need a GPU.

Under the interpreter the alignment hints are not checked by any hardware, so these tests show the cut's
arithmetic (head, body, tail) right; on a GPU they also show the hints true (a false one faults).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from accuracy import rel_err
from kernels import reference
from kernels.softmax import SoftmaxPlan, plan_softmax, softmax, softmax_bwd, softmax_fwd
from test_softmax import BOUNDS, DTYPES, _assert_close_to_float64, _draw, needs_gpu

softmax_module = importlib.import_module("kernels.softmax")

NAN = float("nan")


def _strided(shape, dtype, device, gen, pad: int, offset: int = 0) -> torch.Tensor:
    """A (m, n) matrix whose rows are n + pad elements apart, starting `offset` elements into its buffer."""
    m, n = shape
    buf = _draw((m * (n + pad) + offset + n,), dtype, device, gen)
    return buf[offset:offset + m * (n + pad)].view(m, n + pad)[:, :n]


@pytest.mark.parametrize("n", [1000, 1001, 1030, 4099, 5003, 16, 17])
@pytest.mark.parametrize("stride", [None, 16, 3001])
def test_plan_cuts_rows_unless_length_and_stride_are_multiples_of_16(n, stride):
    row_stride = n if stride is None else stride if stride >= n else n + stride
    plan = plan_softmax(64, n, torch.float32, "single_block", row_stride=row_stride)
    wanted = (n % 16 != 0 or row_stride % 16 != 0) and plan.rows_per_program == 1
    assert plan.edges == wanted
    split = plan_softmax(4, 40000 + n, torch.bfloat16, "auto", allow_split_row=True, row_stride=row_stride + 40000)
    assert split.impl == "split_row" and split.edges == ((n + 40000) % 16 != 0 or (row_stride + 40000) % 16 != 0)


def test_short_rows_and_online_plans_never_cut():
    assert not plan_softmax(64, 300, torch.float32).edges  # several rows a program
    assert not plan_softmax(4, 70001, torch.float32, "online").edges


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_launch_cuts_only_rows_on_a_boundary(dtype, device, gen):
    n = 1001
    x = _draw((3, n), dtype, device, gen)
    plan = plan_softmax(3, n, dtype)
    assert plan.edges
    _, _, _, meta = softmax_module._fwd_launch(x, torch.empty_like(x), plan, softmax_module._fresh_workspace)
    assert meta["EDGES"] and meta["Y_ALIGNED"] and meta["VEC"] == 16 // x.element_size()
    off = _draw((3 * n + 1,), dtype, device, gen)[1:].view(3, n)  # base 2 or 4 bytes past a boundary
    _, _, _, meta = softmax_module._fwd_launch(off, torch.empty_like(x), plan, softmax_module._fresh_workspace)
    assert not meta["EDGES"], "a misaligned base must not be hinted aligned"
    y_odd = torch.empty(3 * n + 8, dtype=dtype, device=device)[1:1 + 3 * n].view(3, n)
    _, _, _, meta = softmax_module._fwd_launch(x, y_odd, plan, softmax_module._fresh_workspace)
    assert meta["EDGES"] and not meta["Y_ALIGNED"]


@pytest.mark.parametrize("n", [1001, 1030, 4099, 5003])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "odd-stride", "offset-base", "offset-rows"])
def test_forward_and_backward_at_any_cut(dtype, n, layout, device, gen):
    m = 3
    x = {
        "contiguous": lambda: _draw((m, n), dtype, device, gen),
        "odd-stride": lambda: _strided((m, n), dtype, device, gen, pad=3),
        "offset-base": lambda: _strided((m, n), dtype, device, gen, pad=0, offset=1),
        "offset-rows": lambda: _strided((m, n), dtype, device, gen, pad=5, offset=16),
    }[layout]()
    plan = plan_softmax(m, n, dtype, row_stride=x.stride(0))
    y = softmax_fwd(x, plan, out=torch.full((m, n), NAN, dtype=dtype, device=device))
    _assert_close_to_float64(y, x)
    dy = _draw((m, n), dtype, device, gen, scale=1.0)
    bwd = plan_softmax(m, n, dtype, direction="backward")
    dx = softmax_bwd(y, dy, bwd, out=torch.full((m, n), NAN, dtype=dtype, device=device))
    assert not torch.isnan(dx).any()
    assert rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUNDS[dtype][2]


@pytest.mark.parametrize("n,block_n,tail_n", [(40, 64, 0), (64, 64, 0), (61, 64, 0), (77, 64, 16), (100, 128, 0)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "odd-stride", "offset-rows"])
def test_backward_reloading_the_row_at_any_cut(dtype, n, block_n, tail_n, layout, device, gen):
    """SoftmaxPlan.reload (y and dy loaded again for dx) on cut and uncut rows, with and without a tail."""
    m = 3
    y = {
        "contiguous": lambda: _draw((m, n), dtype, device, gen),
        "odd-stride": lambda: _strided((m, n), dtype, device, gen, pad=3),
        "offset-rows": lambda: _strided((m, n), dtype, device, gen, pad=5, offset=16),
    }[layout]()
    y.copy_(y.float().softmax(-1))  # probabilities, in the layout drawn
    dy = _draw((m, n), dtype, device, gen, scale=1.0)
    edges = n % 16 != 0 or y.stride(0) % 16 != 0
    plan = SoftmaxPlan("single_block", block_n, 1, 4, m, tail_n=tail_n, edges=edges, reload=True)
    dx = softmax_bwd(y, dy, plan, out=torch.full((m, n), NAN, dtype=dtype, device=device))
    assert not torch.isnan(dx).any()
    assert rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUNDS[dtype][2]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_public_softmax_and_grad_on_odd_strided_rows(dtype, device, gen):
    x = _strided((4, 2051), dtype, device, gen, pad=7, offset=3).requires_grad_()
    y = softmax(x)
    _assert_close_to_float64(y.detach(), x.detach())
    dy = _draw(y.shape, dtype, device, gen, scale=1.0)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    assert rel_err(x.grad, x64.grad) <= BOUNDS[dtype][2]


def test_rows_shorter_than_a_vector(device, gen):
    # A cut whose head covers the whole row: rows of 1-7 elements placed off a boundary, one row a program.
    for n in range(1, 8):
        x = _strided((2, n), torch.bfloat16, device, gen, pad=3, offset=5)
        plan = softmax_module.SoftmaxPlan("single_block", 16, 1, 1, 2, edges=True)
        y = softmax_fwd(x, plan, out=torch.full((2, n), NAN, dtype=torch.bfloat16, device=device))
        _assert_close_to_float64(y, x)


@needs_gpu
@pytest.mark.parametrize("n", [40001, 70003, 131079])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pad,offset", [(0, 0), (3, 0), (5, 16)])
def test_split_row_at_any_cut(dtype, n, pad, offset, device, gen):
    m = 5
    x = _strided((m, n), dtype, device, gen, pad=pad, offset=offset)
    plan = plan_softmax(m, n, dtype, "auto", allow_split_row=True, row_stride=x.stride(0))
    assert plan.impl == "split_row" and plan.edges
    y = softmax_fwd(x, plan, out=torch.full((m, n), NAN, dtype=dtype, device=device))
    _assert_close_to_float64(y, x)
    dy = _draw((m, n), dtype, device, gen, scale=1.0)
    dx = softmax_bwd(y, dy, plan_softmax(m, n, dtype, "auto", True, "backward"),
                     out=torch.full((m, n), NAN, dtype=dtype, device=device))
    assert not torch.isnan(dx).any()
    assert rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUNDS[dtype][2]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,splits", [(16_385, 3), (17_001, 3), (40_000, 5), (100_000, 13), (262_144, 32),
                                      (262_145, 33), (524_288, 64)])
def test_split_row_slices_are_8192_wide_on_4_warps_in_both_directions(dtype, n, splits):
    # Rows past 32,768 split in both directions; fp32 rows past 16,384 already in the backward.
    directions = ("forward", "backward") if n > 32768 else ("backward",) if dtype == torch.float32 else ()
    for direction in directions:
        plan = plan_softmax(8, n, dtype, "auto", allow_split_row=True, direction=direction)
        assert (plan.impl, plan.block_n, plan.num_warps, plan.splits, plan.grid) == (
            "split_row", 8192, 4, splits, 8 * splits)
    assert plan_softmax(8, 524_289, dtype, "auto", allow_split_row=True, direction="backward").impl == "online"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [40_000, 40_001, 65_536, 100_003])
def test_split_row_forward_slices_compile_under_a_register_cap(dtype, n):
    # The cap that fits one more program an SM (kernels/softmax_plan.py, _SPLIT_ROW_MAX_REGISTERS): every
    # 2-byte forward slice, fp32 forward slices of rows cut at 16-byte boundaries; never the backward's.
    plan = plan_softmax(8, n, dtype, "auto", allow_split_row=True, direction="forward", clusters=False)
    cut = n % 16 != 0
    want = 80 if dtype != torch.float32 else 96 if cut else 0
    assert (plan.impl, plan.edges, plan.max_registers) == ("split_row", cut, want)
    strided = plan_softmax(8, n, dtype, "auto", allow_split_row=True, row_stride=n + 8 // dtype.itemsize)
    assert strided.edges and strided.max_registers == (80 if dtype != torch.float32 else 96)
    for clusters in (False, True):
        back = plan_softmax(8, n, dtype, "auto", allow_split_row=True, direction="backward", clusters=clusters)
        assert back.max_registers == 0
