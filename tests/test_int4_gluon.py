"""kernels/int4_gluon.py: the prepacking (exact round trip, everywhere) and the Gluon int4 GEMV against a float64
reference on the dequantised weights (Hopper GPUs only: Gluon kernels do not run in the interpreter)."""

from __future__ import annotations

import pytest
import torch

from kernels import dequant_linear as dl
from kernels import int4_gluon as ig
from kernels._gemv import counters_at_rest
from kernels.quantize import dequantize_int4, quantize_int4

# ‖out − ref‖ / ‖ref‖ against float64 on W rounded once to x's dtype: the output's rounding (2^-9 bf16,
# 2^-12 fp16) and the kernel's exact q * s against the reference's rounded one.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 3e-3}

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
gpu = pytest.mark.skipif(not HOPPER, reason="Gluon's wgmma kernel needs a CUDA GPU of capability 9.x")


def _weight(n: int, k: int, group: int, dtype=torch.bfloat16, device="cpu", seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    p, s = quantize_int4(w, group)
    return p.to(device), s.to(device)


@pytest.mark.parametrize("n,k,group", [(100, 256, 128), (64, 128, 32), (11007, 512, 128), (129, 1024, 256),
                                       (3, 192, 64)])
def test_prepack_round_trip(n, k, group):
    p, s = _weight(n, k, group, seed=n + k)
    packed = ig.prepack_int4(p, s, group)
    assert packed.weight.shape == (-(-n // 64), k // group, 128, group // 4)
    p2, s2 = ig.unprepack_int4(packed)
    assert torch.equal(p2, p) and torch.equal(s2, s)


def test_prepack_places_each_nibble():
    # One nonzero weight at a time lands where the module docstring says: thread 32w + 4r + t, word c,
    # nibble 4p + 2h + i for (row 16w + 8h + r, k = 16c + 8i + 2t + p).
    group = 32
    for row, col in [(0, 0), (9, 1), (17, 10), (63, 31), (40, 22)]:
        u = torch.full((64, group), 8, dtype=torch.uint8)
        u[row, col] = 3
        half = group // 2
        p = (u[:, :half] | (u[:, half:] << 4)).contiguous()
        packed = ig.prepack_int4(p, torch.ones(64, 1), group)
        w, h, r = row // 16, row % 16 // 8, row % 8
        c, i, t, pp = col // 16, col % 16 // 8, col % 8 // 2, col % 2
        j = 4 * pp + 2 * h + i
        byte = packed.weight[0, 0, 32 * w + 4 * r + t, 4 * c + j // 2]
        assert int(byte >> (4 * (j % 2))) & 0xF == 3
        assert int((packed.weight != 0x88).sum()) == 1


def test_rejects_what_it_does_not_serve():
    p, s = _weight(64, 256, 128)
    packed = ig.prepack_int4(p, s, 128)
    with pytest.raises(ValueError, match="group_size"):
        ig.prepack_int4(p, s, 96)
    with pytest.raises(ValueError, match="shape"):
        ig.prepack_int4(p, s[:, :1], 128)
    with pytest.raises(TypeError, match="prepack_int4"):
        ig.int4_linear_gluon(torch.randn(1, 256), (p, s), 128)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        ig.int4_linear_gluon(torch.randn(1, 256), packed, 128)
    with pytest.raises(ValueError, match="1 <= M <= 64"):
        ig.int4_linear_gluon(torch.randn(65, 256, dtype=torch.bfloat16), packed, 128)
    with pytest.raises(ValueError, match="group_size"):
        ig.int4_linear_gluon(torch.randn(1, 256, dtype=torch.bfloat16), packed, 64)
    with pytest.raises(ValueError, match="K = 128"):
        ig.int4_linear_gluon(torch.randn(1, 128, dtype=torch.bfloat16), packed, 128)


def test_plan_splits_k_into_runs_of_whole_chunks():
    # up to 8 rows: one group a chunk, the smallest split giving at least 3.5 programs an SM (462 of 132)
    assert [ig.plan_int4_gluon(m, 4096, 4096, 128)["GPC"] for m in (1, 8, 9)] == [1, 1, 2]
    assert ig.plan_int4_gluon(1, 4096, 4096, 128, sm_count=132)["SPLIT"] == 8  # 64 tiles: 512 programs
    assert ig.plan_int4_gluon(1, 14336, 4096, 128, sm_count=132)["SPLIT"] == 4  # 224 tiles: 896, not 448
    assert ig.plan_int4_gluon(1, 12288, 4096, 128, sm_count=132)["SPLIT"] == 4  # 192 tiles: 768, not 384
    assert ig.plan_int4_gluon(9, 14336, 4096, 128, sm_count=132)["SPLIT"] == 2  # from 9 rows two an SM: 448
    # a split need not divide the chunks (uneven runs of K): three chunks split two ways, 86 eight ways
    assert ig.plan_int4_gluon(1, 4096, 384, 128) == dict(G=128, GPC=1, WG=1, MP=8, SPLIT=2, num_warps=4)
    assert ig.plan_int4_gluon(1, 4096, 11008, 128, sm_count=132)["SPLIT"] == 8
    assert ig.plan_int4_gluon(1, 4096, 128, 128, sm_count=132)["SPLIT"] == 1  # one chunk: no split
    assert ig.plan_int4_gluon(9, 4096, 4096, 128)["MP"] == 16
    assert [ig.plan_int4_gluon(m, 4096, 4096, 128)["MP"] for m in (17, 32, 33, 64)] == [32, 32, 64, 64]
    # two groups a chunk spill at MP = 64 (255 registers): one there
    assert [ig.plan_int4_gluon(m, 4096, 4096, 128)["GPC"] for m in (32, 33)] == [2, 1]
    # from MP = 32 one program an SM (each split's partial grows with MP): 224 tiles at N = 14336 need no split
    assert [ig.plan_int4_gluon(m, 14336, 4096, 128, sm_count=132)["SPLIT"] for m in (16, 17, 64)] == [2, 1, 1]
    assert ig.plan_int4_gluon(64, 4096, 4096, 128, sm_count=132)["SPLIT"] == 4  # 64 tiles: 256 programs
    with pytest.raises(ValueError, match="divide"):
        ig.plan_int4_gluon(1, 4096, 384, 128, gpc=2)
    assert ig.plan_int4_gluon(1, 100, 4096, 256)["GPC"] == 1  # at most 256 k a chunk


def _check(m, n, k, group, dtype, gpc=None, wg=None, seed=0):
    p, s = _weight(n, k, group, dtype, "cuda", seed)
    packed = ig.prepack_int4(p, s, group)
    x = torch.randn(m, k, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    y = ig.int4_linear_gluon(x, packed, group, out=out, gpc=gpc, wg=wg)
    torch.cuda.synchronize()
    assert y is out and not y.isnan().any(), "unwritten or NaN outputs"
    ref = x.double() @ dequantize_int4(p, s, group, dtype).double().t()
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < TOLERANCE[dtype], f"M={m} N={n} K={k} G={group} {dtype}: relative error {err:.2e}"
    assert counters_at_rest(x.device)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 17, 33, 64])
@pytest.mark.parametrize("n", [100, 4096, 11007])
def test_matches_float64(m, n, dtype):
    _check(m, n, 4096, 128, dtype, seed=m * 7 + n)


@gpu
@pytest.mark.parametrize("k,group,gpc,wg", [(384, 128, None, None), (4096, 128, 4, 2), (4096, 128, 1, 2),
                                            (1024, 32, None, None), (2048, 64, 2, 1), (4096, 256, None, None),
                                            (4096, 128, 2, 1), (1280, 128, 1, 1), (11008, 128, None, None),
                                            (11008, 128, 2, None), (1408, 128, 1, None)])
@pytest.mark.parametrize("m", [1, 16])
def test_other_plans_and_groups(m, k, group, gpc, wg):
    _check(m, 1000, k, group, torch.bfloat16, gpc, wg, seed=k + group)


@gpu
def test_deterministic():
    p, s = _weight(4096, 4096, 128, torch.bfloat16, "cuda")
    packed = ig.prepack_int4(p, s, 128)
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)
    first = ig.int4_linear_gluon(x, packed, 128)
    for _ in range(5):
        assert torch.equal(ig.int4_linear_gluon(x, packed, 128), first)


@gpu
@pytest.mark.parametrize("m,n,k,dtype", [(1, 4096, 4096, torch.bfloat16), (16, 1000, 4096, torch.float16),
                                         (64, 100, 1024, torch.bfloat16), (5, 4096, 11008, torch.bfloat16)])
def test_bound_launch_equals_the_jit_launch(m, n, k, dtype):
    # int4_linear_gluon launches through a bound launcher (kernels/_launch.py), one per specialisation; the
    # launcher must write exactly what kernel[grid] writes with the same plan, and be reused, not rebound.
    p, s = _weight(n, k, 128, dtype, "cuda", seed=m + n)
    packed = ig.prepack_int4(p, s, 128)
    x = torch.randn(m, k, device="cuda").to(dtype)
    ig._LAUNCHERS.clear()
    y = ig.int4_linear_gluon(x, packed, 128)
    launchers = dict(ig._LAUNCHERS)
    assert [getattr(launch, "mode", None) for launch in launchers.values()] in (["raw"], ["run"])  # not "jit"
    x2 = torch.randn(m, k, device="cuda").to(dtype)
    y2 = ig.int4_linear_gluon(x2, packed, 128, out=torch.full_like(y, float("nan")))
    assert ig._LAUNCHERS == launchers, "a second call with the same specialisation bound another launcher"
    meta = ig.plan_int4_gluon(m, n, k, 128, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    n_tiles = -(-n // (ig.BLOCK_ROWS * meta["WG"]))
    for inp, got in ((x, y), (x2, y2)):
        want = torch.full_like(got, float("nan"))
        if meta["SPLIT"] > 1:
            part, counts = ig.workspace(n_tiles * meta["SPLIT"] * ig.BLOCK_ROWS * meta["WG"] * meta["MP"], n_tiles,
                                        inp.device)
        else:
            part = counts = want
        offset_bits, sub = ig._OFFSET[dtype]
        ig._int4_gemv_kernel[(n_tiles * meta["SPLIT"], )](
            inp, packed.weight.view(torch.int32), packed.scales, want, part, counts, m, n, k, inp.stride(0),
            packed.scales.stride(0), want.stride(0), MAGIC_BITS=ig._MAGIC[dtype][0], OFFSET_BITS=offset_bits,
            SUB=sub, **meta)
        torch.cuda.synchronize()
        assert torch.equal(got, want)
    assert counters_at_rest(x.device)


# --------------------------------------------------------------------------------------------------------
# The public path: kernels.dequant_linear.int4_linear on a prepacked weight
# --------------------------------------------------------------------------------------------------------


def test_quantize_helpers_take_the_prepacked_weight_exactly():
    from kernels.quantize import unpack_int4

    p, s = _weight(70, 256, 64, seed=3)
    packed = dl.prepack_int4(p, s, 64)
    assert torch.equal(unpack_int4(packed), unpack_int4(p, 64))
    assert torch.equal(dequantize_int4(packed, dtype=torch.float64), dequantize_int4(p, s, 64, torch.float64))
    with pytest.raises(ValueError, match="carries its scales and group size"):
        dequantize_int4(packed, s, 64)
    with pytest.raises(ValueError, match="carries its scales and group size"):
        unpack_int4(packed, 128)
    with pytest.raises(TypeError, match="prepack_int4: w_packed must be uint8"):
        dl.prepack_int4(p.to(torch.int8), s, 64)


def test_the_weight_names_the_kernel_and_bad_calls_say_why():
    p, s = _weight(64, 256, 128)
    packed = dl.prepack_int4(p, s, 128)
    assert dl.int4_linear_impl(packed) == "gluon" and dl.int4_linear_impl(p) == "triton"
    x = torch.randn(1, 256, dtype=torch.bfloat16, device=packed.device)
    with pytest.raises(TypeError, match="carries its scales"):
        dl.int4_linear(x, packed, s)
    with pytest.raises(ValueError, match="does not match the prepacked weight's 128"):
        dl.int4_linear(x, packed, group_size=64)
    with pytest.raises(ValueError, match="K = 256"):
        dl.int4_linear(torch.randn(1, 128, dtype=torch.bfloat16), packed)
    with pytest.raises(TypeError, match="scales .* are required"):
        dl.int4_linear(x, p)
    if not HOPPER:  # here the CPU (interpreter or not) or another GPU: the Gluon kernel refuses with the reason
        assert dl.int4_gluon_refusal(x.device) is not None
        with pytest.raises(ValueError, match="cannot run here: .*unprepack"):
            dl.int4_linear(x, packed)


@gpu
@pytest.mark.parametrize("shape", [(1, 4096), (16, 4096), (3, 7, 4096), (64, 4096)])
def test_int4_linear_runs_the_gluon_kernel_on_prepacked_weights(shape):
    p, s = _weight(1000, 4096, 128, torch.bfloat16, "cuda", seed=len(shape))
    packed = dl.prepack_int4(p, s, 128)
    x = torch.randn(*shape, device="cuda").to(torch.bfloat16)
    y = dl.int4_linear(x, packed)
    ref = x.double() @ dequantize_int4(p, s, 128, torch.bfloat16).double().t()
    assert y.shape == (*shape[:-1], 1000)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < TOLERANCE[torch.bfloat16], err
    assert torch.equal(y[..., :5], dl.int4_linear(x, packed)[..., :5])
