"""Tokens per second, for experiments that declare how many tokens a call processes (Experiment.tokens): each
profile's rate at each point on the GPU-time clock and on the eager-call clock. Derived from the record's
medians and the point's recorded shape; nothing here is measured, and a shape the declaration cannot read
(an older or a hostile record) leaves its row's rates as dashes instead of stopping the page."""

from __future__ import annotations

from experiments.spec import Experiment
from lab.evidence.records import ProfileResult, RunRecord
from lab.publish import formatting as fmt
from lab.publish.collect import profile_names


def _tokens(experiment: Experiment, shape) -> int | None:
    try:
        n = experiment.tokens(shape)
    except (KeyError, TypeError, ValueError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def _rate(tokens: int | None, ms: float | None) -> float | None:
    return None if tokens is None or not ms else tokens / (ms * 1e-3)


def _eager_ms(result: ProfileResult | None) -> float | None:
    if result is None or result.status != "ok" or result.eager is None or result.eager.error:
        return None
    return result.eager.p50_ms


def tokens_view(experiment: Experiment, run: RunRecord) -> dict | None:
    """{"names", "rows": [{"case", "dtype", "tokens", "cells": ["GPU / eager", ...]}], "eager"}, or None when
    the experiment declares no token count or the run is not performance evidence."""
    if experiment.tokens is None or not run.is_performance_evidence:
        return None
    names = profile_names(experiment, run.points)
    rows, any_eager = [], False
    for point in run.points:
        n = _tokens(experiment, point.shape)
        cells = []
        for name in names:
            result = point.results.get(name)
            gpu = _rate(n, result.p50_ms) if result is not None and result.status == "ok" else None
            eager = _rate(n, _eager_ms(result))
            any_eager = any_eager or eager is not None
            cells.append(f"{fmt.tokens_per_s(gpu)} / {fmt.tokens_per_s(eager)}")
        rows.append({"case": point.case, "dtype": point.dtype, "tokens": fmt.DASH if n is None else f"{n:,}",
                     "cells": cells})
    return {"names": names, "rows": rows, "eager": any_eager}
