"""View models of the pages that gather experiments: the experiments index and verdict snippet, each
experiment's summary snippet, the decision pages, the environment snippet and the legend of the words.

Snippets under docs/generated/ are included into pages elsewhere, so their links are written from the docs
root (/experiments/<slug>.md), which MkDocs resolves for the including page when
`validation.links.absolute_links` is `relative_to_docs`.
"""

from __future__ import annotations

from statistics import median
from typing import Iterable

from experiments.spec import Decision
from lab.evidence.records import RunRecord, run_seconds
from lab.evidence.verdict import (
    AGAINST,
    CLOCK_NAMES,
    DECISION_RULE,
    OPEN,
    PointJudgement,
    Verdict,
    decide,
    point_label,
    word_counts,
)
from lab.publish import badges
from lab.publish import formatting as fmt
from lab.publish.collect import Evidence, dtypes_in
from lab.publish.escape import Md, cell, compose, declared, href
from lab.publish.overview import record_file
from lab.publish.views import gpu_order, run_shape


def speedup_range(judgements: Iterable[PointJudgement]) -> dict | None:
    """The speedups over the best peer at the judged points: lowest, median and highest, with where the lowest
    and highest lie; None where no point has a speedup."""
    timed = sorted((j for j in judgements if j.speedup is not None), key=lambda j: j.speedup.ratio)
    if not timed:
        return None
    return {"low": timed[0], "median": median(j.speedup.ratio for j in timed), "high": timed[-1]}


def range_text(found: dict) -> str:
    """"0.912× – 1.004× – 1.180×": lowest – median – highest (one figure where there is one point)."""
    if found["low"] is found["high"]:
        return fmt.ratio(found["median"])
    return f"{fmt.ratio(found['low'].speedup.ratio)} – {fmt.ratio(found['median'])} – {fmt.ratio(found['high'].speedup.ratio)}"


def range_where(found: dict) -> str:
    """"lowest at a (float32), highest at b (bfloat16)" ("at a (float32)" where there is one point)."""
    if found["low"] is found["high"]:
        return f"at {point_label(found['low'])}"
    return f"lowest at {point_label(found['low'])}, highest at {point_label(found['high'])}"


def clock_label(experiment) -> str:
    """The claim's clock and its margin: "Eager call, margin ±6.0%"."""
    clock = experiment.claim.clock
    return f"{CLOCK_NAMES[clock]}, margin ±{experiment.claim.margin_on(clock).fraction:.1%}"


def standing(experiment, verdict: Verdict | None, gpu_label: str = "", with_range: bool = True) -> Md:
    """The verdict that stands for a claim on one GPU: its badge on the claim's clock, the clock named, and the
    speedup over the best peer as lowest – median – highest, with the points of the lowest and highest in a
    short line under it. Record strings pass through badges.esc."""
    clock = experiment.claim.clock
    gpu = f"<strong>{badges.esc(gpu_label)}</strong> · " if gpu_label else ""
    head = Md(f'{gpu}{badges.verdict_badge(verdict)} <span class="kl-clock">{badges.esc(clock_label(experiment))}</span>')
    found = speedup_range(verdict.points) if verdict is not None and with_range else None
    if found is None:
        return head
    where = range_where(found)
    return Md(f'{head} · <span class="kl-range">{badges.esc(range_text(found))}</span>'
              f"<br><small>{badges.esc(where)}</small>")


def standing_cell(evidence: Evidence, slug: str) -> Md:
    """Every GPU's standing verdict for `slug`, one GPU a line ("No evidence" without a GPU run)."""
    experiment = evidence.experiments[slug]
    verdicts = evidence.claim_verdicts(slug)
    lines = [standing(experiment, verdicts[key], evidence.gpu_labels[key]) for key in evidence.evidence_gpus
             if key in verdicts and verdicts[key].run is not None and verdicts[key].run.is_performance_evidence]
    return Md("<br>").join(lines) if lines else badges.verdict_badge(None)


def claim_words(experiment) -> str:
    """The claim in words: its statement, else the subject against its baselines."""
    claim = experiment.claim
    return claim.statement or f"{claim.subject} is faster than {', '.join(claim.baselines)}"


def index_rows(evidence: Evidence, link_prefix: str) -> list[dict]:
    """A row per experiment: its title, question, claim in words and the verdict on its claim's clock per GPU."""
    rows = []
    for slug, experiment in evidence.experiments.items():
        rows.append({
            "slug": slug,
            "title": declared(experiment.title),
            "link": href(f"{link_prefix}{slug}.md"),
            "question": cell(declared(experiment.question)),
            "claim": cell(declared(claim_words(experiment))),
            "clock": CLOCK_NAMES[experiment.claim.clock],
            "run_shape": run_shape(experiment),
            "standing": standing_cell(evidence, slug),
            "no_gpu": badges.verdict_badge(None),
        })
    return rows


