"""Nsight Compute facts per point: which points to profile, the ncu command, its CSV, the record's blocks.

Timings are never taken under a profiler. A run made with profiling first times every point as usual; then
one child process per experiment runs under Nsight Compute's command-line profiler:

    ncu --clock-control none --profile-from-start off --nvtx --csv --page raw --print-units base
        --metrics <METRICS> <python> -m lab.profile_driver --plan plan.json --manifest manifest.json

The driver (lab.profile_driver) redraws each selected point's inputs from the seed recorded for it, calls
each selected profile twice outside any profiled range (compiling, autotuning, filling the allocator's
cache), then once between cudaProfilerStart and cudaProfilerStop inside the NVTX range
`kernel-lab-point-<index>`. With `--profile-from-start off` ncu profiles only kernels launched inside those
ranges, and with `--nvtx` its raw CSV names each kernel's enclosing NVTX range: that name, not the order
of the rows, ties every kernel to its point and profile. A kernel whose range cannot be read is counted as
unattributed, never guessed.

`--clock-control none` leaves the GPU's clocks as they are (ncu would otherwise lock them to base). ncu's
default cache control is kept: it flushes the caches before every replay pass, as the timing flushes the
L2 before every timed call. ncu replays each kernel several times to collect its counters, so its
durations are of replayed, cache-cold kernels and are not the timing evidence.

Failure is a finding: ncu missing, exiting non-zero, or unable to read the counters (ERR_NVGPUCTRPERM,
LibraryNotLoaded, ...) leaves the timed record intact with a run-level block {"error": <ncu's first
lines>, ...} and no per-point facts. `profile_record` never raises for such reasons.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from experiments.spec import Experiment
from lab.records import RunRecord

TOOL = "Nsight Compute"
DRIVER_MODULE = "lab.profile_driver"
RANGE_PREFIX = "kernel-lab-point-"
DEFAULT_MAX_POINTS = 8
DEFAULT_TIMEOUT_S = 1800.0
WARMUP_CALLS = 2

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

# What is collected for every profiled kernel. A metric this GPU does not have is left out of ncu's output
# (and so out of the record), never reported as zero.
METRICS = (DURATION, DRAM_READ, DRAM_WRITE, DRAM_PCT, SM_PCT, REGISTERS, GRID, BLOCK, LOCAL_LOAD, LOCAL_STORE,
           TENSOR_PCT, GMMA_INSTRUCTIONS)

# ncu is asked for base units; other spellings are scaled to them rather than misread.
_TO_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_TO_BYTES = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}
_RANGE = re.compile(rf"{re.escape(RANGE_PREFIX)}(\d+)(?!\d)")
_NVTX_COLUMN = "Push/Pop_Range"
# Messages by which ncu says it could not read the counters even where it exits 0.
_FATAL_MARKERS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "Failed to initialize the profiler",
                  "Failed to connect", "Profiling failed")
_MESSAGE_LINES = 6


class NcuOutputError(ValueError):
    """ncu's output holds no raw-page CSV that this module can read; the message says what was missing."""


# --------------------------------------------------------------------------------------------------------
# What to profile
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfilingRequest:
    """How a run is to be profiled.

    max_points: points (case × dtype) profiled per experiment, spread evenly, first and last included
        (0: every point). profiles: profile names to profile (None: the claim's subject and baselines).
    ncu: the profiler's executable (a name looked up on PATH, or a path). timeout_s: the whole ncu run's limit.
    """

    max_points: int = DEFAULT_MAX_POINTS
    profiles: tuple[str, ...] | None = None
    ncu: str = "ncu"
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_points < 0:
            raise ValueError(f"max_points {self.max_points}: expected 0 (every point) or a positive count")


@dataclass(frozen=True)
class Target:
    """One profiled call: a profile at one point of the record, with the seed its inputs were drawn from."""

    index: int
    point: int  # index into record.points
    case: str
    dtype: str
    profile: str
    seed: int

    @property
    def range_name(self) -> str:
        return f"{RANGE_PREFIX}{self.index}"


def evenly(count: int, limit: int) -> list[int]:
    """`limit` indices spread evenly over range(count), the first and the last included; all of them when
    `limit` is 0 or at least `count` (a limit of 1 keeps the first)."""
    if limit <= 0 or limit >= count:
        return list(range(count))
    if limit == 1:
        return [0]
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def profile_names(experiment: Experiment, names: Sequence[str] | None) -> list[str]:
    """The profiles to profile, in declaration order: the named ones this experiment declares, or by default
    the claim's subject and baselines (the profiles a verdict rests on)."""
    wanted = set(names) if names is not None else {experiment.claim.subject, *experiment.claim.baselines}
    return [p.name for p in experiment.profiles if p.name in wanted]


