"""kernels.reference_decoder (the decoder block in plain PyTorch) and kernels.decoder_block (the same block from
the lab's kernels): float64 references, the KV cache path, quantised weights, op labels and bad input.

Bounds: norm-wise ‖out − ref‖ / ‖ref‖ of the block's output against the plain-PyTorch block in float64 on the
same weights (for a quantised block: its weights dequantised, exactly, in float64), one row per dtype:
* the lab's block rounds every intermediate to the storage dtype (qkv, q and k after the rotary, the attention
  output, the projections, h, the normalised h, the gate/up output, silu(gate) * up) and accumulates in fp32:
  a dozen roundings of 2^-8 (bf16) or 2^-11 (fp16) relative size, partly cancelling. Measured on these
  shapes: bf16 up to 1.2e-2 (Triton 3.6's interpreter truncates fp32 -> bf16 where a GPU rounds to nearest,
  a biased error about twice as large), fp16 up to 5.5e-4. The bounds leave 2-4x room; a dropped norm gain, a
  key or head read from the wrong place, or a rotary turned the wrong way costs 10-100x more.
* the same errors for int8 and int4 weights: against the dequantised weights the kernels add no error of
  their own beyond rounding the activations (the scales apply in fp32).
Each error must also stay within TORCH_FACTOR of the plain-PyTorch block's own error in the same dtype.
QUANT_BOUNDS: the quantised block against the float64 block on the unquantised weights, i.e. the
quantisation error itself (int8: 1/254 of a row's largest weight at most, measured 1.4e-2; int4: 1/14 of a
group's, measured 1.5e-1 at groups of 64). A wrong nibble order or scale exceeds these several times over.
"""

from __future__ import annotations

import math

import pytest
import torch
from accuracy import rel_err
from torch.profiler import ProfilerActivity, profile, record_function

from kernels.decoder_block import FUSED_QKV_MAX_ROWS, SOURCES, LabDecoderBlock, check_decoder_inputs, sources_for
from kernels.reference_decoder import (
    LLAMA_8B,
    OPS,
    REFERENCE_SOURCES,
    DecoderBlock,
    DecoderConfig,
    DecoderWeights,
    KVCache,
    op_label,
)

BOUNDS = {torch.bfloat16: 2.5e-2, torch.float16: 2e-3}
TORCH_FACTOR = 4.0
QUANT_BOUNDS = {"int8": 3e-2, "int4": 0.3}
DTYPES = list(BOUNDS)

# head_dim 64 (the lab's attention takes 64 or 128), two query heads sharing one key/value head. SEQ, CACHED
# and CAPACITY are no multiples of any tile; 2 x 7 rows take the decode GEMV of rmsnorm_linear, 1 x 19 its
# tiled kernel, 1 x 70 two launches of the quantised kernels (64 rows a launch).
CONFIG = DecoderConfig(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, intermediate=192)
GROUP = 64  # int4 groups: must divide hidden = 128 and intermediate = 192
BATCH, SEQ, CAPACITY, CACHED = 2, 7, 40, 29


