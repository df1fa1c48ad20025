"""The words a record's schema is written in: each check takes a JSON value and the place it sits in the
record ("record.points[3].results['liger'].p50_ms"), and returns the value to keep or raises a RecordError
that names that place, what it accepts and what it got.

A record arrives from a machine the site does not control, and what it says is published; so every value
is checked for its type and its range before anything renders, names that end up in file names and links
(slugs, GPU keys, dtypes, profile and case names, run ids) match one safe pattern, and free text is
bounded in length and depth. The schema itself (lab.evidence.records) is a table per object, field ->
check, so a new field is one line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

Check = Callable[[Any, str], Any]

# Lower-case words of letters and digits joined by single '.', '_' or '-': safe in a file name, a URL path
# and Markdown alike (no '/', no '..', no '--' that could blur a plot's <slug>--<gpu>--<dtype>.svg name).
IDENTIFIER = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
IDENTIFIER_TEXT = "lower-case letters and digits joined by single '.', '_' or '-'"
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-" + IDENTIFIER.pattern)
CASE = re.compile(r"[a-z0-9]+(?:[._+-][a-z0-9]+)*")  # a case name names no file, so "fwd+bwd-1x1024" may be one
UTC_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
DIMENSION = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # a shape's dimension names: M, N, K
SOURCE_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")  # no '..', no '/x'
MAX_NAME = 128
MAX_TEXT = 100_000
MAX_DEPTH = 16  # how deep free-form JSON (a launch plan, an environment's extras) may nest
MAX_INT = 1 << 62
# Times in ms: from a picosecond to a day, so that every ratio and plot drawn from them stays finite.
MIN_MS, MAX_MS = 1e-9, 86_400_000.0
MAX_FIGURE = 1e12  # GB/s, TFLOP/s, percentages, relative errors, profiler totals
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # line breaks included; a tab reads as a space


class RecordError(ValueError):
    """A record's content does not match the schema; the message names the field and what was expected."""


def got(value: Any) -> str:
    """A short, printable account of a value for an error message (hostile text stays inert on a terminal)."""
    if isinstance(value, (dict, list)):
        return f"{type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(where: str, expected: str, value: Any) -> RecordError:
    return RecordError(f"{where}: expected {expected}, got {got(value)}")


# --------------------------------------------------------------------------------------------------------
# Scalars
# --------------------------------------------------------------------------------------------------------


def integer(low: int = 0, high: int = MAX_INT) -> Check:
    def check(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, "an integer", value)
        if not low <= value <= high:
            raise _fail(where, f"an integer from {low} to {high}", value)
        return value
    return check


def number(low: float = 0.0, high: float = MAX_FIGURE, *, above: bool = False) -> Check:
    """A finite number in [low, high] ((low, high] when `above`)."""
    def check(value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        if not (low < value if above else low <= value) or value > high:
            raise _fail(where, f"a number {'above' if above else 'from'} {low:g}{' up' if above else ''} to {high:g}",
                        value)
        return float(value)
    return check


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "true or false", value)
    return value


