"""GPU probe: what one call of the lab's int4 linear costs the host, by launch route, beside int8 and tinygemm.
(kernels/int4_gluon.py, kernels/dequant_linear.py)

    python probes/int4_host_time.py OUT_DIR     (writes OUT_DIR/int4_host_time.json)

The decode experiments' eager-call clock gave the Gluon int4 kernel 69-151 us of host time a call where its GPU
time was 10 us and the Triton int8 kernel's host time 13-23 us (notes/dequant-linear.md). The Gluon kernel was
launched through `kernel[grid]` on every call; the Triton kernels launch through kernels/_launch.py's bound
launchers. This probe times both routes for the same compiled kernel in one process, beside the lab's int8,
tinygemm's int4 and a bf16 F.linear, and profiles the two int4 routes.

Host time: the wall time of 2,000 back-to-back calls, the queue drained after, best of 5, a call. Where that is
below the call's GPU time (`gpu_us`: triton.testing.do_bench median, L2 cleared) the loop waited on the GPU, so
shapes with few output features (N = 256) keep the GPU time small. Before anything is timed the bound route's
output must equal the `kernel[grid]` route's bit for bit at every checked shape. A tuning instrument, not
evidence: the site's figures come only from run records.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import dequant_linear as dl  # noqa: E402
from kernels import int4_gluon as ig  # noqa: E402
from kernels._gemv import device_sm_count, workspace  # noqa: E402
from kernels.quantize import quantize_int4, quantize_int8, unpack_int4  # noqa: E402
from probes.harness import probe_header, write_output  # noqa: E402

QUESTION = "What does one call of the lab's int4 linear cost the host, launched through kernel[grid] and bound?"
CANDIDATES = ("int4 Gluon through kernel[grid]", "int4 Gluon bound (int4_linear_gluon)",
              "int4_linear on the prepacked weight", "int8_linear", "tinygemm int4", "bf16 F.linear")
SHAPES = "K = 4,096, group 128, bf16; M = 1 and 16 at N = 256; M = 1 at N = 4,096"
OUTPUTS = {"int4-host-time": ("notes/probes/2026-11-27-h100-int4-host-time.json",)}

BF = torch.bfloat16
K, GROUP = 4096, 128
SHAPES_TIMED = ((1, 256), (16, 256), (1, 4096))
CHECKED = ((1, 256), (16, 256), (1, 4096), (3, 1000), (64, 4096), (17, 11007))
CALLS, REPEATS = 2000, 5
TIMING = ("host_us: wall time of 2,000 back-to-back calls, the queue drained after, best of 5, a call; gpu_us: "
          "triton.testing.do_bench median, L2 cleared")


def jit_route(x: torch.Tensor, packed, out: torch.Tensor) -> torch.Tensor:
    """int4_linear_gluon's launch as it was before its launches were bound: the same plan and workspace, then
    `kernel[grid]` on every call."""
    n_rows, n_cols = x.shape[0], packed.n_cols
    meta = ig.plan_int4_gluon(n_rows, n_cols, K, GROUP, sm_count=device_sm_count(x.device))
    n_tiles = triton.cdiv(n_cols, ig.BLOCK_ROWS * meta["WG"])
    if meta["SPLIT"] > 1:
        part, counts = workspace(n_tiles * meta["SPLIT"] * ig.BLOCK_ROWS * meta["WG"] * meta["MP"], n_tiles, x.device)
    else:
        part = counts = out
    offset_bits, sub = ig._OFFSET[x.dtype]
    ig._int4_gemv_kernel[(n_tiles * meta["SPLIT"], )](
        x, packed.weight.view(torch.int32), packed.scales, out, part, counts, n_rows, n_cols, K, x.stride(0),
        packed.scales.stride(0), out.stride(0), MAGIC_BITS=ig._MAGIC[x.dtype][0], OFFSET_BITS=offset_bits, SUB=sub,
        **meta)
    return out


def host_us(fn) -> float:
    """Best of REPEATS of the wall time of CALLS back-to-back calls (the queue drained after), a call, in us."""
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best / CALLS * 1e6


def top_entries(fn, calls: int = 500, n: int = 14) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(n)
    return text.getvalue().strip()


def weights(n: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, K, generator=gen) / K**0.5).to(BF).cuda()
    p, s = quantize_int4(w, GROUP)
    q8, s8 = quantize_int8(w)
    u = (unpack_int4(p, GROUP) + 8).to(torch.int32)
    tg = torch.ops.aten._convert_weight_to_int4pack((u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8), 8)
    tz = torch.stack([s.t(), torch.zeros_like(s.t())], dim=2).contiguous()
    return dict(w=w, packed=ig.prepack_int4(p, s, GROUP), q8=q8, s8=s8, tg=tg, tz=tz)


def candidates(x: torch.Tensor, d: dict) -> dict:
    out = torch.empty(x.shape[0], d["packed"].n_cols, dtype=BF, device="cuda")
    return {
        "int4 Gluon through kernel[grid]": lambda: jit_route(x, d["packed"], out),
        "int4 Gluon bound (int4_linear_gluon)": lambda: ig.int4_linear_gluon(x, d["packed"], GROUP, out=out),
        "int4_linear on the prepacked weight": lambda: dl.int4_linear(x, d["packed"]),
        "int8_linear": lambda: dl.int8_linear(x, d["q8"], d["s8"]),
        "tinygemm int4": lambda: torch.ops.aten._weight_int4pack_mm(x, d["tg"], GROUP, d["tz"]),
        "bf16 F.linear": lambda: F.linear(x, d["w"]),
    }


def main() -> int:
    from triton.testing import do_bench

    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "int4_host_time.json"
    result = probe_header(question=QUESTION, shapes=SHAPES, calls=CALLS, repeats=REPEATS, checks=[], rows=[],
                          timing=TIMING)
    torch.manual_seed(0)
    with torch.no_grad():
        for m, n in CHECKED:
            d = weights(n, seed=m + n)
            x = torch.randn(m, K, device="cuda").to(BF)
            jit = jit_route(x, d["packed"], torch.full((m, n), float("nan"), dtype=BF, device="cuda"))
            bound = ig.int4_linear_gluon(x, d["packed"], GROUP, out=torch.full((m, n), float("nan"), dtype=BF,
                                                                                  device="cuda"))
            torch.cuda.synchronize()
            ok = bool(torch.equal(jit, bound)) and not bool(bound.isnan().any())
            result["checks"].append({"m": m, "n": n, "equal": ok})
            print(f"check M={m} N={n}: {'equal' if ok else 'DIFFERENT'}", flush=True)
        write_output(path, result)
        if not all(c["equal"] for c in result["checks"]):
            print("the bound route differs from kernel[grid]: nothing timed")
            return 1
        for m, n in SHAPES_TIMED:
            d = weights(n, seed=m + n)
            x = torch.randn(m, K, device="cuda").to(BF)
            row = {"m": m, "n": n, "k": K}
            for name, fn in candidates(x, d).items():
                row[name] = {"host_us": round(host_us(fn), 2),
                             "gpu_us": round(do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3, 2)}
                print(f"M={m} N={n} {name}: {row[name]}", flush=True)
            if (m, n) == SHAPES_TIMED[0]:
                cands = candidates(x, d)
                result["profile_jit_route"] = top_entries(cands["int4 Gluon through kernel[grid]"])
                result["profile_int4_linear"] = top_entries(cands["int4_linear on the prepacked weight"])
            result["rows"].append(row)
            write_output(path, result)
    print(result.get("profile_jit_route", "")[:3000])
    print(result.get("profile_int4_linear", "")[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
