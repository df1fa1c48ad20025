"""The attention backward's dQ for Hopper (sm_90) in Gluon: the same maths and results as
kernels/attention_kernels.py's _attention_bwd_q_kernel, scheduled by hand.

For each key tile j a query block sees:

    S = Q K_j^T,   P = exp2(S c log2 e - lse log2 e),   dP = dO V_j^T,   dS = P (dP - delta),   dQ += dS K_j

and dQ is scaled by c at the end. One program holds 2 x 64 queries of one (batch, head) with their dO rows, lse
and delta, and walks the key tiles (64 keys each) that its rows may see. Warps in three partitions, as the
dK/dV kernel (kernels/attention_bwd_gluon.py): a loader warp copies Q and dO once, then K_j and V_j into a
ring of STAGES slots; two consumer warpgroups, one a 64-query half, issue S and dP together on the tensor
cores, compute P while dP is in flight, then dS and dQ += dS K_j with dS as the register operand.

Here the rows are queries, so lse and delta are per-row values (two a thread), and the accumulators are dQ
(64 x D fp32) and the two 64 x 64 score tiles. Which pairs count is the Triton kernel's rule (keys below seq_k,
the causal limit, the key mask); a row that sees no key has lse = -inf and the masks hide each of its pairs, so
its dQ is 0; rows past seq_q take lse = +inf and are not stored. Without a key mask only the key tiles that hold
a hidden pair take the comparisons and the select: the last one when it runs past seq_k, and under CAUSAL those
that cross the diagonal (round attention-bwd-masks in the lab notebook). dQ leaves converted to rows of eight
elements a thread (16-byte stores), as dK, dV and the forward's O do.
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

WARPGROUP_M = 64  # queries a consumer warpgroup holds
BLOCK_M = 2 * WARPGROUP_M  # queries a program holds
BLOCK_N = 64  # keys a tile
STAGES = 2  # ring slots of (K_j, V_j)
CONSUMER_REGS, LOADER_REGS, MAXNREG = 240, 24, 168
NUM_WARPS = 4  # the default partition (consumer 0); the workers add 4 + 1


@gluon.jit
def _block(seq_q, seq_k, n_heads, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    # (b, h, bh, first query, key tiles the block's rows may see); causal blocks with the most keys first.
    n_blocks_m = gl.cdiv(seq_q, BLOCK_M)
    bh = gl.program_id(0) // n_blocks_m
    pid_m = gl.program_id(0) % n_blocks_m
    if CAUSAL:
        pid_m = n_blocks_m - 1 - pid_m
    start_m = pid_m * BLOCK_M
    if CAUSAL:
        hi = gl.maximum(gl.minimum(seq_k, start_m + BLOCK_M + seq_k - seq_q), 0)
    else:
        hi = seq_k
    return bh // n_heads, bh % n_heads, bh, start_m, gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _dq_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, seq_q, seq_k,
               n_heads, group, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    wg_m: gl.constexpr = q_desc.block_type.shape[2]
    block_n: gl.constexpr = k_desc.block_type.shape[2]
    b, h, bh, start_m, n_tiles = _block(seq_q, seq_k, n_heads, CAUSAL, 2 * wg_m, block_n)
    h_kv = h // group
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * wg_m, 0], q_bar, q_smem.index(w))
        tma.async_copy_global_to_shared(do_desc, [b, h, start_m + w * wg_m, 0], q_bar, do_smem.index(w))
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(free.index(slot), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, h_kv, j * block_n, 0], ready.index(slot), k_smem.index(slot))
        tma.async_copy_global_to_shared(v_desc, [b, h_kv, j * block_n, 0], ready.index(slot), v_smem.index(slot))


@gluon.jit
def _dq_consumer(q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, lse_ptr, delta_ptr, dq_ptr, mask_ptr, seq_q,
                 seq_k, n_heads, qk_scale, scale, stride_dqb, stride_dqh, stride_dqs, stride_mb, stride_mk,
                 WG: gl.constexpr, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr,
                 STAGES: gl.constexpr):
    wg_m: gl.constexpr = q_smem.shape[3]
    block_n: gl.constexpr = k_smem.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, block_n, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM, HEAD_DIM // 8], [4, 1], [1, 0])
    b, h, bh, start_m, n_tiles = _block(seq_q, seq_k, n_heads, CAUSAL, 2 * wg_m, block_n)
    rows = start_m + WG * wg_m + gl.arange(0, wg_m, layout=gl.SliceLayout(1, s_layout))
    row_in = rows < seq_q
    lse2 = gl.load(lse_ptr + bh.to(gl.int64) * seq_q + rows, mask=row_in, other=float("inf")) * _LOG2E
    delta = gl.load(delta_ptr + bh.to(gl.int64) * seq_q + rows, mask=row_in, other=0.0)
    cols = gl.arange(0, block_n, layout=gl.SliceLayout(0, s_layout))
    limit = rows + (seq_k - seq_q)  # under CAUSAL, row i sees keys j <= limit_i
    mask_base = mask_ptr
    if KEY_MASK:
        mask_base += b.to(gl.int64) * stride_mb
    q_view = q_smem.index(WG).reshape([wg_m, HEAD_DIM])
    do_view = do_smem.index(WG).reshape([wg_m, HEAD_DIM])
    dq = gl.zeros([wg_m, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(q_bar, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
        k_tile = k_smem.index(slot).reshape([block_n, HEAD_DIM])
        v_tile = v_smem.index(slot).reshape([block_n, HEAD_DIM])
        s_acc = warpgroup_mma(q_view, k_tile.permute((1, 0)), gl.zeros([wg_m, block_n], gl.float32, s_layout),
                              use_acc=False, is_async=True)
        dp_acc = warpgroup_mma(do_view, v_tile.permute((1, 0)), gl.zeros([wg_m, block_n], gl.float32, s_layout),
                               use_acc=False, is_async=True)
        keys = j * block_n + cols
        if KEY_MASK:
            visible = gl.load(mask_base + keys.to(gl.int64) * stride_mk, mask=keys < seq_k, other=0) != 0
        s = warpgroup_mma_wait(1, deps=(s_acc, ))
        p = gl.exp2(s * qk_scale - lse2[:, None])
        if KEY_MASK:
            seen = visible[None, :]
            if CAUSAL:  # rows that see no key have lse = -inf and p = inf here; the masks take them out
                seen = seen & (keys[None, :] <= limit[:, None])
            p = gl.where(seen, p, 0.0)
        else:
            # Only the last key tile (keys past seq_k) and, causal, the tiles whose last key lies past the
            # warpgroup's first row's limit are masked; rows that see no key lie in such tiles alone.
            crosses = j * block_n + block_n > seq_k
            if CAUSAL:
                crosses = crosses | (j * block_n + block_n - 1 > start_m + WG * wg_m + (seq_k - seq_q))
            if crosses:
                seen = (keys < seq_k)[None, :]
                if CAUSAL:
                    seen = seen & (keys[None, :] <= limit[:, None])
                p = gl.where(seen, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp_acc, ))
        ds = gl.convert_layout((p * (dp - delta[:, None])).to(q_smem.dtype), op_layout)
        dq_acc = warpgroup_mma(ds, k_tile, dq, is_async=True)
        dq, ds = warpgroup_mma_wait(0, deps=(dq_acc, ds))
        mbarrier.arrive(free.index(slot))

    o_rows = start_m + WG * wg_m + gl.arange(0, wg_m, layout=gl.SliceLayout(1, store_layout))
    d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
    dq_base = dq_ptr + b.to(gl.int64) * stride_dqb + h.to(gl.int64) * stride_dqh
    gl.store(dq_base + o_rows.to(gl.int64)[:, None] * stride_dqs + d_cols[None, :],
             gl.convert_layout((dq * scale).to(dq_ptr.dtype.element_ty), store_layout),
             mask=(o_rows < seq_q)[:, None])


@gluon.jit
def _dq_consumer_1(q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, lse_ptr, delta_ptr, dq_ptr, mask_ptr, seq_q,
                   seq_k, n_heads, qk_scale, scale, stride_dqb, stride_dqh, stride_dqs, stride_mb, stride_mk,
                   HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, STAGES: gl.constexpr):
    _dq_consumer(q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, lse_ptr, delta_ptr, dq_ptr, mask_ptr, seq_q,
                 seq_k, n_heads, qk_scale, scale, stride_dqb, stride_dqh, stride_dqs, stride_mb, stride_mk, 1,
                 HEAD_DIM, CAUSAL, KEY_MASK, STAGES)


@gluon.jit
def _attention_bwd_q_gluon_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dq_ptr, mask_ptr, seq_q, seq_k,
                                  n_heads, group, qk_scale, scale, stride_dqb, stride_dqh, stride_dqs, stride_mb,
                                  stride_mk, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr,
                                  STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)  # both consumers are done with the slot
    fence_async_shared()
    gl.warp_specialize([
        (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, lse_ptr, delta_ptr, dq_ptr, mask_ptr,
                        seq_q, seq_k, n_heads, qk_scale, scale, stride_dqb, stride_dqh, stride_dqs, stride_mb,
                        stride_mk, 0, HEAD_DIM, CAUSAL, KEY_MASK, STAGES)),
        (_dq_consumer_1, (q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, lse_ptr, delta_ptr, dq_ptr, mask_ptr,
                          seq_q, seq_k, n_heads, qk_scale, scale, stride_dqb, stride_dqh, stride_dqs, stride_mb,
                          stride_mk, HEAD_DIM, CAUSAL, KEY_MASK, STAGES)),
        (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, free, seq_q,
                      seq_k, n_heads, group, CAUSAL, STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def launch_args(q, k, v, do, lse, delta, dq, causal: bool, scale: float, key_mask=None, stages: int = STAGES) -> tuple:
    """(grid, positional args, meta) of one launch; tensors may live on the 'meta' device (shapes only)."""
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    mask, stride_mb, stride_mk = key_mask_args(key_mask)
    args = (descriptor(q, WARPGROUP_M), descriptor(do, WARPGROUP_M), descriptor(k, BLOCK_N), descriptor(v, BLOCK_N),
            lse, delta, dq, mask, seq_q, seq_k, n_heads, n_heads // n_kv_heads, scale * LOG2E, scale, dq.stride(0),
            dq.stride(1), dq.stride(2), stride_mb, stride_mk)
    meta = dict(HEAD_DIM=head_dim, CAUSAL=causal, KEY_MASK=key_mask is not None, STAGES=stages,
                CONSUMER_REGS=CONSUMER_REGS, LOADER_REGS=LOADER_REGS)
    return (triton.cdiv(seq_q, BLOCK_M) * batch * n_heads,), args, meta


def attention_bwd_q_gluon(q, k, v, do, lse, delta, dq, causal: bool, scale: float, key_mask=None,
                          stages: int = STAGES) -> None:
    """Writes dQ; q, k, v, do fit tensor descriptors; lse and delta contiguous fp32 [batch, heads, seq_q]; dq
    with a unit last stride; seq_q, seq_k >= 1."""
    grid, args, meta = launch_args(q, k, v, do, lse, delta, dq, causal, scale, key_mask, stages)
    _attention_bwd_q_gluon_kernel[grid](*args, **meta, num_warps=NUM_WARPS, maxnreg=MAXNREG)


def compile_for_sm90(head_dim: int, dtype: torch.dtype, causal: bool, key_mask: bool, stages: int = STAGES):
    """The kernel compiled for sm_90 from shapes alone (no GPU needed)."""
    q = torch.empty(2, 4, 1000, head_dim, dtype=dtype, device="meta")
    k = torch.empty(2, 2, 1000, head_dim, dtype=dtype, device="meta")
    lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    mask = torch.empty(2, 1000, dtype=torch.bool, device="meta") if key_mask else None
    _, args, meta = launch_args(q, k, k, q, lse, lse, torch.empty_like(q), causal, 0.125, mask, stages)
    return compile_kernel_for_sm90(_attention_bwd_q_gluon_kernel, args, meta, NUM_WARPS, MAXNREG)
