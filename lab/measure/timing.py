"""Timing: the L2-flushed per-call clock, interleaved rounds over profiles, and the copy-bandwidth ceiling.

Method (the same on every device; only the clock differs):

* Before every sample a buffer twice the size of the L2 cache is zeroed (on the CPU, a fixed
  CPU_FLUSH_BYTES buffer), so each call reads its inputs from DRAM. The flush runs before the start
  event and is not timed.
* On CUDA each sample is a pair of CUDA events around one call; on the CPU (Triton's interpreter) it is
  time.perf_counter around the call. CPU figures are never performance evidence.
* Profiles are timed in rounds: round r times every profile once, in the declaration order rotated by r,
  so clock or thermal drift hits all profiles alike and none always runs first after the flush.
* The first `warmup_rounds` rounds are discarded; they also estimate the per-call time, from which the
  number of kept rounds follows: enough for about `target_seconds` of the slowest profile, clamped to
  [min_samples, max_samples].
* Each profile's call allocates its own output, so every profile pays for that alike.
* On CUDA the device is held by a spin kernel at the start of every round while the host queues the
  round's calls, so host-side launch overhead (argument checks, Python launchers, compiled-graph guards)
  never shows in a device timing: the events measure what the GPU spends, as a GPU-bound program sees it.
  The hold is sized from the host's measured queueing time of the previous round (twice that, at least
  HOLD_MIN_MS).

The copy ceiling is the bandwidth of a device-to-device copy of a large buffer (read + write bytes over
the median time), measured in the same run as the kernels it is compared with.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from lab.evidence.records import CopyCeiling, MatmulPeak, TimingMethod

ORDER = "interleaved rounds, declaration order rotated by one each round"


@dataclass(frozen=True)
class TimingParams:
    """How many rounds to run and discard, the bounds on kept samples, the time budget that picks a count
    between them (seconds of the slowest profile), and the size and repeats of the copy-ceiling test."""

    warmup_rounds: int
    min_samples: int
    max_samples: int
    target_seconds: float
    copy_bytes: int
    copy_repeats: int


GPU_TIMING = TimingParams(warmup_rounds=3, min_samples=20, max_samples=60, target_seconds=0.1,
                          copy_bytes=1 << 30, copy_repeats=15)
# Under the interpreter a call takes milliseconds to seconds and the figures mean nothing: a few samples
# exercise the same code path.
CPU_TIMING = TimingParams(warmup_rounds=1, min_samples=3, max_samples=3, target_seconds=0.0,
                          copy_bytes=1 << 22, copy_repeats=3)
CPU_FLUSH_BYTES = 1 << 22


HOLD_MIN_MS = 0.5


class CudaEventClock:
    """Per-call CUDA-event timing with the L2 flushed before every call."""

    name = "cuda-events, device held while each round is queued"

    def __init__(self, device: str):
        props = torch.cuda.get_device_properties(torch.device(device))
        l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
        self.flush_bytes = 2 * l2
        self._device = device
        self._flush_buffer = torch.empty(self.flush_bytes, dtype=torch.uint8, device=device)
        self._cycles_per_ms = props.clock_rate  # kHz: cycles per millisecond
        self._queue_ms = HOLD_MIN_MS
        self._queue_started = 0.0

    def begin_round(self) -> None:
        """Hold the device while the host queues this round, so launch overhead stays off the clock."""
        hold_ms = max(HOLD_MIN_MS, 2 * self._queue_ms)
        torch.cuda._sleep(int(hold_ms * self._cycles_per_ms))
        self._queue_started = time.perf_counter()

    def end_round(self) -> None:
        self._queue_ms = (time.perf_counter() - self._queue_started) * 1e3

    def hold(self, ms: float) -> None:
        """Keep the device busy for `ms` (a spin kernel), so what the host queues next runs back to back."""
        torch.cuda._sleep(int(ms * self._cycles_per_ms))

    def flush(self) -> None:
        """Evict the L2 (write a buffer twice its size), as before every timed call."""
        self._flush_buffer.zero_()

    def measure(self, fn: Callable[[], object]) -> Callable[[], float]:
        """Queue one flushed, timed call of `fn`; the returned reader gives its ms after `settle()`."""
        self.flush()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return lambda: start.elapsed_time(end)

    def settle(self) -> None:
        torch.cuda.synchronize(self._device)

    def release(self) -> None:
        """Hand cached blocks back after a failure (an out-of-memory error leaves them fragmented)."""
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            # After a sticky fault (an illegal memory access) nothing can be freed; the fault itself is
            # already recorded against the profile that caused it, and every later call records its own.
            pass


class WallClock:
    """time.perf_counter around each call, for the CPU path; the same flush, the same rounds."""

    name = "wall-clock"

    def __init__(self, flush_bytes: int = CPU_FLUSH_BYTES):
        self.flush_bytes = flush_bytes
        self._flush_buffer = torch.empty(flush_bytes, dtype=torch.uint8)

    def measure(self, fn: Callable[[], object]) -> Callable[[], float]:
        self._flush_buffer.zero_()
        start = time.perf_counter()
        fn()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        return lambda: elapsed_ms

    def begin_round(self) -> None:
        return None

    def end_round(self) -> None:
        return None

    def settle(self) -> None:
        return None

    def release(self) -> None:
        return None


def make_clock(device: str) -> CudaEventClock | WallClock:
    return CudaEventClock(device) if torch.device(device).type == "cuda" else WallClock()


def timing_method(clock: CudaEventClock | WallClock, params: TimingParams) -> TimingMethod:
    return TimingMethod(
        clock=clock.name, l2_flush_bytes=clock.flush_bytes, warmup_rounds=params.warmup_rounds,
        min_samples=params.min_samples, max_samples=params.max_samples,
        target_seconds=params.target_seconds, order=ORDER,
    )


@dataclass
class InterleavedTimes:
    """Kept samples (ms) per profile name, and the error text of each profile that raised while timed."""

    samples_ms: dict[str, list[float]]
    errors: dict[str, str]


def describe_exception(exc: BaseException, limit: int = 600) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rounds_for(per_call_ms: float, params: TimingParams) -> int:
    """How many rounds to keep when the slowest profile takes `per_call_ms` a call."""
    wanted = math.ceil(params.target_seconds * 1e3 / per_call_ms) if per_call_ms > 0 else params.max_samples
    return max(params.min_samples, min(params.max_samples, wanted))


def time_interleaved(
    calls: Mapping[str, Callable[[], object]],
    clock: CudaEventClock | WallClock,
    params: TimingParams,
    on_round: Callable[[int, int], None] | None = None,
) -> InterleavedTimes:
    """Time every call in interleaved rounds (see the module docstring).

    A call that raises is dropped from the remaining rounds and its error recorded; the others go on.
    `on_round(done, total)` is called after each kept round (progress reporting).
    """
    names = list(calls)
    errors: dict[str, str] = {}
    warmup = _run_rounds(names, calls, clock, params.warmup_rounds, errors)
    per_call = [statistics.median(v) for v in warmup.values() if v]
    rounds = rounds_for(max(per_call, default=0.0), params)
    kept = _run_rounds(names, calls, clock, rounds, errors, on_round)
    return InterleavedTimes({name: kept[name] for name in names if name not in errors}, errors)


def _run_rounds(names, calls, clock, rounds, errors, on_round=None) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        live = [n for n in names if n not in errors]
        if not live:
            break
        shift = r % len(live)
        pending = []
        clock.begin_round()
        for name in live[shift:] + live[:shift]:
            try:
                pending.append((name, clock.measure(calls[name])))
            except Exception as exc:  # noqa: BLE001 - any failure of one profile is that profile's result
                errors[name] = describe_exception(exc)
                clock.release()
        clock.end_round()
        clock.settle()
        for name, read in pending:
            if name not in errors:
                samples[name].append(read())
        if on_round is not None:
            on_round(r + 1, rounds)
    return samples


def measure_copy_ceiling(clock: CudaEventClock | WallClock, device: str, params: TimingParams) -> CopyCeiling:
    """Device-to-device copy bandwidth: 2 x bytes (one read, one write) over the median time."""
    nbytes, samples = _time_copies(clock, device, params)
    clock.release()  # the two buffers are gone: hand their memory back before the kernels run
    median_ms = statistics.median(samples)
    return CopyCeiling(gbps=2 * nbytes / (median_ms * 1e-3) / 1e9, bytes_copied=nbytes, samples_ms=tuple(samples))


MATMUL_SHAPE = (8192, 8192, 8192)  # bf16: long enough (about 1 ms) that the flush and the events are noise


def measure_matmul_peak(clock: CudaEventClock, device: str, params: TimingParams) -> MatmulPeak:
    """A bf16 matmul's TFLOP/s on the same clock as everything else: the roofline's flat roof."""
    m, n, k = MATMUL_SHAPE
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        torch.matmul(a, b, out=out)
    readers = [clock.measure(lambda: torch.matmul(a, b, out=out)) for _ in range(params.copy_repeats)]
    clock.settle()
    samples = [read() for read in readers]
    del a, b, out
    clock.release()
    median_ms = statistics.median(samples)
    return MatmulPeak(tflops=2 * m * n * k / (median_ms * 1e-3) / 1e12, m=m, n=n, k=k, dtype="bfloat16",
                      samples_ms=tuple(samples))


def _time_copies(clock, device: str, params: TimingParams) -> tuple[int, list[float]]:
    numel = params.copy_bytes // 4
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    readers = [clock.measure(lambda: dst.copy_(src)) for _ in range(params.copy_repeats)]
    clock.settle()
    return numel * 4, [read() for read in readers]
