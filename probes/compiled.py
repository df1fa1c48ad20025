"""What probes read from a compiled kernel without a GPU: a Triton kernel compiled for sm_90a from its signature (the
decode GEMVs' int8 kernel among them), its registers and spilled bytes as ptxas reports them, its longest loop as
nvdisasm prints it, and how many programs of it one SM holds by the CUDA occupancy rules (probes/occupancy.py's
study, the any-N rounds' shared-memory forms). Shared by probes; not a probe itself.
"""

from __future__ import annotations

import collections
import math
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


# Per SM, compute capability 8.0 and later (the CUDA occupancy rules): registers, warps, resident programs,
# shared memory in bytes, and what each program reserves of it.
REGISTERS, WARPS, PROGRAMS, SHARED, SHARED_RESERVED = 65536, 64, 32, 228 * 1024, 1024
REGISTER_UNIT = 256  # registers are given to a warp in units of 256


@dataclass(frozen=True)
class Occupancy:
    programs: int  # resident programs an SM
    limit: str  # "registers", "warps", "programs" or "shared memory"
    by_limit: dict


def occupancy(registers: int, warps: int, shared: int) -> Occupancy:
    """Programs of `warps` warps, `registers` a thread and `shared` bytes one SM holds at once."""
    per_warp = math.ceil(registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
    by_limit = {
        "registers": REGISTERS // (per_warp * warps) if registers else PROGRAMS,
        "warps": WARPS // warps,
        "programs": PROGRAMS,
        "shared memory": SHARED // (shared + SHARED_RESERVED) if shared else PROGRAMS,
    }
    limit = min(by_limit, key=by_limit.get)
    return Occupancy(by_limit[limit], limit, by_limit)


def ptxas_registers(compiled, arch: int) -> tuple[int, int]:
    """(registers a thread, spilled bytes) of a kernel compiled for sm_`arch`, as `ptxas -v` reports them."""
    from triton.backends.nvidia.compiler import get_ptxas

    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{suffix}", str(ptx), "-o",
                                 str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True, check=True).stderr
    registers = int(re.findall(r"Used (\d+) registers", report)[-1])
    return registers, sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", report))


def loop_bodies(sass: str) -> list[list[str]]:
    """Instruction lists of the backward branches' bodies (the loops), longest first."""
    labels, ins = {}, []
    for line in sass.splitlines():
        if m := re.match(r"^\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(ins)
        elif m := re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?);", line):
            ins.append(m.group(1))
    bodies = []
    for i, text in enumerate(ins):
        m = re.search(r"BRA (?:`\()?(\.L_x_\d+)", text)
        if m and labels.get(m.group(1), i) < i:
            bodies.append(ins[labels[m.group(1)]:i + 1])
    return sorted(bodies, key=len, reverse=True)


# As the launcher sees real tensors: 16-byte aligned pointers, and these sizes and strides multiples of 16.
ALIGNED = ("N", "K", "stride_xm", "stride_wn", "stride_ym", "stride_qn", "stride_pn", "stride_sn")
INT8_SIGNATURE = {"x_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
                  "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_qn": "i32",
                  "stride_ym": "i32"}


def compile_for_sm90a(fn, signature: dict, constexprs: dict, num_warps: int):
    """Triton kernel `fn` compiled for sm_90a from its signature and constexprs alone (no GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(signature)
             if signature[n].startswith("*") or n in ALIGNED}
    src = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs,
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 1})


def int8_gemv_for_sm90a(fn, plan, fast: bool = True):
    """kernels/dequant_linear.py's int8 kernel (or a copy of it, `fn`) compiled for sm_90a as `plan` launches it,
    bf16 activations, K even."""
    const = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, SPLIT_K=plan.split_k,
                 USE_DOT=plan.form == "dot", EVEN_K=True, LOAD_STAGES=plan.load_stages, EVICT="", DOT_F32=False,
                 FAST_CVT=fast)
    return compile_for_sm90a(fn, INT8_SIGNATURE, const, plan.num_warps)


def sass_loop(compiled) -> tuple[int, int, list[str]]:
    """(registers a thread, spilled bytes, the longest loop's instructions) of a kernel compiled for sm_90a."""
    import triton

    registers, spilled = ptxas_registers(compiled, 90)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm", "-c", cubin],
                              capture_output=True, text=True).stdout
    return registers, spilled, loop_bodies(sass)[0]


def opcodes(body: list[str]) -> collections.Counter:
    """How often each opcode (predicate and modifiers dropped) occurs in a list of SASS instructions."""
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", b).split()[0].split(".")[0] for b in body)
