"""GPU probe: does the Gluon forward's persistent grid win back its fixed cost when each query tile's first
score product and masked softmax run under the last tile's value product? (kernels/attention_gluon.py)

    python probes/attention_ramp_overlap.py OUT_DIR     (writes OUT_DIR/attention_ramp_overlap.json)

Round attention-fixed-cost (notes/attention.md) left 3.3 µs a query tile's turn in the persistent kernel's fixed
part against cuDNN's 1.1: at every tile boundary each consumer warpgroup runs, with the tensor cores idle,
the last key tile's value product alone, the epilogue, then the next tile's first score product alone and its
masked softmax. The candidate here ("overlap") keeps the persistent kernel's loader, key loop and softmax and
changes only that boundary: once the key loop of tile i is done, the consumer issues tile i + 1's first score
product S_0 = Q' K_0'^T and then tile i's last value product O += P V_last, waits for the first only, runs
tile i + 1's masked softmax while the value product is in flight, and only then stores tile i's O and lse.
The arithmetic of every row is the plan's, in the plan's order, so its outputs must equal the plan's bit for
bit (checked at every correctness shape below before anything is timed).

Candidates: the plan (one program a query tile), the persistent grid as built (kernels/attention_gluon.py,
PERSISTENT), "overlap" (this file's consumer on the same persistent grid) and cuDNN through SDPA. Two sets of
shapes: the fixed-cost walk (2,048 query tiles, keys 128 to 4,096, no mask; T(n) = a + b·n fitted from 4 key
tiles on, as that round did) and the attention-fwd experiment's head-dim-128 shapes at 2,048-8,192 keys,
causal and not. Timing: the median of three triton.testing.do_bench medians (the L2 flushed between calls),
GPU time. A tuning instrument, not evidence: the site's figures come only from run records.

Forms: "overlap" gives the program one Q buffer, so the next tile's Q is loaded once both consumers are done with
the last one's; "overlap-2q" gives it two, as the persistent kernel has. Each form is timed only if its outputs
equal the plan's at every check shape. Round attention-ramp-overlap (notes/attention.md) has the readings.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from probes.attention_forms import check_case, rel_error  # noqa: E402
from probes.harness import key_tile_fit  # noqa: E402
from kernels.attention_gluon import (  # noqa: E402
    _LN2, MAXNREG, NUM_WARPS, _consume_tiles, _loader, _query_tile, _softmax_tile, launch_args)

QUESTION = ("Does issuing each query tile's first score product and running its masked softmax under the last tile's "
            "value product win back the persistent Gluon forward's fixed cost a query tile?")
CANDIDATES = ("the plan: one program a query tile", "the persistent grid as built",
              "overlap: the persistent grid with the next tile's first product and softmax under the last value "
              "product, one Q buffer", "overlap-2q: the same with two Q buffers", "cuDNN through SDPA")
SHAPES = ("fixed-cost walk: head dim 128, bf16, no mask, 8 x 16 heads of 2,048 queries, keys 128-4,096; "
          "experiment shapes: head dim 128, bf16, B x S = 16,384, 16 heads, S 2,048 / 4,096 / 8,192, causal and not; "
          "correctness: head dims 64 and 128, bf16 and fp16, causal, GQA, ragged lengths, a key mask")
OUTPUTS = {"attention-ramp-overlap": ("notes/probes/2026-11-27-h100-attention-ramp-overlap-checks.json",
                                      "notes/probes/2026-11-27-h100-attention-ramp-overlap-timed.json")}

HEAD_DIM, HEADS, BF = 128, 16, torch.bfloat16
WALK_KEYS = (128, 256, 512, 1024, 2048, 4096)
WALK_SEQ_Q, WALK_BATCH = 2048, 8
EXPERIMENT_S = (2048, 4096, 8192)
FIT_FROM = 4
REPEATS = 3
TOLERANCE = 2e-2  # bf16 / fp16 output against float64, norm-wise
# (batch, heads, kv heads, seq_q, seq_k, head dim, dtype, causal, key mask)
CHECKS = ((2, 4, 4, 1000, 1500, 128, torch.bfloat16, False, False), (2, 4, 4, 1000, 1500, 128, torch.bfloat16, True, False),
          (1, 8, 2, 777, 777, 128, torch.float16, True, False), (2, 4, 1, 640, 2100, 128, torch.bfloat16, False, True),
          (3, 4, 4, 1500, 900, 128, torch.bfloat16, True, False), (2, 4, 4, 1000, 1500, 64, torch.bfloat16, True, False),
          (2, 8, 8, 2048, 2048, 128, torch.bfloat16, True, False), (1, 2, 2, 130, 128, 128, torch.bfloat16, False, False),
          (4, 16, 16, 1024, 1000, 128, torch.bfloat16, True, False), (8, 16, 4, 1024, 600, 128, torch.bfloat16, False, True),
          (8, 16, 16, 2048, 512, 64, torch.float16, False, False))


@gluon.jit
def _tile_rows(t, WG: gl.constexpr, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N: gl.constexpr, wg_m: gl.constexpr,
               CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, s_layout: gl.constexpr):
    # Tile t's (b, h, bh, first row of this warpgroup, key tiles, each row's key limit, tiles seen whole).
    b, h, bh, start_m, n_tiles = _query_tile(t, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N, 2 * wg_m, CAUSAL)
    row0 = start_m + WG * wg_m
    rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, s_layout))
    if CAUSAL:
        limit = gl.minimum(rows + (seq_k - seq_q + 1), seq_k)
        n_full = gl.minimum(gl.maximum(row0 + (seq_k - seq_q + 1), 0), seq_k) // BLOCK_N
    else:
        limit = gl.full([wg_m], seq_k, gl.int32, gl.SliceLayout(1, s_layout))
        n_full = seq_k // BLOCK_N
    if KEY_MASK:
        n_full = n_full * 0
    return b, h, bh, row0, n_tiles, limit, n_full


@gluon.jit
def _first_softmax(s, limit, mask_base, seq_k, stride_mk, qk_scale, dtype: gl.constexpr, BLOCK_N: gl.constexpr,
                   KEY_MASK: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr):
    # Key tile 0 of a query tile, always through the masked softmax: (P in the scores' layout, m, d).
    wg_m: gl.constexpr = s.shape[0]
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    kept = keys < seq_k
    if KEY_MASK:
        kept = gl.load(mask_base + keys.to(gl.int64) * stride_mk, mask=kept, other=0) != 0
    m0 = gl.full([wg_m], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    d0 = gl.zeros([wg_m], gl.float32, gl.SliceLayout(1, s_layout))
    p, m, d, alpha = _softmax_tile(s, m0, d0, keys, limit, kept, qk_scale, True, KEY_MASK, False)
    return p.to(dtype), m, d


@gluon.jit
def _store_tile(o, m, d, o_ptr, lse_ptr, b, h, bh, row0, seq_q, stride_ob, stride_oh, stride_os,
                HEAD_DIM: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
    # The plan's epilogue: a row that saw no key has d = 0, O = 0 and lse = -inf.
    wg_m: gl.constexpr = o.shape[0]
    rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, s_layout))
    empty = d == 0.0
    d_safe = gl.where(empty, 1.0, d)
    lse = gl.where(empty, -float("inf"), (m + gl.log2(d_safe)) * _LN2)
    gl.store(lse_ptr + bh.to(gl.int64) * seq_q + rows, lse, mask=rows < seq_q)
    o = o / gl.convert_layout(d_safe, gl.SliceLayout(1, o_layout))[:, None]
    o_rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_base = o_ptr + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    offs = o_rows.to(gl.int64)[:, None] * stride_os + o_cols[None, :]
    gl.store(o_base + offs, o.to(o_ptr.dtype.element_ty), mask=(o_rows < seq_q)[:, None])


@gluon.jit
def _overlap_consumer(q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr,
                      mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os,
                      stride_mb, stride_mk, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, Q_BUFFERS: gl.constexpr):
    # The persistent consumer with the tile boundary overlapped (module docstring). c: key tiles consumed so far
    # (the loader's ring position); i: query tiles so far (the Q buffers' position).
    wg_m: gl.constexpr = q_smem.shape[3]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    n_total = n_blocks_m * n_bh
    # What crosses a tile boundary: key tile 0's P of the next tile (bf16, the scores' layout), its m and d. The
    # first tile makes its own at the top of the loop, as the plan's consumer does for every tile: before the
    # loop nothing but these initial values is made.
    p_first = gl.zeros([wg_m, BLOCK_N], dtype, s_layout)
    m = gl.full([wg_m], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    d = gl.zeros([wg_m], gl.float32, gl.SliceLayout(1, s_layout))
    c = 0
    i = 0
    for t in range(gl.program_id(0), n_total, gl.num_programs(0)):
        b, h, bh, row0, n_tiles, limit, n_full = _tile_rows(t, WG, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N, wg_m,
                                                            CAUSAL, KEY_MASK, s_layout)
        mask_base = mask_ptr
        if KEY_MASK:
            mask_base += b.to(gl.int64) * stride_mb
        qb = i % Q_BUFFERS
        q_view = q_smem.index(2 * qb + WG).reshape([wg_m, HEAD_DIM])
        if i == 0:  # the program's first tile: S_0 and its softmax alone
            mbarrier.wait(q_bar.index(0), 0)
            mbarrier.wait(k_ready.index(0), 0)
            s_acc = warpgroup_mma(q_view, k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                                  gl.zeros([wg_m, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_acc, ))
            mbarrier.arrive(k_free.index(0))
            p_first, m, d = _first_softmax(s, limit, mask_base, seq_k, stride_mk, qk_scale, dtype, BLOCK_N,
                                           KEY_MASK, s_layout, p_layout)
        p_prev = gl.convert_layout(p_first, p_layout)
        o = gl.zeros([wg_m, HEAD_DIM], gl.float32, o_layout)
        mid = gl.maximum(n_full, 1)
        o, p_prev, m, d = _consume_tiles(o, p_prev, m, d, q_view, k_smem, v_smem, k_ready, k_free, v_ready, v_free,
                                         turn, mask_base, limit, c, 1, mid, seq_k, stride_mk, qk_scale, BLOCK_N,
                                         HEAD_DIM, STAGES, False, KEY_MASK, s_layout, o_layout, p_layout, WG,
                                         False, False)
        o, p_prev, m, d = _consume_tiles(o, p_prev, m, d, q_view, k_smem, v_smem, k_ready, k_free, v_ready, v_free,
                                         turn, mask_base, limit, c, mid, n_tiles, seq_k, stride_mk, qk_scale,
                                         BLOCK_N, HEAD_DIM, STAGES, True, KEY_MASK, s_layout, o_layout, p_layout, WG,
                                         False, False)
        mbarrier.arrive(q_free.index(qb))
        last = c + n_tiles - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        c_next = c + n_tiles
        t_next = t + gl.num_programs(0)
        nqb = (i + 1) % Q_BUFFERS
        nq_view = q_smem.index(2 * nqb + WG).reshape([wg_m, HEAD_DIM])
        # The two branches keep their asynchronous products under names of their own: an asynchronous result
        # assigned to one name in both is yielded out of the branch, and in a worker partition O then came out
        # wrong (notes/attention.md, round attention-ramp-overlap).
        if t_next < n_total:
            # Tile i + 1's S_0 first, then tile i's last value product; the softmax of S_0 runs under the latter.
            # The next tile's batch (for its key mask) and row limits; the rest is worked out again at its turn.
            nb, _, _, _, _, nlimit, _ = _tile_rows(t_next, WG, seq_q, seq_k, n_heads, n_blocks_m, BLOCK_N, wg_m,
                                                   CAUSAL, KEY_MASK, s_layout)
            nmask_base = mask_ptr
            if KEY_MASK:
                nmask_base += nb.to(gl.int64) * stride_mb
            mbarrier.wait(q_bar.index(nqb), ((i + 1) // Q_BUFFERS) & 1)
            mbarrier.wait(k_ready.index(c_next % STAGES), (c_next // STAGES) & 1)
            s_acc = warpgroup_mma(nq_view, k_smem.index(c_next % STAGES).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                                  gl.zeros([wg_m, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
            pv_acc = warpgroup_mma(p_prev, v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM]), o, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_acc, ))
            mbarrier.arrive(k_free.index(c_next % STAGES))
            p_next, m_next, d_next = _first_softmax(s, nlimit, nmask_base, seq_k, stride_mk, qk_scale, dtype,
                                                    BLOCK_N, KEY_MASK, s_layout, p_layout)
            o, p_prev = warpgroup_mma_wait(0, deps=(pv_acc, p_prev))
        else:
            o, p_prev = warpgroup_mma_wait(0, deps=(
                warpgroup_mma(p_prev, v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM]), o, is_async=True),
                p_prev))
            # No next tile: placeholders (p_first itself would stay live through the whole key loop).
            p_next, m_next, d_next = gl.zeros([wg_m, BLOCK_N], dtype, s_layout), m, d
        mbarrier.arrive(v_free.index(last % STAGES))
        _store_tile(o, m, d, o_ptr, lse_ptr, b, h, bh, row0, seq_q, stride_ob, stride_oh, stride_os, HEAD_DIM,
                    s_layout, o_layout)
        p_first, m, d = p_next, m_next, d_next
        c = c_next
        i += 1


@gluon.jit
def _overlap_consumer_1(q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr,
                        mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os,
                        stride_mb, stride_mk, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                        CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, Q_BUFFERS: gl.constexpr):
    _overlap_consumer(q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr, lse_ptr,
                      mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob, stride_oh, stride_os,
                      stride_mb, stride_mk, 1, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, KEY_MASK, Q_BUFFERS)


@gluon.jit
def _overlap_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, mask_ptr, seq_q, seq_k, n_heads, group, n_bh, qk_scale,
                    stride_ob, stride_oh, stride_os, stride_mb, stride_mk, counter_ptr, HEAD_DIM: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr,
                    PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr, EXP_SPLIT: gl.constexpr,
                    ON_DEMAND: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                    Q_BUFFERS: gl.constexpr):
    # The persistent kernel of kernels/attention_gluon.py (the same ring and loader; one or two Q buffers) with the
    # overlapping consumers; PINGPONG, EXP_SPLIT and ON_DEMAND are not taken (launched without a counter, the
    # loader walks tiles pid, pid + grid, ...).
    wg_m: gl.constexpr = q_desc.block_type.shape[2]
    n_blocks_m = gl.cdiv(seq_q, 2 * wg_m)
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
        mbarrier.init(q_free.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)
        mbarrier.init(v_free.index(i), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_overlap_consumer, (q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr,
                             lse_ptr, mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob,
                             stride_oh, stride_os, stride_mb, stride_mk, 0, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                             KEY_MASK, Q_BUFFERS)),
        (_overlap_consumer_1, (q_smem, k_smem, v_smem, q_bar, q_free, k_ready, k_free, v_ready, v_free, turn, o_ptr,
                               lse_ptr, mask_ptr, seq_q, seq_k, n_heads, n_blocks_m, n_bh, qk_scale, stride_ob,
                               stride_oh, stride_os, stride_mb, stride_mk, HEAD_DIM, BLOCK_N, STAGES, CAUSAL,
                               KEY_MASK, Q_BUFFERS)),
        (_loader, (tile_smem, counter_ptr, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, k_ready,
                   k_free, v_ready, v_free, seq_q, seq_k, n_heads, group, n_blocks_m, n_bh, BLOCK_N, STAGES, CAUSAL,
                   Q_BUFFERS, ON_DEMAND)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def overlap_fwd(q, k, v, causal: bool, scale: float, stages: int, key_mask=None, q_buffers: int = 1):
    """(O, lse) from the overlapping persistent kernel; the plan's launch arguments, one program an SM, and
    q_buffers Q buffers (two: the next tile's Q lands while this one's is in use)."""
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    programs = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid, args, meta = launch_args(q, k, v, o, lse, causal, scale, stages, key_mask, False, programs, False)
    _overlap_kernel[grid](*args, **meta, Q_BUFFERS=q_buffers, num_warps=NUM_WARPS, maxnreg=MAXNREG)
    return o, lse


def compile_overlap_for_sm90(head_dim: int, dtype: torch.dtype, causal: bool, key_mask: bool, stages: int,
                             q_buffers: int = 1):
    """The overlapping kernel compiled for sm_90 from shapes alone (the CPU checks it builds, without a GPU)."""
    from kernels._gluon_host import compile_kernel_for_sm90

    q = torch.empty(2, 4, 1000, head_dim, dtype=dtype, device="meta")
    lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    mask = torch.empty(2, 1000, dtype=torch.bool, device="meta") if key_mask else None
    _, args, meta = launch_args(q, q, q, torch.empty_like(q), lse, causal, 0.125, stages, mask, False, 132, False)
    return compile_kernel_for_sm90(_overlap_kernel, args, {**meta, "Q_BUFFERS": q_buffers}, NUM_WARPS, MAXNREG)


# The overlapping kernel's forms: Q buffers a program.
OVERLAPS = {"overlap": 1, "overlap-2q": 2}


def _checks(gen) -> list[dict]:
    rows = []
    for batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, causal, masked in CHECKS:
        case = check_case(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, causal, masked)
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, head_dim], "dtype": str(dtype).split(".")[-1],
               "causal": causal, "key_mask": masked, "plan_rel_error": rel_error(case.o_plan, case.ref)}
        for name, buffers in OVERLAPS.items():
            o, lse = overlap_fwd(case.q, case.k, case.v, causal, case.scale, case.plan.num_stages, case.key_mask,
                                 buffers)
            row[name] = {"equal_to_plan": bool(torch.equal(o, case.o_plan) and torch.equal(lse, case.lse_plan)),
                         "rel_error": rel_error(o, case.ref)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _time(fn) -> float:
    return 1e3 * statistics.median(triton.testing.do_bench(fn, warmup=25, rep=100) for _ in range(REPEATS))


def _candidates(q, k, v, causal: bool, scale: float, overlaps: dict) -> dict:
    from dataclasses import replace

    plan = plan_attention(q.shape[2], q.shape[3], q.dtype, causal, seq_k=k.shape[2], impl="gluon")

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)

    runs = {"plan": lambda: attention_fwd(q, k, v, causal, scale, plan)[0],
            "persistent": lambda: attention_fwd(q, k, v, causal, scale, replace(plan, persistent=True))[0]}
    for name, buffers in overlaps.items():
        runs[name] = lambda b=buffers: overlap_fwd(q, k, v, causal, scale, plan.num_stages, None, b)[0]
    return {**runs, "cudnn": cudnn}


def _timed_row(row: dict, q, k, v, causal: bool, scale: float, flops: float, overlaps: dict) -> dict:
    first = None
    for name, fn in _candidates(q, k, v, causal, scale, overlaps).items():
        try:
            out = fn()
            if first is None:
                first = out
            err = float((out.double() - first.double()).norm() / first.double().norm())
            row[name] = {"rel_diff_to_plan": err}
            if not err < TOLERANCE:
                row[name]["error"] = f"differs from the plan by {err:.3g}: not timed"
                continue
            us = _time(fn)
            row[name].update(us=us, tflops=flops / us / 1e6)
        except Exception as exc:  # noqa: BLE001 - one candidate's failure is its own row
            row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print(json.dumps(row), flush=True)
    return row



def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    facts = {"device": torch.cuda.get_device_name(), "sms": props.multi_processor_count, "torch": torch.__version__,
             "triton": triton.__version__, "clock": "GPU time (do_bench, L2 flushed)", "question": QUESTION,
             "shapes": SHAPES}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261127)
    facts["checks"] = _checks(gen)
    # A form is timed only if its outputs equal the plan's at every check shape.
    passed = {name: b for name, b in OVERLAPS.items() if all(r[name]["equal_to_plan"] for r in facts["checks"])}
    facts["all_correct"] = {name: name in passed for name in OVERLAPS}
    if not passed:
        (out_dir / "attention_ramp_overlap.json").write_text(json.dumps(facts, indent=1))
        print("no overlapping form matches the plan: nothing timed", flush=True)
        return 1
    scale = 1 / math.sqrt(HEAD_DIM)
    facts["walk"], facts["experiment"], facts["fits"] = [], [], {}
    q = torch.randn(WALK_BATCH, HEADS, WALK_SEQ_Q, HEAD_DIM, device="cuda", dtype=BF, generator=gen)
    for seq_k in WALK_KEYS:
        k, v = (torch.randn(WALK_BATCH, HEADS, seq_k, HEAD_DIM, device="cuda", dtype=BF, generator=gen) for _ in range(2))
        row = {"query_tiles": WALK_BATCH * HEADS * WALK_SEQ_Q // 128, "seq_k": seq_k, "key_tiles": seq_k // 128}
        facts["walk"].append(_timed_row(row, q, k, v, False, scale,
                                        4.0 * WALK_BATCH * HEADS * WALK_SEQ_Q * seq_k * HEAD_DIM, passed))
    for name in ("plan", "persistent", *passed, "cudnn"):
        fit = key_tile_fit(facts["walk"], name, props.multi_processor_count, FIT_FROM)
        if fit is not None:
            facts["fits"][name] = fit
    del q, k, v
    for causal in (False, True):
        for seq in EXPERIMENT_S:
            batch = 16384 // seq
            q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=BF, generator=gen) for _ in range(3))
            flops = 4.0 * batch * HEADS * seq * seq * HEAD_DIM / (2 if causal else 1)
            row = {"batch": batch, "seq": seq, "causal": causal}
            facts["experiment"].append(_timed_row(row, q, k, v, causal, scale, flops, passed))
            del q, k, v
    (out_dir / "attention_ramp_overlap.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts["fits"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
