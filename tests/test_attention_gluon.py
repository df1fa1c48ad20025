"""kernels/attention_gluon.py, the Hopper forward in Gluon: against float64 (tests/test_attention.py's bounds
and checks), on the GPU only; the choice between it and the Triton forward, and its sm_90 build, anywhere.

On the GPU (compute capability 9.x): causal and not, head dims 64 and 128, bf16 and fp16, grouped heads,
batch > 1, sequence lengths 1, 17, 127, 1000 and 2049 (tails inside and across 128-key tiles), more queries
than keys (causal rows that see no key), the key mask (holes, a batch that sees nothing), outputs poisoned
with NaN before the launch, and gradients through the Triton backward from the Gluon forward's lse.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from test_attention import BOUNDS, _check_backward, _check_forward, _draw, _inputs
from warm_python import run_python

from kernels.attention import attention, attention_bwd, attention_fwd, choose_forward_impl, plan_attention

attn = importlib.import_module("kernels.attention")  # the module (kernels.attention is also the function)
ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
gpu = pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward runs on Hopper GPUs (sm_90) only; "
                         "Triton's interpreter does not run Gluon")

#        (batch, heads, kv_heads, seq_q, seq_k, head_dim)
SHAPES = [
    (1, 2, 2, 1, 1, 64),
    (2, 2, 1, 17, 17, 128),
    (1, 2, 2, 127, 127, 64),
    (2, 4, 2, 1000, 1000, 128),
    (1, 2, 1, 2049, 2049, 64),
    (1, 2, 2, 100, 300, 128),  # more keys than queries
    (1, 4, 2, 300, 100, 64),  # more queries than keys: causal rows that see no key
    (2, 2, 2, 256, 256, 128),  # whole tiles
]


def _gluon_fwd(q, k, v, causal, scale, key_mask=None):
    o = torch.full_like(q, math.nan)  # poisoned: every row must be written
    lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
    return attention_fwd(q, k, v, causal, scale, out=o, lse=lse, key_mask=key_mask, impl="gluon")


@gpu
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
def test_forward_matches_float64(dtype, causal, shape, gen):
    q, k, v = _inputs(shape, dtype, "cuda", gen)
    o, lse = _gluon_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]))
    _check_forward(o, lse, q, k, v, causal)


@gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_key_mask_and_rows_that_see_no_key(head_dim, causal, gen):
    shape = (3, 2, 1, 200, 333, head_dim)
    q, k, v = _inputs(shape, torch.bfloat16, "cuda", gen)
    mask = torch.rand(3, 333, generator=gen) > 0.35
    mask[1, 150:] = False  # padding: the last key tiles of batch 1 are wholly hidden
    mask[2] = False  # batch 2 sees no key at all
    mask = mask.cuda()
    o, lse = _gluon_fwd(q, k, v, causal, 1 / math.sqrt(head_dim), key_mask=mask)
    _check_forward(o, lse, q, k, v, causal, key_mask=mask)
    assert torch.equal(o[2], torch.zeros_like(o[2])) and bool((lse[2] == -math.inf).all())


@gpu
def test_hidden_keys_with_huge_scores_do_not_reach_the_maximum(gen):
    q, k, v = _inputs((1, 2, 2, 130, 260, 128), torch.float16, "cuda", gen)
    k[:, :, 200:] *= 1000  # huge scores on keys the mask hides
    mask = torch.ones(1, 260, dtype=torch.bool, device="cuda")
    mask[:, 200:] = False
    o, lse = _gluon_fwd(q, k, v, False, 0.125, key_mask=mask)
    _check_forward(o, lse, q, k, v, False, scale=0.125, key_mask=mask)


@gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
def test_gradients_through_the_triton_backward(dtype, causal, gen):
    shape = (2, 4, 2, 333, 333, 128 if dtype == torch.bfloat16 else 64)
    q, k, v = _inputs(shape, dtype, "cuda", gen)
    do = _draw(q.shape, dtype, "cuda", gen)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, causal=causal, impl="gluon")
    out.backward(do)
    _check_backward([t.grad for t in leaves], q, k, v, do, causal)
    o, lse = _gluon_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]))
    o_t, lse_t = attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), impl="triton")
    assert torch.allclose(lse, lse_t, rtol=0, atol=2e-5)  # the same lse: either forward feeds the backward
    grads = attention_bwd(q, k, v, o, lse, do, causal, 1 / math.sqrt(shape[-1]))
    assert all(torch.equal(g, t.grad) for g, t in zip(grads, leaves))


@gpu
@pytest.mark.parametrize("tiles", [(64, 2), (64, 1), (128, 1)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[-1] == 64] + [(3, 16, 4, 1500, 1700, 64)], ids=str)
def test_head_dim_64_at_either_tile(shape, causal, tiles, gen):
    # Head dim 64 runs 64-key tiles two programs an SM or 128-key tiles one program an SM by the plan's key count
    # (kernels/attention_choice.py); each, and 64-key tiles one program an SM, against float64 at every shape,
    # with and without a key mask, into NaN-poisoned outputs.
    from dataclasses import replace

    plan = replace(plan_attention(shape[3], 64, torch.bfloat16, causal, seq_k=shape[4], impl="gluon"),
                   block_n=tiles[0], programs_per_sm=tiles[1])
    q, k, v = _inputs(shape, torch.bfloat16, "cuda", gen)
    o = torch.full_like(q, math.nan)
    lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
    attention_fwd(q, k, v, causal, 0.125, plan, out=o, lse=lse)
    _check_forward(o, lse, q, k, v, causal)
    mask = torch.rand(shape[0], shape[4], generator=gen) > 0.35
    mask[0] = False
    mask = mask.cuda()
    o.fill_(math.nan)
    lse.fill_(math.nan)
    attention_fwd(q, k, v, causal, 0.125, plan, out=o, lse=lse, key_mask=mask)
    _check_forward(o, lse, q, k, v, causal, key_mask=mask)
    assert torch.equal(o[0], torch.zeros_like(o[0])) and bool((lse[0] == -math.inf).all())


@gpu
@pytest.mark.parametrize("prefetch_q,on_demand", [(True, False), (False, False), (True, True), (False, True)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(4, 8, 2, 2049, 2049, 128), (3, 16, 4, 1500, 1700, 64), (8, 8, 8, 777, 300, 128)],
                         ids=str)
def test_the_persistent_grid(shape, causal, prefetch_q, on_demand, gen):
    # More query tiles than the GPU has SMs: each program walks several (causal ones of different lengths),
    # carrying its K/V ring and Q barrier phases from one tile to the next; then a key mask over many tiles.
    # With one Q buffer (prefetch_q False) the next tile's Q waits for both consumers to finish the last; on
    # demand, each program takes its next tile from a counter.
    from dataclasses import replace

    plan = replace(plan_attention(shape[3], shape[-1], torch.bfloat16, causal, impl="gluon"), persistent=True,
                   prefetch_q=prefetch_q, on_demand=on_demand)
    q, k, v = _inputs(shape, torch.bfloat16, "cuda", gen)
    assert 2 * torch.cuda.get_device_properties(0).multi_processor_count < (shape[3] + 127) // 128 * shape[0] * shape[1]
    o = torch.full_like(q, math.nan)
    lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
    attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), plan, out=o, lse=lse)
    _check_forward(o, lse, q, k, v, causal)
    mask = torch.rand(shape[0], shape[4], generator=gen) > 0.35
    mask[1, 150:] = False
    mask[2] = False
    mask = mask.cuda()
    o.fill_(math.nan)
    attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), plan, out=o, lse=lse, key_mask=mask)
    _check_forward(o, lse, q, k, v, causal, key_mask=mask)
    assert torch.equal(o[2], torch.zeros_like(o[2])) and bool((lse[2] == -math.inf).all())


@gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, dtype", [((2, 4, 2, 1000, 1000, 128), torch.bfloat16),
                                          ((1, 2, 2, 1, 1, 128), torch.bfloat16),  # dQ is 0 but for rounding
                                          ((1, 4, 2, 300, 100, 64), torch.float16),
                                          ((1, 2, 2, 100, 300, 128), torch.bfloat16)], ids=str)
def test_the_gluon_backward_kernels(shape, dtype, causal, gen):
    # The backward with kernels/attention_bwd_gluon.py's dK/dV and then also kernels/attention_bwd_q_gluon.py's dQ
    # (asked for by plan), against float64; with Triton's dQ kernel, dQ matches the Triton backward's bit for bit.
    q, k, v = _inputs(shape, dtype, "cuda", gen)
    do = _draw(q.shape, dtype, "cuda", gen)
    scale = 1 / math.sqrt(shape[-1])
    o, lse = attention_fwd(q, k, v, causal, scale, impl="triton")
    kv = plan_attention(shape[3], shape[-1], dtype, causal, "backward_kv", impl="gluon")
    for dq_impl in ("triton", "gluon"):
        plans = (kv, plan_attention(shape[3], shape[-1], dtype, causal, "backward_q", impl=dq_impl))
        grads = tuple(torch.full_like(t, math.nan) for t in (q, k, v))
        attention_bwd(q, k, v, o, lse, do, causal, scale, plans, out=grads)
        _check_backward(grads, q, k, v, do, causal)
        if dq_impl == "triton":
            assert torch.equal(grads[0], attention_bwd(q, k, v, o, lse, do, causal, scale)[0])


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_autograd_takes_the_gluon_backward_from_1024(causal, gen, monkeypatch):
    # attention()'s backward through choose_backward_impl: at 1,100 queries and keys Gluon's kernels, at 1,000
    # Triton's (the plans attention_bwd is handed say which); a zero-stride dO (the gradient of a sum) is made
    # contiguous, not refused.
    handed = []
    run_backward = attn.attention_bwd
    monkeypatch.setattr(attn, "attention_bwd", lambda *a, **kw: handed.append(a[8]) or run_backward(*a, **kw))
    for seq, expected in ((1100, "gluon"), (1000, "triton")):
        q, k, v = (t.requires_grad_() for t in _inputs((1, 4, 2, seq, seq, 128), torch.bfloat16, "cuda", gen))
        do = _draw(q.shape, torch.bfloat16, "cuda", gen)
        assert attn.backward_impl(q, k, v, do) == expected
        attention(q, k, v, causal=causal).backward(do)
        assert [p.impl for p in handed.pop()] == [expected, expected]
        _check_backward((q.grad, k.grad, v.grad), q, k, v, do, causal)
        q.grad = None
        attention(q, k, v, causal=causal).sum().backward()
        assert [p.impl for p in handed.pop()] == [expected, expected] and torch.isfinite(q.grad).all()


@gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, dtype", [((2, 4, 2, 1000, 1000, 64), torch.bfloat16),
                                          ((1, 2, 1, 2049, 2049, 128), torch.float16),
                                          ((2, 2, 2, 100, 1300, 64), torch.float16)], ids=str)
def test_exponentials_split_between_the_mufu_and_the_fma_pipe(shape, dtype, causal, gen):
    # The exp_split plan option: half of each unmasked tile's exponentials from a polynomial; the same bounds
    # as the plan, lse within 2e-5 of float64's.
    from dataclasses import replace

    plan = replace(plan_attention(shape[3], shape[-1], dtype, causal, impl="gluon"), exp_split=True)
    q, k, v = _inputs(shape, dtype, "cuda", gen)
    o = torch.full_like(q, math.nan)
    lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
    attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), plan, out=o, lse=lse)
    _check_forward(o, lse, q, k, v, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 4, 4, 1000, 1500, 128), (1, 8, 2, 777, 777, 64), (3, 4, 4, 1500, 900, 128),
                                   (1, 3, 3, 33, 5000, 128), (1, 2, 2, 130, 128, 128), (16, 16, 16, 1024, 1024, 128)],
                         ids=str)
@gpu
def test_tiles_on_demand_equal_one_program_a_tile(shape, causal, gen):
    # The tiles' order changes which SM runs a tile, never a tile's arithmetic: O and lse equal the one-program-
    # a-tile launch's bit for bit, launch after launch (each zeroes its own counter), with and without a key mask.
    from dataclasses import replace

    q, k, v = _inputs(shape, torch.bfloat16, "cuda", gen)
    scale = 1 / math.sqrt(shape[-1])
    base = plan_attention(shape[3], shape[-1], torch.bfloat16, causal, seq_k=shape[4], impl="gluon")
    one = replace(base, persistent=False, prefetch_q=True, on_demand=False)
    dyn = replace(base, persistent=True, prefetch_q=True, on_demand=True)
    mask = (torch.rand(shape[0], shape[4], generator=gen) > 0.3).cuda()
    for key_mask in (None, mask):
        o_one, lse_one = attention_fwd(q, k, v, causal, scale, one, key_mask=key_mask)
        for _ in range(3):
            o = torch.full_like(q, math.nan)
            lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
            attention_fwd(q, k, v, causal, scale, dyn, out=o, lse=lse, key_mask=key_mask)
            assert torch.equal(o, o_one) and torch.equal(lse, lse_one)


@gpu
def test_tiles_on_demand_on_two_streams_and_in_a_cuda_graph(gen):
    # Each launch zeroes a counter of its own: launches on two streams at once do not take each other's tiles,
    # and a captured launch replays with its counter zeroed again.
    from dataclasses import replace

    shape = (4, 16, 16, 2048, 2048, 128)
    plan = replace(plan_attention(2048, 128, torch.bfloat16, True, impl="gluon"), persistent=True, on_demand=True)
    inputs = [_inputs(shape, torch.bfloat16, "cuda", gen) for _ in range(2)]
    expected = [attention_fwd(q, k, v, True, 1 / math.sqrt(128), plan)[0] for q, k, v in inputs]
    streams = [torch.cuda.Stream() for _ in inputs]
    torch.cuda.synchronize()
    for _ in range(3):
        outs = []
        for stream, (q, k, v) in zip(streams, inputs):
            with torch.cuda.stream(stream):
                outs.append(attention_fwd(q, k, v, True, 1 / math.sqrt(128), plan)[0])
        torch.cuda.synchronize()
        assert all(torch.equal(o, e) for o, e in zip(outs, expected))
    q, k, v = inputs[0]
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention_fwd(q, k, v, True, 1 / math.sqrt(128), plan)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=side):
            o_graph = attention_fwd(q, k, v, True, 1 / math.sqrt(128), plan)[0]
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        o_graph.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o_graph, expected[0])


@pytest.mark.skipif(not attn.gluon_imports(), reason="this Triton has no Gluon for Hopper")
def test_tiles_on_demand_need_the_persistent_grid():
    kernels = importlib.import_module("kernels.attention_gluon")
    q = torch.empty(1, 1, 256, 128, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(1, 1, 256, dtype=torch.float32, device="meta")
    counter = torch.empty(1, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="need the persistent grid"):
        kernels.launch_args(q, q, q, q, lse, True, 0.1, 2, counter=counter)
    with pytest.raises(ValueError, match="needs persistent=True"):
        kernels.attention_fwd_gluon(q, q, q, q, lse, True, 0.1, 2, on_demand=True)


@gpu
def test_strided_inputs_and_a_strided_output(gen):
    # (batch, seq, heads, head_dim) storage viewed as (batch, heads, seq, head_dim), as models hold it.
    q, k, v = (_draw((2, 300, 4, 64), torch.bfloat16, "cuda", gen).transpose(1, 2) for _ in range(3))
    o_buf = torch.full((2, 4, 310, 64), math.nan, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 4, 300, device="cuda")
    o, lse = attention_fwd(q, k, v, True, 0.125, out=o_buf[:, :, 5:305], lse=lse, impl="gluon")
    _check_forward(o, lse, q, k, v, True, scale=0.125)
    assert torch.isnan(o_buf[:, :, :5]).all() and torch.isnan(o_buf[:, :, 305:]).all()  # nothing else written


# ---------------------------------------------------------------------------------------------------------
# The choice (pure) and the plan, anywhere
# ---------------------------------------------------------------------------------------------------------

HOPPER = (9, 0)
#        impl, capability, gluon imports, head_dim, dtype, descriptors fit, interpreter, seq_q, seq_k, causal -> kernel
CHOICES = [
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 4096, 4096, True, "gluon"),
    ("auto", HOPPER, True, 128, torch.float16, True, False, 2048, 2048, True, "gluon"),
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 1024, 1024, True, "triton"),  # causal, short
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 512, 512, False, "gluon"),  # no mask: from 512 keys
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 511, 511, False, "triton"),  # shorter: not timed
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 64, 8192, False, "triton"),  # decode-like query block
    ("auto", HOPPER, True, 64, torch.bfloat16, True, False, 1024, 1024, False, "gluon"),  # head dim 64, no mask
    ("auto", HOPPER, True, 64, torch.bfloat16, True, False, 1024, 1023, False, "triton"),
    ("auto", HOPPER, True, 64, torch.bfloat16, True, False, 8192, 8192, True, "gluon"),  # head dim 64, causal
    ("auto", HOPPER, True, 64, torch.bfloat16, True, False, 1024, 1024, True, "gluon"),  # from 1,024 keys
    ("auto", HOPPER, True, 64, torch.bfloat16, True, False, 1023, 1023, True, "triton"),
    ("auto", (8, 0), True, 128, torch.bfloat16, True, False, 4096, 4096, False, "triton"),  # Ampere
    ("auto", (10, 0), True, 128, torch.bfloat16, True, False, 4096, 4096, False, "triton"),  # Blackwell: no wgmma
    ("auto", None, True, 128, torch.bfloat16, True, True, 4096, 4096, False, "triton"),  # the interpreter
    ("auto", HOPPER, False, 128, torch.bfloat16, True, False, 4096, 4096, False, "triton"),  # no Gluon here
    ("auto", HOPPER, True, 96, torch.bfloat16, True, False, 4096, 4096, False, "triton"),
    ("auto", HOPPER, True, 128, torch.bfloat16, False, False, 4096, 4096, False, "triton"),  # misaligned strides
    ("triton", HOPPER, True, 128, torch.bfloat16, True, False, 4096, 4096, False, "triton"),
    ("gluon", HOPPER, True, 64, torch.bfloat16, True, False, 17, 17, True, "gluon"),  # asked for by name
]


@pytest.mark.parametrize("row", CHOICES, ids=lambda r: "-".join(map(str, r[:2] + r[3:4] + r[5:])))
def test_the_forward_kernel_choice(row):
    *facts, expected = row
    assert choose_forward_impl(*facts) == expected


#        impl, capability, gluon imports, head_dim, dtype, descriptors fit, interpreter, seq_q, seq_k -> kernels
BACKWARD_CHOICES = [
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 4096, 4096, "gluon"),
    ("auto", HOPPER, True, 64, torch.float16, True, False, 1024, 1024, "gluon"),  # both head dims, from 1,024
    ("auto", HOPPER, True, 64, torch.bfloat16, True, False, 1023, 4096, "triton"),  # shorter: not timed
    ("auto", HOPPER, True, 128, torch.bfloat16, True, False, 4096, 512, "triton"),
    ("auto", (8, 0), True, 128, torch.bfloat16, True, False, 4096, 4096, "triton"),  # Ampere
    ("auto", None, True, 128, torch.bfloat16, True, True, 4096, 4096, "triton"),  # the interpreter
    ("auto", HOPPER, False, 128, torch.bfloat16, True, False, 4096, 4096, "triton"),  # no Gluon in this Triton
    ("auto", HOPPER, True, 128, torch.bfloat16, False, False, 4096, 4096, "triton"),  # misaligned strides
    ("triton", HOPPER, True, 128, torch.bfloat16, True, False, 4096, 4096, "triton"),
    ("gluon", HOPPER, True, 64, torch.bfloat16, True, False, 17, 17, "gluon"),  # asked for by name
]


@pytest.mark.parametrize("row", BACKWARD_CHOICES, ids=lambda r: "-".join(map(str, r[:2] + r[3:4] + r[5:])))
def test_the_backward_kernel_choice(row):
    *facts, expected = row
    assert attn.choose_backward_impl(*facts) == expected
    assert (attn.choose_backward_impl(*facts[:-2], attn.GLUON_BWD_AUTO_MIN_LENGTH - 1, facts[-1]) == "triton"
            or facts[0] == "gluon")
    with pytest.raises(ValueError, match="cannot run the backward here: the Gluon backward is written for Hopper"):
        attn.choose_backward_impl("gluon", (8, 0), True, 128, torch.bfloat16, True, False, 4096, 4096)
    kv, q = attn.plan_backward_on("cpu", 4096, 128, torch.bfloat16, True)
    assert kv.impl == q.impl == "triton"


def test_the_preference_table():
    for (head_dim, causal), keys in attn.GLUON_AUTO_MIN_KEYS.items():
        assert attn.gluon_preferred(head_dim, 4096, keys, causal)
        assert not attn.gluon_preferred(head_dim, 4096, keys - 1, causal)
        assert not attn.gluon_preferred(head_dim, attn.SHORT_QUERY_MAX, 4096, causal)
    assert not any(attn.gluon_preferred(head_dim, s, s, causal) for s in (128, 511) for head_dim in (64, 128)
                   for causal in (False, True))  # below 512 keys: not timed, never
    assert importlib.import_module("kernels.attention_choice").GLUON_MAX_SHORT_QUERIES == attn.SHORT_QUERY_MAX


@pytest.mark.parametrize("facts", [((8, 9), True, 128, torch.bfloat16, True, False, 4096, 4096),
                                   (HOPPER, True, 128, torch.bfloat16, True, True, 4096, 4096),
                                   (HOPPER, True, 128, torch.bfloat16, False, False, 4096, 4096)])
def test_asking_for_gluon_where_it_cannot_run_says_why(facts):
    with pytest.raises(ValueError, match="impl='gluon' cannot run here"):
        choose_forward_impl("gluon", *facts, True)
    with pytest.raises(ValueError, match="impl must be one of"):
        choose_forward_impl("cuda", *facts, True)


def test_the_gluon_forward_tiles_by_head_dim_mask_and_keys():
    # Round attention-head-dim-64: 64-key tiles two programs an SM at head dim 64 with the causal mask below
    # GLUON_TWO_PROGRAMS_BELOW_KEYS keys, 128-key tiles one program an SM everywhere else.
    below = attn.GLUON_TWO_PROGRAMS_BELOW_KEYS[64, True]
    for seq, causal, head_dim, tiles in ((below - 1, True, 64, (64, 2)), (17, True, 64, (64, 2)),
                                         (below, True, 64, (128, 1)), (below - 1, False, 64, (128, 1)),
                                         (below - 1, True, 128, (128, 1)), (65536, True, 64, (128, 1))):
        assert attn.gluon_forward_tiles(head_dim, seq, causal) == tiles
        plan = plan_attention(seq, head_dim, torch.bfloat16, causal, impl="gluon")
        assert (plan.block_n, plan.programs_per_sm) == tiles
        # by the keys, not the queries
        assert plan_attention(8, head_dim, torch.bfloat16, causal, seq_k=seq, impl="gluon").block_n == tiles[0]
    assert plan_attention(1024, 64, torch.bfloat16, True).programs_per_sm == 1  # the Triton forward: no such choice


@pytest.mark.parametrize("head_dim,block_n,programs", [(128, 64, 1), (128, 64, 2), (128, 128, 2), (64, 128, 2),
                                                       (64, 32, 1), (64, 64, 3)])
def test_tiles_the_gluon_forward_does_not_run_are_refused(head_dim, block_n, programs):
    from kernels.attention_gluon import check_tiles, launch_args

    with pytest.raises(ValueError, match="runs 128-key tiles one program an SM, or at head dim 64"):
        check_tiles(head_dim, block_n, programs)
    q = torch.empty(1, 2, 256, head_dim, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(1, 2, 256, dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match=f"got {block_n}-key tiles, {programs} program"):
        launch_args(q, q, q, q, lse, True, 0.1, 3, block_n=block_n, programs_per_sm=programs)


def test_the_plan_names_its_kernel():
    plan = plan_attention(4096, 128, torch.bfloat16, True, impl="gluon")
    assert (plan.impl, plan.block_m, plan.block_n, plan.num_stages) == ("gluon", 128, 128, 2)
    assert plan_attention(4096, 64, torch.bfloat16, True, impl="gluon").num_stages == 3
    assert plan_attention(4096, 128, torch.bfloat16, True).impl == "triton"
    for direction, tiles in (("backward_kv", (64, 128)), ("backward_q", (128, 64))):  # Gluon only when asked
        assert plan_attention(4096, 128, torch.bfloat16, True, direction).impl == "triton"
        gluon_plan = plan_attention(4096, 128, torch.bfloat16, True, direction, impl="gluon")
        assert (gluon_plan.impl, gluon_plan.block_m, gluon_plan.block_n) == ("gluon", *tiles)
    assert attn.plan_forward_on("cpu", 4096, 128, torch.bfloat16, True).impl == "triton"
    assert attn.plan_forward_on("cpu", 4096, 128, torch.bfloat16, True, impl="triton").as_dict()["impl"] == "triton"


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv(attn.IMPL_ENV, "triton")
    assert attn.default_impl() == "triton"
    monkeypatch.delenv(attn.IMPL_ENV)
    assert attn.default_impl() == "auto"


def test_a_bad_impl_is_named(device, gen):
    q, k, v = _inputs((1, 1, 1, 4, 4, 64), torch.float16, device, gen)
    with pytest.raises(ValueError, match="impl must be one of"):
        attention(q, k, v, impl="fast")


_BUILD = """
import json, re, torch
from kernels.attention_gluon import compile_for_sm90
from kernels import attention_bwd_gluon, attention_bwd_q_gluon
for backward in (attention_bwd_gluon, attention_bwd_q_gluon):
    assert "wgmma.mma_async" in backward.compile_for_sm90(128, torch.bfloat16, True, True).asm["ptx"]
