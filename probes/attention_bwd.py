"""Tuning probe for the attention backward (GPU for timing; the kernels also run under Triton's interpreter):
the lab's three-kernel backward against an atomic-dQ schedule and torch's SDPA backends.

    python -m probes.attention_bwd [OUT_DIR] [--budget-s 240]

The lab's backward (kernels/attention.py) runs a delta pass, then one kernel for dK and dV (keys resident,
queries streamed) and one for dQ (queries resident, keys streamed): the second recomputes the scores and
the probabilities' gradient, seven tile products in all. The candidate here computes dQ inside the dK/dV
kernel: each program adds its share dS K (scaled) into an fp32 dQ accumulator with atomic adds, five tile
products, at the price of fp32 atomics to the same dQ rows from every key block and a zeroed accumulator
converted to the output dtype after. notes/attention.md names it the lead whose ceiling is higher.

Correctness first: every candidate's gradients at a ragged causal case with grouped heads are compared
with the lab's float64 reference before it is timed. Timing: triton.testing.do_bench medians (it flushes the
L2 between calls), B·S = 16,384, H·D = 2,048, bf16, S in {2048, 8192}, causal and not; TFLOP/s =
2.5 × 4·B·H·S²·D (halved when causal) over the median. A tuning instrument, not evidence: the site's figures
come only from run records. Writes OUT_DIR/probe_attention_bwd.json (OUT_DIR defaults to $OUT, else the
current directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import reference_attention as reference  # noqa: E402
from kernels.attention import (  # noqa: E402
    _DELTA_BLOCK_M,
    _DELTA_WARPS,
    _LOG2E,
    LOG2E,
    _attention_bwd_delta_kernel,
    _dot_f32,
    _mma,
    _strides,
    attention_bwd,
    attention_fwd,
)

QUESTION = ("Does an atomic-dQ backward schedule (one pass over K/V tiles, dQ accumulated with atomics) beat the "
            "lab's two-kernel backward, and at which tile?")
CANDIDATES = ("lab", "atomic-dq/{BLOCK_M}x{BLOCK_N}w{warps}s{stages}", "sdpa")
SHAPES = "B·S = 16,384 tokens, H·D = 2,048 (bf16), S of 2048 and 8192, causal and not"
OUTPUTS = {"attention-atomic-dq": ("notes/probes/2026-11-25-h100-attention-bwd-atomic-dq.json",)}

TOKENS, WIDTH, HEAD_DIM = 16384, 2048, 128
SEQS = (2048, 8192)
# (block_m queries streamed, block_n keys resident, num_warps, num_stages); the first is the lab's dK/dV tile.
TILES = ((64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2))


@triton.jit
def _kv_dq_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, q_offs, do_offs, dq_offs, offs_n,
                 lo, hi, seq_q, causal_offset, qk_scale, scale, stride_qs, stride_dos, stride_dqs,
                 BLOCK_M: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT_F32: tl.constexpr):
    # kernels/attention.py's _bwd_kv_tiles (keys along rows: s^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
    # dS^T = P^T (dP^T - delta), dK += dS^T Q), plus dQ[rows] += scale * dS K, added atomically.
    offs_bm = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        step = start_m.to(tl.int64)
        offs_m = start_m + offs_bm
        row_in = offs_m < seq_q
        if MASK:
            q = tl.load(q_base + step * stride_qs + q_offs, mask=row_in[:, None], other=0.0)
            do = tl.load(do_base + step * stride_dos + do_offs, mask=row_in[:, None], other=0.0)
            lse2 = tl.load(lse_base + offs_m, mask=row_in, other=float("inf")) * _LOG2E
            delta = tl.load(delta_base + offs_m, mask=row_in, other=0.0)
        else:
            q = tl.load(q_base + step * stride_qs + q_offs)
            do = tl.load(do_base + step * stride_dos + do_offs)
            lse2 = tl.load(lse_base + offs_m) * _LOG2E
            delta = tl.load(delta_base + offs_m)
        p_t = tl.exp2(_mma(k, tl.trans(q), None, DOT_F32) * qk_scale - lse2[None, :])
        if MASK and CAUSAL:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_offset, p_t, 0.0)
        dv = _mma(p_t.to(do.dtype), do, dv, DOT_F32)
        ds_t = (p_t * (_mma(v, tl.trans(do), None, DOT_F32) - delta[None, :])).to(q.dtype)
        dk = _mma(ds_t, q, dk, DOT_F32)
        dq = _mma(tl.trans(ds_t), k, None, DOT_F32) * scale
        tl.atomic_add(dq_base + step * stride_dqs + dq_offs, dq, mask=row_in[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _kv_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr,
    seq_q, seq_k, n_kv_heads, group, qk_scale, scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_dqb, stride_dqh, stride_dqs,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # One program: BLOCK_N keys of one (batch, key/value head), as kernels/attention.py's
    # _attention_bwd_kv_kernel, and its share of dQ for every query row it meets.
    n_blocks_n = tl.cdiv(seq_k, BLOCK_N)
    start_n = tl.program_id(0) % n_blocks_n * BLOCK_N
    bh_kv = tl.program_id(0) // n_blocks_n
    b = (bh_kv // n_kv_heads).to(tl.int64)
    h_kv = (bh_kv % n_kv_heads).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_in = offs_n < seq_k
    rows_n = offs_n.to(tl.int64)[:, None]
    k = tl.load(k_ptr + b * stride_kb + h_kv * stride_kh + rows_n * stride_ks + offs_d[None, :],
                mask=key_in[:, None], other=0.0)
    v = tl.load(v_ptr + b * stride_vb + h_kv * stride_vh + rows_n * stride_vs + offs_d[None, :],
                mask=key_in[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offs_bm = tl.arange(0, BLOCK_M)
    q_offs = offs_bm[:, None] * stride_qs + offs_d[None, :]
    do_offs = offs_bm[:, None] * stride_dos + offs_d[None, :]
    dq_offs = offs_bm[:, None] * stride_dqs + offs_d[None, :]
    causal_offset = seq_k - seq_q
    q_end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    q_even = seq_q // BLOCK_M * BLOCK_M
    if CAUSAL:
        m_lo = tl.minimum(tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M, q_end)
        m_full = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M
        mid_lo = tl.maximum(m_lo, tl.minimum(m_full, q_end))
    else:
        m_lo = 0
        mid_lo = 0
    mid_hi = tl.maximum(mid_lo, q_even)
    for g in range(0, group):
        h = h_kv * group + g
        bh = (b * n_kv_heads + h_kv) * group + g
        q_base = q_ptr + b * stride_qb + h * stride_qh
        do_base = do_ptr + b * stride_dob + h * stride_doh
        dq_base = dq_ptr + b * stride_dqb + h * stride_dqh
        lse_base = lse_ptr + bh * seq_q
        delta_base = delta_ptr + bh * seq_q
        # The diagonal band (causal only), the unmasked middle, the ragged tail of the queries.
        dk, dv = _kv_dq_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, q_offs, do_offs,
                              dq_offs, offs_n, m_lo, mid_lo, seq_q, causal_offset, qk_scale, scale, stride_qs,
                              stride_dos, stride_dqs, BLOCK_M, True, CAUSAL, DOT_F32)
        dk, dv = _kv_dq_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, q_offs, do_offs,
                              dq_offs, offs_n, mid_lo, q_even, seq_q, causal_offset, qk_scale, scale, stride_qs,
                              stride_dos, stride_dqs, BLOCK_M, False, CAUSAL, DOT_F32)
        dk, dv = _kv_dq_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, q_offs, do_offs,
                              dq_offs, offs_n, mid_hi, q_end, seq_q, causal_offset, qk_scale, scale, stride_qs,
                              stride_dos, stride_dqs, BLOCK_M, True, CAUSAL, DOT_F32)
    tl.store(dk_ptr + b * stride_dkb + h_kv * stride_dkh + rows_n * stride_dks + offs_d[None, :],
             (dk * scale).to(dk_ptr.dtype.element_ty), mask=key_in[:, None])
    tl.store(dv_ptr + b * stride_dvb + h_kv * stride_dvh + rows_n * stride_dvs + offs_d[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=key_in[:, None])


def atomic_dq_backward(q, k, v, o, lse, do, causal: bool, scale: float, tile=TILES[0]):
    """(dQ, dK, dV) by the atomic-dQ schedule: the lab's delta pass, then one kernel for all three gradients
    into an fp32 dQ accumulator, converted to q's dtype at the end."""
    block_m, block_n, num_warps, num_stages = tile
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    if seq_q == 0 or seq_k == 0:
        return dq.to(q.dtype), dk.zero_(), dv.zero_()
    delta = torch.empty((batch, n_heads, seq_q), dtype=torch.float32, device=q.device)
    _attention_bwd_delta_kernel[(triton.cdiv(seq_q, _DELTA_BLOCK_M) * batch * n_heads,)](
        o, do, delta, seq_q, n_heads, *_strides(o), *_strides(do),
        HEAD_DIM=head_dim, BLOCK_M=_DELTA_BLOCK_M, num_warps=_DELTA_WARPS)
    _kv_dq_kernel[(triton.cdiv(seq_k, block_n) * batch * n_kv_heads,)](
        q, k, v, do, lse.contiguous(), delta, dk, dv, dq, seq_q, seq_k, n_kv_heads, n_heads // n_kv_heads,
        scale * LOG2E, scale, *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk),
        *_strides(dv), *_strides(dq),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, DOT_F32=_dot_f32(q),
        num_warps=num_warps, num_stages=num_stages)
    return dq.to(q.dtype), dk, dv


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _check(tile, device: str) -> float:
    """The largest relative error of the three gradients against float64 at a ragged causal grouped case."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(s, generator=gen).to(device=device, dtype=torch.bfloat16)
                   for s in ((1, 4, 300, HEAD_DIM), (1, 2, 300, HEAD_DIM), (1, 2, 300, HEAD_DIM), (1, 4, 300, HEAD_DIM)))
    scale = 1 / math.sqrt(HEAD_DIM)
    o, lse = attention_fwd(q, k, v, True, scale)
    grads = atomic_dq_backward(q, k, v, o, lse, do, True, scale, tile)
    refs = reference.attention_backward_float64(q, k, v, do, True)
    return max(rel(g, r) for g, r in zip(grads, refs))


def timing(say, deadline: float) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    rows = []
    for seq in SEQS:
        for causal in (False, True):
            batch, heads = TOKENS // seq, WIDTH // HEAD_DIM
            gen = torch.Generator(device="cuda").manual_seed(seq)
            q, k, v, do = (torch.randn((batch, heads, seq, HEAD_DIM), generator=gen, device="cuda",
                                       dtype=torch.bfloat16) for _ in range(4))
            scale = 1 / math.sqrt(HEAD_DIM)
            o, lse = attention_fwd(q, k, v, causal, scale)
            flops = 2.5 * 4 * batch * heads * seq * seq * HEAD_DIM / (2 if causal else 1)
            calls = {"lab": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale)}
            calls.update({f"atomic-dq/m{t[0]}n{t[1]}w{t[2]}s{t[3]}": (lambda t=t: atomic_dq_backward(
                q, k, v, o, lse, do, causal, scale, t)) for t in TILES})
            for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                with sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
                calls[name] = lambda out=out, leaves=leaves: torch.autograd.grad(out, leaves, do, retain_graph=True)
            for name, fn in calls.items():
                if time.time() > deadline:
                    return rows
                row = {"seq": seq, "causal": causal, "candidate": name}
                try:
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    row.update(ms=ms, tflops=flops / ms / 1e9)
                except Exception as exc:  # a tile that does not compile (shared memory, registers) is reported
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                say(json.dumps(row))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_attention_bwd: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "timing": "triton.testing.do_bench medians (L2 flushed between calls)", "checks": {}, "rows": []}
    for tile in TILES:
        try:
            result["checks"][str(tile)] = _check(tile, "cuda")
        except Exception as exc:
            result["checks"][str(tile)] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(f"check {tile}: {result['checks'][str(tile)]}", flush=True)
    result["rows"] = timing(lambda text: print(text, flush=True), start + args.budget_s)
    result["wall_s"] = time.time() - start
    Path(args.out_dir, "probe_attention_bwd.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