def select_targets(experiment: Experiment, record: RunRecord, request: ProfilingRequest) -> list[Target]:
    """The calls to profile: the selected profiles at up to `request.max_points` points of the record,
    chosen evenly across its cases × dtypes. Only results that were checked correct and timed ("ok") are
    profiled: a profile that failed, declined or was unavailable has nothing to explain."""
    names = profile_names(experiment, request.profiles)
    targets: list[Target] = []
    for at in evenly(len(record.points), request.max_points):
        point = record.points[at]
        for name in names:
            result = point.results.get(name)
            if result is not None and result.status == "ok":
                targets.append(Target(len(targets), at, point.case, point.dtype, name, point.input_seed))
    return targets


def plan_document(experiment: Experiment, targets: Sequence[Target], device: str) -> dict:
    """What the driver reads: the experiment, the device, and every call with its range name and seed."""
    return {
        "experiment": experiment.slug,
        "device": device,
        "warmup_calls": WARMUP_CALLS,
        "targets": [{"index": t.index, "range": t.range_name, "case": t.case, "dtype": t.dtype,
                     "profile": t.profile, "seed": t.seed} for t in targets],
    }


def ncu_command(ncu: str, python: str, plan: str, manifest: str, metrics: Sequence[str] = METRICS) -> list[str]:
    """The profiler's command line. Clocks are left alone; ncu's default cache control (flush before every
    replay pass) is kept; nothing is profiled outside the driver's cudaProfilerStart/Stop ranges."""
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--nvtx", "--csv", "--page", "raw",
            "--print-units", "base", "--metrics", ",".join(metrics),
            python, "-m", DRIVER_MODULE, "--plan", plan, "--manifest", manifest]


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


def point_totals(kernels: Sequence[Mapping]) -> dict:
    """A point's totals over its kernels: summed duration, DRAM bytes and local-memory (spill) bytes, the
    DRAM bandwidth those bytes over that duration achieved, the highest registers per thread, and
    duration-weighted means of the percentages. A total is None where a kernel lacks what it needs."""
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


def last_lines(text: str, count: int = _MESSAGE_LINES) -> str:
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
        said = "\n".join(errors[:_MESSAGE_LINES]) or last_lines(stderr) or last_lines(stdout)
        return f"ncu exited with status {returncode}" + (f":\n{said}" if said else "")
    if fatal:
        return "\n".join((fatal + [e for e in errors if e not in fatal])[:_MESSAGE_LINES])
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


