"""kernels.add_rmsnorm (residual add + RMSNorm, forward and backward) and the two experiments that time it,
against float64 references.

Bounds: norm-wise ‖out − ref‖ / ‖ref‖ against float64, one row per dtype (why these numbers):
* h = x + r is rounded once to the storage dtype; y once at the store (computed in fp32 from h as stored, so
  h's rounding reaches y too); dx once at the store; dgamma after an fp32 sum over the rows. Unit roundoff:
  fp16 2^-11, bf16 2^-8. Triton 3.6's interpreter truncates fp32 -> bf16 where the GPU rounds to nearest, a
  biased error about twice as large, hence 1.6e-2 for bf16. fp32 has no rounding to storage; its bound is the
  fp32 sums over a row.
Every error must also stay within TORCH_FACTOR of torch's own error in the same dtype (or, if larger, of the
float64 result merely stored in that dtype, truncated for bf16 under the interpreter). A dropped gamma, a
missing dh, a wrong rstd or an unwritten row exceed these bounds by an order of magnitude or more.
"""

from __future__ import annotations

import importlib
import weakref
from pathlib import Path

import pytest
import torch

import kernels
from accuracy import reference_error, rel_err
from kernels import reference_fusions as ref
from kernels.add_rmsnorm import (
    BWD_LOAD_STAGES,
    BWD_PREFETCH_SMEM_BYTES,
    BWD_PROGRAMS_PER_SM,
    INTERPRETER_SM_COUNT,
    MAX_H,
    AddRmsNormPlan,
    add_rmsnorm,
    add_rmsnorm_bwd,
    add_rmsnorm_fwd,
    plan_add_rmsnorm,
    sm_count,
)

ar_module = importlib.import_module("kernels.add_rmsnorm")  # `kernels.add_rmsnorm` the attribute is the function

#               h       y       dx      dgamma
BOUNDS = {
    torch.float32: (1e-6, 1e-6, 1e-6, 1e-6),
    torch.float16: (2e-3, 2e-3, 2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2, 1.6e-2, 1.6e-2),
}
TORCH_FACTOR = 4.0
DTYPES = list(BOUNDS)
EPS = 1e-6
# (M, H): one row; a few rows of an odd H (masked lanes); a power of two; more rows than backward programs
# under the interpreter (INTERPRETER_SM_COUNT * BWD_PROGRAMS_PER_SM), so programs own runs of rows, the last
# run shorter; a long non-power-of-two row.
SHAPES = [(1, 16), (3, 100), (4, 256), (11, 64), (2, 1000)]


def _draw(shape, dtype, device, gen, scale=1.0, offset=0.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype).to(device)


def _operands(m, h, dtype, device, gen):
    x = _draw((m, h), dtype, device, gen)
    r = _draw((m, h), dtype, device, gen)
    gamma = _draw((h,), dtype, device, gen, scale=0.1, offset=1.0)
    return x, r, gamma


def _allowed(torch_result, ref64, dtype):
    return TORCH_FACTOR * reference_error(torch_result, ref64, dtype) + 1e-7


def _check_forward(h, y, x, r, gamma, eps=EPS):
    h64, y64 = ref.add_rmsnorm_float64(x, r, gamma, eps)
    torch_h, torch_y = ref.add_rmsnorm_reference(x, r, gamma, eps)
    for i, (name, out, out64, theirs) in enumerate((("h", h, h64, torch_h), ("y", y, y64, torch_y))):
        assert out.shape == out64.shape and out.dtype == x.dtype, name
        assert not torch.isnan(out).any(), f"{name}: an element is NaN (unwritten, or a wrong reduction)"
        err = rel_err(out, out64)
        assert err <= BOUNDS[x.dtype][i], f"{name}: relative error {err:.3e}"
        assert err <= _allowed(theirs, out64, x.dtype), f"{name}: {err:.3e} against torch's {rel_err(theirs, out64):.3e}"


def _grads(fn, x, r, gamma, dh, dy, cast=None):
    """Gradients of (x, r, gamma) through fn's (h, y), given dh and dy (either may be None: output unused)."""
    leaves = [(t.detach().to(cast) if cast else t.detach().clone()).requires_grad_() for t in (x, r, gamma)]
    h, y = fn(*leaves)
    outs, grads = [], []
    for out, g in ((h, dh), (y, dy)):
        if g is not None:
            outs.append(out)
            grads.append(g.to(out.dtype))
    torch.autograd.backward(outs, grads)
    return [t.grad for t in leaves]


