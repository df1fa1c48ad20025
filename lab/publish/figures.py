"""Checked figures: measured numbers and claims in hand-written pages, taken from or checked against the records.

A write-up never types a measured figure. It writes a call the site's hook (tools/mkdocs_hooks.py) expands at
build time from the same verdicts the evidence pages show (lab.evidence.verdict, through lab.publish.collect):

    {{ fig("rmsnorm-linear-decode", gpu="H100", case="m1-n4096-k4096", dtype="bfloat16", what="speedup") }}
        -> "1.23": the number from the newest run on that GPU
    {{ claim("rmsnorm-linear-decode", gpu="*", case="m1-*", every="Faster", text="faster at every one-token shape") }}
        -> "faster at every one-token shape", if the newest run on every GPU says so, else the build fails

Arguments are Python literals, keywords after the slug:

* `gpu`: a GPU key (nvidia-h100-80gb-hbm3) or its label (H100); "*" (the default for claim) means every GPU
  with a performance run, each of which must hold the claim. fig needs one GPU.
* `run`: a run id or its leading part (20261123T222307Z): that run, judged by the same rule, instead of the
  newest run on each GPU; it must name exactly one run.
* `case`: fnmatch patterns joined by "|" ("m1-*|m16-*"); `dtype` likewise ("bfloat16|float16"); `clock`: "gpu-time"
  (default) or "eager-call". A selection that matches no point is an error, never a vacuous truth.
* fig `what`: "speedup" (the point's speedup over its best correct baseline), "low" / "high" (its 95% bounds),
  "word" (Faster, Level, ...), "ms" (the median of `profile` on that clock), "tflops" (the point's FLOP count
  over that median), "peak" (those TFLOP/s as a percentage of the bf16 matmul peak measured in the same run),
  "pct" (`profile`'s share of the copy ceiling, in percent); `digits` sets the decimals (2 by default, 3 for
  ms, 0 for tflops, peak and pct). Over any number
  of points: "count" (how many selected points have one of the `words`, joined by "|") and "points" (how many
  are selected).
* claim quantifiers, each a word or words joined by "|" (lab.evidence.verdict.WORDS): `every` (every selected
  point has one of them), `some` (at least one point has), `none` (no point has); `verdict` (the experiment's
  state on the GPU: Supported, Rejected, ...). `text` is what the claim renders as (nothing without it).

`expand` returns the page with every call replaced, or raises FigureError listing each failing call as
"<page>:<line>: <why>", so a post whose figure no longer holds cannot be published.

A figure or claim text taken from a newest run that is Stale (the code it measured has changed since, so the
experiment page marks it Stale) is followed by a small "earlier code" mark linking to that page's history,
its title naming the run: the number stays true of its run, and the reader sees it is not of today's code.
A call that names its run (`run=`) cites that run on purpose and carries no mark.
"""

from __future__ import annotations

import ast
import fnmatch
import html
import posixpath
import re
from dataclasses import dataclass
from typing import Iterable

from lab.evidence.verdict import CLOCKS, GPU_TIME, STALE, STATES, WORDS, Verdict, clock_timing, verdict_for_gpu
from lab.publish.collect import Evidence
from lab.publish.overview import performance_verdicts

CALL = re.compile(r"\{\{\s*(fig|claim)\((.*?)\)\s*\}\}", re.DOTALL)
OPENING = re.compile(r"\{\{\s*(?:fig|claim)\(")  # a call's start: one that CALL does not complete is an error
FIG_WHATS = ("speedup", "low", "high", "word", "ms", "tflops", "peak", "pct", "count", "points")
QUANTIFIERS = ("every", "some", "none")
ALL = "*"


class FigureError(Exception):
    """One or more calls on a page that cannot be expanded; the message names page and line of each."""


class _Refused(Exception):
    """One call's problem, before the page and line are attached."""


@dataclass(frozen=True)
class Call:
    """One `{{ fig(...) }}` or `{{ claim(...) }}` in a page: where it is, its name and arguments."""

    name: str
    slug: str
    kwargs: dict
    line: int
    start: int
    end: int


