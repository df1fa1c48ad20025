"""Op-by-op breakdown of one profile's call: which kernels it ran, how long each op's kernels took on the GPU,
and how long the GPU spent between them, on both clocks.

GPU time. The call runs a few times under torch.profiler with CUDA activity (CUPTI), as the GPU-time clock
runs it (lab.measure.timing): before each call the L2 is flushed and the device held by a spin kernel while
the host queues the call, so its kernels run back to back and what separates them is the GPU's own turnaround
from one kernel to the next, never the host.

Eager call. The same call runs back to back under the profiler as the eager-call clock runs it
(lab.measure.eager): no hold, no flush, each call on the next of the input copies that clock cycles through,
so the GPU waits whenever the host has not yet launched the next kernel. Each kernel's idle time before it
(since the last earlier activity ended) is the host's gap as a program calling eagerly pays it; it is charged
to the kernel's op, and the idle time before a call's first kernel (since the previous call's last one) is
kept apart as `lead_ms`. The profiler slows the host, so the record keeps the profiled period per call
(lead + span) for the pages to set beside the unprofiled eager-call median.

Each profiled call is wrapped in the annotation CALL; the code under test may wrap its ops in annotations of
its own (`torch.profiler.record_function(label)`, as kernels/reference_decoder.py does). From the trace:

* every GPU activity (kernel, memset, memcopy) is matched to the host call that launched it through CUPTI's
  correlation id; the launch's host time stamp places it inside one CALL and inside the innermost op
  annotation around it (activities replayed from a CUDA graph carry the graph launch's id, so they land in
  the call but in no op annotation);
* the experiment's classifier turns (kernel name, enclosing labels) into an op name: the label where there is
  one, the kernel's name otherwise (torch.compile's kernels carry no labels; inductor names its fused kernels
  after the ops inside them). A classifier may also tell the lab's own kernels by name (`is_lab(kernel)`):
  each op then records how many of its kernels are the lab's (`lab_kernels`), its provenance as measured;
  `group` is what the classifier makes of the op's kernels by name alone (the class holding most of its
  time), so ops named differently by two profiles still compare; `kernel` names its longest kernel;
* per call: `kernel_ms` the sum of activity durations (one stream: they never overlap), `span_ms` from the
  first activity's start to the last one's end, `gap_ms` the GPU's idle time inside that span. Figures per
  call are medians over the profiled calls; an op's kernel time is its mean, its gap (eager-call) its median.

On the GPU-time clock the span is the call's GPU time as that clock measures it, so the ops and the gap add
up to its median. The record keeps the result per profile (lab.evidence.records: ProfileResult.breakdown),
the eager-call figures under its key "eager".
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time
from bisect import bisect_right
from collections import defaultdict
from typing import Callable, Mapping, Sequence

import torch

from kernels._provenance import triton_kernel_names  # noqa: F401 - the classifiers' names of the lab's kernels

CALL = "kernel_lab.call"
METHOD = ("torch.profiler (CUPTI) over {calls} calls after {warmup} warm-up calls and one profiled warm-up call, "
          "each flushed (L2 flush: {flush}) and queued behind a device hold as on the GPU-time clock ({hold:.1f} ms: {margin}x the "
          "longest host queueing of a warm-up call, the profiled one included): kernel, memset and copy durations "
          "per op, attributed by the op annotation around each launch (else by kernel name); gap = first start to "
          "last end, minus kernel time")
EAGER_METHOD = ("torch.profiler (CUPTI; host events: {host}) over {calls} back-to-back calls after {warmup} profiled "
                "warm-up calls, as on the eager-call clock (no hold, no flush, inputs cycled through {copies} "
                "cop{ies}): each kernel's "
                "GPU idle time since the previous activity ended, charged to its op; the idle time before a call's "
                "first kernel kept apart (between calls)")
GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MAX_OPS = 64  # ops kept per breakdown; the rest are summed into "other"
KERNEL_NAME_MAX = 120  # characters of an op's longest kernel's name kept in the record
# The device hold before each profiled call outlasts the host's queueing of the call by this factor. The
# queueing is measured on a profiled warm-up call: the profiler slows the host by a factor that varies with the
# call and the host (a fixed 4x of the unprofiled queueing once fell short: the GPU waited, and the span read
# ten times the GPU-time median).
HOLD_MARGIN = 2
MIN_HOLD_MS = 1.0
EAGER_CALLS = 30
EAGER_WARMUP = 5

Classifier = Callable[[str, tuple[str, ...]], str]


def _queue_ms(call: Callable[[], object]) -> float:
    """Host ms to queue one call of `call`, which then runs to completion."""
    started = time.perf_counter()
    call()
    queued = (time.perf_counter() - started) * 1e3
    torch.cuda.synchronize()
    return queued


def hold_ms(queue_ms: float) -> float:
    """The device hold before a profiled call whose queueing took up to `queue_ms` under the profiler."""
    return max(MIN_HOLD_MS, HOLD_MARGIN * queue_ms)


def measure_breakdown(call: Callable[[], object], classify: Classifier, clock, *, calls: int = 5,
                      warmup: int = 2, eager_calls: Sequence[Callable[[], object]] | None = None) -> dict:
    """The breakdown of `call` (see the module docstring) as the record stores it. `clock`: the run's
    lab.measure.timing.CudaEventClock (its hold, its L2 flush and its flush size). `eager_calls`: one call per
    input copy the eager-call clock cycles through; by default made from `call`'s keyword inputs as that clock
    makes them (lab.measure.eager). The eager-call part failing leaves {"error": why} under "eager"."""
    from torch.profiler import ProfilerActivity, profile, record_function

    queue_ms = max((_queue_ms(call) for _ in range(warmup)), default=0.0)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # Outside any CALL annotation, so the trace leaves its kernels out (breakdown_from_trace).
        queue_ms = max(queue_ms, _queue_ms(call))
        hold = hold_ms(queue_ms)
        for _ in range(calls):
            clock.hold(hold)
            clock.flush()
            with record_function(CALL):
                call()
            torch.cuda.synchronize()
    result = breakdown_from_trace(_trace_events(prof), classify)
    result["method"] = METHOD.format(calls=calls, warmup=warmup, hold=hold, margin=HOLD_MARGIN,
                                     flush=getattr(clock, "flush_method", "zero"))
    try:
        if eager_calls is None:
            eager_calls = _input_copy_calls(call, getattr(clock, "flush_bytes", 0))
        result["eager"] = measure_eager_breakdown(eager_calls, classify)
    except Exception as exc:  # noqa: BLE001 - the GPU-time breakdown stands without it
        result["eager"] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    return result


def _input_copy_calls(call: Callable[[], object], past_bytes: int) -> list[Callable[[], object]]:
    """One call per input copy, as the eager-call clock makes them (lab.measure.eager), where `call` is a
    partial over keyword inputs; else `call` alone."""
    from lab.measure.eager import copies_needed, input_bytes, input_copies

    if not isinstance(call, functools.partial) or call.args or not call.keywords:
        return [call]
    inputs = dict(call.keywords)
    sets = input_copies(inputs, copies_needed(input_bytes(inputs), past_bytes))
    return [functools.partial(call.func, **s) for s in sets]


def measure_eager_breakdown(calls: Sequence[Callable[[], object]], classify: Classifier, *,
                            profiled: int = EAGER_CALLS, warmup: int = EAGER_WARMUP) -> dict:
    """`profiled` back-to-back calls under the profiler, cycling through `calls` (one per input copy), after
    one unprofiled call of each (it prepares each input set, e.g. a graph capture) and `warmup` profiled ones
    outside any CALL (they give the first profiled call a predecessor). The profiler records the op
    annotations alone on the host where this torch allows it (see _AnnotationsOnly)."""
    from torch.profiler import record_function

    for c in calls:
        c()
    torch.cuda.synchronize()
    with _AnnotationsOnly() as prof:
        for i in range(warmup):
            calls[i % len(calls)]()
        for i in range(warmup, warmup + profiled):
            with record_function(CALL):
                calls[i % len(calls)]()
        torch.cuda.synchronize()
    result = eager_breakdown_from_trace(_trace_events(prof.profiler), classify)
    result["method"] = EAGER_METHOD.format(calls=profiled, warmup=warmup, copies=len(calls),
                                           ies="y" if len(calls) == 1 else "ies", host=prof.host)
    return result


class _AnnotationsOnly:
    """A profiler of CUDA activity and host annotations that leaves torch's own ops unrecorded: an event per
    aten op costs the host microseconds, which on the eager-call clock would show as gaps the unprofiled
    program does not have. Kineto's RecordFunction scopes are narrowed to user scopes (record_function)
    through torch's private API; where that API differs, every CPU op is recorded as torch.profiler does
    (`host` says which)."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        try:
            from torch._C._profiler import RecordScope
            from torch.autograd import _enable_profiler
            from torch.autograd.profiler import profile as kineto_profile

            self.profiler = kineto_profile(use_device="cuda", use_kineto=True)
            self.profiler._prepare_trace()
            _enable_profiler(self.profiler.config(create_trace_id=False), self.profiler.kineto_activities,
                             {RecordScope.USER_SCOPE})
            self.host = "annotations only"
        except Exception:  # noqa: BLE001 - another torch's private API: record every op instead
            self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.profiler.__enter__()
            self.host = "every torch op"
        return self

    def __exit__(self, *exc):
        self.profiler.__exit__(*exc)


