"""The one way a record's text reaches a page: every string is escaped for Markdown unless it is marked safe.

Records come from machines the site does not control; a GPU name, a driver version, an error text or a
command line is published as the record says it. The page templates render with `finalize=md` (see
lab.publish.render): every `{{ value }}` goes through `md`, which leaves text readable and inert —

* no HTML: `<` starts no tag, comment or autolink (escaped unless a space, '=' or a digit follows, so
  "N <= 4096" stays as it is); `&` names no entity;
* no Markdown that could pull anything in or link anywhere: backticks, braces (attribute lists), pipes
  (table cells), backslashes and dollars (math) and asterisks (emphasis) are escaped, and so is a `]` that
  a link target could follow (before `(`, `[` or the end of the value; "[0.98, 1.02] wide" stays as it
  is); pymdownx.snippets' `--8<--` cannot form (its `<` is escaped); line breaks become spaces, so no value
  starts a block of its own; `javascript:` gets a zero-width break;
* what can only restyle text is left alone: _underscores_ (paths such as kernels/_launch.py are full of
  them) and pymdownx's smart symbols, ~~, ^^, ==, ++;
* text without any of these characters comes out unchanged, so escaping costs a benign page nothing.

What is already safe is an `Md` (or any markupsafe Markup): the project's own text (declarations, fixed
phrases), and what the helpers here build — `code` (an inline code span of any text), `code_block` (a
fenced block), `href` (a link target: relative or https only), `compose` (a trusted pattern with escaped
parts). Template authors mark trusted text explicitly (`|safe`, or `declared(...)` for a declaration) and
never need to escape record text themselves.
"""

from __future__ import annotations

import dataclasses
import html
import re
from typing import Any
from urllib.parse import quote, urlsplit

from markupsafe import Markup


class Md(Markup):
    """Markdown that goes onto a page as it is. Adding plain text to it (`+`, `%`, `.format`, `.join`)
    escapes that text with `md`, as markupsafe does with HTML."""

    __slots__ = ()

    @classmethod
    def escape(cls, s: Any) -> "Md":
        return md(s)


