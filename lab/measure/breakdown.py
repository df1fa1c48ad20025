"""Op-by-op breakdown of one profile's call: which kernels it ran, how long each op's kernels took on the GPU,
and how long the GPU spent between them.

The call runs a few times under torch.profiler with CUDA activity (CUPTI), as the GPU-time clock runs it
(lab.measure.timing): before each call the L2 is flushed and the device held by a spin kernel while the host
queues the call, so its kernels run back to back and what separates them is the GPU's own turnaround from
one kernel to the next, never the host. Each call is wrapped in the annotation CALL; the code under test may
wrap its ops in annotations of their own (`torch.profiler.record_function(label)`, as
kernels/reference_decoder.py does). From the profiler's trace:

* every GPU activity (kernel, memset, memcopy) is matched to the host call that launched it through CUPTI's
  correlation id; the launch's host time stamp places it inside one CALL and inside the innermost op
  annotation around it (activities replayed from a CUDA graph carry the graph launch's id, so they land in
  the call but in no op annotation);
* the experiment's classifier turns (kernel name, enclosing labels) into an op name: the label where there is
  one, the kernel's name otherwise (torch.compile's kernels carry no labels; inductor names its fused kernels
  after the ops inside them);
* per call: `kernel_ms` the sum of activity durations (one stream: they never overlap), `span_ms` from the
  first activity's start to the last one's end, `gap_ms` = span - kernel time, the GPU's time between
  kernels with the host out of the way. Figures per call are medians over the profiled calls; an op's time
  is its mean.

The span is the call's GPU time as the GPU-time clock measures it, so the ops and the gap add up to that
clock's median; what a program calling eagerly pays on top (the host's own pace) is the eager-call clock's
median minus the span, which the pages show beside it. The record keeps the result per profile
(lab.evidence.records: ProfileResult.breakdown).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from bisect import bisect_right
from collections import defaultdict
from typing import Callable, Mapping, Sequence

import torch

CALL = "kernel_lab.call"
METHOD = ("torch.profiler (CUPTI) over {calls} calls after {warmup} warm-up calls and one profiled warm-up call, "
          "each flushed and queued behind a device hold as on the GPU-time clock ({hold:.1f} ms: {margin}x the "
          "longest host queueing of a warm-up call, the profiled one included): kernel, memset and copy durations "
          "per op, attributed by the op annotation around each launch (else by kernel name); gap = first start to "
          "last end, minus kernel time")
GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MAX_OPS = 64  # ops kept per breakdown; the rest are summed into "other"
# The device hold before each profiled call outlasts the host's queueing of the call by this factor. The
# queueing is measured on a profiled warm-up call: the profiler slows the host by a factor that varies with the
# call and the host (a fixed 4x of the unprofiled queueing once fell short: the GPU waited, and the span read
# ten times the GPU-time median).
HOLD_MARGIN = 2
MIN_HOLD_MS = 1.0

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
                      warmup: int = 2) -> dict:
    """The breakdown of `call` (see the module docstring) as the record stores it. `clock`: the run's
    lab.measure.timing.CudaEventClock (its hold and its L2 flush)."""
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
    fd, path = tempfile.mkstemp(suffix=".json", prefix="kernel-lab-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    result = breakdown_from_trace(events, classify)
    result["method"] = METHOD.format(calls=calls, warmup=warmup, hold=hold, margin=HOLD_MARGIN)
    return result


class _Ranges:
    """Annotation ranges on one host thread, for "which annotations hold time t" queries."""

    def __init__(self, ranges: Sequence[tuple[float, float, str]]):
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]

    def around(self, t: float) -> list[tuple[float, float, str]]:
        """The ranges holding t, outermost first (ranges nest: the earlier start is the outer one)."""
        stop = bisect_right(self.starts, t)
        return [r for r in self.ranges[:stop] if r[0] <= t <= r[1]]


def breakdown_from_trace(events: Sequence[Mapping], classify: Classifier) -> dict:
    """Per-call figures from a chrome trace's events (see the module docstring); raises ValueError when the
    trace holds no CALL annotation or no GPU activity inside one."""
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
    call_ranges = {tid: _Ranges(r) for tid, r in calls.items()}
    label_ranges = {tid: _Ranges(r) for tid, r in labels.items()}
    per_call: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    for ts, dur, name, correlation in activities:
        launch = launches.get(correlation)
        if launch is None:
            continue
        host_ts, tid = launch
        holders = call_ranges[tid].around(host_ts) if tid in call_ranges else []
        if not holders:
            continue
        enclosing = label_ranges[tid].around(host_ts) if tid in label_ranges else []
        op = classify(name, tuple(r[2] for r in enclosing))
        per_call[(tid, holders[-1][0])].append((ts, dur, op))
    if not per_call:
        raise ValueError("the profiler's trace holds no GPU activity launched inside a profiled call")
    return _summarise(list(per_call.values()))


def _summarise(calls: list[list[tuple[float, float, str]]]) -> dict:
    n = len(calls)
    op_ms: dict[str, float] = defaultdict(float)
    op_kernels: dict[str, int] = defaultdict(int)
    kernel_ms, span_ms, gap_ms = [], [], []
    order: dict[str, float] = {}
    for activities in calls:
        activities.sort()
        start = activities[0][0]
        busy = sum(dur for _, dur, _ in activities)
        end = max(ts + dur for ts, dur, _ in activities)
        kernel_ms.append(busy / 1e3)
        span_ms.append((end - start) / 1e3)
        gap_ms.append(max(0.0, end - start - busy) / 1e3)
        for ts, dur, op in activities:
            op_ms[op] += dur / 1e3 / n
            op_kernels[op] += 1
            order.setdefault(op, ts - start)
    ops = sorted(op_ms, key=lambda op: order[op])
    if len(ops) > MAX_OPS:
        kept = set(sorted(ops, key=lambda op: -op_ms[op])[:MAX_OPS - 1])
        other_ms = sum(op_ms[op] for op in ops if op not in kept)
        other_kernels = sum(op_kernels[op] for op in ops if op not in kept)
        ops = [op for op in ops if op in kept]
        op_ms["other"], op_kernels["other"] = op_ms.get("other", 0.0) + other_ms, other_kernels
        ops.append("other")
    return {
        "calls": n,
        "ops": [{"op": op, "ms": op_ms[op], "kernels": round(op_kernels[op] / n)} for op in ops],
        "kernel_ms": statistics.median(kernel_ms),
        "span_ms": statistics.median(span_ms),
        "gap_ms": statistics.median(gap_ms),
    }
