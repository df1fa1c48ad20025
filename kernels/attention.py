"""Fused scaled-dot-product attention (FlashAttention-style), forward and backward, with an optional key mask.

    O = softmax(c * Q K^T over the keys each query sees) V,   c = 1/sqrt(D) unless given

Two files, read in this order: the kernels, their maths and the bytes they move
(kernels/attention_kernels.py), then this module: the fixed launch plans, the launchers, autograd, the
input checks and the public `attention`. The write-up is docs/posts/attention.md.

Which keys a query sees. Causal masking with Sq != Sk aligns bottom-right, as FlashAttention-2 (>= 2.1)
does: query i sees key j when j <= i + (Sk - Sq), so the last query sees every key. torch's SDPA
`is_causal=True` aligns top-left (j <= i); the two agree when Sq == Sk. A key mask, (batch, Sk) bool, True
where the key takes part (the sense of a boolean `attn_mask` in torch's SDPA), hides the keys it marks False
from every query of that batch, on top of the causal mask when both are given; a hidden key takes no
weight but is still read, so its K and V must be finite (as in torch). A query that sees no key at
all (Sk = 0, i < Sq - Sk under the causal mask, or every key it could see masked out) gets an output row of
zeros and lse = -inf (the log of an empty sum), and no gradient: its dQ row is zero and it adds nothing to
dK or dV. It never produces NaN.

The backward recomputes P from Q, K and the saved lse instead of storing it: a delta pass, then one kernel
for dK and dV (keys resident) and one for dQ (queries resident), each gradient written once from registers,
so runs are bitwise reproducible. The tile tables below are fixed per head_dim, dtype and direction (no
autotuning): every run launches the same plan.

Two forwards compute the same O and lse: the Triton kernel (kernels/attention_kernels.py; any GPU Triton
runs on, and the interpreter) and a Gluon kernel for Hopper (kernels/attention_gluon.py: a TMA loader and
two consumer warpgroups, warp-specialised). `choose_forward_impl` picks one from facts about the device,
shape and dtype (a pure, tabulated rule); `impl=` or the LAB_ATTENTION_IMPL environment variable ("auto",
"triton" or "gluon") overrides it. Both save the same lse, so either backward serves either forward. The
backward has the same two kinds (Gluon's in kernels/attention_bwd_gluon.py and attention_bwd_q_gluon.py),
chosen by `choose_backward_impl` for `attention`'s autograd; `attention_bwd` itself runs the plans it is
given, Triton's by default.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import torch
import triton

from kernels import attention_kernels
from kernels.attention_choice import (  # noqa: F401 (the choice's names, importable from here)
    GLUON_AUTO_MIN_KEYS,
    GLUON_BLOCK_M,
    GLUON_BWD_AUTO_MIN_LENGTH,
    GLUON_BLOCK_N,
    GLUON_EXP_SPLIT,
    GLUON_ON_DEMAND_CAUSAL,
    GLUON_PERSISTENT,
    GLUON_PERSISTENT_UNMASKED,
    GLUON_PINGPONG,
    GLUON_STAGES,
    GLUON_TWO_PROGRAMS_BELOW_KEYS,
    GLUON_WARPS,
    IMPL_ENV,
    IMPLS,
    choose_backward_impl,
    choose_forward_impl,
    default_impl,
    gluon_backward_imports,
    gluon_forward_refusal,
    gluon_forward_tiles,
    gluon_imports,
    gluon_preferred,
)
from kernels._checks import check_device, check_dtype, interpreter_enabled
from kernels.attention_kernels import (
    LOG2E,
    _attention_bwd_delta_kernel,
    _attention_bwd_kv_kernel,
    _attention_bwd_q_kernel,
    _attention_fwd_kernel,
)

# Also importable from here, as before the kernels moved (probes/attention_bwd.py builds on them).
LN2, _LOG2E, _mma = attention_kernels.LN2, attention_kernels._LOG2E, attention_kernels._mma

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128)
DIRECTIONS = ("forward", "backward_kv", "backward_q")

# --------------------------------------------------------------------------------------------------------
# Launch plan: pure functions of direction, head_dim, dtype, causal and the query length; no autotuning
# --------------------------------------------------------------------------------------------------------

# (direction, head_dim) -> (block_m, block_n, num_warps, num_stages). Both supported dtypes are two bytes
# wide and share their tiles; causal and full attention share them too (the causal diagonal is one masked
# tile pass per program either way). Shared memory per program, two-byte elements, stays under the H100's
# 227 KiB: the forward at D = 128 holds a 32 KiB Q tile and 3 stages of 32 KiB K + 32 KiB V tiles (224 KiB;
# it compiles and runs on the H100); the backward keeps its resident tiles' fp32 accumulators (dK and dV, or
# dQ) at 64 registers a thread.
_TILES = {
    ("forward", 64): (128, 128, 4, 3),
    ("forward", 128): (128, 128, 8, 3),
    # backward_kv: a program holds block_n keys and streams block_m queries at a time.
    ("backward_kv", 64): (64, 128, 8, 2),
    ("backward_kv", 128): (64, 128, 8, 2),
    # backward_q: a program holds block_m queries and streams block_n keys at a time.
    ("backward_q", 64): (128, 64, 8, 2),
    ("backward_q", 128): (128, 128, 8, 2),
}
# Measured on an H100 (checks/attention.py, B·S = 16,384, H·D = 2,048, bf16, causal and not;
# notes/attention.md, "The tile sweeps"): the forward, K and V through tensor descriptors (TMA) at both head
# dims: D = 128 on 128 x 128 tiles and 8 warps, 3 stages, ran 1.5-5.5% above the 128 x 64 tiles first tabled
# at S = 512, 2048 and 8192; D = 64 on 128 x 128 tiles and 4 warps 19-26% above 128 x 128 on 8 warps without
# TMA at S = 2048 and 8192, and 37% at S = 512 (full; level there with 128 x 64 tiles on 4 or 8 warps).
# The backward's tiles were the fastest of the pairs timed at D = 128 (S = 2048); at D = 64 (S = 2048, full)
# 64 x 64 pairs on 4 warps ran 6% above them and two other pairs within 3%, timed at that one length only.
_FORWARD_TMA_HEAD_DIMS = (64, 128)
# ...except the D = 128 forward over at most this many keys, on 64 x 64 tiles and 4 warps: a short key loop
# pays a 128-query tile's prologue and epilogue over few iterations. At S = 512 it ran 18% (full) and 13%
# (causal) above 128 x 128 tiles, at 2048 level (full) and 9% above (causal); at 8192, 6% and 3% below.
SHORT_KEYS_MAX = 2048
_SHORT_KEYS_TILE = {128: (64, 64, 4, 3)}
# Forward launches for at most this many queries take 64-query tiles on 4 warps: a 128-row tile would leave
# at least half its rows empty (short prompts, decode-like steps).
SHORT_QUERY_MAX = 64
_SHORT_QUERY_TILE = (64, 4)
# The delta pass: rows a program, warps.
_DELTA_BLOCK_M, _DELTA_WARPS = 64, 8


@dataclass(frozen=True)
class AttentionPlan:
    """How one kernel is launched. Recorded next to every timing the lab takes."""

    direction: str  # "forward", "backward_kv" (dK, dV) or "backward_q" (dQ)
    block_m: int  # queries a tile
    block_n: int  # keys a tile
    num_warps: int
    num_stages: int
    tma: bool = False  # forward: K and V tiles through tensor descriptors (TMA on Hopper)
    warp_specialize: bool = False  # forward, with tma: warp-specialised unmasked loop
    impl: str = "triton"  # "triton" (kernels/attention_kernels.py) or "gluon" (kernels/attention_gluon.py)
    pingpong: bool = False  # Gluon forward: the two consumer warpgroups issue their products in turns
    persistent: bool = False  # Gluon forward: one program an SM walks query tiles (causal: longest first)
    prefetch_q: bool = True  # Gluon forward, persistent: a second Q buffer, the next tile's Q loading early
    exp_split: bool = False  # Gluon forward: half the unmasked tiles' exponentials on the FMA pipe
    on_demand: bool = False  # Gluon forward, persistent: each program takes its next query tile from a counter
    programs_per_sm: int = 1  # Gluon forward: 2 with 64-key tiles at head dim 64 (kernels/attention_choice.py)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_attention(seq_q: int, head_dim: int, dtype: torch.dtype, causal: bool,
                   direction: str = "forward", seq_k: int | None = None, impl: str = "triton") -> AttentionPlan:
    """The launch plan for one kernel of `direction` at this query length (and key length, None: the query
    length), head_dim and dtype. impl: the kernel, "triton" or "gluon": the forward's (choose_forward_impl's
    answer) or a backward kernel's (choose_backward_impl's)."""
    if impl not in ("triton", "gluon"):
        raise ValueError(f"attention: impl must be 'triton' or 'gluon' once chosen, got {impl!r}.")
    if direction not in DIRECTIONS:
        raise ValueError(f"attention: direction must be one of {', '.join(map(repr, DIRECTIONS))}, got {direction!r}.")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"attention: head_dim {head_dim} is not supported; supported head dims are "
                         f"{', '.join(map(str, HEAD_DIMS))}.")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"attention: dtype {str(dtype).removeprefix('torch.')} is not supported; supported "
                        "dtypes are float16, bfloat16.")
    if direction == "forward" and impl == "gluon":
        one_q = GLUON_PERSISTENT_UNMASKED and not causal and not GLUON_PERSISTENT
        on_demand = GLUON_ON_DEMAND_CAUSAL and causal
        block_n, programs_per_sm = gluon_forward_tiles(head_dim, seq_q if seq_k is None else seq_k, causal)
        return AttentionPlan(direction, GLUON_BLOCK_M, block_n, GLUON_WARPS, GLUON_STAGES[head_dim], tma=True,
                             warp_specialize=True, impl="gluon", pingpong=GLUON_PINGPONG,
                             persistent=GLUON_PERSISTENT or one_q or on_demand, prefetch_q=not one_q,
                             exp_split=GLUON_EXP_SPLIT, on_demand=on_demand, programs_per_sm=programs_per_sm)
    if direction == "backward_kv" and impl == "gluon":  # kernels/attention_bwd_gluon.py's fixed tiles
        return AttentionPlan(direction, 64, 128, 12, 2, tma=True, warp_specialize=True, impl="gluon")
    if direction == "backward_q" and impl == "gluon":  # kernels/attention_bwd_q_gluon.py's fixed tiles
        return AttentionPlan(direction, 128, 64, 12, 2, tma=True, warp_specialize=True, impl="gluon")
    block_m, block_n, num_warps, num_stages = _TILES[direction, head_dim]
    if direction == "forward" and head_dim in _SHORT_KEYS_TILE and (seq_q if seq_k is None else seq_k) <= SHORT_KEYS_MAX:
        block_m, block_n, num_warps, num_stages = _SHORT_KEYS_TILE[head_dim]
    tma = direction == "forward" and head_dim in _FORWARD_TMA_HEAD_DIMS
    if direction == "forward" and seq_q <= SHORT_QUERY_MAX:
        block_m, num_warps = _SHORT_QUERY_TILE
    return AttentionPlan(direction, block_m, block_n, num_warps, num_stages, tma=tma)


# --------------------------------------------------------------------------------------------------------
# Which forward (the rule is kernels/attention_choice.py's); the facts about these tensors and this device
# --------------------------------------------------------------------------------------------------------


def _capability(device) -> tuple[int, int] | None:
    device = torch.device(device)
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def _descriptors_fit(*tensors: torch.Tensor) -> bool:
    return _tma_fits(*tensors) and all(s > 0 for t in tensors for s in t.stride())


def forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, impl: str | None = None) -> str:
    """choose_forward_impl's answer for these tensors on their device."""
    impl = default_impl() if impl is None else impl
    if impl == "triton":
        return "triton"
    return choose_forward_impl(impl, _capability(q.device), gluon_imports(), q.shape[-1], q.dtype,
                               _descriptors_fit(q, k, v), interpreter_enabled(), q.shape[2], k.shape[2], causal)


