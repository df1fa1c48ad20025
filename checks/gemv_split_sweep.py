"""GPU sweep of the decode GEMV's tensor-core form (rmsnorm_linear, M = 16): ten tiles x split-K 1-16, each
with the plan's tl.load kernel and with the same kernel reading W through a TMA descriptor, plus two and four
rows on the CUDA cores; graph clock as checks/decode_probe.py. A tuning instrument, not evidence
(notes/rmsnorm-linear.md, "Split-K was costing the tensor-core form 10-20%"). About 2 minutes on an H100.

    python checks/gemv_split_sweep.py OUT_JSON [BUDGET_S]
"""
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checks"))
import decode_probe as dp  # noqa: E402
from kernels import reference  # noqa: E402
from kernels import rmsnorm_gemv as rg  # noqa: E402
from kernels._gemv import GemvPlan, split_k_sum, split_k_workspace  # noqa: E402

EPS = 1e-6


@triton.jit
def _tma_gemv(x_ptr, w_desc, gamma_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_ym, eps,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
              LOAD_STAGES: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    split = pid % SPLIT_K
    n0 = tile * BLOCK_N
    rows = tl.arange(0, BLOCK_M)
    row_in = rows < M
    offs_k = tl.arange(0, BLOCK_K)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=LOAD_STAGES):
        w = w_desc.load([n0, k0])
        k_in = (k0 + offs_k) < K
        x = tl.load(x_ptrs + k0, mask=row_in[:, None] & k_in[None, :], other=0.0).to(tl.float32)
        g = tl.load(gamma_ptr + k0 + offs_k, mask=k_in, other=0.0).to(tl.float32)
        s2 += x * x
        a = (x * g[None, :]).to(w.dtype)
        acc = tl.dot(w, tl.trans(a), acc)
    c = tl.trans(acc)
    s = tl.sum(s2, axis=1)
    is_last = True
    if SPLIT_K > 1:
        is_last, c, s = split_k_sum(c, s, part_ptr, count_ptr, tile, split, SPLIT_K, BLOCK_M, BLOCK_N)
    if is_last:
        r = tl.rsqrt(s / K + eps)
        c = c * r[:, None]
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = row_in[:, None] & (cols < N)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], c.to(y_ptr.dtype.element_ty), mask=mask)


def tma_launch(plan: GemvPlan, n: int):
    def fn(x, d, g):
        w = d["w"]
        key = ("desc", plan.block_n, plan.block_k)
        if key not in d:
            d[key] = TensorDescriptor.from_tensor(w, [plan.block_n, plan.block_k])
        out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
        part, counts = split_k_workspace(plan, n, x.device) if plan.split_k > 1 else (out, out)
        _tma_gemv[plan.grid(n)](x, d[key], g, out, part, counts, x.shape[0], n, x.shape[1], x.stride(0),
                                out.stride(0), EPS, BLOCK_M=16, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
                                SPLIT_K=plan.split_k, LOAD_STAGES=plan.load_stages, num_warps=plan.num_warps,
                                num_stages=1)
        return out
    return fn


def ld_launch(plan: GemvPlan, n: int):
    return lambda x, d, g: rg.rmsnorm_gemv_fwd(x, d["w"], g, EPS, plan,
                                               torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device))


TILES = [(128, 128, 4, 3), (128, 128, 4, 4), (128, 128, 4, 6), (128, 256, 4, 3), (128, 256, 8, 3), (64, 256, 4, 4),
         (64, 128, 4, 6), (256, 128, 8, 3), (128, 64, 4, 8), (64, 512, 4, 2)]
SPLITS = (1, 2, 4, 8, 16)
SHAPES = [(16, 14336, 4096), (16, 4096, 4096), (16, 11007, 4096), (16, 4096, 8192)]


def main():
    out_path = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 480
    t0 = time.time()
    torch.manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    ceiling = dp.copy_ceiling_gbs()
    res = {"device": torch.cuda.get_device_name(0), "copy_ceiling_gbs": ceiling, "rows": []}
    print(res["device"], round(ceiling), flush=True)
    for m, n, k in SHAPES:
        dp.K = k
        nb = 2 * n * k
        ws = [{"w": (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)} for _ in range(dp.n_copies(nb))]
        g = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = reference.rmsnorm_linear_float64(x, ws[0]["w"], g, EPS)
        floor = nb / ceiling / 1e3
        table = rg.plan_rmsnorm_gemv(m, n, k, torch.bfloat16, 132)
        cands = [("table", table, ld_launch)]
        for (bn, bk, w, st), s in itertools.product(TILES, SPLITS):
            if triton.cdiv(k, bk) < 2 * s:
                continue
            p = GemvPlan("dot", 16, bn, bk, s, w, st, True, False)
            cands.append(("ld", p, ld_launch))
            cands.append(("tma", p, tma_launch))
        if m >= 2:
            for bn, bk, w, st in [(8, 512, 4, 4), (4, 512, 4, 6), (8, 256, 4, 6)]:
                for bm in (2, 4):
                    for s in (1, 2):
                        cands.append(("fma", GemvPlan("fma", bm, bn, bk, s, w, st, False, False), ld_launch))
        for variant, p, launch in cands:
            if time.time() - t0 > budget:
                break
            row = {"M": m, "N": n, "K": k, "variant": variant, "plan": p.as_dict(), "floor_us": floor}
            try:
                xm = x if not (variant == "fma") else x[: p.block_m]
                fn = launch(p, n)
                r = reference.rmsnorm_linear_float64(xm, ws[0]["w"], g, EPS) if xm is not x else ref
                row["rel_err"] = dp.rel_err(fn(xm, ws[0], g), r)
                row["us"] = dp.graph_us(fn, [(xm, d, g) for d in ws])
                row["pct"] = 100 * floor / row["us"]
                if variant == "fma":
                    row["M"] = p.block_m
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            res["rows"].append(row)
        best = {}
        for r in res["rows"]:
            if r["N"] == n and r["K"] == k and "us" in r and r["rel_err"] < 1e-2:
                key = (r["M"], r["variant"])
                if key not in best or r["us"] < best[key]["us"]:
                    best[key] = r
        for key, r in sorted(best.items()):
            print(f"M={key[0]:2} N={n:6} K={k} {key[1]:5} {r['us']:7.2f}us {r['pct']:5.1f}% {r['plan']}", flush=True)
        errs = [r for r in res["rows"] if r["N"] == n and r["K"] == k and ("error" in r or r.get("rel_err", 0) >= 1e-2)]
        for r in errs[:3]:
            print("  bad:", r["variant"], r["plan"], r.get("error", r.get("rel_err")), flush=True)
        del ws
        torch.cuda.empty_cache()
        out_path.write_text(json.dumps(res))
    print("elapsed", round(time.time() - t0))


if __name__ == "__main__":
    main()
