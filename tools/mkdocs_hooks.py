"""MkDocs hooks for the Kernel Lab site (mkdocs.yml: `hooks: [tools/mkdocs_hooks.py]`).

* Refuses to build without the vendored KaTeX and fonts (tools/vendor_assets.py): a site that would
  reach for a CDN, or show raw TeX, is worse than a clear error.
* Publishes the run records that pages link, from records/ (repository root) at the same path in the site,
  as they are stored: records/<slug>/<run-id>.json.gz stays compressed, a plain <run-id>.json stays plain.
  The pages link the records their numbers come from (the newest run of each experiment on each GPU, the
  run a profile comes from, a run a write-up cites: lab.publish.served) and name every other run by its
  path in the repository, which keeps every record; published, those would be most of the site's weight.
  A record is published when a Markdown link or an href of any page under docs/ points at it, so a link
  and its file never part, and `--strict` checks those links. The host a record ran on is named by its
  alias there, as on the pages (KERNEL_LAB_SHOW_HOSTS=1 keeps names), and the rest of the record is
  unchanged. Nothing else under records/ is published: another file, or one behind a symbolic link, is
  left out with a warning (which fails a --strict build). `mkdocs serve` watches records/ as soon as it
  exists.
* Links each record path a page shows as code (`records/<slug>/<file>`) to the repository's copy when
  mkdocs.yml's `extra.records_url` (KERNEL_LAB_RECORDS_URL) names where the repository's records/ folder
  is browsed; without it the path stays plain text.
* Lists every generated experiment and decision page under its section of the navigation, so adding an
  experiment touches one declaration and no configuration.
* Opens a notebook page whose saved outputs are missing or older than its code with a note saying so, and
  serves the stylesheet mkdocs-jupyter writes into it (over half a megabyte) as a file of its own.
* Expands the checked figures of hand-written pages (`{{ fig(...) }}`, `{{ claim(...) }}`: lab.publish.figures)
  from the records' verdicts, and fails the build naming page and line where a figure or claim no longer
  holds.
* Under `mkdocs serve`, re-renders the evidence pages (tools/build_results.py --render-only) whenever a
  record, a page template or a declaration changed, so the served site follows the evidence live. The render
  runs beside the server, never inside a rebuild: the site is served at once from the pages on disk, an
  edited post reloads without waiting for it, and the pages it rewrites trigger their own reload. What it
  last rendered from is kept in .cache/ (a digest of its inputs), so a restart with nothing changed renders
  nothing.
"""

from __future__ import annotations

import gzip
import hashlib
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
from mkdocs.structure.files import File, Files
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.kernel_lab")

RECORDS_DIR = "records"
# <slug>/<run-id>.json or .json.gz, with the names lab.evidence.checks accepts: nothing else under records/
# (an .html, an .svg) is ever published, whatever a folder of records holds.
_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"
RECORD_NAME = re.compile(rf"{_NAME}/[0-9]{{8}}T[0-9]{{6}}Z-{_NAME}\.json(?:\.gz)?")
# A page's link to a record: a Markdown link's target (inline or a reference definition) or an href, through
# any relative or absolute prefix ("../", "/"); group 1 is <slug>/<file>.
RECORD_LINK = re.compile(rf"(?:\]\(\s*<?|^\s*\[[^\]\n]+\]:\s*<?|href\s*=\s*[\"'])(?:\.{{0,2}}/)*records/({RECORD_NAME.pattern})",
                         re.MULTILINE)
# A record's path shown as code on a page, outside a link's text: linked to the repository's copy when
# mkdocs.yml names where its records/ folder is browsed (extra.records_url).
RECORD_PATH_CODE = re.compile(rf"(?<![\[`])`records/({RECORD_NAME.pattern})`(?![`\]])")
# A notebook page's inline stylesheets this long or longer are served as files (shared_styles), under this folder
# of the site.
INLINE_STYLE = re.compile(r'<style type="text/css">(.*?)</style>', re.DOTALL)
STYLE_KEPT_INLINE = 16_000
NOTEBOOK_STYLES = "assets/notebook"
# Navigation sections filled from the folder their index page lives in.
# The lab notebook's rounds are listed by its own index page (docs/probes/index.md), not in the navigation,
# which every page of the site carries: sixty rounds there weighed more than the pages themselves.
LISTED_SECTIONS = ("experiments", "decisions")
# What the evidence pages are rendered from; a change to any of them re-renders under `mkdocs serve`.
RENDER_INPUTS = ("records", "lab", "experiments", "kernels", "probes", "notes")
RENDER_COMMAND = ("tools/build_results.py", "--render-only")

