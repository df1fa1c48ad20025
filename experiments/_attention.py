"""Profiles, inputs, byte and FLOP models shared by the attention experiments (not an experiment itself).

Every point holds B·S = 16,384 tokens and H·D = 2,048 (the shapes of the SDPA anchors): S from 512 to
16,384 plus a ragged 3,000 (B = 5, 15,000 tokens), D = 64 (H = 32) and 128 (H = 16), causal and not, with
as many key/value heads as query heads; then grouped-query cases (D = 128, 16 query heads over Hkv = 4
key/value heads, so each K/V head serves 4 query heads) at S = 2,048, 8,192 and 16,384, causal and not.
Every profile takes the grouped heads as they are: the lab's kernel and torch's SDPA (enable_gqa=True) read
the Hkv heads, the unfused reference repeats them to H before its products. A case's shape names Hkv only
where it differs from H; the models read a missing Hkv as H (older records' shapes).

Correctness at every size, large ones included: the runner compares each profile's whole output (every
query row of every head; in the backward each of dQ, dK and dV, the worst part counting) with a float64
reference computed on the GPU, query chunk by query chunk (kernels.reference_attention.attention_float64 and
attention_backward_float64), so its scores never exist whole: at S = 16,384 a chunk is 256 queries of
16 heads, 512 MiB of float64 scores. Its cost is two (forward) or six (backward) float64 products of 2·B·H·S²·D
FLOPs on the float64 tensor cores, well under a second a point on an H100.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
import torch.nn.functional as F

from experiments.spec import Case, PointColumn, Profile
from kernels import reference_attention as reference
from kernels.attention import attention, plan_backward_on, plan_forward_on

TOKENS = 16384
WIDTH = 2048  # H·D
SEQS = (512, 1024, 2048, 3000, 4096, 8192, 16384)
HEAD_DIMS = (128, 64)
# Grouped-query cases: head dim (so H = WIDTH // 128 = 16 query heads), key/value heads, sequence lengths.
GQA_HEAD_DIM, GQA_KV_HEADS = 128, 4
GQA_SEQS = (2048, 8192, 16384)
ATTENTION_SOURCES = ("kernels/attention.py", "kernels/attention_kernels.py", "kernels/attention_gluon.py",
                     "kernels/attention_bwd_gluon.py", "kernels/attention_bwd_q_gluon.py",
                     "kernels/attention_choice.py", "kernels/_checks.py")
REFERENCE_SOURCES = ("kernels/reference_attention.py",)

# The unfused path's scores, bytes per score: S in bf16, S and P in fp32, P in bf16 (attention_reference)
# in the forward; the backward adds their four gradients. Past UNFUSED_MAX_BYTES of them it is not run.
UNFUSED_SCORE_BYTES = {"forward": 12, "backward": 24}
UNFUSED_MAX_BYTES = 16 << 30

# ‖out − ref‖ / ‖ref‖ accepted against float64, per dtype: a few units of the storage rounding of P and of
# the output (bf16 2^-8, fp16 2^-11 relative), with room for long rows (tests/test_attention.py measures the
# same error on small shapes, within a factor of torch's own).
FORWARD_TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
BACKWARD_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}

# Backends by the name of their SDPBackend member, looked up at call time: the enum's members are pybind11
# objects that cannot be serialised, and a cluster run sends each declaration to its worker.
SDPA_BACKENDS = {
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
}
BASELINES = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch.compile")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_heads(case: Case) -> int:
    """Hkv, the key/value heads (H where the shape does not name it)."""
    return case.shape.get("Hkv", case["H"])


def scores(case: Case) -> int:
    """B·H·S²: the scores the unfused path materialises (all of them, causal or not)."""
    return case["B"] * case["H"] * case["S"] ** 2


def unfused_bytes(case: Case, direction: str) -> int:
    return scores(case) * UNFUSED_SCORE_BYTES[direction]


def _case(seq: int, head_dim: int, causal: bool, kv: int | None = None) -> Case:
    """The point at S = seq: B·S = TOKENS (rounded), H·D = WIDTH; kv key/value heads (None: H)."""
    batch, heads = max(1, round(TOKENS / seq)), WIDTH // head_dim
    shape = {"B": batch, "H": heads, **({"Hkv": kv} if kv is not None else {}), "S": seq, "D": head_dim,
             "causal": int(causal)}
    group = "" if kv is None else f"-h{heads}kv{kv}"
    case = Case(f"d{head_dim}{group}-{'causal' if causal else 'full'}-s{seq}", shape)
    return Case(case.name, case.shape, _describe(case))


def cases() -> tuple[Case, ...]:
    out = [_case(seq, head_dim, causal) for head_dim in HEAD_DIMS for causal in (False, True) for seq in SEQS]
    out += [_case(seq, GQA_HEAD_DIM, causal, GQA_KV_HEADS) for causal in (False, True) for seq in GQA_SEQS]
    return tuple(out)


def _describe(case: Case) -> str:
    tokens = case["B"] * case["S"]
    mask = "causal (key j ≤ query i)" if case["causal"] else "every key"
    heads = "" if kv_heads(case) == case["H"] else (
        f", grouped-query: {case['H']} query heads over {kv_heads(case)} key/value heads")
    return (f"{tokens:,} tokens, {mask}{heads}; the unfused path's {scores(case):,} scores take "
            f"{unfused_bytes(case, 'forward') / 2**30:.1f} GiB in the forward, "
            f"{unfused_bytes(case, 'backward') / 2**30:.1f} GiB in the backward")


def flops(case: Case, dtype: torch.dtype) -> int:
    """4·B·H·S²·D (QKᵀ and PV), halved when causal."""
    total = 4 * case["B"] * case["H"] * case["S"] ** 2 * case["D"]
    return total // 2 if case["causal"] else total


def backward_flops(case: Case, dtype: torch.dtype) -> int:
    """2.5× the forward's: dV, dP, dQ and dK products plus the recomputation of S."""
    return 5 * flops(case, dtype) // 2


