"""GPU sweep of the int4 decode kernel after its unpacking moved to PTX (kernels/dequant_linear.py, _int4_to_q):
the previous plan with the previous unpacking and with the new one, sixteen tiles x split-K 1 and 2 with the
new one, and tinygemm, at M = 1 and 16 and N = 14336, 4096, 11007 (K = 4096, groups of 128); graph clock as
checks/decode_probe.py. A tuning instrument, not evidence. About 40 s on an H100 after compiling.

    python checks/int4_unpack_sweep.py OUT_JSON BUDGET_S
"""
import itertools, json, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checks"))
import decode_probe as dp  # noqa: E402
from kernels import dequant_linear as dl  # noqa: E402
from kernels._gemv import GemvPlan  # noqa: E402

def main():
    out_path, budget = Path(sys.argv[1]), float(sys.argv[2])
    t0 = time.time(); torch.manual_seed(0)
    ceiling = dp.copy_ceiling_gbs()
    res = {"device": torch.cuda.get_device_name(0), "copy_ceiling_gbs": ceiling, "rows": []}
    print(res["device"], round(ceiling), flush=True)
    k = dp.K
    for n, m in [(14336, 1), (14336, 16), (4096, 1), (4096, 16), (11007, 1), (11007, 16)]:
        nb = dp.weight_bytes("int4", n)
        ws = [dp.make_weights("int4", n, None) for _ in range(dp.n_copies(nb))]
        g = None
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = dp.reference_for("int4", x, ws[0], g)
        floor = nb / ceiling / 1e3
        narrow = n * k <= 4096 * 4096  # the plan before this sweep: its narrow and wide rows
        table = GemvPlan("dot", 16, 64, 512 if narrow else 128, 4 if narrow else 2, 4, 3 if narrow else 4, True, False)
        cands = [("table-old", table, False), ("table-asm", table, True)]
        tiles = [(64, 128, 4, 4), (128, 128, 4, 4), (64, 256, 4, 4), (128, 256, 4, 3), (64, 512, 4, 3),
                 (128, 512, 8, 3), (64, 128, 4, 8), (128, 128, 8, 6)]
        for (bn, bk, w, st), s in itertools.product(tiles, (1, 2)):
            cands.append(("asm", GemvPlan("dot", 16, bn, bk, s, w, st, True, False), True))
        cands.append(("tinygemm", None, None))
        rows = []
        for name, p, fast in cands:
            if time.time() - t0 > budget: break
            row = {"M": m, "N": n, "variant": name, "plan": p.as_dict() if p else None, "floor_us": floor}
            try:
                if p is None:
                    fn = lambda x, d, g: torch.ops.aten._weight_int4pack_mm(x, d["tiny"], dp.GROUP, d["tiny_sz"])
                else:
                    def fn(x, d, g, p=p, fast=fast):
                        out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
                        return dl.int4_linear_fwd(x, d["w"], d["s"], dp.GROUP, p, out, fast_cvt=fast)
                row["rel_err"] = dp.rel_err(fn(x, ws[0], g), ref)
                row["us"] = dp.graph_us(fn, [(x, d, g) for d in ws])
                row["pct"] = 100 * floor / row["us"]
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            rows.append(row)
        res["rows"] += rows
        ok = sorted([r for r in rows if "us" in r and r["rel_err"] < 2e-2], key=lambda r: r["us"])
        for r in [r for r in rows if r["variant"] in ("table-old", "table-asm", "tinygemm")] + ok[:3]:
            name = dp.plan_name(GemvPlan(**r["plan"])) if r["plan"] else ""
            print(f"M={m:2} N={n:6} {r['variant']:9} {r.get('us', float('nan')):7.2f}us {r.get('pct', 0):5.1f}% "
                  f"err={r.get('rel_err', r.get('error'))} {name}", flush=True)
        del ws; torch.cuda.empty_cache()
        out_path.write_text(json.dumps(res))
    print("elapsed", round(time.time() - t0))

main()
