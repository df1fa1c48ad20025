"""The rotary kernel (kernels/rotary.py): queries and keys turned as the plain-torch rotary of
kernels/reference_decoder.py turns them, values passed through, keys and values written into the slices they
are given and nowhere else; launches reused only for the layout they were built for; bad input refused."""

from __future__ import annotations

import pytest
import torch

from kernels import rotary as rot
from kernels.reference_decoder import DecoderConfig, rotary, rotary_inv_freq, rotary_tables
from kernels.rotary import rotary_qkv

# ‖out − ref‖ / ‖ref‖ against float64: one rounding of the output (bf16 2^-9, fp16 2^-12 relative, on
# average about half of that) after fp32 math; cos and sin in fp32 add ~1e-7. The bounds leave 2-4x room.
TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
CONFIG = DecoderConfig(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, intermediate=192)
H, HKV, D = CONFIG.n_heads, CONFIG.n_kv_heads, CONFIG.head_dim


def _inv_half(device):
    return rotary_inv_freq(CONFIG, device, torch.float32)[:D // 2].contiguous()


def _reference(qkv: torch.Tensor, positions: torch.Tensor):
    heads = qkv.double().unflatten(-1, (H + 2 * HKV, D)).transpose(1, 2)
    cos, sin = rotary_tables(CONFIG, positions.cpu(), "cpu", torch.float64)
    turned = rotary(heads[:, :H + HKV].cpu(), cos, sin)
    return turned[:, :H], turned[:, H:], heads[:, H + HKV:].cpu()


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double().cpu() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 7, "tensor"])
def test_turns_queries_and_keys_and_passes_values(dtype, start, device, gen):
    batch, seq = 2, 5
    qkv = torch.randn(batch, seq, (H + 2 * HKV) * D, generator=gen).to(device=device, dtype=dtype)
    positions = torch.tensor([3, 9, 1, 40, 2], device=device) if start == "tensor" else start
    q, k, v = rotary_qkv(qkv, H, HKV, D, _inv_half(device), positions)
    p = positions if start == "tensor" else torch.arange(start, start + seq)
    rq, rk, rv = _reference(qkv, p)
    assert q.shape == (batch, H, seq, D) and k.shape == v.shape == (batch, HKV, seq, D)
    assert _err(q, rq) <= TOLERANCE[dtype] and _err(k, rk) <= TOLERANCE[dtype]
    assert torch.equal(v.double().cpu(), rv)  # values are copied, never rounded again


def test_writes_keys_and_values_into_cache_slices_only(device, gen):
    batch, seq, capacity, start = 2, 3, 9, 4
    qkv = torch.randn(batch, seq, (H + 2 * HKV) * D, generator=gen).to(device)
    k_cache = torch.full((batch, HKV, capacity, D), float("nan"), device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    _, k, v = rotary_qkv(qkv, H, HKV, D, _inv_half(device), start, k_out=k_cache[:, :, start:start + seq],
                         v_out=v_cache[:, :, start:start + seq])
    assert k.data_ptr() == k_cache[:, :, start:].data_ptr()  # the given slice, no copy
    for cache in (k_cache, v_cache):
        assert torch.isnan(cache[:, :, :start]).all() and torch.isnan(cache[:, :, start + seq:]).all()
        assert torch.isfinite(cache[:, :, start:start + seq]).all()
    _, rk, rv = _reference(qkv, torch.arange(start, start + seq))
    assert _err(k_cache[:, :, start:start + seq], rk) <= TOLERANCE[torch.float32]
    assert torch.equal(v_cache[:, :, start:start + seq].double().cpu(), rv)


def test_a_route_serves_only_its_layout_and_positions_stay_runtime(device, gen):
    rot._ROUTES.clear()
    base = torch.randn(3 * (H + 2 * HKV) * D + 8, generator=gen).to(device)
    width = (H + 2 * HKV) * D
    inv = _inv_half(device)
    first = base[:2 * width].view(1, 2, width)
    rotary_qkv(first, H, HKV, D, inv, 0)
    rotary_qkv(first, H, HKV, D, inv, 5)  # another start: the same route, the start a runtime argument
    assert len(rot._ROUTES) == 1
    q5, _, _ = rotary_qkv(first, H, HKV, D, inv, 5)
    assert _err(q5, _reference(first, torch.arange(5, 7))[0]) <= TOLERANCE[torch.float32]
    shifted = base[1:1 + 2 * width].view(1, 2, width)  # 4 bytes off: another alignment, another route
    q, _, _ = rotary_qkv(shifted, H, HKV, D, inv, 3)
    assert len(rot._ROUTES) == 2
    assert _err(q, _reference(shifted, torch.arange(3, 5))[0]) <= TOLERANCE[torch.float32]
    longer = base[:3 * width].view(1, 3, width)  # another shape
    q, _, _ = rotary_qkv(longer, H, HKV, D, inv, 1)
    assert len(rot._ROUTES) == 3
    assert _err(q, _reference(longer, torch.arange(1, 4))[0]) <= TOLERANCE[torch.float32]


# Layouts of the reported wrong answers: each read with the wrong stride before the kernel took qkv's batch and
# sequence strides, the positions' stride and inv_freq's stride (a batch slice gave a relative error of 1.2).


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["batch-slice", "seq-by-batch", "strided-positions", "strided-inv-freq"])
def test_strided_layouts_match_float64(layout, dtype, device, gen):
    batch, seq, width = 2, 4, (H + 2 * HKV) * D
    full = torch.randn(batch, 9, width, generator=gen).to(device=device, dtype=dtype)
    qkv, positions, inv = full[:, :seq], torch.tensor([3, 9, 1, 40], device=device), _inv_half(device)
    if layout == "batch-slice":  # x[:, :4] of a longer tensor: batch stride 9 * width, sequence stride width
        positions = 2
    elif layout == "seq-by-batch":  # [S, B, W] storage seen as [B, S, W]: sequence stride B * width
        qkv = full[:, :seq].transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "strided-positions":
        positions = torch.arange(10, device=device)[::2][:seq]
    else:
        inv = torch.stack([inv, torch.full_like(inv, float("nan"))], dim=1)[:, 0]
    assert not qkv.is_contiguous() or layout.startswith("strided")
    q, k, v = rotary_qkv(qkv, H, HKV, D, inv, positions)
    p = torch.arange(positions, positions + seq) if isinstance(positions, int) else positions
    rq, rk, rv = _reference(qkv, p)
    assert _err(q, rq) <= TOLERANCE[dtype] and _err(k, rk) <= TOLERANCE[dtype]
    assert torch.equal(v.double().cpu(), rv)