def _rows(case: Case) -> tuple[int, int]:
    """(B·H·S, B·Hkv·S): the query heads' rows and the key/value heads' rows."""
    return case["B"] * case["H"] * case["S"], case["B"] * kv_heads(case) * case["S"]


def forward_bytes(case: Case, dtype: torch.dtype) -> int:
    """The least a fused forward moves: Q, K, V read once, O written once, the fp32 lse written; K and V
    at the case's key/value heads."""
    rows, kv_rows = _rows(case)
    return (2 * rows + 2 * kv_rows) * case["D"] * element_size(dtype) + 4 * rows


def backward_bytes(case: Case, dtype: torch.dtype) -> int:
    """The least a fused backward moves: Q, K, V, O, dO and lse read once; dQ, dK, dV written once; K, V, dK
    and dV at the case's key/value heads."""
    rows, kv_rows = _rows(case)
    return (4 * rows + 4 * kv_rows) * case["D"] * element_size(dtype) + 4 * rows


def _draw(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def forward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """q ~ N(0, 1) of shape (B, H, S, D), k and v of shape (B, Hkv, S, D); `causal` a CPU bool the profiles
    read without a device sync."""
    q_shape = (case["B"], case["H"], case["S"], case["D"])
    kv_shape = (case["B"], kv_heads(case), case["S"], case["D"])
    inputs = {name: _draw(q_shape if name == "q" else kv_shape, dtype, device, gen) for name in ("q", "k", "v")}
    inputs["causal"] = torch.tensor(bool(case["causal"]))
    return inputs


def backward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """forward_inputs and the upstream gradient dO ~ N(0, 1)."""
    inputs = forward_inputs(case, dtype, device, gen)
    inputs["do"] = _draw(inputs["q"].shape, dtype, device, gen)
    return inputs


def forward_reference(q, k, v, causal):
    return reference.attention_float64(q, k, v, bool(causal))


def backward_reference(q, k, v, do, causal):
    return reference.attention_backward_float64(q, k, v, do, bool(causal))


# ---- the implementations, as functions of (q, k, v, causal) ---------------------------------------------


def _lab(q, k, v, causal):
    return attention(q, k, v, causal=causal)


def _sdpa(backend: str):
    def run(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel  # imported here: the closure must serialise

        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    return run


IMPLEMENTATIONS = {
    "triton-fused": _lab,
    **{name: _sdpa(backend) for name, backend in SDPA_BACKENDS.items()},
    "torch.compile": reference.compiled_attention,
    "unfused": reference.attention_reference,
}
DESCRIPTIONS = {
    "triton-fused": "the lab's fused attention (kernels/attention.py): online softmax over key tiles, fixed tiles; "
                    "grouped heads read their shared K/V head",
    **{name: f"torch's scaled_dot_product_attention pinned to the {backend} backend; enable_gqa=True on the "
              "grouped-query cases" for name, backend in (("sdpa-cudnn", "cuDNN"), ("sdpa-flash", "FlashAttention-2"),
                                                          ("sdpa-efficient", "memory-efficient"))},
    "torch.compile": "the unfused reference (QKᵀ → mask → softmax in fp32 → PV) through torch.compile; grouped "
                     "K/V heads repeated to the query heads first",
    "unfused": "the unfused reference in eager PyTorch: every score written and read back; grouped K/V heads "
               "repeated to the query heads first",
}


def _forward_run(name: str):
    impl = IMPLEMENTATIONS[name]
    return lambda q, k, v, causal: impl(q, k, v, bool(causal))


# One forward graph per backward profile and inputs, freed when the runner drops the inputs: each timed
# call runs the backward alone, through autograd, as a training step would.
_SAVED: dict[tuple, tuple] = {}


def _backward_run(name: str):
    impl = IMPLEMENTATIONS[name]

    def run(q, k, v, do, causal):
        key = (name, id(q), id(k), id(v), id(do), bool(causal))
        if key not in _SAVED:
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
            _SAVED[key] = (leaves, impl(*leaves, bool(causal)))
            weakref.finalize(q, _SAVED.pop, key, None)
        leaves, out = _SAVED[key]
        return torch.autograd.grad(out, leaves, do, retain_graph=True)

    return run


# ---- unsupported ----------------------------------------------------------------------------------------


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.cache
def _sdpa_refusal(name: str, head_dim: int, dtype: torch.dtype, causal: bool, backward: bool,
                  group: int = 1) -> str | None:
    """Why torch's backend `name` cannot run this head_dim, dtype and mask with `group` query heads to a
    key/value head (it is asked on a 128-token input, enable_gqa=True where group > 1), or None."""
    q = torch.zeros(1, group, 128, head_dim, dtype=dtype, device=_device(), requires_grad=backward)
    kv = torch.zeros(1, 1, 128, head_dim, dtype=dtype, device=_device(), requires_grad=backward)
    with warnings.catch_warnings(record=True) as caught:  # torch says why a backend declines in warnings
        warnings.simplefilter("always")
        try:
            out = _sdpa(SDPA_BACKENDS[name])(q, kv, kv, causal)
            if backward:
                out.sum().backward()
        except RuntimeError as exc:
            why = "; ".join(str(w.message).strip() for w in caught) or str(exc).splitlines()[0]
            return f"torch's {name.removeprefix('sdpa-')} backend refuses it on {q.device.type}: {why[:240]}"
    return None


def _sdpa_unsupported(name: str, backward: bool):
    def reason(case: Case, dtype: torch.dtype) -> str | None:
        heads, kv = case["H"], kv_heads(case)
        if kv < 1 or heads % kv:
            return f"{heads} query heads do not share {kv} key/value heads evenly"
        return _sdpa_refusal(name, case["D"], dtype, bool(case["causal"]), backward, heads // kv)

    return reason


def _unfused_unsupported(direction: str):
    def reason(case: Case, dtype: torch.dtype) -> str | None:
        nbytes = unfused_bytes(case, direction)
        if nbytes > UNFUSED_MAX_BYTES:
            return (f"its {scores(case):,} scores take {nbytes / 2**30:.1f} GiB over their copies "
                    f"(more than {UNFUSED_MAX_BYTES >> 30} GiB)")
        return None

    return reason


# ---- plans and profiles -----------------------------------------------------------------------------------


def forward_plan(case: Case, dtype: torch.dtype) -> dict:
    """The forward plan `attention` launches here, its kernel (plan "impl": Triton or Gluon) included."""
    return plan_forward_on(_device(), case["S"], case["D"], dtype, bool(case["causal"])).as_dict()


def backward_plan(case: Case, dtype: torch.dtype) -> dict:
    """The (dK/dV, dQ) plans `attention`'s backward launches here, their kernel (plan "impl") included."""
    kv, q = plan_backward_on(_device(), case["S"], case["D"], dtype, bool(case["causal"]))
    return {"backward_kv": kv.as_dict(), "backward_q": q.as_dict()}


def profiles(direction: str) -> tuple[Profile, ...]:
    backward = direction == "backward"
    run = _backward_run if backward else _forward_run
    what = (lambda name: DESCRIPTIONS[name] + "; timed: its backward through autograd (the forward ran once, "
            "untimed)") if backward else DESCRIPTIONS.get
    out = [Profile("triton-fused", what("triton-fused"), run("triton-fused"), ATTENTION_SOURCES,
                   plan=backward_plan if backward else forward_plan)]
    for name in SDPA_BACKENDS:
        out.append(Profile(name, what(name), run(name), unsupported=_sdpa_unsupported(name, backward)))
    for name in ("torch.compile", "unfused"):
        out.append(Profile(name, what(name), run(name), REFERENCE_SOURCES,
                           unsupported=_unfused_unsupported(direction)))
    return tuple(out)


# ---- the points tables' columns -----------------------------------------------------------------------------


def point_columns(direction: str) -> tuple[PointColumn, ...]:
    """The unfused path's score bytes beside the fused byte model, at every point of the pages' tables."""
    per_score = UNFUSED_SCORE_BYTES[direction]
    copies = ("S in bf16, S and P in fp32, P in bf16" if direction == "forward" else
              "the forward's four copies and their four gradients")
    fused = ("Q, K and V read once, O and the fp32 lse written" if direction == "forward" else
             "Q, K, V, O, dO and the fp32 lse read once, dQ, dK and dV written once")
    return (
        PointColumn("Unfused S² bytes",
                    f"what the unfused path's B·H·S² scores take, {per_score} bytes a score ({copies}), each "
                    "written once and read back; from the point's shape, whether the unfused profiles ran or "
                    "declined it", value=lambda case, dtype: unfused_bytes(case, direction)),
        PointColumn("Fused bytes",
                    f"the byte model as recorded with the point, the least a fused kernel moves ({fused}; K and V "
                    "at the key/value heads), the bytes the GB/s column divides"),
    )
