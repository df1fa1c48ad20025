"""kernels.softmax against float64 references, on every schedule, dtype, rank and special value.

Bounds, one row per dtype (why these numbers):
* rtol: the output is rounded once to the storage dtype (fp16: 2^-11, bf16: 2^-8 relative), plus the fp32
  exp (the GPU's ex2.approx after a multiply by log2 e: a few 1e-7 relative for |x - m| < 30). Two units in
  the last place of the storage dtype pass; a wrong max, a missing row or a stale tile does not.
* atol: fp16's subnormal spacing (6e-8) for fp16, zero beyond fp32 rounding noise elsewhere.
* grad: norm-wise relative error of dx, whose cancellation (dy - dot) makes elementwise bounds meaningless;
  dominated by the rounding of the saved y.
Each kernel error must also stay within GRAD_TORCH_FACTOR of torch's own error in the same dtype (or, if
larger, of the error of the float64 result merely stored in that dtype). Triton 3.6's interpreter truncates
fp32 -> bf16 where the GPU rounds to nearest, so under the interpreter that storage error is truncation's.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels
from accuracy import reference_error, rel_err
from kernels import reference
from kernels.softmax import (
    AUTO_SINGLE_BLOCK_MAX_N,
    MAX_SINGLE_BLOCK_N,
    MAX_SPLITS,
    SoftmaxPlan,
    choose_impl,
    plan_softmax,
    single_block_lanes,
    softmax,
    softmax_bwd,
    softmax_fwd,
)

softmax_module = importlib.import_module("kernels.softmax")  # `kernels.softmax` the package attr is the function

#               rtol    atol    grad (norm-wise)
BOUNDS = {
    torch.float32: (2e-5, 1e-12, 2e-5),
    torch.float16: (2e-3, 6e-8, 4e-3),
    torch.bfloat16: (1.6e-2, 1e-12, 3e-2),
}
GRAD_TORCH_FACTOR = 4.0
DTYPES = list(BOUNDS)
IMPLS = ["auto", "single_block", "online"]
ROW_LENGTHS = [1, 2, 3, 127, 128, 129, 1000, 1024, 4097, 4600, 70000]  # 4097, 4600: head + tail lanes


def _rows_for(n: int) -> int:
    # The interpreter runs one program at a time: few rows, and fewer still for long ones.
    return 2 if n > 4096 else 5


def _draw(shape, dtype, device, gen, scale=3.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)


def _assert_close_to_float64(y: torch.Tensor, x: torch.Tensor, dim: int = -1):
    rtol, atol, _ = BOUNDS[x.dtype]
    ref = reference.softmax_float64(x, dim)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert not torch.isnan(y).any(), "an output element is NaN (unwritten, or a wrong reduction)"
    err = (y.double() - ref).abs()
    bound = atol + rtol * ref.abs()
    worst = (err - bound).argmax()
    assert (err <= bound).all(), f"max excess at flat index {worst.item()}: err {err.flatten()[worst].item():.3e}"


# ---------------------------------------------------------------------------------------------------------
# Forward and backward against float64, every impl, dtype and row length
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_forward_matches_float64(impl, dtype, n, device, gen):
    x = _draw((_rows_for(n), n), dtype, device, gen)
    y = softmax(x, impl=impl)
    _assert_close_to_float64(y, x)
    # No worse than torch's own kernel in the same dtype.
    ref = reference.softmax_float64(x)
    ours, theirs = rel_err(y, ref), reference_error(torch.softmax(x, -1), ref, dtype)
    assert ours <= GRAD_TORCH_FACTOR * theirs + 1e-7


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_backward_matches_float64(impl, dtype, n, device, gen):
    x = _draw((_rows_for(n), n), dtype, device, gen).requires_grad_()
    dy = _draw((_rows_for(n), n), dtype, device, gen, scale=1.0)
    softmax(x, impl=impl).backward(dy)

    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    assert x.grad.dtype == dtype and not torch.isnan(x.grad).any()
    err = rel_err(x.grad, x64.grad)
    assert err <= BOUNDS[dtype][2], f"relative error {err:.3e}"

    xt = x.detach().clone().requires_grad_()
    torch.softmax(xt, -1).backward(dy)
    assert err <= GRAD_TORCH_FACTOR * reference_error(xt.grad, x64.grad, dtype) + 1e-7


# ---------------------------------------------------------------------------------------------------------
# Shapes, ranks, dims and layouts
# ---------------------------------------------------------------------------------------------------------

SHAPES_AND_DIMS = [((7,), 0), ((3, 5, 9), 0), ((3, 5, 9), 1), ((3, 5, 9), 2), ((3, 5, 9), -2),
                   ((2, 3, 4, 33), 1), ((2, 3, 4, 33), -1)]


@pytest.mark.parametrize("shape,dim", SHAPES_AND_DIMS)
@pytest.mark.parametrize("impl", IMPLS)
def test_any_rank_and_dim(shape, dim, impl, device, gen):
    x = _draw(shape, torch.float32, device, gen).requires_grad_()
    y = softmax(x, dim, impl=impl)
    _assert_close_to_float64(y, x.detach(), dim)
    dy = _draw(shape, torch.float32, device, gen)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, dim).backward(dy.double())
    assert rel_err(x.grad, x64.grad) <= BOUNDS[torch.float32][2]


def _non_contiguous_inputs(device, gen):
    base = _draw((6, 40), torch.float32, device, gen)
    yield "transposed", base.t()  # rows along a strided dim
    yield "column slice", base[:, 3:31]  # row stride != N
    yield "step slice", base[:, ::2]  # unit stride lost: copied
    yield "row step", base[::2]
    yield "expanded", _draw((1, 40), torch.float32, device, gen).expand(5, 40)  # row stride 0
    yield "expanded along dim", _draw((6, 1), torch.float32, device, gen).expand(6, 17)  # stride 0 in row


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl, device, gen):
    for name, x in _non_contiguous_inputs(device, gen):
        y = softmax(x, -1, impl=impl)
        try:
            _assert_close_to_float64(y, x)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


def test_non_contiguous_upstream_gradient(device, gen):
    x = _draw((4, 30), torch.float32, device, gen).requires_grad_()
    dy = _draw((30, 4), torch.float32, device, gen).t()  # a transposed gradient
    softmax(x).backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    assert rel_err(x.grad, x64.grad) <= BOUNDS[torch.float32][2]


# ---------------------------------------------------------------------------------------------------------
# Poisoned outputs: every element must be written, including the rows of a partial last program
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 100, 129, 4224, 4600, 5000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)  # fp32 short rows run on one warp
@pytest.mark.parametrize("impl", ["single_block", "online"])
def test_every_output_element_written(impl, dtype, n, device, gen):
    m = 13  # not a multiple of any rows-per-program
    x = _draw((m, n), dtype, device, gen)
    plan = plan_softmax(m, n, x.dtype, impl)
    y = softmax_fwd(x, plan, out=torch.full_like(x, float("nan")))
    _assert_close_to_float64(y, x)
    dy = _draw((m, n), dtype, device, gen)
    dx = softmax_bwd(y, dy, plan, out=torch.full_like(x, float("nan")))
    assert not torch.isnan(dx).any()
    ref = reference.softmax_backward(y.double(), dy.double())
    assert rel_err(dx, ref) <= BOUNDS[dtype][2]


def test_launch_writes_nothing_outside_its_rows(device, gen):
    # The output is a view into a larger poisoned buffer: neighbours of every row must stay poisoned.
    x = _draw((9, 50), torch.float32, device, gen)
    for impl in ["single_block", "online"]:
        buf = torch.full((9, 64), float("nan"), device=device)
        out = buf[:, 7:57]
        softmax_fwd(x, plan_softmax(9, 50, x.dtype, impl), out=out)
        assert torch.isnan(buf[:, :7]).all() and torch.isnan(buf[:, 57:]).all()
        _assert_close_to_float64(out, x)


@pytest.mark.parametrize("m", [8, 10])  # 8: every program's four rows exist; 10: the last program has two
def test_packed_rows_write_no_row_past_the_matrix(m, device, gen):
    # A program holding 4 rows of a matrix of m rows: the last program of a ragged m (10) must write no row
    # past the matrix, and an even m (8) must come out whole.
    n = 200
    x = _draw((m, n), torch.float32, device, gen)
    dy = _draw((m, n), torch.float32, device, gen)
    for direction in ("forward", "backward"):
        plan = plan_softmax(m, n, x.dtype, "single_block", direction=direction)
        assert plan.rows_per_program == 4
        buf = torch.full((m + 4, n), float("nan"), device=device)
        if direction == "forward":
            _assert_close_to_float64(softmax_fwd(x, plan, out=buf[:m]), x)
        else:
            y = softmax_fwd(x, plan_softmax(m, n, x.dtype, "single_block"))
            dx = softmax_bwd(y, dy, plan, out=buf[:m])
            assert rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUNDS[torch.float32][2]
        assert torch.isnan(buf[m:]).all()


def test_row_offsets_are_32_bit_only_while_every_element_fits():
    # The one-row forward multiplies the row index by the row stride in 32 bits unless some element lies 2^31
    # or more elements past its tensor's start; the stride, not the row length, decides.
    fits = softmax_module._row_offsets_fit_int32
    meta = {"device": "meta", "dtype": torch.float32}
    assert fits(torch.empty((2, 2**30), **meta))  # last element at 2^31 - 1
    assert not fits(torch.empty((2, 2**30 + 1), **meta))
    assert not fits(torch.empty((3, 2**30), **meta))
    assert not fits(torch.empty_strided((2, 16), (2**31, 1), **meta))
    assert not fits(torch.empty((4, 8), **meta), torch.empty_strided((4, 8), (2**30, 1), **meta))


def test_row_kernel_gives_the_same_rows_with_64_bit_offsets(device, gen, monkeypatch):
    x = _draw((6, 700), torch.float32, device, gen)
    plan = plan_softmax(6, 700, x.dtype, "single_block")
    assert plan.rows_per_program == 1
    y32 = softmax_fwd(x, plan)
    monkeypatch.setattr(softmax_module, "_row_offsets_fit_int32", lambda *matrices: False)
    y64 = softmax_fwd(x, plan)
    _assert_close_to_float64(y64, x)
    assert torch.equal(y32, y64)


# ---------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    m=st.integers(1, 4),
    n=st.integers(1, 600),
    dtype=st.sampled_from(DTYPES),
    impl=st.sampled_from(IMPLS),
    scale=st.sampled_from([0.01, 1.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_matches_reference_and_sums_to_one(m, n, dtype, impl, scale, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = _draw((m, n), dtype, device, g, scale)
    y = softmax(x, impl=impl)
    _assert_close_to_float64(y, x)
    rtol = BOUNDS[dtype][0]
    sums = y.double().sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), rtol=0, atol=rtol * math.sqrt(n) + 1e-6)
    assert (y >= 0).all() and (y <= 1).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_shift_invariance(impl, device, gen):
    # x in steps of 1/8 and shifts that are multiples of 64 keep x + c exact in fp32.
    x = (torch.randint(-80, 80, (6, 300), generator=gen).double() / 8).float().to(device)
    c = (torch.randint(-4, 5, (6, 1), generator=gen).double() * 64).float().to(device)
    y, y_shift = softmax(x, impl=impl), softmax(x + c, impl=impl)
    assert torch.equal(y, y_shift)


@pytest.mark.parametrize("impl", ["single_block", "online"])
def test_impls_agree(impl, device, gen):
    x = _draw((4, 3000), torch.float32, device, gen)
    other = "online" if impl == "single_block" else "single_block"
    torch.testing.assert_close(softmax(x, impl=impl), softmax(x, impl=other), rtol=2e-6, atol=1e-9)


# ---------------------------------------------------------------------------------------------------------
# The worked example (seed 002): O and dX to four decimals
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_worked_example(impl, device):
    x = torch.tensor([[1.0, 2.0, 3.0], [1.0, 3.0, 5.0]], device=device, requires_grad=True)
    d_o = torch.tensor([[0.1, 0.2, 0.7], [0.2, 0.3, 0.5]], device=device)
    o = softmax(x, impl=impl)
    o.backward(d_o)
    expected_o = torch.tensor([[0.0900, 0.2447, 0.6652], [0.0159, 0.1173, 0.8668]])
    expected_dx = torch.tensor([[-0.0381, -0.0792, 0.1173], [-0.0043, -0.0202, 0.0245]])
    four_decimals = lambda t: torch.round(t.detach().cpu().double() * 1e4) / 1e4  # noqa: E731
    assert torch.allclose(four_decimals(o), expected_o.double(), rtol=0, atol=1e-6)
    assert torch.allclose(four_decimals(x.grad), expected_dx.double(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Special values, exactly as torch.softmax
# ---------------------------------------------------------------------------------------------------------

INF, NAN = float("inf"), float("nan")
SPECIAL_ROWS = [
    [-INF, -INF, -INF, -INF],  # all -inf: NaN
    [1.0, -INF, 2.0, -INF],  # -inf entries: exactly 0
    [1.0, INF, 2.0, 0.0],  # +inf: NaN
    [1.0, NAN, 2.0, 0.0],  # NaN: NaN
    [INF, INF, 1.0, 1.0],
    [-INF, 0.0, -INF, -INF],  # one finite entry: exactly 1
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("width", [4, 4200, 5000])
def test_special_values_match_torch(impl, dtype, width, device):
    rows = torch.tensor(SPECIAL_ROWS)
    x = torch.full((len(SPECIAL_ROWS), width), -INF)
    x[:, :4] = rows
    if width > 4:
        x[:, -4:] = rows  # the special values also sit in the last, partial tile
    x = x.to(dtype).to(device)
    y = softmax(x, impl=impl).float().cpu()
    expected = torch.softmax(x.float().cpu(), -1)
    assert torch.equal(torch.isnan(y), torch.isnan(expected))
    finite = ~torch.isnan(expected)
    assert torch.equal(y[finite] == 0, expected[finite] == 0), "-inf entries must give exactly 0"
    torch.testing.assert_close(y[finite], expected[finite], rtol=BOUNDS[dtype][0], atol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_no_overflow_near_fp16_max(impl, device):
    x = torch.tensor([[65504.0, 65472.0, 65440.0, -65504.0], [65504.0, 65504.0, 65504.0, 65504.0]])
    x = x.to(torch.float16).to(device)
    y = softmax(x, impl=impl)
    _assert_close_to_float64(y, x)
    assert torch.equal(y[1].float().cpu(), torch.full((4,), 0.25))


@pytest.mark.parametrize("impl", IMPLS)
def test_no_overflow_near_fp32_huge(impl, device):
    x = torch.tensor([[1e30, 0.9999999e30, -1e30, 3e38], [1e30, 1e30, 1e30, -3e38]], device=device)
    y = softmax(x, impl=impl)
    expected = torch.softmax(x.cpu(), -1)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------------------
# Empty tensors and bad input
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,dim", [((0, 5), -1), ((5, 0), -1), ((0,), 0), ((3, 0, 4), 2), ((3, 0, 4), 1)])
def test_empty_tensors_return_empty_without_launch(shape, dim, device, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("an empty tensor must not launch a kernel")

    for name in ("softmax_fwd", "_fwd_launch", "bind", "_new_route"):
        monkeypatch.setattr(softmax_module, name, no_launch)
    x = torch.empty(shape, device=device)
    y = softmax(x, dim)
    assert y.shape == x.shape and y.dtype == x.dtype


def test_zero_dim_tensor(device):
    y = softmax(torch.tensor(3.5, device=device), 0)
    assert y.shape == () and y.item() == 1.0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_integer_and_bool_input_raise_type_error(dtype, device):
    with pytest.raises(TypeError, match="supported dtypes are float32, float16, bfloat16"):
        softmax(torch.ones(2, 3, device=device).to(dtype))


def test_float64_raises_type_error_naming_supported_dtypes(device):
    with pytest.raises(TypeError, match="float64.*supported dtypes are float32, float16, bfloat16"):
        softmax(torch.ones(2, 3, dtype=torch.float64, device=device))


@pytest.mark.parametrize("dim", [2, -3, 10])
def test_dim_out_of_range(dim, device):
    with pytest.raises(IndexError, match=r"expected to be in range of \[-2, 1\]"):
        softmax(torch.ones(2, 3, device=device), dim)


def test_non_tensor_and_bad_impl():
    with pytest.raises(TypeError, match="torch.Tensor"):
        softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="'auto', 'single_block', 'online'"):
        softmax(torch.ones(2, 3), impl="fast")


def test_cpu_tensor_without_interpreter_names_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        softmax(torch.ones(2, 3))


def test_single_block_refuses_rows_past_its_limit():
    with pytest.raises(ValueError, match=f"N <= {MAX_SINGLE_BLOCK_N}.*impl='online'"):
        plan_softmax(4, MAX_SINGLE_BLOCK_N + 1, torch.float32, "single_block")
    assert plan_softmax(4, MAX_SINGLE_BLOCK_N + 1, torch.float32, "auto").impl in ("online", "split_row")


# ---------------------------------------------------------------------------------------------------------
# The launch plan: which branch runs on each side of every threshold
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_auto_dispatch_on_each_side_of_threshold(dtype, direction):
    limit = AUTO_SINGLE_BLOCK_MAX_N[direction][dtype]
    for allow_split_row, long_row_impl in [(True, "split_row"), (False, "online")]:
        assert choose_impl(limit, dtype, allow_split_row, direction) == "single_block"
        assert choose_impl(limit + 1, dtype, allow_split_row, direction) == long_row_impl
        assert plan_softmax(8, limit, dtype, "auto", allow_split_row, direction).impl == "single_block"
        assert plan_softmax(8, limit + 1, dtype, "auto", allow_split_row, direction).impl == long_row_impl


@pytest.mark.parametrize("dtype,forward_impl,backward_impl", [(torch.float32, "single_block", "split_row"),
                                                              (torch.bfloat16, "single_block", "single_block"),
                                                              (torch.float16, "single_block", "single_block")])
def test_auto_dispatch_at_32k_depends_on_direction(dtype, forward_impl, backward_impl):
    # An fp32 row of 32,768 holds two 128 KiB tensors in the backward: split-row there, single-block forward.
    assert plan_softmax(8192, 32768, dtype, "auto", True).impl == forward_impl
    assert plan_softmax(8192, 32768, dtype, "auto", True, "backward").impl == backward_impl
    assert plan_softmax(8192, 16384, dtype, "auto", True, "backward").impl == "single_block"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_row_gives_way_to_online_past_max_splits(dtype):
    block_n = plan_softmax(1, 40000, dtype, "auto", True).block_n
    assert choose_impl(MAX_SPLITS * block_n, dtype, True) == "split_row"
    assert choose_impl(MAX_SPLITS * block_n + 1, dtype, True) == "online"
    plan = plan_softmax(3, MAX_SPLITS * block_n, dtype, "auto", True)
    assert (plan.splits, plan.grid) == (MAX_SPLITS, 3 * MAX_SPLITS)


def test_interpreter_never_plans_split_row(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_impl(100000, torch.float32) == "online"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert choose_impl(100000, torch.float32) == "split_row"


def test_auto_dispatch_reaches_both_kernels_through_the_public_api(device, gen, monkeypatch):
    # Lower the threshold so the long-row branch is reachable on a short row, and record which plan ran.
    monkeypatch.setitem(AUTO_SINGLE_BLOCK_MAX_N["forward"], torch.float32, 64)
    monkeypatch.setattr(softmax_module, "_ROUTES", {})  # plans made before the threshold moved are gone
    seen = []
    real = softmax_module._fwd_launch
    monkeypatch.setattr(softmax_module, "_fwd_launch",
                        lambda x, y, plan, workspace: seen.append(plan.impl) or real(x, y, plan, workspace))
    y_short = softmax(_draw((2, 64), torch.float32, device, gen))
    x_long = _draw((2, 65), torch.float32, device, gen)
    y_long = softmax(x_long)
    assert seen == ["single_block", choose_impl(65, torch.float32)] and seen[1] != "single_block"
    _assert_close_to_float64(y_long, x_long)
    assert y_short.shape == (2, 64)


ONE_WARP_IN_FP32 = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 2}  # warps, rows of <= 128 lanes


@pytest.mark.parametrize(
    "n,block_n,tail_n,warps,rows",
    [(1, 16, 0, ONE_WARP_IN_FP32, 64), (16, 16, 0, ONE_WARP_IN_FP32, 64), (17, 32, 0, ONE_WARP_IN_FP32, 32),
     (128, 128, 0, ONE_WARP_IN_FP32, 8), (129, 256, 0, 2, 4), (512, 512, 0, 2, 2), (1024, 1024, 0, 2, 1),
     (2048, 2048, 0, 4, 1), (2049, 4096, 0, 8, 1), (4096, 4096, 0, 8, 1), (4097, 4096, 16, 4, 1),
     (4224, 4096, 128, 4, 1), (4352, 4096, 256, 4, 1), (4608, 4096, 512, 4, 1), (4609, 8192, 0, 16, 1),
     (8320, 8192, 128, 8, 1), (8321, 16384, 0, 16, 1), (8448, 16384, 0, 16, 1), (9216, 16384, 0, 16, 1),
     (16384, 16384, 0, 16, 1), (16385, 16384, 16, 16, 1), (17408, 16384, 1024, 16, 1), (17409, 32768, 0, 32, 1),
     (20000, 32768, 0, 32, 1)],
)
def test_single_block_settings_table(n, block_n, tail_n, warps, rows):
    # Every dtype in both directions, except the forward of 2-byte rows past 2048 (halved warps and wide
    # tails, below).
    for dtype in DTYPES:
        expected_warps = warps[dtype] if isinstance(warps, dict) else warps
        for direction in ("forward", "backward") if n <= 512 else ("forward",):
            if direction == "forward" and dtype != torch.float32 and n > 2048:
                continue
            plan = plan_softmax(1000, n, dtype, "single_block", direction=direction)
            assert (plan.block_n, plan.tail_n, plan.num_warps, plan.rows_per_program) == (
                block_n, tail_n, expected_warps, rows)
            assert plan.grid == -(-1000 // rows)


@pytest.mark.parametrize(
    "n,block_n,tail_n,warps",
    [(2049, 4096, 0, 4), (3072, 4096, 0, 4), (3073, 4096, 0, 8), (4096, 4096, 0, 8), (4097, 4096, 16, 4),
     (4608, 4096, 512, 4), (4609, 4096, 1024, 4), (5120, 4096, 1024, 4), (5121, 8192, 0, 8), (6144, 8192, 0, 8),
     (6145, 8192, 0, 16), (8192, 8192, 0, 16), (8320, 8192, 128, 8), (8321, 8192, 256, 16), (9216, 8192, 1024, 16),
     (10240, 8192, 2048, 16),
     (10241, 16384, 0, 16), (16385, 16384, 16, 16), (17408, 16384, 1024, 16), (17409, 16384, 2048, 16),
     (20480, 16384, 4096, 16), (20481, 32768, 0, 32)],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_two_byte_forward_takes_wide_tails_and_halves_warps(dtype, n, block_n, tail_n, warps):
    # One row a program (sms=0); the persistent grid's lanes are tests/test_softmax_pipelined.py's. One padded
    # block of 4096 or 8192 lanes that the row fills at most three quarters of runs on half fp32's warps.
    plan = plan_softmax(1000, n, dtype, "single_block", sms=0)
    assert (plan.block_n, plan.tail_n, plan.num_warps) == (block_n, tail_n, warps)
    if n > 8192:  # the backward keeps fp32's tails past 8192 lanes
        backward = plan_softmax(1000, n, dtype, "single_block", direction="backward")
        assert backward.tail_n <= {8192: 128}.get(backward.block_n, backward.block_n // 16)


@pytest.mark.parametrize("n,block_n,tail_n", [(4100, 4096, 16), (4608, 4096, 512), (4609, 4096, 1024),
                                              (4610, 4096, 1024), (5120, 4096, 1024), (5121, 8192, 0),
                                              (8200, 8192, 16), (8400, 16384, 0)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_two_byte_backward_takes_a_wide_tail_on_a_4096_head(dtype, n, block_n, tail_n):
    plan = plan_softmax(1000, n, dtype, "single_block", direction="backward")
    if dtype == torch.float32 and tail_n > 512:  # fp32 keeps the narrow tails
        block_n, tail_n = 8192, 0
    assert (plan.block_n, plan.tail_n, plan.stages) == (block_n, tail_n, 1)
    reloads = block_n == 16384 and dtype != torch.float32  # one 16,384 block: test_two_byte_backward_reloads...
    assert plan.num_warps == ({4096: 4, 8192: 8}[block_n] if tail_n else 8 if reloads else 16)


@pytest.mark.parametrize("n,warps", [(8400, 8), (9001, 8), (9512, 8), (10922, 8), (10923, 32), (12000, 32),
                                     (16384, 32)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_two_byte_backward_reloads_one_16384_block(dtype, n, warps):
    """2-byte backward rows held as one 16,384-lane block load y and dy again for dx: on 8 warps up to two
    thirds of the block, 32 above. fp32 rows, forward rows, rows with a tail and other blocks hold theirs."""
    plan = plan_softmax(1000, n, dtype, "single_block", direction="backward")
    assert (plan.block_n, plan.tail_n, plan.rows_per_program) == (16384, 0, 1)
    if dtype == torch.float32:
        assert not plan.reload and plan.num_warps == 16
    else:
        assert plan.reload and plan.num_warps == warps
    assert not plan_softmax(1000, n, dtype, "single_block", direction="forward").reload
    for other in (8192, 8200, 16385, 20000, 40000):
        assert not plan_softmax(1000, other, dtype, "single_block", direction="backward").reload


@pytest.mark.parametrize("n", list(range(1, 70000, 997)) + [2**k + d for k in range(4, 17) for d in (-1, 0, 1)])
@pytest.mark.parametrize("wide", [(), (8192, 16384), (4096,)], ids=str)
def test_single_block_lanes_cover_the_row(n, wide):
    head, tail = single_block_lanes(n, wide)
    padded = max(16, triton.next_power_of_2(n))
    assert head & (head - 1) == 0 and head + tail >= n  # a power-of-two head; the lanes hold the row
    if tail:
        limit = head // 4 if head in wide else {4096: 512, 8192: 128}.get(head, head // 16)
        assert tail & (tail - 1) == 0 and 16 <= tail <= limit
        assert head < n and n >= 4096
        assert head + tail < padded  # a tail is only taken when it saves lanes
    else:
        assert head == padded


@pytest.mark.parametrize("n,forward_warps,backward_warps", [(512, 2, 2), (513, 2, 1), (640, 2, 1), (1024, 2, 1),
                                                            (1025, 4, 4), (16384, 16, 16), (20000, 32, 16),
                                                            (32768, 32, 16), (40000, 32, 32)])
def test_backward_settings_differ_where_measured(n, forward_warps, backward_warps):
    assert plan_softmax(64, n, torch.float32, "single_block").num_warps == forward_warps
    assert plan_softmax(64, n, torch.float32, "single_block", direction="backward").num_warps == backward_warps
    fwd = plan_softmax(64, 100000, torch.bfloat16, "auto", True)
    bwd = plan_softmax(64, 100000, torch.bfloat16, "auto", True, direction="backward")
    assert (fwd.impl, bwd.impl, fwd.splits, bwd.splits) == ("split_row", "split_row", 13, 13)
    with pytest.raises(ValueError, match="direction"):
        plan_softmax(64, n, torch.float32, direction="sideways")


@pytest.mark.parametrize("n,rows", [(100, 8), (256, 4), (512, 2), (1024, 1), (2048, 1)])
def test_short_rows_share_a_program_up_to_1024_lanes(n, rows):
    for dtype in DTYPES:
        for direction in ("forward", "backward"):
            plan = plan_softmax(100, n, dtype, "single_block", direction=direction)
            assert plan.rows_per_program == rows and plan.grid == -(-100 // rows)


@pytest.mark.parametrize("dtype,n,block_n", [(torch.float32, 100, 128), (torch.float32, 10**6, 4096),
                                            (torch.bfloat16, 10**6, 8192), (torch.float16, 5000, 8192)])
def test_online_tile_width(dtype, n, block_n):
    plan = plan_softmax(3, n, dtype, "online")
    assert plan == SoftmaxPlan("online", block_n, 1, 8, 3)


def test_kernels_package_is_this_repository():
    # PyPI has an unrelated package called `kernels`: the import must resolve to this checkout.
    from pathlib import Path

    assert Path(kernels.__file__).resolve().parent == Path(__file__).resolve().parents[1] / "kernels"


# ---------------------------------------------------------------------------------------------------------
# Split-row (GPU only: its programs wait for each other, the interpreter runs one program at a time)
# ---------------------------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="split-row programs wait on each other; Triton's interpreter runs one program at a time",
)


@needs_gpu
@pytest.mark.parametrize("n", [32769, 70000, 262144])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_row_forward_and_backward(dtype, n, device, gen):
    m = 7
    x = _draw((m, n), dtype, device, gen)
    plan = plan_softmax(m, n, dtype, "auto", allow_split_row=True)
    assert plan.impl == "split_row"
    y = softmax_fwd(x, plan, out=torch.full_like(x, float("nan")))
    _assert_close_to_float64(y, x)
    dy = _draw((m, n), dtype, device, gen, scale=1.0)
    dx = softmax_bwd(y, dy, plan, out=torch.full_like(x, float("nan")))
    assert not torch.isnan(dx).any()
    assert rel_err(dx, reference.softmax_backward(y.double(), dy.double())) <= BOUNDS[dtype][2]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_row_special_values(dtype, device):
    n = 3 * plan_softmax(1, 40000, dtype, "auto", True).block_n + 5
    x = torch.full((len(SPECIAL_ROWS) + 1, n), -INF)
    x[:-1, :4] = torch.tensor(SPECIAL_ROWS)
    x[:-1, -4:] = torch.tensor(SPECIAL_ROWS)
    x[-1, -1] = -1e30 if dtype != torch.float16 else -60000.0  # slices of only -inf beside a very negative max
    x = x.to(dtype).to(device)
    y = softmax_fwd(x, plan_softmax(x.shape[0], n, dtype, "auto", True)).float().cpu()
    expected = torch.softmax(x.float().cpu(), -1)
    assert torch.equal(torch.isnan(y), torch.isnan(expected))
    finite = ~torch.isnan(expected)
    torch.testing.assert_close(y[finite], expected[finite], rtol=BOUNDS[dtype][0], atol=0)


@needs_gpu
def test_split_row_through_autograd(device, gen):
    x = _draw((3, 100000), torch.bfloat16, device, gen).requires_grad_()
    dy = _draw((3, 100000), torch.bfloat16, device, gen, scale=1.0)
    softmax(x).backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    assert rel_err(x.grad, x64.grad) <= BOUNDS[torch.bfloat16][2]
