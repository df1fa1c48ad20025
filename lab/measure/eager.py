"""The eager-call clock: what a Python program that calls an op back to back pays per call.

The GPU-time clock (lab.measure.timing) answers "how good is the kernel": the device is held while the host
queues a round, so host work never shows. This clock answers "what does my program pay":

* Eager time per call. One sample is a batch of `calls` back-to-back calls timed on the host's clock from an
  idle, synchronised device to a synchronised device, divided by `calls`. Host work (Python, argument checks,
  plan look-ups, allocations, launches) and GPU work both count, as they do for a caller; in a loop a call
  costs about max(host, GPU).
* Inputs from DRAM without a flush kernel. A flush between calls would hide host time behind its own GPU
  time, so there is none: call i reads copy i mod K of the point's inputs, with K copies together past
  twice the L2 (`flush_bytes`, the GPU-time clock's flush size), so no call finds its inputs in the L2.
  Inputs already larger than that are read from a single copy: the L2 cannot hold them between calls.
* Host time per call. The host seconds to issue the first HOST_BATCH_MAX calls of each batch (or all of
  them), over that count: the loop returns before the device finishes, and so few calls cannot fill the
  launch queue, so the host never waits on the GPU there. An op that synchronises inside a call shows its
  wait here too, as its caller would feel it.
* Profiles are sampled in interleaved rounds (declaration order rotated each round), after one discarded
  warm-up round that also sizes each profile's batch: enough calls for about `batch_seconds`, clamped.

On the CPU (Triton's interpreter) the same code runs with a wall clock and nothing to synchronise; its figures check
the machinery and are never performance evidence.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from lab.evidence.records import EagerMethod
from lab.measure.timing import describe_exception, kept_sample

HOST_BATCH_MAX = 64  # calls whose issue is timed for host time: a few kernels each stays well inside the launch queue


@dataclass(frozen=True)
class EagerParams:
    """Samples per profile (kept rounds), the wall time a batch aims for, and its bounds in calls."""

    warmup_rounds: int
    samples: int
    batch_seconds: float
    min_calls: int
    max_calls: int


GPU_EAGER = EagerParams(warmup_rounds=1, samples=20, batch_seconds=0.004, min_calls=4, max_calls=400)
CPU_EAGER = EagerParams(warmup_rounds=1, samples=2, batch_seconds=0.0, min_calls=1, max_calls=1)


@dataclass
class EagerTimes:
    """Per profile: eager ms per call (one value per batch), host-only ms per call, calls per batch; and the
    error text of each profile that raised."""

    eager_ms: dict[str, list[float]]
    host_ms: dict[str, list[float]]
    calls: dict[str, int]
    errors: dict[str, str]


class EagerClock:
    """Back-to-back batches timed on the host's clock; on CUDA synchronised at both ends."""

    def __init__(self, device: str, copies_past_bytes: int):
        self.device = device
        self.copies_past_bytes = copies_past_bytes
        self.on_gpu = torch.device(device).type == "cuda"

    @property
    def name(self) -> str:
        if self.on_gpu:
            return ("eager calls back to back, host clock from synchronised device to synchronised device, "
                    "inputs cycled through copies past twice the L2")
        return "wall-clock, back-to-back calls (CPU interpreter)"

    def _sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)

    def batch(self, calls: Sequence[Callable[[], object]], count: int, start: int) -> tuple[float, float]:
        """(eager ms per call, host ms per call) over `count` back-to-back calls, cycling through `calls` from
        `start`: eager from synchronised device to synchronised device, host over the first HOST_BATCH_MAX."""
        issued = min(count, HOST_BATCH_MAX)
        self._sync()
        began = time.perf_counter()
        for i in range(start, start + issued):
            calls[i % len(calls)]()
        host_done = time.perf_counter()
        for i in range(start + issued, start + count):
            calls[i % len(calls)]()
        self._sync()
        ended = time.perf_counter()
        return (ended - began) * 1e3 / count, (host_done - began) * 1e3 / issued

    def method(self, params: EagerParams) -> EagerMethod:
        return EagerMethod(clock=self.name, copies_past_bytes=self.copies_past_bytes, warmup_rounds=params.warmup_rounds,
                           samples=params.samples, batch_seconds=params.batch_seconds,
                           min_calls=params.min_calls, max_calls=params.max_calls, host_batch_max=HOST_BATCH_MAX)


def copies_needed(input_bytes: int, past_bytes: int) -> int:
    """How many copies of a point's inputs keep every call's inputs out of the L2: together past
    `past_bytes` (1 when one copy already is, or when `past_bytes` is 0: the CPU path)."""
    if input_bytes <= 0 or input_bytes >= past_bytes:
        return 1
    return math.ceil(past_bytes / input_bytes) + 1


def input_copies(inputs: Mapping[str, object], count: int) -> list[dict[str, object]]:
    """`count` sets of inputs: the originals, then clones (same strides, same requires_grad)."""
    sets: list[dict[str, object]] = [dict(inputs)]
    for _ in range(count - 1):
        sets.append({name: (t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t)
                     for name, t in inputs.items()})
    return sets


def input_bytes(inputs: Mapping[str, object]) -> int:
    return sum(t.numel() * t.element_size() for t in inputs.values() if isinstance(t, torch.Tensor))


def calls_for(per_call_ms: float, params: EagerParams) -> int:
    wanted = math.ceil(params.batch_seconds * 1e3 / per_call_ms) if per_call_ms > 0 else params.max_calls
    return max(params.min_calls, min(params.max_calls, wanted))


def time_eager(calls: Mapping[str, Sequence[Callable[[], object]]], clock: EagerClock, params: EagerParams) -> EagerTimes:
    """Sample every profile's eager and host time per call in interleaved rounds (see the module docstring).

    `calls[name]` holds one zero-argument call per input copy. A profile that raises is dropped from the
    remaining rounds and its error recorded; the others go on.
    """
    names = list(calls)
    times = EagerTimes({n: [] for n in names}, {n: [] for n in names}, {}, {})
    cursor = dict.fromkeys(names, 0)
    for name in names:  # warm-up: compile, fill caches, and size each profile's batch
        try:
            per_call = min(clock.batch(calls[name], params.min_calls, 0)[0] for _ in range(max(1, params.warmup_rounds)))
            times.calls[name] = calls_for(per_call, params)
        except Exception as exc:  # noqa: BLE001 - one profile's failure is its own result
            times.errors[name] = describe_exception(exc)
    for r in range(params.samples):
        live = [n for n in names if n not in times.errors]
        if not live:
            break
        shift = r % len(live)
        for name in live[shift:] + live[:shift]:
            count = times.calls[name]
            try:
                eager, host = clock.batch(calls[name], count, cursor[name])
                cursor[name] += count
            except Exception as exc:  # noqa: BLE001
                times.errors[name] = describe_exception(exc)
                continue
            times.eager_ms[name].append(kept_sample(eager))
            times.host_ms[name].append(kept_sample(host))
    return times


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
