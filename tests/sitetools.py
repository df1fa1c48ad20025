"""Helpers shared by the site tests: build the MkDocs site into a folder, load the tools/ scripts."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from warm_python import run_python

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
POSTS = DOCS / "posts"


def load_tool(name: str):
    """tools/<name>.py as a module (tools/ is not a package)."""
    module_name = f"kernel_lab_tool_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def load_check(name: str):
    """checks/<name>.py as a module (checks/ is a folder of scripts, not a package)."""
    module_name = f"kernel_lab_check_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "checks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


# The tools/ files `mkdocs build` loads (mkdocs.yml's hook and what it loads): what a sandboxed copy of the
# site needs beside its mkdocs.yml.
SITE_TOOLS = ("mkdocs_hooks.py", "site_records.py", "markdown_plain_text.py", "mkdocs_page_cache.py",
              "vendor_assets.py")
# A sandbox's build keeps its published records where the repository's builds do (tools/site_records.py names
# each by what it is made from, whatever the root), so the records a sandbox shares with the site are not
# published again.
SHARED_CACHES = {"KERNEL_LAB_SITE_RECORD_CACHE": os.environ.get("KERNEL_LAB_SITE_RECORD_CACHE")
                 or str(ROOT / ".cache" / "site-records")}


def require_vendored_assets() -> None:
    """Fail with the way out when KaTeX and the fonts have not been vendored (./dev.sh setup does it)."""
    missing = load_tool("vendor_assets").missing()
    if missing:
        import pytest

        pytest.fail(f"vendored assets missing ({', '.join(missing)}): run `python tools/vendor_assets.py`")


def build_site(site_dir: Path, site_url: str | None = None) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the repository's site into site_dir; returns the finished process.

    site_url: the address it will be served from (Material's instant navigation only follows links under
    the configured site_url).

    The pages' Markdown is converted once per content: a page that `./dev.sh site` (or an earlier build)
    converted from the same text, includes, file list, configuration and code is taken from the page cache
    (tools/mkdocs_page_cache.py, KERNEL_LAB_PAGE_CACHE=read). A page whose conversion warned is never kept
    there, so this build warns wherever a build converting every page would; every other stage of the build
    (hooks, checked figures, navigation, templates, the anchors links point to) runs in full.
    KERNEL_LAB_PAGE_CACHE=off converts every page.
    """
    require_vendored_assets()
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.setdefault("KERNEL_LAB_PAGE_CACHE", "read")
    if site_url:
        env["KERNEL_LAB_SITE_URL"] = site_url
    env.pop("TRITON_INTERPRET", None)  # the build judges records, it runs no kernel; as outside the tests
    return run_python(["-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)], cwd=ROOT, env=env,
                      timeout=600)


def front_matter(path: Path) -> dict:
    """The YAML front matter of a Markdown file ({} when it has none)."""
    import yaml

    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return {}
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end]) or {}


def posts(include_drafts: bool = True) -> list[Path]:
    found = sorted(POSTS.glob("*.md"))
    return found if include_drafts else [p for p in found if not front_matter(p).get("draft")]


def post_url(path: Path) -> str:
    """Site path of a post: the blog is configured with post_url_format "{slug}" under writeups/."""
    return f"writeups/{front_matter(path).get('slug', path.stem)}/"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shared_site(tmp_path_factory) -> tuple[Path, str]:
    """(folder, address): the one strict build of the site that every test of a run reads, made by whichever
    pytest-xdist worker asks first while the others wait on a file lock.

    It is built for http://127.0.0.1:<port>/ (a port free when the build started), the address the browser
    tests serve it from: Material's instant navigation follows only links its sitemap names, on that port.
    A failed build is remembered, so every test that needs the site fails with the same log instead of
    building again.
    """
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder the workers' own base folders share
    facts = root / "shared-site.json"
    with FileLock(str(root / "shared-site.lock")):
        if not facts.is_file():
            site_dir, url = root / "shared-site", f"http://127.0.0.1:{_free_port()}/"
            proc = build_site(site_dir, site_url=url)
            log = proc.stdout + proc.stderr
            warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
            problem = (f"mkdocs build --strict failed:\n{log[-4000:]}" if proc.returncode else
                       "the build warned:\n" + "\n".join(warnings) if warnings else "")
            facts.write_text(json.dumps({"dir": str(site_dir), "url": url, "problem": problem}), encoding="utf-8")
        built = json.loads(facts.read_text(encoding="utf-8"))
    if built["problem"]:
        import pytest

        pytest.fail(built["problem"], pytrace=False)
    return Path(built["dir"]), built["url"]
