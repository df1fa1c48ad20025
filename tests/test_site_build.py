"""The site: a strict MkDocs build with no warnings, drafts, the records hook, offline assets, and the
write-ups' own numbers checked against float64 and against the code they describe."""

from __future__ import annotations

import io
import json
import re
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sitetools import DOCS, ROOT, front_matter, load_tool, post_url, posts, require_vendored_assets, shared_site

hooks = load_tool("mkdocs_hooks")
vendor = load_tool("vendor_assets")


# --------------------------------------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """(folder, address) of the run's one strict build (sitetools.shared_site): no warnings, no errors."""
    return shared_site(tmp_path_factory)


@pytest.fixture(scope="module")
def site(built) -> Path:
    return built[0]


def test_navigation_sections_exist(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    tabs = re.findall(r'<a href="[^"]*" class="md-tabs__link">\s*(.*?)\s*</a>', home, flags=re.S)
    assert tabs == ["Home", "Write-ups", "Experiments", "Decisions", "Lab notebook", "Method"]


def test_every_probe_round_has_a_page_in_the_lab_notebook(site):
    from lab.publish.notebook import load_rounds

    rounds, problems = load_rounds(ROOT)
    assert rounds and problems == []
    index = (site / "probes" / "index.html").read_text(encoding="utf-8")
    for r in rounds:
        assert (site / "probes" / r.id / "index.html").is_file(), r.id
        assert f'href="{r.id}/"' in index, r.id


def test_every_published_post_is_built_and_drafts_are_not(site):
    published = posts(include_drafts=False)
    drafts = [p for p in posts() if p not in published]
    assert drafts, "seed 000 is kept as a draft post"
    for post in published:
        if "slug" in front_matter(post):
            assert (site / post_url(post) / "index.html").is_file(), post
    for draft in drafts:
        assert not (site / post_url(draft)).exists(), f"draft {draft.name} was published"
    index = (site / "writeups" / "index.html").read_text(encoding="utf-8")
    for draft in drafts:
        assert front_matter(draft)["slug"] not in index


def _blog_posts_as(command: str, tmp_path: Path) -> set[str]:
    """The posts Material's blog plugin keeps for `command` ("serve" or "build"): MkDocs run as that command
    up to the file stage, where the plugin drops the posts it will not render (no page is rendered)."""
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    require_vendored_assets()
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / command))
    config.plugins.on_startup(command=command, dirty=False)
    config.plugins["tools/mkdocs_hooks.py"]._serving = False  # no background re-render from this test
    try:
        config = config.plugins.on_config(config)
        config.plugins.on_files(get_files(config), config=config)
        return {post.file.src_uri for post in config.plugins["material/blog"].blog.posts}
    finally:
        config.plugins.on_shutdown()


def test_drafts_are_shown_by_mkdocs_serve_and_only_there(tmp_path, monkeypatch):
    # `mkdocs serve` starts its plugins with command="serve"; the blog then keeps drafts (the built site's
    # own check that drafts are not published is test_every_published_post_is_built_and_drafts_are_not).
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    drafts = {p.relative_to(DOCS).as_posix() for p in posts() if front_matter(p).get("draft")}
    assert drafts
    served, built = _blog_posts_as("serve", tmp_path), _blog_posts_as("build", tmp_path)
    assert drafts <= served and not drafts & built
    assert served - drafts == built


def test_posts_have_dates_tags_categories_and_an_excerpt():
    for post in posts():
        meta = front_matter(post)
        text = post.read_text(encoding="utf-8")
        assert meta.get("date"), post
        assert meta.get("tags") and meta.get("categories"), post
        assert "<!-- more -->" in text, f"{post.name} has no excerpt separator"


# --------------------------------------------------------------------------------------------------------
# Offline: nothing on a page reaches outside the site
# --------------------------------------------------------------------------------------------------------


