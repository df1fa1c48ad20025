"""The runner: declared experiment in, one immutable run record out.

For each case and dtype the inputs are drawn once (seeded) and the float64 reference computed once. Each
profile is then, in order:

1. skipped as "unsupported" (its own reason) or "unavailable" (an optional peer that does not import);
2. checked for correctness against the reference, ‖out − ref‖ / ‖ref‖ <= the experiment's tolerance for the
   dtype (NaN fails): a mismatch is "incorrect", recorded and never timed. A profile that returns several
   tensors (a tuple) is checked output by output against a reference returning as many; its error is the
   largest of theirs;
3. timed with the profiles that passed, in interleaved rounds (lab.measure.timing).

Any exception inside one profile (out of memory, Triton's OutOfResources, a bad launch) becomes that
profile's status "error" with the exception's text, and the run goes on. The record is written only when
the run completes: an interrupted run leaves no file behind.

A run asked to profile (lab.measure.profiling) does so after every point is timed, in a separate process under
Nsight Compute, and only then writes the record, once, with the profiler's facts in it: the timings are
never taken under the profiler, and a record is never rewritten to add them.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from experiments.spec import Case, Experiment, Profile
from lab import REPO_ROOT
from lab.evidence.checks import CASE, IDENTIFIER, IDENTIFIER_TEXT
from lab.evidence.hashing import source_hashes
from lab.evidence.records import (
    CPU_EVIDENCE,
    GPU_EVIDENCE,
    SCHEMA_VERSION,
    EagerResult,
    Point,
    ProfileResult,
    RunRecord,
)
from lab.evidence.stats import summarize
from lab.evidence.store import write_record
from lab.measure.breakdown import measure_breakdown
from lab.measure.compile_limits import allow_a_compile_per_point
from lab.measure.eager import (
    CPU_EAGER,
    GPU_EAGER,
    EagerClock,
    EagerParams,
    EagerTimes,
    copies_needed,
    input_bytes,
    input_copies,
    time_eager,
)
from lab.measure.environment import capture_environment, command_line, git_state
from lab.measure.inputs import (
    CHECK_ELEMENT_BUDGET,
    as_float64,
    json_ready,
    draw_inputs,
    dtype_name,
    input_seed,
    new_run_id,
    relative_error,
    RowSelection,
    select_rows,
    utc_now,
    utc_text,
)
from lab.measure.profiling import ProfilingRequest, profile_record
from lab.measure.timing import (CPU_TIMING, GPU_TIMING, CudaEventClock, TimingParams, WallClock, describe_exception,
                                make_clock, measure_copy_ceiling, measure_matmul_peak, measure_read2_write_ceiling,
                                measure_read_ceiling, time_interleaved, timing_method)

# --------------------------------------------------------------------------------------------------------
# One point: a case at a dtype, every profile
# --------------------------------------------------------------------------------------------------------


def _unavailable(profile: Profile) -> str | None:
    if profile.requires is None:
        return None
    try:
        importlib.import_module(profile.requires)
    except Exception as exc:  # noqa: BLE001 - an optional peer may fail to import in any way
        note = f"; {profile.requires_note}" if profile.requires_note else ""
        return f"{profile.requires} does not import ({describe_exception(exc, 200)}){note}"
    return None


def _check(profile: Profile, case: Case, dtype: torch.dtype, inputs, ref: torch.Tensor, rows: RowSelection,
           tolerance: float, clock) -> ProfileResult:
    """Whether `profile` runs this case correctly: "ok" (not yet timed), or why not."""
    plan = None
    try:
        reason = profile.unsupported(case, dtype) if profile.unsupported is not None else None
        if reason is not None:
            return ProfileResult("unsupported", reason=reason)
        reason = _unavailable(profile)
        if reason is not None:
            return ProfileResult("unavailable", reason=reason)
        plan = json_ready(profile.plan(case, dtype)) if profile.plan is not None else None
        error, why = relative_error(profile.run(**inputs), ref, rows)
    except Exception as exc:  # noqa: BLE001 - one profile's failure is its own result
        clock.release()
        return ProfileResult("error", plan=plan, error=describe_exception(exc))
    if error is None or error > tolerance:
        why = why or f"relative error {error:.3g} exceeds the tolerance {tolerance:.3g}"
        return ProfileResult("incorrect", plan=plan, rel_error=error, reason=why)
    return ProfileResult("ok", plan=plan, rel_error=error)


def measure_point(
    experiment: Experiment,
    case: Case,
    dtype: torch.dtype,
    *,
    device: str,
    clock: CudaEventClock | WallClock,
    params: TimingParams,
    ceiling_gbps: float,
    profiles: Sequence[Profile] | None = None,
    bar: Any = None,
    check_budget: int = CHECK_ELEMENT_BUDGET,
    eager: tuple[EagerClock, EagerParams] | None = None,
) -> Point:
    """Check and time `profiles` (default: all of the experiment's) on one case and dtype: on the GPU-time
    clock, then (with `eager`) the profiles that timed on the eager-call clock (lab.measure.eager)."""
    profiles = list(experiment.profiles if profiles is None else profiles)
    seed = input_seed(experiment.slug, case, dtype)
    bytes_moved = int(experiment.bytes_moved(case, dtype))
    flops = int(experiment.flops(case, dtype)) if experiment.flops is not None else None
    tolerance = float(experiment.tolerance[dtype])
    results: dict[str, ProfileResult] = {}
    calls = {}
    # A profile's own byte model (a quantised profile's weight bytes), where it declares one.
    own_bytes = {p.name: int(p.bytes_moved(case, dtype)) for p in profiles if p.bytes_moved is not None}

    def progress(what: str, advance: int = 0) -> None:
        if bar is not None:
            bar.set_postfix_str(f"{case.name} {dtype_name(dtype)} · {what}", refresh=False)
            bar.update(advance)

    try:
        inputs = draw_inputs(experiment, case, dtype, device, seed)
        rows = select_rows(experiment, inputs, check_budget)
        reference_inputs = {
            name: (t.index_select(0, rows.index) if rows.index is not None and name in experiment.row_inputs else t)
            for name, t in inputs.items()
        }
        ref = as_float64(experiment.reference(**reference_inputs))
    except Exception as exc:  # noqa: BLE001 - the whole point fails, the run goes on
        clock.release()
        failure = f"inputs or reference failed: {describe_exception(exc)}"
        progress("inputs failed", len(profiles))
        return Point(case.name, dict(case.shape), dtype_name(dtype), bytes_moved, flops, tolerance, seed, None,
                     {p.name: ProfileResult("error", error=failure) for p in profiles})

    for profile in profiles:
        progress(f"checking {profile.name}")
        bound = float(profile.tolerance[dtype]) if profile.tolerance is not None else tolerance
        results[profile.name] = _check(profile, case, dtype, inputs, ref, rows, bound, clock)
        if results[profile.name].status == "ok":
            calls[profile.name] = functools.partial(profile.run, **inputs)
        else:
            progress(profile.name, 1)

    if calls:
        progress(f"timing {len(calls)} profiles")
        try:
            timed = time_interleaved(calls, clock, params,
                                     on_round=lambda done, total: progress(f"timing, round {done}/{total}"))
            samples, errors = timed.samples_ms, timed.errors
        except Exception as exc:  # noqa: BLE001 - e.g. an asynchronous CUDA fault surfacing at a sync
            clock.release()
            samples, errors = {}, {name: describe_exception(exc) for name in calls}
        for name in calls:
            checked = results[name]
            if name in errors:
                results[name] = ProfileResult("error", plan=checked.plan, rel_error=checked.rel_error,
                                              error=errors[name])
            else:
                results[name] = _timed_result(checked, samples[name], own_bytes.get(name, bytes_moved), flops,
                                              ceiling_gbps)
                if name in own_bytes:
                    results[name] = replace(results[name], bytes_moved=own_bytes[name])
        progress("timed", len(calls))
    copies, eager_calls = None, {}
    timed = [p for p in profiles if results[p.name].status == "ok"]
    if eager is not None and timed:
        progress(f"eager-call clock, {len(timed)} profiles")
        copies, eager_calls = _time_eager_calls(timed, inputs, results, eager, bytes_moved, flops, ceiling_gbps,
                                                clock, own_bytes)
    if experiment.breakdown is not None and device != "cpu":
        progress(f"op breakdown, {len(timed)} profiles")
        for p in timed:
            breakdown = _breakdown(p, inputs, experiment.breakdown, clock, eager_calls.get(p.name))
            results[p.name] = replace(results[p.name], breakdown=breakdown)
    del inputs, reference_inputs, ref, calls, eager_calls
    clock.release()
    return Point(case.name, dict(case.shape), dtype_name(dtype), bytes_moved, flops, tolerance, seed,
                 rows.describe(), {p.name: results[p.name] for p in profiles}, eager_copies=copies)


def _time_eager_calls(timed: Sequence[Profile], inputs, results: dict[str, ProfileResult],
                      eager: tuple[EagerClock, EagerParams], bytes_moved: int, flops: int | None,
                      ceiling_gbps: float, clock, own_bytes: dict[str, int] | None = None) -> tuple[int, dict[str, list]]:
    """Time `timed` on the eager-call clock over copies of `inputs`; store each result's `eager` block and
    return how many input copies the calls cycled through, and each profile's calls over them (none where
    the copies could not be made), which the op breakdown's eager part reuses."""
    eager_clock, eager_params = eager
    count = copies_needed(input_bytes(inputs), eager_clock.copies_past_bytes)
    try:
        sets = input_copies(inputs, count)
        for p in (p for p in timed if p.warm is not None):
            for s in sets:
                p.warm(**s)
        calls = {p.name: [functools.partial(p.run, **s) for s in sets] for p in timed}
        times = time_eager(calls, eager_clock, eager_params)
    except Exception as exc:  # noqa: BLE001 - e.g. no memory for the copies: the GPU-time results stand
        clock.release()
        times = EagerTimes({}, {}, {}, {p.name: describe_exception(exc) for p in timed})
        calls = {}
    for p in timed:
        moved = (own_bytes or {}).get(p.name, bytes_moved)
        results[p.name] = replace(results[p.name], eager=_eager_result(times, p.name, moved, flops, ceiling_gbps))
    return count, calls


