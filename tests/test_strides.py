"""Every public entry point gives the same answer for any layout of its inputs, or refuses the layout by name.

Property: for a call f(t1, t2, ...) and views v1, v2, ... that hold the same values as t1, t2, ... in other
layouts (a slice of a larger tensor, every second element along a dimension, a permuted storage order, a
misaligned start, or a dimension expanded from size 1, stride 0), f(v1, v2, ...) equals f(c1, c2, ...) with
ci = vi.contiguous(). Storage a view does not cover is poisoned (NaN, or an out-of-range integer), so a kernel
that reads with the wrong stride reads poison. An output the caller hands in (rotary_qkv's k_out and v_out, a
KV cache) is compared after the call, and must be written exactly where the view says.

Equality: the same kernel on the same values may take another launch plan for another layout (softmax's plan
reads the row stride; alignment picks other loads), so results are compared within ‖a − b‖ / ‖b‖ <= SAME, one
to two roundings of the output dtype: a stride ignored costs 10-1000x more (a batch slice of rotary_qkv's qkv
read with the wrong stride gave 1.2).

Every input layout is served (read in place, or copied once where the docstring says so). Only a tensor
written in place (rotary_qkv's k_out and v_out, the block's KV cache) may be refused, and only for elements
that overlap (stride 0) or a strided head_dim: then a ValueError must name the tensor and what is accepted
(_refused_outputs). Any other exception fails.
"""

from __future__ import annotations

import random

import pytest
import torch
from accuracy import rel_err

from kernels import add_rmsnorm, attention, int4_linear, int8_linear, rmsnorm_linear, softmax, swiglu, swiglu_packed
from kernels.decoder_block import LabDecoderBlock
from kernels.kv_cache import KVCache
from kernels.quantize import quantize_int4, quantize_int8
from kernels.reference_decoder import DecoderConfig, DecoderWeights, rotary_inv_freq
from kernels.rotary import rotary_qkv

# One to two roundings of the output dtype, relative (bf16 2^-8, fp16 2^-11, fp32 2^-24), norm-wise.
SAME = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
KINDS = ("sliced", "stepped", "permuted", "offset", "expanded")
# A case is one kind for every input, or "mixed-<seed>": each input draws its own kind.
CASES = [*KINDS, "mixed-11", "mixed-12"]
POISON_INT = {torch.int8: -128, torch.uint8: 0xFF, torch.int32: 1 << 20, torch.int64: 1 << 20, torch.bool: True}


def _poison(storage: torch.Tensor) -> torch.Tensor:
    if storage.is_floating_point():
        return storage.fill_(float("nan"))
    return storage.fill_(POISON_INT[storage.dtype])


