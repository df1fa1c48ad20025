"""GPU sweep, second pass of checks/gemv_split_sweep.py: int8 and int4 tensor-core tiles x split-K at M = 1 and
16, int8 at M = 1 on the CUDA cores, and rmsnorm_linear's tensor-core tiles at N = 1024 and 2048; graph clock
as checks/decode_probe.py. A tuning instrument, not evidence. About 3.5 minutes on an H100.

    python checks/gemv_split_sweep_2.py OUT_JSON BUDGET_S
"""
import itertools, json, sys, time
from pathlib import Path
import torch, triton
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checks"))
import decode_probe as dp  # noqa: E402
from kernels._gemv import GemvPlan  # noqa: E402

def table(kind, m, n, k):
    return dp.table_plan(kind, m, n, 132)

def cands(kind, m, n, k):
    out = [("table", table(kind, m, n, k))]
    if kind == "rmsnorm":
        tiles = [(64, 256, 4, 4), (128, 256, 4, 3), (64, 128, 4, 6), (32, 256, 4, 4)]
        splits = (1, 2, 4, 8)
    elif kind == "int8":
        tiles = [(64, 256, 4, 4), (128, 256, 4, 3), (64, 512, 4, 3), (128, 512, 4, 2), (64, 128, 4, 5),
                 (128, 128, 4, 4), (128, 256, 8, 4)]
        splits = (1, 2, 4)
    else:
        tiles = [(64, 512, 4, 3), (128, 512, 4, 3), (64, 256, 4, 4), (128, 256, 4, 4), (128, 256, 8, 4),
                 (64, 128, 4, 4), (128, 128, 4, 6), (64, 1024, 4, 2), (128, 1024, 8, 2)]
        splits = (1, 2, 4)
    for (bn, bk, w, st), s in itertools.product(tiles, splits):
        if triton.cdiv(k, bk) < 2 * s:
            continue
        out.append(("dot", GemvPlan("dot", 16, bn, bk, s, w, st, True, False)))
    if kind == "int8" and m == 1:
        for bn, bk, w, st in [(8, 512, 4, 6), (8, 1024, 4, 4), (16, 512, 4, 6)]:
            out.append(("fma", GemvPlan("fma", 1, bn, bk, 1, w, st, True, False)))
    return out

SHAPES = [("int8", m, n) for m in (16, 1) for n in (14336, 4096, 11007)] + \
         [("int4", m, n) for m in (16, 1) for n in (14336, 4096, 11007)] + \
         [("rmsnorm", 16, n) for n in (1024, 2048)]

def main():
    out_path, budget = Path(sys.argv[1]), float(sys.argv[2])
    t0 = time.time(); torch.manual_seed(0)
    ceiling = dp.copy_ceiling_gbs()
    res = {"device": torch.cuda.get_device_name(0), "copy_ceiling_gbs": ceiling, "rows": []}
    print(res["device"], round(ceiling), flush=True)
    k = dp.K
    for kind, m, n in SHAPES:
        if time.time() - t0 > budget: break
        nb = dp.weight_bytes(kind, n)
        ws = [dp.make_weights(kind, n, None) for _ in range(dp.n_copies(nb))]
        g = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = dp.reference_for(kind, x, ws[0], g)
        floor = nb / ceiling / 1e3
        rows = []
        for variant, p in cands(kind, m, n, k):
            if time.time() - t0 > budget: break
            row = {"op": kind, "M": m, "N": n, "K": k, "variant": variant, "plan": p.as_dict(), "floor_us": floor}
            try:
                fn = dp.run_plan(kind, p, n)
                row["rel_err"] = dp.rel_err(fn(x, ws[0], g), ref)
                row["us"] = dp.graph_us(fn, [(x, d, g) for d in ws])
                row["pct"] = 100 * floor / row["us"]
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
        res["rows"] += rows
        ok = [r for r in rows if "us" in r and r["rel_err"] < 1e-2]
        t = [r for r in ok if r["variant"] == "table"]
        for r in [t[0]] if t else []:
            name = dp.plan_name(GemvPlan(**r["plan"]))
            print(f"{kind} M={m:2} N={n:6} table {r['us']:7.2f}us {r['pct']:5.1f}% {name}")
        for r in sorted(ok, key=lambda r: r["us"])[:4]:
            name = dp.plan_name(GemvPlan(**r["plan"]))
            print(f"{kind} M={m:2} N={n:6} {r['variant']:5} {r['us']:7.2f}us {r['pct']:5.1f}% {name}")
        for r in [r for r in rows if r not in ok][:2]:
            print("  bad:", r["variant"], r["plan"], r.get("error", r.get("rel_err")))
        sys.stdout.flush()
        del ws; torch.cuda.empty_cache()
        out_path.write_text(json.dumps(res))
    print("elapsed", round(time.time() - t0))

main()
