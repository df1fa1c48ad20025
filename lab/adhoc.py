"""benchmark-softmax: time the softmax experiments' profiles on one shape and print a table.

    benchmark-softmax --backend all --device cuda --rows 4096 --cols 1024 --dtype float16
    benchmark-softmax --backend triton-auto,liger --direction backward --rows 8192 --cols 4096

The profiles, inputs, accuracy check and timing are exactly those of the sweeps (softmax-fwd-sweep or
softmax-bwd-sweep), through lab.measure.runner.measure_point: correctness first, then L2-flushed CUDA-event
timing in interleaved rounds, with the copy ceiling measured in the same process. Nothing is recorded:
the evidence pages come only from tools/build_results.py.

With --device cpu (and TRITON_INTERPRET=1) the same path runs through Triton's interpreter; its table is
labelled "cpu-interpreter: not performance evidence".

A shape whose tensors cannot fit in the device's memory is refused before anything is allocated; a profile
that fails is named with its whole message under the table.

Exit codes: 0 every selected profile ran correctly (or was skipped with a reason); 1 some profile was
incorrect or raised; 2 bad arguments, no device to run on, or a shape too large for it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
EXPERIMENT_BY_DIRECTION = {"forward": "softmax-fwd-sweep", "backward": "softmax-bwd-sweep"}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmark-softmax",
        description="Check and time the softmax profiles on one M x N shape (not recorded).",
        epilog="Exit codes: 0 all correct; 1 a profile was incorrect or raised; 2 bad arguments or no device.",
    )
    parser.add_argument("--backend", default="all",
                        help="'all' or comma-separated profile names (see --list-backends)")
    parser.add_argument("--device", default="cuda", help="'cuda', 'cuda:N', or 'cpu' (needs TRITON_INTERPRET=1)")
    parser.add_argument("--rows", type=_positive, default=4096, help="M, the number of rows")
    parser.add_argument("--cols", type=_positive, default=1024, help="N, the row length")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    parser.add_argument("--direction", choices=sorted(EXPERIMENT_BY_DIRECTION), default="forward")
    parser.add_argument("--list-backends", action="store_true", help="print the profile names and exit")
    return parser.parse_args(argv)


# Bytes per element the check holds at once: input and output in the dtype, the float64 reference, and for
# the backward the upstream gradient and the input gradient too.
TENSORS_HELD = {"forward": 2, "backward": 4}


def _memory_bytes(device: str) -> int | None:
    """The memory the device has (the GPU's, or the host's for the CPU), None when it cannot be told."""
    try:
        if torch.device(device).type == "cuda":
            index = torch.device(device).index
            return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None


def _size_problem(args) -> str | None:
    """Why --rows x --cols cannot be checked and timed on the device, or None."""
    elements = args.rows * args.cols
    needed = elements * (TENSORS_HELD[args.direction] * DTYPES[args.dtype].itemsize + 8)
    have = _memory_bytes(args.device)
    if have is not None and needed > have:
        return (f"--rows {args.rows:,} x --cols {args.cols:,} is {elements:,} elements: its {args.direction} check "
                f"holds about {needed / 2**30:,.1f} GiB ({args.dtype} tensors and a float64 reference), and "
                f"{args.device} has {have / 2**30:,.1f} GiB; choose a smaller shape")
    return None


def _device_problem(device: str) -> str | None:
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        return f"unknown device {device!r}; accepted: cuda, cuda:N, cpu"
    from kernels._checks import interpreter_enabled

    if kind == "cuda" and not torch.cuda.is_available():
        return ("no CUDA GPU is available here. Run on a machine with an NVIDIA GPU, or use --device cpu with "
                "TRITON_INTERPRET=1 set to exercise the same path through Triton's interpreter (not a benchmark)")
    if kind == "cuda" and interpreter_enabled():
        return "TRITON_INTERPRET is set: unset it to time the compiled kernels on the GPU"
    if kind == "cpu" and not interpreter_enabled():
        return "--device cpu needs TRITON_INTERPRET=1 set in the environment (Triton's interpreter)"
    if kind not in ("cuda", "cpu"):
        return f"unsupported device {device!r}; accepted: cuda, cuda:N, cpu"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from experiments import get_experiment

    experiment = get_experiment(EXPERIMENT_BY_DIRECTION[args.direction])
    names = [p.name for p in experiment.profiles]
    if args.list_backends:
        print("\n".join(names))
        return 0
    wanted = names if args.backend == "all" else [n.strip() for n in args.backend.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown or not wanted:
        print(f"benchmark-softmax: unknown backend(s) {', '.join(unknown) or '(none)'}; "
              f"accepted: all, {', '.join(names)}", file=sys.stderr)
        return 2
    problem = _device_problem(args.device) or _size_problem(args)
    if problem:
        print(f"benchmark-softmax: {problem}", file=sys.stderr)
        return 2

    from experiments.spec import Case
    from lab.measure.environment import capture_environment
    from lab.measure.runner import measure_point
    from lab.measure.timing import CPU_TIMING, GPU_TIMING, make_clock, measure_copy_ceiling

    reference = experiment.claim.baselines[0]
    selected = [p for p in experiment.profiles if p.name in wanted or p.name == reference]
    on_gpu = torch.device(args.device).type == "cuda"
    params = GPU_TIMING if on_gpu else CPU_TIMING
    clock = make_clock(args.device)
    ceiling = measure_copy_ceiling(clock, args.device, params)
    case = Case(f"{args.rows}x{args.cols}", {"M": args.rows, "N": args.cols})
    point = measure_point(experiment, case, DTYPES[args.dtype], device=args.device, clock=clock, params=params,
                          ceiling_gbps=ceiling.gbps, profiles=selected)
    env = capture_environment(args.device)
    print(format_table(point, reference, env["gpu_name"], ceiling.gbps, args, on_gpu))
    bad = [name for name, r in point.results.items() if r.status in ("incorrect", "error")]
    return 1 if bad else 0


def format_table(point, reference: str, device_name: str, ceiling_gbps: float, args, on_gpu: bool) -> str:
    """The printed report: a heading, then one aligned row per profile."""
    from lab.publish import formatting as fmt

    base = point.results.get(reference)
    base_ms = base.p50_ms if base is not None and base.status == "ok" else None
    lines = []
    if not on_gpu:
        lines.append("cpu-interpreter: not performance evidence (Triton's interpreter on the CPU)")
    lines.append(f"softmax {args.direction}, {args.rows} x {args.cols} {args.dtype} on {device_name}; "
                 f"copy ceiling {fmt.gbps(ceiling_gbps)} GB/s; {point.bytes_moved:,} bytes moved per call")
    header = ("profile", "status", "p50 µs", "p20-p80 µs", "GB/s", "% ceiling", f"vs {reference}")
    rows = [header]
    for name, r in point.results.items():
        ok = r.status == "ok"
        speedup = fmt.ratio(base_ms / r.p50_ms) if ok and base_ms and r.p50_ms else fmt.DASH
        status = r.status if ok else f"{r.status}: {r.reason or r.error or ''}".strip()
        rows.append((name, status, fmt.latency_us(r.p50_ms), fmt.latency_range_us(r.p20_ms, r.p80_ms),
                     fmt.gbps(r.gbps), fmt.percent(r.pct_of_ceiling), speedup))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = [row[0].ljust(widths[0]), _clip(row[1]).ljust(min(widths[1], 60))]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    failed = [(name, r) for name, r in point.results.items() if r.status != "ok" and (r.reason or r.error)]
    if any(len(r.status) + len(r.reason or r.error) + 2 > 60 for _, r in failed):
        lines += ["", "in full:"] + [f"  {name}: {r.status}: {r.reason or r.error}" for name, r in failed]
    return "\n".join(lines)


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


if __name__ == "__main__":
    sys.exit(main())
