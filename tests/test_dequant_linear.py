"""kernels.dequant_linear (int8 and int4 weight-only linear), kernels.quantize (the quantisers and the int4
packing) and the dequant-linear-decode experiment, against float64 dequantise-then-matmul references.

Bounds: ‖out − ref‖ / ‖ref‖ against float64 of the same quantised weights, one row per activation dtype.
The kernel multiplies exact small integers by x in fp32 (the tensor-core form feeds 128 + u, exact in
bf16, and subtracts 136 · sum(x) per group: a few bits of fp32) and rounds once at the output, so the error
is the output's rounding: half a unit (fp16 2^-11, bf16 2^-8; Triton's interpreter truncates to bf16, about
twice that). A wrong nibble, a swapped half, a scale from the wrong group or a lost split miss these bounds
by an order of magnitude (each is a change of O(1) in some weights). Every error must also stay within
TORCH_FACTOR of torch's own dequantise-then-F.linear in the same dtype.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from accuracy import reference_error, rel_err
from kernels import dequant_linear as dl
from kernels import reference
from kernels._gemv import GemvPlan, counters_at_rest
from kernels.quantize import GROUP_SIZES, dequantize_int4, dequantize_int8, quantize_int4, quantize_int8, unpack_int4

BOUNDS = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
TORCH_FACTOR = 4.0
DTYPES = list(BOUNDS)


def _x(m, k, dtype, device, gen):
    return torch.randn(m, k, generator=gen, dtype=torch.float64).to(dtype).to(device)


def _w(n, k, dtype, device, gen):
    return (torch.randn(n, k, generator=gen, dtype=torch.float64) / math.sqrt(k)).to(dtype).to(device)


def _ref(x, weight, scales, group_size=None):
    if weight.dtype == torch.int8:
        return reference.int8_linear_reference(x.double(), weight, scales.double())
    return reference.int4_linear_reference(x.double(), weight, scales.double(), group_size)


def _torch(x, weight, scales, group_size=None):
    if weight.dtype == torch.int8:
        return reference.int8_linear_reference(x, weight, scales)
    return reference.int4_linear_reference(x, weight, scales, group_size)


def _check(y, x, weight, scales, group_size=None):
    ref = _ref(x, weight, scales, group_size)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert not torch.isnan(y).any(), "an output element is NaN (unwritten, or a lost split)"
    err = rel_err(y, ref)
    assert err <= BOUNDS[x.dtype], f"relative error {err:.3e}"
    theirs = _torch(x, weight, scales, group_size)
    assert err <= TORCH_FACTOR * reference_error(theirs, ref, x.dtype) + 1e-7, f"{err:.3e} against torch's"


# ---------------------------------------------------------------------------------------------------------
# Quantisation and the int4 layout
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_int4_packing_round_trips_and_matches_the_documented_layout(group_size, gen):
    q = torch.randint(-7, 8, (5, 2 * group_size), generator=gen, dtype=torch.int8)
    q[:, ::group_size] = 7  # every group reaches 7: its scale is exactly 0.25 below
    u = (q + 8).to(torch.uint8)
    half = group_size // 2
    # Pack by hand from the layout in kernels/quantize.py: byte j of group g holds k = gG + j (bits 0-3)
    # and k = gG + G/2 + j (bits 4-7).
    packed = torch.empty(5, group_size, dtype=torch.uint8)
    for g in range(2):
        for j in range(half):
            packed[:, g * half + j] = u[:, g * group_size + j] | (u[:, g * group_size + half + j] << 4)
    assert torch.equal(unpack_int4(packed, group_size), q)
    assert torch.equal(reference.unpack_int4_reference(packed, group_size), q.long())
    w = q.float() * 0.25
    packed_q, scales = quantize_int4(w, group_size)
    assert torch.equal(packed_q, packed) and torch.equal(scales, torch.full((5, 2), 0.25))
    assert torch.equal(dequantize_int4(packed_q, scales, group_size), w)
    # -8 decodes too, though the symmetric quantiser never writes it.
    assert unpack_int4(torch.zeros(1, half, dtype=torch.uint8), group_size).eq(-8).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantisers_stay_within_half_a_step(dtype, gen):
    w = (torch.randn(33, 256, generator=gen) * torch.rand(33, 1, generator=gen) * 3).to(dtype)
    w[3] = 0  # an all-zero row: scale 1, q 0, no division by zero
    q8, s8 = quantize_int8(w)
    assert q8.dtype == torch.int8 and s8.dtype == dtype and s8.shape == (33,) and q8.abs().max() <= 127
    step8 = s8.float()[:, None]
    assert ((dequantize_int8(q8, s8, torch.float32) - w.float()).abs() <= step8 / 2 * (1 + 1e-2) + 1e-6).all()
    p4, s4 = quantize_int4(w, 64)
    assert p4.shape == (33, 128) and s4.shape == (33, 4) and s4.dtype == dtype
    step4 = s4.float().repeat_interleave(64, dim=1)
    err4 = (dequantize_int4(p4, s4, 64, torch.float32) - w.float()).abs()
    assert (err4 <= step4 / 2 * (1 + 1e-2) + 1e-6).all()
    assert unpack_int4(p4, 64).min() >= -8 and unpack_int4(p4, 64).max() <= 7
    assert (s8[3] == 1) and (s4[3] == 1).all() and not q8[3].any()


def test_quantiser_errors():
    with pytest.raises(ValueError, match=r"group_size must be one of 32, 64, 128, 256, got 48"):
        quantize_int4(torch.zeros(4, 96), 48)
    with pytest.raises(ValueError, match=r"K = 96 is not a multiple of group_size = 64"):
        quantize_int4(torch.zeros(4, 96), 64)
    with pytest.raises(TypeError, match=r"weight must be a floating-point tensor, got dtype int8"):
        quantize_int8(torch.zeros(4, 96, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"weight must have shape \[N, K\], got \(96,\)"):
        quantize_int8(torch.zeros(96))


# ---------------------------------------------------------------------------------------------------------
# The kernels against float64, both forms, every split, poisoned outputs
# ---------------------------------------------------------------------------------------------------------

# (form, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K): one row on the CUDA cores with and without split-K, four rows
# held in registers, the tensor cores with split 3 (more splits than K-steps at some sizes: empty splits
# still count in) and a 64-row tile.
PLANS = [("fma", 1, 8, 64, 1), ("fma", 1, 16, 32, 3), ("fma", 4, 8, 64, 2), ("dot", 16, 16, 32, 3), ("dot", 64, 32, 64, 1)]


@pytest.mark.parametrize("form,bm,bn,bk,split", PLANS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_every_plan(dtype, form, bm, bn, bk, split, device, gen):
    plan = GemvPlan(form, bm, bn, bk, split, 4, 2)
    w_q, scales = quantize_int8(_w(37, 200, dtype, device, gen))  # odd N, a K not a multiple of BLOCK_K
    for m in sorted({1, (bm + 1) // 2, bm}):
        x = _x(m, 200, dtype, device, gen)
        for fast in (True, False):
            y = torch.full((m, 37), float("nan"), dtype=dtype, device=device)
            dl.int8_linear_fwd(x, w_q, scales, plan, y, fast_cvt=fast)
            _check(y, x, w_q, scales)
        assert counters_at_rest(x.device)


# int4 plans (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K) with groups of 64 and K = 320 (five groups): one group a
# step, two groups a step (the last step holds one: masked), four groups a step with split 2 (the second
# split holds one step), split 3 over five steps, and a 64-row tile.
INT4_PLANS = [(16, 16, 64, 1), (16, 16, 128, 1), (16, 32, 256, 2), (16, 16, 64, 3), (64, 32, 128, 1)]


@pytest.mark.parametrize("bm,bn,bk,split", INT4_PLANS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int4_every_plan(dtype, bm, bn, bk, split, device, gen):
    plan = GemvPlan("dot", bm, bn, bk, split, 4, 2)
    w_packed, scales = quantize_int4(_w(37, 320, dtype, device, gen), 64)
    for m in sorted({1, 3, bm}):
        x = _x(m, 320, dtype, device, gen)
        y = torch.full((m, 37), float("nan"), dtype=dtype, device=device)
        dl.int4_linear_fwd(x, w_packed, scales, 64, plan, y)
        _check(y, x, w_packed, scales, 64)
        assert counters_at_rest(x.device)


def test_int4_refuses_plans_it_cannot_run(device, gen):
    w_packed, scales = quantize_int4(_w(8, 128, torch.bfloat16, device, gen), 64)
    x = _x(1, 128, torch.bfloat16, device, gen)
    y = torch.empty(1, 8, dtype=torch.bfloat16, device=device)
    for plan in (GemvPlan("fma", 1, 8, 64, 1, 4, 2), GemvPlan("dot", 16, 16, 96, 1, 4, 2)):
        with pytest.raises(ValueError, match="int4_linear: plans run on the tensor cores with whole groups"):
            dl.int4_linear_fwd(x, w_packed, scales, 64, plan, y)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_int4_group_sizes_through_the_public_function(group_size, device, gen):
    for m in (1, 5):
        x = _x(m, 2 * 256, torch.bfloat16, device, gen)
        w_packed, scales = quantize_int4(_w(24, 512, torch.bfloat16, device, gen), group_size)
        _check(dl.int4_linear(x, w_packed, scales, group_size), x, w_packed, scales, group_size)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_public_functions_take_leading_dims_and_scale_dtypes(scale_dtype, device, gen):
    x = _x(6, 128, torch.float16, device, gen).reshape(2, 3, 128)
    w = _w(20, 128, torch.float16, device, gen)
    w_q, s8 = quantize_int8(w)
    y8 = dl.int8_linear(x, w_q, s8.to(scale_dtype))
    assert y8.shape == (2, 3, 20)
    _check(y8.reshape(6, 20), x.reshape(6, 128), w_q, s8.to(scale_dtype))
    w_p, s4 = quantize_int4(w, 32)
    y4 = dl.int4_linear(x[:, 1:], w_p, s4.to(scale_dtype), 32)  # a strided x: rows copied once
    assert y4.shape == (2, 2, 20)
    _check(y4.reshape(4, 20), x[:, 1:].reshape(4, 128), w_p, s4.to(scale_dtype), 32)


def test_large_int4_sums_keep_their_precision(device, gen):
    # Rows of x with a large common offset: the tensor-core form's sum of (128 + u) * x is ~34 times the
    # answer, and the per-group correction must cancel it without losing the result.
    x = (_x(3, 256, torch.float32, device, gen) + 20).to(torch.bfloat16)
    w_p, s4 = quantize_int4(_w(16, 256, torch.bfloat16, device, gen), 128)
    _check(dl.int4_linear(x, w_p, s4, 128), x, w_p, s4, 128)


def test_empty_inputs_return_empty(device, gen):
    w_q, s = quantize_int8(_w(16, 64, torch.bfloat16, device, gen))
    assert dl.int8_linear(_x(0, 64, torch.bfloat16, device, gen), w_q, s).shape == (0, 16)
    w_p, s4 = quantize_int4(_w(16, 64, torch.bfloat16, device, gen)[:0], 32)
    assert dl.int4_linear(_x(2, 64, torch.bfloat16, device, gen), w_p, s4, 32).shape == (2, 0)


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear errors
# ---------------------------------------------------------------------------------------------------------


def _bad_calls(device):
    bf = {"dtype": torch.bfloat16, "device": device}
    x = torch.ones(3, 128, **bf)
    w8, s8 = torch.ones(16, 128, dtype=torch.int8, device=device), torch.ones(16, **bf)
    w4, s4 = torch.ones(16, 64, dtype=torch.uint8, device=device), torch.ones(16, 1, **bf)
    yield dl.int8_linear, (x.float(), w8, s8), TypeError, r"x has dtype float32; supported dtypes are bfloat16, float16"
    yield dl.int8_linear, (x, w8.to(torch.uint8), s8), TypeError, r"weight has dtype uint8; expected int8 \[N, K\]"
    yield dl.int8_linear, (x, w8, s8.to(torch.int32)), TypeError, r"scales has dtype int32; supported dtypes are float32"
    yield dl.int8_linear, (x, w8[:, :64], s8), ValueError, r"weight must have shape \[N, K\] with K = 128.*got \(16, 64\)"
    yield dl.int8_linear, (x, w8, s8[:15]), ValueError, r"scales must have shape \[N\] = \(16,\), got \(15,\)"
    yield dl.int8_linear, (torch.ones(3, 0, **bf), w8[:, :0], s8), ValueError, r"K > 0"
    yield dl.int8_linear, ([1.0], w8, s8), TypeError, r"x must be a torch.Tensor, got list"
    yield dl.int8_linear, (torch.ones(65, 128, **bf), w8, s8), ValueError, r"up to M = 64 rows.*got 65"
    yield dl.int4_linear, (x, w4.to(torch.int8), s4), TypeError, r"weight has dtype int8; expected uint8 \[N, K/2\]"
    yield dl.int4_linear, (x, w4[:, :32], s4), ValueError, r"weight must have shape \[N, K/2\] with K = 128.*got \(16, 32\)"
    yield dl.int4_linear, (x, w4, torch.ones(16, 2, **bf)), ValueError, r"scales must have shape \[N, K/group_size\] = \(16, 1\)"
    yield (lambda *a: dl.int4_linear(*a, group_size=100)), (x, w4, s4), ValueError, r"group_size must be one of 32, 64"
    yield (lambda *a: dl.int4_linear(*a, group_size=256)), (x, w4, s4), ValueError, r"K = 128 is not a multiple of group_size = 256"
    yield (lambda *a: dl.int4_linear(*a, group_size=True)), (x, w4, s4), ValueError, r"group_size must be one of"


def test_bad_inputs_raise_clear_errors(device):
    for fn, args, exc, pattern in _bad_calls(device):
        with pytest.raises(exc, match=pattern):
            fn(*args)


def test_forward_only_says_so(device, gen):
    w_q, s = quantize_int8(_w(16, 64, torch.bfloat16, device, gen))
    x = _x(2, 64, torch.bfloat16, device, gen)
    dl.int8_linear(x, w_q, s)  # cached layout first: the check must still run
    with pytest.raises(RuntimeError, match=r"forward only, but x requires grad; .*torch.no_grad\(\)"):
        dl.int8_linear(x.requires_grad_(), w_q, s)
    with torch.no_grad():
        assert dl.int8_linear(x, w_q, s).shape == (2, 16)


def test_cpu_tensors_without_the_interpreter_name_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, s = torch.ones(2, 64, dtype=torch.bfloat16), torch.ones(16, 64, dtype=torch.int8), torch.ones(16)
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        dl.int8_linear(x, w, s)


def test_mixed_devices_are_refused(device):
    if device == "cpu":
        pytest.skip("needs a CUDA device beside the CPU")
    x = torch.ones(2, 64, dtype=torch.bfloat16, device=device)
    # Without the interpreter the CPU weight is refused as such before the devices are compared.
    with pytest.raises(RuntimeError, match=r"got a tensor on device 'cpu'|all tensors must be on one device"):
        dl.int8_linear(x, torch.ones(16, 64, dtype=torch.int8), torch.ones(16, device=device))


# ---------------------------------------------------------------------------------------------------------
# The plan: each threshold on both sides
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_plan_thresholds(bits):
    edge = dl.FMA_MAX_M[bits]
    if edge >= 1:
        assert dl.plan_dequant_linear(bits, edge, 4096, 4096).form == "fma"
    dot = dl.plan_dequant_linear(bits, edge + 1, 4096, 4096)
    assert dot.form == "dot" and dot.block_m == 16 and dot.swap
    assert dl.plan_dequant_linear(bits, 16, 4096, 4096).block_m == 16
    assert dl.plan_dequant_linear(bits, 17, 4096, 4096).block_m == 32
    assert dl.plan_dequant_linear(bits, dl.DOT_MAX_M, 4096, 4096).block_m == dl.DOT_MAX_M
    with pytest.raises(ValueError, match=f"1 <= M <= {dl.DOT_MAX_M} rows, got {dl.DOT_MAX_M + 1}"):
        dl.plan_dequant_linear(bits, dl.DOT_MAX_M + 1, 4096, 4096)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        dl.plan_dequant_linear(3, 1, 64, 64)


@pytest.mark.parametrize("bits", [8, 4])
def test_tile_buckets_on_each_side_of_every_threshold(bits):
    """Each (form, M bucket) row of TILES runs at its bucket's M; one row past it runs the next row."""
    keys = sorted((0 if f == "fma" else 1, mb) for (b, f, mb) in dl.TILES if b == bits)
    big_n, big_k = 4096, 4096  # no tile shrinks to the problem, and the weight is not yet wide
    assert not dl.is_wide(big_n, big_k) and dl.is_wide(big_n + 1, big_k)
    for i, (f, bucket) in enumerate(keys):
        form = ("fma", "dot")[f]
        at = dl.plan_dequant_linear(bits, bucket, big_n, big_k)
        assert (at.form, at.block_n, at.block_k, at.num_warps, at.load_stages) == (form, *dl.TILES[(bits, form, bucket)])
        if bucket < dl.DOT_MAX_M:
            nf, nb = keys[i + 1]
            past = dl.plan_dequant_linear(bits, bucket + 1, big_n, big_k)
            want = dl.TILES[(bits, ("fma", "dot")[nf], nb)]
            assert (past.form, past.block_n, past.block_k, past.num_warps, past.load_stages) == (("fma", "dot")[nf], *want)


