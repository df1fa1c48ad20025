"""MkDocs hooks for the Kernel Lab site (mkdocs.yml: `hooks: [tools/mkdocs_hooks.py]`).

* Refuses to build without the vendored KaTeX and fonts (tools/vendor_assets.py): a site that would
  reach for a CDN, or show raw TeX, is worse than a clear error.
* Publishes the run records that pages link, as they are stored, their hosts aliased, and links the record
  paths a page shows as code to the repository's copy when mkdocs.yml names where it is browsed
  (tools/site_records.py). The pages link the records their numbers come from (lab.publish.served) and name
  every other run by its path in the repository, which keeps every record. `--strict` checks the links.
  `mkdocs serve` watches records/ as soon as it exists.
* Lists every generated experiment and decision page under its section of the navigation, so adding an
  experiment touches one declaration and no configuration.
* Opens a notebook page whose saved outputs are missing or older than its code with a note saying so, and
  serves the stylesheet mkdocs-jupyter writes into it (over half a megabyte) as a file of its own.
* Expands the checked figures of hand-written pages (`{{ fig(...) }}`, `{{ claim(...) }}`: lab.publish.figures)
  from the records' verdicts, and fails the build naming page and line where a figure or claim no longer
  holds. An expanded page is kept in .cache/ under the digest of its text and of everything its figures are
  judged from (FIGURE_INPUTS), so a build whose records, declarations and code are unchanged loads neither
  the records nor torch for it.
* Keeps every rendered page in .cache/ and, under `mkdocs serve` only, takes an unchanged page from there
  instead of converting its Markdown again (tools/mkdocs_page_cache.py).
* Under `mkdocs serve`, re-renders the evidence pages (tools/build_results.py --render-only) whenever a
  record, a page template or a declaration changed, so the served site follows the evidence live. The render
  runs beside the server, never inside a rebuild: the site is served at once from the pages on disk, an
  edited post reloads without waiting for it, and the pages it rewrites trigger their own reload. What it
  last rendered from is kept in .cache/ (a digest of its inputs), so a restart with nothing changed renders
  nothing.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.kernel_lab")

def _load_tool(name: str):
    """tools/<name>.py, beside this file, as a module (tools/ is not a package)."""
    module_name = f"kernel_lab_{name}"
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the class is being built
    spec.loader.exec_module(module)
    return module


# Which records are published and how: tools/site_records.py, its names kept here too.
_records = _load_tool("site_records")
RECORDS_DIR = _records.RECORDS_DIR
RECORD_NAME = _records.RECORD_NAME
SHOW_HOSTS = _records.SHOW_HOSTS
host_alias, published_record, PublishedRecord = _records.host_alias, _records.published_record, _records.PublishedRecord
linked_records, record_files = _records.linked_records, _records.record_files
records_url, link_record_paths = _records.records_url, _records.link_record_paths

_plain_text = _load_tool("markdown_plain_text")
_page_cache = _load_tool("mkdocs_page_cache")

# A notebook page's inline stylesheets this long or longer are served as files (shared_styles), under this folder
# of the site.
INLINE_STYLE = re.compile(r'<style type="text/css">(.*?)</style>', re.DOTALL)
STYLE_KEPT_INLINE = 16_000
NOTEBOOK_STYLES = "assets/notebook"
# Navigation sections filled from the folder their index page lives in.
# The lab notebook's rounds are listed by its own index page (docs/probes/index.md), not in the navigation,
# which every page of the site carries: sixty rounds there weighed more than the pages themselves.
LISTED_SECTIONS = ("experiments", "decisions")
# The render run beside the server when its inputs (lab/evidence/render_inputs.py) changed since the last one.
RENDER_COMMAND = ("tools/build_results.py", "--render-only")

# Expanded pages kept between builds (git-ignored, never published): an entry is named by the SHA-256 of the
# page's text and of every file under FIGURE_INPUTS (the records; the declarations with margins.json; the
# kernels, whose hashes mark a run Stale; the lab's code that judges and formats), of this file, and of the
# Python and numpy that judged them. A changed record, declaration, margin, kernel or line of that code names
# another entry. The entries of the newest FIGURE_STATES_KEPT input states are kept, older ones removed.
# KERNEL_LAB_FIGURE_CACHE=off turns the cache off.
FIGURE_CACHE = ".cache/kernel-lab/figures"
FIGURE_INPUTS = ("records", "experiments", "kernels", "lab")
FIGURE_STATES_KEPT = 4

# MkDocs loads this module once per process and keeps it across the rebuilds of `mkdocs serve`.
_serving = False
_rendered_fingerprint: str | None = None
_evidence: tuple[str, object] | None = None  # (figure inputs digest, lab.publish.collect.Evidence)
_evidence_lock = threading.Lock()
_code_loaded: str | None = None  # digest of the code the lab's modules were imported from, in this process
_file_digests: dict[tuple[str, int, int], bytes] = {}  # (path, size, mtime) -> SHA-256 of the file's bytes
_render_thread: threading.Thread | None = None


def project_root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


# --------------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------------


# Pages left out of the search index: the per-point tables, numbers a reader reaches from their experiment's
# page. They were half of the index every page of the site loads and indexes in the browser.
UNSEARCHED = ("points/",)


def on_startup(command: str, dirty: bool) -> None:
    global _serving
    _serving = command == "serve"


def on_config(config):
    root = project_root(config)
    records_url(config)  # an address that is not https: fails here, before anything is built
    records = root / RECORDS_DIR
    if records.is_dir() and str(records) not in config.watch:
        config.watch.append(str(records))  # `mkdocs serve` reloads when a run is recorded
    # Plain text skips Python-Markdown's inline patterns: the same HTML, the evidence pages built sooner.
    extensions = getattr(config, "markdown_extensions", None)
    if extensions is not None and not any(isinstance(ext, _plain_text.PlainTextExtension) for ext in extensions):
        extensions.append(_plain_text.PlainTextExtension())
    vendor = _load_tool("vendor_assets")
    missing = vendor.missing(Path(config.docs_dir) / "assets" / "vendor")
    if missing:
        raise PluginError(
            f"the site's vendored assets are missing ({', '.join(missing)}): KaTeX and the fonts are served "
            "from docs/assets/vendor/, never from a CDN. Run `python tools/vendor_assets.py` (or ./dev.sh setup)."
        )
    return config


def on_pre_build(config) -> None:
    if _serving:
        rerender_in_background(project_root(config))


def on_serve(server, config, builder):
    """Once `mkdocs serve` serves (its first build read every expanded page from the cache), the evidence
    is loaded beside it, so the first edit of a post is expanded as fast as the ones after it."""
    root = project_root(config)
    threading.Thread(target=_load_evidence_quietly, args=(root,), name="kernel-lab-evidence", daemon=True).start()
    return server


def _load_evidence_quietly(root: Path) -> None:
    try:
        evidence_for(root)
    except Exception as exc:  # the rebuild that needs the evidence reports the same failure, on its page
        log.debug(f"loading the evidence beside the server failed: {exc}")


def on_files(files: Files, config) -> Files:
    linked = linked_records(Path(config.docs_dir))
    for record in record_files(project_root(config), config):
        if files.get_file_from_path(record.src_uri) is not None:
            raise PluginError(
                f"docs/{record.src_uri} collides with the run record of the same name: records are published "
                f"from {RECORDS_DIR}/ at the repository root; remove the copy under docs/."
            )
        if record.src_uri.removeprefix(RECORDS_DIR + "/") in linked:
            files.append(record)
    return files


def on_page_markdown(markdown: str, page: Page, config, files: Files) -> str:
    # MkDocs takes a page's title from its first H1 only when the heading opens the page; generated pages
    # open with their "do not edit" comment, so without this they would be titled after their file name.
    if "title" not in page.meta:
        title = heading_after_comments(markdown)
        if title:
            page.meta["title"] = title
    if page.file.src_uri.startswith(UNSEARCHED):
        page.meta.setdefault("search", {"exclude": True})
    markdown = expand_figures(markdown, f"{Path(config.docs_dir).name}/{page.file.src_uri}", project_root(config),
                              page.file.abs_src_path)
    return link_record_paths(markdown, records_url(config), project_root(config))


def on_page_content(html: str, page: Page, config, files: Files) -> str:
    """A notebook page whose saved outputs are missing or were made by other code opens with a note saying so
    (lab.publish.jupyter), so bare cells or an older version's outputs are never taken for the code's own.
    Its large inline stylesheets are served as files of their own (shared_styles)."""
    if not page.file.src_uri.endswith(".ipynb") or not page.file.abs_src_path:
        return html
    html = shared_styles(html, page.url, config.site_dir)
    jupyter = _project_module(project_root(config), "lab.publish.jupyter")
    try:
        notebook = json.loads(Path(page.file.abs_src_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PluginError(f"{page.file.src_uri}: not a readable notebook ({exc})") from None
    notice = jupyter.outputs_notice(notebook)
    return html if notice is None else notice + html


def shared_styles(html: str, page_url: str, site_dir: str) -> str:
    """`html` with each inline stylesheet of STYLE_KEPT_INLINE characters or more moved to a file of the site
    (NOTEBOOK_STYLES/<digest of its text>.css) and linked in its place, where it stood, so the cascade is the
    same. mkdocs-jupyter writes its whole theme, over half a megabyte, into every notebook page; as a file it
    is fetched once and the page stays light. The theme's url()s are all data: addresses, which move as they
    are."""
    def move(match: re.Match) -> str:
        css = match.group(1).strip()
        if len(css) < STYLE_KEPT_INLINE:
            return match.group(0)
        name = f"{NOTEBOOK_STYLES}/{hashlib.sha256(css.encode('utf-8')).hexdigest()[:16]}.css"
        path = Path(site_dir) / name
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(css + "\n", encoding="utf-8")
        return f'<link rel="stylesheet" href="{get_relative_url(name, page_url)}">'

    return INLINE_STYLE.sub(move, html)


def on_nav(nav: Navigation, config, files: Files) -> Navigation:
    for section in _sections(nav.items):
        folder = _listed_folder(section)
        if folder is None:
            continue
        present = {id(child) for child in section.children}
        extra = [
            f.page for f in sorted(files.documentation_pages(), key=lambda f: f.src_uri)
            if f.src_uri.startswith(folder + "/") and f.page is not None and id(f.page) not in present
        ]
        for page in extra:
            page.parent = section
        section.children.extend(extra)
    nav.pages = [item for item in _walk(nav.items) if isinstance(item, Page)]
    bookended = [None, *nav.pages, None]
    for before, page, after in zip(bookended, nav.pages, bookended[2:]):
        page.previous_page, page.next_page = before, after
    # The file list is final here and no page is rendered yet: rendered pages are kept from now on, and under
    # `mkdocs serve` taken from what was kept (tools/mkdocs_page_cache.py).
    _page_cache.install(project_root(config), config, files, read=_serving)
    return nav


def on_post_build(config) -> None:
    _page_cache.prune()


# --------------------------------------------------------------------------------------------------------
# Titles and navigation
# --------------------------------------------------------------------------------------------------------


def heading_after_comments(markdown: str) -> str | None:
    """The text of a leading "# " heading that follows only blank lines and HTML comments, else None."""
    rest = markdown.lstrip()
    if not rest.startswith("<!--"):
        return None  # MkDocs finds a heading that opens the page by itself
    while rest.startswith("<!--"):
        end = rest.find("-->")
        if end < 0:
            return None
        rest = rest[end + 3:].lstrip()
    first = rest.split("\n", 1)[0].strip()
    if first.startswith("# "):
        return first[2:].strip().rstrip("#").strip() or None
    return None


def _walk(items):
    for item in items:
        yield item
        if isinstance(item, Section):
            yield from _walk(item.children)


def _sections(items):
    return [item for item in _walk(items) if isinstance(item, Section)]


def _listed_folder(section: Section) -> str | None:
    """The folder whose pages this section lists: one of LISTED_SECTIONS, if its index page is the first child."""
    first = section.children[0] if section.children else None
    if isinstance(first, Page):
        for folder in LISTED_SECTIONS:
            if first.file.src_uri == f"{folder}/index.md":
                return folder
    return None


# --------------------------------------------------------------------------------------------------------
# Checked figures
# --------------------------------------------------------------------------------------------------------


def expand_figures(markdown: str, source: str, root: Path, path: str | None = None) -> str:
    """The page with its checked figures expanded (lab.publish.figures); PluginError lists each one that fails,
    by its line in the page's file (`path`; MkDocs has already cut the front matter off `markdown`)."""
    if "fig(" not in markdown and "claim(" not in markdown:
        return markdown  # no call can open here (lab.publish.figures.OPENING): nothing to load
    whole = Path(path).read_text(encoding="utf-8") if path and Path(path).is_file() else markdown
    entry = _figure_entry(root, source, markdown, whole)
    if entry is not None:
        try:
            return entry.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    figures = _project_module(root, "lab.publish.figures")
    if not figures.OPENING.search(markdown):
        return markdown  # "fig(" or "claim(" in its prose only: no need to load the records
    try:
        expanded = figures.expand(markdown, evidence_for(root), source, figures.first_line_of(markdown, whole))
    except figures.FigureError as exc:
        raise PluginError(f"figures that the records do not bear out:\n{exc}") from None
    if entry is not None and _code_loaded == code_digest(root):  # judged by the code on disk now
        _keep_figures(entry, expanded)
    return expanded


