"""kernels.attention's key mask: forward, lse and gradients against the float64 references (and torch's SDPA
math path given the same boolean mask), with tests/test_attention.py's bounds; rows that see no key (zeros,
lse -inf, zero gradients, never NaN); hidden keys whose huge scores must not reach the running maximum;
masks that hide nothing against no mask; masks of any strides; every error the argument can raise.

Masks are (batch, seq_k) bool, True where the key takes part. Shapes are small and the tiles 16 wide, so
holes and padding fall inside tiles, across tiles and over whole tiles.
"""

from __future__ import annotations

import math

import pytest
import torch
from accuracy import rel_err
from cases import grid
from test_attention import BOUNDS, SMALL, SMALL_BWD, _check_backward, _check_forward, _draw, _inputs

from kernels import reference_attention as reference
from kernels.attention import AttentionPlan, attention, attention_bwd, attention_fwd


def _holes(batch, seq_k, gen, device):
    """Random holes (about a third of the keys hidden); the last batch hides every key."""
    mask = torch.rand(batch, seq_k, generator=gen) > 0.35
    mask[-1] = False
    return mask.to(device)


def _padding(lengths, seq_k, device):
    """Batch b keeps its first lengths[b] keys and hides the tail (right padding)."""
    return (torch.arange(seq_k)[None, :] < torch.tensor(lengths)[:, None]).to(device)


#        (batch, heads, kv_heads, seq_q, seq_k, head_dim), the mask
MASKED = [
    ((2, 2, 1, 37, 53, 64), "holes"),  # grouped heads, ragged lengths; batch 1 sees nothing
    ((2, 2, 2, 33, 45, 128), "padding"),  # batch 0 keeps 29 keys (the last tile and part of one hidden), batch 1 7
]


def _mask(kind, shape, gen, device):
    batch, seq_k = shape[0], shape[4]
    return _holes(batch, seq_k, gen, device) if kind == "holes" else _padding([29, 7], seq_k, device)


@pytest.mark.parametrize("dtype, causal, shape, kind", [(d, c, *m) for d, c, m in grid(list(BOUNDS), [False, True], MASKED)],
                         ids=str)
def test_masked_forward_and_backward_match_float64(dtype, causal, shape, kind, device, gen):
    q, k, v = _inputs(shape, dtype, device, gen)
    key_mask = _mask(kind, shape, gen, device)
    scale = 1 / math.sqrt(shape[-1])
    o, lse = attention_fwd(q, k, v, causal, scale, SMALL, key_mask=key_mask)
    _check_forward(o, lse, q, k, v, causal, key_mask=key_mask)
    do = _draw(o.shape, dtype, device, gen)
    grads = attention_bwd(q, k, v, o, lse, do, causal, scale, SMALL_BWD, key_mask=key_mask)
    _check_backward(grads, q, k, v, do, causal, key_mask=key_mask)
    if kind == "holes":  # batch 1 sees no key: zeros and -inf, exactly, and no gradient anywhere in it
        assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.equal(lse[1], torch.full_like(lse[1], -math.inf))
        assert all(torch.equal(g[1], torch.zeros_like(g[1])) for g in grads)


def test_public_function_with_the_default_plans(device, gen):
    # The plans attention() runs (on a GPU, head dim 128's forward through tensor descriptors): full and
    # ragged key tiles, padding inside and across them.
    q, k, v = (t.requires_grad_() for t in _inputs((1, 2, 1, 40, 150, 128), torch.bfloat16, device, gen))
    key_mask = _padding([100], 150, device)
    o = attention(q, k, v, causal=True, key_mask=key_mask)
    o_fwd, lse = attention_fwd(q.detach(), k.detach(), v.detach(), True, 128**-0.5, key_mask=key_mask)
    assert torch.equal(o.detach(), o_fwd)
    _check_forward(o.detach(), lse, q.detach(), k.detach(), v.detach(), True, key_mask=key_mask)
    do = _draw(o.shape, torch.bfloat16, device, gen)
    o.backward(do)
    _check_backward((q.grad, k.grad, v.grad), q.detach(), k.detach(), v.detach(), do, True, key_mask=key_mask)


