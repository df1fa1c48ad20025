"""Weight-only int8 and int4 linear layers at decode: is the lab's dequantise-in-registers kernel at least as
fast as every PyTorch path for the same quantised weights?"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from experiments._margins import measured_margin
from experiments.spec import PARITY, READ, Case, Claim, Experiment, Profile
from kernels import reference
from kernels._gemv import device_sm_count
from kernels.dequant_linear import int4_gluon_refusal, int4_linear, int8_linear, plan_dequant_linear, prepack_int4
from kernels.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8

GROUP = 128
M_VALUES = (1, 2, 4, 8, 16, 64)
# A 4096-wide model's projections (Q/K/V fused 12288, the MLP's 14336) and an odd N no tile divides.
NK = ((4096, 4096), (12288, 4096), (14336, 4096), (11007, 4096))
# tinygemm's packing: innerKTiles 8 asks K to be a multiple of 8 * 16.
INNER_K_TILES = 8

LAB_SOURCES = ("kernels/dequant_linear.py", "kernels/int4_gluon.py", "kernels/quantize.py", "kernels/_gemv.py",
               "kernels/_checks.py")
# The lab's int4 subject runs the Gluon kernel (kernels/int4_gluon.py, on prepack_int4's weight) where it can run
# and for M up to this (every case's M); the Triton kernel elsewhere (other GPUs, the interpreter).
GLUON_MAX_M = 64
TORCH_SOURCES = ("kernels/quantize.py",)

# ‖out − ref‖ / ‖ref‖ against float64 dequantise-then-matmul of the same quantised weights. The lab's kernel
# accumulates in fp32 and rounds once at the output (half a unit, ~2e-3 in bf16); the PyTorch paths also
# round the dequantised weight to bf16 first (another half unit per weight). A wrong nibble, scale or group
# misses these bounds by an order of magnitude.
TOLERANCE = {torch.bfloat16: 1e-2}

BYTE_MODEL = (
    "int weights read once (N·K bytes for int8, N·K/2 for int4) + scales (N, or N·K/128, × 2 bytes) "
    "+ x read + y written (× 2 bytes)"
)


def _cases() -> tuple[Case, ...]:
    return tuple(
        Case(f"int{bits}-m{m}-n{n}-k{k}", {"BITS": bits, "M": m, "N": n, "K": k},
             f"{m} token{'s' if m > 1 else ''} through a {k} → {n} int{bits} projection")
        for bits in (8, 4)
        for n, k in NK
        for m in M_VALUES
    )


def bytes_moved(case: Case, dtype: torch.dtype) -> int:
    m, n, k, bits = case["M"], case["N"], case["K"], case["BITS"]
    weight = n * k if bits == 8 else n * k // 2
    scales = (n if bits == 8 else n * (k // GROUP)) * 2
    return weight + scales + (m * k + m * n) * 2


def flops(case: Case, dtype: torch.dtype) -> int:
    return 2 * case["M"] * case["N"] * case["K"]


def make_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """x ~ N(0, 1); W ~ N(0, 1/K) quantised by kernels/quantize.py (scales in bf16). int4 cases on CUDA also
    carry the same weights in tinygemm's layout (u = q + 8 with zero points 0), prepared outside the clock, and
    where the lab's Gluon kernel serves the case (_int4_impl) in prepack_int4's order as well."""
    m, n, k, bits = case["M"], case["N"], case["K"], case["BITS"]
    x = torch.randn(m, k, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=gen, dtype=torch.float32) / k**0.5).to(device=device, dtype=dtype)
    if bits == 8:
        weight, scales = quantize_int8(w)
        return {"x": x, "weight": weight, "scales": scales}
    weight, scales = quantize_int4(w, GROUP)
    inputs = {"x": x, "weight": weight, "scales": scales}
    if _int4_impl(case, dtype, torch.device(device)) == "gluon":
        inputs["prepacked"] = prepack_int4(weight, scales, GROUP)
    if torch.device(device).type == "cuda" and n % 8 == 0:  # tinygemm's packing needs N in multiples of 8
        q = reference.unpack_int4_reference(weight, GROUP)
        u = (q + 8).to(torch.int32)
        inputs["tinygemm_weight"] = torch.ops.aten._convert_weight_to_int4pack(
            (u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8), INNER_K_TILES)
        inputs["tinygemm_scales_zeros"] = torch.stack(
            [scales.t(), torch.zeros_like(scales.t())], dim=2).contiguous()  # [K/G, N, 2]
    return inputs


def float64_reference(x, weight, scales, **_):
    if weight.dtype == torch.int8:
        return reference.int8_linear_reference(x.double(), weight, scales.double())
    return reference.int4_linear_reference(x.double(), weight, scales.double(), GROUP)


def _int4_impl(case: Case, dtype: torch.dtype, device: torch.device) -> str:
    """The lab's int4 kernel for this case: "gluon" on a GPU it runs on for M <= GLUON_MAX_M, else "triton"."""
    gluon = case["BITS"] == 4 and case["M"] <= GLUON_MAX_M and int4_gluon_refusal(device, dtype) is None
    return "gluon" if gluon else "triton"


