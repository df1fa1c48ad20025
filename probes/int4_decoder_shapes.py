"""GPU probe: the Gluon int4 GEMV (kernels/int4_gluon.py) at the decoder layer's own projections, its plan against
the split it replaced, on the graph clock with weights rotated past L2.

    python probes/int4_decoder_shapes.py OUT_DIR         (writes OUT_DIR/int4_decoder_shapes.json)
    python probes/int4_decoder_shapes.py OUT_DIR --map   (writes OUT_DIR/int4_split_map.json)

The plan adopted in round int4-alu-2 (one group a chunk, the smallest power-of-two split giving 3.5 programs an
SM, at up to eight rows) was chosen at K = 4096. The decoder layer (kernels/decoder_block.py) also runs the
down projection, K = 14,336, and the fused projections N = 6,144 (qkv) and 28,672 (gate and up). Candidates, all
the kernel at the probe's commit with its `gpc` and `per_sm` overridden: "plan" (no override); "c2 p2" (two
groups a chunk, two programs an SM: the split before round int4-alu-2, with its offset now on the ALU); "c1 pP"
(one group a chunk, P programs an SM). bfloat16, G = 128, M in 1 and 16; every output checked against float64
on the dequantised weight, into a NaN-filled buffer.

--shared-workspace lets the split's launches share the stream's counters in the graph (no zeroing in it).
Round int4-split-map ran --map four times on an H100: at commit 7fc96f8 (counters zeroed in each graph), with the
split's reduction loads unrolled (a one-line kernel edit, not kept), with --shared-workspace, and with
kernels/_gemv.py's zeroed slab (no flag), then with --wide, before and after splits became uneven; and
--wide once on an H200 with uneven splits.

--wide adds N in 2048, 8192, 11007 at K = 4096 and K = 11008 at N = 4096, and M = 8, to the map.

--map times, at M = 1, every split s in 1, 2, 4, 8, 16 (up to 14 programs an SM) at one and two groups a chunk
("c1 sS", "c2 sS") for N in 4096, 6144, 12288, 14336, 28672 at K = 4096 and N = 4096 at K = 14336: the map a
split rule is read from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.decode_probe import copy_ceiling_gbs, graph_us, rel_err  # noqa: E402
from kernels import _gemv, int4_gluon as ig  # noqa: E402
from kernels.quantize import dequantize_int4, quantize_int4  # noqa: E402
from probes.int4_parts import int4_prepacked_copies  # noqa: E402

QUESTION = ("Does the one-row int4 plan chosen at K = 4,096 also serve the decoder layer's own projections, the "
            "down projection's K = 14,336 among them, or does the split it replaced win there?")
CANDIDATES = ("the plan (one group a chunk, 3.5 programs an SM)", "two groups a chunk at two programs an SM",
              "one group a chunk at 2, 6 and 8 programs an SM")
SHAPES = "(N, K) in (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336); M in 1 and 16; bfloat16, G = 128"
OUTPUTS = {"int4-decoder-shapes": ("notes/probes/2026-11-27-h100-int4-decoder-shapes.json",),
           "int4-split-map": ("notes/probes/2026-11-27-h100-int4-split-map.json",
                              "notes/probes/2026-11-27-h100-int4-split-map-unrolled.json",
                              "notes/probes/2026-11-27-h100-int4-split-map-shared.json",
                              "notes/probes/2026-11-27-h100-int4-split-map-slab.json",
                              "notes/probes/2026-11-27-h100-int4-split-map-wide.json",
                              "notes/probes/2026-11-27-h100-int4-split-map-uneven.json",
                              "notes/probes/2026-11-27-h200-int4-split-map-wide.json.gz")}

G, BF = 128, torch.bfloat16
# Whether the kernel at the probe's commit takes a split that does not divide the chunks (uneven runs of K).
UNEVEN = ig.plan_int4_gluon(1, 64, 3 * G, G, sm_count=132)["SPLIT"] > 1  # three chunks split two ways
PROJECTIONS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
MAP_SHAPES = (("n4096", 4096, 4096), ("n6144", 6144, 4096), ("n12288", 12288, 4096), ("n14336", 14336, 4096),
              ("n28672", 28672, 4096), ("k14336", 4096, 14336))
WIDE_SHAPES = (("n2048", 2048, 4096), ("n8192", 8192, 4096), ("n11007", 11007, 4096), ("k11008", 4096, 11008))
VARIANTS = {"plan": {}, "c2 p2": {"gpc": 2, "per_sm": 2}, "c1 p2": {"gpc": 1, "per_sm": 2},
            "c1 p6": {"gpc": 1, "per_sm": 6}, "c1 p8": {"gpc": 1, "per_sm": 8}}


def split_map(n: int, k: int, sm: int) -> list[tuple[str, dict]]:
    """Every (groups a chunk, split) the kernel can run at M <= 8, as plan_int4_gluon overrides: per_sm set so its
    doubling loop stops at that split."""
    tiles, out = -(-n // 64), []
    for gpc in (1, 2):
        for split in (1, 2, 4, 8, 16):
            if split > k // G // gpc or (k // G // gpc) % split and not UNEVEN or tiles * split > 14 * sm:
                continue
            out.append((f"c{gpc} s{split}", {"gpc": gpc, "per_sm": tiles * split / sm}))
    return out


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp")
    out_dir.mkdir(parents=True, exist_ok=True)
    wide = "--wide" in sys.argv[2:]
    mapping = wide or "--map" in sys.argv[2:]
    if "--shared-workspace" in sys.argv[2:]:  # no zeroing of the split's counters captured into each graph
        _gemv.CAPTURE_OWN_WORKSPACE = False
    shapes = MAP_SHAPES + WIDE_SHAPES if wide else MAP_SHAPES if mapping else PROJECTIONS
    rows = (1, 8) if wide else (1, ) if mapping else (1, 16)
    name_out = ("int4_split_map_wide" if wide else "int4_split_map" if mapping else "int4_decoder_shapes") + (
        "_shared.json" if "--shared-workspace" in sys.argv[2:] else ".json")

    def variants(n, k, sm):
        return split_map(n, k, sm) if mapping else list(VARIANTS.items())

    ceiling = copy_ceiling_gbs()
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"device": torch.cuda.get_device_name(), "copy_ceiling_gbs": round(ceiling, 1), "group": G,
              "rows": [], "failures": []}
    for proj, n, k in shapes:
        floor = (n * k // 2 + 2 * n * (k // G)) / ceiling / 1e3
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(BF)
        p, s = quantize_int4(w, G)
        ref_w = dequantize_int4(p, s, G, BF).double()
        packs = int4_prepacked_copies(p, s, G, n * k // 2)
        for m in rows:
            x = torch.randn(m, k, device="cuda").to(BF)
            want = x.double() @ ref_w.t()
            for name, kw in variants(n, k, sm):
                meta = ig.plan_int4_gluon(m, n, k, G, kw.get("gpc"), None, kw.get("per_sm"), sm)
                row = {"projection": proj, "N": n, "K": k, "M": m, "variant": name, "GPC": meta["GPC"],
                       "SPLIT": meta["SPLIT"], "floor_us": round(floor, 2)}
                try:
                    y = ig.int4_linear_gluon(x, packs[0], G, torch.full((m, n), float("nan"), dtype=BF,
                                                                         device="cuda"), **kw)
                    row["rel_err"] = rel_err(y, want)
                    if not row["rel_err"] < 1e-2:
                        result["failures"].append(f"{proj} M={m} {name}: rel_err {row['rel_err']:.3g}")
                    call = (lambda pk, kw=kw: ig.int4_linear_gluon(x, pk, G, **kw))
                    row["us"] = round(graph_us(call, [(pk, ) for pk in packs]), 2)
                    row["us_again"] = round(graph_us(call, [(pk, ) for pk in packs]), 2)
                    row["pct_floor"] = round(100 * floor / min(row["us"], row["us_again"]), 1)
                except Exception as exc:  # noqa: BLE001 - recorded, the probe goes on
                    row["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
                (out_dir / name_out).write_text(json.dumps(result, indent=1))
        del packs
        torch.cuda.empty_cache()
    print("failures:", result["failures"] or "none")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