@pytest.mark.parametrize("bits", [8, 4])
def test_wide_weights_take_their_own_rows(bits):
    n, k = 4097, 4096  # one row past the narrow limit
    assert dl.fma_max_m(bits, n, k) == dl.FMA_MAX_M_WIDE[bits] and dl.fma_max_m(bits, n - 1, k) == dl.FMA_MAX_M[bits]
    edge = dl.FMA_MAX_M_WIDE[bits]
    if edge >= 1:
        assert dl.plan_dequant_linear(bits, edge, n, k).form == "fma"
    assert dl.plan_dequant_linear(bits, edge + 1, n, k).form == "dot"
    for (b, form, bucket), tile in dl.WIDE_TILES.items():
        if b == bits:
            plan = dl.plan_dequant_linear(bits, bucket, n, k)
            assert (plan.form, plan.block_n, plan.block_k, plan.num_warps, plan.load_stages) == (form, *tile)
            narrow = dl.plan_dequant_linear(bits, bucket, n - 1, k)
            assert (narrow.block_n, narrow.block_k, narrow.num_warps, narrow.load_stages) == dl.TILES[(b, form, bucket)]


def test_int4_steps_hold_whole_groups():
    for group in GROUP_SIZES:
        for m in (1, 16):
            plan = dl.plan_dequant_linear(4, m, 4096, 4096, group)
            assert plan.block_k % group == 0 and plan.block_k >= group
    assert dl.plan_dequant_linear(4, 1, 64, 128, 128).block_k == 128  # no wider than K