def _x(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _weights(dtype, device, seed=1):
    return DecoderWeights.random(CONFIG, dtype, device, seed)


def _check(out, ref64, theirs, dtype):
    """out (the lab's, in dtype) against ref64, and against torch's own error in dtype (theirs)."""
    assert out.shape == ref64.shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "an output element is NaN or infinite (unwritten, or read from poison)"
    err = rel_err(out, ref64)
    assert err <= BOUNDS[dtype], f"relative error {err:.3e} > {BOUNDS[dtype]:.1e}"
    allowed = TORCH_FACTOR * rel_err(theirs, ref64)
    assert err <= allowed, f"relative error {err:.3e} > {TORCH_FACTOR} x torch's own {allowed / TORCH_FACTOR:.3e}"


# --------------------------------------------------------------------------------------------------------
# The reference block against the block written out from its definition
# --------------------------------------------------------------------------------------------------------


def _straightforward(w: DecoderWeights, c: DecoderConfig, x, positions, past_k=None, past_v=None):
    """The block from its definition in float64, one (sequence, head) at a time: (out, keys, values), keys and
    values [B, Hkv, P + S, D] with the P past ones first; query i sees the past and the new keys up to i."""
    def rms(t, gain):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + c.eps) * gain

    batch, seq, _ = x.shape
    half = c.head_dim // 2
    freq = torch.tensor([c.rope_theta ** (-2.0 * i / c.head_dim) for i in range(half)], dtype=torch.float64)

    def turn(t, p):  # t [S, D], p [S]: features i and i + D/2 turned by the angle p * freq_i
        a, b = t[:, :half], t[:, half:]
        angle = p.double()[:, None] * freq[None, :]
        return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], dim=1)

    qkv = rms(x, w.attn_norm) @ w.w_qkv.T
    hq, hk = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    o = torch.zeros(batch, seq, hq, dtype=torch.float64)
    n_past = 0 if past_k is None else past_k.shape[2]
    keys = torch.zeros(batch, c.n_kv_heads, n_past + seq, c.head_dim, dtype=torch.float64)
    values = torch.zeros_like(keys)
    for b in range(batch):
        p = positions if positions.dim() == 1 else positions[b]
        for j in range(c.n_kv_heads):
            cols = slice(j * c.head_dim, (j + 1) * c.head_dim)
            keys[b, j, n_past:] = turn(qkv[b, :, hq:hq + hk][:, cols], p)
            values[b, j, n_past:] = qkv[b, :, hq + hk:][:, cols]
            if n_past:
                keys[b, j, :n_past], values[b, j, :n_past] = past_k[b, j], past_v[b, j]
        for h in range(c.n_heads):
            kv = h // (c.n_heads // c.n_kv_heads)
            q = turn(qkv[b, :, h * c.head_dim:(h + 1) * c.head_dim], p)
            s = q @ keys[b, kv].T / math.sqrt(c.head_dim)
            visible = torch.arange(n_past + seq)[None, :] <= torch.arange(seq)[:, None] + n_past
            e = torch.exp(s - s.max()).masked_fill(~visible, 0.0)
            o[b, :, h * c.head_dim:(h + 1) * c.head_dim] = (e / e.sum(-1, keepdim=True)) @ values[b, kv]
    hidden = x + o @ w.w_o.T
    gate_up = rms(hidden, w.mlp_norm) @ w.w_gate_up.T
    gate, up = gate_up[..., :c.intermediate], gate_up[..., c.intermediate:]
    return hidden + (gate * torch.sigmoid(gate) * up) @ w.w_down.T, keys, values


@pytest.mark.parametrize("explicit_positions", [False, True])
def test_reference_prefill_matches_the_block_written_out(explicit_positions):
    w = _weights(torch.float64, "cpu")
    x = _x((BATCH, SEQ, CONFIG.hidden), torch.float64)
    positions = torch.arange(SEQ)
    if explicit_positions:  # each sequence from its own offset
        positions = torch.stack([torch.arange(3, 3 + SEQ), torch.arange(500, 500 + SEQ)])
    out = DecoderBlock(w, CONFIG)(x, positions if explicit_positions else None)
    want, _, _ = _straightforward(w, CONFIG, x, positions)
    assert rel_err(out, want) < 1e-13


def test_reference_decode_matches_the_block_written_out():
    w = _weights(torch.float64, "cpu")
    x = _x((BATCH, 1, CONFIG.hidden), torch.float64)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.float64).fill(CACHED, seed=5)
    past_k, past_v = cache.keys(CACHED).clone(), cache.values(CACHED).clone()
    out = DecoderBlock(w, CONFIG).decode(x, cache, CACHED)
    want, keys, values = _straightforward(w, CONFIG, x, torch.tensor([CACHED]), past_k, past_v)
    assert rel_err(out, want) < 1e-13
    assert rel_err(cache.keys(CACHED + 1), keys) < 1e-13 and rel_err(cache.values(CACHED + 1), values) < 1e-13
    assert (cache.k[:, :, CACHED + 1:] == 0).all(), "written past position pos"