class _Assets(HTMLParser):
    """Collects the URLs a page loads (scripts, stylesheets, icons, images), not the links it offers."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "source") and a.get("src"):
            self.urls.append(a["src"])
        if tag == "link" and a.get("href") and (a.get("rel") or "") in ("stylesheet", "icon", "preload", "modulepreload", "manifest"):
            self.urls.append(a["href"])


def test_no_page_loads_anything_from_another_host(site):
    offenders = []
    for page in site.rglob("*.html"):
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8"))
        offenders += [f"{page.relative_to(site)}: {u}" for u in parser.urls if re.match(r"^(https?:)?//", u)]
    for css in site.rglob("*.css"):
        offenders += [f"{css.relative_to(site)}: {u}"
                      for u in re.findall(r"url\(\s*['\"]?((?:https?:)?//[^'\")]+)", css.read_text(encoding="utf-8"))]
    assert not offenders, "assets from the network:\n" + "\n".join(offenders)


def test_math_and_fonts_are_served_by_the_site(site):
    for rel in ("assets/vendor/katex/katex.min.js", "assets/vendor/katex/katex.min.css",
                "assets/vendor/katex/contrib/auto-render.min.js", "assets/javascripts/katex-init.js"):
        assert (site / rel).is_file(), rel
    css = (site / "assets/vendor/katex/katex.min.css").read_text(encoding="utf-8")
    for font in set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css)):
        assert (site / "assets/vendor/katex" / font).is_file(), font
    extra = (site / "assets/stylesheets/extra.css").read_text(encoding="utf-8")
    fonts = re.findall(r'url\("\.\./(vendor/fonts/[^"]+)"\)', extra)
    assert fonts
    for font in fonts:
        assert (site / "assets" / font).is_file(), font


def test_generated_snippets_are_not_pages_of_their_own(site):
    assert not (site / "generated").exists()


def test_generated_pages_are_titled_by_their_heading(site):
    html = (site / "experiments" / "index.html").read_text(encoding="utf-8")
    for page in sorted((DOCS / "experiments").glob("*.md")):
        if page.name == "index.md":
            continue
        title = hooks.heading_after_comments(page.read_text(encoding="utf-8"))
        assert title, f"{page} has no heading"
        # listed in the Experiments section of the navigation, under its own title
        assert re.search(rf'href="{re.escape(page.stem)}/"[^>]*>\s*<span class="md-ellipsis">\s*{re.escape(title)}', html), page


def test_a_build_without_an_address_points_nowhere_else(built, monkeypatch):
    # Without KERNEL_LAB_SITE_URL the configuration names no address, so MkDocs writes no canonical link and
    # an empty sitemap. The address a build is given appears only in those two places: no page carries it
    # elsewhere, so no page sends a reader to a host that served some earlier build.
    from mkdocs.config import load_config

    monkeypatch.delenv("KERNEL_LAB_SITE_URL", raising=False)
    assert load_config(str(ROOT / "mkdocs.yml")).site_url is None
    site, url = built
    canonical = re.compile(r'<link rel="canonical" href="' + re.escape(url) + r'[^"]*">')
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert page.name == "404.html" or canonical.search(html), f"{page}: no canonical link to {url}"
        rest = canonical.sub("", html)
        assert url.rstrip("/") not in rest and "localhost:" not in rest, page
    locs = re.findall(r"<loc>([^<]*)</loc>", (site / "sitemap.xml").read_text(encoding="utf-8"))
    assert locs and all(loc.startswith(url) for loc in locs), locs[:5]


HOST_PATHS = re.compile(r"--records-dir|--docs-dir|/root/|/opt/|/home/|/tmp/|/usr/local/")


def test_generated_pages_show_commands_without_the_hosts_paths():
    found = []
    for page in sorted((DOCS / "experiments").glob("*.md")) + sorted((DOCS / "generated").glob("*.md")):
        found += [f"{page.relative_to(ROOT)}: {m.group(0)}" for m in HOST_PATHS.finditer(page.read_text(encoding="utf-8"))]
    assert not found, found[:10]


def test_markdown_sources_hold_no_control_characters():
    # A literal carriage return once turned "\\rangle" into a line break and "angle"; a control character in a
    # source is never meant.
    bad = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for lineno, line in enumerate(text.split("\n"), 1):
            for ch in line:
                if ord(ch) < 32 and ch != "\t":
                    bad.append(f"{page.relative_to(ROOT)}:{lineno}: control character {ch!r}")
    assert not bad, "\n".join(bad)


def test_the_control_character_check_can_fail(tmp_path):
    text = "sums of $\\langle dy, y \rangle$"  # what a "\\r" read as an escape leaves behind
    assert any(ord(ch) < 32 and ch != "\t" for line in text.split("\n") for ch in line)


def test_declarations_label_figures_from_outside_the_records():
    # Prose in a declaration may mention a GPU that has no record only to say so; counts of GPUs and what
    # ran where are generated from the records on each page.
    from experiments import all_experiments

    named_gpu = re.compile(r"\b(A10G|A100|H100|H200|L4|L40S|T4|V100)\b")
    count = re.compile(r"\b(one|a single|two) GPU models?\b", re.IGNORECASE)
    problems = []
    for slug, e in all_experiments().items():
        for field in ("question", "why", "evidence_boundary", "focus"):
            text = getattr(e, field)
            if named_gpu.search(text) and "no record" not in text:
                problems.append(f"{slug}.{field} names a GPU without saying the figure has no record")
            if count.search(text):
                problems.append(f"{slug}.{field} states a GPU count: {count.search(text).group(0)!r}")
    assert not problems, problems


# --------------------------------------------------------------------------------------------------------
# The hook, on its own
# --------------------------------------------------------------------------------------------------------


def _config(root: Path, linking: tuple[str, ...] = ("records/softmax-x/20261101T000000Z-abc.json",
                                                    "records/softmax-x/20261101T000000Z-abc.json.gz")):
    """A configuration for the hook, with a page under docs/ that links each record in `linking`."""
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "page.md").write_text("".join(f"[run](../{name})\n" for name in linking))
    return SimpleNamespace(config_file_path=str(root / "mkdocs.yml"), site_dir=str(root / "site"),
                           docs_dir=str(root / "docs"), use_directory_urls=True,
                           plugins=SimpleNamespace(_current_plugin="hooks"))


def test_records_are_published_at_their_own_path(tmp_path):
    from mkdocs.structure.files import Files

    (tmp_path / "records" / "softmax-x").mkdir(parents=True)
    record = tmp_path / "records" / "softmax-x" / "20261101T000000Z-abc.json"
    record.write_text('{"schema": 1}\n')
    (tmp_path / "records" / "softmax-x" / ".run.json.tmp").write_text("partial")
    files = hooks.on_files(Files([]), config=_config(tmp_path))
    published = {f.src_uri: f for f in files}
    assert list(published) == ["records/softmax-x/20261101T000000Z-abc.json"]
    f = published["records/softmax-x/20261101T000000Z-abc.json"]
    assert f.dest_uri == "records/softmax-x/20261101T000000Z-abc.json"
    assert f.abs_src_path == str(record)
    assert f.url == "records/softmax-x/20261101T000000Z-abc.json"


def test_compressed_records_are_published_compressed_at_their_own_path(tmp_path):
    import gzip

    from mkdocs.structure.files import Files

    (tmp_path / "records" / "softmax-x").mkdir(parents=True)
    text = '{"schema_version": 1}\n'
    stored = tmp_path / "records" / "softmax-x" / "20261101T000000Z-abc.json.gz"
    stored.write_bytes(gzip.compress(text.encode()))
    config = _config(tmp_path)
    (f,) = hooks.on_files(Files([]), config=config)
    assert f.src_uri == f.dest_uri == "records/softmax-x/20261101T000000Z-abc.json.gz"
    f.copy_file()
    assert Path(f.abs_dest_path).read_bytes() == stored.read_bytes()
    assert gzip.decompress(Path(f.abs_dest_path).read_bytes()).decode() == text
    (tmp_path / "records" / "softmax-x" / "20261101T000000Z-abc.json").write_text(text)
    with pytest.raises(Exception, match="both record the run"):
        hooks.on_files(Files([]), config=config)


def test_only_record_files_are_published_and_never_through_a_link(tmp_path, caplog):
    from mkdocs.structure.files import Files

    folder = tmp_path / "records" / "softmax-x"
    folder.mkdir(parents=True)
    (folder / "20261101T000000Z-abc.json").write_text("{}")
    (folder / "evil.html").write_text("<script>alert(1)</script>")
    (folder / "20261101T000000Z-abc.svg").write_text("<svg/>")
    (tmp_path / "secret.txt").write_text("secret")
    (folder / "20261102T000000Z-abc.json").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "records" / "linked").symlink_to(folder)
    files = hooks.on_files(Files([]), config=_config(tmp_path))
    assert [f.src_uri for f in files] == ["records/softmax-x/20261101T000000Z-abc.json"]
    assert "evil.html is not a run record" in caplog.text and "lies behind a symbolic link" in caplog.text


def test_only_the_records_pages_link_are_published(tmp_path):
    from mkdocs.structure.files import Files

    folder = tmp_path / "records" / "softmax-x"
    folder.mkdir(parents=True)
    names = [f"2026110{i}T000000Z-abc.json.gz" for i in range(1, 7)]
    for name in names:
        (folder / name).write_bytes(b"")
    (tmp_path / "docs" / "points").mkdir(parents=True)
    (tmp_path / "docs" / "points" / "p.md").write_text(
        f"| [`abc`](../../records/softmax-x/{names[0]}) |\n"  # a Markdown link, two folders down
        f'<a href="/records/softmax-x/{names[1]}">raw</a>\n'  # an href, from the docs root
        f"[ref]: ../records/softmax-x/{names[2]}\n"  # a reference definition
        f"The history's path, not a link: `records/softmax-x/{names[3]}`\n"
        f"[run](https://example.org/records/softmax-x/{names[4]})\n"  # another host's copy
    )
    config = _config(tmp_path, linking=())
    assert sorted(f.src_uri for f in hooks.on_files(Files([]), config=config)) == \
        [f"records/softmax-x/{n}" for n in names[:3]]
    assert hooks.linked_records(tmp_path / "nowhere") == set()


def test_record_paths_link_the_repository_only_when_its_address_is_given(tmp_path):
    from mkdocs.exceptions import PluginError

    (tmp_path / "records" / "s").mkdir(parents=True)
    (tmp_path / "records" / "s" / "20261101T000000Z-r.json.gz").write_bytes(b"")
    held, gone = "records/s/20261101T000000Z-r.json.gz", "records/s/20261102T000000Z-r.json.gz"
    page = f"| `{held}` | superseded |\n[`{held}`](../{held}) and `{gone}`\n"
    assert hooks.link_record_paths(page, None, tmp_path) == page
    url = "https://example.org/lab/blob/main/records"
    assert hooks.link_record_paths(page, url, tmp_path) == (
        f"| [`{held}`]({url}/s/20261101T000000Z-r.json.gz) | superseded |\n[`{held}`](../{held}) and `{gone}`\n")
    assert hooks.records_url(SimpleNamespace(extra={"records_url": url + "/"})) == url
    assert hooks.records_url(SimpleNamespace(extra={"records_url": None})) is None
    for bad in ("http://example.org/records", "javascript:alert(1)", "https://x.org/a b"):
        with pytest.raises(PluginError, match="https"):
            hooks.records_url(SimpleNamespace(extra={"records_url": bad}))


def test_a_notebook_pages_large_stylesheet_is_served_as_a_file(tmp_path):
    theme = ".jupyter-wrapper{--x: url(data:image/png;base64,AAAA)}" * 400
    small = "pre { line-height: 125%; }"
    html = (f'<style type="text/css">{small}</style><style type="text/css">\n{theme}\n</style>'
            f'<div class="jupyter-wrapper">cells</div><style type="text/css">{theme}</style>')
    out = hooks.shared_styles(html, "notebooks/softmax-from-scratch/", str(tmp_path))
    (css,) = (tmp_path / "assets" / "notebook").iterdir()
    assert css.read_text(encoding="utf-8") == theme + "\n"
    link = f'<link rel="stylesheet" href="../../assets/notebook/{css.name}">'
    assert out == f'<style type="text/css">{small}</style>{link}<div class="jupyter-wrapper">cells</div>{link}', \
        "the small one stays inline; the theme is linked where it stood, one file for both"


def test_the_site_weighs_what_its_pages_need(site):
    heavy = [f"{p.relative_to(site)}: {p.stat().st_size:,}" for p in site.rglob("*.html") if p.stat().st_size > 250_000]
    assert heavy == [], "pages over 250 kB of HTML"
    served = {p.relative_to(site / "records").as_posix() for p in (site / "records").rglob("*") if p.is_file()}
    assert served == hooks.linked_records(DOCS), "exactly the records the pages link"
    assert len(served) < sum(1 for p in (ROOT / "records").rglob("*.json*")), "superseded runs stay in the repository"


def test_a_docs_file_shadowing_a_record_is_refused(tmp_path):
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    (tmp_path / "records" / "s").mkdir(parents=True)
    (tmp_path / "records" / "s" / "20261101T000000Z-r.json").write_text("{}")
    clash = File("records/s/20261101T000000Z-r.json", str(tmp_path / "docs"), str(tmp_path / "site"), True)
    with pytest.raises(PluginError, match="collides"):
        hooks.on_files(Files([clash]), config=_config(tmp_path))


def test_no_records_folder_publishes_nothing(tmp_path):
    from mkdocs.structure.files import Files

    assert list(hooks.on_files(Files([]), config=_config(tmp_path))) == []


def test_the_build_refuses_to_run_without_vendored_assets(tmp_path):
    from mkdocs.exceptions import PluginError

    config = SimpleNamespace(config_file_path=str(ROOT / "mkdocs.yml"), docs_dir=str(tmp_path / "docs"), watch=[])
    with pytest.raises(PluginError, match="vendor_assets.py"):
        hooks.on_config(config)


def test_serve_watches_records_once_they_exist(tmp_path):
    require_vendored_assets()
    config = SimpleNamespace(config_file_path=str(tmp_path / "mkdocs.yml"), docs_dir=str(DOCS), watch=["experiments"])
    hooks.on_config(config)
    assert config.watch == ["experiments"]  # no records yet: nothing MkDocs would refuse
    (tmp_path / "records").mkdir()
    hooks.on_config(config)
    hooks.on_config(config)
    assert config.watch == ["experiments", str(tmp_path / "records")]


@pytest.mark.parametrize(
    "markdown, title",
    [
        ("<!-- generated -->\n\n# Softmax forward sweep\n\ntext", "Softmax forward sweep"),
        ("<!-- a -->\n<!-- b\nc -->\n# Two comments #\n", "Two comments"),
        ("# Plain heading\n", None),  # MkDocs handles a heading that opens the page itself
        ("<!-- generated -->\n\nSome text\n\n# Late heading\n", None),
        ("<!-- never closed\n# Heading\n", None),
    ],
)
def test_heading_after_comments(markdown, title):
    assert hooks.heading_after_comments(markdown) == title


def test_serve_rerenders_only_when_the_evidence_inputs_change(tmp_path, monkeypatch):
    (tmp_path / "tools").mkdir()
    (tmp_path / "records" / "x").mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    # A stand-in renderer that counts its runs and checks the flag it is given.
    (tmp_path / "tools" / "build_results.py").write_text(
        "import sys\n"
        "assert sys.argv[1:] == ['--render-only'], sys.argv\n"
        f"open({str(calls)!r}, 'a').write('run\\n')\n"
    )
    monkeypatch.setattr(hooks, "_rendered_fingerprint", None)
    runs = lambda: calls.read_text().count("run") if calls.exists() else 0  # noqa: E731

    assert hooks.rerender_if_changed(tmp_path) and runs() == 1
    assert not hooks.rerender_if_changed(tmp_path) and runs() == 1  # nothing changed: no render, no loop
    (tmp_path / "records" / "x" / "new.json").write_text("{}")
    assert hooks.rerender_if_changed(tmp_path) and runs() == 2
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "e.py").write_text("X = 1\n")
    assert hooks.rerender_if_changed(tmp_path) and runs() == 3
    # A new server process (nothing in memory) finds the inputs of the last render kept on disk: no render.
    monkeypatch.setattr(hooks, "_rendered_fingerprint", None)
    assert not hooks.rerender_if_changed(tmp_path) and runs() == 3
    (tmp_path / "records" / "x" / "new.json").write_text("{ }")
    thread = hooks.rerender_in_background(tmp_path)
    assert thread is not None
    thread.join(timeout=60)
    assert runs() == 4 and hooks.rerender_in_background(tmp_path) is None


def test_a_failing_renderer_is_reported_not_raised(tmp_path, monkeypatch, caplog):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "build_results.py").write_text("import sys\nsys.exit('bad record')\n")
    monkeypatch.setattr(hooks, "_rendered_fingerprint", None)
    assert not hooks.rerender_if_changed(tmp_path)
    assert "bad record" in caplog.text


# --------------------------------------------------------------------------------------------------------
# Vendored assets
# --------------------------------------------------------------------------------------------------------


def test_every_pinned_package_is_installed():
    assert vendor.missing() == [], "run python tools/vendor_assets.py"


def _fake_package(tmp_path: Path, monkeypatch) -> "vendor.Package":
    """A local npm-style tarball (no network), with the vendor module pointed at tmp_path."""
    monkeypatch.setattr(vendor, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(vendor, "VENDOR_DIR", tmp_path / "vendor")
    (tmp_path / "cache").mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {"package/dist/lib.js": b"lib", "package/dist/fonts/a.woff2": b"a",
                           "package/dist/fonts/b.woff2": b"b", "package/LICENSE": b"MIT"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    pkg = vendor.Package("@demo/lib", "1.0.0", "", "demo",
                         (("dist/lib.js", "lib.js"), ("dist/fonts/", "fonts/"), ("LICENSE", "LICENSE")))
    pkg.tarball.write_bytes(buf.getvalue())
    return vendor.Package(pkg.name, pkg.version, vendor.sri_sha512(pkg.tarball), pkg.dest, pkg.files)


def test_install_unpacks_the_selected_files_and_stamps_them(tmp_path, monkeypatch):
    pkg = _fake_package(tmp_path, monkeypatch)
    assert not vendor.is_installed(pkg, tmp_path / "vendor")
    vendor.install(pkg, tmp_path / "vendor")
    dest = tmp_path / "vendor" / "demo"
    assert (dest / "lib.js").read_bytes() == b"lib"
    assert sorted(p.name for p in (dest / "fonts").iterdir()) == ["a.woff2", "b.woff2"]
    assert vendor.is_installed(pkg, tmp_path / "vendor")
    stamp = json.loads((dest / vendor.STAMP).read_text())
    assert stamp["spec"] == "@demo/lib@1.0.0" and "fonts/b.woff2" in stamp["files"]
    (dest / "fonts" / "a.woff2").unlink()  # a lost file means a reinstall
    assert not vendor.is_installed(pkg, tmp_path / "vendor")


def test_a_tarball_with_the_wrong_integrity_is_refused_and_nothing_changes(tmp_path, monkeypatch):
    good = _fake_package(tmp_path, monkeypatch)
    vendor.install(good, tmp_path / "vendor")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "vendor").rglob("*"))
    tampered = vendor.Package(good.name, good.version, "sha512-AAAA", good.dest, good.files)
    monkeypatch.setattr(vendor.shutil, "which", lambda name: None)  # the cached copy is all there is
    with pytest.raises(vendor.VendorError, match="npm is not installed"):
        vendor.install(tampered, tmp_path / "vendor")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "vendor").rglob("*")) == before
    assert vendor.is_installed(good, tmp_path / "vendor")


def test_a_missing_file_in_the_tarball_is_named(tmp_path, monkeypatch):
    good = _fake_package(tmp_path, monkeypatch)
    broken = vendor.Package(good.name, good.version, good.integrity, good.dest, (("dist/nope.js", "nope.js"),))
    with pytest.raises(vendor.VendorError, match="no file 'dist/nope.js'"):
        vendor.install(broken, tmp_path / "vendor")
    assert not (tmp_path / "vendor" / "demo").exists()


def test_check_mode_reports_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vendor, "VENDOR_DIR", tmp_path / "empty")
    assert vendor.main(["--check"]) == 1
    assert "katex@" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------
# The write-ups: every number they print is checked, and none is a typed measurement
# --------------------------------------------------------------------------------------------------------

X = np.array([[1.0, 2.0, 3.0], [1.0, 3.0, 5.0]])
DO = np.array([[0.1, 0.2, 0.7], [0.2, 0.3, 0.5]])


def _worked_example():
    m = X.max(axis=1, keepdims=True)
    e = np.exp(X - m)
    d = e.sum(axis=1, keepdims=True)
    o = e / d
    s = (o * DO).sum(axis=1, keepdims=True)
    return {"E": e, "d": d, "O": o, "OdO": o * DO, "s": s, "centred": DO - s, "dX": o * (DO - s),
            "J1": np.diag(o[0]) - np.outer(o[0], o[0])}


def _matrix_rows(a: np.ndarray) -> list[str]:
    """The LaTeX rows "0.0900 & 0.2447 & 0.6652" of a matrix, four decimals."""
    return [" & ".join(f"{v:.4f}" for v in row) for row in np.atleast_2d(a)]


def _normalise(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text)


def test_softmax_post_prints_the_float64_worked_example():
    text = _normalise((DOCS / "posts" / "softmax.md").read_text(encoding="utf-8"))
    ex = _worked_example()
    for key in ("E", "O"):
        for row in _matrix_rows(ex[key]):
            assert row in text, (key, row)
    assert r"\begin{bmatrix} 1.5032 \\ 1.1537 \end{bmatrix}" in text


def test_gradient_post_prints_the_float64_backward_example():
    text = _normalise((DOCS / "posts" / "softmax-gradient.md").read_text(encoding="utf-8"))
    ex = _worked_example()
    for key in ("O", "OdO", "centred", "dX"):
        for row in _matrix_rows(ex[key]):
            assert row in text, (key, row)
    assert r"\begin{bmatrix} 0.5236 \\ 0.4718 \end{bmatrix}" in text
    for row in _matrix_rows(ex["J1"]):
        assert re.sub(r" +", " ", row) in re.sub(r" +", " ", text), ("J1", row)
    np.testing.assert_allclose(ex["J1"].T @ DO[0], ex["dX"][0], atol=1e-12)  # the Jacobian agrees
    np.testing.assert_allclose(ex["dX"].sum(axis=1), 0, atol=1e-12)  # rows of dX sum to zero, as written


def test_online_post_prints_the_recurrence_as_computed():
    text = (DOCS / "posts" / "online-softmax.md").read_text(encoding="utf-8")
    m, d, states = -np.inf, 0.0, []
    for x in X[1]:
        m_new = max(m, x)
        d = d * np.exp(m - m_new) + np.exp(x - m_new)
        m = m_new
        states.append((m, d))
    assert [f"{d:.4f}" for _, d in states] == ["1.0000", "1.1353", "1.1537"]
    assert "(3,\\, 1.1353)" in text and "(5,\\, 1.1353 \\cdot e^{-2} + 1) = (5,\\, 1.1537)" in text
    assert abs(states[-1][1] - _worked_example()["d"][1, 0]) < 1e-12


def _table_rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header line starts with header_start."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_tuning_post_settings_tables_match_the_code():
    from kernels.softmax import plan_softmax

    text = (DOCS / "posts" / "tuning-softmax.md").read_text(encoding="utf-8")
    rows = _table_rows(text, "| row length $N$")
    assert len(rows) >= 5
    for n, block_n, tail, warps, per_program, per_thread in rows:
        plan = plan_softmax(4096, int(n), torch.float32, "single_block")
        assert (plan.block_n, plan.tail_n, plan.num_warps, plan.rows_per_program) == (
            int(block_n.strip("`")), int(tail), int(warps), int(per_program)
        ), (
            f"docs/posts/tuning-softmax.md says N = {n} runs with BLOCK_N {block_n}, a {tail}-lane tail, {warps} "
            f"warps, {per_program} rows per program, but kernels/softmax.py plans {plan}: update the post's table"
        )
        assert float(per_thread) == plan.rows_per_program * (plan.block_n + plan.tail_n) / (32 * plan.num_warps)
    for dtype_cell, block_n, warps in _table_rows(text, "| element type"):
        for name in re.findall(r"float16|bfloat16|float32", dtype_cell):
            plan = plan_softmax(4096, 1 << 18, getattr(torch, name), "online")
            assert (plan.block_n, plan.num_warps) == (int(block_n), int(warps)), (name, plan)


def test_fusion_post_byte_table_follows_from_the_byte_counts():
    text = (DOCS / "posts" / "kernel-fusion.md").read_text(encoding="utf-8")
    k, n, size = 4096, 12288, 2
    for m, unfused, fused, share, intensity in _table_rows(text, "| tokens $M$"):
        m = int(m)
        b_unfused = (3 * m * k + n * k + m * n + k) * size
        b_fused = (m * k + n * k + m * n + k) * size
        assert unfused == f"{b_unfused / 1e6:.1f} MB" and fused == f"{b_fused / 1e6:.1f} MB", m
        assert abs(float(share.rstrip("%")) - 100 * (b_unfused - b_fused) / b_unfused) < 0.05 * max(1, float(share.rstrip("%")))
        assert int(intensity) == round(2 * m * n * k / b_fused), m


# A measured figure typed into prose: a bandwidth, a latency, or a share of the copy ceiling.
TYPED_MEASUREMENT = re.compile(
    r"\d[\d,.]*\s*(?:GB/s|TB/s|µs|us\b|ms\b|TFLOP/s)|\d[\d,.]*\s*%\s*of\s+(?:the\s+)?(?:copy\s+)?(?:ceiling|peak)",
    re.IGNORECASE,
)


def test_no_write_up_types_a_measured_number():
    pages = [*posts(), DOCS / "index.md", DOCS / "method.md", DOCS / "notebooks" / "index.md"]
    found = []
    for page in pages:
        body = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code is not prose
        found += [f"{page.relative_to(ROOT)}: {m.group(0)!r}" for m in TYPED_MEASUREMENT.finditer(body)]
    assert not found, "measured figures must be included from docs/generated/, not typed:\n" + "\n".join(found)


def test_the_typed_measurement_check_can_fail():
    assert TYPED_MEASUREMENT.search("PyTorch ran at 334.4 GB/s")
    assert TYPED_MEASUREMENT.search("the kernel took 14.7 µs")
    assert TYPED_MEASUREMENT.search("97% of the copy ceiling")
    assert not TYPED_MEASUREMENT.search("65504 is the largest float16; 2·M·N·size bytes")


def test_write_ups_include_existing_generated_snippets():
    includes = []
    for page in [*posts(), DOCS / "index.md", DOCS / "method.md"]:
        includes += [(page, inc) for inc in re.findall(r'--8<-- "([^"]+)"', page.read_text(encoding="utf-8"))]
    assert includes
    for page, inc in includes:
        assert inc.startswith("docs/generated/"), (page, inc)
        assert (ROOT / inc).is_file(), f"{page.name} includes {inc}: run python tools/build_results.py --render-only"


def test_per_point_pages_are_left_out_of_the_search_index(site):
    # Their tables are numbers a reader reaches from the experiment's page; indexed, they were half of the
    # index every page loads. The experiment pages themselves stay searchable.
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    locations = [doc["location"] for doc in index["docs"]]
    assert (site / "points").is_dir() and not [loc for loc in locations if loc.startswith("points/")]
    assert any(loc.startswith("experiments/softmax-fwd-sweep/") for loc in locations)


def test_the_other_clock_folds_away_below_the_claims_clock():
    # An evidence page shows the plots and tables of its claim's clock; the other clock's fold into one block.
    checked = 0
    for page in sorted((DOCS / "experiments").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        marks = [text.find("{ #clock-gpu-time }"), text.find("{ #clock-eager-call }")]
        if min(marks) < 0:
            continue
        first, second = text[min(marks):max(marks)], text[max(marks):text.index("## Decision rule")]
        assert "![Speedup" in first and "plots and points, GPUs side by side" not in first, page
        folded = second.split('??? info "', 1)
        assert len(folded) == 2 and "plots and points, GPUs side by side" in folded[1].split("\n", 1)[0], page
        assert "![Speedup" not in folded[0], f"{page}: a plot of the other clock outside its fold"
        checked += 1
    assert checked >= 10


def test_a_sandboxed_site_copies_every_tool_the_hook_loads():
    """The hostile-site tests build a copy of the site from SITE_TOOLS: a tool the hook loads and the list
    lacks would fail every such build before a page is made."""
    from sitetools import SITE_TOOLS

    source = (ROOT / "tools" / "mkdocs_hooks.py").read_text(encoding="utf-8")
    loaded = {f"{name}.py" for name in re.findall(r'_load_tool\("(\w+)"\)', source)}
    assert loaded and {"mkdocs_hooks.py", *loaded} <= set(SITE_TOOLS)
