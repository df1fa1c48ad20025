"""tools/mkdocs_page_cache.py: rendered pages kept between starts of `mkdocs serve`.

A small MkDocs project in a temporary folder, its hooks installing the cache as tools/mkdocs_hooks.py does:
a page read from the cache is the page rendered afresh, byte for byte; an entry is taken only while the page,
the files it includes by snippet, the file list and the configuration are unchanged; a page that includes
another way is never cached, nor one that warned; `mkdocs build` writes entries but reads none unless told to.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HOOKS = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kernel_lab_mkdocs_page_cache", {str(ROOT / "tools" / "mkdocs_page_cache.py")!r})
cache = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cache
spec.loader.exec_module(cache)
from pathlib import Path

def on_nav(nav, config, files):
    cache.install(Path(config.config_file_path).parent, config, files, read=False)
    return nav

def on_post_build(config):
    cache.prune()
"""

CONFIG = """site_name: cache test
use_directory_urls: false
hooks: [hooks.py]
markdown_extensions:
  - toc:
      permalink: true
  - tables
  - pymdownx.snippets:
      base_path: ["."]
      check_paths: true
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "parts").mkdir()
    (tmp_path / "hooks.py").write_text(HOOKS)
    (tmp_path / "mkdocs.yml").write_text(CONFIG)
    (tmp_path / "parts" / "table.md").write_text("| a | b |\n| --- | --- |\n| 1 | 2 |\n\n--8<-- \"parts/inner.md\"\n")
    (tmp_path / "parts" / "inner.md").write_text("Inner text one.\n")
    (tmp_path / "docs" / "index.md").write_text(
        "# Home\n\n## Results\n\nSee [the other page](other.md#details).\n\n--8<-- \"parts/table.md\"\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Details\n\nPlain words.\n")
    (tmp_path / "docs" / "block.md").write_text("# Block\n\n--8<--\nparts/inner.md\n--8<--\n")
    return tmp_path


def _build(project: Path, site: str, monkeypatch, mode: str = "", warnings: list[str] | None = None) -> dict[str, bytes]:
    """The built pages; with `warnings`, MkDocs' warnings are logged and appended to it (else only its errors)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.setenv("KERNEL_LAB_PAGE_CACHE", mode)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")  # the theme prints the build date
    monkeypatch.chdir(project)
    mkdocs_log = logging.getLogger("mkdocs")
    level = mkdocs_log.level
    mkdocs_log.setLevel(logging.ERROR if warnings is None else logging.WARNING)
    heard = _Heard(warnings if warnings is not None else [])
    mkdocs_log.addHandler(heard)
    try:
        build(load_config(str(project / "mkdocs.yml"), site_dir=str(project / site)))
    finally:
        mkdocs_log.removeHandler(heard)
        mkdocs_log.setLevel(level)  # other tests read MkDocs' warnings
        sys.modules["kernel_lab_mkdocs_page_cache"].uninstall()
    return {str(p.relative_to(project / site)): p.read_bytes() for p in sorted((project / site).rglob("*.html"))}


class _Heard(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(level=logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def _entries(project: Path) -> list[Path]:
    return sorted((project / ".cache" / "kernel-lab" / "pages").glob("*/*.json"))


def test_a_page_read_from_the_cache_is_the_page_rendered(tmp_path, monkeypatch):
    project = _project(tmp_path)
    built = _build(project, "site_a", monkeypatch)
    entries = _entries(project)
    assert len(entries) == 2, "index and other are kept; block (a block-form snippet) is not"
    read = _build(project, "site_b", monkeypatch, "read")
    assert read == built
    assert b"Inner text one." in built["index.html"] and b'id="results"' in built["index.html"]


def test_an_entry_is_taken_only_while_its_inputs_are_unchanged(tmp_path, monkeypatch):
    project = _project(tmp_path)
    _build(project, "site_a", monkeypatch)
    for entry in _entries(project):  # mark every entry: a page shows the mark only if it came from the cache
        data = json.loads(entry.read_text())
        data["content"] += "<p>FROM-THE-CACHE</p>"
        entry.write_text(json.dumps(data))
    read = _build(project, "site_b", monkeypatch, "read")
    assert b"FROM-THE-CACHE" in read["index.html"] and b"FROM-THE-CACHE" in read["other.html"]
    plain = _build(project, "site_c", monkeypatch)  # `mkdocs build` reads nothing
    assert b"FROM-THE-CACHE" not in plain["index.html"]
    _build(project, "site_a", monkeypatch)  # entries as rendered again
    for entry in _entries(project):
        data = json.loads(entry.read_text())
        data["content"] += "<p>FROM-THE-CACHE</p>"
        entry.write_text(json.dumps(data))
    (project / "parts" / "inner.md").write_text("Inner text two.\n")  # a file included two levels down
    changed = _build(project, "site_d", monkeypatch, "read")
    assert b"Inner text two." in changed["index.html"] and b"FROM-THE-CACHE" not in changed["index.html"]
    assert b"FROM-THE-CACHE" in changed["other.html"]
    (project / "docs" / "new.md").write_text("# New\n")  # the file list is in every entry's state
    listed = _build(project, "site_e", monkeypatch, "read")
    assert b"FROM-THE-CACHE" not in listed["other.html"]


def test_a_page_that_warns_is_never_kept_so_a_build_that_reads_the_cache_warns_too(tmp_path, monkeypatch):
    project = _project(tmp_path)
    (project / "docs" / "warns.md").write_text("# Warns\n\nSee [a page that is not there](missing.md).\n")
    heard: list[str] = []
    _build(project, "site_a", monkeypatch, warnings=heard)
    assert [m for m in heard if "missing.md" in m], heard
    assert len(_entries(project)) == 2, "index and other are kept; warns (it warned) and block are not"
    heard_again: list[str] = []
    read = _build(project, "site_b", monkeypatch, "read", warnings=heard_again)
    assert [m for m in heard_again if "missing.md" in m], "the page was converted again, and warned again"
    assert b"not there" in read["warns.html"]


def test_off_turns_it_off_and_old_states_are_pruned(tmp_path, monkeypatch):
    project = _project(tmp_path)
    _build(project, "site_a", monkeypatch, "off")
    assert _entries(project) == []
    cache = sys.modules["kernel_lab_mkdocs_page_cache"]
    for n in range(cache.STATES_KEPT + 2):  # each new page is a new file list, so a new state
        (project / "docs" / f"page{n}.md").write_text(f"# Page {n}\n")
        _build(project, "site_a", monkeypatch)
    states = [p for p in (project / ".cache" / "kernel-lab" / "pages").iterdir() if p.is_dir()]
    assert len(states) == cache.STATES_KEPT


@pytest.mark.parametrize("text, expected", [
    ('--8<-- "a.md"\n', ["a.md"]),
    ("  --8<-- 'b.md'  \n", ["b.md"]),
    ('--8<--\na.md\n--8<--\n', None),  # the block form: not followed, so not cached
    ("text only\n", []),
])
def test_the_snippet_lines_a_page_includes(tmp_path, text, expected):
    spec = importlib.util.spec_from_file_location("page_cache_alone", ROOT / "tools" / "mkdocs_page_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "a.md").write_text("A\n")
    got = module.included_files(tmp_path, text)
    assert (None if got is None else [name for name, _ in got]) == expected