def parse_calls(markdown: str, source: str, first_line: int = 1) -> list[Call]:
    """Every call in `markdown`, in order; a call that does not parse raises FigureError naming its line.
    `first_line` is the line of the page file that `markdown` starts on (after a front matter block)."""
    calls, errors = [], []
    for match in CALL.finditer(markdown):
        line = markdown.count("\n", 0, match.start()) + first_line
        try:
            slug, kwargs = _arguments(match.group(2))
        except _Refused as exc:
            errors.append(f"{source}:{line}: {match.group(1)}(...): {exc}")
            continue
        calls.append(Call(match.group(1), slug, kwargs, line, match.start(), match.end()))
    complete = {match.start() for match in CALL.finditer(markdown)}
    for opening in OPENING.finditer(markdown):
        if opening.start() not in complete:
            line = markdown.count("\n", 0, opening.start()) + first_line
            errors.append(f"{source}:{line}: a call opened here is not closed with ') }}}}'")
    if errors:
        raise FigureError("\n".join(sorted(errors, key=_line_of)))
    return calls


def _line_of(message: str) -> int:
    return int(message.split(":")[1])


def _arguments(text: str) -> tuple[str, dict]:
    try:
        node = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError as exc:
        raise _Refused(f"does not parse ({exc.msg})") from None
    if len(node.args) != 1 or any(k.arg is None for k in node.keywords):
        raise _Refused("takes the experiment's slug first, then keyword arguments")
    try:
        slug = ast.literal_eval(node.args[0])
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
        raise _Refused("arguments must be literals (strings, numbers)") from None
    if not isinstance(slug, str):
        raise _Refused("the experiment's slug must be a string")
    return slug, kwargs


def expand(markdown: str, evidence: Evidence, source: str, first_line: int = 1) -> str:
    """`markdown` with every call replaced by its figure or text; FigureError lists every call that fails."""
    calls = parse_calls(markdown, source, first_line)
    pieces, errors, at = [], [], 0
    for call in calls:
        try:
            used: list[Verdict] = []
            value = figure(call, evidence, used) if call.name == "fig" else check_claim(call, evidence, used)
            if value:
                value += stale_mark(call, used, source)
        except _Refused as exc:
            errors.append(f"{source}:{call.line}: {call.name}({call.slug!r}): {exc}")
            value = ""
        pieces += [markdown[at:call.start], value]
        at = call.end
    if errors:
        raise FigureError("\n".join(errors))
    return "".join(pieces) + markdown[at:]


def stale_mark(call: Call, used: Iterable[Verdict], source: str) -> str:
    """The "earlier code" mark for a call whose newest run on some GPU it read (`used`) is Stale; "" otherwise."""
    if "run" in call.kwargs:
        return ""
    stale = sorted(v.run.run_id for v in used if v.state == STALE)
    if not stale:
        return ""
    # source: "docs/<page>"; the experiment page is docs/experiments/<slug>.md (the slug is a declared one)
    page_dir = posixpath.dirname(source.split("/", 1)[1]) if "/" in source else ""
    target = posixpath.relpath(f"experiments/{call.slug}.md", page_dir or ".")
    title = html.escape(f"From run {', '.join(stale)}: measured before the code it tests last changed "
                        "(the experiment page marks it Stale).", quote=True)
    return f'<sup class="kl-stale" title="{title}">[earlier code]({target}#history)</sup>'


def check_pages(pages: Iterable[tuple[str, str]], evidence: Evidence) -> list[str]:
    """Every failing call in (source, whole file text) pairs, one "<page>:<line>: <why>" per call."""
    problems = []
    for source, markdown in pages:
        try:
            expand(markdown, evidence, source)
        except FigureError as exc:
            problems += str(exc).splitlines()
    return problems


def cited_runs(pages: Iterable[str], evidence: Evidence) -> set[str]:
    """The ids of the runs that calls in `pages` (Markdown texts) name by `run=`, each matched as the figures
    match it (exactly one run of the experiment starts with the given id). A page whose calls do not parse,
    or a call naming no run or several, cites nothing here: expanding that page fails the build anyway."""
    cited = set()
    for markdown in pages:
        if not OPENING.search(markdown):
            continue
        try:
            calls = parse_calls(markdown, "")
        except FigureError:
            continue
        for call in calls:
            if "run" in call.kwargs:
                wanted = str(call.kwargs["run"])
                runs = [r.run_id for r in evidence.runs.get(call.slug, []) if r.run_id.startswith(wanted)]
                if len(runs) == 1:
                    cited.add(runs[0])
    return cited


def first_line_of(body: str, whole: str) -> int:
    """The line of the file text `whole` on which `body` (its Markdown after the front matter) starts."""
    at = whole.find(body[:500]) if body.strip() else -1
    return whole.count("\n", 0, at) + 1 if at >= 0 else 1