def _project_module(root: Path, name: str):
    global _code_loaded
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the checkout's own packages, whatever the environment has installed
    if _code_loaded is None:
        _code_loaded = code_digest(root)  # before anything of the lab is imported: the code it is imported from
    return importlib.import_module(name)


def evidence_for(root: Path):
    """Every record judged as build_results judges it, loaded once per change of the figures' inputs."""
    global _evidence
    with _evidence_lock:  # one load, whether a rebuild or the load beside the server asks first
        digest = inputs_digest(root)
        if _evidence is None or _evidence[0] != digest:
            experiments = _project_module(root, "experiments").all_experiments()
            decisions = _project_module(root, "experiments.decisions").DECISIONS
            hashing = _project_module(root, "lab.evidence.hashing")
            hashes = {slug: hashing.source_hashes(e, root) for slug, e in experiments.items()}
            evidence = _project_module(root, "lab.publish.collect").collect_evidence(
                experiments, decisions, root / RECORDS_DIR, hashes, missing_ok=True)
            _evidence = (digest, evidence)
        return _evidence[1]


def _digest_files(h, root: Path, tops) -> None:
    """Feed `h` each file under root/<top> (sorted, __pycache__ left out): its path and the SHA-256 of its bytes,
    hashed again only when its size or modification time changed since this process last read it."""
    for top in tops:
        base = root / top
        if not base.exists():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            st = path.stat()
            key = (str(path), st.st_size, st.st_mtime_ns)
            digest = _file_digests.get(key)
            if digest is None:
                digest = _file_digests[key] = hashlib.sha256(path.read_bytes()).digest()
            h.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0" + digest)


