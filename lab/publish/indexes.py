"""View models of the pages that gather experiments: the experiments index and verdict snippet, each
experiment's summary snippet, the decision pages, the environment snippet and the legend of the words.

Snippets under docs/generated/ are included into pages elsewhere, so their links are written from the docs
root (/experiments/<slug>.md), which MkDocs resolves for the including page when
`validation.links.absolute_links` is `relative_to_docs`.
"""

from __future__ import annotations

from experiments.spec import Decision
from lab.evidence.records import RunRecord
from lab.evidence.verdict import AGAINST, DECISION_RULE, OPEN, decide, word_counts
from lab.publish import badges
from lab.publish import formatting as fmt
from lab.publish.collect import Evidence, dtypes_in
from lab.publish.escape import Md, cell, compose, declared, href
from lab.publish.overview import record_file
from lab.publish.views import gpu_order, run_shape


def index_rows(evidence: Evidence, link_prefix: str) -> tuple[list[str], list[dict]]:
    gpus = evidence.evidence_gpus
    names = evidence.gpu_names
    rows = []
    for slug, experiment in evidence.experiments.items():
        verdicts = evidence.verdicts[slug]
        rows.append({
            "slug": slug,
            "title": declared(experiment.title),
            "link": href(f"{link_prefix}{slug}.md"),
            "question": cell(declared(experiment.question)),
            "claim": declared(experiment.claim.short),
            "run_shape": run_shape(experiment),
            "cells": [badges.verdict_badge(verdicts.get(key)) for key in gpus],
            "no_gpu": badges.verdict_badge(None),
        })
    return [evidence.gpu_labels[k] for k in gpus], rows


def summary_rows(evidence: Evidence, slug: str) -> list[dict]:
    """Per GPU with performance evidence and dtype: the subject against the best baseline, in brief."""
    rows = []
    for key in evidence.evidence_gpus:
        verdict = evidence.verdicts[slug].get(key)
        if verdict is None or verdict.run is None or not verdict.run.is_performance_evidence:
            continue
        for dtype in dtypes_in(verdict.run):
            judged = [j for j in verdict.points if j.dtype == dtype]
            timed = [j for j in judged if j.speedup is not None]
            low = min(timed, key=lambda j: j.speedup.ratio, default=None)
            high = max(timed, key=lambda j: j.speedup.ratio, default=None)
            rows.append({
                "gpu": evidence.gpu_labels[key],
                "dtype": dtype,
                "verdict": badges.verdict_badge(verdict),
                "points": len(judged),
                "counts": word_counts(judged) or fmt.DASH,
                "against": sum(j.effect == AGAINST for j in judged),
                "lowest": compose("{} {}", fmt.ratio(low.speedup.ratio), fmt.interval(low.speedup.low, low.speedup.high))
                if low else fmt.DASH,
                "lowest_at": low.case if low else fmt.DASH,
                "highest": fmt.ratio(high.speedup.ratio) if high else fmt.DASH,
                "run_link": href(f"/records/{slug}/{record_file(verdict.run)}"),
                "run_id": fmt.short_run_id(verdict.run.run_id),
            })
    return rows


def decision_context(evidence: Evidence, decision: Decision, link_prefix: str) -> dict:
    gpus = [k for k in evidence.evidence_gpus
            if any(k in evidence.verdicts.get(slug, {}) for slug in decision.experiments)]
    names = evidence.gpu_names
    calls = []
    for key in gpus:
        call = decide(decision, {slug: evidence.verdicts[slug][key] for slug in decision.experiments
                                 if slug in evidence.verdicts and key in evidence.verdicts[slug]})
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
            "cells": [badges.verdict_badge(evidence.verdicts[slug].get(key)) if experiment
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
        })
    return rows
