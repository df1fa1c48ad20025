"""Compile the decode kernels for sm_90a without a GPU and count the instructions of their main loops.

    python -m probes.sass_decode > notes/probes/<date>-sm90a-decode-sass.txt

For each launch plan: registers and spills (ptxas -v), shared memory, whether the product runs on the
warpgroup MMA (wgmma) or mma.sync, and per K-loop iteration the instruction count, the count per weight
element a thread handles, and the commonest opcodes. Instructions per weight against the rate weights
arrive at the copy ceiling (bytes per clock per SM over bytes per weight) says whether a loop can keep up
with DRAM: an SM issues 128 thread-instructions a clock. A reading of the code, not a timing.
Uses the ptxas and nvdisasm that ship with Triton.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # compiled kernels, never the interpreter's (imported, the caller decides)
    os.environ.pop("TRITON_INTERPRET", None)
if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402

from kernels import dequant_linear as dl  # noqa: E402
from kernels import rmsnorm_gemv as rg  # noqa: E402
from kernels._gemv import GemvPlan  # noqa: E402
from probes.compiled import compile_for_sm90a, int8_gemv_for_sm90a, opcodes, sass_loop  # noqa: E402

QUESTION = ("What does the inner loop of each decode GEMV kernel compile to on sm_90a: instructions a weight, "
            "conversions, loads?")
CANDIDATES = ("rmsnorm-gemv", "int8 dequant", "int4 dequant")
SHAPES = "the decode plans' tiles (compiled only, no shapes run)"
OUTPUTS = {"decode-sass": ("notes/probes/2026-11-23-sm90a-decode-sass.txt",)}

def report(label: str, kernel, weights_per_thread: float) -> None:
    regs, spills, body = sass_loop(kernel)
    mma = "wgmma" if "wgmma" in kernel.asm["ptx"] else "mma.sync" if "mma.sync" in kernel.asm["ptx"] else "-"
    top = " ".join(f"{op}:{n}" for op, n in opcodes(body).most_common(8))
    print(f"{label:<44} regs {regs:>3} spill {spills:>3} "
          f"smem {kernel.metadata.shared:>6} {mma:<8} loop {len(body):>4} instr, "
          f"{len(body) / weights_per_thread:5.2f} per weight | {top}")


def rmsnorm(plan: GemvPlan) -> None:
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "gamma_ptr": "*bf16", "y_ptr": "*bf16", "r_ptr": "*fp32",
           "part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
           "stride_wn": "i32", "stride_ym": "i32", "eps": "fp32"}
    const = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, SPLIT_K=plan.split_k,
                 USE_DOT=plan.form == "dot", SWAP=plan.swap, RMS_IN_LOOP=True, STORE_R=False, EVEN_K=True,
                 LOAD_STAGES=plan.load_stages, EVICT="", DOT_F32=False)
    k = compile_for_sm90a(rg._rmsnorm_gemv_kernel, sig, const, plan.num_warps)
    report(f"rmsnorm {plan.form} m{plan.block_m} n{plan.block_n} k{plan.block_k} w{plan.num_warps}"
           f"{' W-first' if plan.form == 'dot' and plan.swap else ''}", k,
           plan.block_n * plan.block_k / (32 * plan.num_warps))


def int8(plan: GemvPlan, fast: bool = True) -> None:
    k = int8_gemv_for_sm90a(dl._int8_linear_kernel, plan, fast)
    report(f"int8 {plan.form} m{plan.block_m} n{plan.block_n} k{plan.block_k} w{plan.num_warps}"
           f"{'' if fast else ' plain-cvt'}", k, plan.block_n * plan.block_k / (32 * plan.num_warps))


def int4(plan: GemvPlan, group: int = 128) -> None:
    sig = {"x_ptr": "*bf16", "p_ptr": "*u8", "s_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
           "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_pn": "i32",
           "stride_sn": "i32", "stride_ym": "i32"}
    const = dict(GROUP=group, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
                 SPLIT_K=plan.split_k, EVEN_K=True, LOAD_STAGES=plan.load_stages, EVICT="", DOT_F32=False)
    k = compile_for_sm90a(dl._int4_linear_kernel, sig, const, plan.num_warps)
    report(f"int4 {plan.form} m{plan.block_m} n{plan.block_n} k{plan.block_k} g{group} w{plan.num_warps}", k,
           plan.block_n * plan.block_k / (32 * plan.num_warps))


def main() -> int:
    print(f"Triton {triton.__version__}, sm_90a, offline (no GPU). Weights per clock per SM at 3 TB/s on 132 SMs "
          f"at 1.75 GHz: bf16 6.5, int8 13, int4 26; an SM issues 128 thread-instructions a clock.")
    for m in (1, 16):
        rmsnorm(rg.plan_rmsnorm_gemv(m, 4096, 4096, __import__("torch").bfloat16))
    rmsnorm(GemvPlan("fma", 4, 4, 256, 1, 4, 4, False))
    rmsnorm(GemvPlan("dot", 16, 64, 256, 4, 4, 4, False))
    for m in (1, 16):
        int8(dl.plan_dequant_linear(8, m, 4096, 4096))
    int8(dl.plan_dequant_linear(8, 1, 4096, 4096), fast=False)
    for plan in (GemvPlan("dot", 16, 64, 128, 1, 4, 4), GemvPlan("dot", 16, 64, 512, 1, 4, 3),
                 dl.plan_dequant_linear(4, 1, 4096, 4096), GemvPlan("dot", 16, 128, 128, 1, 8, 3),
                 dl.plan_dequant_linear(4, 64, 4096, 4096)):
        int4(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