def plan_forward_on(device, seq_q: int, head_dim: int, dtype: torch.dtype, causal: bool,
                    seq_k: int | None = None, impl: str | None = None) -> AttentionPlan:
    """The forward plan `attention` launches on `device` for contiguous inputs of these sizes (the plan
    experiments record)."""
    impl = default_impl() if impl is None else impl
    seq_k = seq_q if seq_k is None else seq_k
    chosen = "triton" if impl == "triton" else choose_forward_impl(
        impl, _capability(device), gluon_imports(), head_dim, dtype, True, interpreter_enabled(), seq_q, seq_k,
        causal)
    return plan_attention(seq_q, head_dim, dtype, causal, "forward", seq_k, impl=chosen)


def plan_attention_backward(seq_q: int, head_dim: int, dtype: torch.dtype, causal: bool,
                            impl: str = "triton") -> tuple:
    """(dK/dV plan, dQ plan) of the backward; impl: both kernels' ("triton" or "gluon", once chosen)."""
    return tuple(plan_attention(seq_q, head_dim, dtype, causal, d, impl=impl) for d in ("backward_kv", "backward_q"))


def backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, impl: str | None = None) -> str:
    """choose_backward_impl's answer for these tensors on their device."""
    impl = default_impl() if impl is None else impl
    if impl == "triton":
        return "triton"
    return choose_backward_impl(impl, _capability(q.device), gluon_backward_imports(), q.shape[-1], q.dtype,
                                _descriptors_fit(q, k, v, do), interpreter_enabled(), q.shape[2], k.shape[2])


