"""Timing: the L2-flushed per-call clock, interleaved rounds over profiles, and the copy-bandwidth ceiling.

Method (the same on every device; only the clock differs):

* Before every sample the L2 is flushed clean (L2Flush): a buffer twice the size of the L2 cache (on the CPU,
  a fixed CPU_FLUSH_BYTES buffer), written once when the clock is made, is read end to end by a sum into one
  preallocated scalar. Each call then reads its inputs from DRAM, and finds the L2 holding clean lines it
  can drop for free. The flush runs before the start event and is not timed. The older flush zeroed the
  buffer instead: that left the L2 full of dirty lines, whose write-back to DRAM the timed call paid for, a
  fixed cost of some microseconds that made every short kernel read slow (docs/method.md gives the
  measured difference). Records say which flush they used (TimingMethod.l2_flush).
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

The ceilings are measured in the same run as the kernels they are compared with, each on a large buffer:
the copy ceiling, a device-to-device copy (read + write bytes over the median time); the read ceiling, a sum
into one scalar (reads alone); the 2:1 ceiling, an elementwise add (two reads and one write). An experiment
declares which matches its traffic (experiments.spec.Experiment.traffic).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from lab.evidence.records import FLUSH_READ, FLUSH_ZERO, L2_FLUSHES, CopyCeiling, MatmulPeak, TimingMethod

ORDER = "interleaved rounds, declaration order rotated by one each round"

# Significant digits a timing sample keeps in its record. A CUDA event reads to about half a microsecond and a
# host clock to tens of nanoseconds; seven digits of a millisecond figure keep far finer steps than either
# (0.01 ns at 10 us), while the 16-17 digits of a float's shortest repr are the bulk of a record's bytes.
SAMPLE_DIGITS = 7


def kept_sample(ms: float) -> float:
    """A sample as a record keeps it: rounded to SAMPLE_DIGITS significant digits (inf and nan unchanged)."""
    return float(f"{ms:.{SAMPLE_DIGITS}g}")


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


GPU_TIMING = TimingParams(warmup_rounds=3, min_samples=30, max_samples=100, target_seconds=0.15,
                          copy_bytes=1 << 30, copy_repeats=15)
# Under the interpreter a call takes milliseconds to seconds and the figures mean nothing: a few samples
# exercise the same code path.
CPU_TIMING = TimingParams(warmup_rounds=1, min_samples=3, max_samples=3, target_seconds=0.0,
                          copy_bytes=1 << 22, copy_repeats=3)
CPU_FLUSH_BYTES = 1 << 22


HOLD_MIN_MS = 0.5


class L2Flush:
    """Empties the L2 (or the CPU's caches) of everything a timed call could reuse, `method` deciding how.

    FLUSH_READ (the lab's flush): sum the whole buffer into one preallocated scalar. Every line of the buffer
    passes through the cache as a clean line, so whatever the previous call left (dirty output lines
    included) is evicted, and written back, by the flush itself, while the next call finds lines it may drop
    at no cost. The sum's result is a real output (kept in `sink`), so the read cannot be skipped; one
    launch, no allocation. FLUSH_ZERO (the older flush, kept to compare against): write zeros over the buffer,
    which leaves the L2 full of dirty lines the timed call must write back before its own data fits.
    """

    def __init__(self, nbytes: int, device: str, method: str = FLUSH_READ):
        if method not in L2_FLUSHES:
            raise ValueError(f"L2 flush {method!r}: expected one of {', '.join(L2_FLUSHES)}")
        self.nbytes = nbytes
        self.method = method
        # Written once here (zeros: the sum stays 0 and finite); the first read flush evicts these dirty lines.
        self.buffer = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        self.sink = torch.zeros((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        if self.method == FLUSH_READ:
            torch.sum(self.buffer, dim=0, out=self.sink)
        else:
            self.buffer.zero_()


class CudaEventClock:
    """Per-call CUDA-event timing with the L2 flushed before every call."""

    name = "cuda-events, device held while each round is queued"

    def __init__(self, device: str, flush_method: str = FLUSH_READ):
        props = torch.cuda.get_device_properties(torch.device(device))
        l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
        self.flush_bytes = 2 * l2
        self.flush_method = flush_method
        self._device = device
        self._flush = L2Flush(self.flush_bytes, device, flush_method)
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
        """Evict the L2 (see L2Flush), as before every timed call."""
        self._flush()

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

    def __init__(self, flush_bytes: int = CPU_FLUSH_BYTES, flush_method: str = FLUSH_READ):
        self.flush_bytes = flush_bytes
        self.flush_method = flush_method
        self._flush = L2Flush(flush_bytes, "cpu", flush_method)

    def flush(self) -> None:
        self._flush()

    def measure(self, fn: Callable[[], object]) -> Callable[[], float]:
        self.flush()
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
        target_seconds=params.target_seconds, order=ORDER, l2_flush=clock.flush_method,
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
                samples[name].append(kept_sample(read()))
        if on_round is not None:
            on_round(r + 1, rounds)
    return samples


def measure_copy_ceiling(clock: CudaEventClock | WallClock, device: str, params: TimingParams) -> CopyCeiling:
    """Device-to-device copy bandwidth: 2 x bytes (one read, one write) over the median time."""
    return _ceiling(clock, device, params, buffers=2, moved=2, op=lambda dst, src: dst.copy_(src))


def measure_read_ceiling(clock: CudaEventClock | WallClock, device: str, params: TimingParams) -> CopyCeiling:
    """Read bandwidth: a sum of the buffer into one scalar, bytes (reads alone) over the median time."""
    return _ceiling(clock, device, params, buffers=1, moved=1, op=lambda src, sink: torch.sum(src, dim=0, out=sink))


def measure_read2_write_ceiling(clock: CudaEventClock | WallClock, device: str, params: TimingParams) -> CopyCeiling:
    """Two reads to one write: an elementwise add, 3 x bytes over the median time."""
    return _ceiling(clock, device, params, buffers=3, moved=3, op=lambda out, a, b: torch.add(a, b, out=out))


def _ceiling(clock, device: str, params: TimingParams, *, buffers: int, moved: int, op) -> CopyCeiling:
    """Time `op` over `buffers` buffers of params.copy_bytes (a one-element sink follows a single buffer): the
    first is written, the others read. `moved` buffers' worth of bytes cross DRAM per call."""
    numel = params.copy_bytes // 4
    tensors = [torch.ones(numel, dtype=torch.float32, device=device) for _ in range(buffers)]
    if buffers == 1:
        tensors.append(torch.empty((), dtype=torch.float32, device=device))
    for _ in range(2):
        op(*tensors)
    readers = [clock.measure(lambda: op(*tensors)) for _ in range(params.copy_repeats)]
    clock.settle()
    samples = [kept_sample(read()) for read in readers]
    del tensors
    clock.release()  # the buffers are gone: hand their memory back before the kernels run
    median_ms = statistics.median(samples)
    nbytes = numel * 4
    return CopyCeiling(gbps=moved * nbytes / (median_ms * 1e-3) / 1e9, bytes_copied=nbytes, samples_ms=tuple(samples))


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
    samples = [kept_sample(read()) for read in readers]
    del a, b, out
    clock.release()
    median_ms = statistics.median(samples)
    return MatmulPeak(tflops=2 * m * n * k / (median_ms * 1e-3) / 1e12, m=m, n=n, k=k, dtype="bfloat16",
                      samples_ms=tuple(samples))
