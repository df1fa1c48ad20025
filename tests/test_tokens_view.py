"""Tokens per second on the pages of experiments that declare a token count: each profile's rate on both
clocks from the recorded medians, dashes where a clock or the shape gives nothing, and no table otherwise."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from lab.evidence.records import EagerResult  # noqa: E402
from lab.publish.formatting import tokens_per_s  # noqa: E402
from lab.publish.tokens import tokens_view  # noqa: E402


def _experiment():
    return replace(syn.experiment(), tokens=lambda shape: shape["M"] * shape["N"])  # 2 × 8 = 16 tokens a call


def _eager(ms: float) -> EagerResult:
    return EagerResult(samples_ms=(ms, ms), host_samples_ms=(0.01, 0.01), calls_per_sample=4, p20_ms=ms, p50_ms=ms,
                       p80_ms=ms)


def test_rates_are_tokens_over_each_clocks_median():
    point = syn.point({"subject": syn.timed([0.002, 0.002], eager=_eager(0.004)), "base": syn.timed([0.016])})
    view = tokens_view(_experiment(), syn.run([point]))
    assert view["names"] == ["subject", "base"] and view["eager"]
    (row,) = view["rows"]
    assert row["tokens"] == "16"
    # 16 tokens in 2 µs: 8 M/s on the GPU-time clock; in 4 µs eager: 4 M/s; the baseline has no eager median.
    assert row["cells"] == ["8.00 M / 4.00 M", "1.00 M / –"]


def test_a_shape_the_declaration_cannot_read_leaves_dashes():
    point = replace(syn.point({"subject": syn.timed([1.0])}), shape={"K": 3})  # no M or N: an older record's shape
    (row,) = tokens_view(_experiment(), syn.run([point]))["rows"]
    assert row["tokens"] == "–" and row["cells"][0] == "– / –"


def test_failed_profiles_and_undeclared_experiments_get_no_rate():
    failed = replace(syn.timed([1.0]), status="error", p50_ms=None)
    view = tokens_view(_experiment(), syn.run([syn.point({"subject": syn.timed([1.0]), "base": failed})]))
    assert view["rows"][0]["cells"] == ["16,000 / –", "– / –"] and not view["eager"]
    assert tokens_view(syn.experiment(), syn.run([syn.point({"subject": syn.timed([1.0])})])) is None
    assert tokens_view(_experiment(), syn.run([syn.point({"subject": syn.timed([1.0])})], cpu=True)) is None


def test_rates_read_whole_tokens_then_millions():
    assert [tokens_per_s(v) for v in (None, 983.4, 123_456.0, 1_234_567.0)] == ["–", "983", "123,456", "1.23 M"]
