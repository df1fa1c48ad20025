"""GPU probe: the int4 decode GEMV at one row on the CUDA cores, against kernels/int4_gluon.py's tensor-core plan.

    python probes/int4_gemv_fma.py OUT_DIR [--ns 4096,14336] [--only plan,fma]

At M = 1 the plan's warpgroup MMA computes eight columns to use one, and (at 1c232d3, where this round ran)
spent a second MMA a group on the offset (-136 sum x). On the same prepacked weight (prepack_int4's order):

- "fma cC pP": no tensor cores. Each thread keeps its own words (two rows x 32 k of a group), turns each nibble
  into the float32 128 + u with one shift and one LOP3 (the nibble at bits 16-19 of 0x43000000), multiplies by
  x held as float32 in shared memory in the thread's own order (two 16-byte reads an (i, p) pair), and applies
  each row's scale to its group partial; the four lanes of a row are summed once, at the end. About 3.6
  instructions a weight (sm_90a SASS) against the five an SM can spend at the copy rate;
- "alu": the plan with the offset subtracted from each unpacked pair instead (probes/int4_gemv_alu.py);
- "read pP": the prepacked words read once by a kernel that does nothing else, P programs an SM: what a read of
  this size attains on this clock.

K = 4096, bfloat16, G = 128, M = 1; N in 4096, 12288, 14336, 11007; graph clock, weights rotated past L2
(checks/decode_probe.py). Writes OUT_DIR/int4_gemv_fma.json. With --profile NAMES it runs each named kernel once
at the first N (plan, alu, fma, read8) for a profiler, as the round's counters were taken:
    ncu -k regex:"_int4_gemv|_read_kernel" --section SpeedOfLight --section Occupancy --section WarpStateStats
        --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --csv --page details
        python probes/int4_gemv_fma.py OUT --ns 14336 --profile plan,alu,fma,read8
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import int4_gluon as ig  # noqa: E402
from kernels._gemv import device_sm_count, workspace  # noqa: E402
from kernels.quantize import quantize_int4  # noqa: E402
from probes.int4_gemv_alu import BF16, GROUP, K, arguments, bare_read, int4_gemv_alu, measure  # noqa: E402

QUESTION = ("At one row, does the int4 GEMV come closer to its weight-read floor on the CUDA cores (one FFMA a "
            "weight, the nibble placed in a float32 mantissa) or with the offset moved off the tensor cores, "
            "and how close does a bare read of the same bytes come?")
CANDIDATES = ("the plan (kernels/int4_gluon.py)", "the plan, offset on the ALU", "the CUDA-core kernel at 1-2 "
              "groups a chunk and 2-4 programs an SM", "a bare read of the weight at 2, 4 and 8 programs an SM")
SHAPES = "K = 4096, N in 4096, 12288, 14336, 11007, M = 1, bfloat16, G = 128"
OUTPUTS = {"int4-fma-1": ("notes/probes/2026-11-27-h200-int4-gemv-fma-1.json",
                          "notes/probes/2026-11-27-h200-int4-gemv-ncu.json")}

FMA_VARIANTS = ((2, 2), (1, 2), (2, 3), (2, 4), (1, 4))  # (groups a chunk, programs an SM)


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
    SLX: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])  # the same bytes, read a [4, C] slice at a time
    SL2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
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
    x_smem = gl.allocate_shared_memory(gl.float32, [NG * 4, 4, C], SL3, xs)._reinterpret(gl.float32, [NG * 4, 4, C], SLX)
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


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--profile", default="", help="run these kernels once each at the first N, for a profiler")
    args = ap.parse_args()
    if args.profile:
        return profile_once(int(args.ns.split(",")[0]), args.profile.split(","))
    sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    cands = [("plan", lambda x, w, y=None: ig.int4_linear_gluon(x, w, GROUP, y), True),
             ("alu", lambda x, w, y=None: int4_gemv_alu(x, w, y), True)]
    cands += [(f"fma c{c} p{ps}", lambda x, w, y=None, c=c, ps=ps: int4_gemv_fma(x, w, y, c, ps), True)
              for c, ps in FMA_VARIANTS]
    cands += [(f"read p{ps}", lambda x, w, ps=ps: bare_read(w.weight.view(torch.int32), sink, ps), False)
              for ps in (2, 4, 8)]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return measure(out / "int4_gemv_fma.json", [int(v) for v in args.ns.split(",")], cands,
                   [v for v in args.only.split(",") if v])


if __name__ == "__main__":
    sys.exit(main())