# Where the digest of the inputs of the last successful render is kept, from the repository root.
FINGERPRINT_FILE = ".cache/kernel-lab/evidence-inputs.sha256"

# MkDocs loads this module once per process and keeps it across the rebuilds of `mkdocs serve`.
_serving = False
_rendered_fingerprint: str | None = None
_evidence: tuple[str, object] | None = None  # (render fingerprint, lab.publish.collect.Evidence)
_render_thread: threading.Thread | None = None


def project_root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _load_vendor_assets():
    """tools/vendor_assets.py, beside this file, as a module (tools/ is not a package)."""
    name = "kernel_lab_vendor_assets"
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "vendor_assets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is being built
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------------------


def on_startup(command: str, dirty: bool) -> None:
    global _serving
    _serving = command == "serve"


def on_config(config):
    root = project_root(config)
    records_url(config)  # an address that is not https: fails here, before anything is built
    records = root / RECORDS_DIR
    if records.is_dir() and str(records) not in config.watch:
        config.watch.append(str(records))  # `mkdocs serve` reloads when a run is recorded
    vendor = _load_vendor_assets()
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
    return nav


# --------------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------------


SHOW_HOSTS = "KERNEL_LAB_SHOW_HOSTS"  # as lab.publish.formatting.SHOW_HOSTS


def host_alias(name: str) -> str:
    """The alias the pages give a host (lab.publish.formatting.host_label, repeated here: the hook imports
    nothing of the lab's); a test holds the two equal."""
    return "host-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:6]


def published_record(data: bytes) -> bytes:
    """A record's bytes as the site serves them: the host it ran on named by its alias, unless
    KERNEL_LAB_SHOW_HOSTS=1 (the repository's record keeps the name). Anything else passes unchanged, bytes
    that are not a JSON object with a named host included."""
    if os.environ.get(SHOW_HOSTS) == "1":
        return data
    try:
        record = json.loads(data)
    except ValueError:
        return data
    env = record.get("environment") if isinstance(record, dict) else None
    if not isinstance(env, dict) or not isinstance(env.get("host"), str) or not env["host"]:
        return data
    env["host"] = host_alias(env["host"])
    return (json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


class PublishedRecord(File):
    """A run record copied into the site as it is stored (a .json.gz stays compressed), its host aliased."""

    def copy_file(self, dirty: bool = False) -> None:
        if dirty and not self.is_modified():
            return
        os.makedirs(os.path.dirname(self.abs_dest_path), exist_ok=True)
        compressed = self.abs_src_path.endswith(".gz")
        with open(self.abs_src_path, "rb") as source:
            stored = source.read()
        data = gzip.decompress(stored) if compressed else stored
        published = published_record(data)
        if published is data:  # nothing to alias: the stored bytes as they are
            out_bytes = stored
        else:  # mtime 0: the same record gives the same bytes on every build
            out_bytes = gzip.compress(published, compresslevel=9, mtime=0) if compressed else published
        with open(self.abs_dest_path, "wb") as out:
            out.write(out_bytes)


def linked_records(docs_dir: Path) -> set[str]:
    """<slug>/<file> of every record that a Markdown page under docs_dir links (RECORD_LINK): the records
    the site publishes. Generated snippets count too, as the pages that include them link what they do."""
    linked: set[str] = set()
    for path in sorted(docs_dir.rglob("*.md")) if docs_dir.is_dir() else ():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # MkDocs names a page it cannot read
        linked.update(match.group(1) for match in RECORD_LINK.finditer(text))
    return linked


def records_url(config) -> str | None:
    """Where the repository's records/ folder is browsed (mkdocs.yml extra.records_url, from
    KERNEL_LAB_RECORDS_URL), without a trailing slash; None when none is given. Only an https: address."""
    extra = getattr(config, "extra", None)
    url = extra.get("records_url") if hasattr(extra, "get") else None
    if not url:
        return None
    url = str(url).strip().rstrip("/")
    if not re.fullmatch(r"https://[^\s\"'<>()\[\]`]+", url):
        raise PluginError(f"extra.records_url (KERNEL_LAB_RECORDS_URL) must be an https: address, not {url!r}")
    return url


def link_record_paths(markdown: str, url: str | None, root: Path) -> str:
    """`markdown` with each record path shown as code (`records/<slug>/<file>`, RECORD_PATH_CODE) linked to
    the repository's copy at `url`/<slug>/<file>, when a url is given and the repository holds that record."""
    if not url or "`records/" not in markdown:
        return markdown

    def link(match: re.Match) -> str:
        name = match.group(1)
        if not (root / RECORDS_DIR / name).is_file():
            return match.group(0)
        return f"[{match.group(0)}]({url}/{name})"

    return RECORD_PATH_CODE.sub(link, markdown)


def record_files(root: Path, config) -> list[File]:
    """A site file for every run record under <root>/records/, at the same relative path in the site and
    copied as it is (a .json.gz record stays compressed); on_files keeps those that pages link."""
    base = root / RECORDS_DIR
    if not base.is_dir():
        return []
    files = []
    for path in sorted(base.rglob("*")):
        # hidden names are editor and OS droppings, or a record still being written, never records
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(base).parts):
            continue
        parts = path.relative_to(base).parts
        if any((base / Path(*parts[:i])).is_symlink() for i in range(1, len(parts) + 1)):
            log.warning(f"{path} lies behind a symbolic link: not published (a link could point anywhere)")
            continue
        if not RECORD_NAME.fullmatch("/".join(parts)):
            log.warning(f"{path} is not a run record (records/<slug>/<run-id>.json.gz): not published")
            continue
        files.append(PublishedRecord.generated(config, path.relative_to(root).as_posix(), abs_src_path=str(path)))
    seen: dict[str, str] = {}
    for f in files:
        run = f.src_uri.removesuffix(".gz")
        if run in seen:
            raise PluginError(f"{seen[run]} and {f.abs_src_path} both record the run {run.removesuffix('.json')}: "
                              "a run is recorded once, compressed or not; remove one of them.")
        seen[run] = f.abs_src_path
    return files


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
    figures = _project_module(root, "lab.publish.figures")
    if not figures.OPENING.search(markdown):
        return markdown  # most pages have none: no need to load the records
    whole = Path(path).read_text(encoding="utf-8") if path and Path(path).is_file() else markdown
    try:
        return figures.expand(markdown, evidence_for(root), source, figures.first_line_of(markdown, whole))
    except figures.FigureError as exc:
        raise PluginError(f"figures that the records do not bear out:\n{exc}") from None


