"""View models of what an experiment page shows before its per-GPU detail: the summary card, the GPUs side by
side, and the verdict of every run ever recorded (the history) — each on every clock the records hold (GPU
time always; the eager-call clock where a run measured it).

Numbers are formatted here (lab.publish.formatting); words and badges come from lab.publish.badges; record
strings reach HTML only through `badges.esc`, and Markdown only through the templates (lab.publish.escape);
what is built here as Markdown of the project's own (a line break, a code span, a link) is an Md.
"""

from __future__ import annotations

from typing import Collection

from experiments.spec import Experiment
from lab.evidence.hashing import changed_sources
from lab.evidence.records import Point, RunRecord
from lab.evidence.verdict import (
    CLOCK_NAMES,
    EAGER_CALL,
    GPU_TIME,
    MEETS,
    NO_EVIDENCE,
    STALE,
    PointJudgement,
    Verdict,
    clock_timing,
    judge_run,
    word_counts,
)
from lab.publish import badges, ceilings
from lab.publish import formatting as fmt
from lab.publish.collect import Evidence, dtypes_in
from lab.publish.escape import Md, code, compose, href
from lab.publish.plots import GPU_PALETTE, speedup_plot_filename

PLOTS = "../assets/plots"
CARD_POINTS = 4  # a GPU and dtype with more points than this shows its lowest and highest speedup only


def record_file(run: RunRecord) -> str:
    """The record's file name as it is stored and published (tools/mkdocs_hooks.py copies records as they
    are): <run-id>.json.gz when it was read from a compressed file, else <run-id>.json."""
    compressed = run.path is not None and run.path.name.endswith(".json.gz")
    return f"{run.run_id}.json.gz" if compressed else f"{run.run_id}.json"


def record_path(run: RunRecord) -> str:
    """Where the repository keeps the record, and the site its copy: records/<slug>/<file>."""
    return f"records/{run.experiment}/{record_file(run)}"


def record_link(run: RunRecord) -> Md:
    return href(f"../{record_path(run)}")


def run_ref(run: RunRecord, gpu_label: str) -> dict:
    """How a run is named in tables: its short id linked to the record, date, GPU and commit."""
    return {
        "short": fmt.short_run_id(run.run_id),
        "run_id": run.run_id,
        "link": record_link(run),
        "date": fmt.utc_date(run.started_utc),
        "commit": fmt.short_commit(run.git.get("commit"), run.git.get("dirty")),
        "gpu": gpu_label,
    }


def clock_verdicts(evidence: Evidence, slug: str, clock: str) -> dict[str, Verdict]:
    return evidence.on_clock(slug, clock)


def performance_verdicts(evidence: Evidence, slug: str, clock: str = GPU_TIME) -> list[tuple[str, Verdict]]:
    """(GPU key, verdict on `clock`) for every GPU whose newest run of `slug` is a GPU run that holds `clock`,
    in the evidence's GPU order."""
    verdicts = clock_verdicts(evidence, slug, clock)
    return [(k, verdicts[k]) for k in evidence.evidence_gpus
            if k in verdicts and verdicts[k].run is not None and verdicts[k].run.is_performance_evidence
            and (clock == GPU_TIME or verdicts[k].run.eager is not None)]


def clocks_with_data(evidence: Evidence, slug: str) -> list[str]:
    """GPU time, and the eager-call clock when some GPU's newest run measured it."""
    return [GPU_TIME] + ([EAGER_CALL] if performance_verdicts(evidence, slug, EAGER_CALL) else [])


def gpu_colour(evidence: Evidence, gpu_key: str) -> str:
    """A GPU's colour in every side-by-side plot: by its place among all GPUs with evidence, so it never changes
    from page to page."""
    return GPU_PALETTE[evidence.evidence_gpus.index(gpu_key) % len(GPU_PALETTE)]


def _time_and_rate(experiment: Experiment, point: Point, run: RunRecord, name: str | None, clock: str) -> str:
    """Median µs and the rate a reader judges it by: GB/s where the point is memory-bound, TFLOP/s where it
    is compute-bound (lab.publish.ceilings)."""
    result = point.results.get(name) if name else None
    timing = clock_timing(result, clock)
    if timing is None:
        return fmt.DASH if result is None else result.status
    p50 = timing[0]
    return Md(f"{fmt.latency_us(p50)} µs<br>{ceilings.share(experiment, point, run, name, result, p50).rate}")