def test_reference_decode_after_a_prefill_equals_the_whole_prefill():
    """Prefill the first tokens into the cache, decode the rest one by one: every step's output is the full
    prefill's output for that token."""
    block = DecoderBlock(_weights(torch.float64, "cpu"), CONFIG)
    x = _x((BATCH, SEQ, CONFIG.hidden), torch.float64)
    whole = block(x)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.float64)
    first = 3
    assert rel_err(block(x[:, :first], cache=cache), whole[:, :first]) < 1e-14
    for pos in range(first, SEQ):
        assert rel_err(block.decode(x[:, pos:pos + 1], cache, pos), whole[:, pos:pos + 1]) < 1e-13


def test_reference_compiles_whole():
    """No graph break in forward or decode (fullgraph), and the compiled decode writes the caller's cache."""
    block = DecoderBlock(_weights(torch.float64, "cpu"), CONFIG)
    x = _x((BATCH, SEQ, CONFIG.hidden), torch.float64)
    torch._dynamo.reset()
    forward = torch.compile(block.forward, backend="aot_eager", fullgraph=True)
    decode = torch.compile(block.decode, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(forward(x), block(x), rtol=0, atol=0)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.float64).fill(CACHED, seed=2)
    eager_cache = cache.to()
    for pos in (CACHED, CACHED + 1):
        torch.testing.assert_close(decode(x[:, :1], cache, pos), block.decode(x[:, :1], eager_cache, pos),
                                   rtol=0, atol=0)
    assert torch.equal(cache.k, eager_cache.k) and torch.equal(cache.v, eager_cache.v)


def test_random_weights_are_seeded_and_scaled():
    w, again = _weights(torch.float32, "cpu", seed=3), _weights(torch.float32, "cpu", seed=3)
    assert all(torch.equal(a, b) for a, b in zip(w.tensors().values(), again.tensors().values()))
    assert not torch.equal(w.w_qkv, _weights(torch.float32, "cpu", seed=4).w_qkv)
    assert torch.equal(_weights(torch.bfloat16, "cpu", seed=3).w_o, w.w_o.to(torch.bfloat16))
    for name, t in w.tensors().items():
        if t.dim() == 1:
            assert (t - 1).abs().max() < 0.6, name
        else:
            assert abs(t.std().item() * math.sqrt(t.shape[1]) - 1) < 0.1, name
    assert LLAMA_8B.parameter_count() == 218_112_000


# --------------------------------------------------------------------------------------------------------
# The lab's block against the float64 reference
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, (BATCH, SEQ)), (torch.float16, (BATCH, SEQ)),
                                          (torch.bfloat16, (1, 19))])
def test_lab_prefill_matches_float64(dtype, shape, device):
    w = _weights(dtype, device)
    x = _x((*shape, CONFIG.hidden), dtype).to(device)
    positions = torch.arange(10, 10 + shape[1], device=device)
    out = LabDecoderBlock(w, CONFIG)(x, positions)
    ref64 = DecoderBlock(w.to(torch.float64), CONFIG)(x.double(), positions)
    _check(out, ref64, DecoderBlock(w, CONFIG)(x, positions), dtype)


@pytest.mark.parametrize("layout", ["stepped-positions", "batch-positions", "int16-positions", "stepped-x",
                                    "cache-slice"])