def strided_view(t: torch.Tensor, kind: str, rng: random.Random) -> torch.Tensor:
    """A view holding t's values (for "expanded": t's first slice along one dimension, repeated) in another
    layout; the storage it does not cover is poisoned."""
    shape = tuple(t.shape)
    if kind == "expanded":
        dims = [d for d, n in enumerate(shape) if n > 1]
        if not dims:
            return t.clone()
        d = rng.choice(dims)
        return t.narrow(d, 0, 1).clone().expand(shape)
    if kind == "offset":  # one element past an aligned start: other alignment, other specialisation
        storage = _poison(torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device))
        view = storage[1:].view(shape)
    elif kind == "permuted":
        order = list(range(t.dim()))
        while len(order) > 1 and order == sorted(order):
            rng.shuffle(order)
        storage = _poison(torch.empty([shape[d] for d in order], dtype=t.dtype, device=t.device))
        view = storage.permute([order.index(d) for d in range(t.dim())])
    elif kind == "sliced":  # t inside a larger tensor, at an offset along every dimension
        extra = [rng.randint(1, 3) for _ in shape]
        storage = _poison(torch.empty([n + e for n, e in zip(shape, extra)], dtype=t.dtype, device=t.device))
        view = storage[tuple(slice(e // 2, e // 2 + n) for n, e in zip(shape, extra))]
    elif kind == "stepped":  # every second or third element along one dimension (x[::2])
        d, step = rng.randrange(t.dim()), rng.choice((2, 3))
        big = list(shape)
        big[d] *= step
        storage = _poison(torch.empty(big, dtype=t.dtype, device=t.device))
        view = storage[tuple(slice(None, None, step if i == d else None) for i in range(t.dim()))]
    else:
        raise ValueError(kind)
    view.copy_(t)
    return view


def _views(tensors: dict, case: str) -> dict:
    """Views of the tensors among `tensors` for one case; other entries (ints) stay as they are."""
    rng = random.Random(case)
    out = {}
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            out[name] = strided_view(t, rng.choice(KINDS) if case.startswith("mixed") else case, rng)
        else:
            out[name] = t
    return out


def _dense(args: dict) -> dict:
    return {n: t.contiguous() if isinstance(t, torch.Tensor) else t for n, t in args.items()}


def _same(a, b, what: str = "output") -> None:
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{what}[{i}]")
        return
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape} {a.dtype} against {b.shape} {b.dtype}"
    if torch.equal(a, b):
        return
    assert not torch.isnan(a).any() or torch.isnan(b).any(), f"{what}: NaN where the contiguous call has none (poison read)"
    err = rel_err(a.double(), b.double())
    assert err <= SAME[a.dtype], f"{what}: relative difference {err:.3e} from the contiguous call > {SAME[a.dtype]:.0e}"


def _check(fn, args: dict, case: str) -> None:
    """fn(**views) equals fn(**contiguous copies of the views)."""
    views = _views(args, case)
    _same(fn(**views), fn(**_dense(views)))


def _randn(gen, *shape, dtype=torch.bfloat16, device="cpu", scale=1.0):
    return (scale * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------------------
# The public kernels (kernels/__init__.py)
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_add_rmsnorm(case, device, gen):
    args = {"x": _randn(gen, 2, 3, 48, device=device), "residual": _randn(gen, 2, 3, 48, device=device),
            "gamma": _randn(gen, 48, device=device)}
    _check(lambda x, residual, gamma: add_rmsnorm(x, residual, gamma, 1e-6), args, case)


@pytest.mark.parametrize("case", CASES)
def test_attention(case, device, gen):
    args = {"q": _randn(gen, 2, 2, 5, 64, device=device), "k": _randn(gen, 2, 1, 7, 64, device=device),
            "v": _randn(gen, 2, 1, 7, 64, device=device),
            "key_mask": torch.rand(2, 7, generator=gen).to(device) > 0.3}
    args["key_mask"][:, 0] = True
    _check(lambda q, k, v, key_mask: attention(q, k, v, causal=True, key_mask=key_mask), args, case)


@pytest.mark.parametrize("case", CASES)
def test_int8_linear(case, device, gen):
    w_q, scales = quantize_int8(_randn(gen, 24, 64, device=device))
    args = {"x": _randn(gen, 3, 64, device=device), "w_q": w_q, "scales": scales}
    _check(int8_linear, args, case)


@pytest.mark.parametrize("case", CASES)
def test_int4_linear(case, device, gen):
    w_packed, scales = quantize_int4(_randn(gen, 24, 64, device=device), 32)
    args = {"x": _randn(gen, 2, 2, 64, device=device), "w_packed": w_packed, "scales": scales}
    _check(lambda x, w_packed, scales: int4_linear(x, w_packed, scales, 32), args, case)


@pytest.mark.parametrize("rows", [3, 40], ids=["gemv", "tiled"])
@pytest.mark.parametrize("case", CASES)
def test_rmsnorm_linear(case, rows, device, gen):
    args = {"x": _randn(gen, rows, 32, device=device), "weight": _randn(gen, 24, 32, device=device, scale=0.2),
            "gamma": _randn(gen, 32, device=device)}
    _check(rmsnorm_linear, args, case)


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("case", CASES)
def test_softmax(case, dim, device, gen):
    args = {"x": _randn(gen, 3, 4, 37, dtype=torch.float32, device=device)}
    _check(lambda x: softmax(x, dim), args, case)


@pytest.mark.parametrize("case", CASES)
def test_swiglu(case, device, gen):
    args = {"a": _randn(gen, 2, 3, 40, device=device), "b": _randn(gen, 2, 3, 40, device=device)}
    _check(swiglu, args, case)


@pytest.mark.parametrize("case", CASES)
def test_swiglu_packed(case, device, gen):
    args = {"ab": _randn(gen, 2, 3, 80, device=device)}
    _check(swiglu_packed, args, case)


# --------------------------------------------------------------------------------------------------------
# rotary_qkv and the decoder block
# --------------------------------------------------------------------------------------------------------

CONFIG = DecoderConfig(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, intermediate=192)
H, HKV, D = CONFIG.n_heads, CONFIG.n_kv_heads, CONFIG.head_dim


def _overlapping(t: torch.Tensor) -> bool:
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def _refused_outputs(views: dict):
    """Outputs are written in place: one whose elements overlap, or whose head_dim is strided, is refused."""
    for name in ("k_out", "v_out"):
        t = views.get(name)
        if t is not None and _overlapping(t):
            return f"{name} .*overlap"
        if t is not None and t.stride(-1) != 1:
            return f"{name} .*unit stride"
    return None


def _rotary_args(gen, device, positions: str, dtype=torch.bfloat16, batch=2, seq=3):
    args = {"qkv": _randn(gen, batch, seq, (H + 2 * HKV) * D, dtype=dtype, device=device),
            "inv_freq": rotary_inv_freq(CONFIG, device, torch.float32)[:D // 2].contiguous()}
    if positions == "tensor":
        args["positions"] = torch.tensor([5, 1, 9][:seq], device=device)
    return args


@pytest.mark.parametrize("positions", ["int", "tensor"])
@pytest.mark.parametrize("case", CASES)
def test_rotary_qkv_inputs(case, positions, device, gen):
    args = _rotary_args(gen, device, positions)

    def run(qkv, inv_freq, positions=4):
        return rotary_qkv(qkv, H, HKV, D, inv_freq, positions)

    _check(run, args, case)


@pytest.mark.parametrize("case", CASES)
def test_rotary_qkv_outputs(case, device, gen):
    """k_out and v_out: views of caches in any layout; compared after the call, poison around them untouched."""
    args = _rotary_args(gen, device, "tensor")
    nan = torch.full((2, HKV, 3, D), float("nan"), dtype=torch.bfloat16, device=device)
    views = _views({"k_out": nan, "v_out": nan.clone()}, case)
    reason = _refused_outputs(views)
    if reason is not None:
        with pytest.raises(ValueError, match=reason):
            rotary_qkv(args["qkv"], H, HKV, D, args["inv_freq"], args["positions"], **views)
        return
    bases = [t._base if t._base is not None else t for t in (views["k_out"], views["v_out"])]
    nans = [torch.isnan(t).sum().item() for t in bases]  # the views' elements and the poison around them
    q, k, v = rotary_qkv(args["qkv"], H, HKV, D, args["inv_freq"], args["positions"], **views)
    assert k.data_ptr() == views["k_out"].data_ptr() and v.data_ptr() == views["v_out"].data_ptr()
    _same((q, views["k_out"].clone(), views["v_out"].clone()),
          rotary_qkv(args["qkv"], H, HKV, D, args["inv_freq"], args["positions"]))
    for base, view, before in zip(bases, (views["k_out"], views["v_out"]), nans):
        assert torch.isfinite(view).all(), "an element of k_out or v_out was left unwritten"
        assert torch.isnan(base).sum().item() == before - view.numel(), "a write landed outside k_out or v_out"


def _block(dtype=torch.bfloat16, device="cpu", quant=None):
    return LabDecoderBlock(DecoderWeights.random(CONFIG, dtype, device, seed=1), CONFIG, quant=quant, group_size=64)


BLOCKS: dict = {}


def _cached_block(device, quant=None):
    key = (device, quant)
    if key not in BLOCKS:
        BLOCKS[key] = _block(device=device, quant=quant)
    return BLOCKS[key]


# The contiguous calls made so far, as (inputs, output): most cases draw the same x from the seeded `gen` (an
# expanded view repeats values, so not all), and the block's forward on contiguous inputs equal to earlier
# ones is taken from here, not run again (seconds in the interpreter).
DENSE_FORWARD: list = []


@pytest.mark.parametrize("positions", [None, "1d", "2d"])
@pytest.mark.parametrize("case", CASES)
def test_block_forward(case, positions, device, gen):
    block = _cached_block(device)
    args = {"x": _randn(gen, 2, 3, CONFIG.hidden, device=device)}
    if positions == "1d":
        args["positions"] = torch.tensor([0, 2, 7], device=device)
    elif positions == "2d":
        args["positions"] = torch.tensor([[0, 2, 7], [1, 3, 4]], device=device)
    views = _views(args, case)
    dense = _dense(views)
    expected = next((out for seen, out in DENSE_FORWARD if seen.keys() == dense.keys() and all(
        seen[n].device == dense[n].device and torch.equal(seen[n], dense[n]) for n in dense)), None)
    if expected is None:
        expected = block.forward(**dense)
        DENSE_FORWARD.append((dense, expected))
    _same(block.forward(**views), expected)


@pytest.mark.parametrize("case", CASES)
def test_block_decode(case, device, gen):
    """x and the cache in any layout: the same output, and the same cache afterwards."""
    block = _cached_block(device)
    x = _randn(gen, 2, 1, CONFIG.hidden, device=device)
    filled = KVCache.allocate(CONFIG, 2, 6, torch.bfloat16, device).fill(4, seed=3)
    views = _views({"x": x, "k": filled.k, "v": filled.v}, case)
    cache = KVCache(views["k"], views["v"])
    reason = _refused_outputs({"k_out": cache.k, "v_out": cache.v})
    if reason is not None:
        with pytest.raises(ValueError, match=r"the cache's [kv] has strides .* written in place"):
            block.decode(views["x"], cache, 4)
        return
    dense = KVCache(cache.k.contiguous(), cache.v.contiguous())
    out = block.decode(views["x"], cache, 4)
    _same((out, cache.k, cache.v), (block.decode(views["x"].contiguous(), dense, 4), dense.k, dense.v))


@pytest.mark.parametrize("quant", [None, "int8"])
def test_block_from_strided_weights(quant, device, gen):
    """Weights handed over as views (slices, transposed storage, expanded) make the same block."""
    weights = DecoderWeights.random(CONFIG, torch.bfloat16, device, seed=1)
    rng = random.Random(5)
    views = DecoderWeights(**{n: strided_view(t, rng.choice(KINDS), rng) for n, t in weights.tensors().items()})
    x = _randn(gen, 1, 2, CONFIG.hidden, device=device)
    a = LabDecoderBlock(views, CONFIG, quant=quant)
    b = LabDecoderBlock(DecoderWeights(**_dense(views.tensors())), CONFIG, quant=quant)
    _same(a(x), b(x))