def test_rows_that_see_no_key_and_hidden_keys_with_huge_scores(device, gen):
    # Causal, 40 queries over 40 keys. Batch 0 hides keys 0..19: queries 0..19 see no key at all (the keys
    # the causal mask leaves them are all hidden). Batch 1 hides every key. Every hidden key holds huge K and
    # V (scores far past exp's range, were they not hidden before the running maximum), and every output
    # buffer starts as NaN, which must all be overwritten.
    q, k, v = _inputs((2, 2, 1, 40, 40, 64), torch.float16, device, gen)
    key_mask = torch.ones(2, 40, dtype=torch.bool, device=device)
    key_mask[0, :20] = False
    key_mask[1] = False
    hidden = ~key_mask[:, None, :, None]
    k_big, v_big = k.masked_fill(hidden, 3e4), v.masked_fill(hidden, -3e4)
    o = torch.full_like(q, math.nan)
    lse = torch.full(q.shape[:3], math.nan, device=device)
    attention_fwd(q, k_big, v_big, True, 0.125, SMALL, o, lse, key_mask=key_mask)
    _check_forward(o, lse, q, k, v, True, scale=0.125, key_mask=key_mask)
    for rows in (o[0, :, :20], o[1]):
        assert torch.equal(rows, torch.zeros_like(rows))
    assert torch.isneginf(lse[0, :, :20]).all() and torch.isneginf(lse[1]).all() and torch.isfinite(lse[0, :, 20:]).all()
    do = _draw(o.shape, torch.float16, device, gen)
    grads = tuple(torch.full_like(t, math.nan) for t in (q, k, v))
    attention_bwd(q, k_big, v_big, o, lse, do, True, 0.125, SMALL_BWD, grads, key_mask=key_mask)
    _check_backward(grads, q, k, v, do, True, scale=0.125, key_mask=key_mask)
    dq, dk, dv = grads
    assert torch.equal(dq[0, :, :20], torch.zeros_like(dq[0, :, :20])) and torch.equal(dq[1], torch.zeros_like(dq[1]))
    for g in (dk, dv):  # hidden keys get no gradient
        assert torch.equal(g.masked_select(hidden), torch.zeros_like(g.masked_select(hidden)))


@pytest.mark.parametrize("causal", [False, True])
def test_a_mask_that_hides_nothing_is_the_unmasked_path(causal, device, gen):
    # The masked path compares where the unmasked one does not, but takes the same products in the same
    # order: an all-True mask, in any layout (here broadcast over the batch, or a strided view), gives the
    # unmasked results bit for bit under the interpreter. Compiled, the unmasked tiles may fuse the score's
    # scaling into the exponent's subtraction (one rounding fewer), so there they agree to far inside the
    # bounds.
    q, k, v = _inputs((2, 2, 1, 37, 29, 64), torch.bfloat16, device, gen)
    o, lse = attention_fwd(q, k, v, causal, 0.125, SMALL)
    do = _draw(o.shape, torch.bfloat16, device, gen)
    grads = attention_bwd(q, k, v, o, lse, do, causal, 0.125, SMALL_BWD)
    if causal:
        key_mask = torch.ones(29, 4, dtype=torch.bool, device=device)[:, ::2].t()  # strides (2, 4)
    else:
        key_mask = torch.ones(29, dtype=torch.bool, device=device).expand(2, 29)  # strides (0, 1)
    o_m, lse_m = attention_fwd(q, k, v, causal, 0.125, SMALL, key_mask=key_mask)
    grads_m = attention_bwd(q, k, v, o, lse, do, causal, 0.125, SMALL_BWD, key_mask=key_mask)
    if device == "cpu":
        assert torch.equal(o_m, o) and torch.equal(lse_m, lse)
        assert all(torch.equal(a, b) for a, b in zip(grads_m, grads))
    else:
        assert rel_err(o_m, o.double()) <= BOUNDS[torch.bfloat16][0] / 10
        torch.testing.assert_close(lse_m, lse, rtol=0, atol=1e-5)
        assert all(rel_err(a, b.double()) <= BOUNDS[torch.bfloat16][1] / 10 for a, b in zip(grads_m, grads))


def test_a_strided_mask_reads_like_its_contiguous_copy(device, gen):
    q, k, v = _inputs((2, 2, 2, 20, 37, 64), torch.float16, device, gen)
    wide = torch.rand(37, 6, generator=gen).to(device) > 0.4
    key_mask = wide[:, 1::3].t()  # (2, 37), strides (3, 6)
    o, lse = attention_fwd(q, k, v, False, 0.125, SMALL, key_mask=key_mask)
    o_c, lse_c = attention_fwd(q, k, v, False, 0.125, SMALL, key_mask=key_mask.contiguous())
    assert torch.equal(o, o_c) and torch.equal(lse, lse_c)