def _breakdown(profile: Profile, inputs, classify, clock, eager_calls=None) -> dict:
    """The profile's op-by-op breakdown (lab.measure.breakdown), or {"error": why}: a breakdown is an
    addition to the profile's timings, never a reason to lose them. `eager_calls`: the eager-call clock's
    calls over its input copies, for the breakdown's eager part (None: it makes its own)."""
    try:
        return measure_breakdown(functools.partial(profile.run, **inputs), classify, clock, eager_calls=eager_calls)
    except Exception as exc:  # noqa: BLE001 - e.g. a profiler already active, or no CUPTI on this host
        clock.release()
        return {"error": describe_exception(exc)}


def _eager_result(times: EagerTimes, name: str, bytes_moved: int, flops: int | None,
                  ceiling_gbps: float) -> EagerResult:
    if name in times.errors or not times.eager_ms.get(name):
        return EagerResult((), (), times.calls.get(name, 0), error=times.errors.get(name, "no eager samples"))
    samples, host = times.eager_ms[name], times.host_ms[name]
    summary = summarize(samples)
    seconds = summary.p50 * 1e-3
    gbps = bytes_moved / seconds / 1e9 if seconds > 0 else None
    return EagerResult(
        samples_ms=tuple(samples), host_samples_ms=tuple(host), calls_per_sample=times.calls[name],
        p20_ms=summary.p20, p50_ms=summary.p50, p80_ms=summary.p80, host_p50_ms=summarize(host).p50,
        gbps=gbps, pct_of_ceiling=100 * gbps / ceiling_gbps if gbps is not None and ceiling_gbps > 0 else None,
        tflops=flops / seconds / 1e12 if flops is not None and seconds > 0 else None,
    )