def _speedup(j: PointJudgement | None, between: str = " ") -> str:
    if j is None or j.speedup is None:
        return fmt.DASH
    return Md(f"{fmt.ratio(j.speedup.ratio)}{between}{fmt.interval(j.speedup.low, j.speedup.high)}")


def _card_points(judged: list[PointJudgement]) -> list[tuple[str, PointJudgement]]:
    if len(judged) <= CARD_POINTS:
        return [("", j) for j in judged]
    timed = [j for j in judged if j.speedup is not None]
    if not timed:
        return [("first", judged[0])]
    low = min(timed, key=lambda j: j.speedup.ratio)
    high = max(timed, key=lambda j: j.speedup.ratio)
    return [("lowest", low), ("highest", high)]


REASON_CHARS = 160  # of a peer's reason on the card; the page's table of declined profiles gives it whole


def _short_reason(text: str | None) -> str:
    """A record's reason cut at its first clause ("; ") and to REASON_CHARS."""
    first = (text or "no reason recorded").split("; ", 1)[0].strip()
    return first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 1].rstrip() + "…"


def absent_baselines(experiment: Experiment, runs: list[RunRecord]) -> Md | None:
    """The claim's baselines that timed no point in any of `runs` (a peer that did not import, or declined every
    case), named with the first point's status and reason: the card's verdicts are against the baselines that
    ran, and a claim that names a peer must not read as a win over it. None when every baseline ran."""
    if not runs:
        return None
    absent = []
    for name in experiment.claim.baselines:
        results = [p.results.get(name) for run in runs for p in run.points]
        if any(r is not None and r.status == "ok" for r in results):
            continue
        first = next((r for r in results if r is not None), None)
        if first is None:
            absent.append(compose("{} (in no point)", code(name)))
        else:
            absent.append(compose("{} ({}: {})", code(name), first.status, _short_reason(first.reason or first.error)))
    if not absent:
        return None
    return compose("**Not compared:** {} timed no point in the newest runs shown here, so the verdicts below are "
                   "against the baselines that ran.", Md("; ").join(absent))


def summary_card(evidence: Evidence, slug: str) -> dict:
    """Per GPU: the verdict on each clock and the run it rests on; per GPU, dtype, point shown and clock: the
    subject's and the best baseline's time and GB/s, the speedup with its interval and the point's word."""
    experiment = evidence.experiments[slug]
    subject = experiment.claim.subject
    claim_clock = experiment.claim.clock
    clocks = sorted(clocks_with_data(evidence, slug), key=lambda c: c != claim_clock)  # the claim's clock first
    gpus = []
    rows = {clock: [] for clock in clocks}  # the card's table holds the claim's clock; the other folds under it
    found = performance_verdicts(evidence, slug)
    several = len({d for _, v in found for d in dtypes_in(v.run)}) > 1
    for key, verdict in found:
        run = verdict.run
        judged = {}
        verdicts = []
        for clock in clocks:
            on_clock = clock_verdicts(evidence, slug, clock).get(key)
            margin = experiment.claim.margin_on(clock).fraction
            label = CLOCK_NAMES[clock] + (f" (the claim's clock, ±{margin:.1%})" if clock == claim_clock
                                          else f" (±{margin:.1%})")
            if on_clock is None or not on_clock.points:
                verdicts.append({"clock": CLOCK_NAMES[clock], "label": label, "badge": badges.verdict_badge(on_clock),
                                 "counts": "not measured in this run"})
                continue
            judged[clock] = on_clock.points
            verdicts.append({"clock": CLOCK_NAMES[clock], "label": label, "badge": badges.verdict_badge(on_clock),
                             "counts": word_counts(on_clock.points)})
        gpus.append({**run_ref(run, evidence.gpu_labels[key]), "verdicts": verdicts})
        points = {(p.case, p.dtype): p for p in run.points}
        for dtype in dtypes_in(run):
            for clock, judgements in judged.items():
                for which, j in _card_points([j for j in judgements if j.dtype == dtype]):
                    point = points[(j.case, j.dtype)]
                    base = point.results.get(j.baseline) if j.baseline else None
                    rows[clock].append({
                        "gpu": evidence.gpu_labels[key],
                        "where": (f"{which}: " if which else "") + j.case + (f" · {dtype}" if several else ""),
                        "subject": _time_and_rate(experiment, point, run, subject, clock),
                        "baseline": compose("{}<br>{}", code(j.baseline),
                                            _time_and_rate(experiment, point, run, j.baseline, clock))
                        if base else fmt.DASH,
                        "speedup": _speedup(j, "<br>"),
                        "word": badges.word(j.word, j.reason),
                    })
    other = next((c for c in clocks if c != claim_clock), None)
    return {"gpus": gpus, "rows": rows.get(claim_clock, []), "other_rows": rows[other] if other else [],
            "absent": absent_baselines(experiment, [v.run for _, v in found]),
            "clock": CLOCK_NAMES[claim_clock], "other_clock": CLOCK_NAMES[other] if other else None,
            "points_limit": CARD_POINTS}


