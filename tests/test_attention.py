"""kernels.attention against float64 references: forward, lse and gradients, causal and not, ragged lengths,
grouped-query heads, rows that see no key, poisoned outputs, the launch plan and bad input.

Bounds, one row per dtype (why these numbers): norm-wise relative errors ‖out − ref‖ / ‖ref‖ against
float64, for O and for each of dQ, dK, dV. The kernels round P to the input dtype before P V (and dS before
dS K, dS^T Q) and round each output once; with bf16's 2^-8 and fp16's 2^-11 relative spacing that is a
few thousandths (bf16) or a few ten-thousandths (fp16) norm-wise, more under the interpreter, whose
fp32 -> bf16 cast truncates. The bounds leave 2-3x room; a missing key tile, a stale rescale or a wrong
mask costs far more (a row's weights shift by whole tiles). Each error must also stay within TORCH_FACTOR
of torch's own SDPA math path in the same dtype (or of the float64 result merely stored in that dtype,
if larger: on the CPU torch's math path widens half types and lands on the storage error). lse is fp32
whatever the inputs: LSE_ATOL absolute.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from accuracy import reference_error, rel_err
from cases import grid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels
from kernels import reference_attention as reference
from kernels.attention import (
    _FORWARD_TMA_HEAD_DIMS,
    _SHORT_KEYS_TILE,
    _TILES,
    HEAD_DIMS,
    SHORT_KEYS_MAX,
    SHORT_QUERY_MAX,
    AttentionPlan,
    attention,
    attention_bwd,
    attention_fwd,
    plan_attention,
    plan_attention_backward,
)

#               forward  backward
BOUNDS = {
    torch.bfloat16: (1.6e-2, 2.4e-2),
    torch.float16: (1.5e-3, 2e-3),
}
TORCH_FACTOR = 4.0
LSE_ATOL = 2e-5
TERMS_SHARE = 1e-3  # dQ's and dK's floor: a thousandth of their terms' size (_error_against_terms)
DTYPES = list(BOUNDS)

# Tiles of 16 make every test shape span several query and key tiles: the unmasked loops, the causal
# diagonal band, the ragged last tiles and the rows past the end all run on sequences of a few dozen.
SMALL = AttentionPlan("forward", 16, 16, 4, 1)
SMALL_BWD = (AttentionPlan("backward_kv", 16, 16, 4, 1), AttentionPlan("backward_q", 16, 16, 4, 1))

#        (batch, heads, kv_heads, seq_q, seq_k, head_dim)
SHAPES = [
    (1, 2, 2, 48, 48, 64),  # whole tiles
    (2, 2, 1, 37, 53, 64),  # ragged, more keys than queries, grouped heads
    (1, 4, 2, 53, 37, 64),  # more queries than keys: causal rows that see no key
    (1, 2, 2, 33, 21, 128),
]


def _draw(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)


def _inputs(shape, dtype, device, gen, q_scale=1.0):
    b, h, h_kv, s_q, s_k, d = shape
    q = _draw((b, h, s_q, d), dtype, device, gen, q_scale)
    k = _draw((b, h_kv, s_k, d), dtype, device, gen)
    v = _draw((b, h_kv, s_k, d), dtype, device, gen)
    return q, k, v


def _torch_math(q, k, v, causal, do=None, key_mask=None):
    """torch's SDPA math path in the inputs' dtype (and its gradients when `do` is given); rows that see no
    key come out as zeros, as the lab defines them (torch gives NaN there)."""
    leaves = [t.detach().clone().requires_grad_(do is not None) for t in (q, k, v)]
    mask = reference.visible_keys(q.shape[2], k.shape[2], causal, key_mask, q.device)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    if do is None:
        return torch.nan_to_num(o.detach(), nan=0.0)
    o.backward(do)
    return tuple(torch.nan_to_num(t.grad, nan=0.0) for t in leaves)


def _check_forward(o, lse, q, k, v, causal, scale=None, key_mask=None):
    assert o.shape == q.shape and o.dtype == q.dtype and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "an output is NaN (unwritten?)"
    ref, ref_lse = reference.attention_reference(q.double(), k.double(), v.double(), causal, scale, return_lse=True,
                                                 key_mask=key_mask)
    err = rel_err(o, ref)
    assert err <= BOUNDS[q.dtype][0], f"relative error {err:.3e}"
    if scale is None:
        theirs = reference_error(_torch_math(q, k, v, causal, key_mask=key_mask), ref, q.dtype)
        assert err <= TORCH_FACTOR * theirs, f"{err:.3e} against torch's {theirs:.3e}"
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (lse[torch.isinf(lse)] < 0).all()
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse.double()[finite], ref_lse[finite], rtol=0, atol=LSE_ATOL)


def _error_against_terms(got, ref, other, v, do, scale):
    """‖dQ − ref‖ (other = K) or ‖dK − ref‖ (other = Q) over TERMS_SHARE of T = c ‖dO‖ max ‖v_j‖ max ‖other_r‖,
    the size of the gradient's terms c P_ij (dP_ij − δ_i) k_j (or q_i): |dP_ij| and |δ_i| are at most
    ‖dO_i‖ max ‖v_j‖. Where the terms cancel, the gradient is rounding alone: with one key a row dP = δ exactly,
    so the float64 dQ and dK are 0 to their own rounding and the norm-wise error of any rounded kernel is
    astronomical. There the yardstick is the terms' size; elsewhere ‖ref‖ is far above TERMS_SHARE · T."""
    c = 1 / math.sqrt(v.shape[-1]) if scale is None else scale
    terms = c * do.double().norm() * v.double().norm(dim=-1).max() * other.double().norm(dim=-1).max()
    return ((got.double() - ref).norm() / (TERMS_SHARE * terms).clamp_min(1e-300)).item()


