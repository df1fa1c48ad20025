"""Rendering: declared experiments + run records -> Markdown pages, snippets and SVG plots under docs/.

`collect_evidence` loads and judges everything; `render_outputs` turns it into a mapping of docs-relative
paths to file contents (pure: no files touched, so tests compare it with golden files); `write_outputs`
(lab.publish.output) writes what changed and removes the generated files that are no longer produced.
Everything is iterated in sorted order and the only dates on a page come from records, so unchanged records
re-render byte for byte.

Links: pages under docs/experiments/ and docs/decisions/ link relatively (../records/<slug>/<id>.json.gz: the
site's hook publishes every record a page links). Only the records the pages' numbers come from, and those a
hand-written page cites, are linked (lab.publish.served); the history names every other run by its path in
the repository. Snippets under docs/generated/ are included into pages elsewhere, so their
links are written from the docs root (/experiments/<slug>.md), which MkDocs resolves for the including
page when `validation.links.absolute_links` is `relative_to_docs`.

Escaping: the templates render with `finalize=md` (lab.publish.escape), so every `{{ value }}` is escaped for
Markdown unless it is already safe (an Md or Markup: the project's own text, a badge, a code span, a link).
Filters: `cell` (a table cell), `indent4` (inside an admonition), `code` (an inline code span of any text),
`code_block(language)` (a fenced block), `href` (a link target), `e`/`escape` (the same escaping as every
value gets), `safe` (trusted text, by hand: a macro's output, which was escaped inside it).
"""

from __future__ import annotations

from typing import Iterable

import jinja2

from lab.evidence.checks import IDENTIFIER, IDENTIFIER_TEXT
from lab.evidence.verdict import DECISION_RULE, RULE_TEXT
from lab.publish import badges, escape
from lab.publish import formatting as fmt
from lab.publish.clocks import margins_text
from lab.publish.collect import Evidence, dtypes_in
from lab.publish.breakdown import breakdown_filename, has_breakdown, render_breakdown_plot
from lab.publish.profiled import profiled_run
from lab.publish.roofline import render_roofline_plot, roofline_filename, roofline_points
from lab.publish.notebook import Round, rounds_by_page
from lab.publish.indexes import (
    decision_context,
    environment_rows,
    index_rows,
    standing,
    summary_rows,
)
from lab.publish.output import WriteReport, lost_evidence, write_outputs  # noqa: F401 - the render's way out
from lab.publish.overview import clocks_with_data, performance_verdicts, speedup_series
from lab.publish.plots import plot_filename, render_plot, render_speedup_plot, speedup_plot_filename
from lab.publish.served import served_runs
from lab.publish.views import GENERATED_HEADER, PLOTS_DIR, REFRESH_COMMAND, experiment_page_context


def _jinja() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("lab.publish", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # HTML escaping would not stop Markdown; `finalize` escapes for Markdown instead
        finalize=escape.md,
    )
    for name in ("cell", "indent4", "code", "code_block", "href"):
        env.filters[name] = getattr(escape, name)
    env.filters["e"] = env.filters["escape"] = escape.md
    env.filters["plural"] = fmt.plural
    return env