def _trace_events(prof) -> list:
    fd, path = tempfile.mkstemp(suffix=".json", prefix="kernel-lab-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace


class _Ranges:
    """Annotation ranges on one host thread, for "which annotations hold time t" queries."""

    def __init__(self, ranges: Sequence[tuple[float, float, str]]):
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]

    def around(self, t: float) -> list[tuple[float, float, str]]:
        """The ranges holding t, outermost first (ranges nest: the earlier start is the outer one)."""
        stop = bisect_right(self.starts, t)
        return [r for r in self.ranges[:stop] if r[0] <= t <= r[1]]


class _Activity(tuple):
    """(ts, dur, op, kernel name, idle µs before it or None where nothing ran before it in the trace)."""

    __slots__ = ()
    ts = property(lambda self: self[0])
    dur = property(lambda self: self[1])
    op = property(lambda self: self[2])
    name = property(lambda self: self[3])
    idle = property(lambda self: self[4])


def _per_call(events: Sequence[Mapping], classify: Classifier) -> list[list[_Activity]]:
    """Each CALL's GPU activities, in start order; raises ValueError when there are none."""
    calls, labels = defaultdict(list), defaultdict(list)
    launches: dict[int, tuple[float, object]] = {}
    activities = []
    for e in events:
        if not isinstance(e, Mapping) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), str(e.get("name", ""))
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        if cat == "user_annotation":
            (calls if name == CALL else labels)[e.get("tid")].append((ts, ts + dur, name))
        elif cat in LAUNCH_CATEGORIES:
            correlation = (e.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = (ts, e.get("tid"))
        elif cat in GPU_CATEGORIES:
            activities.append((ts, dur, name, (e.get("args") or {}).get("correlation")))
    activities.sort(key=lambda a: (a[0], a[1]))
    call_ranges = {tid: _Ranges(r) for tid, r in calls.items()}
    label_ranges = {tid: _Ranges(r) for tid, r in labels.items()}
    per_call: dict[tuple, list[_Activity]] = defaultdict(list)
    busy_until = None  # the latest end of any activity started so far
    for ts, dur, name, correlation in activities:
        idle = None if busy_until is None else max(0.0, ts - busy_until)
        busy_until = ts + dur if busy_until is None else max(busy_until, ts + dur)
        launch = launches.get(correlation)
        if launch is None:
            continue
        host_ts, tid = launch
        holders = call_ranges[tid].around(host_ts) if tid in call_ranges else []
        if not holders:
            continue
        enclosing = label_ranges[tid].around(host_ts) if tid in label_ranges else []
        op = classify(name, tuple(r[2] for r in enclosing))
        per_call[(tid, holders[-1][0])].append(_Activity((ts, dur, op, name, idle)))
    if not per_call:
        raise ValueError("the profiler's trace holds no GPU activity launched inside a profiled call")
    return list(per_call.values())


def breakdown_from_trace(events: Sequence[Mapping], classify: Classifier) -> dict:
    """Per-call figures from a chrome trace's events (see the module docstring); raises ValueError when the
    trace holds no CALL annotation or no GPU activity inside one."""
    calls = _per_call(events, classify)
    result = _summarise(calls, classify)
    result["gap_ms"] = statistics.median(max(0.0, span - busy) for span, busy in map(_span_and_busy, calls)) / 1e3
    return result


def eager_breakdown_from_trace(events: Sequence[Mapping], classify: Classifier) -> dict:
    """The eager-call figures from a trace of back-to-back calls (see the module docstring): per op its
    kernel time and the GPU's idle time before its kernels (`gap_ms`), per call the idle time inside the
    call (`gap_ms`) and before its first kernel (`lead_ms`, over the calls that had a predecessor)."""
    calls = _per_call(events, classify)
    result = _summarise(calls, classify, eager=True)
    result["gap_ms"] = statistics.median(sum(a.idle or 0.0 for a in c[1:]) for c in calls) / 1e3
    leads = [c[0].idle for c in calls if c[0].idle is not None]
    result["lead_ms"] = statistics.median(leads) / 1e3 if leads else 0.0
    return result


def _span_and_busy(activities: Sequence[_Activity]) -> tuple[float, float]:
    start = activities[0].ts
    end = max(a.ts + a.dur for a in activities)
    return max(0.0, end - start), sum(a.dur for a in activities)


def _summarise(calls: list[list[_Activity]], classify: Classifier, *, eager: bool = False) -> dict:
    n = len(calls)
    is_lab = getattr(classify, "is_lab", None)
    op_ms: dict[str, float] = defaultdict(float)
    op_gap: dict[str, list[float]] = defaultdict(lambda: [0.0] * n)  # per call: a median resists one stalled call
    op_kernels: dict[str, int] = defaultdict(int)
    op_lab: dict[str, int] = defaultdict(int)
    op_names: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    op_groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    order: dict[str, float] = {}
    for c, activities in enumerate(calls):
        start = activities[0].ts
        for i, a in enumerate(activities):
            op_ms[a.op] += a.dur / 1e3 / n
            op_kernels[a.op] += 1
            if i and a.idle:
                op_gap[a.op][c] += a.idle / 1e3
            op_names[a.op][a.name] += a.dur
            op_groups[a.op][classify(a.name, ())] += a.dur
            if is_lab is not None and is_lab(a.name):
                op_lab[a.op] += 1
            order.setdefault(a.op, a.ts - start)
    ops = sorted(op_ms, key=lambda op: order[op])
    if len(ops) > MAX_OPS:
        kept = set(sorted(ops, key=lambda op: -op_ms[op])[:MAX_OPS - 1])
        for op in [op for op in ops if op not in kept]:
            op_ms["other"] += op_ms[op]
            op_gap["other"] = [a + b for a, b in zip(op_gap["other"], op_gap[op])]
            op_kernels["other"] += op_kernels[op]
            op_lab["other"] += op_lab[op]
            for name, dur in op_names[op].items():
                op_names["other"][name] += dur
            op_groups["other"]["other"] += sum(op_groups[op].values())
        ops = [op for op in ops if op in kept] + ["other"]
    spans = [_span_and_busy(c) for c in calls]
    out_ops = []
    for op in ops:
        row = {"op": op, "ms": op_ms[op], "kernels": round(op_kernels[op] / n)}
        if eager:
            row["gap_ms"] = statistics.median(op_gap[op])
        else:
            if is_lab is not None:
                row["lab_kernels"] = min(row["kernels"], round(op_lab[op] / n))
            row["kernel"] = _one_line(_longest(op_names[op]))[:KERNEL_NAME_MAX]
            row["group"] = _longest(op_groups[op])
        out_ops.append(row)
    return {
        "calls": n,
        "ops": out_ops,
        "kernel_ms": statistics.median(busy for _, busy in spans) / 1e3,
        "span_ms": statistics.median(span for span, _ in spans) / 1e3,
    }


def _one_line(name: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in name)


def _longest(times: Mapping[str, float]) -> str:
    """The key with the most time (the first such in insertion order)."""
    return max(times, key=times.get)
