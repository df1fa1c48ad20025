"""Statistics of raw timing samples: percentiles and a bootstrap confidence interval of a speedup.

The speedup of a subject over a baseline is the ratio of medians, baseline / subject (> 1: the subject is
faster). Its 95% interval comes from resampling both sets of raw samples with replacement (a percentile
bootstrap). The generator is seeded and draws positions in the sorted samples, so the same samples, in any
order, always give the same interval and pages re-render byte for byte.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 20261122


@dataclass(frozen=True)
class Summary:
    """p20 / p50 / p80 of a set of samples (linear interpolation between order statistics)."""

    p20: float
    p50: float
    p80: float


def summarize(samples: Sequence[float]) -> Summary:
    if len(samples) == 0:
        raise ValueError("summarize: no samples")
    p20, p50, p80 = np.percentile(np.asarray(samples, dtype=np.float64), [20, 50, 80])
    return Summary(float(p20), float(p50), float(p80))


@dataclass(frozen=True)
class SpeedupInterval:
    """baseline median / subject median, with the bounds of its bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    confidence: float


def bootstrap_speedup(
    baseline_ms: Sequence[float],
    subject_ms: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> SpeedupInterval:
    """The speedup of the subject over the baseline with a percentile-bootstrap confidence interval."""
    baseline = np.sort(np.asarray(baseline_ms, dtype=np.float64))
    subject = np.sort(np.asarray(subject_ms, dtype=np.float64))
    if baseline.size == 0 or subject.size == 0:
        raise ValueError("bootstrap_speedup: both sample sets must be non-empty")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_speedup: confidence must lie in (0, 1), got {confidence}")
    (b_low, b_high), (s_low, s_high) = _middle_draws(seed, resamples, baseline.size, subject.size)
    ratios = ((baseline[b_low] + baseline[b_high]) / 2) / ((subject[s_low] + subject[s_high]) / 2)
    tail = (1 - confidence) / 2
    low, high = _quantiles(ratios, (tail, 1 - tail))
    ratio = float(_sorted_median(baseline) / _sorted_median(subject))
    # A lopsided resampling distribution can leave the point estimate outside a percentile interval;
    # widening the interval to include it only ever makes a verdict more cautious.
    return SpeedupInterval(ratio, min(float(low), ratio), max(float(high), ratio), confidence)


def _quantiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """np.quantile(values, qs) with its default (linear) method, bit for bit, without its general machinery:
    a page judges thousands of points and numpy's setup was most of each bootstrap. The same arithmetic in
    the same order: position (n - 1)·q, the two order statistics around it from one partition, and numpy's
    two-sided interpolation (from the lower value below the midpoint, from the upper one at or above it).
    Positions at either end, and values that are not all finite, go to np.quantile itself."""
    n = values.size
    positions = [(n - 1) * q for q in qs]
    if n < 2 or not all(0 <= p < n - 1 for p in positions) or not np.isfinite(values).all():
        return [float(v) for v in np.quantile(values, qs)]
    below = [math.floor(p) for p in positions]
    part = np.partition(values, sorted({i for b in below for i in (b, b + 1)}))
    out = []
    for p, b in zip(positions, below):
        low, high = float(part[b]), float(part[b + 1])
        gap, weight = high - low, p - b
        out.append(high - gap * (1 - weight) if weight >= 0.5 else low + gap * weight)
    return out


def _sorted_median(values: np.ndarray) -> float:
    """np.median of values already sorted: the middle value, or the mean of the two middle ones."""
    n = values.size
    if n % 2:
        return float(values[n // 2])
    return float((values[n // 2 - 1] + values[n // 2]) / 2)


@functools.lru_cache(maxsize=256)
def _middle_draws(seed: int, resamples: int, n_baseline: int, n_subject: int):
    """For each resample of each set, the positions (in the sorted samples) of the two middle draws.

    A resample draws n positions with replacement. The draws depend only on the seed and the two sample
    counts, never on the values, and with the samples sorted the median of a resample is the mean of the
    values at its two middle positions (one when n is odd). So every point with the same counts shares one
    set of draws, and a page of thousands of points costs a gather per point instead of a sort.
    """
    rng = np.random.default_rng(seed)
    draws = (rng.integers(0, n_baseline, (resamples, n_baseline)), rng.integers(0, n_subject, (resamples, n_subject)))
    middles = []
    for drawn in draws:
        n = drawn.shape[1]
        ordered = np.sort(drawn, axis=1)
        middles.append((ordered[:, (n - 1) // 2], ordered[:, n // 2]))
    return tuple(middles)
