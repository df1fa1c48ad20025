"""Nsight Compute's side of profiling: the command, the metrics asked for, reading its raw-page CSV into
per-kernel facts and per-point totals, and telling from its output whether it could read the counters.

lab.measure.profiling decides what to profile and writes the facts into the record; this module only speaks
ncu's language.
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from lab.measure.profiling import Target

RANGE_PREFIX = "kernel-lab-point-"

DURATION = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
REGISTERS = "launch__registers_per_thread"
GRID = "launch__grid_size"
BLOCK = "launch__block_size"
LOCAL_LOAD = "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
LOCAL_STORE = "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
# On Hopper the HMMA pipe counter also counts the warpgroup (HGMMA/QGMMA) instructions; there is no separate
# "gmma cycles" counter. The GMMA instruction count tells whether a kernel used the warpgroup path at all.
TENSOR_PCT = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
GMMA_INSTRUCTIONS = "sm__inst_executed_pipe_tensor_op_gmma.sum"

# Floating-point instructions executed on the SMs' FP pipes, per thread, by precision (h, f, d): an add or a
# multiply is one FLOP, a fused multiply-add two (Nsight Compute's roofline counts them so). Tensor-core work
# is not among them. The roofline of an experiment that declares no FLOP model uses their sum.
FP_INSTRUCTION_FLOPS = {f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": 2 if op == "fma" else 1
                        for p in "hfd" for op in ("add", "mul", "fma")}

# What is collected for every profiled kernel. A metric this GPU does not have is left out of ncu's output
# (and so out of the record), never reported as zero.
METRICS = (DURATION, DRAM_READ, DRAM_WRITE, DRAM_PCT, SM_PCT, REGISTERS, GRID, BLOCK, LOCAL_LOAD, LOCAL_STORE,
           TENSOR_PCT, GMMA_INSTRUCTIONS, *FP_INSTRUCTION_FLOPS)

# ncu is asked for base units; other spellings are scaled to them rather than misread.
_TO_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_TO_BYTES = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}
_RANGE = re.compile(rf"{re.escape(RANGE_PREFIX)}(\d+)(?!\d)")
_NVTX_COLUMN = "Push/Pop_Range"
# Messages by which ncu says it could not read the counters even where it exits 0.
_FATAL_MARKERS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "Failed to initialize the profiler",
                  "Failed to connect", "Profiling failed")
MESSAGE_LINES = 6


class NcuOutputError(ValueError):
    """ncu's output holds no raw-page CSV that this module can read; the message says what was missing."""


# --------------------------------------------------------------------------------------------------------
# Reading ncu's raw page
# --------------------------------------------------------------------------------------------------------


