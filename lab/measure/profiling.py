"""Nsight Compute facts per point: which points to profile, the ncu command, its CSV, the record's blocks.

Timings are never taken under a profiler. A run made with profiling first times every point as usual; then
one child process per experiment runs under Nsight Compute's command-line profiler:

    ncu --clock-control none --profile-from-start off --nvtx --csv --page raw --print-units base
        --metrics <METRICS> <python> -m lab.measure.profile_driver --plan plan.json --manifest manifest.json

The driver (lab.measure.profile_driver) redraws each selected point's inputs from the seed recorded for it, calls
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

import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from experiments.spec import Experiment
from lab.evidence.records import RunRecord
from lab.measure.inputs import utc_now, utc_text
from lab.measure.ncu import (
    MESSAGE_LINES,
    METRICS,
    RANGE_PREFIX,
    attribute,
    child_environment,
    last_lines,
    ncu_failure,
    ncu_messages,
    ncu_version,
    NcuOutputError,
    point_totals,
    read_raw_csv,
    run_command,
)

TOOL = "Nsight Compute"
DRIVER_MODULE = "lab.measure.profile_driver"
DEFAULT_MAX_POINTS = 8
DEFAULT_TIMEOUT_S = 1800.0
WARMUP_CALLS = 2

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
# The record's blocks
# --------------------------------------------------------------------------------------------------------


def _utc_now() -> str:
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
            status, stdout, stderr = run_command(command, cwd=folder, env=child_environment(Path(root)),
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
            said = "\n".join(ncu_messages(stdout, stderr)[:MESSAGE_LINES])
            raise _NoData(f"{exc}" + (f":\n{said}" if said else "")) from exc
        if not rows:
            raise _NoData("ncu profiled no kernel inside the driver's ranges")
        kernels, unattributed = attribute(rows, units, targets)
    except _NoData as exc:
        say(f"profiling gave no data: {str(exc).splitlines()[0]}")
        return replace(record, profiling=failed(str(exc), command=command, ncu_version=version, **base,
                                                finished_utc=_utc_now()))
    except Exception as exc:  # noqa: BLE001 - the timed record must survive anything the profiler does
        from lab.measure.timing import describe_exception

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
