"""Rendered pages kept between starts of `mkdocs serve` (installed by tools/mkdocs_hooks.py).

Every start of `mkdocs serve` turns every page's Markdown into HTML again, and on this site that conversion is
most of the start: the evidence and per-point pages are long tables. `install` wraps MkDocs' Page.render so
that a page whose inputs are unchanged takes what rendering would give it (its HTML, table of contents,
title from the first heading, anchor ids and links to other pages' anchors) from a file under PAGE_CACHE.

An entry is named by the SHA-256 of everything the rendered page is a function of: the page's Markdown as
the hooks hand it to the renderer (figures already expanded), the bytes of every file it includes by a
snippet line (`--8<-- "path"`, followed into the files it includes; a page that includes any other way is
rendered every time), its path, mkdocs.yml, the list of the site's
files with their URLs (relative links resolve against it), the Markdown extensions of this repository
(tools/), and the versions of Python and of the packages that render. A page whose entry is missing renders
as always and is then kept, unless its conversion logged a warning: such a page is never kept, so it is
converted, and warns, on every build, whether that build reads the cache or not. What a page read from the
cache would have raised is therefore nothing: its conversion is a function of the entry's key, and that
conversion raised no warning.

Only `mkdocs serve` reads the cache (`read=True`). `mkdocs build` renders every page itself; it writes the
entries (`read=False`), so the first `./dev.sh serve` after `./dev.sh site` starts from them.
KERNEL_LAB_PAGE_CACHE=off turns the cache off; =read makes `mkdocs build` read it too (the tests' build of
the site does, after `./dev.sh site` converted every page). Entries of all but the newest STATES_KEPT site
states (configuration, file list, code) are removed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import sys
import threading
from pathlib import Path

from mkdocs.structure.pages import Page
from mkdocs.structure.toc import get_toc

log = logging.getLogger("mkdocs.hooks.kernel_lab")

PAGE_CACHE = ".cache/kernel-lab/pages"
STATES_KEPT = 2
PACKAGES = ("mkdocs", "markdown", "pymdown-extensions", "mkdocs-material", "pygments")
FORMAT = 1  # the entries' layout; a change here names new entries

# pymdownx.snippets' one-line form; SNIPPET_MARK anywhere else (its block form, a nested syntax) keeps a page
# out of the cache.
SNIPPET_LINE = re.compile(r"""^[ \t]*-{1,}8<-{1,}[ \t]+(["'])([^"'\n]+)\1[ \t]*$""", re.MULTILINE)
SNIPPET_MARK = re.compile(r"-{1,}8<-{1,}")

_original_render = Page.render
_state: dict = {"dir": None, "read": False, "root": None}


def enabled() -> bool:
    return os.environ.get("KERNEL_LAB_PAGE_CACHE", "").strip().lower() not in ("off", "0", "no", "false")


def state_digest(root: Path, config, files) -> str:
    """The digest of what every page's rendering shares: configuration, file list, code and packages."""
    h = hashlib.sha256(f"{FORMAT}\0{sys.version}\0".encode())
    for name in PACKAGES:
        try:
            h.update(f"{name}={importlib.metadata.version(name)}\0".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{name}=-\0".encode())
    h.update(Path(config.config_file_path).read_bytes())
    for path in sorted((root / "tools").glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for file in sorted(files, key=lambda f: f.src_uri):
        h.update(f"\0{file.src_uri}\0{file.url}\0{file.inclusion}".encode())
    return h.hexdigest()


def install(root: Path, config, files, read: bool) -> None:
    """Route Page.render through the cache for this build (read: take entries, not only write them;
    KERNEL_LAB_PAGE_CACHE=read makes every build read, which is how the tests hold a served page to a built one)."""
    if not enabled():
        uninstall()
        return
    _state["dir"] = root / PAGE_CACHE / state_digest(root, config, files)
    _state["read"] = read or os.environ.get("KERNEL_LAB_PAGE_CACHE", "").strip().lower() == "read"
    _state["root"] = root
    Page.render = _cached_render


def uninstall() -> None:
    Page.render = _original_render
    _state["dir"] = None


def included_files(root: Path, text: str, seen: set[str] | None = None) -> list[tuple[str, bytes]] | None:
    """(path, bytes) of every file `text` includes by a one-line snippet, and those they include, in order;
    None where it includes any other way (or too deep to follow)."""
    seen = set() if seen is None else seen
    if len(SNIPPET_MARK.findall(text)) != len(SNIPPET_LINE.findall(text)) or len(seen) > 64:
        return None
    out = []
    for match in SNIPPET_LINE.finditer(text):
        name = match.group(2).strip()
        if name in seen:
            continue
        seen.add(name)
        path = root / name
        data = path.read_bytes() if path.is_file() else b"\0missing"
        out.append((name, data))
        if path.suffix == ".md" and data != b"\0missing":
            nested = included_files(root, data.decode("utf-8", "replace"), seen)
            if nested is None:
                return None
            out += nested
    return out


def _entry(page: Page) -> Path | None:
    included = included_files(_state["root"], page.markdown)
    if included is None:
        return None
    h = hashlib.sha256(f"{page.file.src_uri}\0{page.markdown}".encode("utf-8"))
    for name, data in included:
        h.update(f"\0{name}\0{len(data)}\0".encode() + data)
    return _state["dir"] / f"{h.hexdigest()}.json"


def _tokens(items) -> list[dict]:
    return [{"level": i.level, "id": i.id, "name": i.title, "children": _tokens(i.children)} for i in items]


def _cached_render(self: Page, config, files) -> None:
    if type(self) is not Page or _state["dir"] is None or self.markdown is None:  # blog excerpts and the like
        return _original_render(self, config, files)
    entry = _entry(self)
    if entry is None:
        return _original_render(self, config, files)
    if _state["read"] and _load(self, entry, files):
        return None
    warnings = _Warnings()
    mkdocs_log = logging.getLogger("mkdocs")
    mkdocs_log.addHandler(warnings)
    try:
        _original_render(self, config, files)
    finally:
        mkdocs_log.removeHandler(warnings)
    if not warnings.seen:  # a page that warned is converted again, and warns again, on every build
        _keep(self, entry)
    return None


class _Warnings(logging.Handler):
    """Notes whether MkDocs logged a warning or an error (what `--strict` counts) while a page converted."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        self.seen = True


def _load(page: Page, entry: Path, files) -> bool:
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
        links = None
        if data["links_to_anchors"] is not None:
            links = {}
            for src_uri, anchors in data["links_to_anchors"].items():
                target = files.get_file_from_path(src_uri)
                if target is None:  # the file list is in the key; a missing file means a stale entry
                    return False
                links[target] = anchors
    except (OSError, ValueError, KeyError, TypeError):
        return False
    page.content = data["content"]
    page.toc = get_toc(data["toc"])
    page._title_from_render = data["title"]
    page.present_anchor_ids = set(data["anchors"])
    if links is not None:
        page.links_to_anchors = links
    return True


def _keep(page: Page, entry: Path) -> None:
    """Write the entry whole or not at all; a cache that cannot be written costs time, never the build."""
    links = page.links_to_anchors
    data = {
        "content": page.content,
        "toc": _tokens(page.toc),
        "title": page._title_from_render,
        "anchors": sorted(page.present_anchor_ids or ()),
        "links_to_anchors": None if links is None else {f.src_uri: dict(a) for f, a in links.items()},
    }
    try:
        keep_entry(entry, json.dumps(data))
    except OSError as exc:
        log.debug(f"could not keep a rendered page: {exc}")


def prune() -> None:
    """Remove the entries of all but the newest STATES_KEPT states (the current one always stays)."""
    current = _state["dir"]
    if current is None or not current.parent.is_dir():
        return
    try:
        prune_states(current, STATES_KEPT)
    except OSError as exc:
        log.debug(f"could not prune rendered pages: {exc}")


# The site build's caches (this one, and tools/mkdocs_hooks.py's expanded figures) keep an entry a file under a
# folder a state, and these two helpers.


def keep_entry(entry: Path, text: str) -> None:
    """Write `text` to `entry` whole or not at all (through a sibling renamed into place); OSError if it cannot."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{entry.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, entry)


def prune_states(current: Path, kept: int) -> None:
    """Remove all but the `kept` newest state folders beside `current` (which always stays)."""
    states = sorted((p for p in current.parent.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in states[:-kept]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)
