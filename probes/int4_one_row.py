"""GPU probe: the int4 decode GEMV at one row (kernels/int4_gluon.py) and what moves it toward its weight-read floor.

    python probes/int4_one_row.py OUT_DIR --round fma|alu [--ns 4096,14336] [--only alu,deep]

"plan" is kernels/int4_gluon.py's plan at the commit the probe runs; these rounds ran at 1c232d3, where it took
two groups a chunk, two programs an SM, and removed the offset -136 sum x by a second MMA a group. On the same
prepacked weight (prepack_int4's order), at M = 1:

- "alu": that plan with the second MMA replaced by one packed subtract a bf16x2 pair of the unpacked words
  (exact: q = (128 + u) - 136); "alu cC pP": C groups a chunk, the split aimed at P programs an SM;
- "fma cC pP": no tensor cores. Each thread keeps its own words (two rows x 32 k of a group), turns each nibble
  into the float32 128 + u with one shift and one LOP3 (the nibble at bits 16-19 of 0x43000000), multiplies by
  x held as float32 in shared memory in the thread's own order, and applies each row's scale to its group
  partial; about 3.6 instructions a weight in the sm_90a SASS against the five an SM can spend at the copy rate;
- "deep cC pP dD": x staged in shared memory once for the program's groups, the words and scales of D chunks in
  flight ahead of the chunk in use;
- "xsum cC pP": the words unpacked to 128 + u as the plan does, and 136 * sum_k x (each group's sum, worked out
  once a program) taken off each group's product instead of the subtracts;
- "read pP": the prepacked words read once by a kernel that does nothing else, P programs an SM: what a read of
  this size attains on this clock.

--round fma (round int4-fma-1) times plan, alu, fma and read into OUT_DIR/int4_gemv_fma.json; --round alu (rounds
int4-alu-1 and -2) times plan, alu, xsum, the alu splits, deep and read p8 into OUT_DIR/int4_gemv_alu.json
(--only picks candidates by name prefix). K = 4096, bfloat16, G = 128, M = 1; N in 4096, 12288, 14336, 11007;
graph clock, weights rotated past L2 (checks/decode_probe.py); every checked output against float64 on the
dequantised weight, into NaN-filled buffers. With --profile NAMES it runs each named kernel once at the first N
(plan, alu, fma, read8) for a profiler, as the counters of round int4-fma-1 were taken:
    ncu -k regex:"_int4_gemv|_read_kernel" --section SpeedOfLight --section Occupancy --section WarpStateStats
        --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --csv --page details
        python probes/int4_one_row.py OUT --ns 14336 --profile plan,alu,fma,read8
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.decode_probe import copy_ceiling_gbs, graph_us, rel_err  # noqa: E402
from kernels import int4_gluon as ig  # noqa: E402
from kernels._gemv import device_sm_count, workspace  # noqa: E402
from kernels.quantize import dequantize_int4, quantize_int4  # noqa: E402
from probes.int4_parts import int4_arrange, int4_operand_plain, int4_prepacked_copies  # noqa: E402

QUESTION = ("At one row, what brings the int4 GEMV nearer its weight-read floor: the CUDA cores, the offset off the "
            "tensor cores, more bytes in flight, fewer groups a chunk or more programs an SM, and how close does a "
            "bare read of the same bytes come?")
CANDIDATES = ("the plan (kernels/int4_gluon.py)", "the plan with the offset on the ALU, at 1-2 groups a chunk and "
              "2-6 programs an SM", "the CUDA-core kernel", "x once with 1-4 chunks in flight", "the offset as a "
              "sum of x", "a bare read of the weight at 2, 4 and 8 programs an SM")
SHAPES = "K = 4096, N in 4096, 12288, 14336, 11007, M = 1, bfloat16, G = 128"
OUTPUTS = {"int4-fma-1": ("notes/probes/2026-11-27-h200-int4-gemv-fma-1.json",
                          "notes/probes/2026-11-27-h200-int4-gemv-ncu.json"),
           "int4-alu-1": ("notes/probes/2026-11-27-h200-int4-gemv-fma-2.json",),
           "int4-alu-2": ("notes/probes/2026-11-27-h200-int4-gemv-fma-3.json",
                          "notes/probes/2026-11-27-h100-int4-gemv-fma-3.json")}

K, GROUP, BF16 = 4096, 128, torch.bfloat16
NS = (4096, 12288, 14336, 11007)
FMA_VARIANTS = ((2, 2), (1, 2), (2, 3), (2, 4), (1, 4))  # (groups a chunk, programs an SM)
DEEP_VARIANTS = ((2, 2, 1), (2, 2, 2), (2, 2, 3), (1, 2, 4), (2, 3, 2), (2, 1, 3), (2, 1, 4))  # (C, P, D)
XSUM_VARIANTS = ((2, 2), (1, 2), (2, 3), (1, 3), (1, 4))
ALU_VARIANTS = ((1, 2), (2, 3), (1, 3), (1, 4), (1, 6))


@gluon.jit
def _unpack_f32(w):
    # One word -> eight float32 128 + u_j (nibble j at bits 4j of the word), as int32 bit patterns.
    asm: gl.constexpr = ("{\n.reg .b32 t;\n"
                         "shl.b32 t, $8, 16;\nlop3.b32 $0, t, 0x000F0000, 0x43000000, 0xEA;\n"
                         "shl.b32 t, $8, 12;\nlop3.b32 $1, t, 0x000F0000, 0x43000000, 0xEA;\n"
                         "shl.b32 t, $8, 8;\nlop3.b32 $2, t, 0x000F0000, 0x43000000, 0xEA;\n"
                         "shl.b32 t, $8, 4;\nlop3.b32 $3, t, 0x000F0000, 0x43000000, 0xEA;\n"
                         "lop3.b32 $4, $8, 0x000F0000, 0x43000000, 0xEA;\n"
                         "shr.b32 t, $8, 4;\nlop3.b32 $5, t, 0x000F0000, 0x43000000, 0xEA;\n"
                         "shr.b32 t, $8, 8;\nlop3.b32 $6, t, 0x000F0000, 0x43000000, 0xEA;\n"
                         "shr.b32 t, $8, 12;\nlop3.b32 $7, t, 0x000F0000, 0x43000000, 0xEA;\n}")
    return gl.inline_asm_elementwise(asm, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(gl.int32, ) * 8, is_pure=True,
                                     pack=1)


@gluon.jit
def _int4_gemv_fma_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, N, K, stride_sn, G: gl.constexpr,
                          GPC: gl.constexpr, SPLIT: gl.constexpr, KR: gl.constexpr):
    # Thread tau = 32 w + 4 r + t of a 64-row block holds, per group, words c = 0..G/16-1; nibble j = 4p + 2h + i
    # of word c is u at (row 16 w + 8 h + r, k = 16 c + 8 i + 2 t + p) (prepack_int4). Here (row8 = 8 w + r, t, c).
    C: gl.constexpr = G // 16
    GB: gl.constexpr = 128 * C  # words of one group of one block
    NG: gl.constexpr = KR // G  # groups this program walks
    L: gl.constexpr = gl.BlockedLayout([1, 1, C], [8, 4, 1], [4, 1, 1], [2, 1, 0])
    PL: gl.constexpr = gl.SliceLayout(2, L)
    XL: gl.constexpr = gl.SliceLayout(0, L)
    RL: gl.constexpr = gl.SliceLayout(1, PL)
    TL: gl.constexpr = gl.SliceLayout(0, PL)
    SL3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    SL2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])  # also x's bytes, read a [4, C] slice at a time
    SLS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])

    pid = gl.program_id(0)
    tile = pid // SPLIT
    split = pid % SPLIT
    n_groups = K // G
    g0 = split * NG

    r8 = gl.arange(0, 32, layout=RL)
    tt = gl.arange(0, 4, layout=TL)
    cc = gl.arange(0, C, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    lane = (r8[:, None] * 4 + tt[None, :])[:, :, None] * C + cc[None, None, :]
    w_ptrs = w_ptr + (tile.to(gl.int64) * n_groups + g0) * GB + lane
    wb = (gl.load(w_ptrs), )
    for g in gl.static_range(1, GPC):
        wb = wb + (gl.load(w_ptrs + g * GB), )

    # x of this program's groups, float32, in the threads' order: [group * 4 + 2 i + p, t, c]; and each thread's
    # share of every group's sum, [group, t].
    gip = gl.arange(0, NG * 4, layout=gl.SliceLayout(1, PL))
    k_st = (((gip // 4) * G + 8 * ((gip // 2) % 2) + gip % 2)[:, None] + 2 * tt[None, :])[:, :, None] + 16 * cc[None, None, :]
    xs = gl.load(x_ptr + g0 * G + k_st).to(gl.float32)
    x_smem = gl.allocate_shared_memory(gl.float32, [NG * 4, 4, C], SL3, xs)._reinterpret(gl.float32, [NG * 4, 4, C], SL2)
    L2: gl.constexpr = gl.BlockedLayout([1, 1, 4 * C], [8, 4, 1], [4, 1, 1], [2, 1, 0])
    gg = gl.arange(0, NG, layout=gl.SliceLayout(1, gl.SliceLayout(2, L2)))
    t2 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, L2)))
    e2 = gl.arange(0, 4 * C, layout=gl.SliceLayout(0, gl.SliceLayout(1, L2)))
    k_sum = (gg[:, None] * G + 2 * t2[None, :])[:, :, None] + (16 * (e2 % C) + 8 * (e2 // (2 * C)) + (e2 // C) % 2)[None, None, :]
    xsum = gl.sum(gl.load(x_ptr + g0 * G + k_sum).to(gl.float32), axis=2)
    s_smem = gl.allocate_shared_memory(gl.float32, [NG, 4], SL2, xsum)._reinterpret(gl.float32, [NG, 4], SLS)
    gl.thread_barrier()

    row0 = tile * 64 + 16 * (r8 // 8) + r8 % 8
    s_ptrs0 = s_ptr + row0.to(gl.int64) * stride_sn + g0
    s_ptrs1 = s_ptrs0 + 8 * stride_sn
    y0 = gl.zeros([32, 4], gl.float32, PL)
    y1 = gl.zeros([32, 4], gl.float32, PL)
    for i in range(NG // GPC):
        nxt = gl.minimum(i + 1, NG // GPC - 1) * GPC
        wn = (gl.load(w_ptrs + nxt * GB), )
        for g in gl.static_range(1, GPC):
            wn = wn + (gl.load(w_ptrs + (nxt + g) * GB), )
        for g in gl.static_range(GPC):
            q = i * GPC + g
            s0 = gl.load(s_ptrs0 + q).to(gl.float32)
            s1 = gl.load(s_ptrs1 + q).to(gl.float32)
            x00 = x_smem.index(4 * q).load(XL)[None, :, :]
            x01 = x_smem.index(4 * q + 1).load(XL)[None, :, :]
            x10 = x_smem.index(4 * q + 2).load(XL)[None, :, :]
            x11 = x_smem.index(4 * q + 3).load(XL)[None, :, :]
            off = 136.0 * s_smem.index(q).load(TL)[None, :]
            o0, o1, o2, o3, o4, o5, o6, o7 = _unpack_f32(wb[g])
            p0 = gl.sum(o0.to(gl.float32, bitcast=True) * x00 + o1.to(gl.float32, bitcast=True) * x10 +
                        o4.to(gl.float32, bitcast=True) * x01 + o5.to(gl.float32, bitcast=True) * x11, axis=2)
            p1 = gl.sum(o2.to(gl.float32, bitcast=True) * x00 + o3.to(gl.float32, bitcast=True) * x10 +
                        o6.to(gl.float32, bitcast=True) * x01 + o7.to(gl.float32, bitcast=True) * x11, axis=2)
            y0 += s0[:, None] * (p0 - off)
            y1 += s1[:, None] * (p1 - off)
        wb = wn
    r0 = gl.sum(y0, axis=1)
    r1 = gl.sum(y1, axis=1)

    local = 16 * (r8 // 8) + r8 % 8
    is_last = True
    if SPLIT > 1:
        base = part_ptr + tile.to(gl.int64) * (SPLIT * 64)
        gl.store(base + split * 64 + local, r0)
        gl.store(base + split * 64 + local + 8, r1)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        is_last = arrived == SPLIT - 1
        if is_last:
            r0 = gl.zeros([32], gl.float32, RL)
            r1 = gl.zeros([32], gl.float32, RL)
            for j in range(SPLIT):
                r0 += gl.load(base + j * 64 + local, cache_modifier=".cg")
                r1 += gl.load(base + j * 64 + local + 8, cache_modifier=".cg")
            gl.atomic_xchg(count_ptr + tile, 0)
    if is_last:
        gl.store(y_ptr + row0, r0.to(y_ptr.dtype.element_ty), mask=row0 < N)
        gl.store(y_ptr + row0 + 8, r1.to(y_ptr.dtype.element_ty), mask=row0 + 8 < N)


def int4_gemv_fma(x, packed, out=None, gpc=2, per_sm=2):
    """y [1, N] = x [1, K] @ W^T on the CUDA cores; the split as the plan's at `per_sm` programs an SM."""
    n, kk = packed.n_cols, packed.n_features
    meta = ig.plan_int4_gluon(1, n, kk, GROUP, gpc=gpc, per_sm=per_sm, sm_count=device_sm_count(x.device))
    split, n_tiles = meta["SPLIT"], triton.cdiv(n, 64)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device) if out is None else out
    part, counts = workspace(n_tiles * split * 64, n_tiles, x.device) if split > 1 else (out, out)
    _int4_gemv_fma_kernel[(n_tiles * split, )](x, packed.weight.view(torch.int32), packed.scales, out, part, counts, n,
                                               kk, packed.scales.stride(0), G=GROUP, GPC=gpc, SPLIT=split,
                                               KR=kk // split, num_warps=4)
    return out


@gluon.jit
def _operand_alu(w, a_layout: gl.constexpr, G: gl.constexpr):
    # The plain operand (bfloat16), each pair's 136 taken off by one packed subtract: Q = u - 8, exact.
    o0, o1, o2, o3, o4, o5, o6, o7 = ig._unpack_q(w, gl.bfloat16, 0x43004300, 0x43084308, "sub.rn.bf16x2")
    return int4_arrange(o0, o1, o2, o3, o4, o5, o6, o7, a_layout, G)


@gluon.jit
def _finish_row(y, y_ptr, part_ptr, count_ptr, tile, split, rows, cols, N, SPLIT: gl.constexpr,
                acc_layout: gl.constexpr, row_layout: gl.constexpr):
    # Row 0 of the [64, 8] fp32 partial: this program's share, counted in; the last to arrive sums all splits in
    # split order and stores y.
    MP: gl.constexpr = 8
    col_in = (cols < 1)[None, :]
    is_last = True
    if SPLIT > 1:
        base = part_ptr + tile.to(gl.int64) * (SPLIT * 64 * MP)
        offs = gl.arange(0, 64, layout=row_layout)[:, None] * MP + cols[None, :]
        gl.store(base + split * (64 * MP) + offs, y, mask=col_in)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        is_last = arrived == SPLIT - 1
        if is_last:
            y = gl.zeros([64, MP], gl.float32, acc_layout)
            for j in range(SPLIT):
                y += gl.load(base + j * (64 * MP) + offs, mask=col_in, other=0.0, cache_modifier=".cg")
            gl.atomic_xchg(count_ptr + tile, 0)
    if is_last:
        gl.store(y_ptr + cols[None, :] * 0 + rows[:, None], y.to(y_ptr.dtype.element_ty), mask=col_in & (rows < N)[:, None])


@gluon.jit
def _int4_gemv_alu_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, N, K, stride_sn, G: gl.constexpr,
                          GPC: gl.constexpr, SPLIT: gl.constexpr, XSUM: gl.constexpr = False, NG: gl.constexpr = 1):
    # kernels/int4_gluon.py's _int4_gemv_kernel at M = 1 (MP = 8, one warpgroup), one MMA a group. XSUM: the
    # words unpacked to 128 + u as the plan does, and 136 * sum_k x (each of the program's NG groups' sums, worked
    # out once into shared memory) taken off each group's product instead.
    MP: gl.constexpr = 8
    GB: gl.constexpr = 128 * G // 16
    DT: gl.constexpr = x_ptr.dtype.element_ty
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, MP, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    b_layout: gl.constexpr = gl.BlockedLayout([1, G // 16], [32, 1], [4, 1], [1, 0])
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (G // 8), G // 8], [4, 1], [1, 0])
    x_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MP, G], DT)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    pid = gl.program_id(0)
    tile = pid // SPLIT
    split = pid % SPLIT
    n_groups = K // G
    n_iter = n_groups // (SPLIT * GPC)
    g0 = split * n_iter * GPC
    tau = gl.arange(0, 128, layout=gl.SliceLayout(1, b_layout))
    offs_b = gl.arange(0, G // 16, layout=gl.SliceLayout(0, b_layout))
    w_ptrs = w_ptr + ((tile.to(gl.int64) * n_groups + g0) * GB + tau * (G // 16))[:, None] + offs_b[None, :]
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, x_layout))
    xk = gl.arange(0, G, layout=gl.SliceLayout(0, x_layout))
    x_ptrs = x_ptr + (xm * 0)[:, None] + (g0 * G + xk)[None, :]
    x_mask = (xm < 1)[:, None]
    rows = tile * 64 + gl.arange(0, 64, layout=row_layout)
    s_ptrs = s_ptr + rows.to(gl.int64) * stride_sn + g0
    x_smem = gl.allocate_shared_memory(DT, [GPC, MP, G], x_smem_layout)
    wb = (gl.load(w_ptrs), )
    xb = (gl.load(x_ptrs, mask=x_mask, other=0.0), )
    for g in gl.static_range(1, GPC):
        wb = wb + (gl.load(w_ptrs + g * GB), )
        xb = xb + (gl.load(x_ptrs + g * G, mask=x_mask, other=0.0), )
    y = gl.zeros([64, MP], gl.float32, acc_layout)
    zero = gl.zeros([64, MP], gl.float32, acc_layout)
    cols = gl.arange(0, MP, layout=col_layout)
    if XSUM:
        xs_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        sq = gl.arange(0, NG, layout=gl.SliceLayout(1, xs_layout))
        sk = gl.arange(0, G, layout=gl.SliceLayout(0, xs_layout))
        xsum = gl.sum(gl.load(x_ptr + g0 * G + sq[:, None] * G + sk[None, :]).to(gl.float32), axis=1)
        xsum = gl.where(gl.arange(0, MP, layout=gl.SliceLayout(0, xs_layout))[None, :] == 0, xsum[:, None], 0.0)
        xs_smem = gl.allocate_shared_memory(gl.float32, [NG, MP], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]),
                                            (136.0 * xsum))._reinterpret(
                                                gl.float32, [NG, MP], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    for i in range(n_iter):
        nxt = gl.minimum(i + 1, n_iter - 1) * GPC
        wn = (gl.load(w_ptrs + nxt * GB), )
        xn = (gl.load(x_ptrs + nxt * G, mask=x_mask, other=0.0), )
        for g in gl.static_range(1, GPC):
            wn = wn + (gl.load(w_ptrs + (nxt + g) * GB), )
            xn = xn + (gl.load(x_ptrs + (nxt + g) * G, mask=x_mask, other=0.0), )
        gl.thread_barrier()
        for g in gl.static_range(GPC):
            x_smem.index(g).store(xb[g])
        fence_async_shared()
        gl.thread_barrier()
        for g in gl.static_range(GPC):
            s = gl.load(s_ptrs + (i * GPC + g)).to(gl.float32)
            if XSUM:
                a = int4_operand_plain(wb[g], a_layout, DT, 0x43004300, G)
                p = warpgroup_mma(a, x_smem.index(g).permute((1, 0)), zero, use_acc=False)
                y += s[:, None] * (p - xs_smem.index(i * GPC + g).load(col_layout)[None, :])
            else:
                a = _operand_alu(wb[g], a_layout, G)
                p = warpgroup_mma(a, x_smem.index(g).permute((1, 0)), zero, use_acc=False)
                y += s[:, None] * p
        wb = wn
        xb = xn
    _finish_row(y, y_ptr, part_ptr, count_ptr, tile, split, rows, cols, N, SPLIT, acc_layout, row_layout)


def int4_gemv_alu(x, packed, out=None, gpc=2, per_sm=2, xsum=False):
    """The plan's kernel at M = 1 with the offset subtracted on the ALU (bfloat16 only), or (xsum) taken off each
    group's product as 136 * sum_k x."""
    n, kk = packed.n_cols, packed.n_features
    meta = ig.plan_int4_gluon(1, n, kk, GROUP, gpc=gpc, per_sm=per_sm, sm_count=device_sm_count(x.device))
    split, n_tiles = meta["SPLIT"], triton.cdiv(n, 64)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device) if out is None else out
    part, counts = workspace(n_tiles * split * 64 * 8, n_tiles, x.device) if split > 1 else (out, out)
    _int4_gemv_alu_kernel[(n_tiles * split, )](x, packed.weight.view(torch.int32), packed.scales, out, part, counts, n,
                                               kk, packed.scales.stride(0), G=GROUP, GPC=gpc, SPLIT=split, XSUM=xsum,
                                               NG=kk // GROUP // split, num_warps=4)
    return out


@gluon.jit
def _int4_gemv_deep_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, N, K, stride_sn, G: gl.constexpr,
                           GPC: gl.constexpr, SPLIT: gl.constexpr, NG: gl.constexpr, DEPTH: gl.constexpr):
    # The "alu" kernel with x staged in shared memory once for the program's NG groups (no barrier in the loop)
    # and the weight words and scales of DEPTH chunks in flight ahead of the chunk in use.
    MP: gl.constexpr = 8
    GB: gl.constexpr = 128 * G // 16
    DT: gl.constexpr = x_ptr.dtype.element_ty
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, MP, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    b_layout: gl.constexpr = gl.BlockedLayout([1, G // 16], [32, 1], [4, 1], [1, 0])
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (G // 8), G // 8], [4, 1], [1, 0])
    x_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MP, G], DT)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    n_iter: gl.constexpr = NG // GPC
    pid = gl.program_id(0)
    tile = pid // SPLIT
    split = pid % SPLIT
    n_groups = K // G
    g0 = split * NG
    tau = gl.arange(0, 128, layout=gl.SliceLayout(1, b_layout))
    offs_b = gl.arange(0, G // 16, layout=gl.SliceLayout(0, b_layout))
    w_ptrs = w_ptr + ((tile.to(gl.int64) * n_groups + g0) * GB + tau * (G // 16))[:, None] + offs_b[None, :]
    rows = tile * 64 + gl.arange(0, 64, layout=row_layout)
    s_ptrs = s_ptr + rows.to(gl.int64) * stride_sn + g0
    wb = ()
    sb = ()
    for d in gl.static_range(DEPTH):
        for g in gl.static_range(GPC):
            wb = wb + (gl.load(w_ptrs + (min(d, n_iter - 1) * GPC + g) * GB), )
            sb = sb + (gl.load(s_ptrs + (min(d, n_iter - 1) * GPC + g)), )
    # x of all NG groups (a store a group: each is followed by a barrier, which the timings include)
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, x_layout))
    xk = gl.arange(0, G, layout=gl.SliceLayout(0, x_layout))
    x_ptrs = x_ptr + (xm * 0)[:, None] + (g0 * G + xk)[None, :]
    x_mask = (xm < 1)[:, None]
    x_smem = gl.allocate_shared_memory(DT, [NG, MP, G], x_smem_layout)
    for q in gl.static_range(NG):
        x_smem.index(q).store(gl.load(x_ptrs + q * G, mask=x_mask, other=0.0))
    fence_async_shared()
    gl.thread_barrier()
    y = gl.zeros([64, MP], gl.float32, acc_layout)
    zero = gl.zeros([64, MP], gl.float32, acc_layout)
    for i in range(n_iter):
        nxt = gl.minimum(i + DEPTH, n_iter - 1) * GPC
        wn = ()
        sn = ()
        for g in gl.static_range(GPC):
            wn = wn + (gl.load(w_ptrs + (nxt + g) * GB), )
            sn = sn + (gl.load(s_ptrs + (nxt + g)), )
        for g in gl.static_range(GPC):
            a = _operand_alu(wb[g], a_layout, G)
            p = warpgroup_mma(a, x_smem.index(i * GPC + g).permute((1, 0)), zero, use_acc=False)
            y += sb[g].to(gl.float32)[:, None] * p
        wr = ()
        sr = ()
        for j in gl.static_range(GPC, DEPTH * GPC):
            wr = wr + (wb[j], )
            sr = sr + (sb[j], )
        wb = wr + wn
        sb = sr + sn
    cols = gl.arange(0, MP, layout=col_layout)
    _finish_row(y, y_ptr, part_ptr, count_ptr, tile, split, rows, cols, N, SPLIT, acc_layout, row_layout)


def int4_gemv_deep(x, packed, out=None, gpc=2, per_sm=2, depth=2):
    """The "alu" kernel with x staged once and `depth` chunks of words and scales in flight."""
    n, kk = packed.n_cols, packed.n_features
    meta = ig.plan_int4_gluon(1, n, kk, GROUP, gpc=gpc, per_sm=per_sm, sm_count=device_sm_count(x.device))
    split, n_tiles = meta["SPLIT"], triton.cdiv(n, 64)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device) if out is None else out
    part, counts = workspace(n_tiles * split * 64 * 8, n_tiles, x.device) if split > 1 else (out, out)
    _int4_gemv_deep_kernel[(n_tiles * split, )](x, packed.weight.view(torch.int32), packed.scales, out, part, counts,
                                                n, kk, packed.scales.stride(0), G=GROUP, GPC=gpc, SPLIT=split,
                                                NG=kk // GROUP // split, DEPTH=depth, num_warps=4)
    return out


@triton.jit
def _read_kernel(w_ptr, out_ptr, n_words, PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr):
    # Each program xors its contiguous run of words into one word (so the loads cannot be dropped).
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    start = pid.to(tl.int64) * PER_PROGRAM
    for i in range(0, PER_PROGRAM, BLOCK):
        idx = start + i + offs
        acc ^= tl.load(w_ptr + idx, mask=idx < n_words, other=0)
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def bare_read(words, out, per_sm):
    n = words.numel()
    programs = per_sm * device_sm_count(words.device)
    per = triton.cdiv(triton.cdiv(n, programs), 1024) * 1024
    _read_kernel[(triton.cdiv(n, per), )](words, out, n, PER_PROGRAM=per, BLOCK=1024, num_warps=4)


def measure(out_path: Path, ns, candidates, only=()) -> int:
    """Time every candidate (name, fn(x, packed, out=None), checked) at M = 1 for each N: graph clock, weights
    rotated past L2; checked candidates' outputs against float64, into NaN-filled buffers. Writes out_path."""
    ceiling = copy_ceiling_gbs()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_ceiling_gbs": round(ceiling, 1), "K": K, "group": GROUP, "M": 1, "rows": [], "failures": []}
    print(f"{result['device']}: copy ceiling {ceiling:.0f} GB/s", flush=True)
    for n in ns:
        floor = (n * K // 2 + 2 * n * (K // GROUP)) / ceiling / 1e3
        w = (torch.randn(n, K, device="cuda") / K**0.5).to(BF16)
        p, s = quantize_int4(w, GROUP)
        ref = dequantize_int4(p, s, GROUP, BF16).double()
        packs = int4_prepacked_copies(p, s, GROUP, n * K // 2)
        x = torch.randn(1, K, device="cuda").to(BF16)
        want = x.double() @ ref.t()
        for name, fn, checked in candidates:
            if only and not name.startswith(tuple(only)):
                continue
            row = {"provider": name, "N": n, "floor_us": round(floor, 2)}
            try:
                if checked:
                    y = fn(x, packs[0], torch.full((1, n), float("nan"), dtype=BF16, device="cuda"))
                    row["rel_err"] = rel_err(y, want)
                    if not row["rel_err"] < 1e-2:
                        result["failures"].append(f"{name} N={n}: rel_err {row['rel_err']:.3g}")
                row["us"] = round(graph_us(fn, [(x, pk) for pk in packs]), 2)
                row["us_again"] = round(graph_us(fn, [(x, pk) for pk in packs]), 2)
                row["pct_floor"] = round(100 * floor / min(row["us"], row["us_again"]), 1)
            except Exception as exc:  # noqa: BLE001 - recorded, the probe goes on
                row["error"] = f"{type(exc).__name__}: {str(exc)[-400:]}"
                traceback.print_exc()
            result["rows"].append(row)
            print(f"N={n:>6} {name:<16} " + (f"{row['us']:7.2f} / {row['us_again']:7.2f} us {row['pct_floor']:5.1f}% "
                                            f"err {row.get('rel_err', float('nan')):.2e}" if "us" in row else
                                            row.get("error", "")[:200]), flush=True)
            out_path.write_text(json.dumps(result, indent=1))
        del packs
        torch.cuda.empty_cache()
    print("failures:", result["failures"] or "none")
    return 1 if result["failures"] else 0


def arguments(doc: str):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("out_dir")
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--only", default="", help="comma-separated name prefixes of the candidates to run (all: empty)")
    return ap


def profile_once(n: int, names: list[str]) -> int:
    w = (torch.randn(n, K, device="cuda") / K**0.5).to(BF16)
    packed = ig.prepack_int4(*quantize_int4(w, GROUP), GROUP)
    x = torch.randn(1, K, device="cuda").to(BF16)
    sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    calls = {"plan": lambda: ig.int4_linear_gluon(x, packed, GROUP), "alu": lambda: int4_gemv_alu(x, packed),
             "fma": lambda: int4_gemv_fma(x, packed), "read8": lambda: bare_read(packed.weight.view(torch.int32), sink, 8)}
    for name in names:
        calls[name]()
    torch.cuda.synchronize()
    return 0


def candidates(which: str, sink: torch.Tensor) -> list:
    cands = [("plan", lambda x, w, y=None: ig.int4_linear_gluon(x, w, GROUP, y), True),
             ("alu", lambda x, w, y=None: int4_gemv_alu(x, w, y), True)]
    if which == "fma":
        cands += [(f"fma c{c} p{ps}", lambda x, w, y=None, c=c, ps=ps: int4_gemv_fma(x, w, y, c, ps), True)
                  for c, ps in FMA_VARIANTS]
        return cands + [(f"read p{ps}", lambda x, w, ps=ps: bare_read(w.weight.view(torch.int32), sink, ps), False)
                        for ps in (2, 4, 8)]
    cands += [(f"xsum c{c} p{ps}", lambda x, w, y=None, c=c, ps=ps: int4_gemv_alu(x, w, y, c, ps, True), True)
              for c, ps in XSUM_VARIANTS]
    cands += [(f"alu c{c} p{ps}", lambda x, w, y=None, c=c, ps=ps: int4_gemv_alu(x, w, y, c, ps), True)
              for c, ps in ALU_VARIANTS]
    cands += [(f"deep c{c} p{ps} d{d}", lambda x, w, y=None, c=c, ps=ps, d=d: int4_gemv_deep(x, w, y, c, ps, d), True)
              for c, ps, d in DEEP_VARIANTS]
    return cands + [("read p8", lambda x, w: bare_read(w.weight.view(torch.int32), sink, 8), False)]


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--round", choices=("fma", "alu"), default="fma")
    ap.add_argument("--profile", default="", help="run these kernels once each at the first N, for a profiler")
    args = ap.parse_args()
    if args.profile:
        return profile_once(int(args.ns.split(",")[0]), args.profile.split(","))
    sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return measure(out / f"int4_gemv_{args.round}.json", [int(v) for v in args.ns.split(",")],
                   candidates(args.round, sink), [v for v in args.only.split(",") if v])


if __name__ == "__main__":
    sys.exit(main())