# --------------------------------------------------------------------------------------------------------
# Selection: which verdicts and points a call speaks of
# --------------------------------------------------------------------------------------------------------


def _allowed(kwargs: dict, names: Iterable[str]) -> None:
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise _Refused(f"unknown argument {', '.join(unknown)} (takes {', '.join(names)})")


def _verdicts(call: Call, evidence: Evidence, default_gpu: str | None, used: list | None = None) -> list[Verdict]:
    """The verdicts the call reads, also appended to `used` when given."""
    found = _select_verdicts(call, evidence, default_gpu)
    if used is not None:
        used += found
    return found


def _select_verdicts(call: Call, evidence: Evidence, default_gpu: str | None) -> list[Verdict]:
    if call.slug not in evidence.experiments:
        raise _Refused("no experiment has this slug")
    clock = call.kwargs.get("clock", GPU_TIME)
    if clock not in CLOCKS:
        raise _Refused(f"clock {clock!r} is not one of {', '.join(CLOCKS)}")
    if "run" in call.kwargs:
        return [_older_run(call, evidence, clock)]
    # the verdicts the evidence pages show on that clock (lab.publish.overview), so figures follow the pages
    judged = {key: v for key, v in performance_verdicts(evidence, call.slug, clock) if v.points}
    gpu = call.kwargs.get("gpu", default_gpu)
    if gpu is None:
        raise _Refused("needs gpu= (a GPU key or label)")
    if gpu == ALL:
        if not judged:
            raise _Refused(f"no GPU has a judged run on the {clock} clock")
        return [judged[key] for key in sorted(judged)]
    labels = evidence.gpu_labels
    keys = [key for key in judged if gpu in (key, labels.get(key)) or gpu.lower() == labels.get(key, "").lower()]
    if not keys:
        known = ", ".join(f"{k} ({labels.get(k, k)})" for k in sorted(judged)) or "none"
        raise _Refused(f"no judged run on GPU {gpu!r} on the {clock} clock (GPUs with one: {known})")
    return [judged[keys[0]]]


def _older_run(call: Call, evidence: Evidence, clock: str) -> Verdict:
    """The named run of the experiment, judged on `clock` as if it were the newest on its GPU."""
    wanted = str(call.kwargs["run"])
    runs = [r for r in evidence.runs.get(call.slug, []) if r.run_id.startswith(wanted)]
    if len(runs) != 1:
        raise _Refused(f"run {wanted!r} names {len(runs)} runs of this experiment, not one")
    verdict = verdict_for_gpu(evidence.experiments[call.slug], runs, evidence.current_hashes.get(call.slug, {}),
                              runs[0].gpu_key, clock)
    if not verdict.points:
        raise _Refused(f"run {runs[0].run_id} has no judged points on the {clock} clock: {verdict.summary}")
    return verdict


def _points(call: Call, verdict: Verdict) -> list:
    cases = str(call.kwargs.get("case", ALL)).split("|")
    dtype = call.kwargs.get("dtype", ALL)
    dtypes = str(dtype).split("|")
    chosen = [p for p in verdict.points if any(fnmatch.fnmatchcase(p.case, c) for c in cases)
              and any(fnmatch.fnmatchcase(p.dtype, d) for d in dtypes)]
    if not chosen:
        raise _Refused(f"case {call.kwargs.get('case', ALL)!r}, dtype {dtype!r} match no point of run "
                       f"{verdict.run.run_id}")
    return chosen


def _words(text: object, what: str) -> set[str]:
    words = set(str(text).split("|"))
    unknown = sorted(words - set(WORDS))
    if unknown:
        raise _Refused(f"{what}: {', '.join(unknown)} is not a point's word ({', '.join(WORDS)})")
    return words


# --------------------------------------------------------------------------------------------------------
# fig: one number (or word) at one point
# --------------------------------------------------------------------------------------------------------


