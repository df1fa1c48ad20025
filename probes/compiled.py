"""What probes read from a compiled kernel without a GPU: its registers and spilled bytes as ptxas reports them,
and how many programs of it one SM holds by the CUDA occupancy rules (probes/occupancy.py's study, the any-N
rounds' shared-memory forms). Shared by probes; not a probe itself.
"""

from __future__ import annotations

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