def test_overlapping_or_strided_head_dim_outputs_are_refused(device):
    qkv = torch.zeros(1, 2, (H + 2 * HKV) * D, device=device)
    cache = torch.zeros(1, HKV, 2, D, device=device)
    with pytest.raises(ValueError, match="k_out has elements that overlap in memory"):
        rotary_qkv(qkv, H, HKV, D, _inv_half(device), 0, k_out=cache[:, :, :1].expand(1, HKV, 2, D))
    with pytest.raises(ValueError, match="v_out is written in place and needs unit stride along head_dim"):
        rotary_qkv(qkv, H, HKV, D, _inv_half(device), 0, v_out=cache.transpose(2, 3).contiguous().transpose(2, 3))
    with pytest.raises(ValueError, match="k_out and v_out are the same memory"):
        rotary_qkv(qkv, H, HKV, D, _inv_half(device), 0, k_out=cache, v_out=cache)


@pytest.mark.parametrize("change, message", [
    (dict(qkv="int"), "qkv"),
    (dict(qkv="2d"), "qkv must have shape"),
    (dict(n_heads=3), "qkv's last dimension is"),
    (dict(head_dim=48), "head_dim must be an even power of two"),
    (dict(inv_freq="wrong"), "inv_freq must be a float32 tensor of shape"),
    (dict(positions=-1), "positions must be an int start"),
    (dict(positions="float"), "positions must be an int start or an int32/int64 tensor"),
    (dict(k_out="short"), "k_out must be"),
])
def test_bad_input_is_named(change, message, device):
    args = dict(qkv=torch.zeros(1, 2, (H + 2 * HKV) * D, device=device), n_heads=H, n_kv_heads=HKV, head_dim=D,
                inv_freq=_inv_half(device), positions=0, k_out=None)
    args.update(change)
    if args["qkv"] == "int":
        args["qkv"] = torch.zeros(1, 2, (H + 2 * HKV) * D, dtype=torch.int32, device=device)
    elif args["qkv"] == "2d":
        args["qkv"] = torch.zeros(2, (H + 2 * HKV) * D, device=device)
    if isinstance(args["inv_freq"], str):
        args["inv_freq"] = torch.zeros(D, device=device)
    if args["positions"] == "float":
        args["positions"] = torch.zeros(2, device=device)
    if args["k_out"] == "short":
        args["k_out"] = torch.zeros(1, HKV, 1, D, device=device)
    rotary_qkv(torch.zeros(1, 2, (H + 2 * HKV) * D, device=device), H, HKV, D, _inv_half(device), 0)  # a route, cached
    with pytest.raises((ValueError, TypeError), match=message):
        rotary_qkv(args.pop("qkv"), args.pop("n_heads"), args.pop("n_kv_heads"), args.pop("head_dim"),
                   args.pop("inv_freq"), args.pop("positions"), **args)
