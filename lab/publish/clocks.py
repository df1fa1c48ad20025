"""View model of the eager-call clock on an experiment page: per GPU, the claim judged on what a Python program
calling each profile back to back pays per call (host work included), beside the GPU-time verdict; and each
profile's eager and host time per call. Records made before that clock existed show as GPU time only."""

from __future__ import annotations

from experiments.spec import Experiment
from lab.evidence.records import RunRecord
from lab.evidence.verdict import CLOCK_MEANINGS, CLOCK_NAMES, EAGER_CALL, GPU_TIME, Verdict, word_counts
from lab.publish import badges
from lab.publish import formatting as fmt
from lab.publish.collect import profile_names
from lab.publish.escape import code, compose


def clock_legend() -> list[dict]:
    """The two clocks' names and one-line meanings, in the order pages show them."""
    return [{"name": CLOCK_NAMES[c], "meaning": CLOCK_MEANINGS[c]} for c in (GPU_TIME, EAGER_CALL)]


def claim_clock_first(experiment: Experiment) -> list[str]:
    """Both clocks, the one the claim speaks of first."""
    clock = experiment.claim.clock
    return [clock] + [c for c in (GPU_TIME, EAGER_CALL) if c != clock]


def margins_text(experiment: Experiment) -> str:
    """Each clock's margin, the claim's clock first: "±1.2% (GPU time); ±48.4% (Eager call)"."""
    return "; ".join(f"±{experiment.claim.margin_on(c).fraction:.1%} ({CLOCK_NAMES[c]})"
                     for c in claim_clock_first(experiment))


def margins_basis(experiment: Experiment) -> str:
    """What each clock's margin rests on, the claim's clock first."""
    return "; ".join(f"{CLOCK_NAMES[c]}: {experiment.claim.margin_on(c).basis}" for c in claim_clock_first(experiment))


def eager_section(experiment: Experiment, verdict: Verdict | None) -> dict | None:
    """The eager-call clock's verdict and tables for one GPU's newest run; None on the CPU interpreter."""
    if verdict is None or verdict.run is None or not verdict.run.is_performance_evidence:
        return None
    run = verdict.run
    if run.eager is None:
        return {"measured": False, "state": verdict.state, "badge": badges.verdict_badge(verdict),
                "summary": verdict.summary, "rows": []}
    judgements = {(j.case, j.dtype): j for j in verdict.points}
    rows = []
    for point in run.points:
        j = judgements.get((point.case, point.dtype))
        subject = point.results.get(experiment.claim.subject)
        base = point.results.get(j.baseline) if j is not None and j.baseline else None
        rows.append({
            "case": point.case,
            "dtype": point.dtype,
            "subject": _eager_cell(subject),
            "subject_host": _host_cell(subject),
            "subject_gbps": fmt.gbps(subject.eager.gbps) if subject and subject.eager else fmt.DASH,
            "subject_tflops": fmt.point_tflops(point.flops, _eager_tflops(subject)),
            "baseline": code(j.baseline) if j is not None and j.baseline else fmt.DASH,
            "baseline_eager": _eager_cell(base),
            "baseline_host": _host_cell(base),
            "baseline_tflops": fmt.point_tflops(point.flops, _eager_tflops(base)),
            "speedup": (compose("{} {}", fmt.ratio(j.speedup.ratio), fmt.interval(j.speedup.low, j.speedup.high))
                        if j is not None and j.speedup else fmt.DASH),
            "word": badges.word(j.word, j.reason) if j is not None else fmt.DASH,
        })
    names = profile_names(experiment, run.points)
    matrix = [{"case": p.case, "dtype": p.dtype,
               "cells": [compose("{} / {}", _eager_cell(p.results.get(n)), _host_cell(p.results.get(n))) for n in names]}
              for p in run.points]
    return {
        "measured": True,
        "state": verdict.state,
        "badge": badges.verdict_badge(verdict),
        "counts": word_counts(verdict.points),
        "summary": verdict.summary,
        "method": _method_text(run),
        "rows": rows,
        "has_flops": any(p.flops for p in run.points),
        "names": names,
        "matrix": matrix,
    }


def _eager_cell(result) -> str:
    if result is None or result.status != "ok":
        return fmt.DASH
    if result.eager is None:
        return "not measured"
    if result.eager.error:
        return compose("error: {}", result.eager.error)
    return fmt.latency_us(result.eager.p50_ms)


def _eager_tflops(result) -> float | None:
    """The recorded TFLOP/s on the eager-call clock (None where the profile has no eager time)."""
    return result.eager.tflops if result is not None and result.eager is not None else None


def _host_cell(result) -> str:
    if result is None or result.eager is None or result.eager.host_p50_ms is None:
        return fmt.DASH
    return fmt.latency_us(result.eager.host_p50_ms)


def _method_text(run: RunRecord) -> str:
    m = run.eager
    return (f"{m.clock}; {m.samples} batches per profile after {fmt.plural(m.warmup_rounds, 'warm-up round')}, each "
            f"{m.min_calls}–{m.max_calls} calls (as many as fill about {m.batch_seconds * 1e3:g} ms); input copies "
            f"together past {fmt.size_bytes(m.copies_past_bytes)}; host time over the first {m.host_batch_max} "
            "calls of each batch")
