"""kernels.rmsnorm_linear (the lab's fused kernel: dispatch, tiled schedules, autograd), kernels.rmsnorm_linear_seed
(the seed-style baseline) and the two experiments that time them, against float64 references. The decode
GEMV's own tests (forms, split-K, plan table, the lean call path) are in tests/test_rmsnorm_gemv.py.

Bounds: norm-wise ‖out − ref‖ / ‖ref‖ against float64, one row per dtype (why these numbers):
* forward: the tile fed to tl.dot and the output are each rounded once to the storage dtype (unit roundoff:
  fp16 2^-11, bf16 2^-8), the products accumulate in fp32. Torch's own error is about half a unit. Triton
  3.6's interpreter truncates fp32 -> bf16 where the GPU rounds to nearest, a biased error about twice as
  large, so under the interpreter bf16 gets 1.6e-2 (the experiments accept 1e-2 on the GPU). A dropped gamma
  (≈ 0.1 here), a skipped K-tile or a wrong r exceed these bounds by an order of magnitude.
* dx, dweight, dgamma: computed by torch from the saved r, rounded like torch's own autograd of the unfused
  pair; the same bounds hold with room to spare.
Every error must also stay within TORCH_FACTOR of torch's own error in the same dtype (or, if larger, of the
float64 result merely stored in that dtype, truncated for bf16 under the interpreter).
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import triton

import kernels
from accuracy import reference_error, rel_err
from kernels import reference
from kernels import _rmsnorm_linear_tiled as tiled
from kernels._gemv import counters_at_rest
from kernels._rmsnorm_linear_tiled import (
    INTERPRETER_CONFIG,
    MAX_M_BUCKET,
    MIN_M_BUCKET,
    SMEM_BYTES,
    TILED_CLASSES,
    class_configs,
    config_dict,
    config_fits,
    m_bucket,
    smem_bytes,
)
from kernels.rmsnorm_gemv import GEMV_MAX_M, rms_inv
from kernels.rmsnorm_linear import (
    DECODE_MAX_M,
    PREFILL_MIN_M,
    RMS_MODE,
    RmsNormLinearPlan,
    candidate_configs,
    plan_rmsnorm_linear,
    resolve_plan,
    rmsnorm_linear,
    rmsnorm_linear_fwd,
    shape_class,
)
from kernels.rmsnorm_linear_seed import (
    SEED_TILES,
    rmsnorm_linear_seed,
    rmsnorm_linear_seed_fwd,
)

rl_module = importlib.import_module("kernels.rmsnorm_linear")  # `kernels.rmsnorm_linear` the attribute is the function

#               forward  dx      dweight dgamma
BOUNDS = {
    torch.float16: (2e-3, 2e-3, 2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2, 1.6e-2, 1.6e-2),
}
TORCH_FACTOR = 4.0
DTYPES = list(BOUNDS)
EPS = 1e-6
# (M, K, N): one row, a few rows, rows past one 16-row tile; K a multiple of the 32-wide K-tile and not
# (40: a masked tail); N a multiple of the 16-wide N-tile and not.
SHAPES = [(1, 32, 16), (3, 40, 20), (17, 96, 48), (40, 64, 33), (2, 1, 16)]
GRAD_SHAPES = [(1, 32, 16), (3, 40, 20), (17, 96, 48)]  # K = 1 leaves dx pure cancellation for everyone


def _draw(shape, dtype, device, gen, scale=1.0, offset=0.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype).to(device)


def _operands(m, k, n, dtype, device, gen):
    x = _draw((m, k), dtype, device, gen)
    weight = _draw((n, k), dtype, device, gen, scale=1 / math.sqrt(k))
    gamma = _draw((k,), dtype, device, gen, scale=0.1, offset=1.0)
    return x, weight, gamma


def _allowed(torch_result: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    return TORCH_FACTOR * reference_error(torch_result, ref, dtype) + 1e-7


def _check_forward(y, x, weight, gamma, bound_index=0):
    ref = reference.rmsnorm_linear_float64(x, weight, gamma, EPS)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert not torch.isnan(y).any(), "an output element is NaN (unwritten, or a wrong reduction)"
    err = rel_err(y, ref)
    assert err <= BOUNDS[x.dtype][bound_index], f"relative error {err:.3e}"
    torch_y = reference.rmsnorm_linear_reference(x, weight, gamma, EPS)
    assert err <= _allowed(torch_y, ref, x.dtype), f"relative error {err:.3e} against torch's {rel_err(torch_y, ref):.3e}"


# ---------------------------------------------------------------------------------------------------------
# Forward against float64
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_float64(dtype, m, k, n, device, gen):
    x, weight, gamma = _operands(m, k, n, dtype, device, gen)
    _check_forward(rmsnorm_linear(x, weight, gamma, EPS), x, weight, gamma)


@pytest.mark.parametrize("rms", ["in-loop", "pre-pass"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_both_rms_modes_match_float64(dtype, rms, device, gen):
    x, weight, gamma = _operands(19, 72, 40, dtype, device, gen)
    plan = replace(plan_rmsnorm_linear(19, 40, 72, dtype), rms=rms)
    y, r, ran = rmsnorm_linear_fwd(x, weight, gamma, EPS, plan)
    _check_forward(y, x, weight, gamma)
    r_ref = torch.rsqrt(x.double().pow(2).mean(-1) + EPS)
    assert r.dtype == torch.float32 and rel_err(r, r_ref) < 1e-6
    assert ran.rms == rms


_TILE = {"GROUP_M": 8, "SPLIT_K": 1, "SWAP_AB": False, "num_warps": 4, "num_stages": 1}


@pytest.mark.parametrize("config", [
    {**_TILE, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1},
    {**_TILE, "BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16},
    {**_TILE, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 3},
    {**_TILE, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 5, "SWAP_AB": True},
    {**_TILE, "BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 64, "SWAP_AB": True},
], ids=["wide-k", "group-8", "split-3", "split-5-swap", "swap"])
def test_other_tile_configs(config, device, gen):
    # Grouped tile order with several row-tiles; a K-tile wider than K's 40 (every load masked); split-K
    # with ragged K ranges (40 = 16 + 16 + 8) and with more splits than K-tiles (empty splits still count in);
    # W as the first operand.
    x, weight, gamma = _operands(70, 40, 50, torch.float16, device, gen)
    plan = replace(plan_rmsnorm_linear(70, 50, 40, torch.float16), config=config, autotuned=False, candidates=1)
    y, _, ran = rmsnorm_linear_fwd(x, weight, gamma, EPS, plan)
    _check_forward(y, x, weight, gamma)
    assert ran.config == config
    if config["SPLIT_K"] > 1:  # the last program of every tile leaves its counter at zero for the next launch
        assert counters_at_rest(x.device)
        y2, _, _ = rmsnorm_linear_fwd(x, weight, gamma, EPS, plan)
        assert torch.equal(y, y2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_row_runs_the_gemv_on_the_cuda_cores(dtype, device, gen):
    # M = 1: fp32 math, r in the loop for both dtypes; ragged N and K.
    for k, n in ((32, 16), (200, 70), (1, 5)):
        x, weight, gamma = _operands(1, k, n, dtype, device, gen)
        plan = plan_rmsnorm_linear(1, n, k, dtype)
        assert (plan.shape_class, plan.rms, plan.config["form"]) == ("gemv", "in-loop", "fma")
        y, r, ran = rmsnorm_linear_fwd(x, weight, gamma, EPS, plan)
        _check_forward(y, x, weight, gamma)
        assert rel_err(r, torch.rsqrt(x.double().pow(2).mean(-1) + EPS)) < 1e-6
        assert ran == plan and not plan.autotuned


def test_eps_is_honoured(device, gen):
    # Rows of tiny values: eps dominates the mean square, so a kernel that drops or misplaces it fails.
    x, weight, gamma = _operands(5, 64, 16, torch.float16, device, gen)
    x = (x.double() * 1e-3).to(torch.float16)
    for eps in (1e-6, 1e-2):
        y = rmsnorm_linear(x, weight, gamma, eps)
        ref = reference.rmsnorm_linear_float64(x, weight, gamma, eps)
        assert rel_err(y, ref) <= BOUNDS[torch.float16][0]


@pytest.mark.parametrize("m", [5, 20], ids=["gemv-dot", "tiled"])
def test_float16_large_activations_do_not_overflow(m, device, gen):
    # |x * gamma| = 1e5 > 65504: folding gamma alone into an fp16 tile overflows; the pre-pass folds r too,
    # so the tile holds the normalised |x * r * gamma| = 50, as F.rms_norm's output would.
    signs = torch.randint(0, 2, (m, 64), generator=gen).double() * 2 - 1
    x = (2000 * signs).to(torch.float16).to(device)
    weight = _draw((16, 64), torch.float16, device, gen, scale=1 / 8)
    gamma = torch.full((64,), 50.0, dtype=torch.float16, device=device)
    y = rmsnorm_linear(x, weight, gamma, EPS)
    assert torch.isfinite(y).all()
    _check_forward(y, x, weight, gamma)
    forced = replace(plan_rmsnorm_linear(m, 16, 64, torch.float16), rms="in-loop")
    y_in_loop = rmsnorm_linear_fwd(x, weight, gamma, EPS, forced)[0]
    assert not torch.isfinite(y_in_loop).all(), "the hazard the pre-pass exists for has gone: revisit RMS_MODE"


# ---------------------------------------------------------------------------------------------------------
# Backward against float64
# ---------------------------------------------------------------------------------------------------------


def _grads_float64(x, weight, gamma, dy):
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, gamma)]
    reference.rmsnorm_linear_float64(*leaves, EPS).backward(dy.double())
    return [t.grad for t in leaves]


def _grads_torch(x, weight, gamma, dy):
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, gamma)]
    reference.rmsnorm_linear_reference(*leaves, EPS).backward(dy)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("m,k,n", GRAD_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_matches_float64(dtype, m, k, n, device, gen):
    x, weight, gamma = (t.requires_grad_() for t in _operands(m, k, n, dtype, device, gen))
    dy = _draw((m, n), dtype, device, gen)
    rmsnorm_linear(x, weight, gamma, EPS).backward(dy)
    refs = _grads_float64(x, weight, gamma, dy)
    theirs = _grads_torch(x, weight, gamma, dy)
    for i, (name, t) in enumerate((("dx", x), ("dweight", weight), ("dgamma", gamma))):
        assert t.grad.shape == t.shape and t.grad.dtype == dtype, name
        assert not torch.isnan(t.grad).any(), name
        err = rel_err(t.grad, refs[i])
        assert err <= BOUNDS[dtype][i + 1], f"{name}: relative error {err:.3e}"
        assert err <= _allowed(theirs[i], refs[i], dtype), f"{name}: {err:.3e} against torch's"


@pytest.mark.parametrize("wanted", ["x", "weight", "gamma"])
def test_backward_computes_only_what_is_needed(wanted, device, gen):
    tensors = dict(zip(("x", "weight", "gamma"), _operands(3, 32, 16, torch.float16, device, gen)))
    tensors[wanted].requires_grad_()
    dy = _draw((3, 16), torch.float16, device, gen)
    rmsnorm_linear(tensors["x"], tensors["weight"], tensors["gamma"], EPS).backward(dy)
    refs = dict(zip(("x", "weight", "gamma"), _grads_float64(tensors["x"], tensors["weight"], tensors["gamma"], dy)))
    for name, t in tensors.items():
        if name == wanted:
            assert rel_err(t.grad, refs[name]) <= BOUNDS[torch.float16][1]
        else:
            assert t.grad is None


# ---------------------------------------------------------------------------------------------------------
# Poisoned outputs: every element written, nothing outside
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rms", ["in-loop", "pre-pass"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_output_element_written(dtype, rms, device, gen):
    m, k, n = 35, 40, 37  # partial row-tile, partial column-tile, partial K-tile
    x, weight, gamma = _operands(m, k, n, dtype, device, gen)
    plan = replace(plan_rmsnorm_linear(m, n, k, dtype), rms=rms)
    y, r, _ = rmsnorm_linear_fwd(
        x, weight, gamma, EPS, plan,
        out=torch.full((m, n), float("nan"), dtype=dtype, device=device),
        r_out=torch.full((m,), float("nan"), device=device),
    )
    assert not torch.isnan(r).any()
    _check_forward(y, x, weight, gamma)


def test_launch_writes_nothing_outside_its_tile(device, gen):
    x, weight, gamma = _operands(20, 32, 24, torch.bfloat16, device, gen)
    buf = torch.full((22, 40), float("nan"), dtype=torch.bfloat16, device=device)
    out = buf[1:21, 5:29]  # row stride 40, not N
    rmsnorm_linear_fwd(x, weight, gamma, EPS, plan_rmsnorm_linear(20, 24, 32, torch.bfloat16), out=out)
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[21]).all()
    assert torch.isnan(buf[:, :5]).all() and torch.isnan(buf[:, 29:]).all()
    _check_forward(out, x, weight, gamma)


def test_seed_style_every_output_element_written(device, gen):
    x, weight, gamma = _operands(70, 40, 130, torch.float16, device, gen)  # 2 x 2 tiles of 64 x 128
    out = torch.full((70, 130), float("nan"), dtype=torch.float16, device=device)
    y = rmsnorm_linear_seed_fwd(x, weight, gamma, EPS, out=out)
    _check_forward(y, x, weight, gamma)


# ---------------------------------------------------------------------------------------------------------
# Shapes and layouts
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lead", [(), (2, 3), (2, 1, 3)], ids=["1-d", "batch-2-3", "batch-2-1-3"])
def test_leading_batch_dims(lead, device, gen):
    k, n = 32, 16
    x = _draw((*lead, k), torch.bfloat16, device, gen).requires_grad_()
    _, weight, gamma = _operands(1, k, n, torch.bfloat16, device, gen)
    y = rmsnorm_linear(x, weight, gamma, EPS)
    assert y.shape == (*lead, n)
    x_rows = x.detach().reshape(-1, k)
    _check_forward(y.reshape(-1, n), x_rows, weight, gamma)
    dy = _draw((*lead, n), torch.bfloat16, device, gen)
    y.backward(dy)
    ref = _grads_float64(x_rows, weight, gamma, dy.reshape(-1, n))[0]
    assert x.grad.shape == x.shape
    assert rel_err(x.grad.reshape(-1, k), ref) <= BOUNDS[torch.bfloat16][1]


def _non_contiguous_cases(device, gen):
    k, n = 32, 16
    x, weight, gamma = _operands(6, k, n, torch.float16, device, gen)
    wide = _draw((6, k + 8), torch.float16, device, gen)
    yield "x column slice", wide[:, 3:3 + k], weight, gamma  # row stride != K
    yield "x transposed", _draw((k, 6), torch.float16, device, gen).t(), weight, gamma  # copied
    yield "x step slice", _draw((6, 2 * k), torch.float16, device, gen)[:, ::2], weight, gamma  # copied
    yield "x row step", _draw((12, k), torch.float16, device, gen)[::2], weight, gamma
    yield "x expanded rows", _draw((1, k), torch.float16, device, gen).expand(5, k), weight, gamma  # row stride 0
    yield "x 3-d permuted", _draw((k, 2, 3), torch.float16, device, gen).permute(1, 2, 0), weight, gamma
    yield "weight row slice", x, _draw((n, k + 8), torch.float16, device, gen, 0.2)[:, 4:4 + k], gamma
    yield "weight transposed", x, _draw((k, n), torch.float16, device, gen, 0.2).t(), gamma
    yield "gamma strided", x, weight, _draw((2 * k,), torch.float16, device, gen, 0.1, 1.0)[::2]


def test_non_contiguous_inputs(device, gen):
    for name, x, weight, gamma in _non_contiguous_cases(device, gen):
        y = rmsnorm_linear(x, weight, gamma, EPS)
        try:
            _check_forward(y.reshape(-1, weight.shape[0]), x.reshape(-1, x.shape[-1]), weight, gamma)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


def test_non_contiguous_upstream_gradient(device, gen):
    x, weight, gamma = (t.requires_grad_() for t in _operands(4, 32, 16, torch.float16, device, gen))
    dy = _draw((16, 4), torch.float16, device, gen).t()
    rmsnorm_linear(x, weight, gamma, EPS).backward(dy)
    refs = _grads_float64(x, weight, gamma, dy)
    for t, ref in zip((x, weight, gamma), refs):
        assert rel_err(t.grad, ref) <= BOUNDS[torch.float16][1]


@pytest.mark.parametrize("x_shape,n", [((0, 32), 16), ((2, 0, 32), 16), ((3, 32), 0)])
def test_empty_inputs_return_empty_without_launch(x_shape, n, device, gen, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("an empty output must not launch a kernel")

    monkeypatch.setattr(rl_module, "_launch_gemv", no_launch)
    monkeypatch.setattr(tiled, "rmsnorm_linear_tiled_fwd", no_launch)
    x = _draw(x_shape, torch.bfloat16, device, gen).requires_grad_()
    weight = _draw((n, 32), torch.bfloat16, device, gen).requires_grad_()
    gamma = _draw((32,), torch.bfloat16, device, gen).requires_grad_()
    y = rmsnorm_linear(x, weight, gamma, EPS)
    assert y.shape == (*x_shape[:-1], n) and y.dtype == torch.bfloat16
    y.sum().backward()
    for t in (x, weight, gamma):
        assert t.grad.shape == t.shape and not t.grad.any()
    assert rmsnorm_linear_seed(x.detach(), weight.detach(), gamma.detach()).shape == y.shape


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear errors
# ---------------------------------------------------------------------------------------------------------


def _bad_inputs(device):
    bf = {"dtype": torch.bfloat16, "device": device}
    x, w, g = torch.ones(3, 32, **bf), torch.ones(16, 32, **bf), torch.ones(32, **bf)
    yield "x float32", (x.float(), w.float(), g.float()), TypeError, r"x has dtype float32; supported dtypes are float16, bfloat16"
    yield "x int", (x.int(), w, g), TypeError, r"supported dtypes are float16, bfloat16"
    yield "weight dtype", (x, w.half(), g), TypeError, r"weight has dtype float16 but x has bfloat16"
    yield "gamma dtype", (x, w, g.float()), TypeError, r"gamma has dtype float32 but x has bfloat16"
    yield "weight K", (x, torch.ones(16, 33, **bf), g), ValueError, r"weight must have shape \[N, K\] with K = 32.*got \(16, 33\)"
    yield "weight 1-d", (x, torch.ones(32, **bf), g), ValueError, r"weight must have shape \[N, K\]"
    yield "gamma K", (x, w, torch.ones(31, **bf)), ValueError, r"gamma must have shape \[K\] with K = 32.*got \(31,\)"
    yield "gamma 2-d", (x, w, torch.ones(1, 32, **bf)), ValueError, r"gamma must have shape \[K\]"
    yield "x 0-d", (torch.ones((), **bf), w, g), ValueError, r"at least 1 dimension"
    yield "K = 0", (torch.ones(3, 0, **bf), torch.ones(16, 0, **bf), torch.ones(0, **bf)), ValueError, r"K = 0"
    yield "x list", ([1.0, 2.0], w, g), TypeError, r"x must be a torch.Tensor, got list"


@pytest.mark.parametrize("fn", [rmsnorm_linear, rmsnorm_linear_seed], ids=["fused", "seed-style"])
def test_bad_shapes_and_dtypes_raise_clear_errors(fn, device):
    for name, args, exc, pattern in _bad_inputs(device):
        with pytest.raises(exc, match=pattern):
            fn(*args)


@pytest.mark.parametrize("eps,exc,pattern", [
    (-1e-6, ValueError, r"eps must be finite and >= 0, got -1e-06"),
    (float("nan"), ValueError, r"eps must be finite"),
    ("1e-6", TypeError, r"eps must be a real number, got str"),
    (True, TypeError, r"eps must be a real number, got bool"),
])
def test_bad_eps(eps, exc, pattern, device):
    x, w, g = torch.ones(2, 32, dtype=torch.float16), torch.ones(16, 32, dtype=torch.float16), torch.ones(32, dtype=torch.float16)
    with pytest.raises(exc, match=pattern):
        rmsnorm_linear(x.to(device), w.to(device), g.to(device), eps)


def test_cpu_tensor_without_interpreter_names_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, g = torch.ones(2, 32, dtype=torch.float16), torch.ones(16, 32, dtype=torch.float16), torch.ones(32, dtype=torch.float16)
    for fn in (rmsnorm_linear, rmsnorm_linear_seed):
        with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
            fn(x, w, g)


def test_plan_refuses_unsupported_dtype():
    with pytest.raises(TypeError, match="float32 is not supported; use float16, bfloat16"):
        plan_rmsnorm_linear(4, 16, 32, torch.float32)


# ---------------------------------------------------------------------------------------------------------
# The launch plan: which branch runs on each side of every threshold
# ---------------------------------------------------------------------------------------------------------


def test_shape_class_thresholds():
    assert shape_class(1) == shape_class(GEMV_MAX_M) == "gemv"
    assert shape_class(GEMV_MAX_M + 1) == "decode"
    assert shape_class(DECODE_MAX_M) == "decode"
    assert shape_class(DECODE_MAX_M + 1) == "middle"
    assert shape_class(PREFILL_MIN_M - 1) == "middle"
    assert shape_class(PREFILL_MIN_M) == "prefill"
    assert shape_class(10**6) == "prefill"


@pytest.mark.parametrize("m,bucket", [(1, 16), (16, 16), (17, 32), (64, 64), (65, 128), (1000, 1024),
                                      (1024, 1024), (1025, 2048), (16384, 16384), (10**6, MAX_M_BUCKET)])
def test_m_bucket(m, bucket):
    assert m_bucket(m) == bucket
    assert MIN_M_BUCKET <= m_bucket(m) <= MAX_M_BUCKET


def test_rms_mode_by_dtype():
    for m in (20, 5):  # the tiled kernels and the GEMV on the tensor cores (M above its CUDA-core rows)
        assert plan_rmsnorm_linear(m, 16, 32, torch.bfloat16).rms == RMS_MODE[torch.bfloat16] == "in-loop"
        assert plan_rmsnorm_linear(m, 16, 32, torch.float16).rms == RMS_MODE[torch.float16] == "pre-pass"
    assert plan_rmsnorm_linear(1, 16, 32, torch.float16).rms == "in-loop"  # the GEMV's CUDA-core math is fp32


def test_interpreter_plan_is_one_fixed_config():
    plan = plan_rmsnorm_linear(17, 48, 96, torch.bfloat16, interpret=True)
    assert plan == RmsNormLinearPlan("decode", 32, "in-loop", False, 1, INTERPRETER_CONFIG)
    assert plan.as_dict()["config"] == INTERPRETER_CONFIG
    assert INTERPRETER_CONFIG["SPLIT_K"] > 1  # CPU tests run the split-K fix-up by default
    for interpret in (True, False):  # the GEMV's plan is the same fixed table everywhere
        gemv = plan_rmsnorm_linear(16, 48, 96, torch.float16, interpret=interpret)
        assert (gemv.shape_class, gemv.autotuned, gemv.candidates) == ("gemv", False, 1) and gemv.config


@pytest.mark.parametrize("m,cls", [(GEMV_MAX_M + 1, "decode"), (DECODE_MAX_M, "decode"), (DECODE_MAX_M + 1, "middle"),
                                   (PREFILL_MIN_M - 1, "middle"), (PREFILL_MIN_M, "prefill"), (8192, "prefill")])
def test_gpu_plan_autotunes_over_its_class_list(m, cls):
    plan = plan_rmsnorm_linear(m, 4096, 4096, torch.bfloat16, interpret=False)
    assert plan.shape_class == cls and plan.autotuned and plan.config is None
    assert plan.candidates == len(candidate_configs(m)) > 1


def test_gemv_rows_have_no_autotuning_candidates():
    assert candidate_configs(1) == candidate_configs(GEMV_MAX_M) == []


@pytest.mark.parametrize("m", [17, 32, 33, 64])
def test_decode_tiles_cover_the_batch_in_one_row_tile(m):
    # W streams from DRAM once only if one row-tile holds every row.
    configs = candidate_configs(m)
    assert configs and all(c["BLOCK_M"] == m_bucket(m) >= m for c in configs)


@pytest.mark.parametrize("m", [65, 128, 129, 512, 1023])
def test_middle_tiles_no_taller_than_the_bucket(m):
    configs = candidate_configs(m)
    assert configs and all(c["BLOCK_M"] <= m_bucket(m) for c in configs)
    assert len({c["BLOCK_M"] for c in configs}) > 1


def test_prefill_keeps_every_config_that_fits():
    assert candidate_configs(4096) == [c for c in class_configs("prefill") if smem_bytes(c) <= SMEM_BYTES]


def test_configs_fit_shared_memory_and_are_valid_tiles():
    for cls in TILED_CLASSES:
        for c in class_configs(cls):
            for dim in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
                assert c[dim] >= 16 and c[dim] == triton.next_power_of_2(c[dim]), (cls, c)
            assert c["num_warps"] in (4, 8)
            assert c["SPLIT_K"] >= 1 and isinstance(c["SWAP_AB"], bool)
            assert not c["SWAP_AB"] or c["BLOCK_N"] >= 64  # W as the first operand fills a warpgroup MMA
    oversized = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 512, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    assert smem_bytes(oversized) == 3 * (64 + 32) * 512 * 2 > SMEM_BYTES
    assert not config_fits(oversized, "decode", 64)
    assert all(smem_bytes(c) <= SMEM_BYTES for m in (17, 64, 128, 1000, 4096) for c in candidate_configs(m))
    with pytest.raises(ValueError, match="shape class must be one of decode, middle, prefill"):
        class_configs("huge")


def test_autotuners_hold_the_tabulated_configs_and_prune_like_the_plan():
    for cls in TILED_CLASSES:
        tuner = tiled.AUTOTUNERS[cls]
        assert tuner.keys == ["M_BUCKET", "N", "K"]
        assert [config_dict(c) for c in tuner.configs] == class_configs(cls)
    for m in (17, 32, 64, 65, 128, 1000, 1024, 8192):
        tuner = tiled.AUTOTUNERS[shape_class(m)]
        pruned = tuner.early_config_prune(tuner.configs, {"M_BUCKET": m_bucket(m)})
        assert [config_dict(c) for c in pruned] == candidate_configs(m)


def test_config_dict_drops_derived_flags():
    cfg = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "EVEN_K": True},
                        num_warps=4, num_stages=5)
    assert config_dict(cfg) == {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 5}


def test_public_api_dispatches_by_shape_class(device, gen, monkeypatch):
    seen = []
    real_gemv, real_tiled = rl_module._launch_gemv, tiled.rmsnorm_linear_tiled_fwd

    def gemv(*args, **kwargs):
        seen.append(("gemv", args[0].gemv.form))
        return real_gemv(*args, **kwargs)

    def tiled_fwd(*args, **kwargs):
        config = real_tiled(*args, **kwargs)
        seen.append((args[4], args[6]))  # shape class, r in the loop
        assert config is not None
        return config

    monkeypatch.setattr(rl_module, "_launch_gemv", gemv)
    monkeypatch.setattr(tiled, "rmsnorm_linear_tiled_fwd", tiled_fwd)
    for m in (1, GEMV_MAX_M, GEMV_MAX_M + 1, DECODE_MAX_M + 1):
        rmsnorm_linear(*_operands(m, 32, 16, torch.bfloat16, device, gen))
    rmsnorm_linear(*_operands(GEMV_MAX_M + 1, 32, 16, torch.float16, device, gen))
    assert seen == [("gemv", "fma"), ("gemv", "dot"), ("decode", True), ("middle", True), ("decode", False)]


def test_resolve_plan_without_cuda_launches_nothing(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("resolve_plan must not launch off CUDA")

    monkeypatch.setattr(rl_module, "rmsnorm_linear_fwd", no_launch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_plan(17, 4096, 4096, torch.bfloat16, "cpu").config == INTERPRETER_CONFIG
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    plan = resolve_plan(17, 4096, 4096, torch.bfloat16, "cpu")
    assert plan.autotuned and plan.config is None
    assert resolve_plan(16, 4096, 4096, torch.bfloat16, "cpu") == plan_rmsnorm_linear(16, 4096, 4096, torch.bfloat16)


def test_rms_prepass_matches_float64(device, gen):
    x = _draw((5, 1500), torch.float16, device, gen, scale=7.0)  # two 1024-wide steps, the second partial
    r = rms_inv(x, EPS, out=torch.full((5,), float("nan"), device=device))
    assert rel_err(r, torch.rsqrt(x.double().pow(2).mean(-1) + EPS)) < 1e-6


# ---------------------------------------------------------------------------------------------------------
# The seed-style baseline
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,k,n", [(1, 32, 16), (3, 96, 20), (70, 64, 130)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_seed_style_matches_float64(dtype, m, k, n, device, gen):
    x, weight, gamma = _operands(m, k, n, dtype, device, gen)
    _check_forward(rmsnorm_linear_seed(x, weight, gamma, EPS), x, weight, gamma)


def test_seed_style_keeps_the_seed_tiles(device, gen):
    assert SEED_TILES == {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    x = _draw((2, 3, 32), torch.bfloat16, device, gen)
    _, weight, gamma = _operands(1, 32, 16, torch.bfloat16, device, gen)
    y = rmsnorm_linear_seed(x, weight, gamma, EPS)
    assert y.shape == (2, 3, 16) and y.grad_fn is None
    _check_forward(y.reshape(6, 16), x.reshape(6, 32), weight, gamma)


# ---------------------------------------------------------------------------------------------------------
# The experiments: declarations, models, and every Triton profile correct on a small case
# ---------------------------------------------------------------------------------------------------------


def _experiments():
    from experiments import get_experiment

    return get_experiment("rmsnorm-linear-decode"), get_experiment("rmsnorm-linear-prefill")


def test_experiment_declarations():
    from experiments import _rmsnorm_linear as rl
    from experiments.decisions import DECISIONS

    decode, prefill = _experiments()
    assert (decode.claim.threshold, prefill.claim.threshold) == (1.1, 1.0)
    nk = ((4096, 4096), (12288, 4096), (14336, 4096), (4096, 8192), (11007, 4096))  # 11007: a ragged last tile
    assert sorted((c["M"], c["N"], c["K"]) for c in decode.cases) == sorted(
        (m, n, k) for m in (1, 2, 4, 8, 16) for n, k in nk)
    assert len(decode.cases) == 25 and all(c["M"] <= GEMV_MAX_M for c in decode.cases)  # every point runs the GEMV
    assert sorted((c["M"], c["N"], c["K"]) for c in prefill.cases) == sorted(
        (m, n, 4096) for m in (1024, 4096, 8192) for n in (4096, 12288))
    for exp in (decode, prefill):
        assert exp.dtypes == (torch.bfloat16,)
        assert [p.name for p in exp.profiles] == ["torch-unfused", "torch.compile", "triton-seed-style", "triton-fused"]
        assert exp.claim.subject == "triton-fused" and exp.claim.baselines == ("torch-unfused", "torch.compile")
        assert exp.row_inputs == ("x",) and exp.flops is not None
        assert exp.source_file == f"experiments/{exp.slug.replace('-', '_')}.py"
        assert Path(exp.source_file).name in {p.name for p in Path(rl.__file__).parent.iterdir()}
        for source in (s for p in exp.profiles for s in p.sources):
            assert (Path(kernels.__file__).parents[1] / source).is_file(), source
    decision = next(d for d in DECISIONS if d.slug == "rmsnorm-linear-fusion")
    assert decision.experiments == ("rmsnorm-linear-decode", "rmsnorm-linear-prefill")
    assert decode.decisions == prefill.decisions == ("rmsnorm-linear-fusion",)
    assert rl._compiled_pair().__wrapped__ is reference.rmsnorm_linear_reference  # compiled lazily, not here


def test_byte_and_flop_models():
    from experiments import _rmsnorm_linear as rl
    from experiments.spec import Case

    case = Case("t", {"M": 16, "N": 12288, "K": 4096})
    assert rl.bytes_moved(case, torch.bfloat16) == 2 * (16 * 4096 + 12288 * 4096 + 4096 + 16 * 12288)
    assert rl.flops(case, torch.bfloat16) == 2 * 16 * 12288 * 4096
    # At M = 1 the weight is all but every byte: the decode floor is the time to read W.
    one = Case("t", {"M": 1, "N": 12288, "K": 4096})
    assert 12288 * 4096 * 2 / rl.bytes_moved(one, torch.bfloat16) > 0.999


def test_make_inputs_are_deterministic_and_shaped():
    from experiments import _rmsnorm_linear as rl
    from experiments.spec import Case

    case = Case("t", {"M": 3, "N": 20, "K": 40})
    a = rl.make_inputs(case, torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    b = rl.make_inputs(case, torch.bfloat16, "cpu", torch.Generator().manual_seed(1))
    assert {k: tuple(v.shape) for k, v in a.items()} == {"x": (3, 40), "weight": (20, 40), "gamma": (40,)}
    assert all(a[k].dtype == torch.bfloat16 and torch.equal(a[k], b[k]) for k in a)
    assert (a["gamma"].float() - 1).abs().max() > 0.05  # far enough from ones to catch a dropped gamma


@pytest.mark.parametrize("profile", ["torch-unfused", "triton-seed-style", "triton-fused"])
def test_experiment_profiles_pass_their_accuracy_check(profile, device):
    from experiments.spec import Case

    decode, _ = _experiments()
    case = Case("small", {"M": 5, "N": 24, "K": 64})
    inputs = decode.make_inputs(case, torch.bfloat16, device, torch.Generator().manual_seed(7))
    out = decode.profile(profile).run(**inputs)
    ref = decode.reference(**inputs)
    assert rel_err(out, ref) <= decode.tolerance[torch.bfloat16]
    plan = decode.profile(profile).plan
    if plan is not None:
        assert isinstance(plan(case, torch.bfloat16), dict)


def test_experiment_plans():
    from experiments import _rmsnorm_linear as rl
    from experiments.spec import Case

    case = Case("t", {"M": 16, "N": 12288, "K": 4096})
    assert rl.seed_plan(case, torch.bfloat16)["grid"] == [1, 96]
    fused = rl.fused_plan(case, torch.bfloat16)
    assert fused["shape_class"] == "gemv" and fused["rms"] == "in-loop" and fused["config"]["form"] == "dot"
    assert rl.fused_plan(Case("t", {"M": 17, "N": 12288, "K": 4096}), torch.bfloat16)["shape_class"] == "decode"


# ---------------------------------------------------------------------------------------------------------
# The write-up's floors table is the byte and FLOP model, not typed guesses
# ---------------------------------------------------------------------------------------------------------

POST = Path(__file__).resolve().parents[1] / "docs" / "posts" / "rmsnorm-linear.md"


def test_post_floors_follow_the_models():
    from experiments import _rmsnorm_linear as rl
    from experiments.spec import Case

    text = POST.read_text(encoding="utf-8")
    pattern = r"^\| (\d+) × (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \|$"
    rows = re.findall(pattern, text, re.MULTILINE)
    assert len(rows) == 12, "the floors table lists twelve shapes from one token to prefill"
    intensities = {}
    for m, n, mbytes, gflop, per_byte, extra_mb in rows:
        case = Case("t", {"M": int(m), "N": int(n), "K": 4096})
        b, f = rl.bytes_moved(case, torch.bfloat16), rl.flops(case, torch.bfloat16)
        assert float(mbytes) == pytest.approx(b / 1e6, abs=0.06), (m, n)
        assert float(gflop) == pytest.approx(f / 1e9, abs=0.006), (m, n)
        assert int(per_byte) == round(f / b), (m, n)
        # The unfused pair's normalisation pass reads x and writes h: 2·M·K more elements of 2 bytes.
        assert float(extra_mb) == pytest.approx(4 * int(m) * 4096 / 1e6, abs=0.006), (m, n)
        intensities[int(m)] = max(intensities.get(int(m), 0), f / b)
    # The text's split: decode shapes below a few hundred FLOP per byte (an H100's F/B), prefill shapes above.
    assert max(v for m, v in intensities.items() if m <= 128) < 200
    assert min(v for m, v in intensities.items() if m >= 1024) > 600


def test_kernels_package_exports_rmsnorm_linear():
    assert kernels.rmsnorm_linear is rmsnorm_linear
    assert Path(kernels.__file__).resolve().parent == Path(__file__).resolve().parents[1] / "kernels"