@pytest.mark.parametrize("warp_specialize", [False, True])
def test_tensor_descriptor_loads_with_a_mask_match_pointer_loads(warp_specialize, device, gen):
    # On a GPU, head dim 128 loads K and V through tensor descriptors (the masked launch without warp
    # specialisation): the same tiles as the pointer loads, the same hidden scores, the same output.
    q, k, v = _inputs((2, 4, 2, 37, 45, 128), torch.bfloat16, device, gen)
    key_mask = _holes(2, 45, gen, device)
    k = k.masked_fill(~key_mask[:, None, :, None], 3e4)
    tma = AttentionPlan("forward", 16, 16, 4, 1, tma=True, warp_specialize=warp_specialize)
    o, lse = attention_fwd(q, k, v, True, 0.125, tma, key_mask=key_mask)
    o_ptr, lse_ptr = attention_fwd(q, k, v, True, 0.125, SMALL, key_mask=key_mask)
    assert torch.equal(o, o_ptr) and torch.equal(lse, lse_ptr) and not torch.isnan(o).any()


def test_references_define_rows_that_see_no_key_as_zeros(device, gen):
    # The unfused reference, the float64 forward and its hand-written backward against autograd through the
    # unfused one, under a key mask with holes, a batch that sees nothing and causal rows that see nothing.
    q, k, v = (t.double() for t in _inputs((2, 4, 2, 23, 17, 64), torch.float16, device, gen))
    do = _draw((2, 4, 23, 64), torch.float64, device, gen)
    key_mask = _holes(2, 17, gen, device)
    for causal in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o, lse = reference.attention_reference(*leaves, causal=causal, return_lse=True, key_mask=key_mask)
        assert not torch.isnan(o).any() and torch.equal(o[1], torch.zeros_like(o[1])) and torch.isneginf(lse[1]).all()
        o.backward(do)
        torch.testing.assert_close(reference.attention_float64(q, k, v, causal, query_chunk=5, key_mask=key_mask),
                                   o.detach())
        expected = reference.attention_backward_float64(q, k, v, do, causal, query_chunk=7, key_mask=key_mask)
        for got, leaf in zip(expected, leaves):
            assert not torch.isnan(leaf.grad).any()
            torch.testing.assert_close(got, leaf.grad)
        assert torch.equal(expected[0][1], torch.zeros_like(expected[0][1]))


def test_no_keys_at_all_with_a_mask(device, gen):
    q, k, v = _inputs((2, 2, 1, 5, 0, 64), torch.float16, device, gen)
    q.requires_grad_()
    out = attention(q, k, v, key_mask=torch.zeros(2, 0, dtype=torch.bool, device=device))
    assert torch.equal(out, torch.zeros_like(out))
    out.backward(torch.ones_like(out))
    assert torch.equal(q.grad, torch.zeros_like(q))


# ---------------------------------------------------------------------------------------------------------
# Bad masks
# ---------------------------------------------------------------------------------------------------------


def _qkv(device):
    q = torch.zeros(2, 4, 8, 64, dtype=torch.float16, device=device)
    kv = torch.zeros(2, 2, 9, 64, dtype=torch.float16, device=device)
    return q, kv, kv


@pytest.mark.parametrize("key_mask,error,message", [
    ([[True] * 9] * 2, TypeError,
     r"key_mask must be None or a bool tensor of shape \(batch, seq_k\), True where the key takes part; got list"),
    (torch.ones(2, 9, dtype=torch.uint8), TypeError,
     r"key_mask has dtype uint8; accepted is a bool tensor of shape \(batch, seq_k\), True where the key takes part"),
    (torch.ones(2, 9), TypeError, "key_mask has dtype float32; accepted is a bool tensor"),
    (torch.ones(2, 8, dtype=torch.bool), ValueError,
     r"key_mask has shape \(2, 8\); expected \(batch, seq_k\) = \(2, 9\) from q's batch and k's sequence length"),
    (torch.ones(9, dtype=torch.bool), ValueError, r"key_mask has shape \(9,\); expected \(batch, seq_k\) = \(2, 9\)"),
    (torch.ones(2, 1, 9, dtype=torch.bool), ValueError, r"key_mask has shape \(2, 1, 9\); expected"),
], ids=["list", "uint8", "float32", "seq_q-not-seq_k", "1-d", "3-d"])
def test_bad_masks_are_named_with_what_is_accepted(key_mask, error, message, device):
    if isinstance(key_mask, torch.Tensor):
        key_mask = key_mask.to(device)
    with pytest.raises(error, match=message):
        attention(*_qkv(device), key_mask=key_mask)


def test_a_mask_on_another_device(device):
    with pytest.raises(RuntimeError, match=f"key_mask is on device 'meta' and q on '{device}"):
        attention(*_qkv(device), key_mask=torch.ones(2, 9, dtype=torch.bool, device="meta"))


def test_a_mask_changes_no_existing_check(device):
    # The tensors are checked first, with their own messages, whatever the mask.
    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="q has batch 2 and k, v have batch 1"):
        attention(q, k[:1], v[:1], key_mask=torch.ones(2, 9, dtype=torch.bool, device=device))
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        attention(q, k, v, causal=1, key_mask=torch.ones(2, 9))
