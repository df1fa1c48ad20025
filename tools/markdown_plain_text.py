"""A Python-Markdown extension that lets plain text skip inline processing: the same HTML, built sooner.

The evidence pages are mostly tables (a per-point page holds thousands of cells) and Python-Markdown runs
every inline pattern over every cell, list item and paragraph: over half of `mkdocs build`'s time went
there. Most cells are plain text ("1,333", "Faster", "bfloat16", "526"), on which no pattern can match, so
running them changes nothing. This tree processor runs just before the inline one and marks such text
atomic (markdown.util.AtomicString), which the inline processors leave as it is.

Text is plain when it holds none of the characters an inline pattern of this site starts from or needs
(code, escapes, links and images, raw HTML and entities, emphasis and the other delimiters, math, keys,
line breaks), none of pymdownx.smartsymbols' patterns match it (taken from the registered processor, so
its configuration is honoured), and, if the page defines link references or abbreviations, it holds no
square bracket and no abbreviation can apply. Only an element's own text is considered, and only for an
element without children.

pymdownx.smartsymbols then runs an inline pass of its own over the whole tree, after prettify has put a
newline after every cell and row: the extension holds those blank tails, on which no symbol matches,
over that pass and gives them back after it (HoldBlankTails, GiveBackBlankTails).

Should an inline pattern or a text-reading tree processor this module does not know be registered (an
extension added to mkdocs.yml later), the extension steps aside for the whole page: the site is then as
slow as before, never different. tests/test_markdown_plain_text.py checks that the HTML is the same with
and without it.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as etree

from markdown import Markdown
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor
from markdown.util import AtomicString

# The inline patterns of mkdocs.yml's extensions whose triggers TRIGGERS covers.
KNOWN_INLINE = frozenset({
    "backtick", "arithmatex-inline", "keys-custom", "escape", "footnote", "reference", "link", "image_link",
    "image_reference", "short_reference", "short_image_ref", "autolink", "automail", "linebreak", "html",
    "entity", "keys", "delimiter", "em_strong", "em_strong2", "not_strong",
})
# Tree processors that run after the inline one (lower priority): Python-Markdown's and pymdownx's, whose
# text handling is accounted for above, and MkDocs' and Material's, which read attributes and headings only.
KNOWN_AFTER_INLINE = frozenset({
    "inline", "prettify", "unescape", "abbr", "attr_list", "toc", "smart-symbols", "footnote-duplicate",
    "mkdocs_extract_anchors", "mkdocs_extract_title", "relpath", "excerpt", "preview", "blank-tails-held",
    "blank-tails-back",
})
# Characters some inline pattern starts from or needs: ` \ ! < > & * _ ^ = ~ $ { } and newlines (code,
# escapes, images, HTML, autolinks, entities, emphasis, caret, mark, tilde, math, attribute lists, line
# breaks), "++" (keys) and a closing bracket followed by "(" or "[" (inline and full reference links).
TRIGGERS = re.compile(r"[`\\!<>&*_^=~${}\n]|\+\+|\]\s*[(\[]")
BRACKETS = re.compile(r"[\[\]]")
# Elements whose own text is considered: cells, list items, paragraphs, definitions, summaries.
TAGS = frozenset({"td", "th", "li", "p", "dd", "dt", "summary"})


def applies(md: Markdown) -> bool:
    """Whether every inline pattern, and every tree processor after the inline step, is one this module knows."""
    inline = {item.name for item in md.inlinePatterns._priority}
    after = {item.name for item in md.treeprocessors._priority if item.priority < PRIORITY}
    return inline <= KNOWN_INLINE and after <= KNOWN_AFTER_INLINE


class PlainTextProcessor(Treeprocessor):
    """Marks plain text atomic so the inline processors skip it."""

    def run(self, root: etree.Element) -> None:
        md = self.md
        if not applies(md):
            return
        symbols = self._smart_symbols(md)
        brackets = bool(md.references) or bool(getattr(self._processor("abbr"), "abbrs", None))
        for el in root.iter():
            if el.tag not in TAGS or len(el):
                continue
            text = el.text
            if not text or isinstance(text, AtomicString) or TRIGGERS.search(text):
                continue
            if brackets and (BRACKETS.search(text) or self._abbreviated(text)):
                continue
            if any(pattern.search(text) for pattern in symbols):
                continue
            el.text = AtomicString(text)

    def _processor(self, name: str):
        return self.md.treeprocessors[name] if name in self.md.treeprocessors else None

    def _abbreviated(self, text: str) -> bool:
        abbrs = getattr(self._processor("abbr"), "abbrs", None) or {}
        return any(word in text for word in abbrs)

    def _smart_symbols(self, md: Markdown) -> list[re.Pattern]:
        processor = self._processor("smart-symbols")
        patterns = getattr(processor, "inlinePatterns", None)
        return [p.compiled_re for p in patterns] if patterns is not None else []


class HoldBlankTails(Treeprocessor):
    """Holds the blank tails (whitespace between elements, one after every cell and row once prettified) over
    pymdownx.smartsymbols' own inline pass, which runs every symbol pattern over every tail and matches none
    on whitespace; GiveBackBlankTails puts them back after it."""

    def __init__(self, md: Markdown, held: list):
        super().__init__(md)
        self.held = held

    def run(self, root: etree.Element) -> None:
        self.held.clear()
        if "smart-symbols" not in self.md.treeprocessors or not applies(self.md):
            return
        for el in root.iter():
            if el.tail and el.tail.isspace():
                self.held.append((el, el.tail))
                el.tail = None


class GiveBackBlankTails(HoldBlankTails):
    def run(self, root: etree.Element) -> None:
        for el, tail in self.held:
            el.tail = tail
        self.held.clear()


PRIORITY = 21  # after the block parser and the tree processors that build or move text (footnotes, task
# lists, highlighting: 25 and up), just before the inline processor (20)
HOLD_PRIORITY, GIVE_BACK_PRIORITY = 6.5, 6.05  # either side of pymdownx.smartsymbols' pass (6.1), after
# prettify (10), attribute lists (8) and abbreviations (7), before the table of contents (5)


class PlainTextExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        md.treeprocessors.register(PlainTextProcessor(md), "plain-text", PRIORITY)
        held: list = []
        md.treeprocessors.register(HoldBlankTails(md, held), "blank-tails-held", HOLD_PRIORITY)
        md.treeprocessors.register(GiveBackBlankTails(md, held), "blank-tails-back", GIVE_BACK_PRIORITY)


def makeExtension(**kwargs) -> PlainTextExtension:  # noqa: N802 (Python-Markdown's name)
    return PlainTextExtension(**kwargs)
