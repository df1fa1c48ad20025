"""Helpers shared by the site tests: build the MkDocs site into a folder, load the tools/ scripts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

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
    """
    require_vendored_assets()
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if site_url:
        env["KERNEL_LAB_SITE_URL"] = site_url
    env.pop("TRITON_INTERPRET", None)  # the build imports no kernels; keep it independent of the test setup
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


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