def test_lab_prefill_of_strided_inputs_matches_float64(layout, device):
    """The reported case, positions = arange(10)[::2] (the rotary kernel read positions 0..4 and was 14% off),
    and its kin: per-sequence positions with a stride, positions of a narrow dtype, x[:, ::2] of a longer x,
    and a prefill into a cache that is a batch slice of a larger one."""
    dtype, seq = torch.bfloat16, 5
    w = _weights(dtype, device)
    x = _x((BATCH, 2 * seq, CONFIG.hidden), dtype).to(device)[:, :seq]
    positions, cache, cache64 = torch.arange(10, device=device)[::2], None, None
    if layout == "batch-positions":
        positions = torch.arange(4 * seq, device=device).view(seq, 4).t()[:BATCH]
    elif layout == "int16-positions":
        positions = positions.to(torch.int16)
    elif layout == "stepped-x":
        x = _x((BATCH, 2 * seq, CONFIG.hidden), dtype).to(device)[:, ::2]
    elif layout == "cache-slice":
        big = KVCache.allocate(CONFIG, BATCH + 1, CAPACITY, dtype, device)
        big.k.fill_(math.nan)
        big.v.fill_(math.nan)
        cache = KVCache(big.k[1:], big.v[1:])
        cache64 = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.float64, device)
    out = LabDecoderBlock(w, CONFIG)(x, positions, cache)
    ref64 = DecoderBlock(w.to(torch.float64), CONFIG)(x.double(), positions, cache64)
    _check(out, ref64, DecoderBlock(w, CONFIG)(x, positions), dtype)
    if cache is not None:
        assert rel_err(cache.k[:, :, :seq], cache64.k[:, :, :seq]) <= BOUNDS[dtype]
        assert torch.isnan(big.k[0]).all() and torch.isnan(big.k[1:, :, seq:]).all(), "a write outside the slice"


@pytest.mark.parametrize("dtype", DTYPES)
def test_lab_prefill_writes_the_cache_and_decode_continues(dtype, device):
    """Prefill into a NaN-poisoned cache, then decode two steps: outputs and cache against the reference's,
    run the same way in float64; positions never written stay NaN."""
    w = _weights(dtype, device)
    lab, ref = LabDecoderBlock(w, CONFIG), DecoderBlock(w.to(torch.float64), CONFIG)
    x = _x((BATCH, SEQ, CONFIG.hidden), dtype).to(device)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, dtype, device)
    cache.k.fill_(math.nan)
    cache.v.fill_(math.nan)
    cache64 = cache.to(torch.float64)
    first = SEQ - 2
    _check(lab(x[:, :first], cache=cache), ref(x[:, :first].double(), cache=cache64),
           DecoderBlock(w, CONFIG)(x[:, :first]), dtype)
    for pos in range(first, SEQ):
        out = lab.decode(x[:, pos:pos + 1], cache, pos)
        assert torch.isfinite(out).all()
        assert rel_err(out, ref.decode(x[:, pos:pos + 1].double(), cache64, pos)) <= BOUNDS[dtype]
    for mine, theirs in ((cache.k, cache64.k), (cache.v, cache64.v)):
        assert rel_err(mine[:, :, :SEQ], theirs[:, :, :SEQ]) <= BOUNDS[dtype]
        assert torch.isnan(mine[:, :, SEQ:]).all(), "written past the last position"