def text(max_length: int = MAX_TEXT, *, line: bool = False, empty: bool = True) -> Check:
    """A string of at most `max_length` characters; one line with no control characters when `line`."""
    def check(value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise _fail(where, "a string", value)
        if len(value) > max_length:
            raise RecordError(f"{where}: expected at most {max_length} characters, got {len(value)}")
        if line and _CONTROL.search(value.replace("\t", " ")):
            raise _fail(where, "one line of text without control characters", value)
        if not empty and not value.strip():
            raise _fail(where, "a non-empty string", value)
        return value
    return check


def matching(pattern: re.Pattern, what: str, max_length: int = MAX_NAME) -> Check:
    def check(value: Any, where: str) -> str:
        if not isinstance(value, str) or len(value) > max_length or not pattern.fullmatch(value):
            raise _fail(where, what, value)
        return value
    return check


identifier = matching(IDENTIFIER, f"a name of {IDENTIFIER_TEXT}")
case_name = matching(CASE, "a case name of lower-case letters and digits joined by single '.', '_', '+' or '-'")
run_id = matching(RUN_ID, f"a run id <yyyymmddThhmmssZ>-<{IDENTIFIER_TEXT}>")
utc_time = matching(UTC_TIME, "a UTC time yyyy-mm-ddThh:mm:ssZ")
dimension = matching(DIMENSION, "a dimension name (a letter, then letters, digits or '_')")
source_path = matching(SOURCE_PATH, "a repository-relative path", max_length=1000)
time_ms = number(MIN_MS, MAX_MS)


def one_of(*values: Any) -> Check:
    def check(value: Any, where: str) -> Any:
        if isinstance(value, bool) or value not in values:  # True == 1 must not pass for 1
            raise RecordError(f"{where}: {got(value)} is not one of {', '.join(map(str, values))}")
        return value
    return check


def optional(check: Check) -> Check:
    """`check`, or null."""
    return lambda value, where: None if value is None else check(value, where)


# --------------------------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------------------------


def list_of(item: Check, *, min_length: int = 0, max_length: int = 1_000_000) -> Check:
    def check(value: Any, where: str) -> tuple:
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        if not min_length <= len(value) <= max_length:
            raise RecordError(f"{where}: expected from {min_length} to {max_length} items, got {len(value)}")
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))
    return check


def mapping(key: Check, value: Check, *, max_length: int = 100_000) -> Check:
    """An object whose every key passes `key` and every value `value`."""
    def check(data: Any, where: str) -> dict:
        if not isinstance(data, dict):
            raise _fail(where, "an object", data)
        if len(data) > max_length:
            raise RecordError(f"{where}: expected at most {max_length} entries, got {len(data)}")
        return {key(k, f"{where} key"): value(v, f"{where}[{k!r}]") for k, v in data.items()}
    return check


def json_value(max_depth: int = MAX_DEPTH) -> Check:
    """Any JSON value (free-form, e.g. a launch plan) nested at most `max_depth` deep, strings bounded."""
    def check(value: Any, where: str, depth: int = 0) -> Any:
        if depth > max_depth:
            raise RecordError(f"{where}: nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            return {text(MAX_NAME)(k, f"{where} key"): check(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [check(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, str):
            return text()(value, where)
        if isinstance(value, float) and not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        if value is None or isinstance(value, (bool, int, float)):
            return value
        raise _fail(where, "a JSON value", value)
    return check


@dataclass(frozen=True)
class Absent:
    """A field that older records lack: `check` when present, `default` when the key is missing."""

    check: Check
    default: Any = None


class fields:  # noqa: N801 - read as a check like the others: fields({...})(value, where)
    """An object with exactly the fields of `table` (field -> check, or Absent(check, default) for a field
    older records lack); keys the table does not name are refused, unless `extra` checks them (an open
    object). Returns the checked values by field name, defaults filled in."""

    def __init__(self, table: Mapping[str, Check | Absent], *, extra: Check | None = None):
        self.table = dict(table)
        self.extra = extra

    def __call__(self, data: Any, where: str) -> dict:
        if not isinstance(data, dict):
            raise _fail(where, "an object", data)
        out = {}
        for key, spec in self.table.items():
            if key in data:
                out[key] = (spec.check if isinstance(spec, Absent) else spec)(data[key], f"{where}.{key}")
            elif isinstance(spec, Absent):
                out[key] = spec.default
            else:
                raise RecordError(f"{where}: missing field {key!r}")
        unknown = [key for key in data if key not in self.table]
        if unknown and self.extra is None:
            raise RecordError(f"{where}: unknown field(s) {', '.join(got(k) for k in sorted(unknown)[:5])}")
        for key in unknown:
            text(MAX_NAME)(key, f"{where} key")
            out[key] = self.extra(data[key], f"{where}.{key}")
        return out
