"""The attention forward for Hopper (sm_90) in Gluon: the same maths and results as kernels/attention_kernels.py's
forward, scheduled by hand.

    s_ij = c * <q_i, k_j>,   O = softmax_j(s) V,   lse_i = log sum_j exp(s_ij)

One program holds BLOCK_M = 128 queries of one (batch, head) and walks its keys in tiles of BLOCK_N = 128 (or
64, with registers for two programs an SM, where kernels/attention_choice.py plans them at head dim 64).
Its warps are split into three partitions (gl.warp_specialize):

* a loader (1 warp, few registers): copies the two 64-query halves of the Q tile once, then each key tile's
  K and V through tensor descriptors (TMA) into a ring of STAGES shared-memory slots. Each slot has four
  mbarriers: K ready, K free, V ready, V free. A copy waits for its slot to be free and signals ready when
  its bytes land.
* two consumer warpgroups (4 warps each), one a half of the Q tile (64 queries): each runs the online
  softmax of attention_kernels.py over every key tile, on the tensor cores through asynchronous warpgroup
  MMAs (wgmma). The score product of tile j (S = Q K_j^T) is issued together with the value product of tile
  j - 1 (O += P_{j-1} V_{j-1}); the consumer waits for the first only, so the exponentials of tile j run
  while the tensor cores still work on tile j - 1. A consumer frees K_j as soon as S_j is in its registers
  and V_{j-1} once its product is done; each free barrier counts both consumers.

Which query tiles a program takes (kernels/attention_choice.py plans it by the mask): one, the grid holding
one program a tile (the hardware hands programs out in order as SMs free up); or, on the persistent grid of one
program an SM, tiles pid, pid + grid, ... (without the causal mask, where tiles are of one length); or, causal,
whichever tile comes next from a counter in global memory when the program's loader is ready for one (ON_DEMAND,
an atomic add), so tiles of unequal length balance over SMs as the hardware's order balances them, with the next
tile's Q in a second buffer. The loader writes each tile's index beside the Q buffer it fills; the consumers read
it once that Q has landed, and the first index past the last tile ends them.

PINGPONG (a plan option, off in the lab's plan): the two consumers also issue their products in turns,
consumer 0, then 1, then 0 (two more mbarriers), so one's exponentials run while the other's products hold
the tensor cores; timed on the H100 it changed little (notes/attention.md, 2026-11-26).

The Q tile stays in shared memory for the whole key loop; P goes from the score accumulator to the value
product's register operand without touching shared memory. O leaves through shared memory: the accumulator's
layout gives a thread pairs of elements (32 four-byte stores a thread for a 64 x 128 tile, which held the
tensor cores idle while they issued), so O is converted first to rows of eight elements a thread and written
in eight 16-byte stores (round attention-o-store in the lab notebook). The running maximum m and normaliser d are
kept in base 2 (x = s * log2 e), as the Triton kernel keeps them; O = acc / d and lse = (m + log2 d) ln 2.
A row that sees no key ends with d = 0: O = 0 and lse = -inf.

Which keys a row sees is the Triton kernel's rule: keys below seq_k, under CAUSAL those with
j <= i + (seq_k - seq_q), under KEY_MASK those whose mask byte is set. The first key tile and the tiles
from n_full on go through the masked softmax (comparisons, -inf, the m = -inf guard); the tiles between,
which every row of the warpgroup sees whole, skip it. With a key mask every tile is masked. Keys past
seq_k, and queries past seq_q, come in as zeros (the descriptor's bounds); their scores are hidden and their
rows are not stored.

Bytes moved are the Triton forward's (kernels/attention_kernels.py's docstring): Q, K, V read once a program,
O and lse written once. Gluon kernels compile for the GPU only (no interpreter); kernels/attention.py falls
back to the Triton kernel elsewhere.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels._gluon_host import LOG2E, compile_kernel_for_sm90, descriptor, key_mask_args

LN2 = 0.6931471805599453
_LN2 = gl.constexpr(LN2)  # readable inside the kernels

WARPGROUP_M = 64  # queries a consumer warpgroup holds
BLOCK_M = 2 * WARPGROUP_M  # queries a program holds (two consumers)
BLOCK_N = 128  # keys a tile
# The ring's stages come from the caller's plan (kernels/attention_choice.py: 3 at D = 64, 2 at D = 128).
# Shared memory, two-byte elements: Q 2 x 64 x D and STAGES slots of K and V, BLOCK_N x D each, and the
# 16 KB O passes through on its way to 16-byte stores: 180,320 bytes compiled at D = 128 as the plan launches
# it without the causal mask (213,124 with it: a second Q buffer and the tile indices beside them). A third
# stage fitted before that 16 KB (229,776 of the H100's 232,448) but ran 0-9% slower.
# Registers a thread: each consumer holds S (64 x 128 fp32, 64 a thread), O (64 x D fp32) and P (bf16);
# the loader holds scalars. 4 + 4 + 1 warps occupy three warpgroups: 3 x 128 threads x 168 = 64,512 of
# the SM's 65,536 registers, handed out as 240 to each consumer and 24 to the loader.
CONSUMER_REGS, LOADER_REGS, MAXNREG = 240, 24, 168
# Two programs an SM (64-key tiles at head dim 64, where kernels/attention_choice.py plans them): a consumer holds
# half the score tile (32 fp32 registers a thread, P 16), so 2 x 3 x 128 threads x 80 = 61,440 registers at launch,
# handed out as 104 to each consumer and 24 to the loader (compiled for sm_90 a consumer spills 32-48 bytes).
# Programs an SM -> (consumer, loader, launch) registers a thread.
REGISTERS = {1: (CONSUMER_REGS, LOADER_REGS, MAXNREG), 2: (104, 24, 80)}
NUM_WARPS = 4  # the default partition (consumer 0); the workers add 4 + 1


@gluon.jit
def _query_tile(t, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N: gl.constexpr, block_m: gl.constexpr,
                CAUSAL: gl.constexpr):
    # Query tile t's (b, h, bh, first query, key tiles walked): tiles of one (batch, head) are consecutive, so
    # the tiles in flight at once share a few heads' keys in the L2; causal tiles of a head come longest
    # first (the hardware hands programs out in order, and a persistent program's tiles t, t + grid, ...
    # then take a share of every length).
    bh = t // n_blocks_m
    pid_m = t % n_blocks_m
    if CAUSAL:
        pid_m = n_blocks_m - 1 - pid_m
    start_m = pid_m * block_m
    if CAUSAL:  # the keys the block's last row may see; at least one tile is walked (all hidden if none)
        hi = gl.maximum(gl.minimum(seq_k, start_m + block_m + seq_k - seq_q), 0)
    else:
        hi = seq_k
    return bh // n_heads, bh % n_heads, bh, start_m, gl.maximum(gl.cdiv(hi, BLOCK_N), 1)


@gluon.jit
def _loader(tile_smem, counter_ptr, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free,
            v_ready, v_free, seq_q, seq_k, n_heads, group, n_blocks_m, n_bh, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, CAUSAL: gl.constexpr, Q_BUFFERS: gl.constexpr, ON_DEMAND: gl.constexpr):
    # For each query tile of the program: its Q halves once the consumers are done with the last tile's
    # (q_free), then K_j and V_j into ring slot c % STAGES once the consumers have freed it; c counts key
    # tiles over the program's whole life, so the ring runs on across query tiles and the next tile's first
    # loads land while the consumers finish the last one. mbarriers start as if their phase 1 had completed,
    # so the first pass over the ring does not wait. ON_DEMAND: the program's next tile is the counter's next
    # value (an atomic add), written beside the Q buffer it fills for the consumers to read once its Q lands;
    # the first value past the last tile, written the same way, ends them.
    wg_m: gl.constexpr = q_desc.block_type.shape[2]
    total = n_blocks_m * n_bh
    c = 0
    i = 0
    if ON_DEMAND:
        t = gl.atomic_add(counter_ptr, 1)
    else:
        t = gl.program_id(0)
    while t < total:
        b, h, bh, start_m, n_tiles = _query_tile(t, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N, 2 * wg_m, CAUSAL)
        h_kv = h // group
        qb = i % Q_BUFFERS
        mbarrier.wait(q_free.index(qb), ((i // Q_BUFFERS) & 1) ^ 1)
        if ON_DEMAND:
            tile_smem.index(qb).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
        mbarrier.expect(q_bar.index(qb), 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_bar.index(qb), q_smem.index(2 * qb))
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + wg_m, 0], q_bar.index(qb), q_smem.index(2 * qb + 1))
        for j in range(n_tiles):
            slot = c % STAGES
            phase = (c // STAGES) & 1
            mbarrier.wait(k_free.index(slot), phase ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, h_kv, j * BLOCK_N, 0], k_ready.index(slot),
                                            k_smem.index(slot))
            mbarrier.wait(v_free.index(slot), phase ^ 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [b, h_kv, j * BLOCK_N, 0], v_ready.index(slot),
                                            v_smem.index(slot))
            c += 1
        i += 1
        if ON_DEMAND:
            t = gl.atomic_add(counter_ptr, 1)
        else:
            t += gl.num_programs(0)
    if ON_DEMAND:
        qb = i % Q_BUFFERS
        mbarrier.wait(q_free.index(qb), ((i // Q_BUFFERS) & 1) ^ 1)
        tile_smem.index(qb).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
        mbarrier.arrive(q_bar.index(qb))


# 2^f on [-1/2, 1/2], degree 4, fitted to the relative error (at most 2.7e-6, against bf16's 3.9e-3 and the
# lse's 2e-5 tolerance in tests/test_attention.py).
_EXP2_C0, _EXP2_C1, _EXP2_C2 = gl.constexpr(0.9999991655349731), gl.constexpr(0.6931219696998596), gl.constexpr(0.24024981260299683)
_EXP2_C3, _EXP2_C4 = gl.constexpr(0.05591712146997452), gl.constexpr(0.009560519829392433)
_ROUNDER = gl.constexpr(12582912.0)  # 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits


@gluon.jit
def _exp2_fma(x):
    # 2^x for finite x <= 0 on the FMA and integer pipes instead of the MUFU: x = n + f with n = round(x),
    # 2^f from the polynomial, n added to its exponent field. x is first clamped to -125 (2^-125 for anything
    # smaller: nothing against a row sum of at least 1).
    x = gl.maximum(x, -125.0)
    t = x + _ROUNDER
    f = x - (t - _ROUNDER)
    poly = _EXP2_C0 + f * (_EXP2_C1 + f * (_EXP2_C2 + f * (_EXP2_C3 + f * _EXP2_C4)))
    bits = poly.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _exp2_split(x):
    # 2^x of a score tile, half of each thread's pairs of columns on the MUFU and half through _exp2_fma, so
    # the two pipes share the exponentials (at head dim 64 the MUFU alone takes as long as the tile's products).
    rows: gl.constexpr = x.shape[0]
    cols: gl.constexpr = x.shape[1]
    a, b = gl.split(gl.reshape(x, [rows, cols // 2, 2]))
    return gl.reshape(gl.join(gl.exp2(a), _exp2_fma(b)), [rows, cols])


@gluon.jit
def _softmax_tile(s, m, d, keys, limit, kept, qk_scale, MASK: gl.constexpr, KEY_MASK: gl.constexpr,
                  EXP_SPLIT: gl.constexpr):
    # One tile of the online softmax: (p, m_new, d_new, alpha), alpha = exp2(m - m_new) rescales O.
    if MASK:
        visible = keys[None, :] < limit[:, None]
        if KEY_MASK:
            visible = visible & kept[None, :]
        x = gl.where(visible, s * qk_scale, -float("inf"))
        m_new = gl.maximum(m, gl.max(x, axis=1))
        m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet keeps d = 0
        p = gl.exp2(x - m_safe[:, None])
    else:
        m_new = gl.maximum(m, gl.max(s, axis=1) * qk_scale)
        m_safe = m_new
        if EXP_SPLIT:  # unmasked tiles only: every x here is finite and at most 0
            p = gl.convert_layout(_exp2_split(s * qk_scale - m_safe[:, None]), s.type.layout)
        else:
            p = gl.exp2(s * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m - m_safe)
    d = d * alpha + gl.sum(p, axis=1)
    return p, m_new, d, alpha


@gluon.jit
def _take_turn(turn, i, WG: gl.constexpr, PINGPONG: gl.constexpr):
    # PINGPONG: the two consumers issue their tensor-core work in turns (0, 1, 0, 1, ...), so one's
    # exponentials run while the other's products occupy the tensor cores. Issue i of consumer WG waits for
    # the other's issue before it (consumer 0's first passes: barriers start with phase 1 complete).
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (i & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG))


@gluon.jit
def _consume_tiles(o, p_prev, m, d, q_view, k_smem, v_smem, k_ready, k_free, v_ready, v_free, turn, mask_base, limit,
                   base, lo, hi, seq_k, stride_mk, qk_scale, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                   STAGES: gl.constexpr, MASK: gl.constexpr, KEY_MASK: gl.constexpr, s_layout: gl.constexpr,
                   o_layout: gl.constexpr, p_layout: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr,
                   EXP_SPLIT: gl.constexpr):
    # Key tiles [lo, hi), lo >= 1: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued back to back; the softmax of
    # S_j runs while the second product is in flight. Tile j sits in ring position base + j.
    wg_m: gl.constexpr = q_view.shape[0]
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(lo, hi):
        c = base + j
        slot = c % STAGES
        prev = (c - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
        k_t = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        mbarrier.wait(v_ready.index(prev), ((c - 1) // STAGES) & 1)
        _take_turn(turn, j, WG, PINGPONG)
        s_acc = warpgroup_mma(q_view, k_t, gl.zeros([wg_m, BLOCK_N], gl.float32, s_layout),
                              use_acc=False, is_async=True)
        o_acc = warpgroup_mma(p_prev, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), o, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        s = warpgroup_mma_wait(1, deps=(s_acc, ))
        mbarrier.arrive(k_free.index(slot))
        keys = j * BLOCK_N + cols
        kept = keys < seq_k
        if KEY_MASK:
            kept = gl.load(mask_base + keys.to(gl.int64) * stride_mk, mask=kept, other=0) != 0
        p, m, d, alpha = _softmax_tile(s, m, d, keys, limit, kept, qk_scale, MASK, KEY_MASK, EXP_SPLIT)
        # p_prev is the product's register operand: it stays live (untouched) until the product is done.
        o, p_prev = warpgroup_mma_wait(0, deps=(o_acc, p_prev))
        mbarrier.arrive(v_free.index(prev))
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_prev = gl.convert_layout(p.to(q_view.dtype), p_layout)
    return o, p_prev, m, d


@gluon.jit
def _consumer(tile_smem, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr, mask_ptr,
              seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os, stride_mb,
              stride_mk, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, PINGPONG: gl.constexpr, Q_BUFFERS: gl.constexpr,
              EXP_SPLIT: gl.constexpr, ON_DEMAND: gl.constexpr):
    # Warpgroup WG's 64 queries of each query tile the program takes, against every key tile they may see;
    # writes their O rows and lse. c: key tiles consumed so far (the loader's ring position).
    wg_m: gl.constexpr = q_smem.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    # O leaves in rows of eight consecutive elements a thread (16-byte stores), not in the accumulator's pairs
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM, HEAD_DIM // 8], [4, 1], [1, 0])
    # ON_DEMAND: the tile's index comes with its Q (the loader writes it beside the buffer), so the consumers
    # wait for each Q before they know the tile.
    tile_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    causal_offset = seq_k - seq_q
    total = n_blocks_m * n_bh
    c = 0
    i = 0
    if ON_DEMAND:
        mbarrier.wait(q_bar.index(0), 0)
        t = gl.max(tile_smem.index(0).load(tile_layout), axis=0)
    else:
        t = gl.program_id(0)
    while t < total:
        b, h, bh, start_m, n_tiles = _query_tile(t, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N, 2 * wg_m, CAUSAL)
        row0 = start_m + WG * wg_m
        rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, s_layout))
        # Row i sees keys j < limit_i; tiles below n_full are seen whole by every row of the warpgroup.
        if CAUSAL:
            limit = gl.minimum(rows + (causal_offset + 1), seq_k)
            n_full = gl.minimum(gl.maximum(row0 + causal_offset + 1, 0), seq_k) // BLOCK_N
        else:
            limit = gl.full([wg_m], seq_k, gl.int32, gl.SliceLayout(1, s_layout))
            n_full = seq_k // BLOCK_N
        if KEY_MASK:
            n_full = 0
        mask_base = mask_ptr
        if KEY_MASK:
            mask_base += b.to(gl.int64) * stride_mb
        m = gl.full([wg_m], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
        d = gl.zeros([wg_m], gl.float32, gl.SliceLayout(1, s_layout))

        # Tile 0, always through the masked softmax: S_0 alone, then its P waits for the loop's first V product.
        qb = i % Q_BUFFERS
        q_view = q_smem.index(2 * qb + WG).reshape([wg_m, HEAD_DIM])
        if not ON_DEMAND:
            mbarrier.wait(q_bar.index(qb), (i // Q_BUFFERS) & 1)
        mbarrier.wait(k_ready.index(c % STAGES), (c // STAGES) & 1)
        k_t = k_smem.index(c % STAGES).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        _take_turn(turn, 0, WG, PINGPONG)
        s_acc = warpgroup_mma(q_view, k_t, gl.zeros([wg_m, BLOCK_N], gl.float32, s_layout), use_acc=False,
                              is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s_acc, ))
        mbarrier.arrive(k_free.index(c % STAGES))
        keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        kept = keys < seq_k
        if KEY_MASK:
            kept = gl.load(mask_base + keys.to(gl.int64) * stride_mk, mask=kept, other=0) != 0
        p, m, d, alpha = _softmax_tile(s, m, d, keys, limit, kept, qk_scale, True, KEY_MASK, False)
        p_prev = gl.convert_layout(p.to(q_view.dtype), p_layout)
        o = gl.zeros([wg_m, HEAD_DIM], gl.float32, o_layout)

        mid = gl.maximum(n_full, 1)
        o, p_prev, m, d = _consume_tiles(o, p_prev, m, d, q_view, k_smem, v_smem, k_ready, k_free, v_ready, v_free,
                                         turn, mask_base, limit, c, 1, mid, seq_k, stride_mk, qk_scale, BLOCK_N,
                                         HEAD_DIM, STAGES, False, KEY_MASK, s_layout, o_layout, p_layout, WG,
                                         PINGPONG, EXP_SPLIT)
        o, p_prev, m, d = _consume_tiles(o, p_prev, m, d, q_view, k_smem, v_smem, k_ready, k_free, v_ready, v_free,
                                         turn, mask_base, limit, c, mid, n_tiles, seq_k, stride_mk, qk_scale,
                                         BLOCK_N, HEAD_DIM, STAGES, True, KEY_MASK, s_layout, o_layout, p_layout, WG,
                                         PINGPONG, False)
        # Every score product of this tile is done: the loader may bring the next tile's Q.
        mbarrier.arrive(q_free.index(qb))
        # The last tile's value product.
        last = c + n_tiles - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        _take_turn(turn, n_tiles, WG, PINGPONG)
        o_acc = warpgroup_mma(p_prev, v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM]), o, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        o, p_prev = warpgroup_mma_wait(0, deps=(o_acc, p_prev))
        mbarrier.arrive(v_free.index(last % STAGES))

        # A row that saw no key has d = 0: O = 0 and lse = -inf.
        empty = d == 0.0
        d_safe = gl.where(empty, 1.0, d)
        lse = gl.where(empty, -float("inf"), (m + gl.log2(d_safe)) * _LN2)
        gl.store(lse_ptr + bh.to(gl.int64) * seq_q + rows, lse, mask=rows < seq_q)
        o = o / gl.convert_layout(d_safe, gl.SliceLayout(1, o_layout))[:, None]
        o_rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, store_layout))
        o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
        o_base = o_ptr + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
        offs = o_rows.to(gl.int64)[:, None] * stride_os + o_cols[None, :]
        gl.store(o_base + offs, gl.convert_layout(o.to(o_ptr.dtype.element_ty), store_layout),
                 mask=(o_rows < seq_q)[:, None])
        c += n_tiles
        i += 1
        if ON_DEMAND:
            mbarrier.wait(q_bar.index(i % Q_BUFFERS), (i // Q_BUFFERS) & 1)
            t = gl.max(tile_smem.index(i % Q_BUFFERS).load(tile_layout), axis=0)
        else:
            t += gl.num_programs(0)


@gluon.jit
def _consumer_1(tile_smem, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr,
                mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os,
                stride_mb, stride_mk, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, PINGPONG: gl.constexpr, Q_BUFFERS: gl.constexpr,
                EXP_SPLIT: gl.constexpr, ON_DEMAND: gl.constexpr):
    _consumer(tile_smem, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr, mask_ptr,
              seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os, stride_mb,
              stride_mk, 1, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, KEY_MASK, PINGPONG, Q_BUFFERS, EXP_SPLIT, ON_DEMAND)


@gluon.jit
def _attention_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, mask_ptr, seq_q, seq_k, n_heads, group,
                                n_bh, qk_scale, stride_ob, stride_oh, stride_os, stride_mb, stride_mk, counter_ptr,
                                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, PINGPONG: gl.constexpr,
                                PERSISTENT: gl.constexpr, EXP_SPLIT: gl.constexpr, ON_DEMAND: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    # Query tiles of 2 x 64 queries of one (batch, head): tile pid alone, or tiles pid, pid + grid, ..., or,
    # ON_DEMAND, whichever tile the int32 at counter_ptr (zero at launch) hands out next, in the order of the
    # tile indices (_query_tile orders them). counter_ptr is read only ON_DEMAND.
    wg_m: gl.constexpr = q_desc.block_type.shape[2]
    n_blocks_m = gl.cdiv(seq_q, 2 * wg_m)
    # A persistent program double-buffers its Q tile: the next tile's Q lands while this one's is in use.
    Q_BUFFERS: gl.constexpr = 2 if PERSISTENT else 1
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2 * Q_BUFFERS] + q_desc.block_type.shape, q_desc.layout)
    tile_smem = gl.allocate_shared_memory(gl.int32, [Q_BUFFERS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_free.index(i), count=2)  # both consumers are done with the Q tile
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)  # both consumers free a slot
        mbarrier.init(v_free.index(i), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (tile_smem, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr,
                     mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os,
                     stride_mb, stride_mk, 0, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, KEY_MASK, PINGPONG, Q_BUFFERS,
                     EXP_SPLIT, ON_DEMAND)),
        (_consumer_1, (tile_smem, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr,
                       mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os,
                       stride_mb, stride_mk, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, KEY_MASK, PINGPONG, Q_BUFFERS,
                       EXP_SPLIT, ON_DEMAND)),
        (_loader, (tile_smem, counter_ptr, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, k_ready,
                   k_free, v_ready, v_free, seq_q, seq_k, n_heads, group, n_blocks_m, n_bh, BLOCK_N, STAGES, CAUSAL,
                   Q_BUFFERS, ON_DEMAND)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# --------------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------------

def check_tiles(head_dim: int, block_n: int, programs_per_sm: int) -> None:
    """ValueError unless the kernel runs (keys a tile, programs an SM) at this head dim: 128-key tiles one
    program an SM at either head dim, or at head dim 64 64-key tiles one or two programs an SM."""
    if (block_n, programs_per_sm) != (BLOCK_N, 1) and not (head_dim == 64 and block_n == 64
                                                           and programs_per_sm in REGISTERS):
        raise ValueError(f"attention: the Gluon forward runs 128-key tiles one program an SM, or at head dim 64 "
                         f"64-key tiles one or two programs an SM; got {block_n}-key tiles, {programs_per_sm} "
                         f"program(s) an SM at head dim {head_dim}.")


def launch_args(q, k, v, o, lse, causal: bool, scale: float, stages: int, key_mask=None, pingpong: bool = False,
                persistent_programs: int | None = None, exp_split: bool = False, prefetch_q: bool = True,
                counter=None, block_n: int = BLOCK_N, programs_per_sm: int = 1) -> tuple:
    """(grid, positional args, meta) of one launch; the tensors may live on the 'meta' device (shapes and
    strides only), which is how the CPU compiles the kernel for sm_90 without a GPU. persistent_programs:
    None, one program a query tile; else at most that many programs, each taking every grid-th tile, or, with a
    counter (one int32, zero, on q's device), the tile the counter hands out next; a second Q buffer unless
    prefetch_q is False (the kernel's PERSISTENT flag chooses the buffers alone). block_n keys a tile, with the
    registers of programs_per_sm programs an SM (check_tiles says which pairs run; launch with maxnreg
    REGISTERS[programs_per_sm][2])."""
    if counter is not None and persistent_programs is None:
        raise ValueError("attention: tiles handed out by a counter need the persistent grid.")
    batch, n_heads, seq_q, head_dim = q.shape
    check_tiles(head_dim, block_n, programs_per_sm)
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    mask, stride_mb, stride_mk = key_mask_args(key_mask)
    consumer_regs, loader_regs, _ = REGISTERS[programs_per_sm]
    args = (descriptor(q, WARPGROUP_M), descriptor(k, block_n), descriptor(v, block_n), o, lse, mask, seq_q, seq_k,
            n_heads, n_heads // n_kv_heads, batch * n_heads, scale * LOG2E, o.stride(0), o.stride(1), o.stride(2),
            stride_mb, stride_mk, lse if counter is None else counter)  # lse: a pointer the kernel never reads
    meta = dict(HEAD_DIM=head_dim, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, KEY_MASK=key_mask is not None,
                PINGPONG=pingpong, PERSISTENT=persistent_programs is not None and prefetch_q, EXP_SPLIT=exp_split,
                ON_DEMAND=counter is not None, CONSUMER_REGS=consumer_regs, LOADER_REGS=loader_regs)
    tiles = triton.cdiv(seq_q, BLOCK_M) * batch * n_heads
    grid = (tiles if persistent_programs is None else max(1, min(tiles, persistent_programs)),)
    return grid, args, meta


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def attention_fwd_gluon(q, k, v, o, lse, causal: bool, scale: float, stages: int, key_mask=None,
                        pingpong: bool = False, persistent: bool = False, exp_split: bool = False,
                        prefetch_q: bool = True, on_demand: bool = False, block_n: int = BLOCK_N,
                        programs_per_sm: int = 1) -> None:
    """Writes O into o and lse (fp32, natural log) into lse; q, k, v (batch, heads, seq, head_dim) with
    16-byte aligned bases and strides and a unit last stride; seq_q, seq_k >= 1 (the caller handles empty
    shapes). persistent: programs_per_sm programs an SM (what their registers allow), each walking query tiles,
    the next tile's Q in a second buffer unless prefetch_q is False; on_demand (persistent only): each program
    takes the next tile from a counter, zeroed for this launch alone (a launch of its own, so launches on other
    streams or in CUDA graphs never share one). block_n: keys a tile (check_tiles)."""
    if on_demand and not persistent:
        raise ValueError("attention: on_demand hands tiles out on the persistent grid; it needs persistent=True.")
    check_tiles(q.shape[-1], block_n, programs_per_sm)
    programs = programs_per_sm * _sm_count(q.device.index if q.device.index is not None
                                           else torch.cuda.current_device()) if persistent else None
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if on_demand else None
    grid, args, meta = launch_args(q, k, v, o, lse, causal, scale, stages, key_mask, pingpong, programs, exp_split,
                                   prefetch_q, counter, block_n, programs_per_sm)
    _attention_fwd_gluon_kernel[grid](*args, **meta, num_warps=NUM_WARPS, maxnreg=REGISTERS[programs_per_sm][2])


def compile_for_sm90(head_dim: int, dtype: torch.dtype, causal: bool, key_mask: bool, stages: int,
                     pingpong: bool = False, persistent: bool = False, exp_split: bool = False,
                     prefetch_q: bool = True, on_demand: bool = False, block_n: int = BLOCK_N,
                     programs_per_sm: int = 1):
    """The kernel compiled for sm_90 from shapes alone (no GPU: the CPU can check it builds, its registers
    and its shared memory)."""
    q = torch.empty(2, 4, 1000, head_dim, dtype=dtype, device="meta")
    lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    mask = torch.empty(2, 1000, dtype=torch.bool, device="meta") if key_mask else None
    counter = torch.empty(1, dtype=torch.int32, device="meta") if on_demand else None
    _, args, meta = launch_args(q, q, q, torch.empty_like(q), lse, causal, 0.125, stages, mask, pingpong,
                                132 * programs_per_sm if persistent or on_demand else None, exp_split, prefetch_q,
                                counter, block_n, programs_per_sm)
    return compile_kernel_for_sm90(_attention_fwd_gluon_kernel, args, meta, NUM_WARPS, REGISTERS[programs_per_sm][2])
