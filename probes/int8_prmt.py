"""Probe: does converting int8 weights with one byte permute each (PRMT) instead of a sign-extend, an integer add
and a float subtraction cut the int8 GEMV's instructions a weight, and its time? (kernels/dequant_linear.py)

    python probes/int8_prmt.py --compile   (the CPU: the plan's and the candidate's loops compiled for sm_90a)
    python probes/int8_prmt.py OUT_DIR      (the GPU: checks, then the graph clock; OUT_DIR/int8_prmt.json)

The int8 kernel turns each weight q into a float without the integer-to-float instruction: q sign-extended to
32 bits (a PRMT), 0x4B000080 added (an integer add) and the sum, read as the float 2^23 + 128 + q, less
2^23 + 128 (FADD) leaves q exactly. Compiled for sm_90a (round decode-sass, probes/sass_decode.py) the one-row
loop spends 5.9 instructions a weight on that and its FFMA, the tensor-core loop 6.2 (two more a weight to take
the bfloat16 top half); at the H200's copy rate an SM can issue about 7 a weight, so the int8 GEMV is held by
its own instructions (notes/dequant-linear.md: 27-77% of the weight-read floor against the 85% asked).

The candidate ("prmt") flips each byte's sign bit once for four (one XOR a 32-bit word: u = q + 128) and builds
each float 2^23 + u in one PRMT, which takes the byte and three bytes of 0x4B000000 at once; one FADD leaves q.
On the tensor-core path two such floats, exact in bfloat16, are joined into the operand's bfloat16 pair by one
more PRMT (their top halves). A few lines of PTX (tl.inline_asm_elementwise), four bytes an invocation on the
one-row path and two on the tensor-core one, whose operand holds pairs of consecutive k. Everything else is
kernels/dequant_linear.py's kernel, read as text and compiled from a copy with `_int8_as_float` and the
bfloat16 operand replaced; the q it gives are the plan's, so its outputs must equal the plan's bit for bit.

On the GPU: every shape's output against the plan's, bit for bit, into NaN-filled buffers (M = 1, 2, 3, 4, 8, 16,
64; N = 4,096, 11,007 and 256; K = 4,096 and 1,000; bf16 and fp16), then the plan and the candidate on the graph
clock (16 calls a graph, each on its own copy of the weights, the copies past max(256 MB, 4 x L2)) at M = 1, 4
and 16, N = 4,096 / 12,288 / 14,336 / 11,007, K = 4,096, bf16, each timed twice; the floor is the int8 weight
bytes at the copy rate measured in the same process. A tuning instrument, not evidence.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels import dequant_linear as dl  # noqa: E402
from probes.compiled import int8_gemv_for_sm90a, opcodes, sass_loop  # noqa: E402
from probes.harness import environment, module_from_source, replace_once, write_output  # noqa: E402

QUESTION = ("Does converting int8 weights with one byte permute each (PRMT) cut the int8 GEMV's instructions a "
            "weight, and its time?")
CANDIDATES = ("the plan: kernels/dequant_linear.py's int8 kernel (sign-extend, integer add, FADD)",
              "prmt: the same kernel with each weight built as the float 2^23 + q + 128 by one PRMT after one XOR "
              "a word, then one FADD (and one PRMT a bfloat16 pair on the tensor cores)")
SHAPES = ("compiled: the plans at M = 1 (CUDA cores) and M = 16 (tensor cores), N = K = 4,096; checked: M = 1-64, "
          "N = 4,096 / 11,007 / 256, K = 4,096 / 1,000, bf16 and fp16; timed: M = 1, 4, 16, N = 4,096 / 12,288 / "
          "14,336 / 11,007, K = 4,096, bf16")
OUTPUTS = {"int8-prmt": ("notes/probes/2026-11-28-sm90a-int8-prmt.txt", "notes/probes/2026-11-28-h200-int8-prmt.json")}

SOURCE = "kernels/dequant_linear.py"
PLAN_CVT = '''def _int8_as_float(q):
    # q (int8) -> fp32, exactly, without an integer-to-float conversion: 2^23 + 128 + q, minus 2^23 + 128.
    return (q.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
'''
PRMT_CVT = '''def _int8_as_float(q):
    # q (int8) -> fp32, exactly: four bytes a word, each sign bit flipped by one XOR (u = q + 128), each u put
    # below the bits of 2^23 by one PRMT (the float 2^23 + u), and 2^23 + 128 taken off.
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 t;
        xor.b32 t, $4, 0x80808080;
        prmt.b32 $0, t, 0x4B000000, 0x7540;
        prmt.b32 $1, t, 0x4B000000, 0x7541;
        prmt.b32 $2, t, 0x4B000000, 0x7542;
        prmt.b32 $3, t, 0x4B000000, 0x7543;
        sub.f32 $0, $0, 0f4B000080;
        sub.f32 $1, $1, 0f4B000080;
        sub.f32 $2, $2, 0f4B000080;
        sub.f32 $3, $3, 0f4B000080;
        }
        """, "=r,=r,=r,=r,r", [q], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _int8_pairs_bf16(q):
    # Two int8 q (consecutive k) -> their bfloat16 pair, exactly: u = q + 128 by one XOR, the floats 2^23 + u by
    # one PRMT each, q by one FADD each, and the two top halves (q is exact in bfloat16) joined by one PRMT.
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 t, f, g;
        xor.b32 t, $1, 0x8080;
        prmt.b32 f, t, 0x4B000000, 0x7540;
        prmt.b32 g, t, 0x4B000000, 0x7541;
        sub.f32 f, f, 0f4B000080;
        sub.f32 g, g, 0f4B000080;
        prmt.b32 $0, f, g, 0x7632;
        }
        """, "=r,r", [q], dtype=tl.bfloat16, is_pure=True, pack=2)
'''
PLAN_BF16 = "wd = (w.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)"
PRMT_BF16 = "wd = _int8_pairs_bf16(q)"


def form_source() -> str:
    """kernels/dequant_linear.py with the candidate's conversions (GPU only: PTX the interpreter cannot run)."""
    text = (ROOT / SOURCE).read_text(encoding="utf-8")
    text = replace_once(text, PLAN_CVT, PRMT_CVT, SOURCE)
    return replace_once(text, PLAN_BF16, PRMT_BF16, SOURCE)


