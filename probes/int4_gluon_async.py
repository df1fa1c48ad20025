"""GPU probe: two changes to the chunk loop of kernels/int4_gluon.py's GEMV, alone and together, against the plan.

    python probes/int4_gluon_async.py OUT_DIR

The variant kernel below differs from _int4_gemv_kernel only in its chunk loop, by two constexpr switches:
ASYNC issues each group's two products with is_async=True and waits for them after the chunk's last group is
issued (num_outstanding counting down by two a group), so group g + 1's unpack runs under group g's products;
PREFETCH_S loads each chunk's scales with its weight words, one chunk ahead, where the plan loads them inside
the loop just before they are needed (one more DRAM round trip a chunk on the chain). Same plan, same
prepacked weight; every output checked against the plan's, and against float64. K = 4096, bfloat16, G = 128;
N in 4096, 12288, 14336, 11007; M in 1, 4, 16; graph clock, weights rotated past L2 (checks/decode_probe.py).
Writes OUT_DIR/int4_gluon_async.json and prints a table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.decode_probe import copy_ceiling_gbs, graph_us, rel_err  # noqa: E402
from kernels import int4_gluon as ig  # noqa: E402
from kernels._gemv import device_sm_count, workspace  # noqa: E402
from kernels.quantize import dequantize_int4, quantize_int4  # noqa: E402
from probes.int4_parts import int4_operand_plain, int4_prepacked_copies  # noqa: E402

QUESTION = ("Do asynchronous wgmma (one group's products overlapping the next group's unpack), or scales loaded a "
            "chunk ahead with the weights, bring the Gluon int4 GEMV closer to its weight-read floor?")
CANDIDATES = ("the plan (synchronous products, scales loaded in the loop)", "asynchronous products",
              "scales a chunk ahead", "both")
SHAPES = "K = 4096, N in 4096, 12288, 14336, 11007, M in 1, 4, 16, bfloat16, G = 128"
OUTPUTS = {"int4-gluon-5": ("notes/probes/2026-11-27-h100-int4-gluon-async.json",)}

K, GROUP, BF16 = 4096, 128, torch.bfloat16
NS = (4096, 12288, 14336, 11007)
MS = (1, 4, 16)
ROWS = ig.ROWS
# name -> (asynchronous products, scales prefetched one chunk ahead)
VARIANTS = {"async": (True, False), "prefetch_s": (False, True), "async_prefetch_s": (True, True)}


@gluon.jit
def _int4_gemv_async_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_sn,
                            stride_ym, G: gl.constexpr, GPC: gl.constexpr, WG: gl.constexpr, MP: gl.constexpr,
                            SPLIT: gl.constexpr, MAGIC_BITS: gl.constexpr, MAGIC: gl.constexpr,
                            ASYNC: gl.constexpr, PREFETCH_S: gl.constexpr):
    T: gl.constexpr = 128 * WG
    BLOCK_N: gl.constexpr = ROWS * WG
    GB: gl.constexpr = 128 * G // 16
    DT: gl.constexpr = x_ptr.dtype.element_ty
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1],
                                                         instr_shape=[16, MP, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    b_layout: gl.constexpr = gl.BlockedLayout([1, G // 16], [32, 1], [4 * WG, 1], [1, 0])
    XT: gl.constexpr = 32 if G >= 256 else G // 8
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // XT, XT], [4 * WG, 1], [1, 0])
    x_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MP, G], DT)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)

    pid = gl.program_id(0)
    tile = pid // SPLIT
    split = pid % SPLIT
    n_groups = K // G
    n_iter = n_groups // (SPLIT * GPC)
    g0 = split * n_iter * GPC
    tau = gl.arange(0, T, layout=gl.SliceLayout(1, b_layout))
    offs_b = gl.arange(0, G // 16, layout=gl.SliceLayout(0, b_layout))
    blk = gl.minimum(tile * WG + tau // 128, gl.cdiv(N, ROWS) - 1)
    w_offs = (blk.to(gl.int64) * n_groups + g0) * GB + (tau % 128) * (G // 16)
    w_ptrs = w_ptr + w_offs[:, None] + offs_b[None, :]
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, x_layout))
    xk = gl.arange(0, G, layout=gl.SliceLayout(0, x_layout))
    x_ptrs = x_ptr + xm.to(gl.int64)[:, None] * stride_xm + (g0 * G + xk)[None, :]
    x_mask = (xm < M)[:, None]
    rows = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_layout)
    s_ptrs = s_ptr + rows.to(gl.int64) * stride_sn + g0
    x_smem = gl.allocate_shared_memory(DT, [GPC, MP, G], x_smem_layout)

    wb = (gl.load(w_ptrs), )
    xb = (gl.load(x_ptrs, mask=x_mask, other=0.0), )
    for g in gl.static_range(1, GPC):
        wb = wb + (gl.load(w_ptrs + g * GB), )
        xb = xb + (gl.load(x_ptrs + g * G, mask=x_mask, other=0.0), )
    sb = (gl.load(s_ptrs, mask=rows < N, other=0.0), )
    for g in gl.static_range(1, GPC):
        sb = sb + (gl.load(s_ptrs + g, mask=rows < N, other=0.0), )
    y = gl.zeros([BLOCK_N, MP], gl.float32, acc_layout)
    zero = gl.zeros([BLOCK_N, MP], gl.float32, acc_layout)
    offset = gl.full([BLOCK_N, G], -MAGIC, DT, a_layout)
    for i in range(n_iter):
        nxt = gl.minimum(i + 1, n_iter - 1) * GPC
        wn = (gl.load(w_ptrs + nxt * GB), )
        xn = (gl.load(x_ptrs + nxt * G, mask=x_mask, other=0.0), )
        sn = (gl.load(s_ptrs + nxt, mask=rows < N, other=0.0), )
        for g in gl.static_range(1, GPC):
            wn = wn + (gl.load(w_ptrs + (nxt + g) * GB), )
            xn = xn + (gl.load(x_ptrs + (nxt + g) * G, mask=x_mask, other=0.0), )
            sn = sn + (gl.load(s_ptrs + (nxt + g), mask=rows < N, other=0.0), )
        gl.thread_barrier()
        for g in gl.static_range(GPC):
            x_smem.index(g).store(xb[g])
        fence_async_shared()
        gl.thread_barrier()
        # PREFETCH_S: the scales came with the chunk's words (one chunk ahead); else loaded here, as the plan does.
        # ASYNC: every group's two products issued without waiting, so group g + 1's unpack runs under group g's.
        ps = ()
        scales = ()
        for g in gl.static_range(GPC):
            if PREFETCH_S:
                scales = scales + (sb[g].to(gl.float32), )
            else:
                scales = scales + (gl.load(s_ptrs + (i * GPC + g), mask=rows < N, other=0.0).to(gl.float32), )
            a = _operand_async(wb[g], a_layout, DT, MAGIC_BITS, G)
            x_g = x_smem.index(g).permute((1, 0))
            if ASYNC:
                p = warpgroup_mma(a, x_g, zero, use_acc=False, is_async=True)
                p = warpgroup_mma(offset, x_g, p, is_async=True)
                ps = ps + (p, )
            else:
                p = warpgroup_mma(a, x_g, zero, use_acc=False)
                p = warpgroup_mma(offset, x_g, p)
                y += scales[g][:, None] * p
        if ASYNC:
            for g in gl.static_range(GPC):
                p = warpgroup_mma_wait(2 * (GPC - 1 - g), deps=(ps[g], ))
                y += scales[g][:, None] * p
        wb = wn
        xb = xn
        sb = sn

    cols = gl.arange(0, MP, layout=col_layout)
    col_in = (cols < M)[None, :]
    is_last = True
    if SPLIT > 1:
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


_operand_async = int4_operand_plain  # the plan's operand as it stood when this probe ran (V = 128 + u)


def int4_linear_variant(x, packed, out=None, asynchronous=True, prefetch_scales=False):
    """ig.int4_linear_gluon's launch with the variant kernel (the plan's constexprs)."""
    n_rows, n_features = x.shape
    meta = ig.plan_int4_gluon(n_rows, packed.n_cols, n_features, GROUP, sm_count=device_sm_count(x.device))
    out = torch.empty((n_rows, packed.n_cols), dtype=x.dtype, device=x.device) if out is None else out
    block_n = ig.BLOCK_ROWS * meta["WG"]
    n_tiles = triton.cdiv(packed.n_cols, block_n)
    if meta["SPLIT"] > 1:
        part, counts = workspace(n_tiles * meta["SPLIT"] * block_n * meta["MP"], n_tiles, x.device)
    else:
        part, counts = out, out
    magic_bits, magic = ig._MAGIC[x.dtype]
    _int4_gemv_async_kernel[(n_tiles * meta["SPLIT"], )](
        x, packed.weight.view(torch.int32), packed.scales, out, part, counts, n_rows, packed.n_cols, n_features,
        x.stride(0), packed.scales.stride(0), out.stride(0), MAGIC_BITS=magic_bits, MAGIC=magic, ASYNC=asynchronous,
        PREFETCH_S=prefetch_scales, **meta)
    return out


def main() -> int:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    ceiling = copy_ceiling_gbs()
    result = {"device": torch.cuda.get_device_name(), "copy_ceiling_gbs": round(ceiling, 1), "rows": [],
              "failures": []}
    print(f"{result['device']}: copy ceiling {ceiling:.0f} GB/s")
    for n in NS:
        floor = (n * K // 2 + 2 * n * (K // GROUP)) / ceiling / 1e3
        w = (torch.randn(n, K, device="cuda") / K**0.5).to(BF16)
        p, s = quantize_int4(w, GROUP)
        ref_w = dequantize_int4(p, s, GROUP, BF16).double()
        packs = int4_prepacked_copies(p, s, GROUP, n * K)
        for m in MS:
            x = torch.randn(m, K, device="cuda").to(BF16)
            row = {"N": n, "M": m, "floor_us": round(floor, 2)}
            plan = ig.int4_linear_gluon(x, packs[0], GROUP)
            ref = x.double() @ ref_w.t()
            row["plan_us"] = round(graph_us(lambda x, w: ig.int4_linear_gluon(x, w, GROUP), [(x, w) for w in packs]), 2)
            for name, flags in VARIANTS.items():
                y = torch.full_like(plan, float("nan"))
                int4_linear_variant(x, packs[0], y, *flags)
                row[f"{name}_rel_err"] = rel_err(y, ref)
                row[f"{name}_equal_to_plan"] = bool(torch.equal(y, plan))
                if not row[f"{name}_rel_err"] < 1e-2:
                    result["failures"].append(f"{name} M={m} N={n}: rel_err {row[f'{name}_rel_err']:.3g}")
                row[f"{name}_us"] = round(graph_us(lambda x, w, f=flags: int4_linear_variant(x, w, None, *f),
                                                   [(x, w) for w in packs]), 2)
            row["plan_again_us"] = round(graph_us(lambda x, w: ig.int4_linear_gluon(x, w, GROUP), [(x, w) for w in packs]), 2)
            result["rows"].append(row)
            print(f"N={n:>6} M={m:>3} floor {floor:5.2f} plan {row['plan_us']:6.2f} / {row['plan_again_us']:6.2f} " +
                  " ".join(f"{name} {row[name + '_us']:6.2f} ({100 * floor / row[name + '_us']:.0f}%, "
                           f"equal {row[name + '_equal_to_plan']})" for name in VARIANTS), flush=True)
            (out_dir / "int4_gluon_async.json").write_text(json.dumps(result, indent=1))
        del packs
        torch.cuda.empty_cache()
    print("failures:", result["failures"] or "none")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