def _share_of_roof(experiment: Experiment, point: Point, name: str, run: RunRecord, clock: str) -> ceilings.Share:
    """Profile `name`'s share of its roof on `clock` (lab.publish.ceilings); its status where it has no time."""
    result = point.results.get(name)
    timing = clock_timing(result, clock)
    if timing is None:
        return ceilings.Share(fmt.DASH, fmt.DASH if result is None else result.status)
    return ceilings.share(experiment, point, run, name, result, timing[0])


def _commit_note(runs: list[RunRecord], labels: dict[str, str], stale_files: set[str]) -> Md:
    """stale_files: the files the runs' verdicts found changed since (hashing's prose-only rule applied)."""
    named = Md("; ").join(compose("{} at {} ({} UTC)", labels[r.gpu_key],
                                  code(fmt.short_commit(r.git.get("commit"), r.git.get("dirty"))),
                                  fmt.utc_date(r.started_utc)) for r in runs)
    commits = {r.git.get("commit") for r in runs}
    if len(commits) == 1 and None not in commits:
        return compose("The newest runs are all at one commit: {}.", named)
    # A file whose versions differ between the runs in words alone (each run's the code of today's, so in no
    # verdict's changed files) is the same code.
    differ = sorted({path for a in runs for b in runs for path in changed_sources(a.hashes, b.hashes)
                     if path in stale_files})
    if not differ:
        return compose("The newest runs are at different commits ({}), with the same hashed sources: "
                       "they timed the same code.", named)
    files = Md(", ").join(code(p) for p in differ)
    return compose("The newest runs are at different commits ({}) and timed different code: {} "
                   "differ between them. Compare them with that in mind.", named, files)


def side_by_side(evidence: Evidence, slug: str, clock: str = GPU_TIME) -> dict:
    """Every GPU's newest run next to the others on `clock`: per dtype a speedup plot and one table, a row per
    point with each GPU's subject at its share of that GPU's own roof (the ceiling matching its traffic, or
    the matmul peak where compute-bound; lab.publish.ceilings), its speedup and its word."""
    experiment = evidence.experiments[slug]
    found = performance_verdicts(evidence, slug, clock)
    base = {"clock": clock, "clock_name": CLOCK_NAMES[clock], "gpus": [], "dtypes": [], "note": ""}
    if not found:
        return base
    runs = [v.run for _, v in found]
    dtypes = list(dict.fromkeys(d for run in runs for d in dtypes_in(run)))
    tables = []
    for dtype in dtypes:
        cases = list(dict.fromkeys(p.case for run in runs for p in run.points if p.dtype == dtype))
        rows, notes = [], []
        for case in cases:
            cells, short, x = [], False, ""
            for _, verdict in found:
                point = next((p for p in verdict.run.points if (p.case, p.dtype) == (case, dtype)), None)
                j = next((j for j in verdict.points if (j.case, j.dtype) == (case, dtype)), None)
                if point is None or j is None:
                    cells.append({"pct": fmt.DASH, "speedup": fmt.DASH, "word": fmt.DASH})
                    continue
                if experiment.x_axis and experiment.x_axis in point.shape:
                    x = f"{point.shape[experiment.x_axis]:,}"
                short = short or j.effect != MEETS
                got = _share_of_roof(experiment, point, experiment.claim.subject, verdict.run, clock)
                notes.append(ceilings.notes(experiment, verdict.run, [got], [point]))
                cells.append({"pct": got.pct, "speedup": _speedup(j), "word": badges.word(j.word, j.reason)})
            rows.append({"case": case, "x": x, "cells": cells, "short": short})
        tables.append({"dtype": dtype, "rows": rows, "short_rows": [r for r in rows if r["short"]],
                       "ceiling_note": " ".join(dict.fromkeys(n for n in notes if n)),
                       "plot": href(f"{PLOTS}/{speedup_plot_filename(slug, dtype, clock)}"), "long": len(rows) > 12})
    return {**base, "gpus": [evidence.gpu_labels[key] for key, _ in found], "dtypes": tables,
            "note": _commit_note(runs, evidence.gpu_labels, {path for _, v in found for path in v.changed})}