def _check_backward(grads, q, k, v, do, causal, scale=None, key_mask=None):
    expected = reference.attention_backward_float64(q, k, v, do, causal, scale, key_mask=key_mask)
    theirs = _torch_math(q, k, v, causal, do, key_mask) if scale is None else None
    for name, got, ref, i in zip("qkv", grads, expected, range(3)):
        assert got.shape == ref.shape and got.dtype == q.dtype, name
        assert not torch.isnan(got).any(), f"d{name} holds NaN"
        err = rel_err(got, ref)
        floored = _error_against_terms(got, ref, k if name == "q" else q, v, do, scale) if name != "v" else err
        cancelled = floored < err
        if cancelled:  # judged against its terms' size; torch's path may land on exactly 0 there by its order
            err = floored
        assert err <= BOUNDS[q.dtype][1], f"d{name}: relative error {err:.3e}"
        if theirs is not None and not cancelled:
            bound = reference_error(theirs[i], ref, q.dtype)
            assert err <= TORCH_FACTOR * bound, f"d{name}: {err:.3e} against torch's {bound:.3e}"


# ---------------------------------------------------------------------------------------------------------
# Forward and backward against float64
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, causal, shape", grid(DTYPES, [False, True], SHAPES), ids=str)
def test_forward_matches_float64(dtype, causal, shape, device, gen):
    q, k, v = _inputs(shape, dtype, device, gen)
    o, lse = attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), SMALL)
    _check_forward(o, lse, q, k, v, causal)


