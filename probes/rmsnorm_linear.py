"""Tuning probe for the fused RMSNorm + linear kernel (GPU only): times explicit GEMV plans (M <= 16) and
tile configs (M = 128), split-K included, against the unfused pair, to choose the plan table in
kernels/rmsnorm_gemv.py and the config lists in kernels/_rmsnorm_linear_tiled.py.

This is a tuning instrument, not evidence: the site's figures come only from tools/build_results.py run
records. Its JSON output is kept under notes/probes/ beside the notes that cite it.

    python -m probes.rmsnorm_linear --out probe.json

Timing: triton.testing.do_bench (CUDA events, L2 cleared before every call, median of the samples).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from triton.testing import do_bench

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import reference  # noqa: E402
from probes.harness import probe_header  # noqa: E402
from kernels._gemv import GemvPlan  # noqa: E402
from kernels._rmsnorm_linear_tiled import SMEM_BYTES, _config, smem_bytes  # noqa: E402
from kernels.rmsnorm_linear import plan_rmsnorm_linear, rmsnorm_linear, rmsnorm_linear_fwd  # noqa: E402

QUESTION = ("Which split-K, prefetch and vector settings bring the fused RMSNorm + linear near the weight-read "
            "floor for decode and prefill rows?")
CANDIDATES = ("torch-unfused", "lab:auto", "lab: split-K / tile / vector grids")
OUTPUTS = {
    "rmsnorm-h200-1": ("notes/probes/2026-11-22-h200-rmsnorm-probe1-split-k.json.gz",),
    "rmsnorm-h200-2": ("notes/probes/2026-11-22-h200-rmsnorm-probe2-x-prefetch.json.gz",),
    "rmsnorm-h200-3": ("notes/probes/2026-11-22-h200-rmsnorm-probe3-vector.json.gz",),
}

K = 4096
EPS = 1e-6
SHAPES = [(m, n) for m in (1, 16, 128) for n in (4096, 12288)]


def vector_grid() -> list[dict]:
    """M = 1 GEMV plans on the CUDA cores: rows of W per program, load depth, warps and loads in flight,
    kept to 8-64 elements of the W tile per thread."""
    configs = []
    for bn, bk, warps, stages in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8), (2, 3, 4)):
        if 8 <= bn * bk // (32 * warps) <= 64:
            configs.append(GemvPlan("fma", 1, bn, bk, 1, warps, stages, False).as_dict())
    return configs


def decode_grid() -> list[dict]:
    """M = 16 GEMV plans on the tensor cores: the tile width, K depth, pipeline depth, split-K and operand order."""
    return [GemvPlan("dot", 16, bn, bk, sk, 4, st, swap).as_dict()
            for bn, bk, st, sk, swap in itertools.product((32, 64), (128, 256), (3, 4), (1, 2, 4), (True, False))]


def middle_grid() -> list[dict]:
    configs = []
    for bm, bn, bk, sk in itertools.product((64, 128), (64, 128), (64, 128), (1, 2, 4)):
        warps = 4 if bm * bn <= 64 * 128 else 8
        configs.append(_config(bm, bn, bk, 4 if bk == 64 else 3, warps, sk))
    return [c for c in configs if smem_bytes(c) <= SMEM_BYTES]


def host_us(fn, calls: int = 200) -> float:
    """Host time per call while the GPU keeps up: launches queued back to back, one sync at the end."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("probe_rmsnorm_linear: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    torch.manual_seed(0)
    dtype = torch.bfloat16
    result = probe_header(rows=[])
    ceiling = result["copy_ceiling_gbs"]
    compiled = torch.compile(reference.rmsnorm_linear_reference, dynamic=False)
    for m, n in SHAPES:
        x = torch.randn(m, K, device="cuda").to(dtype)
        w = (torch.randn(n, K, device="cuda") / K**0.5).to(dtype)
        g = (1 + 0.1 * torch.randn(K, device="cuda")).to(dtype)
        ref = reference.rmsnorm_linear_float64(x, w, g, EPS)
        nbytes = (m * K + n * K + K + m * n) * 2
        base = plan_rmsnorm_linear(m, n, K, dtype)
        grid = vector_grid() if m == 1 else decode_grid() if m <= 64 else middle_grid()
        candidates = [("torch-unfused", lambda: reference.rmsnorm_linear_reference(x, w, g, EPS)),
                      ("torch.compile", lambda: compiled(x, w, g, EPS)),
                      ("lab:autotuned", lambda: rmsnorm_linear(x, w, g, EPS))]
        for cfg in grid:
            plan = replace(base, autotuned=False, candidates=1, config=cfg)
            if "BLOCK_M" in cfg:
                name = "lab:m{BLOCK_M}n{BLOCK_N}k{BLOCK_K}s{num_stages}w{num_warps}x{SPLIT_K}".format(**cfg)
            else:
                name = "lab:{form}-n{block_n}k{block_k}s{load_stages}w{num_warps}x{split_k}{swap}".format(**cfg)
            candidates.append((name, lambda p=plan: rmsnorm_linear_fwd(x, w, g, EPS, p)[0]))
        for name, fn in candidates:
            row = {"M": m, "N": n, "K": K, "variant": name}
            try:
                out = fn()
                row["rel_err"] = ((out.double() - ref).norm() / ref.norm()).item()
                ms = do_bench(fn, warmup=10, rep=60, return_mode="median")
                row.update(us=ms * 1e3, gbs=nbytes / ms / 1e6, pct=100 * nbytes / ms / 1e6 / ceiling,
                           tflops=2 * m * n * K / ms / 1e9)
                if name in ("torch-unfused", "torch.compile", "lab:autotuned"):
                    row["host_us"] = host_us(fn)
            except Exception as e:  # a config that cannot compile or run here is a finding
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    result["wall_s"] = time.time() - start
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    for m, n in SHAPES:
        rows = [r for r in result["rows"] if (r["M"], r["N"]) == (m, n) and "us" in r]
        best = min((r for r in rows if r["variant"].startswith("lab:")), key=lambda r: r["us"])
        peer = min((r for r in rows if not r["variant"].startswith("lab:")), key=lambda r: r["us"])
        auto = next(r for r in rows if r["variant"] == "lab:autotuned")
        print(f"M={m:<4} N={n:<6} best {best['variant']:<28} {best['us']:7.1f} us ({best['pct']:4.1f}%)  "
              f"autotuned {auto['us']:7.1f}  peer {peer['variant']} {peer['us']:7.1f} us  "
              f"speedup {peer['us'] / best['us']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
