"""What the attention probes share: the TMA epilogue's edit of kernels/attention_gluon.py's source, which more
than one probe builds on (probes/harness.py edits and imports a copy of a module's text), one check shape's
inputs with the plan's and a float64 reference's outputs, which every form is held to before it is timed, and the clocks
the forms and cuDNN are timed on. Shared by probes; not a probe itself.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.attention import (
    _DELTA_BLOCK_M,
    _DELTA_WARPS,
    _attention_bwd_delta_kernel,
    _strides,
    attention_fwd,
    plan_attention,
    plan_attention_backward,
)
from kernels.reference_attention import attention_float64
from probes.harness import replace_once


def with_tma_epilogue(consumer: str, second: str, kernel: str) -> tuple[str, str, str]:
    """The sources of the plan's consumer, second consumer and kernel with O stored through a shared-memory
    buffer of each consumer's own by TMA (round attention-tma-epilogue); o_ptr then carries O's descriptor."""
    consumer = replace_once(consumer, "def _consumer(tile_smem, q_smem,", "def _consumer(o_smem, tile_smem, q_smem,")
    start = consumer.index("        o_rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, store_layout))\n")
    end = consumer.index("        c += n_tiles\n")
    consumer = consumer[:start] + (
        "        # The buffer's last copy out must be done before it is written again.\n"
        "        tma.store_wait(0)\n"
        "        o_view = o_smem.index(WG)\n"
        "        o_view.reshape([wg_m, HEAD_DIM]).store(o.to(q_view.dtype))\n"
        "        fence_async_shared()\n"
        "        tma.async_copy_shared_to_global(o_ptr, [b, h, row0, 0], o_view)\n") + consumer[end:]
    consumer = consumer.rstrip("\n") + "\n    tma.store_wait(0)\n"
    second = replace_once(second, "def _consumer_1(tile_smem, q_smem,", "def _consumer_1(o_smem, tile_smem, q_smem,")
    second = replace_once(second, "    _consumer(tile_smem, q_smem,", "    _consumer(o_smem, tile_smem, q_smem,")
    kernel = replace_once(kernel, "    k_smem = gl.allocate_shared_memory(",
                          "    o_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)\n"
                          "    k_smem = gl.allocate_shared_memory(")
    kernel = replace_once(kernel, "(_consumer, (tile_smem, q_smem,", "(_consumer, (o_smem, tile_smem, q_smem,")
    kernel = replace_once(kernel, "(_consumer_1, (tile_smem, q_smem,", "(_consumer_1, (o_smem, tile_smem, q_smem,")
    return consumer, second, kernel


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (a zero reference counts as 1e-30)."""
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


class CheckCase(NamedTuple):
    """One check shape: its inputs, the plan's Gluon forward and what the plan and float64 give."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    key_mask: torch.Tensor | None
    scale: float
    plan: object
    o_plan: torch.Tensor
    lse_plan: torch.Tensor
    ref: torch.Tensor


def draw_inputs(gen, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int, head_dim: int, dtype,
                masked: bool = False) -> tuple:
    """(q, k, v, key_mask) drawn from `gen` on the GPU: N(0, 1) values, and a key mask, when `masked`, keeping 70%
    of the keys and none of batch 0's, so its rows see no key (None otherwise)."""
    q = torch.randn(batch, heads, seq_q, head_dim, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(batch, kv_heads, seq_k, head_dim, device="cuda", dtype=dtype, generator=gen)
            for _ in range(2))
    key_mask = torch.rand(batch, seq_k, device="cuda", generator=gen) < 0.7 if masked else None
    if key_mask is not None:
        key_mask[0, :] = False  # a batch whose rows see no key
    return q, k, v, key_mask


def backward_case(gen, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int, head_dim: int, causal: bool,
                  masked: bool = False) -> tuple:
    """(q, k, v, o, lse, do, scale, plans, key_mask) for a backward at this shape, bf16: draw_inputs, then dO ~ N(0, 1),
    the lab's forward and the Gluon backward's (dK/dV, dQ) plans."""
    q, k, v, key_mask = draw_inputs(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, torch.bfloat16, masked)
    do = torch.randn_like(q)
    scale = 1 / math.sqrt(head_dim)
    o, lse = attention_fwd(q, k, v, causal, scale, key_mask=key_mask)
    plans = plan_attention_backward(seq_q, head_dim, torch.bfloat16, causal, impl="gluon")
    return q, k, v, o, lse, do, scale, plans, key_mask