def _check_grads(x, r, gamma, dh, dy):
    ours = _grads(lambda *a: add_rmsnorm(*a, EPS), x, r, gamma, dh, dy)
    refs = _grads(lambda *a: ref.add_rmsnorm_math(*a, EPS), x, r, gamma, dh, dy, cast=torch.float64)
    theirs = _grads(lambda *a: ref.add_rmsnorm_reference(*a, EPS), x, r, gamma, dh, dy)
    dtype = x.dtype
    for name, got, want, torch_grad, bound in (("dx", ours[0], refs[0], theirs[0], BOUNDS[dtype][2]),
                                               ("dr", ours[1], refs[1], theirs[1], BOUNDS[dtype][2]),
                                               ("dgamma", ours[2], refs[2], theirs[2], BOUNDS[dtype][3])):
        if want is None:
            assert got is None, f"{name}: no path reaches it, so no gradient"
            continue
        assert got.shape == want.shape and got.dtype == dtype, name
        assert not torch.isnan(got).any(), name
        err = rel_err(got, want)
        assert err <= bound, f"{name}: relative error {err:.3e}"
        assert err <= _allowed(torch_grad, want, dtype), f"{name}: {err:.3e} against torch's"
    return ours


# ---------------------------------------------------------------------------------------------------------
# Forward and backward against float64
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_float64(dtype, m, h, device, gen):
    x, r, gamma = _operands(m, h, dtype, device, gen)
    _check_forward(*add_rmsnorm(x, r, gamma, EPS), x, r, gamma)


