"""Profiles, inputs, byte and FLOP models shared by the attention experiments (not an experiment itself).

Every point holds B·S = 16,384 tokens and H·D = 2,048 (the shapes of the SDPA anchors): S from 1,024 to
16,384 plus a ragged 3,000 (B = 5, 15,000 tokens), D = 64 (H = 32) and 128 (H = 16), causal and not.

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
from torch.nn.attention import SDPBackend, sdpa_kernel

from experiments.spec import Case, Profile
from kernels import reference_attention as reference
from kernels.attention import attention, plan_attention, plan_attention_backward

TOKENS = 16384
WIDTH = 2048  # H·D
SEQS = (1024, 2048, 3000, 4096, 8192, 16384)
HEAD_DIMS = (128, 64)
ATTENTION_SOURCES = ("kernels/attention.py", "kernels/_checks.py")
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

SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
}
BASELINES = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch.compile")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def scores(case: Case) -> int:
    """B·H·S²: the scores the unfused path materialises (all of them, causal or not)."""
    return case["B"] * case["H"] * case["S"] ** 2


def unfused_bytes(case: Case, direction: str) -> int:
    return scores(case) * UNFUSED_SCORE_BYTES[direction]


def cases() -> tuple[Case, ...]:
    out = []
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            for seq in SEQS:
                batch, heads = max(1, round(TOKENS / seq)), WIDTH // head_dim
                case = Case(f"d{head_dim}-{'causal' if causal else 'full'}-s{seq}",
                            {"B": batch, "H": heads, "S": seq, "D": head_dim, "causal": int(causal)})
                out.append(Case(case.name, case.shape, _describe(case)))
    return tuple(out)


def _describe(case: Case) -> str:
    tokens = case["B"] * case["S"]
    mask = "causal (key j ≤ query i)" if case["causal"] else "every key"
    return (f"{tokens:,} tokens, {mask}; the unfused path's {scores(case):,} scores take "
            f"{unfused_bytes(case, 'forward') / 2**30:.1f} GiB in the forward, "
            f"{unfused_bytes(case, 'backward') / 2**30:.1f} GiB in the backward")


def flops(case: Case, dtype: torch.dtype) -> int:
    """4·B·H·S²·D (QKᵀ and PV), halved when causal."""
    total = 4 * case["B"] * case["H"] * case["S"] ** 2 * case["D"]
    return total // 2 if case["causal"] else total


def backward_flops(case: Case, dtype: torch.dtype) -> int:
    """2.5× the forward's: dV, dP, dQ and dK products plus the recomputation of S."""
    return 5 * flops(case, dtype) // 2


def forward_bytes(case: Case, dtype: torch.dtype) -> int:
    """The least a fused forward moves: Q, K, V read once, O written once, the fp32 lse written."""
    tokens = case["B"] * case["H"] * case["S"]
    return 4 * tokens * case["D"] * element_size(dtype) + 4 * tokens


def backward_bytes(case: Case, dtype: torch.dtype) -> int:
    """The least a fused backward moves: Q, K, V, O, dO and lse read once; dQ, dK, dV written once."""
    tokens = case["B"] * case["H"] * case["S"]
    return 8 * tokens * case["D"] * element_size(dtype) + 4 * tokens


def _draw(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def forward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    """q, k, v ~ N(0, 1) of shape (B, H, S, D); `causal` a CPU bool the profiles read without a device sync."""
    shape = (case["B"], case["H"], case["S"], case["D"])
    inputs = {name: _draw(shape, dtype, device, gen) for name in ("q", "k", "v")}
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


def _sdpa(backend: SDPBackend):
    def run(q, k, v, causal):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


IMPLEMENTATIONS = {
    "triton-fused": _lab,
    **{name: _sdpa(backend) for name, backend in SDPA_BACKENDS.items()},
    "torch.compile": reference.compiled_attention,
    "unfused": reference.attention_reference,
}
DESCRIPTIONS = {
    "triton-fused": "the lab's fused attention (kernels/attention.py): online softmax over key tiles, fixed tiles",
    "sdpa-cudnn": "torch's scaled_dot_product_attention pinned to the cuDNN backend",
    "sdpa-flash": "torch's scaled_dot_product_attention pinned to the FlashAttention-2 backend",
    "sdpa-efficient": "torch's scaled_dot_product_attention pinned to the memory-efficient backend",
    "torch.compile": "the unfused reference (QKᵀ → mask → softmax in fp32 → PV) through torch.compile",
    "unfused": "the unfused reference in eager PyTorch: every score written and read back",
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
def _sdpa_refusal(name: str, head_dim: int, dtype: torch.dtype, causal: bool, backward: bool) -> str | None:
    """Why torch's backend `name` cannot run this head_dim, dtype and mask (it is asked on a 128-token
    input), or None."""
    q = torch.zeros(1, 1, 128, head_dim, dtype=dtype, device=_device(), requires_grad=backward)
    with warnings.catch_warnings(record=True) as caught:  # torch says why a backend declines in warnings
        warnings.simplefilter("always")
        try:
            out = _sdpa(SDPA_BACKENDS[name])(q, q, q, causal)
            if backward:
                out.sum().backward()
        except RuntimeError as exc:
            why = "; ".join(str(w.message).strip() for w in caught) or str(exc).splitlines()[0]
            return f"torch's {name.removeprefix('sdpa-')} backend refuses it on {q.device.type}: {why[:240]}"
    return None


def _sdpa_unsupported(name: str, backward: bool):
    def reason(case: Case, dtype: torch.dtype) -> str | None:
        return _sdpa_refusal(name, case["D"], dtype, bool(case["causal"]), backward)

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
    return plan_attention(case["S"], case["D"], dtype, bool(case["causal"])).as_dict()


def backward_plan(case: Case, dtype: torch.dtype) -> dict:
    kv, q = plan_attention_backward(case["S"], case["D"], dtype, bool(case["causal"]))
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