def code_digest(root: Path) -> str:
    """A digest of the code (and declared data) the figures are judged by: FIGURE_INPUTS but the records, this
    file, and the Python and numpy they run on."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"\0{_runtime()}\0{os.environ.get(SHOW_HOSTS) == '1'}\0".encode())
    _digest_files(h, root, [top for top in FIGURE_INPUTS if top != RECORDS_DIR])
    return h.hexdigest()


@functools.cache
def _runtime() -> str:
    """The Python and numpy (the verdicts' bootstrap draws from numpy's generator) this process runs."""
    try:
        numpy = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        numpy = None
    return f"{sys.version}\0{numpy}"


def inputs_digest(root: Path) -> str:
    """A digest of everything an expanded figure is a function of, its page aside: the code and the records."""
    h = hashlib.sha256(code_digest(root).encode())
    _digest_files(h, root, [RECORDS_DIR])
    return h.hexdigest()


def _figure_entry(root: Path, source: str, markdown: str, whole: str) -> Path | None:
    """Where the expansion of this page for the figures' inputs now is kept (None: the cache is off)."""
    if os.environ.get("KERNEL_LAB_FIGURE_CACHE", "").strip().lower() in ("off", "0", "no", "false"):
        return None
    page = hashlib.sha256("\0".join((source, markdown, whole)).encode("utf-8")).hexdigest()
    return root / FIGURE_CACHE / inputs_digest(root) / f"{page}.md"


