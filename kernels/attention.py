"""Fused scaled-dot-product attention (FlashAttention-style), forward and backward.

For one (batch, head), queries Q [Sq, D], keys K [Sk, D], values V [Sk, D] and scale c (1/sqrt(D) unless
given):

    s_ij = c * <q_i, k_j>,   P = softmax_j(s) over the keys row i may see,   O = P V
    lse_i = log sum_j exp(s_ij)                                  (saved for the backward)
    delta_i = <dO_i, O_i>,   dP = dO V^T,   dS = P * (dP - delta),
    dV = P^T dO,   dK = c * dS^T Q,   dQ = c * dS K

The forward walks the keys in tiles of BLOCK_N and never writes s or P. Each row carries the online-softmax
pair of kernels/softmax.py and docs/posts/online-softmax.md: the running maximum m and the normaliser d,
here in base 2 (x = s * log2(e), so exp(s - m) is one exp2), and beside them the fp32 accumulator
acc = sum_j exp2(x_j - m) v_j, rescaled by exp2(m_old - m_new) whenever the maximum moves. At the end
O = acc / d and lse = (m + log2 d) * ln 2. The write-up is docs/posts/attention.md.

Bytes, with `size`-byte elements, H query heads and Hkv key/value heads (grouped-query attention: query
head h reads key/value head h // (H / Hkv)):

* forward: at least Q, K, V read once and O written once, lse (fp32) written:
  (2*B*H*Sq*D + 2*B*Hkv*Sk*D) * size + 4*B*H*Sq. Each program re-reads its head's K and V, once per block
  of BLOCK_M queries; those re-reads are served mostly by L2.
* backward: at least Q, O, dO, K and V read and dQ, dK, dV written,
  (4*B*H*Sq*D + 4*B*Hkv*Sk*D) * size, plus lse and delta (fp32, 4*B*H*Sq each); the delta pass reads O
  and dO once more. The dK/dV programs re-read their group's Q and dO once per block of BLOCK_N keys, the
  dQ programs their head's K and V once per block of BLOCK_M queries.
* unfused (kernels/reference_attention.py): the B*H*Sq*Sk scores are written and read back several times,
  in bf16 and fp32: at S = 16,384 with 16 heads, 2^32 scores, 16 GiB for each fp32 copy, where the fused
  kernels hold one BLOCK_M x BLOCK_N tile of them per program, on chip.

Causal masking with Sq != Sk aligns bottom-right, as FlashAttention-2 (>= 2.1) does: query i sees key j
when j <= i + (Sk - Sq), so the last query sees every key. torch's SDPA `is_causal=True` aligns top-left
(j <= i); the two agree when Sq == Sk. A query that sees no key at all (Sk = 0, or i < Sq - Sk under the
causal mask) gets an output row of zeros and lse = -inf (the log of an empty sum), and no gradient; it
never produces NaN.

The backward recomputes P from Q, K and the saved lse (P = exp2(x - lse*log2 e)) instead of storing it.
After a delta pass it runs two kernels: one program per BLOCK_N keys walks every query block (and every
query head of the key/value head's group) for dK and dV; one program per BLOCK_M queries walks the keys
for dQ. That recomputes s and dP in both (7 tile products where an atomic dQ needs 5) but writes every
gradient exactly once from registers: no fp32 dQ buffer, no atomics, so runs are bitwise reproducible and
grouped heads sum their dK and dV without contention. The tile tables below are fixed per head_dim, dtype
and direction (no autotuning): every run launches the same plan.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype, interpreter_enabled

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128)
DIRECTIONS = ("forward", "backward_kv", "backward_q")
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
_LOG2E = tl.constexpr(LOG2E)  # the same constants, readable inside the kernels
_LN2 = tl.constexpr(LN2)


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _mma(a, b, acc, DOT_F32: tl.constexpr):
    # a @ b (+ acc) on the tensor cores. DOT_F32 (the interpreter only): its tl.dot multiplies bfloat16 bit
    # patterns (triton-lang/triton#11584), so operands are widened first; products of bf16 values are exact
    # in fp32, so the result is the same sum.
    if DOT_F32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


@triton.jit
def _fwd_tiles(acc, m, d, q, k_base, v_base, k_offs, v_offs, k_desc, v_desc, b, h_kv, offs_m, offs_n, lo, hi,
               seq_k, causal_offset, qk_scale, stride_ks, stride_vs,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
               USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_F32: tl.constexpr):
    # One pass of the online softmax over key tiles [lo, hi). MASK: some key of a tile may lie past seq_k or
    # past a row's causal limit; unmasked tiles skip the comparisons and the m = -inf guard.
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        step = start_n.to(tl.int64)
        if USE_TMA:
            k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        elif MASK:
            k = tl.load(k_base + step * stride_ks + k_offs, mask=(start_n + offs_n)[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_base + step * stride_ks + k_offs)
        s = _mma(q, tl.trans(k), None, DOT_F32)
        if MASK:
            keys = start_n + offs_n
            visible = keys[None, :] < seq_k
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None] + causal_offset)
            x = tl.where(visible, s * qk_scale, -float("inf"))
            m_new = tl.maximum(m, tl.max(x, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet keeps d = 0
            p = tl.exp2(x - m_safe[:, None])
        else:
            m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
            m_safe = m_new
            p = tl.exp2(s * qk_scale - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        d = d * alpha + tl.sum(p, axis=1)
        if USE_TMA:
            v = v_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        elif MASK:
            v = tl.load(v_base + step * stride_vs + v_offs, mask=(start_n + offs_n)[:, None] < seq_k, other=0.0)
        else:
            v = tl.load(v_base + step * stride_vs + v_offs)
        acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], DOT_F32)
        m = m_new
    return acc, m, d


@triton.jit
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, k_desc, v_desc,
    seq_q, seq_k, n_heads, group, qk_scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_F32: tl.constexpr,
):
    # One program: BLOCK_M queries of one (batch, head). Reads its Q tile once and its head's K and V tiles
    # once each; writes BLOCK_M rows of O and lse. Causal programs start with the longest rows.
    n_blocks_m = tl.cdiv(seq_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks_m
    pid_m = tl.program_id(0) % n_blocks_m
    if CAUSAL:
        pid_m = n_blocks_m - 1 - pid_m
    b = bh // n_heads
    h = bh % n_heads
    h_kv = h // group
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in = offs_m < seq_q
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_m.to(tl.int64)[:, None] * stride_qs
    q = tl.load(q_rows + offs_d[None, :], mask=row_in[:, None], other=0.0)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    k_offs = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vs + offs_d[None, :]
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    d = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    causal_offset = seq_k - seq_q
    if CAUSAL:
        # Keys a row of this block may see end at start_m + BLOCK_M - 1 + causal_offset; every row sees the
        # keys up to start_m + causal_offset, so whole tiles below that need no mask.
        hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + causal_offset), 0)
        n_full = tl.maximum(start_m + causal_offset + 1, 0) // BLOCK_N * BLOCK_N
        n_full = tl.minimum(n_full, seq_k // BLOCK_N * BLOCK_N)
    else:
        hi = seq_k
        n_full = seq_k // BLOCK_N * BLOCK_N
    if WARP_SPECIALIZE:
        tl.static_assert(USE_TMA, "warp specialisation needs the TMA loads")
    acc, m, d = _fwd_tiles(acc, m, d, q, k_base, v_base, k_offs, v_offs, k_desc, v_desc, b, h_kv, offs_m, offs_n,
                           0, n_full, seq_k, causal_offset, qk_scale, stride_ks, stride_vs,
                           BLOCK_N, HEAD_DIM, False, CAUSAL, USE_TMA, WARP_SPECIALIZE, DOT_F32)
    acc, m, d = _fwd_tiles(acc, m, d, q, k_base, v_base, k_offs, v_offs, k_desc, v_desc, b, h_kv, offs_m, offs_n,
                           n_full, hi, seq_k, causal_offset, qk_scale, stride_ks, stride_vs,
                           BLOCK_N, HEAD_DIM, True, CAUSAL, USE_TMA, False, DOT_F32)
    # A row that saw no key has d = 0: output zeros, lse = -inf.
    empty = d == 0.0
    d_safe = tl.where(empty, 1.0, d)
    o = acc / d_safe[:, None]
    lse = tl.where(empty, -float("inf"), (m + tl.log2(d_safe)) * _LN2)
    o_rows = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_m.to(tl.int64)[:, None] * stride_os
    tl.store(o_rows + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_in[:, None])
    tl.store(lse_ptr + bh.to(tl.int64) * seq_q + offs_m, lse, mask=row_in)


@triton.jit
def _attention_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, seq_q, n_heads, stride_ob, stride_oh, stride_os,
                                stride_dob, stride_doh, stride_dos, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # delta_i = <dO_i, O_i> in fp32: reads O and dO once (2*B*H*Sq*D*size bytes), writes 4 bytes a row.
    n_blocks_m = tl.cdiv(seq_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks_m
    b = bh // n_heads
    h = bh % n_heads
    offs_m = tl.program_id(0) % n_blocks_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in = offs_m < seq_q
    rows = offs_m.to(tl.int64)[:, None]
    o = tl.load(o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + rows * stride_os + offs_d[None, :],
                mask=row_in[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + rows * stride_dos
                 + offs_d[None, :], mask=row_in[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh.to(tl.int64) * seq_q + offs_m, tl.sum(o * do, axis=1), mask=row_in)


@triton.jit
def _bwd_kv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n, lo, hi,
                  seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                  BLOCK_M: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT_F32: tl.constexpr):
    # Query tiles [lo, hi) against this program's keys, in the transposed frame (keys along rows):
    # s^T = K Q^T, P^T = exp2(s^T * c * log2 e - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
    # dK += dS^T Q. MASK: rows may lie past seq_q (loaded as zeros with lse = +inf, so P = 0) and, when
    # CAUSAL, some (query, key) pairs are hidden.
    offs_bm = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        step = start_m.to(tl.int64)
        offs_m = start_m + offs_bm
        if MASK:
            row_in = offs_m < seq_q
            q = tl.load(q_base + step * stride_qs + q_offs, mask=row_in[:, None], other=0.0)
            do = tl.load(do_base + step * stride_dos + do_offs, mask=row_in[:, None], other=0.0)
            lse2 = tl.load(lse_base + offs_m, mask=row_in, other=float("inf")) * _LOG2E
            delta = tl.load(delta_base + offs_m, mask=row_in, other=0.0)
        else:
            q = tl.load(q_base + step * stride_qs + q_offs)
            do = tl.load(do_base + step * stride_dos + do_offs)
            lse2 = tl.load(lse_base + offs_m) * _LOG2E
            delta = tl.load(delta_base + offs_m)
        s_t = _mma(k, tl.trans(q), None, DOT_F32)
        p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
        if MASK and CAUSAL:
            # Rows that see no key have lse = -inf and p = inf here; the mask takes them out.
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_offset, p_t, 0.0)
        dv = _mma(p_t.to(do.dtype), do, dv, DOT_F32)
        dp_t = _mma(v, tl.trans(do), None, DOT_F32)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _mma(ds_t.to(q.dtype), q, dk, DOT_F32)
    return dk, dv


@triton.jit
def _attention_bwd_kv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    seq_q, seq_k, n_kv_heads, group, qk_scale, scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # One program: BLOCK_N keys of one (batch, key/value head), dK and dV summed over the `group` query
    # heads that share them. Reads its K and V tiles once, the group's Q, dO, lse and delta once per key
    # block; writes its dK and dV rows once.
    n_blocks_n = tl.cdiv(seq_k, BLOCK_N)
    start_n = tl.program_id(0) % n_blocks_n * BLOCK_N
    bh_kv = tl.program_id(0) // n_blocks_n
    b = bh_kv // n_kv_heads
    h_kv = bh_kv % n_kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_in = offs_n < seq_k
    rows_n = offs_n.to(tl.int64)[:, None]
    k = tl.load(k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh + rows_n * stride_ks
                + offs_d[None, :], mask=key_in[:, None], other=0.0)
    v = tl.load(v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh + rows_n * stride_vs
                + offs_d[None, :], mask=key_in[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offs_bm = tl.arange(0, BLOCK_M)
    q_offs = offs_bm[:, None] * stride_qs + offs_d[None, :]
    do_offs = offs_bm[:, None] * stride_dos + offs_d[None, :]
    causal_offset = seq_k - seq_q
    q_end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    q_even = seq_q // BLOCK_M * BLOCK_M
    if CAUSAL:
        # Rows before m_lo see none of these keys; rows from m_full on see all of them.
        m_lo = tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
        m_full = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M
        m_lo = tl.minimum(m_lo, q_end)
        mid_lo = tl.maximum(m_lo, tl.minimum(m_full, q_end))
    else:
        m_lo = 0
        mid_lo = 0
    mid_hi = tl.maximum(mid_lo, q_even)
    for g in range(0, group):
        bh = (b * n_kv_heads + h_kv) * group + g
        h = h_kv * group + g
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        lse_base = lse_ptr + bh.to(tl.int64) * seq_q
        delta_base = delta_ptr + bh.to(tl.int64) * seq_q
        # The diagonal band (causal only), the unmasked middle, the ragged tail of the queries.
        dk, dv = _bwd_kv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n,
                               m_lo, mid_lo, seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                               BLOCK_M, True, CAUSAL, DOT_F32)
        dk, dv = _bwd_kv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n,
                               mid_lo, q_even, seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                               BLOCK_M, False, CAUSAL, DOT_F32)
        dk, dv = _bwd_kv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n,
                               mid_hi, q_end, seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                               BLOCK_M, True, CAUSAL, DOT_F32)
    tl.store(dk_ptr + b.to(tl.int64) * stride_dkb + h_kv.to(tl.int64) * stride_dkh + rows_n * stride_dks
             + offs_d[None, :], (dk * scale).to(dk_ptr.dtype.element_ty), mask=key_in[:, None])
    tl.store(dv_ptr + b.to(tl.int64) * stride_dvb + h_kv.to(tl.int64) * stride_dvh + rows_n * stride_dvs
             + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty), mask=key_in[:, None])


@triton.jit
def _bwd_q_tiles(dq, q, do, lse2, delta, k_base, v_base, k_offs, v_offs, offs_m, offs_n, lo, hi, seq_k, causal_offset,
                 qk_scale, stride_ks, stride_vs, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                 DOT_F32: tl.constexpr):
    # Key tiles [lo, hi) for this program's queries: P = exp2(s * c * log2 e - lse), dS = P (dO V^T - delta),
    # dQ += dS K. MASK: keys may lie past seq_k or past a row's causal limit.
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        step = start_n.to(tl.int64)
        if MASK:
            key_in = (start_n + offs_n) < seq_k
            k = tl.load(k_base + step * stride_ks + k_offs, mask=key_in[:, None], other=0.0)
            v = tl.load(v_base + step * stride_vs + v_offs, mask=key_in[:, None], other=0.0)
        else:
            k = tl.load(k_base + step * stride_ks + k_offs)
            v = tl.load(v_base + step * stride_vs + v_offs)
        p = tl.exp2(_mma(q, tl.trans(k), None, DOT_F32) * qk_scale - lse2[:, None])
        if MASK:
            visible = key_in[None, :]
            if CAUSAL:
                visible = visible & ((start_n + offs_n)[None, :] <= offs_m[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        ds = p * (_mma(do, tl.trans(v), None, DOT_F32) - delta[:, None])
        dq = _mma(ds.to(k.dtype), k, dq, DOT_F32)
    return dq


@triton.jit
def _attention_bwd_q_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    seq_q, seq_k, n_heads, group, qk_scale, scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # One program: BLOCK_M queries of one (batch, head). Reads its Q and dO tiles once and its head's K and V
    # tiles once each; writes BLOCK_M rows of dQ. Key ranges as in the forward.
    n_blocks_m = tl.cdiv(seq_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks_m
    pid_m = tl.program_id(0) % n_blocks_m
    if CAUSAL:
        pid_m = n_blocks_m - 1 - pid_m
    b = bh // n_heads
    h = bh % n_heads
    h_kv = h // group
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in = offs_m < seq_q
    rows = offs_m.to(tl.int64)[:, None]
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + rows * stride_qs + offs_d[None, :],
                mask=row_in[:, None], other=0.0)
    do = tl.load(do_ptr + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + rows * stride_dos
                 + offs_d[None, :], mask=row_in[:, None], other=0.0)
    # Rows past seq_q take lse = +inf, so their P is 0 without a row mask in the loop.
    lse2 = tl.load(lse_ptr + bh.to(tl.int64) * seq_q + offs_m, mask=row_in, other=float("inf")) * _LOG2E
    delta = tl.load(delta_ptr + bh.to(tl.int64) * seq_q + offs_m, mask=row_in, other=0.0)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    k_offs = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vs + offs_d[None, :]
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    causal_offset = seq_k - seq_q
    if CAUSAL:
        hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + causal_offset), 0)
        n_full = tl.maximum(start_m + causal_offset + 1, 0) // BLOCK_N * BLOCK_N
        n_full = tl.minimum(n_full, seq_k // BLOCK_N * BLOCK_N)
    else:
        hi = seq_k
        n_full = seq_k // BLOCK_N * BLOCK_N
    dq = _bwd_q_tiles(dq, q, do, lse2, delta, k_base, v_base, k_offs, v_offs, offs_m, offs_n, 0, n_full, seq_k,
                      causal_offset, qk_scale, stride_ks, stride_vs, BLOCK_N, False, CAUSAL, DOT_F32)
    dq = _bwd_q_tiles(dq, q, do, lse2, delta, k_base, v_base, k_offs, v_offs, offs_m, offs_n, n_full, hi, seq_k,
                      causal_offset, qk_scale, stride_ks, stride_vs, BLOCK_N, True, CAUSAL, DOT_F32)
    tl.store(dq_ptr + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh + rows * stride_dqs
             + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_in[:, None])


# --------------------------------------------------------------------------------------------------------
# Launch plan: pure functions of direction, head_dim, dtype, causal and the query length; no autotuning
# --------------------------------------------------------------------------------------------------------

# (direction, head_dim) -> (block_m, block_n, num_warps, num_stages). Both supported dtypes are two bytes
# wide and share their tiles; causal and full attention share them too (the causal diagonal is one masked
# tile pass per program either way). Shared memory per program, two-byte elements, stays well under the
# H100's 227 KiB: forward D = 128 holds a 32 KiB Q tile and 3 stages of 16 KiB K + 16 KiB V tiles (128 KiB);
# the backward keeps its resident tiles' fp32 accumulators (dK and dV, or dQ) at 64 registers a thread.
# These are the starting points named in docs/posts/attention.md, not yet measured against alternatives;
# tools/gpu_check_attention.py times them beside two or three others per case.
_TILES = {
    ("forward", 64): (128, 128, 8, 3),
    ("forward", 128): (128, 64, 8, 3),
    # backward_kv: a program holds block_n keys and streams block_m queries at a time.
    ("backward_kv", 64): (64, 128, 8, 2),
    ("backward_kv", 128): (64, 128, 8, 2),
    # backward_q: a program holds block_m queries and streams block_n keys at a time.
    ("backward_q", 64): (128, 64, 8, 2),
    ("backward_q", 128): (128, 128, 8, 2),
}
# Measured on an H100 (tools/gpu_check_attention.py, B·S = 16,384, H·D = 2,048, S 2,048 and 8,192, causal and
# not, bf16; notes/attention.md): at head_dim 128 the forward through tensor descriptors (TMA) ran 0.70–0.77x
# of cuDNN against 0.62–0.68x without, and the backward's 128-key dK/dV tiles with 128x128 dQ tiles
# 0.65–0.69x against 0.39–0.43x for the 64-key tiles first tabled. Head dim 64 has not been measured yet.
_FORWARD_TMA_HEAD_DIMS = (128,)
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

    def as_dict(self) -> dict:
        return asdict(self)


def plan_attention(seq_q: int, head_dim: int, dtype: torch.dtype, causal: bool,
                   direction: str = "forward") -> AttentionPlan:
    """The launch plan for one kernel of `direction` at this query length, head_dim and dtype."""
    if direction not in DIRECTIONS:
        raise ValueError(f"attention: direction must be one of {', '.join(map(repr, DIRECTIONS))}, got {direction!r}.")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"attention: head_dim {head_dim} is not supported; supported head dims are "
                         f"{', '.join(map(str, HEAD_DIMS))}.")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"attention: dtype {str(dtype).removeprefix('torch.')} is not supported; supported "
                        "dtypes are float16, bfloat16.")
    block_m, block_n, num_warps, num_stages = _TILES[direction, head_dim]
    tma = direction == "forward" and head_dim in _FORWARD_TMA_HEAD_DIMS
    if direction == "forward" and seq_q <= SHORT_QUERY_MAX:
        block_m, num_warps = _SHORT_QUERY_TILE
    return AttentionPlan(direction, block_m, block_n, num_warps, num_stages, tma=tma)


def plan_attention_backward(seq_q: int, head_dim: int, dtype: torch.dtype, causal: bool) -> tuple:
    """(dK/dV plan, dQ plan) of the backward."""
    return tuple(plan_attention(seq_q, head_dim, dtype, causal, d) for d in ("backward_kv", "backward_q"))


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


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                  plan: AttentionPlan | None = None, out: torch.Tensor | None = None,
                  lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """O [B, H, Sq, D] (q's dtype) and lse [B, H, Sq] (fp32, natural log); into `out` and `lse` if given."""
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    plan = plan or plan_attention(seq_q, head_dim, q.dtype, causal)
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
    use_tma = plan.tma and _tma_fits(k, v) and not interpreter_enabled()  # the interpreter has no TMA
    k_desc = _tma_descriptor(k, plan.block_n) if use_tma else None
    v_desc = _tma_descriptor(v, plan.block_n) if use_tma else None
    grid = (triton.cdiv(seq_q, plan.block_m) * batch * n_heads,)
    _attention_fwd_kernel[grid](
        q, k, v, o, lse, k_desc, v_desc, seq_q, seq_k, n_heads, n_heads // n_kv_heads, scale * LOG2E,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        HEAD_DIM=head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CAUSAL=causal, USE_TMA=use_tma,
        WARP_SPECIALIZE=use_tma and plan.warp_specialize, DOT_F32=_dot_f32(q),
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    return o, lse


def attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, causal: bool, scale: float, plans: tuple | None = None,
                  out: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from the saved O and lse; into the three tensors of `out` if given.

    plans: (dK/dV plan, dQ plan), by default plan_attention_backward's. The delta pass writes
    delta = rowsum(dO * O) (fp32, [B, H, Sq]) before the two gradient kernels read it.
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
    _attention_bwd_kv_kernel[(triton.cdiv(seq_k, kv_plan.block_n) * batch * n_kv_heads,)](
        q, k, v, do, lse, delta, dk, dv, seq_q, seq_k, n_kv_heads, group, scale * LOG2E, scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        HEAD_DIM=head_dim, BLOCK_M=kv_plan.block_m, BLOCK_N=kv_plan.block_n, CAUSAL=causal, DOT_F32=_dot_f32(q),
        num_warps=kv_plan.num_warps, num_stages=kv_plan.num_stages,
    )
    _attention_bwd_q_kernel[(triton.cdiv(seq_q, q_plan.block_m) * batch * n_heads,)](
        q, k, v, do, lse, delta, dq, seq_q, seq_k, n_heads, group, scale * LOG2E, scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        HEAD_DIM=head_dim, BLOCK_M=q_plan.block_m, BLOCK_N=q_plan.block_n, CAUSAL=causal, DOT_F32=_dot_f32(q),
        num_warps=q_plan.num_warps, num_stages=q_plan.num_stages,
    )
    return dq, dk, dv


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# --------------------------------------------------------------------------------------------------------
# Autograd and the public function
# --------------------------------------------------------------------------------------------------------


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
        q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
        o, lse = attention_fwd(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.scale = scale
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_bwd(q, k, v, o, lse, _unit_stride(do.to(o.dtype)), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def check_attention_inputs(op: str, q, k, v, causal, scale) -> None:
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
    check_device(op, q, k, v)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """softmax(scale * Q K^T [+ causal mask]) V, differentiable; the output has q's shape and dtype.

    q: (batch, heads, seq_q, head_dim); k, v: (batch, kv_heads, seq_k, head_dim), kv_heads dividing heads
    (query head h uses key/value head h // (heads / kv_heads), as torch's SDPA with enable_gqa=True).
    dtype float16 or bfloat16, one for all three; head_dim 64 or 128; any sequence lengths (seq_k may differ
    from seq_q) and strides. On CUDA, or on the CPU with TRITON_INTERPRET=1. scale: finite and >= 0,
    1/sqrt(head_dim) by default. causal=True hides key j from query i unless j <= i + seq_k - seq_q (bottom-right
    alignment, as FlashAttention-2; torch's is_causal aligns top-left, the same when seq_q == seq_k). A query
    that sees no key gets zeros. Math in fp32 (P rounded to the input dtype before P V, as in
    FlashAttention).
    """
    check_attention_inputs("attention", q, k, v, causal, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return AttentionFunction.apply(q, k, v, causal, scale)