def _timed_result(checked: ProfileResult, samples: list[float], bytes_moved: int, flops: int | None,
                  ceiling_gbps: float) -> ProfileResult:
    summary = summarize(samples)
    seconds = summary.p50 * 1e-3
    gbps = bytes_moved / seconds / 1e9 if seconds > 0 else None
    return ProfileResult(
        "ok", plan=checked.plan, samples_ms=tuple(samples),
        p20_ms=summary.p20, p50_ms=summary.p50, p80_ms=summary.p80,
        gbps=gbps,
        pct_of_ceiling=100 * gbps / ceiling_gbps if gbps is not None and ceiling_gbps > 0 else None,
        tflops=flops / seconds / 1e12 if flops is not None and seconds > 0 else None,
        rel_error=checked.rel_error,
    )


# --------------------------------------------------------------------------------------------------------
# One run: every case and dtype of one experiment
# --------------------------------------------------------------------------------------------------------


def check_declaration(experiment: Experiment) -> None:
    """Refuse a declaration the runner could only half run, naming what is wrong and what is accepted."""
    names = [p.name for p in experiment.profiles]
    problems = []
    if len(set(names)) != len(names):
        problems.append(f"profile names repeat: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    for role, name in [("subject", experiment.claim.subject), *(("baseline", b) for b in experiment.claim.baselines)]:
        if name not in names:
            problems.append(f"claim {role} {name!r} is not a profile (profiles: {', '.join(names)})")
    missing = [dtype_name(d) for d in experiment.dtypes if d not in experiment.tolerance]
    if missing:
        problems.append(f"no tolerance for dtype(s) {', '.join(missing)}")
    if not experiment.cases or not experiment.dtypes:
        problems.append("it needs at least one case and one dtype")
    unfit = [n for n in (experiment.slug, *names) if not IDENTIFIER.fullmatch(n)]
    unfit += [c.name for c in experiment.cases if not CASE.fullmatch(c.name)]
    if unfit:  # its record could not be read back: refuse before the run, not after it
        problems.append(f"names a run record refuses: {', '.join(map(repr, unfit))} (accepted: {IDENTIFIER_TEXT}; "
                        "a case name may use '+' too)")
    if problems:
        raise ValueError(f"experiment {experiment.slug!r} cannot run: {'; '.join(problems)}")


def check_device(device: str) -> None:
    """Refuse a device whose figures would be mislabelled: CUDA under the interpreter, or the CPU without it."""
    from kernels._checks import interpreter_enabled

    kind = torch.device(device).type
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r}: no CUDA device is available on this machine")
        if interpreter_enabled():
            raise RuntimeError("TRITON_INTERPRET is set: unset it to time compiled kernels on the GPU")
    elif kind == "cpu":
        if not interpreter_enabled():
            raise RuntimeError("running on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter) set before start")
    else:
        raise ValueError(f"device {device!r}: accepted devices are 'cuda', 'cuda:N' and 'cpu'")


