"""kernels.swiglu (silu(a) * b in two layouts, forward and backward) and the two experiments that time it,
against float64 references.

Bounds: norm-wise ‖out − ref‖ / ‖ref‖ against float64, one row per dtype (why these numbers): the math runs
in fp32 and each output is rounded once to the storage dtype (unit roundoff: fp16 2^-11, bf16 2^-8; Triton
3.6's interpreter truncates fp32 -> bf16, a biased error about twice as large, hence 1.6e-2). fp32 outputs
carry only the fp32 sigmoid's error. Every error must also stay within TORCH_FACTOR of torch's own (F.silu
rounds silu(a) before the product, so torch's error in 16-bit dtypes is the larger). A swapped gate and up, a
wrong sigmoid derivative or an unwritten block exceed these bounds by orders of magnitude.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import triton

import kernels
from accuracy import reference_error, rel_err
from kernels import reference_fusions as ref
from kernels.swiglu import (
    BLOCK_SETTINGS,
    MAX_ROW_PADDING,
    MIN_BLOCK,
    SwigluPlan,
    plan_swiglu,
    swiglu,
    swiglu_bwd,
    swiglu_fwd,
    swiglu_packed,
)

sw_module = importlib.import_module("kernels.swiglu")  # `kernels.swiglu` the attribute is the function

#               c       da      db
BOUNDS = {
    torch.float32: (1e-6, 1e-6, 1e-6),
    torch.float16: (2e-3, 2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2, 1.6e-2),
}
TORCH_FACTOR = 4.0
DTYPES = list(BOUNDS)
# A single element; an odd count; rows of an odd width; batch dimensions; two full 4096-element blocks and
# an odd tail of a flat launch.
SHAPES = [(1,), (7,), (3, 33), (2, 3, 40), (8195,)]


def _draw(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)


def _operands(shape, dtype, device, gen):
    return _draw(shape, dtype, device, gen, 2.0), _draw(shape, dtype, device, gen)  # gate wide: both sigmoid tails


def _allowed(torch_result, ref64, dtype):
    return TORCH_FACTOR * reference_error(torch_result, ref64, dtype) + 1e-7


def _check(name, got, want, torch_result, dtype, bound):
    assert got.shape == want.shape and got.dtype == dtype, name
    assert not torch.isnan(got).any(), f"{name}: an element is NaN (unwritten)"
    err = rel_err(got, want)
    assert err <= bound, f"{name}: relative error {err:.3e}"
    assert err <= _allowed(torch_result, want, dtype), f"{name}: {err:.3e} against torch's {rel_err(torch_result, want):.3e}"


def _torch_grads(a, b, dc):
    a_, b_ = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref.swiglu_reference(a_, b_).backward(dc)
    return a_.grad, b_.grad


def _check_swiglu(a, b, dc):
    dtype = a.dtype
    a_, b_ = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    c = swiglu(a_, b_)
    _check("c", c, ref.swiglu_float64(a, b), ref.swiglu_reference(a, b), dtype, BOUNDS[dtype][0])
    c.backward(dc)
    da, db = ref.swiglu_backward_float64(a, b, dc)
    torch_da, torch_db = _torch_grads(a, b, dc)
    _check("da", a_.grad, da, torch_da, dtype, BOUNDS[dtype][1])
    _check("db", b_.grad, db, torch_db, dtype, BOUNDS[dtype][2])


# ---------------------------------------------------------------------------------------------------------
# Forward and backward against float64
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_matches_float64(dtype, shape, device, gen):
    a, b = _operands(shape, dtype, device, gen)
    _check_swiglu(a, b, _draw(shape, dtype, device, gen))


@pytest.mark.parametrize("shape", [(1, 2), (3, 66), (2, 3, 80), (5, 8190)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_packed_matches_float64(dtype, shape, device, gen):
    # (5, 8190): rows of I = 4095, an odd width, so every row ends in a partial block.
    ab = _draw(shape, dtype, device, gen, 2.0)
    a, b = ref.split_packed(ab)
    leaf = ab.clone().requires_grad_()
    c = swiglu_packed(leaf)
    assert c.shape == (*shape[:-1], shape[-1] // 2)
    _check("c", c, ref.swiglu_float64(a, b), ref.swiglu_reference(a, b), dtype, BOUNDS[dtype][0])
    dc = _draw(c.shape, dtype, device, gen)
    c.backward(dc)
    da, db = ref.swiglu_backward_float64(a, b, dc)
    torch_da, torch_db = _torch_grads(a, b, dc)
    got_da, got_db = ref.split_packed(leaf.grad)
    assert leaf.grad.shape == ab.shape
    _check("da", got_da, da, torch_da, dtype, BOUNDS[dtype][1])
    _check("db", got_db, db, torch_db, dtype, BOUNDS[dtype][2])


def test_backward_formula_is_the_gradient_in_float64(gen):
    a, b = torch.randn(4, 9, generator=gen, dtype=torch.float64) * 3, torch.randn(4, 9, generator=gen, dtype=torch.float64)
    dc = torch.randn(4, 9, generator=gen, dtype=torch.float64)
    a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
    ref.swiglu_math(a_, b_).backward(dc)
    da, db = ref.swiglu_backward(a, b, dc)
    assert rel_err(da, a_.grad) < 1e-12 and rel_err(db, b_.grad) < 1e-12
    assert torch.autograd.gradcheck(ref.swiglu_math, (a.clone().requires_grad_(), b.clone().requires_grad_()))
    assert rel_err(ref.swiglu_reference(a, b), ref.swiglu_math(a, b)) < 1e-12


def test_extreme_gates_saturate_without_nan(device):
    # sigmoid's tails: silu(a) -> 0 for a -> -inf and -> a for a -> +inf; the derivative tends to 0 and 1.
    a = torch.tensor([-100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0], device=device)
    b = torch.full_like(a, 2.0)
    a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
    c = swiglu(a_, b_)
    c.backward(torch.ones_like(c))
    assert torch.isfinite(c).all() and torch.isfinite(a_.grad).all() and torch.isfinite(b_.grad).all()
    assert rel_err(c, ref.swiglu_float64(a, b)) < 1e-6
    assert rel_err(a_.grad, ref.swiglu_backward_float64(a, b, torch.ones_like(a))[0]) < 1e-6


def test_only_the_gradients_asked_for(device, gen):
    a, b = _operands((3, 20), torch.float32, device, gen)
    a_ = a.clone().requires_grad_()
    swiglu(a_, b).sum().backward()
    assert rel_err(a_.grad, ref.swiglu_backward_float64(a, b, torch.ones_like(a))[0]) <= BOUNDS[torch.float32][1]
    assert b.grad is None


# ---------------------------------------------------------------------------------------------------------
# Poisoned outputs: every element written, nothing outside
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_rows,n_cols", [(1, 9001), (3, 2500), (4, 4096)], ids=["flat-tail", "rows-partial", "rows-even"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_output_element_written(dtype, n_rows, n_cols, device, gen):
    a, b = _operands((n_rows, n_cols), dtype, device, gen)
    dc = _draw((n_rows, n_cols), dtype, device, gen)
    nan = dict(dtype=dtype, device=device)
    for direction in ("forward", "backward"):
        plan = plan_swiglu(n_rows, n_cols, direction)
        if direction == "forward":
            c = swiglu_fwd(a, b, plan, out=torch.full((n_rows, n_cols), float("nan"), **nan))
            assert not torch.isnan(c).any() and rel_err(c, ref.swiglu_float64(a, b)) <= BOUNDS[dtype][0]
        else:
            da, db = swiglu_bwd(dc, a, b, plan, torch.full_like(a, float("nan")), torch.full_like(b, float("nan")))
            want_da, want_db = ref.swiglu_backward_float64(a, b, dc)
            assert not torch.isnan(da).any() and not torch.isnan(db).any()
            assert rel_err(da, want_da) <= BOUNDS[dtype][1] and rel_err(db, want_db) <= BOUNDS[dtype][2]


def test_launch_writes_nothing_outside_its_rows(device, gen):
    a, b = _operands((5, 24), torch.float32, device, gen)
    buf = torch.full((7, 40), float("nan"), device=device)
    out = buf[1:6, 3:27]  # row stride 40, not 24
    swiglu_fwd(a, b, plan_swiglu(5, 24), out=out)
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[6]).all()
    assert torch.isnan(buf[:, :3]).all() and torch.isnan(buf[:, 27:]).all()
    assert rel_err(out, ref.swiglu_float64(a, b)) <= BOUNDS[torch.float32][0]


def test_packed_gradient_is_written_in_both_halves(device, gen, monkeypatch):
    # d(ab) is allocated uninitialised by the Function; fill the allocator's choice with NaN to catch a half
    # left unwritten.
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        return real_empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(sw_module.torch, "empty", poisoned_empty)
    ab = _draw((3, 50), torch.float32, device, gen).requires_grad_()
    c = swiglu_packed(ab)
    c.backward(torch.ones_like(c))
    assert not torch.isnan(c).any() and not torch.isnan(ab.grad).any()


# ---------------------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------------------


def _layout_cases(device, gen):
    i = 36
    ab = _draw((4, 2 * i), torch.float16, device, gen, 2.0)
    yield "views of a packed tensor", ab[:, :i], ab[:, i:]  # rows of stride 2I, no copy
    yield "a transposed", _draw((i, 4), torch.float16, device, gen, 2.0).t(), _draw((4, i), torch.float16, device, gen)
    yield "b step slice", _draw((4, i), torch.float16, device, gen, 2.0), _draw((4, 2 * i), torch.float16, device, gen)[:, ::2]
    yield "b expanded rows", _draw((4, i), torch.float16, device, gen, 2.0), _draw((1, i), torch.float16, device, gen).expand(4, i)
    yield "3-d permuted", _draw((i, 2, 3), torch.float16, device, gen, 2.0).permute(1, 2, 0), _draw((2, 3, i), torch.float16, device, gen)


def test_non_contiguous_inputs(device, gen):
    for name, a, b in _layout_cases(device, gen):
        try:
            _check_swiglu(a, b, _draw(a.shape, torch.float16, device, gen))
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


def test_views_of_a_packed_tensor_are_read_in_place(device, gen, monkeypatch):
    seen = []
    real = sw_module.swiglu_fwd

    def recording(a, b, plan, out=None):
        seen.append((a.data_ptr(), b.data_ptr(), plan))
        return real(a, b, plan, out)

    monkeypatch.setattr(sw_module, "swiglu_fwd", recording)
    ab = _draw((4, 64), torch.bfloat16, device, gen)
    swiglu(ab[:, :32], ab[:, 32:])
    ((a_ptr, b_ptr, plan),) = seen
    assert (a_ptr, b_ptr) == (ab.data_ptr(), ab[:, 32:].data_ptr()), "no copy of the halves"
    assert (plan.rows, plan.cols) == (4, 32)


def test_non_contiguous_upstream_gradient(device, gen):
    a, b = _operands((4, 30), torch.float32, device, gen)
    _check_swiglu(a, b, _draw((30, 4), torch.float32, device, gen).t())
    _check_swiglu(a, b, _draw((1, 30), torch.float32, device, gen).expand(4, 30))  # as from c.sum().backward()


def test_zero_dim_and_empty_inputs(device, gen, monkeypatch):
    a, b = torch.tensor(1.5, device=device), torch.tensor(-2.0, device=device)
    _check_swiglu(a, b, torch.tensor(0.5, device=device))

    def no_launch(*args, **kwargs):
        raise AssertionError("an empty input must not launch a kernel")

    monkeypatch.setattr(sw_module, "swiglu_fwd", no_launch)
    e = torch.empty(0, 5, device=device, requires_grad=True)
    assert swiglu(e, e).shape == (0, 5)
    assert swiglu_packed(torch.empty(2, 0, 6, device=device)).shape == (2, 0, 3)


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear errors
# ---------------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(device):
    bf = {"dtype": torch.bfloat16, "device": device}
    a = torch.ones(3, 8, **bf)
    cases = [
        ((a.int(), a.int()), TypeError, r"swiglu: a has dtype int32; supported dtypes are float32, float16, bfloat16"),
        ((a.double(), a.double()), TypeError, r"supported dtypes are float32, float16, bfloat16"),
        ((a, a.half()), TypeError, r"b has dtype float16 but a has bfloat16; a and b must share one dtype"),
        ((a, torch.ones(3, 7, **bf)), ValueError, r"same shape \(no broadcasting\), got \(3, 8\) and \(3, 7\)"),
        ((a, torch.ones(8, **bf)), ValueError, r"no broadcasting"),
        (([1.0], a), TypeError, r"a must be a torch.Tensor, got list"),
        ((a, None), TypeError, r"b must be a torch.Tensor, got NoneType"),
    ]
    for args, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            swiglu(*args)
    for ab, exc, pattern in [
        (torch.ones(3, 7, **bf), ValueError, r"ab must have shape \[\.\.\., 2I\].*got \(3, 7\)"),
        (torch.ones((), **bf), ValueError, r"ab must have shape \[\.\.\., 2I\].*got \(\)"),
        (torch.ones(3, 8, dtype=torch.int64, device=device), TypeError, r"swiglu_packed: ab has dtype int64"),
        ("ab", TypeError, r"ab must be a torch.Tensor, got str"),
    ]:
        with pytest.raises(exc, match=pattern):
            swiglu_packed(ab)


def test_cpu_tensor_without_interpreter_names_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        swiglu(torch.ones(4), torch.ones(4))
    with pytest.raises(RuntimeError, match=r"(?s)swiglu_packed.*TRITON_INTERPRET=1"):
        swiglu_packed(torch.ones(4))


# ---------------------------------------------------------------------------------------------------------
# The launch plan: which branch runs on each side of every threshold
# ---------------------------------------------------------------------------------------------------------


def _padding_ok(n_cols, block):
    return (triton.cdiv(n_cols, block) * block - n_cols) * MAX_ROW_PADDING <= n_cols


@pytest.mark.parametrize("n_cols", [1, 37, 1024, 2500, 4095, 4096, 4551, 11007, 11008, 14336, 28672, 32769])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_row_launch_takes_the_largest_block_whose_row_padding_is_small(n_cols, direction):
    largest = BLOCK_SETTINGS[direction][0]
    plan = plan_swiglu(8, n_cols, direction)
    assert MIN_BLOCK <= plan.block <= largest and plan.block == triton.next_power_of_2(plan.block)
    assert plan.block == MIN_BLOCK or _padding_ok(n_cols, plan.block), "this block pads rows too much"
    assert plan.block == largest or not _padding_ok(n_cols, 2 * plan.block), "a larger block was good enough"
    assert plan.col_blocks == triton.cdiv(n_cols, plan.block) and plan.grid == 8 * plan.col_blocks


def test_block_choices_at_common_widths():
    assert plan_swiglu(8, 14336).block == 2048  # seven whole blocks a row
    assert plan_swiglu(8, 11008).block == 2048  # padding 1280 of 11008 elements: under an eighth
    assert plan_swiglu(1, 14336).block == BLOCK_SETTINGS["forward"][0]  # one row: flat, never shrunk
    assert plan_swiglu(1, 10**6, "backward") == SwigluPlan(1, 10**6, 1024, 8, 977, 977, False)


def test_offsets_switch_to_64_bits_where_a_block_could_reach_2_to_the_31():
    block = BLOCK_SETTINGS["forward"][0]
    assert not plan_swiglu(1, 2**31 - block - 1).offset_64
    assert plan_swiglu(1, 2**31 - block).offset_64
    assert plan_swiglu(2, 100, max_offset=2**31).offset_64  # strided rows far apart
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward', got 'up'"):
        plan_swiglu(1, 10, "up")


def test_contiguous_operands_launch_flat_and_strided_ones_by_rows(device, gen, monkeypatch):
    seen = []
    real = sw_module._plan_for

    def recording(direction, *matrices):  # every forward path plans here: autograd's and the inference route
        plan = real(direction, *matrices)
        seen.append(plan)
        return plan

    monkeypatch.setattr(sw_module, "_plan_for", recording)
    sw_module._PACKED_ROUTES.clear()
    a, b = _operands((3, 5, 7), torch.float32, device, gen)
    swiglu(a, b)
    swiglu(a.transpose(0, 1), b.transpose(0, 1))  # both strided alike: rows of 7 (a copy each)
    swiglu_packed(torch.cat([a, b], -1))
    assert [(p.rows, p.cols) for p in seen] == [(1, 105), (15, 7), (15, 7)]


# ---------------------------------------------------------------------------------------------------------
# The experiments: declarations, byte models, and the profiles correct on a small case
# ---------------------------------------------------------------------------------------------------------


def _experiments():
    from experiments import get_experiment

    return get_experiment("swiglu-fwd"), get_experiment("swiglu-bwd")


def test_experiment_declarations():
    from experiments.decisions import DECISIONS

    fwd, bwd = _experiments()
    for exp in (fwd, bwd):
        assert [p.name for p in exp.profiles] == ["triton", "torch", "torch.compile", "liger"]
        assert exp.claim.subject == "triton" and exp.claim.baselines == ("torch", "torch.compile", "liger")
        assert exp.dtypes == (torch.bfloat16, torch.float32) and set(exp.dtypes) <= set(exp.tolerance)
        assert len(exp.cases) <= 16
        assert any(c["T"] * c["I"] % 2 for c in exp.cases), "an odd element count exercises the masked tail"
        assert {1, 32768} <= {c["T"] for c in exp.cases}
        assert exp.source_file == f"experiments/{exp.slug.replace('-', '_')}.py"
        assert exp.profile("liger").requires == "liger_kernel"
        for source in (s for p in exp.profiles for s in p.sources):
            assert (Path(kernels.__file__).parents[1] / source).is_file(), source
    assert fwd.row_inputs == ("a", "b") and bwd.row_inputs == ("a", "b", "dc")
    decision = next(d for d in DECISIONS if d.slug == "fused-add-rmsnorm-swiglu")
    assert {"swiglu-fwd", "swiglu-bwd"} <= set(decision.experiments)


def test_byte_models():
    from experiments import _swiglu as sw
    from experiments.spec import Case

    case = Case("t", {"T": 4096, "I": 14336})
    assert sw.forward_bytes(case, torch.bfloat16) == 3 * 4096 * 14336 * 2
    assert sw.backward_bytes(case, torch.float32) == 5 * 4096 * 14336 * 4


@pytest.mark.parametrize("profile", ["triton", "torch"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_experiment_profiles_pass_their_accuracy_check(profile, direction, device):
    from experiments.spec import Case
    from lab.measure.inputs import RowSelection, relative_error

    exp = _experiments()[direction == "backward"]
    case = Case("small", {"T": 3, "I": 37})
    inputs = exp.make_inputs(case, torch.bfloat16, device, torch.Generator().manual_seed(7))
    out = exp.profile(profile).run(**inputs)
    want = exp.reference(**inputs)
    want = tuple(t.double() for t in want) if isinstance(want, tuple) else want.double()
    error, why = relative_error(out, want, RowSelection(None))
    assert why is None and error <= exp.tolerance[torch.bfloat16], (error, why)
    plan = exp.profile(profile).plan
    if plan is not None:
        assert plan(case, torch.bfloat16) == plan_swiglu(1, 3 * 37, direction).as_dict()


def test_liger_backward_profile_differentiates_copies(device):
    # Liger's backward overwrites the a and b it saved; the profile hands it copies so the point's inputs
    # stay intact for every other profile. A stand-in with the same habit shows the copies are made.
    from experiments._backward import retained_backward

    class WritesIntoSaved(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, dc):
            a, b = ctx.saved_tensors
            da, db = dc * b, dc * a
            a.data.copy_(da)
            b.data.copy_(db)
            return a, b

    a, b, dc = torch.randn(3, 4, device=device), torch.randn(3, 4, device=device), torch.randn(3, 4, device=device)
    a0, b0 = a.clone(), b.clone()
    run = retained_backward(WritesIntoSaved.apply, ("a", "b"), ("dc",), clone_leaves=True)
    da, db = run(a=a, b=b, dc=dc)
    assert torch.equal(a, a0) and torch.equal(b, b0), "the inputs are untouched"
    assert torch.allclose(da, dc * b0) and torch.allclose(db, dc * a0)


def test_kernels_package_exports_swiglu():
    assert kernels.swiglu is swiglu and kernels.swiglu_packed is swiglu_packed


def test_post_counts_follow_the_byte_models():
    from test_add_rmsnorm import post_rows

    from experiments import _swiglu as sw
    from experiments.spec import Case

    units = {"SwiGLU, forward": ("$5TI$", "$3TI$", "40%"), "SwiGLU, backward": ("$9TI$", "$5TI$", "44%")}
    counted = {cells[0]: tuple(cells[1:]) for cells in post_rows("SwiGLU") if not cells[-1].endswith("MB")}
    assert counted == units
    case = Case("t", {"T": 4096, "I": 14336})
    n = 4096 * 14336
    want = {"SwiGLU, forward": (5 * n * 2, sw.forward_bytes(case, torch.bfloat16)),
            "SwiGLU, backward": (9 * n * 2, sw.backward_bytes(case, torch.bfloat16))}
    found = {cells[0]: cells for cells in post_rows("SwiGLU") if cells[-1].endswith("MB")}
    assert set(found) == set(want)
    for name, (unfused, fused) in want.items():
        assert found[name][2:] == [f"{unfused / 1e6:.1f} MB", f"{fused / 1e6:.1f} MB"], name


def test_packed_inference_routes_follow_the_layout_and_keep_autograd(device, gen):
    sw_module._PACKED_ROUTES.clear()
    ab = torch.randn(4, 2 * 24, generator=gen).to(device)
    first = swiglu_packed(ab)
    swiglu_packed(ab.clone())
    assert len(sw_module._PACKED_ROUTES) == 1
    swiglu_packed(ab.view(2, 2, 48))  # another shape
    swiglu_packed(torch.randn(4 * 48 + 1, generator=gen).to(device)[1:].view(4, 48))  # another alignment
    assert len(sw_module._PACKED_ROUTES) == 3
    a, b = ab[:, :24].double(), ab[:, 24:].double()
    assert rel_err(first, a * torch.sigmoid(a) * b) <= 1e-6
    with pytest.raises(ValueError, match="ab must have shape"):
        swiglu_packed(ab[:, :47])
    grad_in = ab.clone().requires_grad_(True)
    assert swiglu_packed(grad_in).grad_fn is not None


def test_inference_routes_of_two_operands_follow_the_layout(device, gen):
    sw_module._ROUTES.clear()
    a, b = _operands((3, 8), torch.float32, device, gen)
    first = swiglu(a, b)
    swiglu(a.clone(), b.clone())
    assert len(sw_module._ROUTES) == 1
    swiglu(a.view(4, 6), b.view(4, 6))  # another shape
    swiglu(a.t(), b.t())  # strided: autograd's checked path, no route
    assert len(sw_module._ROUTES) == 2
    assert rel_err(first, a.double() * torch.sigmoid(a.double()) * b.double()) <= 1e-6
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        swiglu(a, b[:2])