def plan_backward_on(device, seq_q: int, head_dim: int, dtype: torch.dtype, causal: bool,
                     seq_k: int | None = None, impl: str | None = None) -> tuple:
    """The (dK/dV, dQ) plans `attention`'s backward launches on `device` for contiguous inputs of these sizes
    (the plans experiments record)."""
    impl = default_impl() if impl is None else impl
    seq_k = seq_q if seq_k is None else seq_k
    chosen = "triton" if impl == "triton" else choose_backward_impl(
        impl, _capability(device), gluon_backward_imports(), head_dim, dtype, True, interpreter_enabled(), seq_q,
        seq_k)
    return plan_attention_backward(seq_q, head_dim, dtype, causal, impl=chosen)


# --------------------------------------------------------------------------------------------------------
# Launchers: (batch, heads, seq, head_dim) tensors whose last dimension has unit stride
# --------------------------------------------------------------------------------------------------------


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _dot_f32(t: torch.Tensor) -> bool:
    return interpreter_enabled() and t.dtype == torch.bfloat16


def _tma_descriptor(t: torch.Tensor, block_n: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_n, t.shape[-1]])


def _tma_fits(*tensors: torch.Tensor) -> bool:
    """Tensor descriptors need 16-byte aligned bases and strides (and a last stride of 1)."""
    return all(t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])
               and t.stride(-1) == 1 for t in tensors)