c = compile_for_sm90(128, torch.bfloat16, True, False, 2, persistent=True)
ptx = c.asm["ptx"]
two = compile_for_sm90(64, torch.bfloat16, True, True, 3, persistent=True, on_demand=True, block_n=64,
                       programs_per_sm=2)
print(json.dumps({"shared": c.metadata.shared, "wgmma": "wgmma.mma_async" in ptx,
                  "tma": "cp.async.bulk.tensor" in ptx, "setmaxnreg": "setmaxnreg" in ptx,
                  "two_programs_shared": two.metadata.shared, "two_programs_maxnreg": ".maxnreg 80" in two.asm["ptx"],
                  "two_programs_consumer_regs": bool(re.search(r"setmaxnreg.inc.sync.aligned.u32\\s+104;",
                                                               two.asm["ptx"]))}))
"""


@pytest.mark.skipif(not attn.gluon_imports(), reason="this Triton has no Gluon for Hopper")
def test_the_gluon_forward_builds_for_sm90_without_a_gpu():
    # The largest variant (D = 128, causal), compiled from shapes on the 'meta' device, in a child process
    # without TRITON_INTERPRET (under the interpreter Gluon functions do not compile).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    out = run_python(["-c", _BUILD], cwd=root, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts == {**facts, "wgmma": True, "tma": True, "setmaxnreg": True, "two_programs_maxnreg": True,
                     "two_programs_consumer_regs": True}
    assert facts["shared"] <= 227 * 1024
    # 64-key tiles at head dim 64: two programs' 12 warps at 80 registers a thread and their shared memory (with
    # the 1 KB each program reserves) fit one SM's 65,536 registers and 228 KB
    assert 2 * (facts["two_programs_shared"] + 1024) <= 228 * 1024 and 2 * 12 * 32 * 80 <= 65536


def test_the_gluon_forward_plans_its_persistent_grid_by_the_mask():
    # notes/attention.md, "One Q buffer on the persistent grid" and round attention-causal-dynamic: without the
    # causal mask the plan's kernel on one program an SM with one Q buffer; with it one program an SM, two Q
    # buffers and tiles taken on demand. The choice is the mask's, not the lengths'.
    for seq in (128, 2048, 3000, 16384):
        for head_dim in (64, 128):
            full = plan_attention(seq, head_dim, torch.bfloat16, False, impl="gluon")
            causal = plan_attention(seq, head_dim, torch.float16, True, impl="gluon")
            assert (full.persistent, full.prefetch_q, full.on_demand) == (True, False, False)
            assert (causal.persistent, causal.prefetch_q, causal.on_demand) == (True, True, True)
    assert plan_attention(2048, 128, torch.bfloat16, False).prefetch_q  # the Triton forward: no such choice
