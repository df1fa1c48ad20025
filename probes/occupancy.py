#!/usr/bin/env python3
"""How many programs of a softmax plan's kernel fit one SM, read from the compiler (no GPU needed).

    python -m probes.occupancy --n 21439 [--m 12521] [--dtype bfloat16] [--direction forward] [--impl auto]
                               [--arch 90] [--sms 132] [--maxnreg R]
    python -m probes.occupancy --record records/softmax-any-n/RUN.json.gz [--profile triton-auto]
                               [--direction forward] [--min-n 2048]

Plans the launch as kernels/softmax.py does on a GPU of `--sms` SMs with clusters (the H100's 132 by default),
compiles the kernel it launches for `--arch` with the launch's specialisation (tensors on 16-byte boundaries,
integers that are multiples of 16 marked so), and reads the registers a thread, the bytes spilled and the
shared memory from ptxas (Triton's own, `-v`). From those and the SM's limits (sm_80 and later: 65,536
registers, 64 warps, 32 programs, 228 KiB of shared memory with 1 KiB reserved a program) it gives the programs
one SM holds at once, which limit binds, and for a persistent plan the programs an SM its grid asks for.
A compile-time reading for tuning, not a measurement: what the plan does with that occupancy only a GPU says.
With --record, each point of a softmax run record: the plan the record holds for the profile, compiled the
same way, beside the % of the copy ceiling the record measured for it (one line of JSON a point).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.softmax import _bwd_launch, _fresh_workspace, _fwd_launch, plan_softmax  # noqa: E402
from kernels.softmax_plan import SoftmaxPlan  # noqa: E402
from probes.compiled import Occupancy, occupancy, ptxas_registers  # noqa: E402, F401 - the study's rules, re-exported

QUESTION = ("How many programs of a softmax plan's kernel fit one SM, and which limit binds, read from the "
            "compiler for sm_90 without a GPU?")
CANDIDATES = ("the plan's kernel as compiled", "the same under --maxnreg")
SHAPES = "any (--n, --m), or every point of a softmax run record (--record)"
OUTPUTS: dict[str, tuple[str, ...]] = {}  # prints JSON lines; notes/softmax-any-n.md quotes them
_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32"}

def signature(kernel, args, meta) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of `kernel` called with positional `args` and keyword `meta`, specialised
    as a launch specialises them: tensors 16-byte aligned, integers equal to 1 made constants, multiples of 16
    marked divisible by 16."""
    sig, constexprs, attrs = {}, {}, {}
    fixed = set(getattr(kernel, "do_not_specialize", ()))  # parameters a launch never specialises
    for index, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + _TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool) or value is None:
            sig[name], constexprs[name] = "constexpr", value
        elif isinstance(value, int):
            if value == 1 and index not in fixed:
                sig[name], constexprs[name] = "constexpr", 1
                continue
            sig[name] = "i64" if abs(value) >= 2**31 else "i32"
            if value % 16 == 0 and index not in fixed:
                attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    for name, value in meta.items():
        if name in kernel.arg_names:
            sig[name], constexprs[name] = "constexpr", value
    return {name: sig[name] for name in kernel.arg_names if name in sig}, constexprs, attrs


def compile_facts(kernel, args, meta, arch: int, maxnreg: int | None = None) -> dict:
    """Compile for `arch` without a GPU; registers a thread, spilled bytes and shared bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, constexprs, attrs = signature(kernel, args, meta)
    options = {k: v for k, v in meta.items() if k not in kernel.arg_names}
    if maxnreg:
        options["maxnreg"] = maxnreg
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", arch, 32), options=options)
    registers, spilled = ptxas_registers(compiled, arch)
    return {"kernel": kernel.__name__, "registers": registers, "spill_store_bytes": spilled,
            "shared_bytes": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps}


def plan_occupancy(m: int, n: int, dtype: torch.dtype, direction: str = "forward", impl: str = "auto",
                   arch: int = 90, sms: int = 132, maxnreg: int | None = None,
                   plan: SoftmaxPlan | None = None) -> dict:
    """The plan for an m x n softmax in `direction` (or the given `plan`) and what one SM holds of its
    kernel, with the bytes of rows its resident programs hold (`held_kib`)."""
    if plan is None:
        plan = plan_softmax(m, n, dtype, impl, True, direction, sms=sms, clusters=arch >= 90)
    x = torch.empty(m, n, dtype=dtype, device="meta")  # shapes and strides only: nothing is allocated
    if direction == "forward":
        kernel, _, args, meta = _fwd_launch(x, torch.empty_like(x), plan, _fresh_workspace)
    else:
        kernel, _, args, meta = _bwd_launch(x, torch.empty_like(x), torch.empty_like(x), plan, _fresh_workspace)
    facts = compile_facts(kernel, args, meta, arch, maxnreg)
    fit = occupancy(facts["registers"], facts["num_warps"], facts["shared_bytes"])
    elements = plan.block_n if plan.impl == "split_row" else min(n, plan.block_n + plan.tail_n) * plan.rows_per_program
    out = {"plan": plan.as_dict(), **facts, "programs_an_sm": fit.programs, "limit": fit.limit,
           "by_limit": fit.by_limit, "held_kib": round(fit.programs * elements * x.element_size() / 1024, 1)}
    if plan.stages > 1:  # a persistent grid: the programs an SM it was planned for
        out["planned_programs_an_sm"] = math.ceil(plan.grid / sms)
    return out


def record_occupancy(path: Path, profile: str, direction: str, min_n: int = 0, arch: int = 90, sms: int = 132):
    """Per point of a softmax run record (N >= min_n): the profile's recorded plan, compiled, beside the % of
    the copy ceiling the record measured for it."""
    from lab.evidence.store import load_record

    record = load_record(path)
    for point in record.points:
        result = point.results.get(profile)
        m, n = point.shape.get("M"), point.shape.get("N")
        if result is None or result.status != "ok" or not result.plan or m is None or n is None or n < min_n:
            continue
        report = plan_occupancy(m, n, getattr(torch, point.dtype), direction, arch=arch, sms=sms,
                                plan=SoftmaxPlan(**result.plan))
        yield {"case": point.case, "dtype": point.dtype, "pct_of_ceiling": round(result.pct_of_ceiling, 1),
               **{k: report[k] for k in ("registers", "spill_store_bytes", "programs_an_sm", "limit", "held_kib")},
               "planned_programs_an_sm": report.get("planned_programs_an_sm"), "plan": result.plan}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, help="row length")
    parser.add_argument("--m", type=int, help="rows (default: M*N*2 bytes of 256 MiB)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="bfloat16")
    parser.add_argument("--direction", choices=("forward", "backward"), default="forward")
    parser.add_argument("--impl", default="auto")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm_90")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--maxnreg", type=int, help="cap the registers a thread")
    parser.add_argument("--record", type=Path, help="a softmax run record: every point's recorded plan")
    parser.add_argument("--profile", default="triton-auto", help="with --record: whose plans")
    parser.add_argument("--min-n", type=int, default=0, help="with --record: points of at least this N")
    args = parser.parse_args()
    if args.record is not None:
        for row in record_occupancy(args.record, args.profile, args.direction, args.min_n, args.arch, args.sms):
            print(json.dumps(row), flush=True)
        return 0
    if args.n is None:
        parser.error("give --n (a row length) or --record (a run record)")
    m = args.m or math.ceil((256 << 20) / (2 * args.n))
    print(json.dumps(plan_occupancy(m, args.n, getattr(torch, args.dtype), args.direction, args.impl, args.arch,
                                    args.sms, args.maxnreg), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