def lab_kernel(x, weight, scales, prepacked=None, **_):
    if weight.dtype == torch.int8:
        return int8_linear(x, weight, scales)
    if prepacked is not None:
        return int4_linear(x, prepacked)
    return int4_linear(x, weight, scales, GROUP)


def torch_dequant(x, weight, scales, **_):
    """Dequantise in x's dtype (a full-size weight written and read back), then F.linear."""
    if weight.dtype == torch.int8:
        return F.linear(x, dequantize_int8(weight, scales, x.dtype))
    return F.linear(x, dequantize_int4(weight, scales, GROUP, x.dtype))


@functools.cache
def _compiled_dequant():
    return torch.compile(torch_dequant, dynamic=False)


def compiled_dequant(x, weight, scales, **_):
    return _compiled_dequant()(x, weight, scales)


def int8pack_mm(x, weight, scales, **_):
    return torch.ops.aten._weight_int8pack_mm(x, weight, scales.to(x.dtype))


def int4pack_mm(x, tinygemm_weight, tinygemm_scales_zeros, **_):
    return torch.ops.aten._weight_int4pack_mm(x, tinygemm_weight, GROUP, tinygemm_scales_zeros)


# gemlite's layers, packed from the same quantised values on a profile's first call for each weight tensor
# (a warm-up call, outside the clock) and kept by the weight's address; each cached entry holds its weight,
# so no address is reused while the process lives. Symmetric int4 is gemlite's asymmetric form with zero 8.
_GEMLITE_LAYERS: dict[tuple, tuple] = {}


def _gemlite_layer(weight, scales, dtype):
    key = (weight.data_ptr(), scales.data_ptr(), tuple(weight.shape), weight.dtype, dtype)
    found = _GEMLITE_LAYERS.get(key)
    if found is None:
        from gemlite import helper

        if weight.dtype == torch.int8:
            layer = helper.A16W8_INT8(device=str(weight.device), dtype=dtype).from_weights(
                weight, scales=scales.float()[:, None])
        else:
            u = (reference.unpack_int4_reference(weight, GROUP) + 8).to(torch.uint8)
            layer = helper.A16Wn(device=str(weight.device), dtype=dtype).from_weights(
                u, scales.to(dtype), torch.full_like(scales, 8.0, dtype=dtype), W_nbits=4, group_size=GROUP)
        found = _GEMLITE_LAYERS[key] = (layer, weight, scales)
    return found[0]


def gemlite_linear(x, weight, scales, **_):
    """gemlite's A16W8 (int8 per channel) or A16Wn (int4, group 128) layer with its default settings."""
    return _gemlite_layer(weight, scales, x.dtype)(x)