def load_form(folder: Path):
    return module_from_source(folder, "dequant_linear_prmt", form_source())


def compile_report() -> list[dict]:
    """The plan's and the candidate's int8 loops at M = 1 and 16 (N = K = 4,096, bf16), compiled for sm_90a."""
    folder = Path(tempfile.mkdtemp(prefix="int8-prmt-"))
    try:
        form = load_form(folder)
        rows = []
        for m in (1, 16):
            plan = dl.plan_dequant_linear(8, m, 4096, 4096)
            for name, module in (("plan", dl), ("prmt", form)):
                registers, spilled, body = sass_loop(int8_gemv_for_sm90a(module._int8_linear_kernel, plan))
                weights = plan.block_n * plan.block_k / (32 * plan.num_warps)
                rows.append({"form": name, "M": m, "path": plan.form, "registers": registers, "spilled_bytes": spilled,
                             "loop_instructions": len(body), "per_weight": round(len(body) / weights, 2),
                             "opcodes": dict(opcodes(body).most_common(8))})
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _checks(form) -> list[dict]:
    from kernels.quantize import quantize_int8

    rows = []
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261130)
    for dtype in (torch.bfloat16, torch.float16):
        for n, k in ((4096, 4096), (11007, 4096), (256, 1000)):
            w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
            q, s = quantize_int8(w)
            for m in (1, 2, 3, 4, 8, 16, 64):
                x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
                plan = dl.plan_dequant_linear(8, m, n, k)
                want = dl.int8_linear_fwd(x, q, s, plan, torch.full((m, n), float("nan"), dtype=dtype, device="cuda"))
                got = form.int8_linear_fwd(x, q, s, plan, torch.full((m, n), float("nan"), dtype=dtype, device="cuda"))
                rows.append({"dtype": str(dtype), "M": m, "N": n, "K": k, "path": plan.form,
                             "equal": bool(torch.equal(got, want))})
    return rows


def _timings(form) -> list[dict]:
    from checks.decode_probe import copy_ceiling_gbs, graph_us, n_copies
    from kernels.quantize import quantize_int8

    ceiling = copy_ceiling_gbs()
    rows = []
    for n in (4096, 12288, 14336, 11007):
        w = (torch.randn(n, 4096, device="cuda") / 64).to(torch.bfloat16)
        q, s = quantize_int8(w)
        copies = [(q.clone(), s.clone()) for _ in range(n_copies(n * 4096))]
        floor_us = n * 4096 / ceiling / 1e3
        for m in (1, 4, 16):
            x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
            plan = dl.plan_dequant_linear(8, m, n, 4096)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            row = {"M": m, "N": n, "path": plan.form, "floor_us": round(floor_us, 2), "copy_ceiling_gbs": round(ceiling)}
            for name, module in (("plan", dl), ("prmt", form), ("plan_again", dl), ("prmt_again", form)):
                row[name] = round(graph_us(lambda x, qq, ss, module=module: module.int8_linear_fwd(x, qq, ss, plan, out),
                                           [(x, qq, ss) for qq, ss in copies]), 2)
            best = {f: min(row[f], row[f + "_again"]) for f in ("plan", "prmt")}
            row["plan_over_prmt"] = round(best["plan"] / best["prmt"], 3)
            row["pct_floor"] = {f: round(100 * floor_us / t, 1) for f, t in best.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del copies
    return rows


def main() -> int:
    if sys.argv[1:] == ["--compile"]:
        for row in compile_report():
            print(json.dumps(row))
        return 0
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "int8_prmt.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES,
              "clock": "CUDA-graph replay, weights rotated past the L2 (checks/decode_probe.py's graph_us); GPU time"}
    folder = Path(tempfile.mkdtemp(prefix="int8-prmt-"))
    try:
        form = load_form(folder)
        result["checks"] = _checks(form)
        result["all_equal"] = all(r["equal"] for r in result["checks"])
        write_output(output, result)
        print("all equal:", result["all_equal"], flush=True)
        if not result["all_equal"]:
            return 1
        result["experiment"] = _timings(form)
        write_output(output, result)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
