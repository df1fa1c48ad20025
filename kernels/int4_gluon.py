"""The int4 weight-only decode GEMV for Hopper (sm_90) in Gluon: kernels/dequant_linear.py's int4_linear with
the weight's bytes loaded straight into the registers the warpgroup MMA reads.

    y_mn = sum_g s_ng * sum_{k in g} x_mk q_nk,        q = u - 8 in -8..7, s [N, K/G] (groups of G)

Why: the Triton kernel spends 4.2-4.7 instructions a weight moving each byte into the MMA's fragment order
(shared memory, PRMT) and stalls near 40% of its weight-read floor. Here the order is paid once, on the host.

Roles. W is the MMA's first operand, from registers: a program holds BLOCK_N = 64 * WG rows of W (WG
warpgroups) and x^T [G, MP] (M padded to MP = 8, 16, 32 or 64 columns) is the second, from shared memory, so
every M up to 64 is one launch, one N = MP MMA a k-step. A program walks its run of K in chunks of GPC groups;
chunk i + 1's words and x are loaded into registers before chunk i is unpacked and multiplied (split-K over the
rest of K).

Layout (prepack_int4). wgmma's register operand gives lane l of warp w, for each 16-wide k-step c, the four
bf16x2 registers (h, i) = (row 16w + 8h + l/4, k = 16c + 8i + 2(l%4) + {0, 1}). prepack_int4 writes, per 64
rows and group, 128 threads x G/4 bytes: thread 32w + l's word c (one k-step) holds nibble j = 4p + 2h + i
= u at (row 16w + 8h + l/4, k = 16c + 8i + 2(l%4) + p). A thread's G/4 bytes are contiguous (two 16-byte
loads at G = 128, a warp reads 1 KB in a row) and, shifted by 4(2h + i), a word's nibbles (j, j + 4) sit at
bits 0-3 and 16-19: the two halves of register (h, i).

Maths. One LOP3 a register: (w >> 4(2h + i)) & 0x000F000F | 0x43004300 is two bfloat16 128 + u (float16:
0x6400, 1024 + u), exact, and one packed subtract of 136 (float16: 1032) leaves the pair q = u - 8, exact; three
shifts, four LOP3 and four subtracts a word of eight weights. Per group, in fp32:

    y_nm += s_ng * P_nm,      P = Q_g x_g^T   (one MMA chain, K = G)

The product is exact q * x rather than bf16(q * s) * x (the scale applies to the fp32 partial, as the
Triton kernel's one-group-a-step form does). The offset was first removed by a second MMA on the same x with a
constant -136 operand; on the ALU it costs four HADD2 a word where the MMA doubled the tensor-core work, and
that change alone ran 1.05-1.10x faster at one row on an H200 and 1.02-1.04x on an H100 (notes/dequant-linear.md,
"int4 at one row").

Split-K: SPLIT programs share a tile (the smallest power of two giving PROGRAMS_PER_SM programs an SM, at most
one a chunk). Each walks chunks // SPLIT chunks of its K, the first chunks % SPLIT one more, so a K whose chunks
do not divide (11008: 86 groups, 2 x 43) still splits as far as it needs. Each leaves its fp32 partial
[BLOCK_N, M] in a workspace and the last to arrive sums them in the order 0..SPLIT-1 (deterministic;
kernels/_gemv.py). Bytes: N*K/2 + N*(K/G)*s_size (weights, scales), M*K*size a program (x, from L2), M*N*size
(y). Measured in notes/dequant-linear.md: at M = 1 (K = 4096, N = 4096 / 12288 / 14336 / 11007, GPU time) the
share of the copy ceiling is 28 / 54 / 58 / 50% on an H100 (dequant-linear-decode 20261127T170326Z) and 21 /
42 / 46 / 37% on an H200 (20261127T142425Z); a cp.async ring three times deeper and x staged once with up to
four chunks in flight were slower and were dropped. Reached through kernels.dequant_linear.int4_linear with
prepack_int4's weight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from kernels._gemv import DEFAULT_SM_COUNT, device_sm_count, workspace
from kernels._launch import aligned, bind
from kernels.quantize import GROUP_SIZES, INT4_OFFSET, check_group_size, unpack_int4

BLOCK_ROWS = 64  # rows of W a warpgroup holds (the wgmma's M)
ROWS = gl.constexpr(BLOCK_ROWS)
MAX_M = 64  # rows one launch holds (MP = 64: 208 registers a thread at one group a chunk, no spills)
# (magic bits of two 128 + u or 1024 + u, the value of v - q)
_MAGIC = {torch.bfloat16: (0x43004300, 136.0), torch.float16: (0x64006400, 1032.0)}
# (v - q for each half of a pair, the packed subtract): the offset taken off on the ALU
_OFFSET = {torch.bfloat16: (0x43084308, "sub.rn.bf16x2"), torch.float16: (0x64086408, "sub.rn.f16x2")}
_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


# --------------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------------


@gluon.jit
def _unpack_q(w, DT: gl.constexpr, MAGIC_BITS: gl.constexpr, OFFSET_BITS: gl.constexpr, SUB: gl.constexpr):
    # One word (a thread's k-step) -> eight 16-bit q = u - 8, exact: (w >> 4j) & 0x000F000F | MAGIC is the pair
    # (128 + u) of nibbles (j, j + 4), j = 2h + i, register (h, i) of the step; one packed subtract of (v - q,
    # v - q) then leaves q.
    asm: gl.constexpr = ("{\n.reg .b32 t, v, c;\n"
                         f"mov.b32 c, {OFFSET_BITS:#x};\n"
                         f"lop3.b32 v, $8, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\n{SUB} v, v, c;\nmov.b32 {{$0, $1}}, v;\n"
                         "shr.b32 t, $8, 4;\n"
                         f"lop3.b32 v, t, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\n{SUB} v, v, c;\nmov.b32 {{$2, $3}}, v;\n"
                         "shr.b32 t, $8, 8;\n"
                         f"lop3.b32 v, t, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\n{SUB} v, v, c;\nmov.b32 {{$4, $5}}, v;\n"
                         "shr.b32 t, $8, 12;\n"
                         f"lop3.b32 v, t, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\n{SUB} v, v, c;\nmov.b32 {{$6, $7}}, v;\n}}")
    return gl.inline_asm_elementwise(asm, "=h,=h,=h,=h,=h,=h,=h,=h,r", [w], dtype=(DT.value, ) * 8, is_pure=True,
                                     pack=1)


@gluon.jit
def _operand(w, a_layout: gl.constexpr, DT: gl.constexpr, MAGIC_BITS: gl.constexpr, G: gl.constexpr,
             OFFSET_BITS: gl.constexpr, SUB: gl.constexpr):
    # w: int32 [T, G/16], thread tau's own words -> Q [BLOCK_N, G] in the MMA's register layout. Joins, reshapes
    # and permutes only rename registers: (tau = 32w + 4r + t, word c, nibble 4p + 2h + i) -> (16w + 8h + r,
    # 16c + 8i + 2t + p); the final conversion is checked trivial.
    T: gl.constexpr = w.shape[0]
    o0, o1, o2, o3, o4, o5, o6, o7 = _unpack_q(w, DT, MAGIC_BITS, OFFSET_BITS, SUB)
    v = gl.join(gl.join(gl.join(o0, o1), gl.join(o2, o3)), gl.join(gl.join(o4, o5), gl.join(o6, o7)))
    v = gl.reshape(v, [T // 32, 8, 4, G // 16, 2, 2, 2])  # (w, r, t, c, p, i, h)
    v = gl.permute(v, (0, 6, 1, 3, 5, 2, 4))  # (w, h, r, c, i, t, p)
    v = gl.reshape(v, [T // 2, G])
    return gl.convert_layout(v, a_layout, assert_trivial=True)


@gluon.jit
def _int4_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_sn, stride_ym,
                      G: gl.constexpr, GPC: gl.constexpr, WG: gl.constexpr, MP: gl.constexpr, SPLIT: gl.constexpr,
                      MAGIC_BITS: gl.constexpr, OFFSET_BITS: gl.constexpr, SUB: gl.constexpr):
    T: gl.constexpr = 128 * WG  # threads
    BLOCK_N: gl.constexpr = ROWS * WG
    GB: gl.constexpr = 128 * G // 16  # words of one group of one 64-row block
    DT: gl.constexpr = x_ptr.dtype.element_ty
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1],
                                                         instr_shape=[16, MP, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    b_layout: gl.constexpr = gl.BlockedLayout([1, G // 16], [32, 1], [4 * WG, 1], [1, 0])
    XT: gl.constexpr = 32 if G >= 256 else G // 8  # threads along k of x's tile: one element a thread once
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // XT, XT], [4 * WG, 1], [1, 0])
    x_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MP, G], DT)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)

    pid = gl.program_id(0)
    tile = pid // SPLIT
    split = pid % SPLIT
    n_groups = K // G
    n_chunks = n_groups // GPC
    # Chunks of GPC groups this program walks: n_chunks // SPLIT, one more for the first n_chunks % SPLIT splits.
    extra = n_chunks % SPLIT
    n_iter = n_chunks // SPLIT + (split < extra).to(gl.int32)
    g0 = (split * (n_chunks // SPLIT) + gl.minimum(split, extra)) * GPC

    # Pointers to chunk 0: thread tau's G/4 bytes of each group, and x's [MP, G] tile of each group (rows past
    # M read as zeros).
    tau = gl.arange(0, T, layout=gl.SliceLayout(1, b_layout))
    offs_b = gl.arange(0, G // 16, layout=gl.SliceLayout(0, b_layout))
    blk = gl.minimum(tile * WG + tau // 128, gl.cdiv(N, ROWS) - 1)  # a last tile past N re-reads real rows
    w_offs = (blk.to(gl.int64) * n_groups + g0) * GB + (tau % 128) * (G // 16)
    w_ptrs = w_ptr + w_offs[:, None] + offs_b[None, :]
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, x_layout))
    xk = gl.arange(0, G, layout=gl.SliceLayout(0, x_layout))
    x_ptrs = x_ptr + xm.to(gl.int64)[:, None] * stride_xm + (g0 * G + xk)[None, :]
    x_mask = (xm < M)[:, None]
    rows = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_layout)
    s_ptrs = s_ptr + rows.to(gl.int64) * stride_sn + g0
    x_smem = gl.allocate_shared_memory(DT, [GPC, MP, G], x_smem_layout)

    # Chunk i + 1's bytes and x are loaded (into registers) before chunk i is unpacked and multiplied: GPC * G/4
    # bytes a thread in flight while the tensor cores work. The last chunk loads itself again (from L2).
    wb = (gl.load(w_ptrs), )
    xb = (gl.load(x_ptrs, mask=x_mask, other=0.0), )
    for g in gl.static_range(1, GPC):
        wb = wb + (gl.load(w_ptrs + g * GB), )
        xb = xb + (gl.load(x_ptrs + g * G, mask=x_mask, other=0.0), )
    y = gl.zeros([BLOCK_N, MP], gl.float32, acc_layout)
    zero = gl.zeros([BLOCK_N, MP], gl.float32, acc_layout)
    for i in range(n_iter):
        nxt = gl.minimum(i + 1, n_iter - 1) * GPC
        wn = (gl.load(w_ptrs + nxt * GB), )
        xn = (gl.load(x_ptrs + nxt * G, mask=x_mask, other=0.0), )
        for g in gl.static_range(1, GPC):
            wn = wn + (gl.load(w_ptrs + (nxt + g) * GB), )
            xn = xn + (gl.load(x_ptrs + (nxt + g) * G, mask=x_mask, other=0.0), )
        gl.thread_barrier()  # the previous chunk's products have read x_smem
        for g in gl.static_range(GPC):
            x_smem.index(g).store(xb[g])
        fence_async_shared()
        gl.thread_barrier()
        for g in gl.static_range(GPC):
            s = gl.load(s_ptrs + (i * GPC + g), mask=rows < N, other=0.0).to(gl.float32)
            a = _operand(wb[g], a_layout, DT, MAGIC_BITS, G, OFFSET_BITS, SUB)
            p = warpgroup_mma(a, x_smem.index(g).permute((1, 0)), zero, use_acc=False)
            y += s[:, None] * p
        wb = wn
        xb = xn

    cols = gl.arange(0, MP, layout=col_layout)
    col_in = (cols < M)[None, :]
    is_last = True
    if SPLIT > 1:
        # This program's partial, then count in; the last to arrive sums all in split order.
        base = part_ptr + tile.to(gl.int64) * (SPLIT * BLOCK_N * MP)
        offs = gl.arange(0, BLOCK_N, layout=row_layout)[:, None] * MP + cols[None, :]
        gl.store(base + split * (BLOCK_N * MP) + offs, y, mask=col_in)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        is_last = arrived == SPLIT - 1
        if is_last:
            y = gl.zeros([BLOCK_N, MP], gl.float32, acc_layout)
            for j in range(SPLIT):
                y += gl.load(base + j * (BLOCK_N * MP) + offs, mask=col_in, other=0.0, cache_modifier=".cg")
            gl.atomic_xchg(count_ptr + tile, 0)
    if is_last:
        out = y_ptr + cols.to(gl.int64)[None, :] * stride_ym + rows[:, None]
        gl.store(out, y.to(y_ptr.dtype.element_ty), mask=col_in & (rows < N)[:, None])


# --------------------------------------------------------------------------------------------------------
# Prepacking (once per weight, plain PyTorch)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int4Prepacked:
    """The weight in the kernel's order: `weight` uint8 [N_pad / 64, K / G, 128, G / 4] (N_pad = N rounded up to
    64; padded rows hold q = 0), `scales` [N_pad, K / G] (padded rows 0)."""

    weight: torch.Tensor
    scales: torch.Tensor
    n_cols: int
    n_features: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """[N, K] of the weight it holds."""
        return (self.n_cols, self.n_features)

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def unprepack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_packed uint8 [N, K/2], scales [N, K/G]) in quantize_int4's layout (unprepack_int4)."""
        return unprepack_int4(self)

    @cached_property
    def words(self) -> torch.Tensor:
        """`weight` viewed as the int32 words the kernel loads (one view, made on first use)."""
        return self.weight.view(torch.int32)