def lab_plan(case: Case, dtype: torch.dtype) -> dict:
    """The plan int4_linear / int8_linear run for this case on this machine's GPU (its SM count)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if _int4_impl(case, dtype, device) == "gluon":
        from kernels.int4_gluon import plan_int4_gluon

        return {"impl": "gluon", "form": "dot", **plan_int4_gluon(case["M"], case["N"], case["K"], GROUP,
                                                  sm_count=device_sm_count(device))}
    plan = plan_dequant_linear(case["BITS"], case["M"], case["N"], case["K"], GROUP, device_sm_count(device))
    return {"impl": "triton", **plan.as_dict()}


def _only(bits: int):
    def unsupported(case: Case, dtype: torch.dtype) -> str | None:
        return None if case["BITS"] == bits else f"an int{bits} kernel; this case is int{case['BITS']}"

    return unsupported


def _int4pack_unsupported(case: Case, dtype: torch.dtype) -> str | None:
    if case["BITS"] != 4:
        return f"an int4 kernel; this case is int{case['BITS']}"
    if not torch.cuda.is_available():
        return "tinygemm's int4 kernel runs on CUDA only"
    if case["N"] % 8:
        return f"tinygemm's packing takes N in multiples of 8; N = {case['N']}"
    return None


def _gemlite_unsupported(case: Case, dtype: torch.dtype) -> str | None:
    if not torch.cuda.is_available():
        return "gemlite's kernels run on CUDA only"
    return None


PROFILES = (
    Profile("torch-dequant", "dequantise in PyTorch (the weight in bf16, written and read back), then F.linear",
            torch_dequant, TORCH_SOURCES),
    Profile("torch.compile", "the same dequantise-then-F.linear through torch.compile", compiled_dequant, TORCH_SOURCES),
    Profile("torch-int8pack-mm", "torch.ops.aten._weight_int8pack_mm: PyTorch's int8 weight-only kernel",
            int8pack_mm, unsupported=_only(8)),
    Profile("torch-int4pack-mm", "torch.ops.aten._weight_int4pack_mm: tinygemm, PyTorch's int4 kernel, on the "
            "same weights in its own packing (group 128, zero points 0)", int4pack_mm, unsupported=_int4pack_unsupported),
    Profile("gemlite", "gemlite 0.6 (Triton): A16W8 for int8, A16Wn with zero points 8 for int4, default settings, "
            "packed from the same quantised values outside the clock", gemlite_linear, TORCH_SOURCES,
            unsupported=_gemlite_unsupported, requires="gemlite"),
    Profile("triton-dequant", "the lab's kernel: int weights streamed once and dequantised in registers (int8: CUDA "
            "cores up to four tokens on small weights and one on wide ones; int4: tensor cores at every M), split-K "
            "over the SMs by a fixed plan", lab_kernel, LAB_SOURCES, plan=lab_plan),
)

EXPERIMENT = Experiment(
    slug="dequant-linear-decode",
    title="Weight-only int8 and int4 linear: decode",
    question=(
        "For M = 1, 2, 4, 8, 16 and 64 tokens through a 4096 → 4096, 12288, 14336 or 11007 projection with int8 "
        "(per-channel) or int4 (group 128) weights and bfloat16 activations, is the lab's dequantise-in-registers "
        "kernel at least as fast as the best of dequantise-then-F.linear (eager and torch.compile), PyTorch's own "
        "weight-only kernels and gemlite?"
    ),
    focus="Kernel fusion: dequantisation into the matrix product",
    why=(
        "Quantising weights to 8 or 4 bits pays at decode only if the product reads the small weights and "
        "nothing else: a decode step is a read of the weights. Dequantising first writes a full-size weight "
        "and reads it back, more bytes than the bf16 weight alone; a fused kernel reads half (int8) or a "
        "quarter (int4) of them, and must turn each into a float fast enough to keep up with DRAM."
    ),
    claim=Claim(
        subject="triton-dequant",
        baselines=("torch-dequant", "torch.compile", "torch-int8pack-mm", "torch-int4pack-mm", "gemlite"),
        threshold=1.0,
        statement="triton-dequant is at least as fast as the best PyTorch path for the same quantised weights at every point",
        short="dequant fusion claim",
        kind=PARITY,
        margin=measured_margin("dequant-linear-decode"),
    ),
    cases=_cases(),
    dtypes=(torch.bfloat16,),
    profiles=PROFILES,
    make_inputs=make_inputs,
    reference=float64_reference,
    bytes_moved=bytes_moved,
    byte_model=BYTE_MODEL,
    flops=flops,
    metrics=("latency", "throughput"),
    evidence_boundary=(
        "Forward only, bfloat16 activations, symmetric quantisation (int8 per output channel, int4 groups of 128 "
        "with zero points 0), each GPU model judged on its own; weights fresh in DRAM for every call (L2 flushed). Each PyTorch "
        "path runs the same quantised values in its own layout (tinygemm's packing is prepared outside the "
        "clock). Host time per call is shown on the eager-call clock, which is not the claim's; other group sizes, "
        "asymmetric schemes and M > 64 are outside it."
    ),
    tolerance=TOLERANCE,
    traffic=READ,  # the quantised weight and scales read; a few rows written
    source_file="experiments/dequant_linear_decode.py",
    row_inputs=("x",),
)