@pytest.mark.parametrize("decode_attention", ["lab", "sdpa"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pos", [0, CACHED, CAPACITY - 1])
def test_lab_decode_matches_float64(pos, dtype, decode_attention, device):
    """One decode step over a cache filled up to pos, with positions pos.. poisoned with NaN: the output and
    the key and value written at pos match float64; nothing before pos changes, nothing after is written or
    read."""
    w = _weights(dtype, device)
    x = _x((BATCH, 1, CONFIG.hidden), dtype).to(device)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, dtype, device).fill(pos, seed=7)
    cache.k[:, :, pos:] = math.nan
    cache.v[:, :, pos:] = math.nan
    before = cache.to()
    cache64, cache_torch = cache.to(torch.float64), cache.to()
    out = LabDecoderBlock(w, CONFIG, decode_attention=decode_attention).decode(x, cache, pos)
    ref64 = DecoderBlock(w.to(torch.float64), CONFIG).decode(x.double(), cache64, pos)
    _check(out, ref64, DecoderBlock(w, CONFIG).decode(x, cache_torch, pos), dtype)
    for mine, was, theirs in ((cache.k, before.k, cache64.k), (cache.v, before.v, cache64.v)):
        assert torch.equal(mine[:, :, :pos], was[:, :, :pos])
        assert rel_err(mine[:, :, pos], theirs[:, :, pos]) <= BOUNDS[dtype]
        assert torch.isnan(mine[:, :, pos + 1:]).all()


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantised_block_matches_float64(quant, dtype, device):
    """Prefill and decode against the float64 block on the dequantised weights (BOUNDS), and on the
    original weights (QUANT_BOUNDS: the quantisation error)."""
    w = _weights(dtype, device)
    lab = LabDecoderBlock(w, CONFIG, quant=quant, group_size=GROUP)
    dequantised = lab.effective_weights(torch.float64)
    ref, unquantised = DecoderBlock(dequantised, CONFIG), DecoderBlock(w.to(torch.float64), CONFIG)
    x = _x((BATCH, SEQ, CONFIG.hidden), dtype).to(device)
    out = lab(x)
    _check(out, ref(x.double()), DecoderBlock(lab.effective_weights(), CONFIG)(x), dtype)
    assert rel_err(out, unquantised(x.double())) <= QUANT_BOUNDS[quant]
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, dtype, device).fill(CACHED, seed=9)
    cache64, cache_torch = cache.to(torch.float64), cache.to()
    step = lab.decode(x[:, :1], cache, CACHED)
    _check(step, ref.decode(x[:, :1].double(), cache64, CACHED),
           DecoderBlock(lab.effective_weights(), CONFIG).decode(x[:, :1], cache_torch, CACHED), dtype)
    assert lab.quantised_projections()["w_qkv"][0].dtype == (torch.int8 if quant == "int8" else torch.uint8)
    if quant == "int4":  # prepacked for the Gluon kernel where it runs (a Hopper GPU), and only then
        from kernels.dequant_linear import int4_gluon_refusal, int4_linear_impl

        impl = "gluon" if int4_gluon_refusal(device, dtype) is None else "triton"
        assert lab.int4_impl == impl
        assert {int4_linear_impl(w[0]) for w in lab.projections.values()} == {impl}
        assert lab.op_sources()["o_proj"].startswith(f"lab: kernels/{'int4_gluon' if impl == 'gluon' else 'dequant_linear'}.py")


def test_quantised_prefill_past_64_rows_runs_in_chunks(device):
    lab = LabDecoderBlock(_weights(torch.bfloat16, device), CONFIG, quant="int8")
    x = _x((1, 70, CONFIG.hidden), torch.bfloat16).to(device)
    _check(lab(x), DecoderBlock(lab.effective_weights(torch.float64), CONFIG)(x.double()),
           DecoderBlock(lab.effective_weights(), CONFIG)(x), torch.bfloat16)


# --------------------------------------------------------------------------------------------------------
# Op labels and sources
# --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [FUSED_QKV_MAX_ROWS, FUSED_QKV_MAX_ROWS + 1])
def test_wide_decode_steps_take_torchs_qkv_pair_and_match_float64(batch, device):
    """A decode step of more than FUSED_QKV_MAX_ROWS tokens runs the QKV projection as F.rms_norm + F.linear
    (labels attn_norm, qkv_proj); one of exactly that many keeps the fused kernel. Both match float64."""
    dtype = torch.bfloat16
    w = _weights(dtype, device)
    x = _x((batch, 1, CONFIG.hidden), dtype).to(device)
    cache = KVCache.allocate(CONFIG, batch, CAPACITY, dtype, device).fill(CACHED, seed=3)
    cache.k[:, :, CACHED:] = math.nan
    cache.v[:, :, CACHED:] = math.nan
    cache64, cache_torch = cache.to(torch.float64), cache.to()
    lab = LabDecoderBlock(w, CONFIG)
    outs = []  # the labelled step's own output is the one checked: each step costs seconds in the interpreter
    labels = _labels_seen(lambda: outs.append(lab.decode(x, cache, CACHED)))
    assert list(dict.fromkeys(labels)) == list(lab.op_sources("decode", rows=batch))
    assert ("attn_norm+qkv_proj" in labels) == (batch <= FUSED_QKV_MAX_ROWS)
    out, = outs
    ref64 = DecoderBlock(w.to(torch.float64), CONFIG).decode(x.double(), cache64, CACHED)
    _check(out, ref64, DecoderBlock(w, CONFIG).decode(x, cache_torch, CACHED), dtype)