@pytest.mark.parametrize("m,h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_from_both_outputs_matches_float64(dtype, m, h, device, gen):
    x, r, gamma = _operands(m, h, dtype, device, gen)
    dh, dy = _draw((m, h), dtype, device, gen), _draw((m, h), dtype, device, gen)
    dx, dr, _ = _check_grads(x, r, gamma, dh, dy)
    assert torch.equal(dx, dr), "dr = dx"


@pytest.mark.parametrize("used", ["y only", "h only"])
def test_backward_when_one_output_is_unused(used, device, gen):
    x, r, gamma = _operands(5, 64, torch.float16, device, gen)
    grad = _draw((5, 64), torch.float16, device, gen)
    dh, dy = (None, grad) if used == "y only" else (grad, None)
    dx, _, dgamma = _check_grads(x, r, gamma, dh, dy)
    if used == "h only":  # dx = dr = dh exactly, and gamma is not on any path
        assert torch.equal(dx, grad) and dgamma is None


def test_backward_formula_is_the_gradient_in_float64(gen):
    # The explicit float64 backward (used by the backward experiment) against autograd of the definition,
    # and autograd of the definition against finite differences.
    x, r, gamma = (t.double() for t in _operands(3, 12, torch.float32, "cpu", gen))
    dh, dy = torch.randn(3, 12, generator=gen, dtype=torch.float64), torch.randn(3, 12, generator=gen, dtype=torch.float64)
    dx, dgamma = ref.add_rmsnorm_backward(x + r, gamma, dy, dh, EPS)
    want = _grads(lambda *a: ref.add_rmsnorm_math(*a, EPS), x, r, gamma, dh, dy)
    assert rel_err(dx, want[0]) < 1e-12 and rel_err(dx, want[1]) < 1e-12 and rel_err(dgamma, want[2]) < 1e-12
    leaves = [t.clone().requires_grad_() for t in (x, r, gamma)]
    assert torch.autograd.gradcheck(lambda *a: ref.add_rmsnorm_math(*a, EPS), leaves)
    # torch's own norm agrees with the definition
    assert rel_err(ref.add_rmsnorm_reference(x, r, gamma, EPS)[1], ref.add_rmsnorm_math(x, r, gamma, EPS)[1]) < 1e-12


def test_same_tensor_as_x_and_residual_gets_both_gradients(device, gen):
    x, _, gamma = _operands(4, 48, torch.float32, device, gen)
    dh, dy = _draw((4, 48), torch.float32, device, gen), _draw((4, 48), torch.float32, device, gen)
    leaf = x.clone().requires_grad_()
    torch.autograd.backward(add_rmsnorm(leaf, leaf, gamma, EPS), (dh, dy))
    x64 = x.double().requires_grad_()
    torch.autograd.backward(ref.add_rmsnorm_math(x64, x64, gamma.double(), EPS), (dh.double(), dy.double()))
    assert rel_err(leaf.grad, x64.grad) <= BOUNDS[torch.float32][2]


def test_eps_is_honoured(device, gen):
    # Rows of tiny values: eps dominates the mean square, so a kernel that drops or misplaces it fails.
    x, r, gamma = _operands(5, 64, torch.float32, device, gen)
    x, r = x * 1e-4, r * 1e-4
    for eps in (1e-6, 1e-2):
        _, y = add_rmsnorm(x, r, gamma, eps)
        assert rel_err(y, ref.add_rmsnorm_float64(x, r, gamma, eps)[1]) <= BOUNDS[torch.float32][1]
    dy = _draw((5, 64), torch.float32, device, gen)
    leaves = [t.clone().requires_grad_() for t in (x, r, gamma)]
    add_rmsnorm(*leaves, 1e-2)[1].backward(dy)
    dx, dgamma = ref.add_rmsnorm_backward(x.double() + r.double(), gamma.double(), dy.double(), None, 1e-2)
    assert rel_err(leaves[0].grad, dx) <= 1e-5 and rel_err(leaves[2].grad, dgamma) <= 1e-5


def test_h_is_rounded_before_it_is_normalised(device, gen):
    # y is the norm of h as stored (what torch's x + r, then rms_norm(h), computes and what the backward sees).
    x, r, gamma = _operands(6, 128, torch.bfloat16, device, gen)
    h, y = add_rmsnorm(x, r, gamma, EPS)
    _, y_of_stored_h = ref.add_rmsnorm_math(h.double(), torch.zeros_like(h, dtype=torch.float64), gamma.double(), EPS)
    assert rel_err(y, y_of_stored_h) <= 8e-3  # the store's rounding alone (truncation under the interpreter)


# ---------------------------------------------------------------------------------------------------------
# Poisoned outputs: every element written, nothing outside
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_writes_every_element(dtype, device, gen):
    m, h = 7, 90
    x, r, gamma = _operands(m, h, dtype, device, gen)
    nan = dict(dtype=dtype, device=device)
    h_out, y_out, rstd = add_rmsnorm_fwd(
        x, r, gamma, EPS, plan_add_rmsnorm(m, h, dtype),
        h_out=torch.full((m, h), float("nan"), **nan), y_out=torch.full((m, h), float("nan"), **nan),
        rstd_out=torch.full((m,), float("nan"), device=device),
    )
    _check_forward(h_out, y_out, x, r, gamma)
    want = torch.rsqrt((x.double() + r.double()).pow(2).mean(-1) + EPS)
    assert not torch.isnan(rstd).any() and rel_err(rstd, want) <= BOUNDS[dtype][1]


@pytest.mark.parametrize("sms,grid", [(2, 2), (6, 6), (70, 70)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_writes_every_element_and_every_partial(dtype, sms, grid, device, gen):
    # 70 rows over 2, 6 or 70 programs (runs of 35, 12 with a last run of 10, or 1 row); 70 partial rows is
    # more than one BLOCK_P step of the reduction.
    m, h = 70, 40
    x, r, gamma = _operands(m, h, dtype, device, gen)
    dh, dy = _draw((m, h), dtype, device, gen), _draw((m, h), dtype, device, gen)
    h_saved, _, rstd = add_rmsnorm_fwd(x, r, gamma, EPS, plan_add_rmsnorm(m, h, dtype))
    plan = plan_add_rmsnorm(m, h, dtype, "backward", sm_count=sms)
    assert plan.grid == grid
    partials = torch.full((plan.grid, h), float("nan"), device=device)
    dx, dgamma = add_rmsnorm_bwd(
        dy, dh, h_saved, gamma, rstd, plan, dx_out=torch.full((m, h), float("nan"), dtype=dtype, device=device),
        dgamma_out=torch.full((h,), float("nan"), dtype=dtype, device=device), partials_out=partials,
    )
    assert not torch.isnan(partials).any(), "a program left its dgamma partial unwritten"
    want_dx, want_dgamma = ref.add_rmsnorm_backward(h_saved.double(), gamma.double(), dy.double(), dh.double(), EPS)
    assert not torch.isnan(dx).any() and not torch.isnan(dgamma).any()
    assert rel_err(dx, want_dx) <= BOUNDS[dtype][2]
    assert rel_err(dgamma, want_dgamma) <= BOUNDS[dtype][3]
    assert rel_err(partials.sum(0), want_dgamma) <= 1e-5


def test_launch_writes_nothing_outside_its_rows(device, gen):
    x, r, gamma = _operands(5, 24, torch.float32, device, gen)
    buf = torch.full((2, 7, 40), float("nan"), device=device)
    h_out, y_out = buf[0, 1:6, 3:27], buf[1, 1:6, 3:27]  # row stride 40, not H
    add_rmsnorm_fwd(x, r, gamma, EPS, plan_add_rmsnorm(5, 24, torch.float32), h_out=h_out, y_out=y_out)
    assert torch.isnan(buf[:, 0]).all() and torch.isnan(buf[:, 6]).all()
    assert torch.isnan(buf[:, :, :3]).all() and torch.isnan(buf[:, :, 27:]).all()
    _check_forward(h_out, y_out, x, r, gamma)


# ---------------------------------------------------------------------------------------------------------
# Shapes and layouts
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lead", [(), (2, 3), (2, 1, 3)], ids=["1-d", "batch-2-3", "batch-2-1-3"])
def test_leading_batch_dims(lead, device, gen):
    h = 32
    x, r = _draw((*lead, h), torch.bfloat16, device, gen), _draw((*lead, h), torch.bfloat16, device, gen)
    gamma = _draw((h,), torch.bfloat16, device, gen, 0.1, 1.0)
    out_h, out_y = add_rmsnorm(x, r, gamma, EPS)
    assert out_h.shape == out_y.shape == x.shape
    _check_forward(out_h.reshape(-1, h), out_y.reshape(-1, h), x.reshape(-1, h), r.reshape(-1, h), gamma)
    dh, dy = _draw((*lead, h), torch.bfloat16, device, gen), _draw((*lead, h), torch.bfloat16, device, gen)
    ours = _grads(lambda *a: add_rmsnorm(*a, EPS), x, r, gamma, dh, dy)
    refs = _grads(lambda *a: ref.add_rmsnorm_math(*a, EPS), x, r, gamma, dh, dy, cast=torch.float64)
    assert ours[0].shape == x.shape
    for got, want in zip(ours, refs):
        assert rel_err(got, want) <= BOUNDS[torch.bfloat16][2]


def _non_contiguous_cases(device, gen):
    h = 48
    x, r, gamma = _operands(6, h, torch.float16, device, gen)
    wide = _draw((6, h + 8), torch.float16, device, gen)
    yield "x column slice", wide[:, 3:3 + h], r, gamma  # row stride != H
    yield "x transposed", _draw((h, 6), torch.float16, device, gen).t(), r, gamma  # copied
    yield "r step slice", x, _draw((6, 2 * h), torch.float16, device, gen)[:, ::2], gamma  # copied
    yield "r row step", x, _draw((12, h), torch.float16, device, gen)[::2], gamma
    yield "x expanded rows", _draw((1, h), torch.float16, device, gen).expand(6, h), r, gamma  # row stride 0
    yield "gamma strided", x, r, _draw((2 * h,), torch.float16, device, gen, 0.1, 1.0)[::2]


def test_non_contiguous_inputs(device, gen):
    for name, x, r, gamma in _non_contiguous_cases(device, gen):
        try:
            _check_forward(*add_rmsnorm(x, r, gamma, EPS), x, r, gamma)
            dh, dy = _draw(x.shape, torch.float16, device, gen), _draw(x.shape, torch.float16, device, gen)
            _check_grads(x, r, gamma, dh, dy)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


def test_non_contiguous_upstream_gradients(device, gen):
    x, r, gamma = _operands(4, 32, torch.float32, device, gen)
    dh = _draw((32, 4), torch.float32, device, gen).t()
    dy = _draw((1, 32), torch.float32, device, gen).expand(4, 32)  # what y.sum().backward() hands down
    _check_grads(x, r, gamma, dh, dy)


def test_empty_inputs_return_empty_without_launch(device, gen, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("an empty input must not launch a kernel")

    monkeypatch.setattr(ar_module, "add_rmsnorm_fwd", no_launch)
    x = _draw((0, 32), torch.bfloat16, device, gen).requires_grad_()
    r = _draw((0, 32), torch.bfloat16, device, gen).requires_grad_()
    gamma = _draw((32,), torch.bfloat16, device, gen).requires_grad_()
    h, y = add_rmsnorm(x, r, gamma, EPS)
    assert h.shape == y.shape == (0, 32)
    (h.sum() + y.sum()).backward()
    for t in (x, r, gamma):
        assert t.grad.shape == t.shape and not t.grad.any()


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear errors
# ---------------------------------------------------------------------------------------------------------


def _bad_inputs(device):
    bf = {"dtype": torch.bfloat16, "device": device}
    x, r, g = torch.ones(3, 32, **bf), torch.ones(3, 32, **bf), torch.ones(32, **bf)
    yield "x int", (x.int(), r.int(), g.int()), TypeError, r"x has dtype int32; supported dtypes are float32, float16, bfloat16"
    yield "x float64", (x.double(), r.double(), g.double()), TypeError, r"supported dtypes are float32, float16, bfloat16"
    yield "residual dtype", (x, r.half(), g), TypeError, r"residual has dtype float16 but x has bfloat16"
    yield "gamma dtype", (x, r, g.float()), TypeError, r"gamma has dtype float32 but x has bfloat16"
    yield "residual shape", (x, torch.ones(3, 31, **bf), g), ValueError, r"residual must have the shape of x, \(3, 32\).*got \(3, 31\)"
    yield "residual broadcast", (x, torch.ones(32, **bf), g), ValueError, r"no broadcasting"
    yield "gamma H", (x, r, torch.ones(31, **bf)), ValueError, r"gamma must have shape \[H\] with H = 32.*got \(31,\)"
    yield "gamma 2-d", (x, r, torch.ones(1, 32, **bf)), ValueError, r"gamma must have shape \[H\]"
    yield "x 0-d", (torch.ones((), **bf), torch.ones((), **bf), g), ValueError, r"at least 1 dimension"
    yield "H = 0", (torch.ones(3, 0, **bf), torch.ones(3, 0, **bf), torch.ones(0, **bf)), ValueError, r"H = 0"
    big = MAX_H + 1
    yield "H too large", (torch.ones(1, big, **bf), torch.ones(1, big, **bf), torch.ones(big, **bf)), ValueError, \
        rf"accepts H <= {MAX_H}, got H = {big}"
    yield "x list", ([1.0, 2.0], r, g), TypeError, r"x must be a torch.Tensor, got list"
    yield "residual None", (x, None, g), TypeError, r"residual must be a torch.Tensor, got NoneType"


def test_bad_shapes_and_dtypes_raise_clear_errors(device):
    for name, args, exc, pattern in _bad_inputs(device):
        with pytest.raises(exc, match=pattern):
            add_rmsnorm(*args)


@pytest.mark.parametrize("eps,exc,pattern", [
    (-1e-6, ValueError, r"eps must be finite and >= 0, got -1e-06"),
    (float("inf"), ValueError, r"eps must be finite"),
    ("1e-6", TypeError, r"eps must be a real number, got str"),
    (True, TypeError, r"eps must be a real number, got bool"),
])
def test_bad_eps(eps, exc, pattern, device):
    x = torch.ones(2, 16, device=device)
    with pytest.raises(exc, match=pattern):
        add_rmsnorm(x, x, torch.ones(16, device=device), eps)


def test_cpu_tensor_without_interpreter_names_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.ones(2, 16)
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        add_rmsnorm(x, x, torch.ones(16))


# ---------------------------------------------------------------------------------------------------------
# The launch plan: which branch runs on each side of every threshold
# ---------------------------------------------------------------------------------------------------------


def test_plan_lanes_and_warps():
    for direction in ("forward", "backward"):
        for h, block in ((1, 16), (16, 16), (17, 32), (1000, 1024), (4096, 4096), (4097, 8192), (MAX_H, MAX_H)):
            plan = plan_add_rmsnorm(8, h, torch.float32, direction)
            assert plan.block_h == block and plan.num_warps in (4, 8, 16, 32)
        warps = [plan_add_rmsnorm(8, 2**k, torch.float32, direction).num_warps for k in range(4, 16)]
        assert warps == sorted(warps), "longer rows never get fewer warps"
    assert plan_add_rmsnorm(8, 4096, torch.float32, "forward").num_warps == 8
    assert plan_add_rmsnorm(8, 4097, torch.float32, "forward").num_warps == 16
    assert plan_add_rmsnorm(8, 8192, torch.float32, "backward").num_warps == 16
    assert plan_add_rmsnorm(8, 8193, torch.float32, "backward").num_warps == 32


def test_forward_plan_is_one_program_per_row():
    assert plan_add_rmsnorm(37, 4096, torch.bfloat16) == AddRmsNormPlan("forward", 4096, 8, 37)


@pytest.mark.parametrize("m,sms,grid,rows", [
    (1, 132, 1, 1), (264, 132, 132, 2), (265, 132, 89, 3), (16384, 132, 132, 125), (10, 2, 2, 5), (3, 2, 2, 2),
])
def test_backward_grid_is_a_few_programs_per_sm_owning_runs_of_rows(m, sms, grid, rows):
    plan = plan_add_rmsnorm(m, 4096, torch.bfloat16, "backward", sm_count=sms)
    assert (plan.grid, plan.rows_per_program) == (grid, rows)
    assert plan.grid <= max(1, min(m, sms * BWD_PROGRAMS_PER_SM))
    assert (plan.grid - 1) * plan.rows_per_program < m <= plan.grid * plan.rows_per_program, "no empty program"
    assert plan.reduce_grid == 4096 // 32


def test_backward_pipelines_loads_while_a_stage_fits_shared_memory():
    def stages(h, dtype):
        return plan_add_rmsnorm(4, h, dtype, "backward").load_stages

    assert BWD_LOAD_STAGES == 3
    assert stages(4096, torch.bfloat16) == stages(8192, torch.float32) == BWD_LOAD_STAGES
    # Two rows of dy, h and dh in flight pass the budget at 16384 fp32 and 32768 bf16 (384 KiB); one fits.
    assert 3 * 16384 * 4 <= BWD_PREFETCH_SMEM_BYTES < 2 * 3 * 16384 * 4
    assert stages(16384, torch.float32) == stages(32768, torch.bfloat16) == 2
    assert stages(32768, torch.float32) == 1


def test_plan_refuses_bad_sizes_and_directions():
    with pytest.raises(ValueError, match=rf"accepts 1 <= H <= {MAX_H}, got H = {MAX_H + 1}"):
        plan_add_rmsnorm(1, MAX_H + 1, torch.float32)
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward', got 'sideways'"):
        plan_add_rmsnorm(1, 16, torch.float32, "sideways")


def test_sm_count_off_cuda_is_the_interpreter_count():
    assert sm_count(torch.device("cpu")) == INTERPRETER_SM_COUNT


def test_public_api_backward_uses_the_planned_grid(device, gen, monkeypatch):
    seen = []
    real = ar_module.add_rmsnorm_bwd

    def recording(*args, **kwargs):
        seen.append(args[5])
        return real(*args, **kwargs)

    monkeypatch.setattr(ar_module, "add_rmsnorm_bwd", recording)
    x, r, gamma = (t.requires_grad_() for t in _operands(9, 32, torch.float32, device, gen))
    add_rmsnorm(x, r, gamma, EPS)[1].sum().backward()
    (plan,) = seen
    assert plan == plan_add_rmsnorm(9, 32, torch.float32, "backward", sm_count(x.device))


# ---------------------------------------------------------------------------------------------------------
# The experiments: declarations, byte models, retained graphs, and the profiles correct on a small case
# ---------------------------------------------------------------------------------------------------------


def _experiments():
    from experiments import get_experiment

    return get_experiment("add-rmsnorm-fwd"), get_experiment("add-rmsnorm-bwd")


def test_experiment_declarations():
    from experiments import _add_rmsnorm as ar
    from experiments.decisions import DECISIONS

    fwd, bwd = _experiments()
    for exp in (fwd, bwd):
        assert [p.name for p in exp.profiles] == ["triton", "torch", "torch.compile", "liger", "quack"]
        assert exp.claim.subject == "triton" and exp.claim.baselines == ("torch", "torch.compile", "liger", "quack")
        assert exp.claim.threshold == 1.0
        assert exp.dtypes == (torch.bfloat16, torch.float32) and set(exp.dtypes) <= set(exp.tolerance)
        hidden = {c["H"] for c in exp.cases}
        tokens = {c["T"] for c in exp.cases}
        assert min(hidden) == 2048 and max(hidden) == 16384 and min(tokens) == 1 and max(tokens) == 32768
        assert len(exp.cases) <= 16
        assert exp.source_file == f"experiments/{exp.slug.replace('-', '_')}.py"
        assert exp.profile("liger").requires == "liger_kernel" and exp.profile("quack").requires == "quack"
        for source in (s for p in exp.profiles for s in p.sources):
            assert (Path(kernels.__file__).parents[1] / source).is_file(), source
    assert fwd.row_inputs == ("x", "residual") and bwd.row_inputs == (), "dgamma sums every row"
    decision = next(d for d in DECISIONS if d.slug == "fused-add-rmsnorm-swiglu")
    assert {"add-rmsnorm-fwd", "add-rmsnorm-bwd"} <= set(decision.experiments)
    assert fwd.decisions == bwd.decisions == ar.DECISIONS == ("fused-add-rmsnorm-swiglu",)


def test_byte_models():
    from experiments import _add_rmsnorm as ar
    from experiments.spec import Case

    case = Case("t", {"T": 16384, "H": 4096})
    assert ar.forward_bytes(case, torch.bfloat16) == (4 * 16384 * 4096 + 4096) * 2
    assert ar.backward_bytes(case, torch.float32) == (4 * 16384 * 4096 + 2 * 4096) * 4
    # The module docstring's figure: 264 programs' partials, written and read, against the backward's bytes.
    assert 2 * 264 * 4096 * 4 / ar.backward_bytes(case, torch.bfloat16) == pytest.approx(0.016, abs=0.001)


def test_make_inputs_are_deterministic_and_shaped():
    from experiments import _add_rmsnorm as ar
    from experiments.spec import Case

    case = Case("t", {"T": 3, "H": 40})
    a = ar.backward_inputs(case, torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    b = ar.backward_inputs(case, torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    assert {k: tuple(v.shape) for k, v in a.items()} == {"x": (3, 40), "residual": (3, 40), "gamma": (40,),
                                                          "dh": (3, 40), "dy": (3, 40)}
    assert all(a[k].dtype == torch.bfloat16 and torch.equal(a[k], b[k]) for k in a)
    assert (a["gamma"].float() - 1).abs().max() > 0.05  # far enough from ones to catch a dropped gamma


@pytest.mark.parametrize("profile", ["triton", "torch"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_experiment_profiles_pass_their_accuracy_check(profile, direction, device):
    from experiments.spec import Case
    from lab.measure.inputs import RowSelection, relative_error

    exp = _experiments()[direction == "backward"]
    case = Case("small", {"T": 9, "H": 72})
    inputs = exp.make_inputs(case, torch.bfloat16, device, torch.Generator().manual_seed(7))
    out = exp.profile(profile).run(**inputs)
    want = tuple(t.double() for t in exp.reference(**inputs))
    error, why = relative_error(out, want, RowSelection(None))
    assert why is None and error <= exp.tolerance[torch.bfloat16], (error, why)
    # The same check fails for a wrong dgamma (backward) or a wrong y (forward), so it can fail.
    broken = list(out)
    broken[-1] = broken[-1] * 1.1
    assert relative_error(tuple(broken), want, RowSelection(None))[0] > exp.tolerance[torch.bfloat16]
    plan = exp.profile(profile).plan
    if plan is not None:
        assert plan(case, torch.bfloat16)["direction"] == direction


def test_backward_profiles_build_their_graph_once_and_drop_it_with_the_inputs(device):
    import gc

    from experiments._backward import retained_backward
    from experiments.spec import Case
    from lab.measure.eager import input_copies

    calls = []

    def counted(x, residual, gamma):
        calls.append(1)
        return add_rmsnorm(x, residual, gamma, EPS)

    run = retained_backward(counted, ("x", "residual", "gamma"), ("dh", "dy"))
    _, bwd = _experiments()
    inputs = bwd.make_inputs(Case("s", {"T": 4, "H": 32}), torch.float32, device, torch.Generator().manual_seed(3))
    first = run(**inputs)
    second = run(**inputs)
    assert len(calls) == 1, "the forward runs once per set of inputs"
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    # The eager-call clock's copies of the inputs reuse the graph, each with its own upstream gradients.
    copies = input_copies(inputs, 4)
    for copy in copies[1:]:
        copy["dy"].mul_(-2.0)
        dx, dr, dgamma = run(**copy)
        want_dx, want_dgamma = ref.add_rmsnorm_backward_float64(inputs["x"], inputs["residual"], inputs["gamma"],
                                                                copy["dy"], copy["dh"], EPS)
        assert rel_err(dx, want_dx) < 1e-5 and rel_err(dgamma, want_dgamma) < 1e-5
    assert len(calls) == 1, "no forward inside a batch of copies"
    # Another shape is another point: a new graph.
    other = bwd.make_inputs(Case("s", {"T": 3, "H": 32}), torch.float32, device, torch.Generator().manual_seed(4))
    run(**other)
    assert len(calls) == 2
    closure = dict(zip(run.__code__.co_freevars, (c.cell_contents for c in run.__closure__)))
    graph_output = weakref.ref(closure["slot"]["outputs"][0])
    del inputs, copies, other, first, second
    gc.collect()
    assert graph_output() is None and not closure["slot"], "the graph is dropped with its inputs"


def test_kernels_package_exports_add_rmsnorm():
    assert kernels.add_rmsnorm is add_rmsnorm
    assert Path(kernels.__file__).resolve().parent == Path(__file__).resolve().parents[1] / "kernels"


# ---------------------------------------------------------------------------------------------------------
# The write-up's counts follow from the byte models
# ---------------------------------------------------------------------------------------------------------

POST = Path(__file__).resolve().parents[1] / "docs" / "posts" / "kernel-fusion.md"


def post_rows(prefix: str) -> list[list[str]]:
    """Cells of the kernel-fusion post's table rows whose first cell starts with `prefix`."""
    rows = []
    for line in POST.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(prefix):
            rows.append(cells)
    return rows


def test_post_counts_follow_the_byte_models():
    from experiments import _add_rmsnorm as ar
    from experiments.spec import Case

    units = {"add + RMSNorm, forward": ("$5TH$", "$4TH$", "20%"), "add + RMSNorm, backward": ("$6TH$", "$4TH$", "33%")}
    counted = {cells[0]: tuple(cells[1:]) for cells in post_rows("add + RMSNorm") if not cells[-1].endswith("MB")}
    assert counted == units
    case = Case("t", {"T": 16384, "H": 4096})
    t, h = 16384, 4096
    want = {  # the unfused path moves one more T x H tensor forward, two more backward
        "add + RMSNorm, forward": ((5 * t * h + h) * 2, ar.forward_bytes(case, torch.bfloat16)),
        "add + RMSNorm, backward": ((6 * t * h + 2 * h) * 2, ar.backward_bytes(case, torch.bfloat16)),
    }
    found = {cells[0]: cells for cells in post_rows("add + RMSNorm") if cells[-1].endswith("MB")}
    assert set(found) == set(want)
    for name, (unfused, fused) in want.items():
        assert found[name][1] == "$T = 16384,\\ H = 4096$"
        assert found[name][2:] == [f"{unfused / 1e6:.1f} MB", f"{fused / 1e6:.1f} MB"], name


# ---------------------------------------------------------------------------------------------------------
# Inference routes: reused only for their layout, never in place of a check or of autograd
# ---------------------------------------------------------------------------------------------------------


def test_inference_routes_follow_the_layout_and_keep_the_checks(device, gen):
    ar = importlib.import_module("kernels.add_rmsnorm")
    ar._ROUTES.clear()
    base = torch.randn(2 * 3 * 64 + 4, generator=gen).to(device)
    r = torch.randn(3, 64, generator=gen).to(device)
    g = 1 + 0.1 * torch.randn(64, generator=gen).to(device)
    x = base[:3 * 64].view(3, 64)
    for _ in range(2):
        h, y = add_rmsnorm(x, r, g, 1e-6)
    assert len(ar._ROUTES) == 1
    shifted = base[1:1 + 3 * 64].view(3, 64)  # 4 bytes off: another alignment, another route
    add_rmsnorm(shifted, r, g, 1e-6)
    add_rmsnorm(x, r, g, 1e-5)  # another eps
    assert len(ar._ROUTES) == 3
    for xi, eps in ((x, 1e-6), (shifted, 1e-6), (x, 1e-5)):
        h, y = add_rmsnorm(xi, r, g, eps)
        expected = (xi.double() + r.double())
        assert rel_err(h, expected) <= 1e-6
        rms = expected.pow(2).mean(-1, keepdim=True).add(eps).rsqrt()
        assert rel_err(y, expected * rms * g.double()) <= 1e-5
    with pytest.raises(ValueError, match="eps must be finite"):  # a bad value after a cached call: still refused
        add_rmsnorm(x, r, g, float("nan"))
    with pytest.raises(ValueError, match="residual must have the shape of x"):
        add_rmsnorm(x, r[:2], g, 1e-6)
    xg = x.clone().requires_grad_(True)  # a gradient wanted: autograd's path, not the route
    h, y = add_rmsnorm(xg, r, g, 1e-6)
    assert h.grad_fn is not None and y.grad_fn is not None
