"""GPU probe: the Gluon int4 GEMV (kernels/int4_gluon.py) against the lab's int4 and int8 kernels and torch's
tinygemm int4 (_weight_int4pack_mm), on the graph clock with weights rotated past L2.

    python probes/int4_gluon.py OUT_DIR [--quick]

K = 4096, bfloat16, G = 128; N in 4096, 12288, 14336, 11007; M in 1, 2, 4, 8, 16. Graph clock and copy
ceiling as checks/decode_probe.py (16 calls a graph, each on its own copy of the weights, the copies past
max(256 MB, 4 x L2)). Floor = int4 weight bytes (N*K/2 + 2*N*K/G) / copy ceiling, measured in this process;
int8's own floor is N*K + 2*N bytes. Every output is checked against float64 on the dequantised weights
(the Gluon kernel's into a NaN-filled buffer). Writes OUT_DIR/int4_gluon.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.decode_probe import copy_ceiling_gbs, graph_us, n_copies, rel_err  # noqa: E402
from kernels import int4_gluon as ig  # noqa: E402
from kernels.dequant_linear import int4_linear, int8_linear  # noqa: E402
from kernels.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8  # noqa: E402

QUESTION = ("Does an int4 GEMV in Gluon, its nibbles loaded straight into the wgmma's register operand, reach "
            "the int4 weight-read floor at M = 1-16, and beat the lab's Triton int4, int8 and tinygemm?")
CANDIDATES = ("the Gluon kernel's plan and its variants (groups a chunk, warpgroups, programs an SM)",
              "the lab's Triton int4", "the lab's int8", "tinygemm (_weight_int4pack_mm)")
SHAPES = "K = 4096, N in 4096, 12288, 14336, 11007, M in 1, 2, 4, 8, 16, bfloat16, G = 128"
OUTPUTS = {"int4-gluon-1": ("notes/probes/2026-11-27-h100-int4-gluon.json",),
           "int4-gluon-2": ("notes/probes/2026-11-27-h100-int4-gluon-ring-x-in-ring.json.gz",
                            "notes/probes/2026-11-27-h100-int4-gluon-ring-x-once.json.gz"),
           "int4-gluon-3": ("notes/probes/2026-11-27-h100-int4-gluon-final.json.gz",)}

K, GROUP, BF16 = 4096, 128, torch.bfloat16
NS = (4096, 12288, 14336, 11007)
MS = (1, 2, 4, 8, 16)
VARIANTS = ((None, None, None), (2, 1, 3), (2, 1, 4), (1, 1, 2), (4, 1, 2))  # (groups a chunk, warpgroups,
# programs an SM); None: the plan's. The cp.async ring (notes/probes/2026-11-27-int4-gluon-cpasync-ring.py.txt)
# was timed by this probe's earlier form: notes/probes/2026-11-27-h100-int4-gluon-ring-*.json
TOLERANCE = 1e-2


def int4_bytes(n: int) -> int:
    return n * K // 2 + 2 * n * (K // GROUP)


def make(n: int) -> dict:
    w = (torch.randn(n, K, device="cuda") / K**0.5).to(BF16)
    p, s = quantize_int4(w, GROUP)
    q8, s8 = quantize_int8(w)
    d = {"p": p, "s": s, "packed": ig.prepack_int4(p, s, GROUP), "q8": q8, "s8": s8}
    if n % 8 == 0:  # tinygemm's packing: neighbours k = 2j, 2j + 1 in a byte, N a multiple of 8
        u = (torch.cat([p.view(n, -1, GROUP // 2) & 0xF, p.view(n, -1, GROUP // 2) >> 4], 2).reshape(n, K)).to(torch.int32)
        d["tiny"] = torch.ops.aten._convert_weight_to_int4pack((u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8), 8)
        d["tiny_sz"] = torch.stack([s.t(), torch.zeros_like(s.t())], dim=2).contiguous()
    return d


def providers(m: int, n: int):
    out = []
    for gpc, wg, per_sm in VARIANTS:
        name = "gluon" if gpc is None else f"gluon c{gpc} wg{wg} p{per_sm}"
        v = (gpc, wg, per_sm)
        out.append((name, lambda x, d, v=v: ig.int4_linear_gluon(x, d["packed"], GROUP, None, *v), v))
    out.append(("lab int4", lambda x, d: int4_linear(x, d["p"], d["s"], GROUP), None))
    out.append(("lab int8", lambda x, d: int8_linear(x, d["q8"], d["s8"]), None))
    if n % 8 == 0:
        out.append(("tinygemm", lambda x, d: torch.ops.aten._weight_int4pack_mm(x, d["tiny"], GROUP, d["tiny_sz"]),
                    None))
    return out


def main() -> int:
    global MS, VARIANTS
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--quick", action="store_true", help="the plan's variant only, N = 4096 and 14336")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M")
    args = ap.parse_args()
    MS = tuple(int(m) for m in args.ms.split(","))
    ns = (4096, 14336) if args.quick else NS
    if args.quick:
        VARIANTS = VARIANTS[:1]
    out_path = Path(args.out_dir) / "int4_gluon.json"
    ceiling = copy_ceiling_gbs()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "copy_ceiling_gbs": round(ceiling, 1), "K": K,
              "group": GROUP, "dtype": "bfloat16", "rows": [], "failures": []}
    print(f"{result['device']}: copy ceiling {ceiling:.0f} GB/s")
    for n in ns:
        floor = int4_bytes(n) / ceiling / 1e3
        floor8 = (n * K + 2 * n) / ceiling / 1e3
        ws = [make(n)]
        ws += [{key: (ig.Int4Prepacked(v.weight.clone(), v.scales.clone(), v.n_cols, v.n_features, v.group_size)
                      if isinstance(v, ig.Int4Prepacked) else v.clone()) for key, v in ws[0].items()}
               for _ in range(n_copies(n * K) - 1)]  # past L2 for int8's bytes, so for int4's too
        ref4 = dequantize_int4(ws[0]["p"], ws[0]["s"], GROUP, BF16).double()
        ref8 = dequantize_int8(ws[0]["q8"], ws[0]["s8"], BF16).double()
        for m in MS:
            x = torch.randn(m, K, device="cuda").to(BF16)
            for name, fn, variant in providers(m, n):
                row = {"provider": name, "M": m, "N": n, "floor_us": round(floor, 2)}
                if variant is not None:
                    row["plan"] = ig.plan_int4_gluon(m, n, K, GROUP, *variant, torch.cuda.get_device_properties(0).multi_processor_count)
                try:
                    ref = x.double() @ (ref8 if name == "lab int8" else ref4).t()
                    if name.startswith("gluon"):
                        y = torch.full((m, n), float("nan"), dtype=BF16, device="cuda")
                        y = ig.int4_linear_gluon(x, ws[0]["packed"], GROUP, y, *variant)
                    else:
                        y = fn(x, ws[0])
                    row["rel_err"] = rel_err(y, ref)
                    if not row["rel_err"] < TOLERANCE:
                        result["failures"].append(f"{name} M={m} N={n}: rel_err {row['rel_err']:.3g}")
                    row["us"] = round(graph_us(fn, [(x, d) for d in ws]), 2)
                    row["pct_floor"] = round(100 * floor / row["us"], 1)
                    if name == "lab int8":
                        row["pct_int8_floor"] = round(100 * floor8 / row["us"], 1)
                    if name == "gluon":  # the same call timed again: the clock's spread
                        row["us_again"] = round(graph_us(fn, [(x, d) for d in ws]), 2)
                except Exception as exc:  # noqa: BLE001 - recorded, the probe goes on
                    row["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
                    traceback.print_exc()
                result["rows"].append(row)
            out_path.write_text(json.dumps(result, indent=1))
        del ws
        torch.cuda.empty_cache()
    print(f"{'N':>6} {'M':>3} " + " ".join(f"{name[-12:]:>14}" for name, _, _ in providers(1, 8)))
    for n in ns:
        for m in MS:
            cells = []
            for name, _, _ in providers(1, 8):
                r = next((r for r in result["rows"] if r["N"] == n and r["M"] == m and r["provider"] == name), None)
                cells.append(f"{r['us']:>6.2f} ({r['pct_floor']:>3.0f}%)" if r and "us" in r else f"{'-':>14}")
            print(f"{n:>6} {m:>3} " + " ".join(f"{c:>14}" for c in cells))
    print("failures:", result["failures"] or "none")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