@pytest.mark.parametrize("dtype, causal, shape", grid(DTYPES, [False, True], SHAPES), ids=str)
def test_backward_matches_float64(dtype, causal, shape, device, gen):
    q, k, v = _inputs(shape, dtype, device, gen)
    scale = 1 / math.sqrt(shape[-1])
    o, lse = attention_fwd(q, k, v, causal, scale, SMALL)
    do = _draw(o.shape, dtype, device, gen)
    _check_backward(attention_bwd(q, k, v, o, lse, do, causal, scale, SMALL_BWD), q, k, v, do, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_with_the_default_plans(causal, device, gen):
    # The plans the public function runs: 128-query forward tiles over two query and three key tiles.
    shape = (1, 2, 1, 130, 150, 128)
    q, k, v = (t.requires_grad_() for t in _inputs(shape, torch.bfloat16, device, gen))
    o = attention(q, k, v, causal=causal)
    o_ref, lse = attention_fwd(q.detach(), k.detach(), v.detach(), causal, 1 / math.sqrt(128))
    _check_forward(o.detach(), lse, q.detach(), k.detach(), v.detach(), causal)
    assert torch.equal(o.detach(), o_ref)
    do = _draw(o.shape, torch.bfloat16, device, gen)
    o.backward(do)
    _check_backward((q.grad, k.grad, v.grad), q.detach(), k.detach(), v.detach(), do, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_sharp_scores_rescale_across_tiles(causal, device, gen):
    # scale = 1 on D = 64 gives scores of spread 8: the running maximum moves from tile to tile and every
    # earlier tile's sum must be rescaled. Bounds as above; torch's error is not the yardstick at this scale.
    q, k, v = _inputs((1, 2, 2, 45, 45, 64), torch.float16, device, gen)
    o, lse = attention_fwd(q, k, v, causal, 1.0, SMALL)
    _check_forward(o, lse, q, k, v, causal, scale=1.0)
    do = _draw(o.shape, torch.float16, device, gen)
    _check_backward(attention_bwd(q, k, v, o, lse, do, causal, 1.0, SMALL_BWD), q, k, v, do, causal, 1.0)


def test_causal_equal_lengths_matches_torch_is_causal(device, gen):
    q, k, v = _inputs((1, 2, 2, 40, 40, 64), torch.float16, device, gen)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert rel_err(attention(q, k, v, causal=True), expected) <= BOUNDS[torch.float16][0]


def test_grouped_heads_equal_repeated_heads(device, gen):
    # Query head h reads key/value head h // 3: the same output as repeating each key/value head three times,
    # bit for bit (same tiles, same order), and dK, dV summed over each group.
    q, k, v = _inputs((1, 6, 2, 40, 40, 64), torch.bfloat16, device, gen)
    k_rep, v_rep = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    o, lse = attention_fwd(q, k, v, True, 0.125, SMALL)
    o_rep, lse_rep = attention_fwd(q, k_rep, v_rep, True, 0.125, SMALL)
    assert torch.equal(o, o_rep) and torch.equal(lse, lse_rep)
    do = _draw(o.shape, torch.bfloat16, device, gen)
    dq, dk, dv = attention_bwd(q, k, v, o, lse, do, True, 0.125, SMALL_BWD)
    dq_rep, dk_rep, dv_rep = attention_bwd(q, k_rep, v_rep, o, lse, do, True, 0.125, SMALL_BWD)
    assert torch.equal(dq, dq_rep)
    for got, rep in ((dk, dk_rep), (dv, dv_rep)):
        summed = rep.float().view(1, 2, 3, 40, 64).sum(2)
        assert rel_err(got, summed.double()) <= 1e-2


def test_backward_is_bitwise_reproducible(device, gen):
    q, k, v = _inputs((1, 4, 2, 40, 40, 64), torch.bfloat16, device, gen)
    o, lse = attention_fwd(q, k, v, True, 0.125, SMALL)
    do = _draw(o.shape, torch.bfloat16, device, gen)
    first = attention_bwd(q, k, v, o, lse, do, True, 0.125, SMALL_BWD)
    second = attention_bwd(q, k, v, o, lse, do, True, 0.125, SMALL_BWD)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_strided_inputs(device, gen):
    # (batch, seq, heads, head_dim) storage viewed as (batch, heads, seq, head_dim), and a head dim with a
    # non-unit stride (copied): the kernels take any strides above the last dimension.
    q = _draw((1, 30, 2, 64), torch.float16, device, gen).transpose(1, 2)
    k = _draw((1, 35, 2, 64), torch.float16, device, gen).transpose(1, 2)
    v = _draw((1, 35, 2, 128), torch.float16, device, gen).transpose(1, 2)[..., ::2]
    for causal in (False, True):
        o = attention(q, k, v, causal=causal)
        assert rel_err(o, reference.attention_float64(q, k, v, causal)) <= BOUNDS[torch.float16][0]
    q.requires_grad_()
    attention(q, k, v).backward(_draw((1, 30, 2, 64), torch.float16, device, gen).transpose(1, 2))
    assert q.grad.shape == q.shape and not torch.isnan(q.grad).any()


# ---------------------------------------------------------------------------------------------------------
# Rows that see no key, empty tensors
# ---------------------------------------------------------------------------------------------------------


def test_rows_that_see_no_key_give_zeros_and_minus_infinity(device, gen):
    # Causal, 50 queries, 20 keys, bottom-right: queries 0..29 see nothing, query 30 sees key 0.
    q, k, v = _inputs((1, 2, 1, 50, 20, 64), torch.bfloat16, device, gen)
    o, lse = attention_fwd(q, k, v, True, 0.125, SMALL)
    assert torch.equal(o[:, :, :30], torch.zeros_like(o[:, :, :30]))
    assert torch.equal(lse[:, :, :30], torch.full_like(lse[:, :, :30], -math.inf))
    assert torch.isfinite(lse[:, :, 30:]).all()
    torch.testing.assert_close(o[:, :, 30].float(), v[:, :, 0].expand(1, 2, 64).float(), rtol=0, atol=0)
    do = _draw(o.shape, torch.bfloat16, device, gen)
    dq, dk, dv = attention_bwd(q, k, v, o, lse, do, True, 0.125, SMALL_BWD)
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))
    assert torch.equal(dq[:, :, :30], torch.zeros_like(dq[:, :, :30]))
    _check_backward((dq, dk, dv), q, k, v, do, True)