def _labels_seen(run) -> list[str]:
    """Runs `run` under the profiler inside a range "block"; asserts that every aten op under it has exactly
    one label of OPS among its ancestors and that labels never nest; returns the labels in order."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("block"):
            run()
    seen = []
    for event in prof.events():
        chain, parent = [], event.cpu_parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        if "block" not in chain:
            continue
        labels = [name for name in chain if name in OPS]
        if event.name in OPS:
            assert labels == [], f"{event.name} nested under {labels}"
            seen.append((event.time_range.start, event.name))
        elif event.name.startswith("aten::"):
            assert len(labels) == 1, f"{event.name} runs under the labels {labels}"
    return [name for _, name in sorted(seen)]


@pytest.mark.parametrize("quant", [None, "int8"])
@pytest.mark.parametrize("decode_attention", ["lab", "sdpa"])
def test_every_op_of_the_lab_block_runs_under_one_label(quant, decode_attention, device):
    lab = LabDecoderBlock(_weights(torch.bfloat16, device), CONFIG, quant=quant, decode_attention=decode_attention)
    x = _x((BATCH, SEQ, CONFIG.hidden), torch.bfloat16).to(device)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.bfloat16, device).fill(CACHED)
    token = x[:, :1].clone()
    prefill = _labels_seen(lambda: lab(x))
    decode = _labels_seen(lambda: lab.decode(token, cache, CACHED))
    for phase, labels in (("prefill", prefill), ("decode", decode)):
        sources = lab.op_sources(phase)
        assert list(dict.fromkeys(labels)) == list(sources), phase  # each label of the table, in order
    # Decode turns q and k while writing the cache, in one op; at prefill without a cache the rotary op only
    # turns. The lab's fused RMSNorm + QKV serves decode only when unquantised.
    fused_head = {"attn_norm+qkv_proj"} if quant is None else set()
    split_head = {"attn_norm", "qkv_proj"} if quant is None else set()
    assert set(decode) - fused_head - {"rotary+kv_cache_write"} == set(prefill) - split_head - {"rotary"}


def test_every_op_of_the_reference_runs_under_one_label():
    block = DecoderBlock(_weights(torch.float64, "cpu"), CONFIG)
    x = _x((BATCH, SEQ, CONFIG.hidden), torch.float64)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.float64).fill(CACHED)
    assert set(_labels_seen(lambda: block(x))) == set(block.op_sources("prefill"))
    token = x[:, :1].clone()
    assert set(_labels_seen(lambda: block.decode(token, cache, CACHED))) == set(block.op_sources("decode"))
    assert set(REFERENCE_SOURCES) <= set(OPS)


def test_labels_cost_nothing_without_a_profiler():
    assert type(op_label("attention")).__name__ == "nullcontext"


def test_sources_name_the_implementation_of_each_configuration():
    assert SOURCES == sources_for() and set(SOURCES) <= set(OPS)
    assert SOURCES["attn_norm+qkv_proj"] == "lab: kernels/rmsnorm_linear.py"
    assert SOURCES["attention"] == "lab: kernels/attention.py" and SOURCES["o_proj"] == "torch: F.linear"
    assert sources_for(decode_attention="sdpa")["attention"] == "torch: F.scaled_dot_product_attention"
    assert sources_for(decode_attention="sdpa", phase="prefill")["attention"] == "lab: kernels/attention.py"
    int4 = sources_for("int4")
    assert "attn_norm+qkv_proj" not in int4 and int4["attn_norm"] == "torch: F.rms_norm"
    for label in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        assert int4[label] == "lab: kernels/dequant_linear.py (int4_linear)"
    assert "rotary+kv_cache_write" not in sources_for(phase="prefill")
    assert sources_for(phase="prefill")["qkv_proj"].startswith("torch: F.linear")
    assert sources_for(rows=FUSED_QKV_MAX_ROWS) == SOURCES
    wide = sources_for(rows=FUSED_QKV_MAX_ROWS + 1)
    assert "attn_norm+qkv_proj" not in wide and wide["attn_norm"] == "torch: F.rms_norm"
    assert wide["qkv_proj"].startswith("torch: F.linear") and wide["attention"] == SOURCES["attention"]
    assert sources_for(phase="decode")["rotary+kv_cache_write"].startswith("lab: kernels/rotary.py")
    with pytest.raises(ValueError, match="phase must be one of 'decode', 'prefill', got 'train'"):
        sources_for(phase="train")
    with pytest.raises(ValueError, match="quant must be one of None, 'int8', 'int4', got 'fp8'"):
        sources_for("fp8")


# --------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_heads=6, n_kv_heads=4, head_dim=64, hidden=384), "n_kv_heads = 4 does not divide n_heads = 6"),
    (dict(hidden=100), r"hidden = 100 but n_heads \* head_dim = 32 \* 128 = 4096"),
    (dict(hidden=126, n_heads=2, n_kv_heads=1, head_dim=63), "head_dim must be even .* got 63"),
    (dict(n_heads=0), "n_heads must be a positive int, got 0"),
    (dict(intermediate=1.5), "intermediate must be a positive int, got 1.5"),
    (dict(eps=math.nan), "eps must be a finite real number, got nan"),
    (dict(rope_theta=-1.0), "rope_theta > 0"),
])
def test_bad_configs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig(**kwargs)


def test_bad_blocks_are_named_with_what_is_accepted(device):
    w = _weights(torch.bfloat16, device)
    small = DecoderConfig(hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, intermediate=96)
    with pytest.raises(ValueError, match="head_dim 32 is not supported .* supported head dims are 64, 128"):
        LabDecoderBlock(DecoderWeights.random(small, torch.bfloat16, device), small)
    with pytest.raises(TypeError, match="dtype float32 is not supported; the lab's kernels take float16, bfloat16"):
        LabDecoderBlock(_weights(torch.float32, device), CONFIG)
    with pytest.raises(ValueError, match=r"weight w_qkv has shape \(256, 128\); the config asks for \(384, 128\)"):
        LabDecoderBlock(w, DecoderConfig(hidden=128, n_heads=2, n_kv_heads=2, head_dim=64, intermediate=192))
    with pytest.raises(ValueError, match="quant must be one of None, 'int8', 'int4', got 'int3'"):
        LabDecoderBlock(w, CONFIG, quant="int3")
    with pytest.raises(ValueError, match="decode_attention must be one of 'lab', 'sdpa', got 'flash'"):
        LabDecoderBlock(w, CONFIG, decode_attention="flash")
    with pytest.raises(ValueError, match=r"group_size 128 does not divide intermediate = 192.*\(here: 32, 64\)"):
        LabDecoderBlock(w, CONFIG, quant="int4", group_size=128)
    with pytest.raises(ValueError, match="group_size must be one of 32, 64, 128, 256, got 48"):
        LabDecoderBlock(w, CONFIG, quant="int4", group_size=48)


def test_bad_calls_are_named_with_what_is_accepted(device):
    w = _weights(torch.bfloat16, device)
    lab, ref = LabDecoderBlock(w, CONFIG), DecoderBlock(w, CONFIG)
    x = _x((BATCH, 1, CONFIG.hidden), torch.bfloat16).to(device)
    cache = KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.bfloat16, device)
    full = r"KV cache holds 40 positions; position 40 is past its end"
    lab.decode(x, cache, 3)  # this layout now skips the checks: a bad position must still be refused
    for block in (lab, ref):
        with pytest.raises(ValueError, match=full):
            block.decode(x, cache, CAPACITY)
    with pytest.raises(ValueError, match=r"KV cache holds 40 positions; position 40 is past its end"):
        lab(_x((BATCH, CAPACITY + 1, CONFIG.hidden), torch.bfloat16).to(device), cache=cache)
    with pytest.raises(ValueError, match=r"KV cache positions are ints >= 0, got -1"):
        lab.decode(x, cache, -1)
    with pytest.raises(ValueError, match=r"shape \[batch, seq, hidden\] with hidden = 128, got \(2, 1, 64\)"):
        lab(x[..., :64])
    with pytest.raises(TypeError, match="x has dtype float16 but the block's weights have bfloat16"):
        lab(x.half())
    with pytest.raises(ValueError, match=r"one token a sequence, x \[batch, 1, hidden\]; got \(2, 2, 128\)"):
        lab.decode(torch.cat([x, x], dim=1), cache, 3)
    with pytest.raises(ValueError, match=r"positions must have shape \[seq\] = \(1,\) or \[batch, seq\] = \(2, 1\)"):
        lab(x, torch.arange(3, device=device))
    with pytest.raises(TypeError, match="positions must be an integer tensor .*, got float32"):
        lab(x, torch.zeros(1, device=device))
    with pytest.raises(ValueError, match=r"this call needs batch, n_kv_heads, head_dim = \(1, 1, 64\)"):
        lab.decode(x[:1], cache, 3)
    with pytest.raises(ValueError, match=r"the cache's k has strides \(.*\); keys and values are written in place"):
        lab.decode(x, KVCache(cache.k.transpose(2, 3).contiguous().transpose(2, 3), cache.v), 3)
    with pytest.raises(ValueError, match=r"the cache's v has strides \(0, .*no overlapping elements"):
        lab.decode(x, KVCache(cache.k, cache.v[:1].expand(cache.v.shape)), 3)
    with pytest.raises(TypeError, match="the cache has dtype float16"):
        lab.decode(x, KVCache.allocate(CONFIG, BATCH, CAPACITY, torch.float16, device), 3)
    with pytest.raises(ValueError, match="KV cache holds 40 positions; position 40 is past its end"):
        cache.fill(CAPACITY + 1)
    with pytest.raises(TypeError, match="config must be a DecoderConfig, got dict"):
        check_decoder_inputs("f", {}, torch.bfloat16, x)


def test_cpu_tensors_without_the_interpreter_name_both_ways_out(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    lab = LabDecoderBlock(_weights(torch.bfloat16, "cpu"), CONFIG)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        lab(_x((1, 2, CONFIG.hidden), torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"(?s)x\.cuda\(\).*TRITON_INTERPRET=1"):
        LabDecoderBlock(_weights(torch.bfloat16, "cpu"), CONFIG)


def test_int4_impl_is_checked_and_triton_keeps_the_plain_layout(device):
    with pytest.raises(ValueError, match="int4_impl must be one of 'auto', 'triton', 'gluon'"):
        LabDecoderBlock(_weights(torch.bfloat16, device), CONFIG, quant="int4", group_size=64, int4_impl="cuda")
    lab = LabDecoderBlock(_weights(torch.bfloat16, device), CONFIG, quant="int4", group_size=64, int4_impl="triton")
    assert lab.int4_impl == "triton" and lab.projections["w_o"][0].dtype == torch.uint8
    from kernels.dequant_linear import int4_gluon_refusal

    if int4_gluon_refusal(device, torch.bfloat16) is not None:
        with pytest.raises(ValueError, match="int4_impl='gluon' cannot run here"):
            LabDecoderBlock(_weights(torch.bfloat16, device), CONFIG, quant="int4", group_size=64, int4_impl="gluon")
