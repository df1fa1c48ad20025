"""GPU probe: does a persistent dK/dV kernel that takes its key blocks on demand close the causal and grouped-query
backward's gap? (kernels/attention_bwd_gluon.py)

    python probes/attention_bwd_persistent.py --compile   (the CPU: the forms compiled for sm_90)
    python probes/attention_bwd_persistent.py OUT_DIR      (the GPU: OUT_DIR/attention_bwd_persistent.json)

The Gluon backward's dK/dV kernel runs one program a key block: it loads its block's K and V, walks the query
tiles that may see them (every query head of the group), writes dK and dV and ends, and the hardware starts the
next program on that SM cold. With the causal mask the blocks' walks differ in length, and with grouped-query heads
there are a quarter as many, four times longer (round attention-bwd-split: the dK/dV kernel 1-12% slower with 16
query heads over 4 than with heads of their own, the dQ kernel level). The Gluon forward gained 5-10% at causal
shapes from one program an SM taking its query tiles on demand (round attention-causal-dynamic).

The form ("on-demand") is the plan's dK/dV kernel on one program an SM: its loader takes the next key block from a
counter in global memory (an atomic add, zeroed for each launch), in the plan's order (key blocks of one
(batch, key/value head) in turn, longest first under the causal mask), writes its index beside the K/V buffer,
loads K and V once both consumers have freed them (right after a block's last products, before its dK and dV
are stored, so the next block's loads overlap that epilogue) and streams the block's Q and dO tiles through the
same ring, whose slots and phases run on across blocks. The consumers read the index once K and V have landed;
the first index past the last block ends them. "strided" takes blocks pid, pid + grid, ... instead, and
"on-demand-tma" writes each block's dK and then dV into a shared-memory buffer of the consumer's own and hands it
to the TMA engine (rows past the keys clipped by the descriptor), where the others store from registers. Each tile's
arithmetic is the plan's, so dK and dV must equal the plan's bit for bit (NaN-poisoned outputs) before anything is
timed. Everything but the loader, the consumers' outer loop, the kernel's barriers and the launch is the plan's
(the consumer's per-tile body is written out again here, unchanged).

Timing: the plan's dK/dV kernel and the forms alone, in twelve alternating rounds of short do_bench runs (the
medians; the L2 flushed), after the delta pass, at attention-bwd's head-dim-128 shapes (bf16, B x S = 16,384,
16 query heads over 16 or 4 key/value heads, S = 2,048 / 4,096 / 8,192 / 16,384, causal and not). GPU time. A
tuning instrument, not evidence. Written and compiled for sm_90 on the CPU; its GPU run follows. Compiled, at head
dim 128 a consumer spills 244 / 268 bytes without / with the causal mask on demand (the loop over blocks: run once
it spills 72 / 152) and 144 / 240 with the TMA stores, against the plan's 84 / 168; none at head dim 64.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels.attention_bwd_gluon as KV  # noqa: E402
from kernels._gluon_host import LOG2E, compile_kernel_for_sm90, descriptor, key_mask_args  # noqa: E402
from kernels.attention import (  # noqa: E402
    _DELTA_BLOCK_M,
    _DELTA_WARPS,
    _attention_bwd_delta_kernel,
    _strides,
    attention_fwd,
    plan_attention_backward,
)
from kernels.attention_bwd_gluon import _query_range  # noqa: E402
from probes.attention_forms import ALTERNATING_CLOCK, alternating_rounds, draw_inputs  # noqa: E402
from probes.harness import add_row, environment, write_output  # noqa: E402

QUESTION = ("Does a persistent dK/dV kernel that takes its key blocks on demand close the causal and grouped-query "
            "backward's gap?")
CANDIDATES = ("the plan's dK/dV kernel (kernels/attention_bwd_gluon.py): one program a key block",
              "on-demand: one program an SM, key blocks from a counter, the next block's K and V loading under the "
              "last one's dK/dV stores",
              "strided: one program an SM, key blocks pid, pid + grid, ...",
              "on-demand-tma: on-demand, with dK and dV leaving through shared memory by TMA")
SHAPES = ("checks: head dim 128 and 64, bf16, causal and not, ragged lengths, more keys than queries and the "
          "reverse, grouped-query heads, a key mask; timed: head dim 128, bf16, B x S = 16,384, 16 query heads over "
          "16 or 4 key/value heads, S = 2,048 / 4,096 / 8,192 / 16,384, causal and not")
OUTPUTS = {}

_LOG2E = gl.constexpr(LOG2E)
ROUNDS = 12
# (batch, heads, kv heads, seq_q, seq_k, head dim, causal, key mask)
CHECKS = ((2, 4, 4, 1000, 1500, 128, False, False), (2, 4, 4, 1000, 1500, 128, True, False),
          (3, 4, 4, 1500, 900, 128, True, False), (1, 8, 2, 777, 777, 128, True, False),
          (1, 3, 3, 33, 5000, 128, True, False), (2, 4, 4, 700, 1300, 128, False, True),
          (2, 4, 4, 640, 640, 128, True, True), (8, 16, 4, 2048, 2048, 128, True, False),
          (2, 8, 8, 1500, 1500, 64, True, False), (4, 16, 16, 2048, 2048, 128, False, False))
FORMS = ("on-demand", "strided", "on-demand-tma")
TIMED = tuple((16384 // s, 16, kv, s, c) for s in (2048, 4096, 8192, 16384) for c in (False, True) for kv in (16, 4))


@gluon.jit
def _block_of(t, n_blocks_n, n_kv_heads, wg_n: gl.constexpr):
    # Key block t's (start_n, b, h_kv): the blocks of one (batch, key/value head) in turn, first key first.
    start_n = t % n_blocks_n * (2 * wg_n)
    bh_kv = t // n_blocks_n
    return start_n, bh_kv // n_kv_heads, bh_kv % n_kv_heads


@gluon.jit
def _loader(tile_smem, counter_ptr, q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
            kv_free, ready, free, seq_q, seq_k, n_kv_heads, group, total, CAUSAL: gl.constexpr,
            STAGES: gl.constexpr, ON_DEMAND: gl.constexpr):
    wg_n: gl.constexpr = k_desc.block_type.shape[2]
    block_m: gl.constexpr = q_desc.block_type.shape[2]
    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)
    tile_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    if ON_DEMAND:
        t = gl.atomic_add(counter_ptr, 1)
    else:
        t = gl.program_id(0)
    it = 0
    i = 0
    while t < total:
        start_n, b, h_kv = _block_of(t, n_blocks_n, n_kv_heads, wg_n)
        mbarrier.wait(kv_free, (i & 1) ^ 1)  # both consumers are done with the last block's K and V
        tile_smem.store(gl.full([1], t, gl.int32, tile_layout))
        mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
        for w in gl.static_range(2):
            tma.async_copy_global_to_shared(k_desc, [b, h_kv, start_n + w * wg_n, 0], kv_bar, k_smem.index(w))
            tma.async_copy_global_to_shared(v_desc, [b, h_kv, start_n + w * wg_n, 0], kv_bar, v_smem.index(w))
        m_lo, n_m = _query_range(start_n, seq_q, seq_k, CAUSAL, block_m)
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
        i += 1
        if ON_DEMAND:
            t = gl.atomic_add(counter_ptr, 1)
        else:
            t += gl.num_programs(0)
    # The end: an index past the last block, handed over as a block would be (no bytes to wait for).
    mbarrier.wait(kv_free, (i & 1) ^ 1)
    tile_smem.store(gl.full([1], t, gl.int32, tile_layout))
    mbarrier.arrive(kv_bar)


@gluon.jit
def _consumer(out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr, delta_ptr,
              dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb,
              stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, WG: gl.constexpr,
              HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, STAGES: gl.constexpr,
              TMA_STORE: gl.constexpr):
    wg_n: gl.constexpr = k_smem.shape[3]
    block_m: gl.constexpr = q_smem.shape[3]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, block_m, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM, HEAD_DIM // 8], [4, 1], [1, 0])
    tile_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)
    cols = gl.arange(0, block_m, layout=gl.SliceLayout(0, st_layout))
    causal_offset = seq_k - seq_q
    k_view = k_smem.index(WG).reshape([wg_n, HEAD_DIM])
    v_view = v_smem.index(WG).reshape([wg_n, HEAD_DIM])
    i = 0
    it = 0
    mbarrier.wait(kv_bar, 0)
    t = gl.max(tile_smem.load(tile_layout), axis=0)
    while t < total:
        start_n, b, h_kv = _block_of(t, n_blocks_n, n_kv_heads, wg_n)
        keys = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, st_layout))
        kept = keys < seq_k
        if KEY_MASK:
            kept = gl.load(mask_ptr + b.to(gl.int64) * stride_mb + keys.to(gl.int64) * stride_mk, mask=kept,
                           other=0) != 0
        m_lo, n_m = _query_range(start_n, seq_q, seq_k, CAUSAL, block_m)
        dk = gl.zeros([wg_n, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([wg_n, HEAD_DIM], gl.float32, acc_layout)
        for g in range(group):
            bh = (b * n_kv_heads + h_kv) * group + g
            for mi in range(n_m):
                slot = it % STAGES
                mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
                q_tile = q_smem.index(slot).reshape([block_m, HEAD_DIM])
                do_tile = do_smem.index(slot).reshape([block_m, HEAD_DIM])
                st_acc = warpgroup_mma(k_view, q_tile.permute((1, 0)),
                                       gl.zeros([wg_n, block_m], gl.float32, st_layout), use_acc=False, is_async=True)
                dpt_acc = warpgroup_mma(v_view, do_tile.permute((1, 0)),
                                        gl.zeros([wg_n, block_m], gl.float32, st_layout), use_acc=False,
                                        is_async=True)
                rows = m_lo + mi * block_m + cols
                base = bh.to(gl.int64) * seq_q
                lse2 = gl.load(lse_ptr + base + rows, mask=rows < seq_q, other=float("inf")) * _LOG2E
                s_t = warpgroup_mma_wait(1, deps=(st_acc, ))
                p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
                if CAUSAL:
                    if m_lo + mi * block_m + causal_offset < start_n + WG * wg_n + wg_n - 1:
                        p_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)
                if KEY_MASK:
                    p_t = gl.where(kept[:, None], p_t, 0.0)
                p_op = gl.convert_layout(p_t.to(q_smem.dtype), op_layout)
                dv_acc = warpgroup_mma(p_op, do_tile, dv, is_async=True)
                delta = gl.load(delta_ptr + base + rows, mask=rows < seq_q, other=0.0)
                dp_t = warpgroup_mma_wait(1, deps=(dpt_acc, ))
                ds_t = p_t * (dp_t - delta[None, :])
                ds_op = gl.convert_layout(ds_t.to(q_smem.dtype), op_layout)
                dk_acc = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
                dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc, p_op, ds_op))
                mbarrier.arrive(free.index(slot))
                it += 1
        mbarrier.arrive(kv_free)  # K and V are no longer read: the next block's may load under these stores
        if TMA_STORE:  # dK, then dV, through this warpgroup's buffer and a TMA copy (rows past seq_k clipped)
            view = out_smem.index(WG)
            tma.store_wait(0)
            view.reshape([wg_n, HEAD_DIM]).store((dk * scale).to(q_smem.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_ptr, [b, h_kv, start_n + WG * wg_n, 0], view)
            tma.store_wait(0)
            view.reshape([wg_n, HEAD_DIM]).store(dv.to(q_smem.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dv_ptr, [b, h_kv, start_n + WG * wg_n, 0], view)
        else:
            rows_n = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, store_layout))
            d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
            keep = (rows_n < seq_k)[:, None]
            dk_base = dk_ptr + b.to(gl.int64) * stride_dkb + h_kv.to(gl.int64) * stride_dkh
            gl.store(dk_base + rows_n.to(gl.int64)[:, None] * stride_dks + d_cols[None, :],
                     gl.convert_layout((dk * scale).to(dk_ptr.dtype.element_ty), store_layout), mask=keep)
            dv_base = dv_ptr + b.to(gl.int64) * stride_dvb + h_kv.to(gl.int64) * stride_dvh
            gl.store(dv_base + rows_n.to(gl.int64)[:, None] * stride_dvs + d_cols[None, :],
                     gl.convert_layout(dv.to(dv_ptr.dtype.element_ty), store_layout), mask=keep)
        i += 1
        mbarrier.wait(kv_bar, i & 1)
        t = gl.max(tile_smem.load(tile_layout), axis=0)
    if TMA_STORE:
        tma.store_wait(0)


@gluon.jit
def _consumer_1(out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr,
                delta_ptr, dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale,
                stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk,
                HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, STAGES: gl.constexpr,
                TMA_STORE: gl.constexpr):
    _consumer(out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr, delta_ptr,
              dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb,
              stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, 1, HEAD_DIM, CAUSAL,
              KEY_MASK, STAGES, TMA_STORE)


@gluon.jit
def _persistent_kv_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr, seq_q,
                          seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb, stride_dkh, stride_dks,
                          stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, counter_ptr,
                          HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr,
                          STAGES: gl.constexpr, ON_DEMAND: gl.constexpr, TMA_STORE: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    # TMA_STORE: dk_ptr and dv_ptr carry dK's and dV's tensor descriptors, and each consumer a buffer of its own.
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    tile_smem = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    out_smem = gl.allocate_shared_memory(dtype, [2 if TMA_STORE else 1] + k_desc.block_type.shape, k_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_free, count=2)  # both consumers are done with the block's K and V
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr, delta_ptr,
                     dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb,
                     stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, 0, HEAD_DIM,
                     CAUSAL, KEY_MASK, STAGES, TMA_STORE)),
        (_consumer_1, (out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr, delta_ptr,
                       dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb,
                       stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, HEAD_DIM,
                       CAUSAL, KEY_MASK, STAGES, TMA_STORE)),
        (_loader, (tile_smem, counter_ptr, q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
                   kv_free, ready, free, seq_q, seq_k, n_kv_heads, group, total, CAUSAL, STAGES, ON_DEMAND)),
    ], [4, 1], [KV.CONSUMER_REGS, KV.LOADER_REGS])


def launch_args(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, key_mask, programs: int, counter,
                tma_store: bool = False, stages: int = KV.STAGES) -> tuple:
    """(grid, positional args, meta) of one launch: `programs` programs (tensors may be on the 'meta' device);
    counter: one int32 at zero on q's device (on demand), or None (strided); tma_store: dK and dV leave by TMA
    (they must fit descriptors)."""
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    total = triton.cdiv(seq_k, KV.BLOCK_N) * batch * n_kv_heads
    mask, stride_mb, stride_mk = key_mask_args(key_mask)
    args = (descriptor(q, KV.BLOCK_M), descriptor(do, KV.BLOCK_M), descriptor(k, KV.WARPGROUP_N),
            descriptor(v, KV.WARPGROUP_N), lse, delta, descriptor(dk, KV.WARPGROUP_N) if tma_store else dk,
            descriptor(dv, KV.WARPGROUP_N) if tma_store else dv, mask, seq_q, seq_k, n_kv_heads, n_heads // n_kv_heads,
            total, scale * LOG2E, scale, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1),
            dv.stride(2), stride_mb, stride_mk, lse if counter is None else counter)  # lse: never read then
    meta = dict(HEAD_DIM=head_dim, CAUSAL=causal, KEY_MASK=key_mask is not None, STAGES=stages,
                ON_DEMAND=counter is not None, TMA_STORE=tma_store, CONSUMER_REGS=KV.CONSUMER_REGS,
                LOADER_REGS=KV.LOADER_REGS)
    return (max(1, min(total, programs)),), args, meta


def persistent_kv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, key_mask=None,
                  on_demand: bool = True, tma_store: bool = False) -> None:
    """Writes dK and dV as attention_bwd_kv_gluon does, on one program an SM."""
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if on_demand else None
    grid, args, meta = launch_args(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask,
                                   torch.cuda.get_device_properties(q.device).multi_processor_count, counter,
                                   tma_store)
    _persistent_kv_kernel[grid](*args, **meta, num_warps=KV.NUM_WARPS, maxnreg=KV.MAXNREG)


def compile_for_sm90(head_dim: int, causal: bool, key_mask: bool, on_demand: bool = True, tma_store: bool = False):
    """The form compiled for sm_90 from shapes alone (no GPU)."""
    q = torch.empty(2, 4, 1000, head_dim, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 2, 1000, head_dim, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    mask = torch.empty(2, 1000, dtype=torch.bool, device="meta") if key_mask else None
    counter = torch.empty(1, dtype=torch.int32, device="meta") if on_demand else None
    _, args, meta = launch_args(q, k, k, q, lse, lse, torch.empty_like(k), torch.empty_like(k), causal, 0.125, mask,
                                132, counter, tma_store)
    return compile_kernel_for_sm90(_persistent_kv_kernel, args, meta, KV.NUM_WARPS, KV.MAXNREG)


def _delta(o, do):
    batch, n_heads, seq_q, head_dim = o.shape
    delta = torch.empty((batch, n_heads, seq_q), dtype=torch.float32, device=o.device)
    _attention_bwd_delta_kernel[(triton.cdiv(seq_q, _DELTA_BLOCK_M) * batch * n_heads,)](
        o, do, delta, seq_q, n_heads, *_strides(o), *_strides(do), HEAD_DIM=head_dim, BLOCK_M=_DELTA_BLOCK_M,
        num_warps=_DELTA_WARPS)
    return delta


def _setup(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, masked=False):
    q, k, v, key_mask = draw_inputs(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, torch.bfloat16, masked)
    do = torch.randn_like(q)
    scale = 1 / math.sqrt(head_dim)
    o, lse = attention_fwd(q, k, v, causal, scale, key_mask=key_mask)
    kv_plan, _ = plan_attention_backward(seq_q, head_dim, torch.bfloat16, causal, impl="gluon")
    return q, k, v, do, lse.contiguous(), _delta(o, do), scale, key_mask, kv_plan


def forms(q, k, v, do, lse, delta, causal, scale, key_mask, kv_plan, poison=False) -> dict:
    """name -> a call writing (dK, dV) by the plan's kernel or a form."""
    make = (lambda t: torch.full_like(t, float("nan"))) if poison else torch.empty_like

    def run(which):
        dk, dv = make(k), make(v)
        if which == "plan":
            KV.attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, kv_plan.num_stages)
        else:
            persistent_kv(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, which != "strided",
                          which == "on-demand-tma")
        return dk, dv

    return {name: (lambda name=name: run(name)) for name in ("plan", *FORMS)}


