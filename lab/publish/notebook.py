"""The lab notebook: one page a probe round under docs/probes/, rendered from probes/rounds.toml (the round's
question, what was kept and dropped and why, the page it fed), the round's raw outputs under notes/probes/ (every
number on the page) and the notes' heading the round's full prose lies under.

Raw outputs are untrusted text like records: an output that is not a JSON object (or a text file) of bounded
size, or whose rows carry a number that is not finite, is skipped and named; a round left with no valid
output gets no page. Every string from an output reaches the page through lab.publish.escape.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import tomllib
from dataclasses import dataclass
from pathlib import Path

from lab.publish.escape import cell, code, code_block, href, md
from lab.publish.views import GENERATED_HEADER

FOLDER = "probes"
INDEX = "probes/rounds.toml"
MAX_BYTES = 8 << 20
HEADER = GENERATED_HEADER
_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
FIELDS = ("id", "title", "probe", "outputs", "notes", "heading", "kind", "question", "kept", "dropped", "why", "fed")
OPTIONAL = ("commit", "clock", "gpu")  # from the notes, where the output's own field is missing or wrong
KINDS = {"tuning": "A tuning probe: its figures chose settings; they are not evidence. The site's evidence is "
                   "the run records on the page this round fed.",
         "check": "A GPU check of correctness and timing: a reading taken once, not evidence.",
         "compile": "Compiled without a GPU: no timing at all.",
         "host": "Host time per call: a reading of the CPU side, not evidence."}
NAME_KEYS = ("variant", "impl", "candidate", "provider")
METRICS = (("pct", "% of the copy ceiling"), ("tflops", "TFLOP/s"), ("us", "µs"), ("ms", "ms"),
           ("host_us", "µs of host time"), ("gpu_us", "µs of GPU time"))


@dataclass
class Round:
    id: str
    title: str
    probe: str
    outputs: list
    notes: str
    heading: str
    kind: str
    question: str
    kept: str
    dropped: str
    why: str
    fed: str
    commit: str = ""
    clock: str = ""
    gpu: str = ""


def _rows(data: dict) -> list[tuple[str, list[dict]]]:
    """(key, rows) of each list of objects at the top of an output."""
    return [(k, v) for k, v in data.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]


def _check_number(value, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")


def load_output(root: Path, rel: str):
    """The parsed output at `rel` (a dict, or a str for a text file); ValueError naming what is wrong."""
    if not rel.startswith("notes/probes/") or ".." in rel.split("/"):
        raise ValueError("expected a file under notes/probes/")
    path = root / rel
    if not path.is_file() or path.stat().st_size > MAX_BYTES:
        raise ValueError(f"expected a file of at most {MAX_BYTES} bytes")
    if rel.endswith(".gz"):  # large outputs are kept compressed; read no more than MAX_BYTES of their text
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise ValueError(f"expected a gzip-compressed file ({exc})") from None
        if len(raw) > MAX_BYTES:
            raise ValueError(f"expected at most {MAX_BYTES} bytes once decompressed")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("expected UTF-8 text once decompressed") from None
        rel = rel[:-3]
    else:
        text = path.read_text(encoding="utf-8")
    if rel.endswith(".txt"):
        return text
    data = json.loads(text, parse_constant=lambda c: float(c))
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    for key, rows in _rows(data):
        for i, row in enumerate(rows):
            for k, v in row.items():
                _check_number(v, f"{key}[{i}].{k}")
    return data


def _scalars(data: dict, prefix: str = "", depth: int = 0):
    for k, v in data.items():
        if isinstance(v, dict) and depth < 3:
            yield from _scalars(v, f"{prefix}{k} / ", depth + 1)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            _check_number(v, prefix + k)
            yield prefix + k, v


def _fmt(v) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"


def _is_number(v) -> bool:
    """A finite number (a nested result's values are not checked on loading: a non-finite one is no timing)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _wide_results(rows: list[dict]) -> list[tuple[str, dict]]:
    """(candidate, result) of rows that hold one object a candidate ({"plan": {"us": ...}, "cudnn": {...}}):
    every object value of a row that has a metric or an error."""
    return [(str(k), v) for r in rows for k, v in r.items() if isinstance(v, dict)
            and ("error" in v or any(_is_number(v.get(m)) for m, _ in METRICS))]


def _candidates_table(rows: list[dict]) -> list[str]:
    name_key = next((k for k in NAME_KEYS if any(k in r for r in rows)), None)
    metric = next(((k, label) for k, label in METRICS if any(_is_number(r.get(k)) for r in rows)), None)
    results = [(str(r.get(name_key, "?")), r) for r in rows] if name_key is not None and metric is not None else []
    if not results:  # one object a candidate in each row instead of one row a candidate
        results = _wide_results(rows)
        metric = next(((k, label) for k, label in METRICS if any(_is_number(v.get(k)) for _, v in results)), None)
    if not results or metric is None:
        return [f"{len(rows)} rows; no candidate names or timings to summarise."]
    key, label = metric
    by: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for name, r in results:
        if _is_number(r.get(key)):
            by.setdefault(name, []).append(float(r[key]))
        elif "error" in r:
            failed[name] = failed.get(name, 0) + 1
    out = [f"| candidate | shapes timed | median {label} | min | max | failed |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in sorted(set(by) | set(failed)):
        v = by.get(name, [])
        nums = [_fmt(statistics.median(v)), _fmt(min(v)), _fmt(max(v))] if v else ["–"] * 3
        out.append(f"| {cell(code(name))} | {len(v)} | " + " | ".join(nums) + f" | {failed.get(name, 0)} |")
    return out


def _meta(data: dict, key: str, *alternatives: str):
    for k in (key, *alternatives):
        if isinstance(data.get(k), (str, int, float)) and not isinstance(data.get(k), bool):
            return data[k]
    return None


def render_round(r: Round, outputs: dict[str, object]) -> str:
    """One round's page."""
    lines = [HEADER, "", md(r.title).join(["# ", ""]), "", f"**The question.** {md(r.question)}", ""]
    lines += [f'!!! warning "{md(r.kind.capitalize())}, not evidence"', "", "    " + KINDS[r.kind], ""]
    lines += ["| | |", "| --- | --- |", f"| probe | {cell(code(r.probe) if r.probe else 'not kept in the repository')} |",
              f"| kept | {cell(r.kept)} |", f"| dropped | {cell(r.dropped)} |", f"| why | {cell(r.why)} |",
              f"| commit (from the notes) | {cell(code(r.commit) if r.commit else 'not named')} |",
              f"| the full notes | {cell(code(r.notes))}, section {cell(r.heading)} |",
              f"| fed | [{md(r.fed)}]({href('../' + r.fed)}) |", ""]
    for rel, data in outputs.items():
        lines += [f"## {md(rel.rsplit('/', 1)[-1])}", ""]
        if isinstance(data, str):
            lines += [f"{len(data.splitlines())} lines of compiler output; the first 40:", "",
                      code_block("\n".join(data.splitlines()[:40])), ""]
            continue
        gpu = _meta(data, "gpu", "device", "where")
        facts = [("GPU", gpu if gpu is not None else r.gpu or "not stated"), ("torch", _meta(data, "torch")),
                 ("Triton", _meta(data, "triton")), ("clock", r.clock or _meta(data, "timing", "clock")),
                 ("copy ceiling, GB/s", _meta(data, "copy_ceiling_gbs", "copy_ceiling_gbps")),
                 ("commit", _meta(data, "commit")), ("schema version", _meta(data, "schema_version")),
                 ("wall time, s", _meta(data, "wall_s", "seconds", "elapsed_s"))]
        lines += ["| | |", "| --- | --- |"]
        lines += [f"| {k} | {cell(_fmt(v) if isinstance(v, (int, float)) else v if v is not None else 'not recorded')} |"
                  for k, v in facts]
        lines.append("")
        tables = _rows(data)
        for key, rows in tables:
            lines += [f"### {md(key)}", "", *_candidates_table(rows), ""]
        if not tables:
            scalars = list(_scalars({k: v for k, v in data.items() if k not in ("sms",)}))[:60]
            lines += ["| reading | value |", "| --- | ---: |"]
            lines += [f"| {cell(k)} | {_fmt(v)} |" for k, v in scalars]
            lines.append("")
    return "\n".join(str(x) for x in lines).rstrip("\n") + "\n"


def load_rounds(root: Path) -> tuple[list[Round], list[str]]:
    """The rounds of probes/rounds.toml, and a problem line for each entry that is not well formed."""
    problems, rounds = [], []
    entries = tomllib.loads((root / INDEX).read_text(encoding="utf-8")).get("round", [])
    for i, entry in enumerate(entries):
        where = f"{INDEX}: round[{i}]"
        try:
            missing = [f for f in FIELDS if f not in entry]
            if missing or not all(isinstance(entry[f], list if f == "outputs" else str) for f in FIELDS):
                raise ValueError(f"expected the string fields {', '.join(FIELDS)} (outputs: a list)")
            if not _ID.fullmatch(entry["id"]) or entry["kind"] not in KINDS:
                raise ValueError(f"id {entry['id']!r} or kind {entry['kind']!r} not accepted")
            notes = root / entry["notes"]
            if not entry["notes"].startswith("notes/") or not notes.is_file() or \
                    f"## {entry['heading']}" not in notes.read_text(encoding="utf-8").splitlines():
                raise ValueError(f"heading {entry['heading']!r} not found in {entry['notes']}")
            if not all(isinstance(entry.get(f, ""), str) for f in OPTIONAL):
                raise ValueError(f"{', '.join(OPTIONAL)}: expected strings")
            rounds.append(Round(**{f: entry[f] for f in FIELDS}, **{f: entry.get(f, "") for f in OPTIONAL}))
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    return rounds, problems


def rounds_by_page(rounds: list[Round]) -> dict[str, list[dict]]:
    """The rounds each experiment or decision page was fed by ("experiments/<slug>.md" -> rounds in the order
    of probes/rounds.toml), as that page lists them: the round's page, title, kind, what was kept and dropped."""
    fed: dict[str, list[dict]] = {}
    for r in rounds:
        fed.setdefault(r.fed, []).append({"page": f"../{FOLDER}/{r.id}.md", "title": r.title, "kind": r.kind,
                                          "kept": r.kept, "dropped": r.dropped})
    return fed


def render_notebook(root: Path) -> tuple[dict[str, str], list[str]]:
    """docs-relative path -> content of every round's page and the index; and what was skipped, and why."""
    rounds, problems = load_rounds(root)
    out: dict[str, str] = {}
    listed = []
    for r in rounds:
        outputs = {}
        for rel in r.outputs:
            try:
                outputs[rel] = load_output(root, str(rel))
            except (ValueError, OSError, UnicodeDecodeError) as exc:
                problems.append(f"{rel}: {exc}")
        if not outputs:
            problems.append(f"{INDEX}: round {r.id}: no valid output, no page")
            continue
        out[f"{FOLDER}/{r.id}.md"] = render_round(r, outputs)
        listed.append(r)
    index = [HEADER, "", "# Probe rounds", "",
             "Each probe round as its raw output recorded it: the question, what was timed, on which GPU and clock, "
             "what was kept and dropped. Tuning readings, never evidence: the evidence is the run records on the "
             "experiment and decision pages each round fed.", "", "| round | kind | fed |", "| --- | --- | --- |"]
    index += [f"| [{md(r.title)}]({href(r.id + '.md')}) | {md(r.kind)} | [{md(r.fed)}]({href('../' + r.fed)}) |"
              for r in listed]
    out[f"{FOLDER}/index.md"] = "\n".join(str(x) for x in index) + "\n"
    return dict(sorted(out.items())), problems
