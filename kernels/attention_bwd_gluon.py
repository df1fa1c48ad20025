"""The attention backward's dK and dV for Hopper (sm_90) in Gluon: the same maths and results as
kernels/attention_kernels.py's _attention_bwd_kv_kernel, scheduled by hand.

In the transposed frame (keys along rows), for each query tile i a key block sees:

    S^T = K Q_i^T,   P^T = exp2(S^T c log2 e - lse_i log2 e),   dV += P^T dO_i,
    dP^T = V dO_i^T,   dS^T = P^T (dP^T - delta_i),   dK += dS^T Q_i        (dK is scaled by c at the end)

with delta = rowsum(dO * O) from the delta pass. One program holds BLOCK_N = 128 keys of one (batch, key/value
head) and walks the query tiles of every query head of its group that may see them. Its warps are split into
three partitions (gl.warp_specialize):

* a loader (1 warp): copies the program's K and V once (two 64-key halves each), then each query tile's Q_i
  and dO_i through tensor descriptors (TMA) into a ring of STAGES shared-memory slots, one mbarrier "ready"
  and one "free" a slot;
* two consumer warpgroups (4 warps each), one a 64-key half: each issues S^T and dP^T on the tensor cores
  (asynchronous warpgroup MMAs, both operands in shared memory), computes P^T while dP^T is in flight, issues
  dV += P^T dO_i with P^T as the register operand, then dS^T and dK += dS^T Q_i the same way, and frees the
  slot once both products are done.

Which (query, key) pairs count is the Triton kernel's rule: keys below seq_k, under CAUSAL those with
j <= i + (seq_k - seq_q), under KEY_MASK those whose mask byte is set. Queries past seq_q come in as zeros and
take lse = +inf (P = 0); keys past seq_k come in as zeros and their rows are not stored. A row that saw no key
has lse = -inf: the causal mask or the key mask hides every pair of it, so it adds nothing. Under CAUSAL alone
only the query tiles that cross the diagonal (the first one or two a warpgroup walks) take the comparison and
the select; every tile past them is seen whole (round attention-bwd-masks in the lab notebook).

Registers a consumer thread: dK and dV (64 x D fp32 each, 2 x 64 at D = 128), S^T and dP^T (64 x 64 fp32,
32 each) and P^T, dS^T in 16-bit. dK and dV leave through shared memory, converted from the accumulator's
layout (pairs of elements a thread, four-byte stores) to rows of eight elements a thread, in 16-byte stores, as
the forward's O does. Gluon kernels compile for the GPU only (no interpreter).
"""

from __future__ import annotations

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

_LOG2E = gl.constexpr(LOG2E)

WARPGROUP_N = 64  # keys a consumer warpgroup holds
BLOCK_N = 2 * WARPGROUP_N  # keys a program holds
BLOCK_M = 64  # queries a tile
STAGES = 2  # ring slots of (Q_i, dO_i)
# Registers a thread: consumers 240, loader 24 (the dQ kernel's split). At 224 / 40 a consumer spilled 244 bytes
# at head dim 128 (112 at 240) and the kernel ran 8-18% slower there; at head dim 64 neither spills and the two
# were within 3% (notes/attention.md, H100, 2026-11-27).
CONSUMER_REGS, LOADER_REGS, MAXNREG = 240, 24, 168
NUM_WARPS = 4  # the default partition (consumer 0); the workers add 4 + 1


@gluon.jit
def _query_range(start_n, seq_q, seq_k, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr):
    # (first query tile's row, number of tiles) that may see keys [start_n, start_n + BLOCK_N).
    if CAUSAL:
        m_lo = gl.maximum(start_n - (seq_k - seq_q), 0) // BLOCK_M * BLOCK_M
        m_lo = gl.minimum(m_lo, gl.cdiv(seq_q, BLOCK_M) * BLOCK_M)
    else:
        m_lo = 0
    return m_lo, gl.cdiv(seq_q - m_lo, BLOCK_M)


@gluon.jit
def _bwd_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free,
                seq_q, seq_k, n_kv_heads, group, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    wg_n: gl.constexpr = k_desc.block_type.shape[2]
    block_m: gl.constexpr = q_desc.block_type.shape[2]
    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)
    start_n = gl.program_id(0) % n_blocks_n * (2 * wg_n)
    bh_kv = gl.program_id(0) // n_blocks_n
    b = bh_kv // n_kv_heads
    h_kv = bh_kv % n_kv_heads
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [b, h_kv, start_n + w * wg_n, 0], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(v_desc, [b, h_kv, start_n + w * wg_n, 0], kv_bar, v_smem.index(w))
    m_lo, n_m = _query_range(start_n, seq_q, seq_k, CAUSAL, block_m)
    it = 0
    for g in range(group):
        h = h_kv * group + g
        for mi in range(n_m):
            slot = it % STAGES
            mbarrier.wait(free.index(slot), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, h, m_lo + mi * block_m, 0], ready.index(slot),
                                            q_smem.index(slot))
            tma.async_copy_global_to_shared(do_desc, [b, h, m_lo + mi * block_m, 0], ready.index(slot),
                                            do_smem.index(slot))
            it += 1