def run_experiment(
    experiment: Experiment,
    *,
    device: str,
    records_dir: Path | None,
    root: Path = REPO_ROOT,
    params: TimingParams | None = None,
    progress: bool = True,
    check_budget: int = CHECK_ELEMENT_BUDGET,
    profiling: ProfilingRequest | None = None,
    say: Callable[[str], None] | None = None,
    eager_params: EagerParams | None = None,
) -> tuple[RunRecord, Path | None]:
    """Run every case, dtype and profile of `experiment` on `device`; write and return the record and its path.

    With `records_dir` None the record is returned unwritten (path None): a worker of a cluster run
    (lab.measure.cluster) hands it to the driver, which alone writes records.

    With `profiling`, the finished timed run is profiled under Nsight Compute before the record is written
    (lab.measure.profiling.profile_record, which never raises: a profiler that is missing or fails leaves its
    reason in the record instead of data). `say` receives the profiler's one-line progress reports.
    """
    check_declaration(experiment)
    check_device(device)
    on_gpu = torch.device(device).type == "cuda"
    params = params or (GPU_TIMING if on_gpu else CPU_TIMING)
    eager_params = eager_params or (GPU_EAGER if on_gpu else CPU_EAGER)
    started = utc_now()
    environment = capture_environment(device)
    run_id = new_run_id(environment["gpu_key"], started)
    hashes = source_hashes(experiment, root)
    git = git_state(root)
    command = command_line(root)
    clock = make_clock(device)
    ceiling = measure_copy_ceiling(clock, device, params)
    read_ceiling = measure_read_ceiling(clock, device, params)
    read2_write_ceiling = measure_read2_write_ceiling(clock, device, params)
    peak = measure_matmul_peak(clock, device, params) if on_gpu else None
    eager_clock = EagerClock(device, copies_past_bytes=clock.flush_bytes if on_gpu else 0)
    allow_a_compile_per_point(len(experiment.cases) * len(experiment.dtypes))

    points = []
    total = len(experiment.cases) * len(experiment.dtypes) * len(experiment.profiles)
    with tqdm(total=total, desc=experiment.slug, unit="profile", disable=not progress, leave=True) as bar:
        for case in experiment.cases:
            for dtype in experiment.dtypes:
                points.append(measure_point(experiment, case, dtype, device=device, clock=clock, params=params,
                                            ceiling_gbps=ceiling.gbps, bar=bar, check_budget=check_budget,
                                            eager=(eager_clock, eager_params)))

    record = RunRecord(
        schema_version=SCHEMA_VERSION,
        run_id=run_id,
        experiment=experiment.slug,
        started_utc=utc_text(started),
        finished_utc=utc_text(utc_now()),
        command=tuple(command),
        git=git,
        hashes=hashes,
        environment=json_ready(environment),
        evidence=GPU_EVIDENCE if on_gpu else CPU_EVIDENCE,
        copy_ceiling=ceiling,
        timing=timing_method(clock, params),
        points=tuple(points),
        eager=eager_clock.method(eager_params),
        matmul_peak=peak,
        read_ceiling=read_ceiling,
        read2_write_ceiling=read2_write_ceiling,
    )
    if profiling is not None:
        if on_gpu:
            torch.cuda.empty_cache()  # hand the timed run's cached blocks back: the profiler's process needs room

        record = profile_record(experiment, record, profiling, device=device, root=root, say=say)
    return record, (write_record(record, records_dir) if records_dir is not None else None)