def sides(evidence: Evidence, slug: str) -> list[dict]:
    """side_by_side on every clock the records hold for `slug`."""
    return [side_by_side(evidence, slug, clock) for clock in clocks_with_data(evidence, slug)]


def speedup_series(evidence: Evidence, slug: str, clock: str = GPU_TIME):
    """What render_speedup_plot draws for `slug` on `clock`: (GPU label, colour, judgements, run) per GPU."""
    return [(evidence.gpu_labels[key], gpu_colour(evidence, key), v.points, v.run)
            for key, v in performance_verdicts(evidence, slug, clock)]


def _judged(experiment: Experiment, run: RunRecord, clock: str, newest: dict) -> tuple[str | None, tuple]:
    """What `run`'s own data says on `clock` under today's rule (the newest runs' verdicts are reused)."""
    if not run.is_performance_evidence:
        return NO_EVIDENCE, ()
    if clock == EAGER_CALL and run.eager is None:
        return None, ()
    if run.run_id in newest and newest[run.run_id].data_state is not None:
        return newest[run.run_id].data_state, newest[run.run_id].points
    state, points, _ = judge_run(experiment, run, clock)
    return state, points


def history(evidence: Evidence, slug: str, served: Collection[str]) -> dict:
    """Every run of `slug`, newest first, with the verdict its own data gives under today's rule on each clock;
    and per GPU and clock a strip of those verdicts, oldest to newest. A run in `served` (ids: the records the
    site serves, lab.publish.served) links its record; any other is named by its path in the repository."""
    experiment: Experiment = evidence.experiments[slug]
    clocks = [GPU_TIME] + ([EAGER_CALL] if any(r.eager is not None for r in evidence.runs[slug]) else [])
    newest_ids = {key: v.run.run_id for key, v in evidence.verdicts[slug].items() if v.run is not None}
    rows = []
    for run in evidence.runs[slug]:  # newest first
        if not run.is_performance_evidence:
            status = "CPU interpreter: not performance evidence"
        elif newest_ids.get(run.gpu_key) != run.run_id:
            status = "superseded"
        else:  # the newest run's verdict already says whether it is stale
            status = f"newest, {STALE.lower()}" if evidence.verdicts[slug][run.gpu_key].changed else "newest, fresh"
        states = []
        for clock in clocks:
            newest = {v.run.run_id: v for v in clock_verdicts(evidence, slug, clock).values() if v.run is not None}
            state, points = _judged(experiment, run, clock, newest)
            counts = word_counts(points) or fmt.DASH
            states.append({"clock": clock, "state": state, "counts": counts,
                           "badge": badges.badge(state, f"{run.run_id}: {counts}") if state else fmt.DASH})
        host = fmt.host_label(run.environment.get("host"))  # runs from several hosts of one model, told apart
        label = evidence.gpu_labels[run.gpu_key] + (f" on {host}" if host else "")
        ref = run_ref(run, label)
        if run.run_id not in served:
            ref["link"] = None
        rows.append({**ref, "path": record_path(run), "gpu_key": run.gpu_key, "states": states,
                     "status": status, "points": len(run.points)})
    strips = []
    for key in sorted({r["gpu_key"] for r in rows}):
        mine = [r for r in reversed(rows) if r["gpu_key"] == key]
        for i, clock in enumerate(clocks):
            ticks = [badges.tick(r["states"][i]["state"], r["link"],
                                 f"{r['date']} UTC · commit {r['commit']} · {CLOCK_NAMES[clock]}: "
                                 f"{r['states'][i]['state']} · {r['states'][i]['counts']}")
                     for r in mine if r["states"][i]["state"]]
            if ticks:
                strips.append({"gpu": evidence.gpu_labels[key], "clock": CLOCK_NAMES[clock], "runs": len(ticks),
                               "html": Md(f'<span class="kl-strip">{"".join(ticks)}</span>')})
    return {"rows": rows, "strips": strips, "clocks": [CLOCK_NAMES[c] for c in clocks],
            "unlinked": sum(r["link"] is None for r in rows)}