@gluon.jit
def _bwd_consumer(q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr,
                  seq_q, seq_k, n_kv_heads, group, qk_scale, scale, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                  stride_dvh, stride_dvs, stride_mb, stride_mk, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                  CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, STAGES: gl.constexpr):
    # Warpgroup WG's 64 keys against every query tile that may see them; writes their dK and dV rows.
    wg_n: gl.constexpr = k_smem.shape[3]
    block_m: gl.constexpr = q_smem.shape[3]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, block_m, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM, HEAD_DIM // 8], [4, 1], [1, 0])
    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)
    start_n = gl.program_id(0) % n_blocks_n * (2 * wg_n)
    bh_kv = gl.program_id(0) // n_blocks_n
    b = bh_kv // n_kv_heads
    h_kv = bh_kv % n_kv_heads
    keys = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, st_layout))
    kept = keys < seq_k
    if KEY_MASK:
        kept = gl.load(mask_ptr + b.to(gl.int64) * stride_mb + keys.to(gl.int64) * stride_mk, mask=kept,
                       other=0) != 0
    cols = gl.arange(0, block_m, layout=gl.SliceLayout(0, st_layout))
    causal_offset = seq_k - seq_q
    m_lo, n_m = _query_range(start_n, seq_q, seq_k, CAUSAL, block_m)
    dk = gl.zeros([wg_n, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([wg_n, HEAD_DIM], gl.float32, acc_layout)
    k_view = k_smem.index(WG).reshape([wg_n, HEAD_DIM])
    v_view = v_smem.index(WG).reshape([wg_n, HEAD_DIM])
    mbarrier.wait(kv_bar, 0)
    it = 0
    for g in range(group):
        bh = (b * n_kv_heads + h_kv) * group + g
        for mi in range(n_m):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            q_tile = q_smem.index(slot).reshape([block_m, HEAD_DIM])
            do_tile = do_smem.index(slot).reshape([block_m, HEAD_DIM])
            st_acc = warpgroup_mma(k_view, q_tile.permute((1, 0)), gl.zeros([wg_n, block_m], gl.float32, st_layout),
                                   use_acc=False, is_async=True)
            dpt_acc = warpgroup_mma(v_view, do_tile.permute((1, 0)),
                                    gl.zeros([wg_n, block_m], gl.float32, st_layout), use_acc=False, is_async=True)
            rows = m_lo + mi * block_m + cols
            base = bh.to(gl.int64) * seq_q
            lse2 = gl.load(lse_ptr + base + rows, mask=rows < seq_q, other=float("inf")) * _LOG2E
            s_t = warpgroup_mma_wait(1, deps=(st_acc, ))
            p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
            # Only a tile whose first query sees fewer keys than the warpgroup's last key needs is masked; rows
            # that see no key (lse = -inf, p = inf) lie in such tiles alone.
            if CAUSAL:
                if m_lo + mi * block_m + causal_offset < start_n + WG * wg_n + wg_n - 1:
                    p_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)
            if KEY_MASK:
                p_t = gl.where(kept[:, None], p_t, 0.0)
            p_op = gl.convert_layout(p_t.to(q_smem.dtype), op_layout)
            dv_acc = warpgroup_mma(p_op, do_tile, dv, is_async=True)
            # delta is read only now, so that it is not held beside S^T and P^T.
            delta = gl.load(delta_ptr + base + rows, mask=rows < seq_q, other=0.0)
            dp_t = warpgroup_mma_wait(1, deps=(dpt_acc, ))
            ds_t = p_t * (dp_t - delta[None, :])
            ds_op = gl.convert_layout(ds_t.to(q_smem.dtype), op_layout)
            dk_acc = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
            dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc, p_op, ds_op))
            mbarrier.arrive(free.index(slot))
            it += 1

    rows_n = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, store_layout))
    d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
    keep = (rows_n < seq_k)[:, None]
    dk_base = dk_ptr + b.to(gl.int64) * stride_dkb + h_kv.to(gl.int64) * stride_dkh
    gl.store(dk_base + rows_n.to(gl.int64)[:, None] * stride_dks + d_cols[None, :],
             gl.convert_layout((dk * scale).to(dk_ptr.dtype.element_ty), store_layout), mask=keep)
    dv_base = dv_ptr + b.to(gl.int64) * stride_dvb + h_kv.to(gl.int64) * stride_dvh
    gl.store(dv_base + rows_n.to(gl.int64)[:, None] * stride_dvs + d_cols[None, :],
             gl.convert_layout(dv.to(dv_ptr.dtype.element_ty), store_layout), mask=keep)