def read_raw_csv(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """ncu's `--csv --page raw` output: rows (one per profiled kernel, column -> cell) and units (column -> unit).

    The CSV shares stdout with ncu's ==PROF==/==WARNING== lines and whatever the program printed, all before
    it: reading starts at the header row (its first cell is "ID"); the row after it holds the units.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise NcuOutputError('no raw-page CSV in ncu\'s output (no header row starting with "ID")')
    body = [line for line in lines[start:] if line.strip() and not line.startswith("==")]
    table = list(csv.reader(io.StringIO("\n".join(body))))
    if len(table) < 2:
        raise NcuOutputError("ncu's CSV has a header but no units row")
    header, units = table[0], table[1]
    if len(units) != len(header):
        raise NcuOutputError(f"ncu's units row has {len(units)} cells for {len(header)} columns")
    rows = []
    for number, cells in enumerate(table[2:], start=3):
        if len(cells) != len(header):
            raise NcuOutputError(f"ncu's CSV row {number} has {len(cells)} cells for {len(header)} columns")
        rows.append(dict(zip(header, cells, strict=True)))
    return rows, dict(zip(header, units, strict=True))


def number(cell: str) -> int | float | None:
    """A CSV cell as a number ("1,980,000" -> 1980000, "15.82" -> 15.82), or None for an empty or
    non-numeric cell ("", "n/a", "PolicySpread")."""
    text = cell.strip().replace(",", "")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def short_kernel_name(name: str) -> str:
    """A kernel's name without its return type, namespaces, template arguments and parameter list:
    "void at::vectorized_elementwise_kernel<8, ...>(int, T2, T3)" -> "vectorized_elementwise_kernel"."""
    text = name.strip()
    while True:  # innermost template brackets first, until none are left
        stripped = re.sub(r"<[^<>]*>", "", text)
        if stripped == text:
            break
        text = stripped
    depth, cut = 0, len(text)
    for i, char in enumerate(text):
        if char == "(" and depth == 0 and i > 0:
            cut = i
            break
    words = text[:cut].split()
    short = words[-1].split("::")[-1] if words else ""
    return short or name.strip()[:80]


def kernel_facts(row: Mapping[str, str], units: Mapping[str, str], metrics: Sequence[str] = METRICS) -> dict:
    """One profiled kernel: ncu's launch id, its short name, and each requested metric ncu reported
    (durations in ns and bytes in bytes whatever unit ncu chose; other units as ncu wrote them)."""
    readings = {}
    for metric in metrics:
        value = number(row.get(metric, ""))
        if value is None:
            continue
        unit = units.get(metric, "")
        scale = _TO_NS.get(unit.lower()) or _TO_BYTES.get(unit.lower())
        if scale is not None and scale != 1.0:
            value, unit = value * scale, ("ns" if unit.lower() in _TO_NS else "byte")
        readings[metric] = {"value": value, "unit": unit}
    launch = number(row.get("ID", ""))
    return {"id": int(launch) if launch is not None else -1,
            "name": short_kernel_name(row.get("Kernel Name", "")),
            "metrics": readings}


def range_index(row: Mapping[str, str]) -> int | None:
    """The target index named by the kernel's NVTX push/pop range (kernel-lab-point-<i>), or None when the
    row names no such range or more than one."""
    found = set()
    for column, cell in row.items():
        if _NVTX_COLUMN in column:
            found.update(int(m) for m in _RANGE.findall(cell))
    return found.pop() if len(found) == 1 else None


def attribute(rows: Sequence[Mapping[str, str]], units: Mapping[str, str], targets: Sequence[Target]
              ) -> tuple[dict[int, list[dict]], int]:
    """Kernels per target index, in launch order, and how many kernels named no known target."""
    known = {t.index for t in targets}
    kernels: dict[int, list[dict]] = {t.index: [] for t in targets}
    unattributed = 0
    for row in rows:
        index = range_index(row)
        if index in known:
            kernels[index].append(kernel_facts(row, units))
        else:
            unattributed += 1
    for found in kernels.values():
        found.sort(key=lambda k: k["id"])
    return kernels, unattributed


def _value(kernel: Mapping, metric: str) -> float | None:
    reading = kernel["metrics"].get(metric)
    return None if reading is None else reading["value"]


def _sum(kernels: Sequence[Mapping], metric: str) -> float | None:
    values = [_value(k, metric) for k in kernels]
    return None if not values or any(v is None for v in values) else sum(values)


def _time_weighted(kernels: Sequence[Mapping], metric: str) -> float | None:
    """The kernels' mean of a percentage, each weighted by its duration: the share of the point's profiled
    time. None when any kernel lacks the metric or its duration."""
    pairs = [(_value(k, DURATION), _value(k, metric)) for k in kernels]
    if not pairs or any(d is None or v is None for d, v in pairs):
        return None
    total = sum(d for d, _ in pairs)
    return sum(d * v for d, v in pairs) / total if total > 0 else None


def _fp_flops(kernels: Sequence[Mapping]) -> float | None:
    """FLOPs of the kernels' executed FP add, multiply and FMA instructions (FP_INSTRUCTION_FLOPS); None when
    some kernel has none of those counters (records made before they were collected, or a GPU without them)."""
    total = 0.0
    for kernel in kernels:
        counts = [(_value(kernel, m), w) for m, w in FP_INSTRUCTION_FLOPS.items()]
        if all(v is None for v, _ in counts):
            return None
        total += sum(v * w for v, w in counts if v is not None)
    return total if kernels else None


def point_totals(kernels: Sequence[Mapping]) -> dict:
    """A point's totals over its kernels: summed duration, DRAM bytes and local-memory (spill) bytes, the
    DRAM bandwidth those bytes over that duration achieved, the highest registers per thread,
    duration-weighted means of the percentages, and the FLOPs of the executed FP instructions. A total is
    None where a kernel lacks what it needs."""
    duration = _sum(kernels, DURATION)
    read, write = _sum(kernels, DRAM_READ), _sum(kernels, DRAM_WRITE)
    dram = read + write if read is not None and write is not None else None
    local_load, local_store = _sum(kernels, LOCAL_LOAD), _sum(kernels, LOCAL_STORE)
    registers = [_value(k, REGISTERS) for k in kernels]
    return {
        "kernels": len(kernels),
        "duration_ns": duration,
        "dram_read_bytes": read,
        "dram_write_bytes": write,
        "dram_bytes": dram,
        "dram_gbps": dram / duration if dram is not None and duration else None,  # bytes per ns = GB/s
        "dram_pct_of_peak": _time_weighted(kernels, DRAM_PCT),
        "sm_pct_of_peak": _time_weighted(kernels, SM_PCT),
        "tensor_pct_of_peak": _time_weighted(kernels, TENSOR_PCT),
        "local_spill_bytes": local_load + local_store if local_load is not None and local_store is not None
        else None,
        "registers_per_thread_max": max(registers) if registers and None not in registers else None,
        "fp_flops": _fp_flops(kernels),
    }


# --------------------------------------------------------------------------------------------------------
# Running ncu and judging what it said
# --------------------------------------------------------------------------------------------------------


def ncu_messages(*streams: str) -> list[str]:
    """ncu's own ==ERROR== and ==WARNING== lines, in order, without repeats."""
    seen: dict[str, None] = {}
    for stream in streams:
        for line in stream.splitlines():
            if line.startswith(("==ERROR==", "==WARNING==")):
                seen.setdefault(line.strip())
    return list(seen)


def last_lines(text: str, count: int = MESSAGE_LINES) -> str:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def ncu_failure(returncode: int, stdout: str, stderr: str) -> str | None:
    """Why ncu's run gave no usable data, in ncu's own words, or None when it looks usable.

    A non-zero exit fails (with ncu's ==ERROR== lines, else the end of what the profiled program wrote on
    stderr, where a Python traceback ends with its reason); so does an exit 0 whose messages say the counters
    could not be read (ncu reports a permission or library problem with ==ERROR== and may still exit 0).
    """
    errors = [line for line in ncu_messages(stdout, stderr) if line.startswith("==ERROR==")]
    fatal = [line for line in errors if any(marker in line for marker in _FATAL_MARKERS)]
    if returncode != 0:
        said = "\n".join(errors[:MESSAGE_LINES]) or last_lines(stderr) or last_lines(stdout)
        return f"ncu exited with status {returncode}" + (f":\n{said}" if said else "")
    if fatal:
        return "\n".join((fatal + [e for e in errors if e not in fatal])[:MESSAGE_LINES])
    return None


def ncu_version(ncu: str) -> str | None:
    """What `ncu --version` says of its version ("2025.3.1.0 (build 36398880) (public-release)" from its
    "Version ..." line; its last line when none starts so), or None if it does not answer."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(out)


def parse_version(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    version = [line[len("version"):].strip() for line in lines if line.lower().startswith("version ")]
    return (version or lines or [None])[-1]


def run_command(command: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
    """Run `command` in its own process group and return (status, stdout, stderr); past `timeout` the whole
    group (ncu and the driver it started) is killed and TimeoutError raised."""
    process = subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise TimeoutError(f"ncu did not finish within {timeout:g} s; it and the profiled program were stopped")
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return process.returncode, stdout, stderr


def child_environment(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env
