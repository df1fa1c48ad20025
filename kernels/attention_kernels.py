"""Fused attention kernels, forward and backward (the device code of kernels/attention.py).

For one (batch, head), queries Q [Sq, D], keys K [Sk, D], values V [Sk, D] and scale c:

    s_ij = c * <q_i, k_j>,   P = softmax_j(s) over the keys row i may see,   O = P V
    lse_i = log sum_j exp(s_ij)                                  (saved for the backward)
    delta_i = <dO_i, O_i>,   dP = dO V^T,   dS = P * (dP - delta),
    dV = P^T dO,   dK = c * dS^T Q,   dQ = c * dS K

The forward walks the keys in tiles of BLOCK_N and never writes s or P. Each row carries the online-softmax
pair of kernels/softmax.py and docs/posts/online-softmax.md: the running maximum m and the normaliser d,
here in base 2 (x = s * log2(e), so exp(s - m) is one exp2), and beside them the fp32 accumulator
acc = sum_j exp2(x_j - m) v_j, rescaled by exp2(m_old - m_new) whenever the maximum moves. At the end
O = acc / d and lse = (m + log2 d) * ln 2. A row that saw no key ends with d = 0: O = 0, lse = -inf.

A row sees the keys below seq_k, under CAUSAL those with j <= i + (Sk - Sq), under KEY_MASK those whose
byte of the key mask (Sk bytes a batch, nonzero where the key takes part) is set: hidden scores become -inf
before the (m, d) update and hidden P entries 0 in the backward (a hidden key's K and V are still read, so
must be finite: 0 * NaN is NaN, as in torch). Without KEY_MASK (a constexpr) no key-mask code is compiled;
with it every key tile takes the masked path.

Bytes, with `size`-byte elements, H query heads and Hkv key/value heads (grouped-query attention: query
head h reads key/value head h // (H / Hkv)):

* forward: at least Q, K, V read once and O written once, lse (fp32) written:
  (2*B*H*Sq*D + 2*B*Hkv*Sk*D) * size + 4*B*H*Sq. Each program re-reads its head's K and V, once per block
  of BLOCK_M queries; those re-reads are served mostly by L2. A key mask adds B*Sk bytes, re-read likewise.
* backward: at least Q, O, dO, K and V read and dQ, dK, dV written,
  (4*B*H*Sq*D + 4*B*Hkv*Sk*D) * size, plus lse and delta (fp32, 4*B*H*Sq each); the delta pass reads O
  and dO once more. The dK/dV programs re-read their group's Q and dO once per block of BLOCK_N keys, the
  dQ programs their head's K and V once per block of BLOCK_M queries.

The backward recomputes P from Q, K and the saved lse (P = exp2(x - lse*log2 e)) instead of storing it.
After a delta pass it runs two kernels: one program per BLOCK_N keys walks every query block (and every
query head of the key/value head's group) for dK and dV; one program per BLOCK_M queries walks the keys
for dQ. That recomputes s and dP in both (7 tile products where an atomic dQ needs 5) but writes every
gradient exactly once from registers: no fp32 dQ buffer, no atomics, so runs are bitwise reproducible and
grouped heads sum their dK and dV without contention. A row that saw no key has lse = -inf, so its P is
+inf before the masks set it to 0 (every key it meets is hidden): its dQ and its share of dK, dV are 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
_LOG2E = tl.constexpr(LOG2E)  # the same constants, readable inside the kernels
_LN2 = tl.constexpr(LN2)


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
def _key_kept(mask_base, keys, seq_k, stride_mk):
    # The key mask at `keys` of one batch: True where the key takes part; False past seq_k.
    return tl.load(mask_base + keys.to(tl.int64) * stride_mk, mask=keys < seq_k, other=0) != 0


@triton.jit
def _fwd_tiles(acc, m, d, q, k_base, v_base, k_offs, v_offs, k_desc, v_desc, mask_base, b, h_kv, offs_m, offs_n,
               lo, hi, seq_k, causal_offset, qk_scale, stride_ks, stride_vs, stride_mk,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
               KEY_MASK: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_F32: tl.constexpr):
    # One pass of the online softmax over key tiles [lo, hi). MASK: some key of a tile may lie past seq_k or
    # past a row's causal limit; KEY_MASK: the key mask may hide any key. Tiles with neither skip the
    # comparisons and the m = -inf guard.
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        step = start_n.to(tl.int64)
        if KEY_MASK:
            kept = _key_kept(mask_base, start_n + offs_n, seq_k, stride_mk)
        if USE_TMA:
            k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        elif MASK:
            k = tl.load(k_base + step * stride_ks + k_offs, mask=(start_n + offs_n)[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_base + step * stride_ks + k_offs)
        s = _mma(q, tl.trans(k), None, DOT_F32)
        if MASK or KEY_MASK:
            keys = start_n + offs_n
            if KEY_MASK:
                visible = kept[None, :]
            else:
                visible = keys[None, :] < seq_k
            if MASK and CAUSAL:
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
def _query_block(seq_q, n_heads, group, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    # The (batch, head) and the BLOCK_M queries of this program, for the kernels that hold a query block:
    # (bh, b, h, h_kv, start_m, offs_m). Causal programs start with the longest rows.
    n_blocks_m = tl.cdiv(seq_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks_m
    pid_m = tl.program_id(0) % n_blocks_m
    if CAUSAL:
        pid_m = n_blocks_m - 1 - pid_m
    b = bh // n_heads
    h = bh % n_heads
    start_m = pid_m * BLOCK_M
    return bh, b, h, h // group, start_m, start_m + tl.arange(0, BLOCK_M)


@triton.jit
def _key_range(start_m, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # (causal_offset, n_full, hi) for a query block starting at start_m: keys [0, n_full) come in whole tiles
    # every row of the block sees; keys [n_full, hi) need the mask. Under CAUSAL the keys a row of the block
    # may see end at start_m + BLOCK_M - 1 + causal_offset, and every row sees those up to
    # start_m + causal_offset.
    causal_offset = seq_k - seq_q
    if CAUSAL:
        hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + causal_offset), 0)
        n_full = tl.maximum(start_m + causal_offset + 1, 0) // BLOCK_N * BLOCK_N
        n_full = tl.minimum(n_full, seq_k // BLOCK_N * BLOCK_N)
    else:
        hi = seq_k
        n_full = seq_k // BLOCK_N * BLOCK_N
    return causal_offset, n_full, hi


@triton.jit
def _key_tiles(k_ptr, v_ptr, b, h_kv, offs_n, offs_d, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs):
    # The K/V head a query block reads (its batch b, K/V head h_kv) and one tile's offsets within it:
    # (k_base, v_base, k_offs, v_offs).
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    return (k_base, v_base, offs_n[:, None] * stride_ks + offs_d[None, :], offs_n[:, None] * stride_vs + offs_d[None, :])


@triton.jit
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, k_desc, v_desc, mask_ptr,
    seq_q, seq_k, n_heads, group, qk_scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_mb, stride_mk,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    KEY_MASK: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_F32: tl.constexpr,
):
    # One program: BLOCK_M queries of one (batch, head). Reads its Q tile once and its head's K and V tiles
    # once each; writes BLOCK_M rows of O and lse. Causal programs start with the longest rows.
    bh, b, h, h_kv, start_m, offs_m = _query_block(seq_q, n_heads, group, BLOCK_M, CAUSAL)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in = offs_m < seq_q
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_m.to(tl.int64)[:, None] * stride_qs
    q = tl.load(q_rows + offs_d[None, :], mask=row_in[:, None], other=0.0)
    k_base, v_base, k_offs, v_offs = _key_tiles(k_ptr, v_ptr, b, h_kv, offs_n, offs_d, stride_kb, stride_kh, stride_ks,
                                                stride_vb, stride_vh, stride_vs)
    mask_base = mask_ptr
    if KEY_MASK:
        mask_base += b.to(tl.int64) * stride_mb
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    d = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    causal_offset, n_full, hi = _key_range(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    if WARP_SPECIALIZE:
        tl.static_assert(USE_TMA, "warp specialisation needs the TMA loads")
    acc, m, d = _fwd_tiles(acc, m, d, q, k_base, v_base, k_offs, v_offs, k_desc, v_desc, mask_base, b, h_kv, offs_m,
                           offs_n, 0, n_full, seq_k, causal_offset, qk_scale, stride_ks, stride_vs, stride_mk,
                           BLOCK_N, HEAD_DIM, False, CAUSAL, KEY_MASK, USE_TMA, WARP_SPECIALIZE, DOT_F32)
    acc, m, d = _fwd_tiles(acc, m, d, q, k_base, v_base, k_offs, v_offs, k_desc, v_desc, mask_base, b, h_kv, offs_m,
                           offs_n, n_full, hi, seq_k, causal_offset, qk_scale, stride_ks, stride_vs, stride_mk,
                           BLOCK_N, HEAD_DIM, True, CAUSAL, KEY_MASK, USE_TMA, False, DOT_F32)
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
def _bwd_kv_tiles(dk, dv, k, v, kept, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n, lo, hi,
                  seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                  BLOCK_M: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, KEY_MASK: tl.constexpr,
                  DOT_F32: tl.constexpr):
    # Query tiles [lo, hi) against this program's keys, in the transposed frame (keys along rows):
    # s^T = K Q^T, P^T = exp2(s^T * c * log2 e - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
    # dK += dS^T Q. MASK: rows may lie past seq_q (loaded as zeros with lse = +inf, so P = 0) and, when
    # CAUSAL, some (query, key) pairs are hidden. KEY_MASK: `kept` [BLOCK_N] says which keys take part.
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
        if KEY_MASK:
            p_t = tl.where(kept[:, None], p_t, 0.0)
        dv = _mma(p_t.to(do.dtype), do, dv, DOT_F32)
        dp_t = _mma(v, tl.trans(do), None, DOT_F32)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _mma(ds_t.to(q.dtype), q, dk, DOT_F32)
    return dk, dv


@triton.jit
def _attention_bwd_kv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr,
    seq_q, seq_k, n_kv_heads, group, qk_scale, scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_mb, stride_mk,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    KEY_MASK: tl.constexpr, DOT_F32: tl.constexpr,
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
    if KEY_MASK:
        kept = _key_kept(mask_ptr + b.to(tl.int64) * stride_mb, offs_n, seq_k, stride_mk)
    else:
        kept = key_in
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offs_bm = tl.arange(0, BLOCK_M)
    q_offs = offs_bm[:, None] * stride_qs + offs_d[None, :]
    do_offs = offs_bm[:, None] * stride_dos + offs_d[None, :]
    causal_offset = seq_k - seq_q
    q_end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    q_even = seq_q // BLOCK_M * BLOCK_M
    if KEY_MASK:  # a block of keys that all stay hidden (padding) walks no query: its dK and dV are zeros
        q_end = tl.where(tl.max(kept.to(tl.int32), axis=0) > 0, q_end, 0)
        q_even = tl.minimum(q_even, q_end)
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
        dk, dv = _bwd_kv_tiles(dk, dv, k, v, kept, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n,
                               m_lo, mid_lo, seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                               BLOCK_M, True, CAUSAL, KEY_MASK, DOT_F32)
        dk, dv = _bwd_kv_tiles(dk, dv, k, v, kept, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n,
                               mid_lo, q_even, seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                               BLOCK_M, False, CAUSAL, KEY_MASK, DOT_F32)
        dk, dv = _bwd_kv_tiles(dk, dv, k, v, kept, q_base, do_base, lse_base, delta_base, q_offs, do_offs, offs_n,
                               mid_hi, q_end, seq_q, causal_offset, qk_scale, stride_qs, stride_dos,
                               BLOCK_M, True, CAUSAL, KEY_MASK, DOT_F32)
    tl.store(dk_ptr + b.to(tl.int64) * stride_dkb + h_kv.to(tl.int64) * stride_dkh + rows_n * stride_dks
             + offs_d[None, :], (dk * scale).to(dk_ptr.dtype.element_ty), mask=key_in[:, None])
    tl.store(dv_ptr + b.to(tl.int64) * stride_dvb + h_kv.to(tl.int64) * stride_dvh + rows_n * stride_dvs
             + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty), mask=key_in[:, None])


@triton.jit
def _bwd_q_tiles(dq, q, do, lse2, delta, k_base, v_base, k_offs, v_offs, mask_base, offs_m, offs_n, lo, hi, seq_k,
                 causal_offset, qk_scale, stride_ks, stride_vs, stride_mk, BLOCK_N: tl.constexpr,
                 MASK: tl.constexpr, CAUSAL: tl.constexpr, KEY_MASK: tl.constexpr, DOT_F32: tl.constexpr):
    # Key tiles [lo, hi) for this program's queries: P = exp2(s * c * log2 e - lse), dS = P (dO V^T - delta),
    # dQ += dS K. MASK: keys may lie past seq_k or past a row's causal limit; KEY_MASK: the key mask may
    # hide any key.
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
        if MASK or KEY_MASK:
            if KEY_MASK:
                visible = _key_kept(mask_base, start_n + offs_n, seq_k, stride_mk)[None, :]  # False past seq_k
            else:
                visible = key_in[None, :]
            if MASK and CAUSAL:
                visible = visible & ((start_n + offs_n)[None, :] <= offs_m[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        ds = p * (_mma(do, tl.trans(v), None, DOT_F32) - delta[:, None])
        dq = _mma(ds.to(k.dtype), k, dq, DOT_F32)
    return dq


@triton.jit
def _attention_bwd_q_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, mask_ptr,
    seq_q, seq_k, n_heads, group, qk_scale, scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs, stride_mb, stride_mk,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    KEY_MASK: tl.constexpr, DOT_F32: tl.constexpr,
):
    # One program: BLOCK_M queries of one (batch, head). Reads its Q and dO tiles once and its head's K and V
    # tiles once each; writes BLOCK_M rows of dQ. Key ranges as in the forward.
    bh, b, h, h_kv, start_m, offs_m = _query_block(seq_q, n_heads, group, BLOCK_M, CAUSAL)
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
    k_base, v_base, k_offs, v_offs = _key_tiles(k_ptr, v_ptr, b, h_kv, offs_n, offs_d, stride_kb, stride_kh, stride_ks,
                                                stride_vb, stride_vh, stride_vs)
    mask_base = mask_ptr
    if KEY_MASK:
        mask_base += b.to(tl.int64) * stride_mb
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    causal_offset, n_full, hi = _key_range(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_q_tiles(dq, q, do, lse2, delta, k_base, v_base, k_offs, v_offs, mask_base, offs_m, offs_n, 0, n_full,
                      seq_k, causal_offset, qk_scale, stride_ks, stride_vs, stride_mk, BLOCK_N, False, CAUSAL,
                      KEY_MASK, DOT_F32)
    dq = _bwd_q_tiles(dq, q, do, lse2, delta, k_base, v_base, k_offs, v_offs, mask_base, offs_m, offs_n, n_full, hi,
                      seq_k, causal_offset, qk_scale, stride_ks, stride_vs, stride_mk, BLOCK_N, True, CAUSAL,
                      KEY_MASK, DOT_F32)
    tl.store(dq_ptr + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh + rows * stride_dqs
             + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_in[:, None])