_BREAKS = re.compile(r"\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
_TEXT = re.compile(r"""
    (?P<lt><(?![\s=0-9]))                  # a tag, a comment, an autolink, a snippet's --8<--
  | (?P<amp>&(?=\#?[A-Za-z0-9]+;))         # an entity
  | (?P<entity>[`\\$])                     # code spans, escapes, math
  | (?P<backslash>[{}|*]                   # attribute lists, table cells, emphasis
      | \](?=\s?[(\[]|$)                     # a link's or an image's text closing before its target
      | \[(?=\^))                           # a footnote
  | (?P<scheme>(?i:javascript|vbscript)(?=:))
""", re.VERBOSE)
# In an attribute, Python-Markdown's inline patterns still run before the tag is kept as raw HTML: a link
# formed there would write its own quotes into the attribute. The same characters as in text, as entities.
_ATTRIBUTE = re.compile(r"[`\\$|{}*]|\](?=\s?[(\[]|$)|\[(?=\^)")
_SNIPPET_MARK = re.compile(r"(?<=-8)(?=<-)")  # inside code, where '<' stays: break "-8<-" invisibly
ZWSP = "\u200b"


def _plain(text: str) -> str:
    """One line, no control characters (each shown as U+FFFD)."""
    return _CONTROLS.sub("\ufffd", _BREAKS.sub(" ", text))


def _escape_match(m: re.Match) -> str:
    kind, found = m.lastgroup, m.group()
    if kind == "lt":
        return "&lt;"
    if kind == "amp":
        return "&amp;"
    if kind == "entity":
        return f"&#{ord(found)};"
    if kind == "backslash":
        return "\\" + found
    return found + ZWSP


def md(value: Any) -> Md:
    """`value` as Markdown text that shows exactly what it says and does nothing else; already-safe
    values (Md, Markup) pass unchanged."""
    if hasattr(value, "__html__"):
        return value if isinstance(value, Md) else Md(value.__html__())
    return Md(_TEXT.sub(_escape_match, _plain(str(value))))


def cell(value: Any) -> Md:
    """A table cell: record text escaped (pipes included); safe Markdown with its pipes escaped and its
    lines joined."""
    if hasattr(value, "__html__"):
        return Md(str(value.__html__()).replace("|", "\\|").replace("\n", " "))
    return md(value)


def indent4(value: Any) -> Md:
    """Text inside an admonition: safe Markdown with its later lines indented four spaces; record text is
    one line anyway."""
    return Md(str(md(value)).replace("\n", "\n    "))


def code(value: Any) -> Md:
    """An inline code span showing `value` verbatim: fenced with more backticks than any run inside it."""
    text = _SNIPPET_MARK.sub(ZWSP, _plain(str(value)))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return Md(f"{fence}{pad}{text}{pad}{fence}")


def code_block(value: Any, language: str = "text") -> Md:
    """A fenced code block showing `value`'s lines verbatim: a fence longer than any backtick run in it, so
    no line can close it, and snippet markers broken so none pulls a file in."""
    lines = _CONTROLS.sub("\ufffd", str(value).replace("\r\n", "\n").replace("\r", "\n")).split("\n")
    lines = [_SNIPPET_MARK.sub(ZWSP, line) for line in lines]
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    if not re.fullmatch(r"[a-z0-9]*", language):
        raise ValueError(f"code_block: language {language!r} is not a plain name")
    return Md(f"{fence}{language}\n" + "\n".join(lines) + f"\n{fence}")


def href(target: str) -> Md:
    """A link target: a path relative to the page or the docs root, or an https: address; anything else
    (javascript:, data:, //host, http:) raises ValueError. Characters that would end the link are quoted."""
    parts = urlsplit(target)
    if parts.scheme not in ("", "https") or (not parts.scheme and target.startswith("//")):
        raise ValueError(f"a link may go to a relative path or an https: address, not {target!r}")
    return Md(quote(target, safe="/:#?=&%~.-_+,"))


def attribute(value: Any) -> str:
    """Text for an HTML attribute value in quotes (a tooltip) or between tags: HTML-escaped, quotes
    included, and inert as Markdown too (backticks, backslashes, pipes, braces and dollars as entities, no
    snippet marker, one line)."""
    text = html.escape(_plain(str(value)), quote=True)
    return _ATTRIBUTE.sub(lambda m: f"&#{ord(m.group())};", text)


def compose(pattern: str, *parts: Any) -> Md:
    """`pattern` (the project's own Markdown, with {} slots) filled with `parts`, each escaped unless safe."""
    return Md(pattern).format(*parts)


# --------------------------------------------------------------------------------------------------------
# Declarations: the project's own text
# --------------------------------------------------------------------------------------------------------


class Declared:
    """A declaration (an experiment, a decision, a case, a claim) as a template reads it: its text is the
    project's own Markdown, so every string attribute comes back safe; nested declarations and tuples of
    them are wrapped alike."""

    __slots__ = ("_of",)

    def __init__(self, of: Any):
        self._of = of

    def __getattr__(self, name: str) -> Any:
        return declared(getattr(self._of, name))

    def __repr__(self) -> str:
        return f"declared({self._of!r})"


def declared(value: Any) -> Any:
    """`value` marked as the project's own: strings become Md, dataclass objects Declared, the items of
    tuples and lists and the values of dicts likewise; anything else (numbers, callables) is returned as it is."""
    if isinstance(value, str):
        return value if hasattr(value, "__html__") else Md(value)
    if isinstance(value, (tuple, list)):
        return type(value)(declared(v) for v in value)
    if isinstance(value, dict):
        return {k: declared(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return Declared(value)
    return value