def summary_rows(evidence: Evidence, slug: str) -> list[dict]:
    """Per GPU with performance evidence and dtype: the claim on its clock, the subject against the best
    baseline in brief (lowest – median – highest speedup), and beside it the other clock's verdict, labelled."""
    experiment = evidence.experiments[slug]
    clock = experiment.claim.clock
    other = next(c for c in CLOCK_NAMES if c != clock)
    rows = []
    for key in evidence.evidence_gpus:
        verdict = evidence.claim_verdicts(slug).get(key)
        if verdict is None or verdict.run is None or not verdict.run.is_performance_evidence:
            continue
        beside = evidence.on_clock(slug, other).get(key)
        for dtype in dtypes_in(verdict.run):
            judged = [j for j in verdict.points if j.dtype == dtype]
            found = speedup_range(judged)
            rows.append({
                "gpu": evidence.gpu_labels[key],
                "dtype": dtype,
                "verdict": badges.verdict_badge(verdict),
                "clock": clock_label(experiment),
                "points": len(judged),
                "counts": word_counts(judged) or fmt.DASH,
                "against": sum(j.effect == AGAINST for j in judged),
                "range": range_text(found) if found else fmt.DASH,
                "where": range_where(found) if found else "",
                "other_clock": f"{CLOCK_NAMES[other]}, margin ±{experiment.claim.margin_on(other).fraction:.1%}",
                "other": badges.verdict_badge(beside) if beside is not None and beside.points else "",
                "run_link": href(f"/records/{slug}/{record_file(verdict.run)}"),
                "run_id": fmt.short_run_id(verdict.run.run_id),
            })
    return rows


def decision_context(evidence: Evidence, decision: Decision, link_prefix: str) -> dict:
    gpus = [k for k in evidence.evidence_gpus
            if any(k in evidence.verdicts.get(slug, {}) for slug in decision.experiments)]
    calls = []
    for key in gpus:
        call = decide(decision, {slug: evidence.claim_verdicts(slug)[key] for slug in decision.experiments
                                 if slug in evidence.verdicts and key in evidence.claim_verdicts(slug)})
        calls.append({"gpu": evidence.gpu_labels[key], "outcome": call.outcome, "text": declared(call.text),
                      "kind": f"kl-box-{badges.css_name(call.outcome)}", "badge": badges.badge(call.outcome)})
    experiments = []
    for slug in decision.experiments:
        experiment = evidence.experiments.get(slug)
        experiments.append({
            "slug": slug,
            "known": experiment is not None,
            "title": declared(experiment.title if experiment else slug),
            "link": href(f"{link_prefix}{slug}.md"),
            "cells": [standing(experiment, evidence.claim_verdicts(slug).get(key)) if experiment
                      else "not declared" for key in gpus],
        })
    return {
        "d": declared(decision),
        "gpus": [evidence.gpu_labels[k] for k in gpus],
        "calls": calls,
        "experiments": experiments,
        "rule": declared(DECISION_RULE),
        "open_kind": f"kl-box-{badges.css_name(OPEN)}",
        "open_badge": badges.badge(OPEN),
    }


def environment_rows(evidence: Evidence) -> list[dict]:
    by_gpu: dict[str, list[RunRecord]] = {}
    for runs in evidence.runs.values():
        for run in runs:
            by_gpu.setdefault(run.gpu_key, []).append(run)
    rows = []
    for key in gpu_order(by_gpu):
        runs = sorted(by_gpu[key], key=lambda r: (r.started_utc, r.run_id))
        latest = runs[-1]
        env = latest.environment
        ceilings = [r.copy_ceiling.gbps for r in runs]
        rows.append({
            "gpu": latest.gpu_name,
            "key": key,
            "cpu": not latest.is_performance_evidence,
            "sms": env.get("sm_count") or fmt.DASH,
            "memory": fmt.size_bytes(env.get("memory_bytes")),
            "driver": (env.get("nvidia_smi") or {}).get("driver") or fmt.DASH,
            "cuda": env.get("cuda") or fmt.DASH,
            "torch": env.get("torch") or fmt.DASH,
            "triton": env.get("triton") or fmt.DASH,
            "python": env.get("python") or fmt.DASH,
            "ceiling": fmt.gbps(latest.copy_ceiling.gbps),
            "ceiling_range": f"{fmt.gbps(min(ceilings))}–{fmt.gbps(max(ceilings))}",
            "runs": len(runs),
            "last": latest.started_utc,
            **_refresh_times(runs),
        })
    return rows


def _refresh_times(runs: list[RunRecord]) -> dict[str, str]:
    """How long the newest run of each experiment on one GPU took (`runs` oldest first): all of them one
    after another, and the longest, which bounds a refresh spread over several GPUs from below."""
    newest = {run.experiment: run for run in runs}
    timed = {slug: t for slug, run in newest.items() if (t := run_seconds(run.started_utc, run.finished_utc)) is not None}
    if not timed:
        return {"refresh_sum": fmt.DASH, "refresh_longest": fmt.DASH}
    total = sum(timed.values())
    slug = max(timed, key=timed.get)
    minutes = f" ({total / 60:,.0f} min)" if total >= 120 else ""
    return {"refresh_sum": f"{total:,.0f} s{minutes} over {len(timed)} experiment{'s' if len(timed) > 1 else ''}",
            "refresh_longest": f"{timed[slug]:,.0f} s ({slug})"}