@gluon.jit
def _bwd_consumer_1(q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                    mask_ptr, seq_q, seq_k, n_kv_heads, group, qk_scale, scale, stride_dkb, stride_dkh, stride_dks,
                    stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, HEAD_DIM: gl.constexpr,
                    CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, STAGES: gl.constexpr):
    _bwd_consumer(q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr,
                  seq_q, seq_k, n_kv_heads, group, qk_scale, scale, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                  stride_dvh, stride_dvs, stride_mb, stride_mk, 1, HEAD_DIM, CAUSAL, KEY_MASK, STAGES)


@gluon.jit
def _attention_bwd_kv_gluon_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr,
                                   seq_q, seq_k, n_kv_heads, group, qk_scale, scale, stride_dkb, stride_dkh,
                                   stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk,
                                   HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr,
                                   STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)  # both consumers are done with the slot
    fence_async_shared()
    gl.warp_specialize([
        (_bwd_consumer, (q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                         mask_ptr, seq_q, seq_k, n_kv_heads, group, qk_scale, scale, stride_dkb, stride_dkh,
                         stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, 0, HEAD_DIM, CAUSAL,
                         KEY_MASK, STAGES)),
        (_bwd_consumer_1, (q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                           mask_ptr, seq_q, seq_k, n_kv_heads, group, qk_scale, scale, stride_dkb, stride_dkh,
                           stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, HEAD_DIM, CAUSAL,
                           KEY_MASK, STAGES)),
        (_bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free, seq_q,
                       seq_k, n_kv_heads, group, CAUSAL, STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# --------------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------------

def launch_args(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, key_mask=None,
                stages: int = STAGES) -> tuple:
    """(grid, positional args, meta) of one launch; tensors may live on the 'meta' device (shapes only)."""
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    mask, stride_mb, stride_mk = key_mask_args(key_mask)
    args = (descriptor(q, BLOCK_M), descriptor(do, BLOCK_M), descriptor(k, WARPGROUP_N), descriptor(v, WARPGROUP_N),
            lse, delta, dk, dv, mask, seq_q, seq_k, n_kv_heads, n_heads // n_kv_heads, scale * LOG2E, scale,
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), stride_mb, stride_mk)
    meta = dict(HEAD_DIM=head_dim, CAUSAL=causal, KEY_MASK=key_mask is not None, STAGES=stages,
                CONSUMER_REGS=CONSUMER_REGS, LOADER_REGS=LOADER_REGS)
    grid = (triton.cdiv(seq_k, BLOCK_N) * batch * n_kv_heads,)
    return grid, args, meta


def attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, key_mask=None,
                           stages: int = STAGES) -> None:
    """Writes dK and dV; q, k, v, do (batch, heads, seq, head_dim) fit tensor descriptors (16-byte aligned
    bases and strides, unit last stride); lse and delta contiguous fp32 [batch, heads, seq_q]; dk and dv with a
    unit last stride; seq_q, seq_k >= 1."""
    grid, args, meta = launch_args(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, stages)
    _attention_bwd_kv_gluon_kernel[grid](*args, **meta, num_warps=NUM_WARPS, maxnreg=MAXNREG)


def compile_for_sm90(head_dim: int, dtype: torch.dtype, causal: bool, key_mask: bool, stages: int = STAGES):
    """The kernel compiled for sm_90 from shapes alone (no GPU needed)."""
    q = torch.empty(2, 4, 1000, head_dim, dtype=dtype, device="meta")
    k = torch.empty(2, 2, 1000, head_dim, dtype=dtype, device="meta")
    lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    mask = torch.empty(2, 1000, dtype=torch.bool, device="meta") if key_mask else None
    _, args, meta = launch_args(q, k, k, q, lse, lse, torch.empty_like(k), torch.empty_like(k), causal, 0.125, mask,
                                stages)
    return compile_kernel_for_sm90(_attention_bwd_kv_gluon_kernel, args, meta, NUM_WARPS, MAXNREG)