@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_at_all(causal, device, gen):
    q, k, v = _inputs((2, 2, 1, 5, 0, 64), torch.float16, device, gen)
    q.requires_grad_()
    o, lse = attention_fwd(q.detach(), k, v, causal, 0.125)
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(lse, torch.full_like(lse, -math.inf))
    out = attention(q, k, v, causal=causal)
    out.backward(torch.ones_like(out))
    assert torch.equal(q.grad, torch.zeros_like(q))


def test_no_queries_and_no_heads(device, gen):
    q, k, v = _inputs((1, 2, 2, 0, 9, 64), torch.float16, device, gen)
    assert attention(q, k, v).shape == (1, 2, 0, 64)
    o, lse = attention_fwd(q, k, v, True, 0.125)
    dq, dk, dv = attention_bwd(q, k, v, o, lse, o, True, 0.125)
    assert torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(v)) and dq.shape == q.shape
    q, k, v = _inputs((3, 0, 0, 8, 8, 64), torch.float16, device, gen)
    assert attention(q, k, v, causal=True).shape == (3, 0, 8, 64)


# ---------------------------------------------------------------------------------------------------------
# Poisoned outputs: every element written, nothing written outside
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_every_output_element_written_and_nothing_outside(causal, device, gen):
    shape = (1, 4, 2, 37, 29, 64)
    q, k, v = _inputs(shape, torch.float16, device, gen)
    nan = float("nan")
    o_buf = torch.full((1, 4, 45, 64), nan, dtype=torch.float16, device=device)
    lse = torch.full((1, 4, 37), nan, device=device)
    o, lse = attention_fwd(q, k, v, causal, 0.125, SMALL, out=o_buf[:, :, 4:41], lse=lse)
    assert torch.isnan(o_buf[:, :, :4]).all() and torch.isnan(o_buf[:, :, 41:]).all()
    _check_forward(o, lse, q, k, v, causal, scale=0.125)
    do = _draw(o.shape, torch.float16, device, gen)
    bufs = [torch.full((t.shape[0], t.shape[1], t.shape[2] + 8, 64), nan, dtype=torch.float16, device=device)
            for t in (q, k, v)]
    grads = attention_bwd(q, k, v, o, lse, do, causal, 0.125, SMALL_BWD, out=tuple(b[:, :, 4:-4] for b in bufs))
    for buf in bufs:
        assert torch.isnan(buf[:, :, :4]).all() and torch.isnan(buf[:, :, -4:]).all()
    _check_backward(grads, q, k, v, do, causal, scale=0.125)


