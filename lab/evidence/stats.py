"""Statistics of raw timing samples: percentiles and a bootstrap confidence interval of a speedup.

The speedup of a subject over a baseline is the ratio of medians, baseline / subject (> 1: the subject is
faster). Its 95% interval comes from resampling both sets of raw samples with replacement (a percentile
bootstrap). The generator is seeded, so the same samples always give the same interval and pages
re-render byte for byte.
"""

from __future__ import annotations

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
    baseline = np.asarray(baseline_ms, dtype=np.float64)
    subject = np.asarray(subject_ms, dtype=np.float64)
    if baseline.size == 0 or subject.size == 0:
        raise ValueError("bootstrap_speedup: both sample sets must be non-empty")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_speedup: confidence must lie in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    baseline_medians = np.median(baseline[rng.integers(0, baseline.size, (resamples, baseline.size))], axis=1)
    subject_medians = np.median(subject[rng.integers(0, subject.size, (resamples, subject.size))], axis=1)
    ratios = baseline_medians / subject_medians
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    ratio = float(np.median(baseline) / np.median(subject))
    # A lopsided resampling distribution can leave the point estimate outside a percentile interval;
    # widening the interval to include it only ever makes a verdict more cautious.
    return SpeedupInterval(ratio, min(float(low), ratio), max(float(high), ratio), confidence)