def prepack_int4(w_packed: torch.Tensor, scales: torch.Tensor, group_size: int = 128) -> Int4Prepacked:
    """quantize_int4's (w_packed uint8 [N, K/2], scales [N, K/G]) reordered for _int4_gemv_kernel: an
    Int4Prepacked holding the weight in that order alone (callers drop the plain tensors)."""
    for name, t in (("w_packed", w_packed), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"prepack_int4: {name} must be a torch.Tensor, got {type(t).__name__}.")
    if w_packed.dtype != torch.uint8 or w_packed.dim() != 2:
        raise TypeError(f"prepack_int4: w_packed must be uint8 [N, K/2] (quantize_int4), got "
                        f"{str(w_packed.dtype).removeprefix('torch.')} of shape {tuple(w_packed.shape)}.")
    n_cols, n_features = w_packed.shape[0], 2 * w_packed.shape[1]
    check_group_size("prepack_int4", group_size, n_features)
    if tuple(scales.shape) != (n_cols, n_features // group_size):
        raise ValueError(f"prepack_int4: scales must have shape [N, K/G] = {(n_cols, n_features // group_size)}, "
                         f"got {tuple(scales.shape)}.")
    n_pad = triton.cdiv(n_cols, BLOCK_ROWS) * BLOCK_ROWS
    u = torch.full((n_pad, n_features), INT4_OFFSET, dtype=torch.uint8, device=w_packed.device)
    u[:n_cols] = (unpack_int4(w_packed, group_size) + INT4_OFFSET).to(torch.uint8)
    g = group_size
    # u[64 blk + 16 w + 8 h + r, G gi + 16 c + 8 i + 2 t + p] -> [blk, gi, 32 w + 4 r + t, c, nibble 4p + 2h + i]
    u = u.view(n_pad // BLOCK_ROWS, 4, 2, 8, n_features // g, g // 16, 2, 4, 2)  # blk w h r gi c i t p
    u = u.permute(0, 4, 1, 3, 7, 5, 8, 2, 6).reshape(n_pad // BLOCK_ROWS, n_features // g, 128, g // 16, 4, 2)
    weight = (u[..., 0] | (u[..., 1] << 4)).reshape(n_pad // BLOCK_ROWS, n_features // g, 128, g // 4).contiguous()
    s = torch.zeros((n_pad, n_features // g), dtype=scales.dtype, device=scales.device)
    s[:n_cols] = scales
    return Int4Prepacked(weight, s, n_cols, n_features, g)


def unprepack_int4(packed: Int4Prepacked) -> tuple[torch.Tensor, torch.Tensor]:
    """prepack_int4's inverse: (w_packed uint8 [N, K/2], scales [N, K/G]) in quantize_int4's layout."""
    g, n, k = packed.group_size, packed.n_cols, packed.n_features
    b = packed.weight.reshape(-1, k // g, 128, g // 16, 4)
    u = torch.stack([b & 0xF, b >> 4], dim=-1)  # blk gi (w r t) c j=(p h i)
    u = u.view(-1, k // g, 4, 8, 4, g // 16, 2, 2, 2)  # blk gi w r t c p h i
    u = u.permute(0, 2, 7, 3, 1, 5, 8, 4, 6).reshape(-1, k)[:n]  # blk w h r gi c i t p
    half = g // 2
    u = u.reshape(n, k // g, g)
    w_packed = (u[:, :, :half] | (u[:, :, half:] << 4)).reshape(n, k // 2).contiguous()
    return w_packed, packed.scales[:n].contiguous()


# --------------------------------------------------------------------------------------------------------
# Plan and launcher
# --------------------------------------------------------------------------------------------------------

# Groups a chunk: the largest dividing K/G, at most MAX_K_PER_CHUNK of k. Measured (H100, graph clock, K = 4096,
# notes/probes/2026-11-27-h100-int4-gluon.json): 2 groups (104 registers, 4 programs an SM fit) 17.3 us at
# N = 14336, M = 1, against 22.3 with 4 groups (183 registers); 2 programs an SM beat 4 at every N.
GPC_CHOICES = (2, 1)
MAX_K_PER_CHUNK = 256  # 64 bytes a thread in flight beside the chunk in use
# At MP = 8 (M <= 8), with the offset taken off on the ALU: one group a chunk (71 registers compiled for sm_90a,
# 7 programs an SM fit) and at least NARROW_PROGRAMS_PER_SM programs an SM. Measured (graph clock, K = 4096,
# M = 1, N = 4096 / 12288 / 14336 / 11007; notes/probes/2026-11-27-h*-int4-gemv-fma-*.json): 8.00 / 12.51 / 13.61 / 12.56 us on
# an H200 against two groups at two programs an SM 8.34 / 13.16 / 14.88 / 13.07, and 8.63 / 14.51 / 16.29 /
# 14.06 against 8.95 / 14.96 / 16.62 / 14.28 on an H100. A split giving 3.4 programs an SM (N = 14336) ran as
# slowly as two; 5.2-6.8 ran fastest; 7.8 (N = 4096) and 10.4 (N = 11007) were slower again. Off that grid (H100,
# notes/probes/2026-11-27-h100-int4-split-map-wide.json) two groups at two programs an SM ran 9.5% faster at
# N = 28672 and 6.4% at K = 14336, and within 2% elsewhere but N = 2048: the plan waits on the same map on an H200.
NARROW_GPC = 1
NARROW_PROGRAMS_PER_SM = 3.5
PROGRAMS_PER_SM = 2  # split-K: the smallest power of two giving at least this many programs an SM ...
WIDE_PROGRAMS_PER_SM = 1  # ... and from MP = 32, where each split's fp32 partial [BLOCK_N, MP] costs more:
# measured (H100, graph clock, K = 4096) at M = 64 one program an SM took 38.8 / 39.1 / 38.2 / 17.8 us at
# N = 12288 / 14336 / 11007 / 4096 against two's 44.1 / 44.8 / 42.0 / 26.0 (the Triton kernel 37.7 / 38.7 /
# 36.9 / 25.1), at M = 32 25.1 / 25.4 / 24.8 / 12.8 against 30.4 / 31.0 / 29.4 / 18.7
# (notes/probes/2026-11-27-h100-int4-gluon-m32-m64.json)
WARPGROUPS = 1


def plan_int4_gluon(n_rows: int, n_cols: int, n_features: int, group_size: int, gpc: int | None = None,
                    wg: int | None = None, per_sm: float | None = None, sm_count: int = DEFAULT_SM_COUNT) -> dict:
    """The launch's constexprs for M = n_rows: a pure function of the shapes (and the SM count)."""
    return dict(_plan(n_rows, n_cols, n_features, group_size, gpc, wg, per_sm, sm_count))


@functools.lru_cache(maxsize=4096)
def _plan(n_rows: int, n_cols: int, n_features: int, group_size: int, gpc: int | None, wg: int | None,
          per_sm: float | None, sm_count: int) -> tuple:
    n_groups = n_features // group_size
    mp = max(8, triton.next_power_of_2(n_rows))
    if gpc is None:  # at MP = 64 two groups a chunk need 255 registers and spill (compiled for sm_90a): one
        choices = (NARROW_GPC, ) if mp == 8 else GPC_CHOICES if mp <= 32 else (1, )
        gpc = next(c for c in choices if n_groups % c == 0 and c * group_size <= max(MAX_K_PER_CHUNK, group_size))
    if n_groups % gpc:
        raise ValueError(f"int4_linear_gluon: {gpc} groups a chunk do not divide K/G = {n_groups}.")
    wg = wg or WARPGROUPS
    n_tiles = triton.cdiv(n_cols, BLOCK_ROWS * wg)
    chunks, split = n_groups // gpc, 1
    per_sm = per_sm or (NARROW_PROGRAMS_PER_SM if mp == 8 else PROGRAMS_PER_SM if mp <= 16 else WIDE_PROGRAMS_PER_SM)
    while n_tiles * split < per_sm * sm_count and 2 * split <= chunks:  # uneven runs of K where it does not divide
        split *= 2
    return tuple(dict(G=group_size, GPC=gpc, WG=wg, MP=mp, SPLIT=split, num_warps=4 * wg).items())


GLUON_DTYPES = tuple(_MAGIC)


def gluon_refusal(capability: tuple[int, int] | None, interpreter: bool, dtype: torch.dtype) -> str | None:
    """Why _int4_gemv_kernel cannot run for x of `dtype` on a device of `capability` ((major, minor), None off
    CUDA); None: it can. Any N, any K a multiple of a supported group size, any M (64 rows a launch)."""
    if interpreter:
        return "Triton's interpreter does not run Gluon kernels"
    if capability is None or capability[0] != 9:
        return f"the Gluon int4 kernel is written for Hopper (sm_90); the device is {capability or 'not CUDA'}"
    if dtype not in GLUON_DTYPES:
        return f"x has dtype {dtype}; the Gluon int4 kernel takes bfloat16 or float16"
    return None


# Bound launches (kernels/_launch.py) by everything that picks the compiled kernel and its fixed arguments:
# `kernel[grid]` spent 70-150 us of host time a call here (notes/dequant-linear.md), several times the GPU's.
_LAUNCHERS: dict[tuple, object] = {}
_MAX_LAUNCHERS = 1024


def int4_linear_gluon(x: torch.Tensor, packed: Int4Prepacked, group_size: int, out: torch.Tensor | None = None,
                      gpc: int | None = None, wg: int | None = None, per_sm: float | None = None) -> torch.Tensor:
    """x [M, K] (bfloat16 or float16, 1 <= M <= 64, unit stride along K) @ W^T for prepack_int4's W: [M, N] in
    x's dtype, accumulated in fp32. K must be a multiple of group_size (the K-chunk)."""
    if not isinstance(packed, Int4Prepacked):
        raise TypeError(f"int4_linear_gluon: packed must come from prepack_int4, got {type(packed).__name__}.")
    if x.dtype not in _MAGIC:
        raise ValueError(f"int4_linear_gluon: x must be bfloat16 or float16, got {x.dtype}.")
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M or x.stride(1) != 1:
        raise ValueError(f"int4_linear_gluon: x must be [M, K] with 1 <= M <= {MAX_M} and unit stride along K, "
                         f"got shape {tuple(x.shape)}, strides {x.stride()}.")
    if group_size not in GROUP_SIZES or group_size != packed.group_size:
        raise ValueError(f"int4_linear_gluon: group_size {group_size} does not match the prepacked weight's "
                         f"{packed.group_size}.")
    n_rows, n_features = x.shape
    if n_features != packed.n_features or n_features % group_size:
        raise ValueError(f"int4_linear_gluon: x has K = {n_features}; the weight has K = {packed.n_features} "
                         f"(a multiple of {group_size}).")
    if x.device.type != "cuda" or packed.weight.device != x.device:
        raise ValueError("int4_linear_gluon: x and the prepacked weight must be on one CUDA device.")
    if out is None:
        out = torch.empty((n_rows, packed.n_cols), dtype=x.dtype, device=x.device)
    return _launch(x, packed, out, gpc, wg, per_sm)


def _launch(x: torch.Tensor, packed: Int4Prepacked, out: torch.Tensor, gpc: int | None = None,
            wg: int | None = None, per_sm: float | None = None) -> torch.Tensor:
    """int4_linear_gluon's launch on arguments it has checked (int4_linear_prepacked's checks cover them too)."""
    n_rows, n_features = x.shape
    n_cols = packed.n_cols
    meta = plan_int4_gluon(n_rows, n_cols, n_features, packed.group_size, gpc, wg, per_sm, device_sm_count(x.device))
    block_n = BLOCK_ROWS * meta["WG"]
    n_tiles = triton.cdiv(n_cols, block_n)
    if meta["SPLIT"] > 1:
        part, counts = workspace(n_tiles * meta["SPLIT"] * block_n * meta["MP"], n_tiles, x.device)
    else:
        part, counts = out, out
    scales = packed.scales
    key = (x.device, x.dtype, scales.dtype, n_rows, n_cols, n_features, x.stride(0), scales.stride(0),
           out.stride(0), *meta.values(), aligned(x), aligned(packed.weight), aligned(scales), aligned(out),
           aligned(part), aligned(counts))
    launch = _LAUNCHERS.get(key)
    if launch is None:  # bound once per specialisation: later calls pass their tensors and nothing else
        offset_bits, sub = _OFFSET[x.dtype]
        args = (x, packed.words, scales, out, part, counts, n_rows, n_cols, n_features, x.stride(0),
                scales.stride(0), out.stride(0))
        launch = bind(_int4_gemv_kernel, (n_tiles * meta["SPLIT"], ), args, varying=6, MAGIC_BITS=_MAGIC[x.dtype][0],
                      OFFSET_BITS=offset_bits, SUB=sub, **meta)
        if len(_LAUNCHERS) >= _MAX_LAUNCHERS:
            _LAUNCHERS.clear()
        _LAUNCHERS[key] = launch
    launch(x, packed.words, scales, out, part, counts)
    return out


def int4_linear_prepacked(x: torch.Tensor, packed: Int4Prepacked, scales, group_size, refusal: str | None,
                          max_rows: int) -> torch.Tensor:
    """kernels/dequant_linear.py's int4_linear for a prepacked weight: x [..., K] (at most max_rows rows) in
    MAX_M-row launches (each reads the weight again); `refusal`: why the kernel cannot run here (None: it can)."""
    op = "int4_linear"
    if scales is not None:
        raise TypeError(f"{op}: a prepacked weight (prepack_int4) carries its scales; got scales as well.")
    if group_size is not None and group_size != packed.group_size:
        raise ValueError(f"{op}: group_size {group_size!r} does not match the prepacked weight's {packed.group_size}.")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}.")
    if x.dtype not in _MAGIC:
        raise TypeError(f"{op}: x has dtype {x.dtype}; expected bfloat16 or float16.")
    if x.dim() < 1 or x.shape[-1] != packed.n_features:
        raise ValueError(f"{op}: x must have shape [..., K] with K = {packed.n_features} (the prepacked weight's), "
                         f"got {tuple(x.shape)}.")
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{op}: forward only, but x requires grad; call it under torch.no_grad() or pass x.detach().")
    if refusal is not None:
        raise ValueError(f"{op}: the weight is prepacked for the Gluon kernel (prepack_int4), which cannot run "
                         f"here: {refusal}. Pass quantize_int4's (w_packed, scales) (weight.unprepack()) for the "
                         f"portable Triton kernel.")
    if x.device != packed.device:
        raise RuntimeError(f"{op}: all tensors must be on one device, got {x.device} and {packed.device}.")
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > max_rows:
        raise ValueError(f"dequant_linear: serves up to M = {max_rows} rows (decode and small batches), got "
                         f"{rows.shape[0]}; dequantise once and use F.linear for larger batches.")
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = torch.empty((rows.shape[0], packed.n_cols), dtype=x.dtype, device=x.device)
    if 0 < rows.shape[0] <= MAX_M:  # one launch: no slices
        _launch(rows, packed, y)
    else:
        for start in range(0, rows.shape[0], MAX_M):
            _launch(rows[start:start + MAX_M], packed, y[start:start + MAX_M])
    return y if x.dim() == 2 else y.view(*x.shape[:-1], packed.n_cols)


def compile_for_sm90(n_rows: int = 1, dtype: torch.dtype = torch.bfloat16, group_size: int = 128,
                     gpc: int | None = None, wg: int | None = None, n_features: int = 4096, n_cols: int = 4096):
    """The kernel compiled for sm_90a from shapes alone (no GPU): its PTX, SASS, registers and shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    meta = plan_int4_gluon(n_rows, n_cols, n_features, group_size, gpc, wg)
    num_warps = meta.pop("num_warps")
    offset_bits, sub = _OFFSET[dtype]
    constexprs = dict(meta, MAGIC_BITS=_MAGIC[dtype][0], OFFSET_BITS=offset_bits, SUB=sub)
    t = {torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype]
    signature = {"x_ptr": t, "w_ptr": "*i32", "s_ptr": t, "y_ptr": t, "part_ptr": "*fp32", "count_ptr": "*i32",
                 "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_sn": "i32", "stride_ym": "i32"}
    fn = _int4_gemv_kernel
    attrs = {(i, ): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) 
             if signature.get(name, "")[:1] == "*" or name in ("K", "stride_xm", "stride_sn", "stride_ym")}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    constants = {(fn.arg_names.index(name), ): value for name, value in constexprs.items()}
    src = GluonASTSource(fn, signature, constants, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