def _keep_figures(entry: Path, text: str) -> None:
    """Write an expanded page whole or not at all, and remove the entries of all but the newest
    FIGURE_STATES_KEPT input states; a cache that cannot be written costs time, never the build."""
    try:
        _page_cache.keep_entry(entry, text)
        _page_cache.prune_states(entry.parent, FIGURE_STATES_KEPT)
    except OSError as exc:
        log.debug(f"could not keep an expanded page: {exc}")


# --------------------------------------------------------------------------------------------------------
# Live evidence under `mkdocs serve`
# --------------------------------------------------------------------------------------------------------


def _inputs(root: Path):
    """lab/evidence/render_inputs.py of this checkout (the render's inputs and their stored digest)."""
    return _project_module(root, "lab.evidence.render_inputs")


def _already_rendered(root: Path, fingerprint: str) -> bool:
    """Whether the pages on disk were rendered from inputs of this digest: by this process, or (the digest kept
    in .cache/) by an earlier one or by tools/build_results.py."""
    return fingerprint in (_rendered_fingerprint, _inputs(root).stored_fingerprint(root))


def rerender_if_changed(root: Path) -> bool:
    """Run the renderer when its inputs changed since the last successful render (_already_rendered); True
    if it ran and succeeded."""
    global _rendered_fingerprint
    inputs = _inputs(root)
    fingerprint = inputs.render_fingerprint(root)
    if _already_rendered(root, fingerprint):
        _rendered_fingerprint = fingerprint
        return False
    _rendered_fingerprint = fingerprint  # a failing render is reported once, not retried on every rebuild
    script = root / RENDER_COMMAND[0]
    if not script.is_file():
        log.warning(f"{RENDER_COMMAND[0]} is missing: serving the evidence pages as they are on disk")
        return False
    pythonpath = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, *RENDER_COMMAND], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath})
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        log.warning(f"re-rendering the evidence pages failed (exit {proc.returncode}):\n{tail}")
        return False
    inputs.store_fingerprint(root, fingerprint)
    log.info("evidence pages re-rendered from the records")
    return True


def rerender_in_background(root: Path) -> threading.Thread | None:
    """rerender_if_changed on a thread of its own, unless one is still running; the thread, when started.

    The pages it rewrites are under docs/, which `mkdocs serve` watches, so their rebuild follows by itself;
    inputs changed while it ran are seen by the rebuild after it (the fingerprint is taken again then).
    """
    global _render_thread
    if _render_thread is not None and _render_thread.is_alive():
        return None
    if _already_rendered(root, _inputs(root).render_fingerprint(root)):
        return None
    log.info("evidence inputs changed: re-rendering the evidence pages beside the server")
    _render_thread = threading.Thread(target=rerender_if_changed, args=(root,), name="kernel-lab-render",
                                      daemon=True)
    _render_thread.start()
    return _render_thread