# ---------------------------------------------------------------------------------------------------------
# Properties and the references themselves
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s_q=st.integers(1, 40), s_k=st.integers(1, 40), group=st.sampled_from([1, 2]), causal=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_property_rows_are_convex_combinations_of_visible_values(s_q, s_k, group, causal, seed, device):
    g = torch.Generator().manual_seed(seed)
    q, k, v = _inputs((1, 2, 2 // group, s_q, s_k, 64), torch.float16, device, g, q_scale=3.0)
    o, lse = attention_fwd(q, k, v, causal, 0.125, SMALL)
    _check_forward(o, lse, q, k, v, causal, scale=0.125)
    visible = reference.causal_visible(s_q, s_k, device) if causal else torch.ones(s_q, s_k, dtype=torch.bool)
    v_rep = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).float()  # [1, H, Sk, D]
    hidden = ~visible.to(device)[None, None, :, :, None]
    high = v_rep[:, :, None].masked_fill(hidden, -math.inf).amax(3)
    low = v_rep[:, :, None].masked_fill(hidden, math.inf).amin(3)
    seen = visible.any(-1).to(device)[None, None, :, None]
    slack = 2e-3 * v.abs().max().float()
    assert (~seen | ((o.float() <= high + slack) & (o.float() >= low - slack))).all()


def test_key_order_does_not_matter_without_a_mask(device, gen):
    q, k, v = _inputs((1, 2, 2, 20, 45, 64), torch.float16, device, gen)
    perm = torch.randperm(45, generator=gen).to(device)
    o, _ = attention_fwd(q, k, v, False, 0.125, SMALL)
    o_perm, _ = attention_fwd(q, k[:, :, perm], v[:, :, perm], False, 0.125, SMALL)
    assert rel_err(o_perm, o.double()) <= BOUNDS[torch.float16][0]


def test_float64_references_agree_with_autograd(device, gen):
    # The chunked float64 forward and its hand-written backward against autograd through the unfused
    # reference: causal with rows that see nothing, grouped heads, chunks that split the rows unevenly.
    q, k, v = (t.double() for t in _inputs((2, 4, 2, 23, 17, 64), torch.float16, device, gen))
    do = _draw((2, 4, 23, 64), torch.float64, device, gen)
    for causal in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = reference.attention_reference(*leaves, causal=causal)
        o.backward(do)
        torch.testing.assert_close(reference.attention_float64(q, k, v, causal, query_chunk=5), o.detach())
        for got, leaf in zip(reference.attention_backward_float64(q, k, v, do, causal, query_chunk=7), leaves):
            torch.testing.assert_close(got, leaf.grad)


def test_the_gradient_floor_bites_only_where_the_terms_cancel(device, gen):
    # One key a row: dQ and dK are 0 in exact arithmetic and a rounding-sized error passes against the terms'
    # size. Many keys: the float64 gradients are far above the floor, so it never loosens the norm-wise bound.
    for s_k, degenerate in ((1, True), (17, False), (300, False)):
        q, k, v = _inputs((1, 2, 1, 40, s_k, 64), torch.bfloat16, device, gen)
        do = _draw(q.shape, torch.bfloat16, device, gen)
        grads = reference.attention_backward_float64(q, k, v, do, False)
        for ref, other in ((grads[0], k), (grads[1], q)):
            noisy = ref + 1e-6 * torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(device)
            floored = _error_against_terms(noisy, ref, other, v, do, None)
            assert (floored < rel_err(noisy, ref)) == degenerate, (s_k, floored, rel_err(noisy, ref))
            assert degenerate or floored > 2 * rel_err(noisy, ref)


# ---------------------------------------------------------------------------------------------------------
# The launch plan
# ---------------------------------------------------------------------------------------------------------

SMEM_BYTES = 227 * 1024  # an H100's shared memory per program


def _plan_smem(plan: AttentionPlan, head_dim: int) -> int:
    """Two-byte tiles the plan keeps in shared memory: the resident tile(s) plus num_stages of the two
    streamed ones."""
    resident, streamed = {"forward": (plan.block_m, plan.block_n), "backward_kv": (2 * plan.block_n, plan.block_m),
                          "backward_q": (2 * plan.block_m, plan.block_n)}[plan.direction]
    return 2 * head_dim * (resident + 2 * plan.num_stages * streamed)


def _accumulators_per_thread(plan: AttentionPlan, head_dim: int) -> int:
    rows = {"forward": plan.block_m, "backward_kv": 2 * plan.block_n, "backward_q": plan.block_m}[plan.direction]
    return rows * head_dim // (32 * plan.num_warps)


@pytest.mark.parametrize("direction", ["forward", "backward_kv", "backward_q"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_plan_is_the_table_entry_and_fits_an_h100(direction, head_dim, dtype, causal):
    plan = plan_attention(4096, head_dim, dtype, causal, direction)
    assert (plan.block_m, plan.block_n, plan.num_warps, plan.num_stages) == _TILES[direction, head_dim]
    assert plan.tma == (direction == "forward" and head_dim in _FORWARD_TMA_HEAD_DIMS) and not plan.warp_specialize
    assert _plan_smem(plan, head_dim) <= SMEM_BYTES
    # dK and dV of 128 keys at head_dim 128 hold 128 fp32 accumulators a thread: the fastest measured backward.
    assert _accumulators_per_thread(plan, head_dim) <= 128
    assert plan.as_dict()["direction"] == direction


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_short_key_threshold(head_dim, causal):
    """The D = 128 forward over at most SHORT_KEYS_MAX keys takes its short-key tile, by the key length (the
    query length where none is given); longer key sets and D = 64 take the table's."""
    for seq_q, seq_k in ((SHORT_KEYS_MAX, None), (4096, SHORT_KEYS_MAX), (SHORT_KEYS_MAX + 1, None),
                         (128, SHORT_KEYS_MAX + 1)):
        plan = plan_attention(seq_q, head_dim, torch.bfloat16, causal, seq_k=seq_k)
        short = (seq_q if seq_k is None else seq_k) <= SHORT_KEYS_MAX and head_dim in _SHORT_KEYS_TILE
        want = _SHORT_KEYS_TILE[head_dim] if short else _TILES["forward", head_dim]
        assert (plan.block_m, plan.block_n, plan.num_warps, plan.num_stages) == want, (seq_q, seq_k)
        assert plan.tma and _plan_smem(plan, head_dim) <= SMEM_BYTES


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_short_query_threshold(head_dim):
    short = plan_attention(SHORT_QUERY_MAX, head_dim, torch.bfloat16, False, seq_k=4096)
    long = plan_attention(SHORT_QUERY_MAX + 1, head_dim, torch.bfloat16, False, seq_k=4096)
    assert (short.block_m, short.num_warps) == (64, 4)
    assert (long.block_m, long.num_warps) == _TILES["forward", head_dim][::2]
    # The backward keeps its tiles at any length.
    assert plan_attention_backward(1, head_dim, torch.bfloat16, True) == plan_attention_backward(
        10**6, head_dim, torch.bfloat16, True)


def test_plan_refuses_what_the_kernels_do_not_run():
    with pytest.raises(ValueError, match="direction must be one of 'forward', 'backward_kv', 'backward_q'"):
        plan_attention(8, 64, torch.float16, False, "sideways")
    with pytest.raises(ValueError, match="head_dim 96 is not supported; supported head dims are 64, 128"):
        plan_attention(8, 96, torch.float16, False)
    with pytest.raises(TypeError, match="dtype float32 is not supported"):
        plan_attention(8, 64, torch.float32, False)


def test_the_public_function_runs_the_planned_tiles(device, gen, monkeypatch):
    module = importlib.import_module("kernels.attention")  # `kernels.attention` the attribute is the function

    seen = []
    real = module.attention_fwd
    def spy(q, k, v, causal, scale, plan=None, **kw):
        seen.append(plan)
        return real(q, k, v, causal, scale, plan, **kw)

    monkeypatch.setattr(module, "attention_fwd", spy)
    q, k, v = _inputs((1, 1, 1, 20, 20, 64), torch.float16, device, gen)
    attention(q, k, v)
    assert seen == [None]  # None: attention_fwd asks plan_attention, tested above
    assert kernels.attention is attention


# ---------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------


def _ok(device, **kw):
    shapes = {"q": (1, 4, 8, 64), "k": (1, 2, 8, 64), "v": (1, 2, 8, 64)}
    tensors = {n: torch.zeros(s, dtype=torch.float16, device=device) for n, s in shapes.items()}
    tensors.update(kw)
    return tensors


@pytest.mark.parametrize("change,error,message", [
    (lambda d: {"q": [1.0]}, TypeError, "q must be a torch.Tensor, got list"),
    (lambda d: {"k": torch.zeros(2, 8, 64, device=d)}, ValueError,
     r"k has 3 dimensions \(shape \(2, 8, 64\)\); expected 4: \(batch, heads, seq, head_dim\)"),
    (lambda d: {n: t.float() for n, t in _ok(d).items()}, TypeError,
     "q has dtype float32; supported dtypes are float16, bfloat16"),
    (lambda d: {"v": torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16, device=d)}, TypeError,
     "q, k and v must share one dtype, got q float16, k float16, v bfloat16"),
    (lambda d: {"v": torch.zeros(1, 2, 9, 64, dtype=torch.float16, device=d)}, ValueError,
     r"k and v must have the same shape, got k \(1, 2, 8, 64\) and v \(1, 2, 9, 64\)"),
    (lambda d: {n: torch.zeros(2, 2, 8, 64, dtype=torch.float16, device=d) for n in "kv"}, ValueError,
     "q has batch 1 and k, v have batch 2"),
    (lambda d: {n: torch.zeros(1, 2, 8, 128, dtype=torch.float16, device=d) for n in "kv"}, ValueError,
     "q has head_dim 64 and k, v have head_dim 128"),
    (lambda d: {n: torch.zeros(1, 2 if n != "q" else 4, 8, 96, dtype=torch.float16, device=d) for n in "qkv"},
     ValueError, "head_dim 96 is not supported; supported head dims are 64, 128"),
    (lambda d: {n: torch.zeros(1, 3, 8, 64, dtype=torch.float16, device=d) for n in "kv"}, ValueError,
     r"q has 4 heads and k, v have 3; the key/value heads must divide the query heads"),
])
def test_bad_tensors_are_named_with_what_is_accepted(change, error, message, device):
    with pytest.raises(error, match=message):
        attention(**_ok(device, **change(device)))


def test_bad_flags(device):
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        attention(**_ok(device), causal=1)
    with pytest.raises(TypeError, match="scale must be a real number or None, got str"):
        attention(**_ok(device), scale="0.1")
    with pytest.raises(ValueError, match="scale must be finite and >= 0, got inf"):
        attention(**_ok(device), scale=math.inf)
    with pytest.raises(ValueError, match="scale must be finite and >= 0, got -0.5"):
        attention(**_ok(device), scale=-0.5)


def test_cpu_tensors_without_the_interpreter_name_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        attention(**_ok("cpu"))


@pytest.mark.parametrize("warp_specialize", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_tensor_descriptor_loads_match_pointer_loads(causal, warp_specialize, device, gen):
    # The forward's TMA option loads K and V through tensor descriptors, which zero-fill past seq_k: the
    # same tiles as the masked pointer loads, so the same output bit for bit.
    q, k, v = _inputs((1, 4, 2, 37, 29, 64), torch.bfloat16, device, gen)
    tma = AttentionPlan("forward", 16, 16, 4, 1, tma=True, warp_specialize=warp_specialize)
    o, lse = attention_fwd(q, k, v, causal, 0.125, tma)
    o_ptr, lse_ptr = attention_fwd(q, k, v, causal, 0.125, SMALL)
    assert torch.equal(o, o_ptr) and torch.equal(lse, lse_ptr)
