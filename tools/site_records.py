"""Which run records the Kernel Lab site publishes, and how (tools/mkdocs_hooks.py publishes them).

* The records that pages link, from records/ (repository root) at the same path in the site, as they are
  stored: records/<slug>/<run-id>.json.gz stays compressed, a plain <run-id>.json stays plain. The pages link
  the records their numbers come from (lab.publish.served); a record is published when a Markdown link or
  an href of any page under docs/ points at it, so a link and its file never part. Only files named as
  records are, never one behind a symbolic link.
* The host a record ran on is named by its alias in the site's copy, as on the pages
  (KERNEL_LAB_SHOW_HOSTS=1 keeps names); the rest of the record is unchanged.
* A record path a page shows as code (`records/<slug>/<file>`: a run the site does not serve) is linked to
  the repository's copy when mkdocs.yml's `extra.records_url` (KERNEL_LAB_RECORDS_URL) names where the
  repository's records/ folder is browsed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

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


def published_bytes(stored: bytes, compressed: bool) -> bytes:
    """The bytes the site serves for a record stored as `stored` (gzip-compressed or not)."""
    data = gzip.decompress(stored) if compressed else stored
    published = published_record(data)
    if published is data:  # nothing to alias: the stored bytes as they are
        return stored
    # mtime 0: the same record gives the same bytes on every build
    return gzip.compress(published, compresslevel=9, mtime=0) if compressed else published


# Aliasing a host re-writes and re-compresses the whole record (a quarter of a site build for 59 records), and
# gives the same bytes for the same stored bytes, code and setting: the result is kept in this folder of the
# repository root (git-ignored), named by the SHA-256 of all three. KERNEL_LAB_SITE_RECORD_CACHE=off turns it off;
# a folder path there moves it (as lab.cache_folder reads the lab's caches' settings).
CACHE_DIR = ".cache/site-records"


def _cache_entry(root: Path | None, stored: bytes, compressed: bool) -> Path | None:
    setting = os.environ.get("KERNEL_LAB_SITE_RECORD_CACHE", "").strip()
    if root is None or setting.lower() in ("off", "0", "no", "false"):
        return None
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"\0{os.environ.get(SHOW_HOSTS) == '1'}\0{compressed}\0".encode())
    digest.update(stored)
    return (Path(setting) if setting else root / CACHE_DIR) / digest.hexdigest()


class PublishedRecord(File):
    """A run record copied into the site as it is stored (a .json.gz stays compressed), its host aliased."""

    root: Path | None = None  # the repository root, whose .cache/ keeps published bytes (None: no cache)

    def copy_file(self, dirty: bool = False) -> None:
        if dirty and not self.is_modified():
            return
        os.makedirs(os.path.dirname(self.abs_dest_path), exist_ok=True)
        compressed = self.abs_src_path.endswith(".gz")
        with open(self.abs_src_path, "rb") as source:
            stored = source.read()
        entry = _cache_entry(self.root, stored, compressed)
        out_bytes = None
        if entry is not None:
            try:
                out_bytes = entry.read_bytes()
            except OSError:
                pass
        if out_bytes is None:
            out_bytes = published_bytes(stored, compressed)
            if entry is not None:
                _keep(entry, out_bytes)
        with open(self.abs_dest_path, "wb") as out:
            out.write(out_bytes)


def _keep(entry: Path, data: bytes) -> None:
    """Write a cache entry whole or not at all; a cache that cannot be written costs time, never the build."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".tmp-{os.getpid()}-{entry.name}")
        tmp.write_bytes(data)
        os.replace(tmp, entry)
    except OSError:
        pass


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
        record = PublishedRecord.generated(config, path.relative_to(root).as_posix(), abs_src_path=str(path))
        record.root = root
        files.append(record)
    seen: dict[str, str] = {}
    for f in files:
        run = f.src_uri.removesuffix(".gz")
        if run in seen:
            raise PluginError(f"{seen[run]} and {f.abs_src_path} both record the run {run.removesuffix('.json')}: "
                              "a run is recorded once, compressed or not; remove one of them.")
        seen[run] = f.abs_src_path
    return files
