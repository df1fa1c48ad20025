"""GPU probe: the Gluon int4 GEMV (kernels/int4_gluon.py) at M = 32 and 64, its split and width variants, against
the lab's Triton int4 kernel, on the graph clock with weights rotated past L2.

    python probes/int4_gluon_wide.py        (writes $OUT/m64.json, or /tmp/m64.json)

K = 4096, bfloat16, G = 128; N in 4096, 12288, 14336, 11007. Variants: the plan as it stood (two programs an
SM), two warpgroups, 0.5 / 1 / 4 programs an SM, and at M = 64 two warpgroups at one program an SM and two
launches of 32 rows. Graph clock and copies as checks/decode_probe.py; each variant's output is checked
against float64 on the dequantised weight (relative error beside its time).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.decode_probe import copy_ceiling_gbs, graph_us, n_copies, rel_err  # noqa: E402
from kernels import int4_gluon as ig  # noqa: E402
from kernels.dequant_linear import int4_linear  # noqa: E402
from kernels.quantize import dequantize_int4, quantize_int4  # noqa: E402

QUESTION = ("At M = 32 and 64, which split and width of the Gluon int4 kernel is fastest, and does it catch the "
            "Triton int4 kernel there?")
CANDIDATES = ("the Gluon plan at two programs an SM", "two warpgroups", "0.5, 1 and 4 programs an SM",
              "two launches of 32 rows", "the lab's Triton int4")
SHAPES = "K = 4096, N in 4096, 12288, 14336, 11007, M in 32 and 64, bfloat16, G = 128"
OUTPUTS = {"int4-gluon-4": ("notes/probes/2026-11-27-h100-int4-gluon-m32-m64.json",)}

K, G, BF = 4096, 128, torch.bfloat16


def main() -> int:
    out = {"ceiling": copy_ceiling_gbs(), "rows": []}
    for n in (4096, 12288, 14336, 11007):
        w = (torch.randn(n, K, device="cuda") / K**0.5).to(BF)
        p, s = quantize_int4(w, G)
        copies = [(p.clone(), s.clone()) for _ in range(n_copies(n * K // 2))]
        packs = [ig.prepack_int4(a, b, G) for a, b in copies]
        ref_w = dequantize_int4(p, s, G, BF).double()
        for m in (32, 64):
            x = torch.randn(m, K, device="cuda").to(BF)
            ref = x.double() @ ref_w.t()
            row = {"n": n, "m": m, "triton": graph_us(lambda a, b: int4_linear(x, a, b, G), copies)}
            variants = {"plan": {"per_sm": 2}, "wg2": {"wg": 2, "per_sm": 2}, "ps1": {"per_sm": 1},
                        "ps4": {"per_sm": 4}, "ps05": {"per_sm": 0.5}}
            if m == 64:
                variants["wg2ps1"] = {"wg": 2, "per_sm": 1}
            for name, kw in variants.items():
                try:
                    row[name + "_err"] = rel_err(ig.int4_linear_gluon(x, packs[0], G, **kw), ref)
                    row[name] = graph_us(lambda pk, kw=kw: ig.int4_linear_gluon(x, pk, G, **kw), [(pk,) for pk in packs])
                except Exception as exc:  # noqa: BLE001 - recorded, the probe goes on
                    row[name] = repr(exc)[:200]
            if m == 64:
                def two(pk):
                    ig.int4_linear_gluon(x[:32], pk, G, per_sm=2)
                    ig.int4_linear_gluon(x[32:], pk, G, per_sm=2)
                row["two32"] = graph_us(two, [(pk,) for pk in packs])
            print(json.dumps(row), flush=True)
            out["rows"].append(row)
        del copies, packs
        torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), "m64.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