def figure(call: Call, evidence: Evidence, used: list | None = None) -> str:
    """The figure a `fig` call names, formatted (the verdict it read appended to `used`)."""
    _allowed(call.kwargs, ("gpu", "run", "case", "dtype", "clock", "what", "profile", "digits", "words"))
    (verdict,) = _verdicts(call, evidence, None if "run" not in call.kwargs else ALL, used)
    points = _points(call, verdict)
    what = call.kwargs.get("what", "speedup")
    if what == "points":
        return f"{len(points):,}"
    if what == "count":
        words = _words(call.kwargs.get("words", ""), "words")
        return f"{sum(p.word in words for p in points):,}"
    if len(points) != 1:
        names = ", ".join(f"{p.case} ({p.dtype})" for p in points[:4])
        raise _Refused(f"names {len(points)} points ({names}...): give case= and dtype= for one")
    judged = points[0]
    if what not in FIG_WHATS:
        raise _Refused(f"what={what!r} is not one of {', '.join(FIG_WHATS)}")
    digits = int(call.kwargs.get("digits", {"ms": 3, "tflops": 0, "peak": 0, "pct": 0}.get(what, 2)))
    if what == "word":
        return judged.word
    if what in ("speedup", "low", "high"):
        if judged.speedup is None:
            raise _Refused(f"{judged.case} ({judged.dtype}) has no speedup: {judged.reason}")
        value = {"speedup": judged.speedup.ratio, "low": judged.speedup.low, "high": judged.speedup.high}[what]
        return f"{value:.{digits}f}"
    profile = call.kwargs.get("profile")
    point = next(p for p in verdict.run.points if p.case == judged.case and p.dtype == judged.dtype)
    if profile not in point.results:
        raise _Refused(f"what={what!r} needs profile= one of {', '.join(sorted(point.results))}")
    result = point.results[profile]
    if what in ("ms", "tflops", "peak"):
        timing = clock_timing(result, call.kwargs.get("clock", GPU_TIME))
        if timing is None:
            raise _Refused(f"{profile} has no time at {judged.case} ({judged.dtype}): {result.status}")
        if what == "ms":
            return f"{timing[0]:.{digits}f}"
        if not point.flops:
            raise _Refused(f"{judged.case} ({judged.dtype}) has no FLOP count")
        tflops = point.flops / (timing[0] * 1e-3) / 1e12
        if what == "tflops":
            return f"{tflops:.{digits}f}"
        if verdict.run.matmul_peak is None:
            raise _Refused(f"run {verdict.run.run_id} measured no matmul peak")
        return f"{100 * tflops / verdict.run.matmul_peak.tflops:.{digits}f}"
    if result.pct_of_ceiling is None:
        raise _Refused(f"{profile} has no share of the copy ceiling at {judged.case} ({judged.dtype})")
    return f"{result.pct_of_ceiling:.{digits}f}"


# --------------------------------------------------------------------------------------------------------
# claim: a sentence about verdict words or states, checked
# --------------------------------------------------------------------------------------------------------


def check_claim(call: Call, evidence: Evidence, used: list | None = None) -> str:
    """`text` if the claim holds on every selected GPU; _Refused saying where it fails otherwise (the verdicts
    it read appended to `used`)."""
    _allowed(call.kwargs, ("gpu", "run", "case", "dtype", "clock", "text", "verdict", *QUANTIFIERS))
    tests = [q for q in (*QUANTIFIERS, "verdict") if q in call.kwargs]
    if not tests:
        raise _Refused(f"states nothing to check: give one of {', '.join(QUANTIFIERS)} or verdict=")
    for verdict in _verdicts(call, evidence, ALL, used):
        where = f"{evidence.gpu_labels.get(verdict.gpu_key, verdict.gpu_key)} run {verdict.run.run_id}"
        if "verdict" in call.kwargs:
            states = set(str(call.kwargs["verdict"]).split("|"))
            if states - set(STATES):
                raise _Refused(f"verdict: {', '.join(sorted(states - set(STATES)))} is not a state")
            if verdict.state not in states:
                raise _Refused(f"says {verdict.state}, not {call.kwargs['verdict']}, on {where}")
        if not any(q in call.kwargs for q in QUANTIFIERS):
            continue
        points = _points(call, verdict)
        for quantifier in QUANTIFIERS:
            if quantifier not in call.kwargs:
                continue
            words = _words(call.kwargs[quantifier], quantifier)
            hits = [p for p in points if p.word in words]
            misses = [p for p in points if p.word not in words]
            wrong = {"every": misses, "none": hits, "some": [] if hits else points}[quantifier]
            if wrong:
                shown = ", ".join(f"{p.case} ({p.dtype}) {p.word}" for p in wrong[:3])
                more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
                raise _Refused(f"{quantifier}={call.kwargs[quantifier]!r} does not hold on {where}: {shown}{more}")
    return str(call.kwargs.get("text", ""))