def check_case(gen, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int, head_dim: int, dtype,
               causal: bool, masked: bool) -> CheckCase:
    """Random inputs drawn from `gen` (draw_inputs), the plan's Gluon forward at them and the float64
    reference."""
    q, k, v, key_mask = draw_inputs(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, masked)
    scale = 1 / math.sqrt(head_dim)
    plan = plan_attention(seq_q, head_dim, dtype, causal, seq_k=seq_k, impl="gluon")
    o_plan, lse_plan = attention_fwd(q, k, v, causal, scale, plan, key_mask=key_mask)
    return CheckCase(q, k, v, key_mask, scale, plan, o_plan, lse_plan,
                     attention_float64(q, k, v, causal, scale, key_mask=key_mask))


# The clock of alternating_rounds' medians, with cuDNN timed after them (do_bench, the median of three).
ALTERNATING_CLOCK = ("GPU time (the median of twelve alternating rounds of short do_bench runs, L2 flushed; cuDNN: "
                     "do_bench median of three)")


def alternating_rounds(runs: dict, rounds: int = 12) -> dict:
    """Each candidate's median (and range) in µs over `rounds` short triton.testing.do_bench runs, the candidates
    alternating and their order turning round by round, so a clock that drifts during the run weighs on each
    alike. GPU time, the L2 flushed before every call (do_bench's default)."""
    samples = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(1e3 * triton.testing.do_bench(runs[name], warmup=5, rep=30))
    return {name: {"us": statistics.median(v), "us_min": min(v), "us_max": max(v)} for name, v in samples.items()}


def median_of_three_us(fn) -> float:
    """fn's time in µs: the median of three triton.testing.do_bench medians (GPU time, the L2 flushed)."""
    return 1e3 * statistics.median(triton.testing.do_bench(fn, warmup=25, rep=100) for _ in range(3))


def cudnn_forward(q, k, v, causal: bool, scale: float):
    """A call of cuDNN's attention forward through SDPA with that backend pinned, on these inputs."""
    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return run


def cudnn_backward_us(q, k, v, do, causal: bool, scale: float) -> float:
    """cuDNN's backward alone: the gradients of one saved SDPA forward, do_bench median of three."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(*leaves, scale=scale, is_causal=causal,
                                             enable_gqa=q.shape[1] != k.shape[1])

    def run():
        return torch.autograd.grad(out, leaves, do, retain_graph=True)

    return median_of_three_us(run)


def delta_pass(o, do, delta=None):
    """delta = rowsum(dO * O), fp32 [batch, heads, seq_q], by kernels/attention.py's delta kernel as attention_bwd
    launches it (into `delta` where given)."""
    batch, n_heads, seq_q, head_dim = o.shape
    if delta is None:
        delta = torch.empty((batch, n_heads, seq_q), dtype=torch.float32, device=o.device)
    _attention_bwd_delta_kernel[(triton.cdiv(seq_q, _DELTA_BLOCK_M) * batch * n_heads,)](
        o, do, delta, seq_q, n_heads, *_strides(o), *_strides(do), HEAD_DIM=head_dim, BLOCK_M=_DELTA_BLOCK_M,
        num_warps=_DELTA_WARPS)
    return delta


def backward(kv, dq_module, q, k, v, o, lse, do, causal: bool, scale: float, plans, poison: bool = False,
             key_mask=None) -> tuple:
    """(dQ, dK, dV) by the three launches of attention_bwd's Gluon path (the delta pass, dK/dV, dQ), with the
    given modules' dK/dV and dQ kernels; poison: the gradients start as NaN."""
    kv_plan, q_plan = plans
    make = (lambda t: torch.full_like(t, float("nan"))) if poison else torch.empty_like
    dq, dk, dv = make(q), make(k), make(v)
    delta = delta_pass(o, do)
    lse = lse.contiguous()
    kv.attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, kv_plan.num_stages)
    dq_module.attention_bwd_q_gluon(q, k, v, do, lse, delta, dq, causal, scale, key_mask, q_plan.num_stages)
    return dq, dk, dv