def _project_module(root: Path, name: str):
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the checkout's own packages, whatever the environment has installed
    return importlib.import_module(name)


def evidence_for(root: Path):
    """Every record judged as build_results judges it, loaded once per change of the render's inputs."""
    global _evidence
    fingerprint = render_fingerprint(root)
    if _evidence is None or _evidence[0] != fingerprint:
        experiments = _project_module(root, "experiments").all_experiments()
        decisions = _project_module(root, "experiments.decisions").DECISIONS
        hashing = _project_module(root, "lab.evidence.hashing")
        hashes = {slug: hashing.source_hashes(e, root) for slug, e in experiments.items()}
        evidence = _project_module(root, "lab.publish.collect").collect_evidence(
            experiments, decisions, root / RECORDS_DIR, hashes, missing_ok=True)
        _evidence = (fingerprint, evidence)
    return _evidence[1]


# --------------------------------------------------------------------------------------------------------
# Live evidence under `mkdocs serve`
# --------------------------------------------------------------------------------------------------------


def render_fingerprint(root: Path) -> str:
    """A digest of the names, sizes and modification times of everything the evidence pages depend on."""
    h = hashlib.sha256()
    for top in RENDER_INPUTS:
        base = root / top
        if not base.exists():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                h.update(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _stored_fingerprint(root: Path) -> str | None:
    try:
        return (root / FINGERPRINT_FILE).read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _store_fingerprint(root: Path, fingerprint: str) -> None:
    try:
        path = root / FINGERPRINT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fingerprint + "\n", encoding="ascii")
    except OSError as exc:  # a read-only checkout still serves; it only renders again on the next start
        log.debug(f"could not keep the render's fingerprint: {exc}")


def rerender_if_changed(root: Path) -> bool:
    """Run the renderer when its inputs changed since the last successful render (of this process, or kept
    in FINGERPRINT_FILE by an earlier one); True if it ran and succeeded."""
    global _rendered_fingerprint
    fingerprint = render_fingerprint(root)
    if fingerprint in (_rendered_fingerprint, _stored_fingerprint(root)):
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
    _store_fingerprint(root, fingerprint)
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
    if render_fingerprint(root) in (_rendered_fingerprint, _stored_fingerprint(root)):
        return None
    log.info("evidence inputs changed: re-rendering the evidence pages beside the server")
    _render_thread = threading.Thread(target=rerender_if_changed, args=(root,), name="kernel-lab-render",
                                      daemon=True)
    _render_thread.start()
    return _render_thread
