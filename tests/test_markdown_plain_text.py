"""tools/markdown_plain_text.py: plain text skips the inline patterns, and the HTML is the same with it as without.

Markdown is converted with mkdocs.yml's own extensions, with and without the plain-text processor, over
text built to hit every pattern the site uses (code, links, references, emphasis, math, smart symbols,
abbreviations, HTML) in table cells, list items and paragraphs, and over generated evidence pages.
"""

from __future__ import annotations

import functools
from pathlib import Path

import markdown
import pytest
import yaml
from markdown.util import AtomicString

from sitetools import load_tool

plain_text = load_tool("markdown_plain_text")
ROOT = Path(__file__).resolve().parents[1]


class _Loader(yaml.SafeLoader):  # mkdocs.yml's !ENV and !!python/name values are not needed here
    pass


for _prefix in ("!", "tag:yaml.org,2002:python/"):
    _Loader.add_multi_constructor(_prefix, lambda loader, suffix, node: None)


@functools.cache
def site_extensions() -> tuple[tuple[str, ...], dict]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    names, configs = [], {}
    for item in config["markdown_extensions"]:
        name, options = next(iter(item.items())) if isinstance(item, dict) else (item, None)
        if name == "pymdownx.snippets":  # reads files by path; no sample here includes one
            continue
        names.append(name)
        if options:
            configs[name] = options
    return tuple(names), configs


def convert(text: str, plain: bool, extra=()) -> str:
    names, configs = site_extensions()
    extensions = [*names, *extra, *([plain_text.PlainTextExtension()] if plain else [])]
    return markdown.Markdown(extensions=extensions, extension_configs=configs).convert(text)


TRICKY = [
    "1,333", "Faster", "bfloat16", "1.001× [1.001, 1.002]", "`liger` 526", "**bold**", "*em*", "_em_",
    "snake_case", "a^2^", "H~2~O", "==mark==", "~~gone~~", "++ctrl+alt++", "$x^2$", r"\(x\)", r"a \| b",
    "[a link](../experiments/x.md)", "[a ref][r]", "[r]", "[a] [r]", "![img](a.png)", "<span>html</span>",
    "&amp; &copy;", "(c) (tm) (r)", "+/-", "=/=", "c/o", "1/2 and 3/4", "11/2", "1st 2nd 3rd 4th 11th 21st",
    "a --> b", "<-- b", "x {: .cls }", "GPU", "the GPU", "[^1]", "trailing  ", "100% of 2:1‡", "n4096/k4096",
    "fwd-1333: first 1573 of 12 rows", "≥ 0.95 – 1.05", "µs", "Level · 3 of 12",
]


def _document(abbreviations: bool, references: bool) -> str:
    rows = "\n".join(f"| {cell} | {cell} |" for cell in TRICKY if "|" not in cell)
    items = "\n".join(f"- {cell}" for cell in TRICKY)
    paragraphs = "\n\n".join(TRICKY)
    tail = ""
    if references:
        tail += "\n\n[r]: https://example.org/r\n[1.001, 1.002]: https://example.org/interval\n"
    if abbreviations:
        tail += "\n*[GPU]: graphics processing unit\n"
    return f"# Title\n\n| A | B |\n| --- | ---: |\n{rows}\n\n{items}\n\n{paragraphs}\n\n??? info \"More\"\n\n{items}\n{tail}"


@pytest.mark.parametrize("abbreviations", [False, True])
@pytest.mark.parametrize("references", [False, True])
def test_the_html_is_the_same_with_and_without_it(abbreviations, references):
    text = _document(abbreviations, references)
    assert convert(text, plain=True) == convert(text, plain=False)


def test_generated_pages_come_out_the_same():
    pages = sorted((ROOT / "docs" / "points").glob("*.md"), key=lambda p: p.stat().st_size)
    assert pages, "no generated per-point pages to compare"
    for page in (pages[0], pages[len(pages) // 2]):
        text = page.read_text(encoding="utf-8")
        assert convert(text, plain=True) == convert(text, plain=False), page.name


def _atomic_cells(text: str, extra=()) -> dict[str, bool]:
    names, configs = site_extensions()
    md = markdown.Markdown(extensions=[*names, *extra, plain_text.PlainTextExtension()], extension_configs=configs)
    seen = {}
    processor = md.treeprocessors["plain-text"]
    original = processor.run

    def run(root):
        original(root)
        for cell in root.iter("td"):
            seen[str(cell.text)] = isinstance(cell.text, AtomicString)

    processor.run = run
    md.convert(text)
    return seen


def test_plain_cells_are_skipped_and_the_rest_are_not():
    seen = _atomic_cells("| a | b | c | d | e |\n| --- | --- | --- | --- | --- |\n"
                         "| 1,333 | `liger` 526 | 2nd | 1.001× [1.001, 1.002] | (c) |\n")
    assert seen == {"1,333": True, "`liger` 526": False, "2nd": False, "1.001× [1.001, 1.002]": True, "(c)": False}


class _Shout(markdown.extensions.Extension):
    """An inline pattern the plain-text processor does not know: '!!x!!' in capitals."""

    def extendMarkdown(self, md):
        class Shout(markdown.inlinepatterns.InlineProcessor):
            def handleMatch(self, m, data):
                return m.group(1).upper(), m.start(0), m.end(0)

        md.inlinePatterns.register(Shout(r"%%(\w+)%%", md), "shout", 5)


def test_it_steps_aside_when_an_unknown_inline_pattern_is_registered():
    text = "| a |\n| --- |\n| %%loud%% |\n"
    seen = _atomic_cells(text, extra=[_Shout()])
    assert seen == {"%%loud%%": False}
    assert "LOUD" in convert(text, plain=True, extra=[_Shout()])


def test_it_applies_beside_the_processors_mkdocs_adds_to_every_page():
    """MkDocs registers tree processors of its own on each page's Markdown; the processor must know them, or it
    would step aside on every page and the site would build no sooner."""
    from mkdocs.structure import pages

    names, configs = site_extensions()
    md = markdown.Markdown(extensions=[*names, plain_text.PlainTextExtension()], extension_configs=configs)
    pages._RelativePathTreeprocessor(None, None, None)._register(md)
    pages._ExtractAnchorsTreeprocessor(None, None, None)._register(md)
    pages._ExtractTitleTreeprocessor()._register(md)
    assert plain_text.applies(md)