def main() -> int:
    if sys.argv[1:] == ["--compile"]:
        from probes.compiled import ptxas_registers

        for head_dim in (128, 64):
            for causal in (False, True):
                for name, kernel in (("plan", KV.compile_for_sm90(head_dim, torch.bfloat16, causal, False)),
                                     ("on-demand", compile_for_sm90(head_dim, causal, False)),
                                     ("strided", compile_for_sm90(head_dim, causal, False, on_demand=False)),
                                     ("on-demand-tma", compile_for_sm90(head_dim, causal, False, tma_store=True))):
                    registers, spilled = ptxas_registers(kernel, 90)
                    print(json.dumps({"form": name, "head_dim": head_dim, "causal": causal, "registers": registers,
                                      "spilled_bytes": spilled, "shared_bytes": kernel.metadata.shared}))
        return 0
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "attention_bwd_persistent.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES, "clock": ALTERNATING_CLOCK, "checks": []}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261201)
    for batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, masked in CHECKS:
        calls = forms(*_setup(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, masked), poison=True)
        planned = calls["plan"]()
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, head_dim], "causal": causal, "key_mask": masked}
        for name in FORMS:
            got = [calls[name]() for _ in range(3)]  # three launches: a counter of their own each
            row[name] = all(torch.equal(a, b) for g in got for a, b in zip(g, planned))
        add_row(output, result, row, key="checks")
    result["all_equal"] = all(r[name] for r in result["checks"] for name in FORMS)
    write_output(output, result)
    if not result["all_equal"]:
        print("a form differs from the plan: nothing timed", flush=True)
        return 1
    result["experiment"] = []
    for batch, heads, kv_heads, seq, causal in TIMED:
        calls = forms(*_setup(gen, batch, heads, kv_heads, seq, seq, 128, causal))
        row = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq, "causal": causal}
        row.update(alternating_rounds(calls, ROUNDS))
        for name in FORMS:
            row[f"plan_over_{name}"] = row["plan"]["us"] / row[name]["us"]
        add_row(output, result, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