def _run(command: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
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


def _child_environment(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --------------------------------------------------------------------------------------------------------
# The record's blocks
# --------------------------------------------------------------------------------------------------------


def _utc_now() -> str:
    from lab.runner import utc_now, utc_text

    return utc_text(utc_now())


def _selection(experiment: Experiment, record: RunRecord, request: ProfilingRequest,
               targets: Sequence[Target]) -> dict:
    chosen = sorted({t.point for t in targets})
    return {
        "rule": ("named profiles" if request.profiles is not None else "the claim's subject and baselines")
        + (", every point" if request.max_points == 0 else f", at most {request.max_points} points spread "
           "evenly over cases × dtypes, first and last included"),
        "max_points": request.max_points,
        "profiles": profile_names(experiment, request.profiles),
        "points": [{"case": record.points[i].case, "dtype": record.points[i].dtype} for i in chosen],
    }


def failed(error: str, **context: Any) -> dict:
    """A run-level block for a profiling attempt that gave no data: why, and what was attempted."""
    return {"tool": TOOL, "error": error, "command": list(context.pop("command", [])),
            "ncu_version": context.pop("ncu_version", None), **context}


def attach(record: RunRecord, targets: Sequence[Target], kernels: Mapping[int, list[dict]],
           errors: Mapping[int, str], block: dict) -> RunRecord:
    """`record` with each target's facts in its profile result and `block` as the run-level block.

    A target the driver could not run gets {"error": why}; one inside whose range ncu recorded no kernel
    gets an error saying so; the others {"kernels": [...], "totals": {...}}.
    """
    by_point: dict[int, dict[str, dict]] = {}
    for target in targets:
        if target.index in errors:
            facts = {"error": errors[target.index]}
        elif not kernels.get(target.index):
            facts = {"error": f"ncu recorded no kernel inside the range {target.range_name}"}
        else:
            found = kernels[target.index]
            facts = {"kernels": found, "totals": point_totals(found)}
        by_point.setdefault(target.point, {})[target.profile] = facts
    points = []
    for at, point in enumerate(record.points):
        facts = by_point.get(at)
        if facts:
            results = {name: replace(result, profiling=facts[name]) if name in facts else result
                       for name, result in point.results.items()}
            point = replace(point, results=results)
        points.append(point)
    return replace(record, points=tuple(points), profiling=block)


def _driver_errors(manifest: Mapping, targets: Sequence[Target]) -> dict[int, str]:
    """Per target, why the driver could not profile it; a target it never reached is an error too."""
    done = manifest.get("targets", {})
    errors = {}
    for target in targets:
        entry = done.get(str(target.index))
        if entry is None:
            errors[target.index] = "the profiler's process never reached this call"
        elif entry.get("error"):
            errors[target.index] = str(entry["error"])
    return errors


def profile_record(experiment: Experiment, record: RunRecord, request: ProfilingRequest, *, device: str,
                   root: Path, say: Callable[[str], None] | None = None,
                   python: str = sys.executable) -> RunRecord:
    """`record` with Nsight Compute's facts for the selected points, or with the reason it has none.

    Never raises for the profiler's sake (only KeyboardInterrupt passes): whatever goes wrong becomes the
    run-level block's `error`, and the timed record is kept whole.
    """
    say = say or (lambda message: None)
    started = _utc_now()
    targets = select_targets(experiment, record, request)
    selection = _selection(experiment, record, request, targets)
    base = {"selection": selection, "metrics": list(METRICS), "warmup_calls": WARMUP_CALLS, "started_utc": started}
    if not targets:
        names = ", ".join(selection["profiles"]) or "none of the named profiles"
        why = f"nothing to profile: no selected profile ({names}) ran correctly at the selected points"
        say(why)
        return replace(record, profiling=failed(why, **base, finished_utc=_utc_now()))
    profiled = [name for name in selection["profiles"] if any(t.profile == name for t in targets)]
    say(f"profiling {len(targets)} call(s) under {TOOL}: {len(selection['points'])} point(s) × "
        f"{', '.join(profiled)}")
    command: list[str] = []
    version = None
    try:
        ncu = shutil.which(request.ncu)
        if ncu is None:
            raise _NoData(f"{request.ncu!r} was not found (Nsight Compute's command-line profiler, ncu, is not "
                          "on PATH; pass its path with --ncu)")
        if device.split(":")[0] != "cuda":
            raise _NoData(f"Nsight Compute profiles CUDA kernels; this run was on {device!r}")
        version = ncu_version(ncu)
        with tempfile.TemporaryDirectory(prefix="kernel-lab-ncu-") as tmp:
            folder = Path(tmp)
            (folder / "plan.json").write_text(json.dumps(plan_document(experiment, targets, device)),
                                              encoding="utf-8")
            command = ncu_command(ncu, python, "plan.json", "manifest.json")
            status, stdout, stderr = _run(command, cwd=folder, env=_child_environment(Path(root)),
                                          timeout=request.timeout_s)
            manifest_file = folder / "manifest.json"
            manifest = json.loads(manifest_file.read_text(encoding="utf-8")) if manifest_file.is_file() else None
        failure = ncu_failure(status, stdout, stderr)
        if failure:
            raise _NoData(failure)
        if manifest is None:
            raise _NoData("the profiler's process left no manifest: "
                          + (last_lines(stderr) or "it printed nothing on stderr"))
        changed = sorted(path for path, digest in manifest.get("hashes", {}).items()
                         if record.hashes.get(path) != digest)
        if changed:
            raise _NoData(f"source files changed between the timed run and profiling ({', '.join(changed)}); "
                          "the profiled code would not be the timed code")
        try:
            rows, units = read_raw_csv(stdout)
        except NcuOutputError as exc:
            said = "\n".join(ncu_messages(stdout, stderr)[:_MESSAGE_LINES])
            raise _NoData(f"{exc}" + (f":\n{said}" if said else "")) from exc
        if not rows:
            raise _NoData("ncu profiled no kernel inside the driver's ranges")
        kernels, unattributed = attribute(rows, units, targets)
    except _NoData as exc:
        say(f"profiling gave no data: {str(exc).splitlines()[0]}")
        return replace(record, profiling=failed(str(exc), command=command, ncu_version=version, **base,
                                                finished_utc=_utc_now()))
    except Exception as exc:  # noqa: BLE001 - the timed record must survive anything the profiler does
        from lab.timing import describe_exception

        say(f"profiling gave no data: {describe_exception(exc, 200)}")
        return replace(record, profiling=failed(describe_exception(exc), command=command, ncu_version=version,
                                                **base, finished_utc=_utc_now()))
    found = sum(len(k) for k in kernels.values())
    block = {
        "tool": TOOL,
        "error": None,
        "ncu_version": version,
        "command": command,
        **base,
        "finished_utc": _utc_now(),
        "calls": len(targets),
        "kernels": found,
        "unattributed_kernels": unattributed,
        "messages": ncu_messages(stdout, stderr),
    }
    say(f"profiled {found} kernel(s) in {len(targets)} call(s)"
        + (f"; {unattributed} kernel(s) named no profiled range and were left out" if unattributed else ""))
    return attach(record, targets, kernels, _driver_errors(manifest, targets), block)


class _NoData(Exception):
    """Profiling gave no data; the message is the reason recorded."""