def _key_mask_args(key_mask: torch.Tensor | None) -> tuple:
    """(pointer tensor, batch stride, key stride) of the key mask: its bool storage read as bytes, any
    strides (an expanded mask is not copied). Without one, three Nones: compile-time constants, so the
    unmasked kernels take the same runtime arguments as before the mask existed."""
    if key_mask is None:
        return None, None, None
    return key_mask.view(torch.uint8), key_mask.stride(0), key_mask.stride(1)


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                  plan: AttentionPlan | None = None, out: torch.Tensor | None = None,
                  lse: torch.Tensor | None = None, *,
                  key_mask: torch.Tensor | None = None, impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """O [B, H, Sq, D] (q's dtype) and lse [B, H, Sq] (fp32, natural log); into `out` and `lse` if given.

    key_mask: None, or a (B, Sk) bool tensor on q's device, True where the key takes part (any strides).
    Rows that see no key get O = 0 and lse = -inf. impl: "auto", "triton" or "gluon" (None:
    $LAB_ATTENTION_IMPL or "auto"), used when no plan is given; a given plan names its kernel (plan.impl).
    """
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    plan = plan or plan_attention(seq_q, head_dim, q.dtype, causal, seq_k=seq_k, impl=forward_impl(q, k, v, causal, impl))
    o = torch.empty((batch, n_heads, seq_q, head_dim), dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty((batch, n_heads, seq_q), dtype=torch.float32, device=q.device) if lse is None else lse
    if not lse.is_contiguous():
        raise ValueError("attention: lse must be contiguous (batch, heads, seq_q).")
    if o.numel() == 0:
        return o, lse
    if seq_k == 0:  # no query sees any key
        o.zero_()
        lse.fill_(-math.inf)
        return o, lse
    if plan.impl == "gluon":
        from kernels.attention_gluon import attention_fwd_gluon

        attention_fwd_gluon(q, k, v, o, lse, causal, scale, plan.num_stages, key_mask, plan.pingpong,
                            plan.persistent, plan.exp_split, plan.prefetch_q, plan.on_demand, plan.block_n,
                            plan.programs_per_sm)
        return o, lse
    use_tma = plan.tma and _tma_fits(k, v) and not interpreter_enabled()  # the interpreter has no TMA
    k_desc = _tma_descriptor(k, plan.block_n) if use_tma else None
    v_desc = _tma_descriptor(v, plan.block_n) if use_tma else None
    mask, stride_mb, stride_mk = _key_mask_args(key_mask)
    grid = (triton.cdiv(seq_q, plan.block_m) * batch * n_heads,)
    _attention_fwd_kernel[grid](
        q, k, v, o, lse, k_desc, v_desc, mask, seq_q, seq_k, n_heads, n_heads // n_kv_heads, scale * LOG2E,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o), stride_mb, stride_mk,
        HEAD_DIM=head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal,
        KEY_MASK=key_mask is not None, USE_TMA=use_tma,
        WARP_SPECIALIZE=use_tma and plan.warp_specialize and key_mask is None,  # the key mask: pointer loads
        DOT_F32=_dot_f32(q), num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    return o, lse


def attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, causal: bool, scale: float, plans: tuple | None = None,
                  out: tuple | None = None, *,
                  key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from the saved O and lse; into the three tensors of `out` if given.

    plans: (dK/dV plan, dQ plan), by default plan_attention_backward's. The delta pass writes
    delta = rowsum(dO * O) (fp32, [B, H, Sq]) before the two gradient kernels read it. key_mask: the
    forward's. Rows that see no key (lse = -inf) get dQ = 0 and add nothing to dK and dV.
    """
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    kv_plan, q_plan = plans or plan_attention_backward(seq_q, head_dim, q.dtype, causal)
    if out is None:
        dq = torch.empty((batch, n_heads, seq_q, head_dim), dtype=q.dtype, device=q.device)
        dk = torch.empty((batch, n_kv_heads, seq_k, head_dim), dtype=k.dtype, device=k.device)
        dv = torch.empty((batch, n_kv_heads, seq_k, head_dim), dtype=v.dtype, device=v.device)
    else:
        dq, dk, dv = out
    if seq_q == 0 or seq_k == 0 or dq.numel() + dk.numel() == 0:  # nothing sees anything
        return dq.zero_(), dk.zero_(), dv.zero_()
    group = n_heads // n_kv_heads
    delta = torch.empty((batch, n_heads, seq_q), dtype=torch.float32, device=q.device)
    _attention_bwd_delta_kernel[(triton.cdiv(seq_q, _DELTA_BLOCK_M) * batch * n_heads,)](
        o, do, delta, seq_q, n_heads, *_strides(o), *_strides(do),
        HEAD_DIM=head_dim, BLOCK_M=_DELTA_BLOCK_M, num_warps=_DELTA_WARPS,
    )
    lse = lse.contiguous()
    mask, stride_mb, stride_mk = _key_mask_args(key_mask)
    if "gluon" in (kv_plan.impl, q_plan.impl) and not _tma_fits(q, k, v, do):
        raise ValueError("attention: the Gluon backward kernels need q, k, v and dO that fit tensor descriptors "
                         "(16-byte aligned bases and strides, unit last stride).")
    if kv_plan.impl == "gluon":
        from kernels.attention_bwd_gluon import attention_bwd_kv_gluon

        attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, kv_plan.num_stages)
    else:
        _attention_bwd_kv_kernel[(triton.cdiv(seq_k, kv_plan.block_n) * batch * n_kv_heads,)](
            q, k, v, do, lse, delta, dk, dv, mask, seq_q, seq_k, n_kv_heads, group, scale * LOG2E, scale,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv), stride_mb,
            stride_mk, HEAD_DIM=head_dim, BLOCK_M=kv_plan.block_m, BLOCK_N=kv_plan.block_n, CAUSAL=causal,
            KEY_MASK=key_mask is not None, DOT_F32=_dot_f32(q), num_warps=kv_plan.num_warps,
            num_stages=kv_plan.num_stages,
        )
    if q_plan.impl == "gluon":
        from kernels.attention_bwd_q_gluon import attention_bwd_q_gluon

        attention_bwd_q_gluon(q, k, v, do, lse, delta, dq, causal, scale, key_mask, q_plan.num_stages)
        return dq, dk, dv
    _attention_bwd_q_kernel[(triton.cdiv(seq_q, q_plan.block_m) * batch * n_heads,)](
        q, k, v, do, lse, delta, dq, mask, seq_q, seq_k, n_heads, group, scale * LOG2E, scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq), stride_mb, stride_mk,
        HEAD_DIM=head_dim, BLOCK_M=q_plan.block_m, BLOCK_N=q_plan.block_n, CAUSAL=causal,
        KEY_MASK=key_mask is not None, DOT_F32=_dot_f32(q), num_warps=q_plan.num_warps,
        num_stages=q_plan.num_stages,
    )
    return dq, dk, dv


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# --------------------------------------------------------------------------------------------------------
# Autograd and the public function
# --------------------------------------------------------------------------------------------------------


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                key_mask: torch.Tensor | None = None, impl: str | None = None):
        q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
        o, lse = attention_fwd(q, k, v, causal, scale, key_mask=key_mask, impl=impl)
        ctx.save_for_backward(q, k, v, o, lse, key_mask)
        ctx.causal = causal
        ctx.scale = scale
        ctx.impl = impl
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse, key_mask = ctx.saved_tensors
        do = do.to(o.dtype)
        do = do if _descriptors_fit(do) else do.contiguous()  # a fresh tensor fits the Gluon kernels too
        plans = plan_attention_backward(q.shape[2], q.shape[-1], q.dtype, ctx.causal,
                                        impl=backward_impl(q, k, v, do, ctx.impl))
        dq, dk, dv = attention_bwd(q, k, v, o, lse, do, ctx.causal, ctx.scale, plans, key_mask=key_mask)
        return dq, dk, dv, None, None, None, None


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def check_attention_inputs(op: str, q, k, v, causal, scale, key_mask=None) -> None:
    """Raise, naming what was given and what is accepted, unless attention(q, k, v, ...) can run."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}.")
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} has {t.dim()} dimensions (shape {_shape(t)}); expected 4: "
                             "(batch, heads, seq, head_dim).")
    check_dtype(op, "q", q, SUPPORTED_DTYPES)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        names = [str(t.dtype).removeprefix("torch.") for t in (q, k, v)]
        raise TypeError(f"{op}: q, k and v must share one dtype, got q {names[0]}, k {names[1]}, v {names[2]}.")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k and v must have the same shape, got k {_shape(k)} and v {_shape(v)}.")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q has batch {q.shape[0]} and k, v have batch {k.shape[0]}; they must match.")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"{op}: q has head_dim {q.shape[3]} and k, v have head_dim {k.shape[3]}; they must match.")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"{op}: head_dim {q.shape[3]} is not supported; supported head dims are "
                         f"{', '.join(map(str, HEAD_DIMS))}.")
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    if (n_kv_heads == 0 and n_heads != 0) or (n_kv_heads and n_heads % n_kv_heads):
        raise ValueError(f"{op}: q has {n_heads} heads and k, v have {n_kv_heads}; the key/value heads must "
                         "divide the query heads (grouped-query attention).")
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}.")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"{op}: scale must be a real number or None, got {type(scale).__name__}.")
    if scale is not None and not (math.isfinite(scale) and scale >= 0):
        # The unmasked tiles take the row maximum of the unscaled scores: right for any scale >= 0.
        raise ValueError(f"{op}: scale must be finite and >= 0, got {scale}.")
    if key_mask is not None:
        _check_key_mask(op, key_mask, q.shape[0], k.shape[2])
    check_device(op, q, k, v)
    if key_mask is not None and key_mask.device != q.device:
        raise RuntimeError(f"{op}: key_mask is on device '{key_mask.device}' and q on '{q.device}'; key_mask "
                           "must be on q's device.")


