"""Timing method with a scripted clock: interleaved rotated rounds, warm-up discarded, sample counts, failures."""

from __future__ import annotations

import pytest
import torch

from lab.measure.timing import (

    CPU_TIMING,

    TimingParams,

    WallClock,

    measure_copy_ceiling,

    rounds_for,

    time_interleaved,

)

PARAMS = TimingParams(warmup_rounds=2, min_samples=3, max_samples=6, target_seconds=0.01, copy_bytes=1 << 16,
                      copy_repeats=3)


class ScriptedClock:
    """Calls each function and reports a fixed time per call, logging the order and the flushes."""

    name = "scripted"
    flush_bytes = 0

    def __init__(self, ms_per_call):
        self.ms_per_call = ms_per_call
        self.log = []
        self.settles = 0
        self.releases = 0

    def begin_round(self):
        self.log.append(("hold",))

    def end_round(self):
        self.log.append(("queued",))

    def measure(self, fn):
        self.log.append(("flush",))
        name = fn()
        self.log.append(("call", name))
        ms = self.ms_per_call[name]
        return lambda: ms

    def settle(self):
        self.settles += 1

    def release(self):
        self.releases += 1


def _calls(*names):
    return {name: (lambda n=name: n) for name in names}


def _rounds(clock, per_round):
    calls = [entry[1] for entry in clock.log if entry[0] == "call"]
    return [calls[i:i + per_round] for i in range(0, len(calls), per_round)]


def test_rounds_rotate_the_order_and_flush_before_every_call():
    clock = ScriptedClock({"a": 5.0, "b": 5.0, "c": 5.0})  # slow: min_samples rounds after the warm-up
    result = time_interleaved(_calls("a", "b", "c"), clock, PARAMS)
    rounds = _rounds(clock, 3)
    assert len(rounds) == PARAMS.warmup_rounds + PARAMS.min_samples
    assert rounds[:3] == [["a", "b", "c"], ["b", "c", "a"], ["a", "b", "c"]], "rotation restarts after warm-up"
    assert rounds[3:] == [["b", "c", "a"], ["c", "a", "b"]]
    calls = [entry for entry in clock.log if entry[0] in ("flush", "call")]
    assert all(calls[i] == ("flush",) and calls[i + 1][0] == "call" for i in range(0, len(calls), 2))
    # Every round is queued behind a hold of the device: hold, (flush, call) per profile, queued.
    assert clock.log[0] == ("hold",) and clock.log[7] == ("queued",) and clock.log[8] == ("hold",)
    assert {k: len(v) for k, v in result.samples_ms.items()} == {"a": 3, "b": 3, "c": 3}
    assert result.errors == {}


def test_fast_calls_get_more_samples_up_to_the_maximum():
    clock = ScriptedClock({"a": 0.001, "b": 0.002})
    result = time_interleaved(_calls("a", "b"), clock, PARAMS)
    assert len(result.samples_ms["a"]) == PARAMS.max_samples
    assert result.samples_ms["b"] == [0.002] * PARAMS.max_samples, "warm-up samples are not kept"


@pytest.mark.parametrize("per_call_ms, expected", [(100.0, 3), (10.0 / 4, 4), (0.0001, 6), (0.0, 6)])
def test_rounds_follow_the_target_time_within_the_bounds(per_call_ms, expected):
    assert rounds_for(per_call_ms, PARAMS) == expected


def test_a_call_that_raises_is_dropped_and_the_others_go_on():
    clock = ScriptedClock({"a": 5.0, "c": 5.0})
    calls = _calls("a", "c")

    def out_of_memory():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    calls["b"] = out_of_memory
    result = time_interleaved(calls, clock, PARAMS)
    assert set(result.samples_ms) == {"a", "c"}
    assert result.errors["b"].startswith("OutOfMemoryError: CUDA out of memory")
    assert clock.releases == 1, "cached memory is handed back after a failure"
    assert all(len(v) == PARAMS.min_samples for v in result.samples_ms.values())


def test_progress_callback_sees_every_kept_round():
    seen = []
    time_interleaved(_calls("a"), ScriptedClock({"a": 5.0}), PARAMS, on_round=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_copy_ceiling_counts_read_and_write_bytes():
    ceiling = measure_copy_ceiling(WallClock(flush_bytes=1 << 12), "cpu", CPU_TIMING)
    assert ceiling.bytes_copied == CPU_TIMING.copy_bytes
    assert len(ceiling.samples_ms) == CPU_TIMING.copy_repeats
    median = sorted(ceiling.samples_ms)[len(ceiling.samples_ms) // 2]
    assert ceiling.gbps == pytest.approx(2 * ceiling.bytes_copied / (median * 1e-3) / 1e9)


# The L2 flush (lab.measure.timing.L2Flush): the same code serves the CUDA clock and the CPU path.


def test_the_read_flush_reads_the_whole_buffer_and_writes_only_its_sink():
    from lab.evidence.records import FLUSH_READ
    from lab.measure.timing import L2Flush

    flush = L2Flush(1 << 12, "cpu", FLUSH_READ)
    flush.buffer.copy_(torch.arange(flush.buffer.numel(), dtype=torch.float32))  # a sum that names every element
    before = flush.buffer.clone()
    flush()
    assert torch.equal(flush.buffer, before)  # nothing written over the buffer: the lines it leaves are clean
    n = flush.buffer.numel()
    assert flush.sink.item() == n * (n - 1) / 2  # every element was read, none skipped


def test_the_zero_flush_writes_the_buffer_as_before():
    from lab.evidence.records import FLUSH_ZERO
    from lab.measure.timing import L2Flush

    flush = L2Flush(1 << 12, "cpu", FLUSH_ZERO)
    flush.buffer.fill_(3.0)
    flush()
    assert flush.buffer.abs().sum().item() == 0.0


def test_a_flush_of_another_name_is_refused():
    from lab.measure.timing import L2Flush

    with pytest.raises(ValueError, match="expected one of zero, read"):
        L2Flush(1 << 12, "cpu", "evict")


def test_the_wall_clock_flushes_before_each_call_and_records_its_flush(monkeypatch):
    from lab.evidence.records import FLUSH_READ
    from lab.measure.timing import timing_method

    clock = WallClock(flush_bytes=1 << 12)
    assert clock.flush_method == FLUSH_READ
    order = []
    monkeypatch.setattr(clock, "_flush", lambda: order.append("flush"))
    for _ in range(3):
        clock.measure(lambda: order.append("call"))()
    assert order == ["flush", "call"] * 3
    method = timing_method(clock, CPU_TIMING)
    assert method.l2_flush == FLUSH_READ and method.l2_flush_bytes == 1 << 12


def test_the_ceilings_count_the_bytes_each_moves():
    from lab.measure.timing import measure_read2_write_ceiling, measure_read_ceiling

    class TwoMs:  # runs each call and says it took 2 ms: each ceiling is then its bytes over 2 ms
        def measure(self, fn):
            fn()
            return lambda: 2.0

        def settle(self):
            pass

        def release(self):
            pass

    clock = TwoMs()
    copy = measure_copy_ceiling(clock, "cpu", PARAMS)
    read = measure_read_ceiling(clock, "cpu", PARAMS)
    add = measure_read2_write_ceiling(clock, "cpu", PARAMS)
    for ceiling, moved in ((copy, 2), (read, 1), (add, 3)):
        assert ceiling.bytes_copied == PARAMS.copy_bytes
        assert ceiling.gbps == pytest.approx(moved * PARAMS.copy_bytes / 2e-3 / 1e9)
        assert len(ceiling.samples_ms) == PARAMS.copy_repeats