def render_outputs(evidence: Evidence, cited: Iterable[str] = (), rounds: Iterable[Round] = ()) -> dict[str, str]:
    """Every generated file, as docs-relative path -> content (SVG plots included). `cited`: the ids of runs
    that hand-written pages cite (lab.publish.figures.cited_runs), whose records the site serves besides
    those the pages' numbers come from (lab.publish.served). `rounds`: the lab notebook's rounds that have a
    page (lab.publish.notebook); each experiment and decision page lists those that fed it."""
    for slug in (*evidence.experiments, *(d.slug for d in evidence.decisions)):
        if not IDENTIFIER.fullmatch(slug):  # declared slugs name files and links, as record names do
            raise ValueError(f"declared slug {slug!r} is not a name of {IDENTIFIER_TEXT}")
    env = _jinja()
    served = served_runs(evidence, cited)
    fed = rounds_by_page(list(rounds))
    legend = env.get_template("snippet_legend.md.j2").render(header=GENERATED_HEADER, legend=badges.legend_rows())
    out: dict[str, str] = {"generated/legend.md": legend}
    out["experiments/index.md"] = env.get_template("experiments_index.md.j2").render(
        header=GENERATED_HEADER, rows=index_rows(evidence, ""), any_runs=any(evidence.runs.values()),
        any_gpu=bool(evidence.evidence_gpus),
        refresh=REFRESH_COMMAND, legend=escape.Md(legend.split("\n", 2)[2].strip()),
    )
    for slug, experiment in evidence.experiments.items():
        page = {**experiment_page_context(evidence, slug, served), "rounds": fed.get(f"experiments/{slug}.md", [])}
        out[f"experiments/{slug}.md"] = env.get_template("experiment.md.j2").render(**page)
        if page["paged"]:  # the long per-point tables, on a page of their own for each GPU and clock
            for section in page["sections"]:
                one = {**page, "points_view": True, "sections": [section]}
                out[f"points/{slug}--{section['key']}.md"] = env.get_template("experiment.md.j2").render(**one)
                if section["eager"] and section["eager"]["measured"]:
                    out[f"points/{slug}--{section['key']}--eager-call.md"] = env.get_template(
                        "points_eager.md.j2").render(**one)
        for key, verdict in evidence.verdicts[slug].items():
            for dtype in dtypes_in(verdict.run):
                out[f"{PLOTS_DIR}/{plot_filename(slug, key, dtype)}"] = render_plot(
                    experiment, verdict.run, dtype, evidence.gpu_labels.get(key, key))
                if has_breakdown(verdict.run, dtype):
                    out[f"{PLOTS_DIR}/{breakdown_filename(slug, key, dtype)}"] = render_breakdown_plot(
                        experiment, verdict.run, dtype, evidence.gpu_labels.get(key, key))
        for key, verdict in evidence.verdicts[slug].items():
            profiled = profiled_run(evidence.runs[slug], verdict.run)  # the judged run's, or an earlier one's
            if roofline_points(experiment, profiled)[0]:
                label = evidence.gpu_labels.get(key, key)
                if profiled is not verdict.run:
                    label += f", older run {fmt.short_run_id(profiled.run_id)}"
                out[f"{PLOTS_DIR}/{roofline_filename(slug, key)}"] = render_roofline_plot(experiment, profiled, label)
        for clock in clocks_with_data(evidence, slug):
            series = speedup_series(evidence, slug, clock)
            for dtype in dict.fromkeys(d for _, v in performance_verdicts(evidence, slug, clock)
                                       for d in dtypes_in(v.run)):
                out[f"{PLOTS_DIR}/{speedup_plot_filename(slug, dtype, clock)}"] = render_speedup_plot(
                    experiment, dtype, series, clock)
        out[f"generated/{slug}.md"] = env.get_template("snippet_experiment.md.j2").render(
            header=GENERATED_HEADER, e=escape.declared(experiment), link=escape.href(f"/experiments/{slug}.md"),
            badges=[{"gpu": evidence.gpu_labels[k], "badge": standing(experiment, v, with_range=False)}
                    for k, v in evidence.claim_verdicts(slug).items() if v.run.is_performance_evidence],
            no_evidence=badges.verdict_badge(None), rows=summary_rows(evidence, slug),
            refresh=f"{REFRESH_COMMAND} {slug}", margins=margins_text(experiment),
        )
    decision_pages = []
    for decision in evidence.decisions:
        context = decision_context(evidence, decision, "../experiments/")
        out[f"decisions/{decision.slug}.md"] = env.get_template("decision.md.j2").render(
            header=GENERATED_HEADER, refresh=REFRESH_COMMAND, rounds=fed.get(f"decisions/{decision.slug}.md", []),
            **context)
        decision_pages.append(context)
    out["decisions/index.md"] = env.get_template("decisions_index.md.j2").render(
        header=GENERATED_HEADER, decisions=decision_pages, rule=escape.declared(DECISION_RULE))
    out["generated/verdicts.md"] = env.get_template("snippet_verdicts.md.j2").render(
        header=GENERATED_HEADER, any_gpu=bool(evidence.evidence_gpus), rows=index_rows(evidence, "/experiments/"),
        refresh=REFRESH_COMMAND)
    out["generated/environment.md"] = env.get_template("snippet_environment.md.j2").render(
        header=GENERATED_HEADER, rows=environment_rows(evidence), refresh=REFRESH_COMMAND)
    out["generated/rule.md"] = "\n\n".join((GENERATED_HEADER, *RULE_TEXT, DECISION_RULE)) + "\n"
    return dict(sorted(out.items()))