def _check_key_mask(op: str, key_mask, batch: int, seq_k: int) -> None:
    accepted = "a bool tensor of shape (batch, seq_k), True where the key takes part"
    if not isinstance(key_mask, torch.Tensor):
        raise TypeError(f"{op}: key_mask must be None or {accepted}; got {type(key_mask).__name__}.")
    if key_mask.dtype != torch.bool:
        raise TypeError(f"{op}: key_mask has dtype {str(key_mask.dtype).removeprefix('torch.')}; accepted is "
                        f"{accepted}.")
    if key_mask.shape != (batch, seq_k):
        raise ValueError(f"{op}: key_mask has shape {_shape(key_mask)}; expected (batch, seq_k) = "
                         f"{(batch, seq_k)} from q's batch and k's sequence length.")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, key_mask: torch.Tensor | None = None,
              impl: str | None = None) -> torch.Tensor:
    """softmax(scale * Q K^T [+ causal mask] [+ key mask]) V, differentiable; the output has q's shape and dtype.

    q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), kv_heads dividing heads
    (query head h uses key/value head h // (heads / kv_heads), as torch's SDPA with enable_gqa=True).
    dtype float16 or bfloat16, one for all three; head_dim 64 or 128; any sequence lengths (seq_k may differ
    from seq_q) and strides. On CUDA, or on the CPU with TRITON_INTERPRET=1. scale: finite and >= 0,
    1/sqrt(head_dim) by default. causal=True hides key j from query i unless j <= i + seq_k - seq_q (bottom-right
    alignment, as FlashAttention-2; torch's is_causal aligns top-left, the same when seq_q == seq_k).
    key_mask: None, or a bool tensor (batch, seq_k) on q's device, True where the key takes part (the sense
    of a boolean attn_mask in torch's SDPA; padding keys False), any strides (read in place, not copied);
    combined with causal when both are given. A hidden key takes no weight, but its k and v rows are still
    read: keep them finite (0 * NaN is NaN, as in torch's SDPA). Math in fp32 (P rounded to the input dtype before P V, as in
    FlashAttention).

    A query that sees no key (seq_k = 0, causal with i < seq_q - seq_k, or every key it could see masked
    out) gets an output row of zeros, never NaN, and zero gradients: its dq
    row is zero and it adds nothing to dk and dv.

    impl: which kernels, "auto" (the Gluon kernels on Hopper where they apply, else Triton's; the forward and
    the backward each by its own rule, choose_forward_impl and choose_backward_impl), "triton" or "gluon"
    (ValueError where it cannot run); None reads $LAB_ATTENTION_IMPL, else "auto". Both give the same results
    within rounding.
    """
    check_attention_inputs("attention", q, k, v, causal, scale, key_mask)
    impl = default_impl() if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"attention: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return AttentionFunction.apply(q, k, v, causal, scale, key_mask, impl)