def test_split_k_depends_on_the_sm_count():
    few = dl.plan_dequant_linear(8, 16, 4096, 4096, sm_count=16)
    many = dl.plan_dequant_linear(8, 16, 4096, 4096, sm_count=132)
    assert few.split_k == 1 and many.split_k > 1
    assert many.grid(4096)[0] >= dl.PROGRAMS_PER_SM[8, "dot"] * 132


@pytest.mark.parametrize("bits", [8, 4])
def test_plans_at_the_experiment_shapes_fill_the_gpu(bits):
    for m in (1, 2, 4, 8, 16, 64):
        for n, k in ((4096, 4096), (12288, 4096), (14336, 4096), (11007, 4096)):
            plan = dl.plan_dequant_linear(bits, m, n, k)
            want = min(1, dl.PROGRAMS_PER_SM[bits, plan.form]) * 132  # every SM, or half for int8's tensor cores
            assert plan.grid(n)[0] >= want and k % plan.block_k == 0, (m, n, k, plan)


# ---------------------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------------------


def test_experiment_declaration_and_models():
    from experiments import get_experiment
    from experiments.spec import Case

    exp = get_experiment("dequant-linear-decode")
    nk = ((4096, 4096), (12288, 4096), (14336, 4096), (11007, 4096))
    assert len(exp.cases) == 48 and exp.dtypes == (torch.bfloat16,)
    assert {(c["BITS"], c["M"], c["N"], c["K"]) for c in exp.cases} == {
        (b, m, n, k) for b in (8, 4) for m in (1, 2, 4, 8, 16, 64) for n, k in nk}
    assert exp.claim.subject == "triton-dequant" and exp.claim.threshold == 1.0
    assert set(exp.claim.baselines) == {p.name for p in exp.profiles} - {"triton-dequant"}
    case8 = Case("t", {"BITS": 8, "M": 1, "N": 4096, "K": 4096})
    case4 = Case("t", {"BITS": 4, "M": 1, "N": 4096, "K": 4096})
    assert exp.bytes_moved(case8, torch.bfloat16) == 4096 * 4096 + 4096 * 2 + (4096 + 4096) * 2
    assert exp.bytes_moved(case4, torch.bfloat16) == 4096 * 2048 + 4096 * 32 * 2 + (4096 + 4096) * 2
    assert exp.profile("torch-int8pack-mm").unsupported(case4, torch.bfloat16)
    assert exp.profile("torch-int4pack-mm").unsupported(case8, torch.bfloat16)
    assert exp.profile("torch-int8pack-mm").unsupported(case8, torch.bfloat16) is None
    odd4 = Case("t", {"BITS": 4, "M": 1, "N": 11007, "K": 4096})
    if torch.cuda.is_available():
        assert "multiples of 8" in exp.profile("torch-int4pack-mm").unsupported(odd4, torch.bfloat16)
    assert exp.profile("gemlite").requires == "gemlite"


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("profile", ["torch-dequant", "triton-dequant"])
def test_experiment_profiles_pass_their_accuracy_check(bits, profile, device):
    from experiments import get_experiment
    from experiments.spec import Case

    exp = get_experiment("dequant-linear-decode")
    case = Case("small", {"BITS": bits, "M": 3, "N": 24, "K": 256})
    inputs = exp.make_inputs(case, torch.bfloat16, device, torch.Generator().manual_seed(7))
    assert inputs["weight"].dtype == (torch.int8 if bits == 8 else torch.uint8)
    out = exp.profile(profile).run(**inputs)
    assert rel_err(out, exp.reference(**inputs)) <= exp.tolerance[torch.bfloat16]
    plan = exp.profile(profile).plan
    if plan is not None:
        above = Case("above", {"BITS": bits, "M": dl.FMA_MAX_M[bits] + 1, "N": 24, "K": 256})
        assert plan(above, torch.bfloat16)["form"] == "dot"
        one = Case("one", {"BITS": bits, "M": 1, "N": 24, "K": 256})
        assert plan(one, torch.bfloat16)["form"] == ("fma" if dl.FMA_MAX_M[bits] >= 1 else "dot")
        gluon = bits == 4 and dl.int4_gluon_refusal(device, torch.bfloat16) is None  # wgmma: tensor cores
        assert plan(one, torch.bfloat16)["impl"] == ("gluon" if gluon else "triton")
        assert ("prepacked" in inputs) == gluon


def test_fusion_post_dequant_byte_table_follows_from_the_byte_model():
    from pathlib import Path

    from experiments import get_experiment
    from experiments.spec import Case

    text = (Path(__file__).resolve().parents[1] / "docs" / "posts" / "kernel-fusion.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) × (\d+) \| int(\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.MULTILINE)
    assert len(rows) == 4
    exp = get_experiment("dequant-linear-decode")
    for n, k, bits, fused, unfused, ratio in rows:
        n, k = int(n), int(k)
        b = exp.bytes_moved(Case("t", {"BITS": int(bits), "M": 1, "N": n, "K": k}), torch.bfloat16)
        more = 2 * 2 * n * k  # the bf16 weight written and read back
        assert float(fused) == pytest.approx(b / 1e6, abs=0.06) and float(unfused) == pytest.approx((b + more) / 1e6, abs=0.06)
        assert float(ratio) == pytest.approx((b + more) / b, abs=0.06)
