"""The built site in a real browser: Debian's Chromium headless shell, driven by Playwright.

The run's one build of the site (sitetools.shared_site) is served on 127.0.0.1 at the port it was built for.
Pages must load with no console error and no request leaving the machine, typeset all of their math, load
all of their images, and link only to pages that exist; reader pages must show the point, speedup and word
of every table at a phone's width and a desktop's; plot text must not collide; the search must find the
online-softmax write-up. Screenshots of the home page and of one evidence page are saved (to
KERNEL_LAB_SCREENSHOTS as well, when that is set).

What is visited: each page is opened once per width, and every check of that width reads the same visit
(the `observed` fixture). Every page at 1440 px, except the per-point pages and the lab notebook's rounds,
which are made from one template each and differ only in their data: of those, each experiment's longest
per-point page on each clock, and the longest and shortest rounds. Checks that need no browser (links,
image files, TeX left unrendered in the HTML, weights) read every page.

The browser is Chromium's headless shell (Debian's chromium-headless-shell): the same engine as Chromium
(Blink, V8, the same version), without the browser's own user interface, and what Playwright runs for
headless Chromium by default. The full browser in headless mode builds its windows' interface as well (the
omnibox's popups are web pages of their own, one renderer each) for every browser context the tests open:
the same tests took 205 CPU seconds there against 144 here (one process, 2 cores).

Without /usr/bin/chromium-headless-shell these tests skip on a developer's machine and fail in CI (CI=true).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from sitetools import build_site, shared_site

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium-headless-shell"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
EVIDENCE_PAGE = "experiments/softmax-row-fusion/"
SWEEP_PAGE = "experiments/softmax-fwd-sweep/"
WIDTHS = {"desktop": 1440, "phone": 390}
ARTIFACTS = Path(__file__).resolve().parents[1] / ".pytest-artifacts" / "screenshots"


def _require_chromium() -> None:
    if Path(CHROMIUM).is_file():
        return
    message = f"{CHROMIUM} is missing: install Debian's chromium-headless-shell package (./dev.sh test does it as root)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the built site quietly. Its files do not change while the tests run, so the browser may keep
    each one for the run instead of asking again on every page (the stylesheets, scripts and fonts every page
    loads)."""

    def log_message(self, *args):
        pass

    def end_headers(self):
        self.send_header("Cache-Control", "max-age=3600")
        super().end_headers()


def _server(site_dir: Path, port: int) -> http.server.ThreadingHTTPServer:
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Quiet, directory=str(site_dir)))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(site folder, base URL): the run's shared build, served at the address it was built for. Should that
    port have been taken since, a build of its own for a port this process holds."""
    site_dir, base = shared_site(tmp_path_factory)
    try:
        server = _server(site_dir, urlsplit(base).port)
    except OSError:
        site_dir = tmp_path_factory.mktemp("browser-site")
        server = _server(site_dir, 0)
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        proc = build_site(site_dir, site_url=base)
        assert proc.returncode == 0, f"mkdocs build --strict failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site_dir, base
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def site(served) -> Path:
    return served[0]


@pytest.fixture(scope="module")
def base_url(served) -> str:
    return served[1]


@pytest.fixture(scope="module")
def browser():
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# How often a wait asks the page whether it is ready, in ms. Playwright's default asks on every animation frame,
# which has the browser draw a frame for each question: at 20 ms the 112 visits of `observed` took 71 s instead
# of 84 (one process, 2 cores).
POLL_MS = 20

# True once every formula on the page is typeset (at once on a page without math).
TYPESET = """() => Array.from(document.querySelectorAll(".arithmatex")).every((el) => el.querySelector(".katex, .katex-error"))"""


# Click a link to `href` as a reader would, marking the article being left so its replacement can be told apart.
FOLLOW = """(href) => {
  const article = document.querySelector("article");
  if (article) article.dataset.left = "1";
  const link = Object.assign(document.createElement("a"), {href});
  document.body.appendChild(link);
  link.click();
  link.remove();
}"""

# Every plain table of the article (Material's selector) sits in the scrolling box Material's script wraps it in once the page is mounted
# (after a load, and again after each instant navigation): a table measured before then has no box to scroll in.
WRAPPED = """Array.from(document.querySelectorAll("article table:not([class])")).every((t) => t.closest(".md-typeset__scrollwrap"))"""

# The page at `href` has arrived: its own article is in place, its images are loaded, its math typeset and its
# tables wrapped.
ARRIVED = """(href) => {
  const article = document.querySelector("article");
  return location.href === href && article && !article.dataset.left
    && Array.from(document.images).every((img) => img.complete)
    && Array.from(document.querySelectorAll(".arithmatex")).every((el) => el.querySelector(".katex, .katex-error"))
    && """ + WRAPPED + """;
}"""

# A page opened afresh is ready: its math typeset and its tables wrapped.
READY = "() => (" + TYPESET + ")() && " + WRAPPED


class Visit:
    """A browser page that records console errors, uncaught exceptions and any request off the site."""

    def __init__(self, browser, base_url: str, width: int = 1280, **context_args):
        self.base = base_url
        self.context = browser.new_context(viewport={"width": width, "height": 900}, **context_args)
        self.problems: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        self.page.on("requestfailed", self._failed)

    def _failed(self, request):
        # A request cancelled by the next navigation (net::ERR_ABORTED) is not a fault of the page; a
        # missing file shows up as a console error, an off-site request in _route.
        if "ERR_ABORTED" not in (request.failure or ""):
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.base) or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.problems.append(f"request off the site: {url}")
            route.abort()

    def goto(self, path: str):
        """Open `path` and wait for the load event and for the page to be ready (READY: KaTeX done with its math,
        the tables wrapped), or 15 s, after which what is left undone is what the checks see."""
        response = self.page.goto(self.base + path, wait_until="load")
        try:
            self.page.wait_for_function(READY, timeout=15_000, polling=POLL_MS)
        except PlaywrightTimeout:
            pass
        return response

    def follow(self, path: str) -> bool:
        """Go to `path` the way a reader's click does on this site: Material's instant navigation fetches the
        page and swaps it in, keeping the scripts already running. Waits for the new page's article, its
        images and its math; False if it did not arrive within 30 s (the page is then opened afresh)."""
        target = self.base + path
        self.page.evaluate(FOLLOW, target)
        try:
            self.page.wait_for_function(ARRIVED, arg=target, timeout=30_000, polling=POLL_MS)
        except PlaywrightTimeout:
            self.goto(path)
            return False
        return True

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, base_url):
    v = Visit(browser, base_url)
    yield v
    v.close()


def _every_page(site: Path) -> list[str]:
    return sorted(p.relative_to(site).parent.as_posix() + "/" if p.parent != site else ""
                  for p in site.rglob("index.html"))


def _points_sample(site: Path) -> list[str]:
    """Each experiment's longest GPU-time per-point page (HTML bytes), whose tables its profiles and cases
    make widest, and the three longest eager-call per-point pages (another template)."""
    longest: dict[str, tuple[int, str]] = {}
    eager: list[tuple[int, str]] = []
    for page in (site / "points").glob("*/index.html"):
        name, size = page.parent.name, page.stat().st_size
        if name.endswith("--eager-call"):
            eager.append((size, f"points/{name}/"))
        elif (experiment := name.partition("--")[0]) not in longest or size > longest[experiment][0]:
            longest[experiment] = (size, f"points/{name}/")
    return sorted([path for _, path in longest.values()] + [path for _, path in sorted(eager)[-3:]])


def _rounds_sample(site: Path) -> list[str]:
    """The lab notebook's longest and shortest round pages."""
    rounds = sorted((site / "probes").glob("*/index.html"), key=lambda p: p.stat().st_size)
    return sorted({f"probes/{rounds[0].parent.name}/", f"probes/{rounds[-1].parent.name}/"}) if rounds else []


def _pages(site: Path) -> list[str]:
    """The pages opened in the browser: every page but the per-point and round pages, and a sample of those."""
    sampled = ("points/", "probes/")
    kept = [p for p in _every_page(site) if not (p.startswith(sampled) and p not in sampled)]
    return sorted({*kept, *_points_sample(site), *_rounds_sample(site)})


# The article text with code, scripts and typeset math removed: what is left must hold no TeX source.
LEFTOVER_TEX = """() => {
  const root = (document.querySelector("article") || document.body).cloneNode(true);
  root.querySelectorAll("pre, code, script, style, .katex, .highlight").forEach((el) => el.remove());
  return root.textContent;
}"""

PAGE_FACTS = """() => ({
  arithmatex: document.querySelectorAll(".arithmatex").length,
  untypeset: Array.from(document.querySelectorAll(".arithmatex")).filter((el) => !el.querySelector(".katex")).length,
  katex: document.querySelectorAll(".katex").length,
  katexErrors: document.querySelectorAll(".katex-error").length,
  brokenImages: Array.from(document.images).filter((i) => !(i.complete && i.naturalWidth > 0)).map((i) => i.currentSrc || i.src),
  images: document.images.length,
})"""


# The pages whose plots are measured at a phone's width.
PLOT_PAGES = (EVIDENCE_PAGE, SWEEP_PAGE, "experiments/rmsnorm-linear-decode/", "experiments/decoder-block/")


@functools.cache
def _observe_script() -> str:
    """The facts _observe reads off a page, in one script (one round trip to the browser instead of seven): each
    read-only script below, called in turn; with `desktop`, the math and leftover TeX too."""
    reads = {"tables": TABLE_BOXES, "needed": NEEDED_CELLS, "names": NAMES_IN_TABLES,
             "badges": "() => document.querySelectorAll('article .kl-badge').length",
             "height": "() => document.documentElement.scrollHeight"}
    desktop = {"facts": PAGE_FACTS, "leftover": LEFTOVER_TEX}
    call = lambda scripts: ", ".join(f"{name}: ({script})()" for name, script in scripts.items())  # noqa: E731
    return f"(desktop) => ({{{call(reads)}, ...(desktop ? {{{call(desktop)}}} : {{}})}})"


def _observe(v: Visit, path: str, width: int, fresh: bool) -> dict:
    """One visit's facts, for every check that reads that page at that width: opened afresh, or reached by
    instant navigation from the page before, as a reader clicking through the site reaches it."""
    if fresh:
        response = v.goto(path)
        status = response.status if response else None
    else:
        status = 200 if v.follow(path) else "no instant navigation"
    seen = {"status": status, **v.page.evaluate(_observe_script(), width == WIDTHS["desktop"])}
    if width == WIDTHS["phone"] and path in PLOT_PAGES:
        seen["plots"] = v.page.evaluate(PLOT_TEXT)
    seen["problems"] = list(v.problems)
    return seen


@pytest.fixture(scope="module")
def observed(site, browser, base_url) -> dict[int, dict[str, dict]]:
    """width -> page -> what one visit saw: every browser-opened page at 1440 px, the reader pages (and the
    plot pages) at 390 px. At each width the first page of each folder is opened afresh and the others are
    reached by instant navigation, five times faster: a fresh load of every page measured the same scripts
    starting over and over (test_math_survives_instant_navigation holds that navigation to its own account)."""
    plan = {WIDTHS["desktop"]: sorted({*_pages(site), *_reader_pages(site)}),
            WIDTHS["phone"]: sorted({*_reader_pages(site), *PLOT_PAGES})}
    out: dict[int, dict[str, dict]] = {}
    for width, paths in plan.items():
        v = Visit(browser, base_url, width=width)
        try:
            out[width] = {}
            folders: set[str] = set()
            for path in paths:
                folder = path.split("/", 1)[0]
                v.problems.clear()
                out[width][path] = _observe(v, path, width, fresh=folder not in folders)
                folders.add(folder)
        finally:
            v.close()
    return out


def test_every_page_loads_cleanly_offline_with_math_and_images(site, observed):
    pages = _pages(site)
    assert len(pages) >= 15, pages
    failures: list[str] = []
    typeset_pages = 0
    for path in pages:
        seen = observed[WIDTHS["desktop"]][path]
        if seen["status"] != 200:
            status = seen["status"]
            failures.append(f"/{path}: {f'HTTP {status}' if isinstance(status, int) else status or 'no response'}")
        facts = seen["facts"]
        failures += [f"/{path}: {p}" for p in seen["problems"]]
        if facts["untypeset"] or facts["katexErrors"]:
            failures.append(f"/{path}: {facts['untypeset']} formulas left untypeset, {facts['katexErrors']} KaTeX errors")
        failures += [f"/{path}: {m}" for m in _raw_tex(seen["leftover"])]
        failures += [f"/{path}: image did not load: {src}" for src in facts["brokenImages"]]
        typeset_pages += facts["katex"] > 0
    assert not failures, "\n".join(failures)
    assert typeset_pages >= 5, "the write-ups' math was never typeset"


TEX_TOKENS = ("$$", "\\(", "\\[", "\\begin{", "\\frac")


def _raw_tex(text: str) -> list[str]:
    """TeX source left in a page's text (code, scripts and typeset math already removed)."""
    found = []
    for token in TEX_TOKENS:
        if token in text:
            at = text.index(token)
            found.append(f"raw TeX {token!r} in the text: ...{text[max(0, at - 40):at + 40]!r}...")
    return found


class _ArticleText(HTMLParser):
    """The text of a page's article outside code, scripts, styles and math (which KaTeX typesets)."""

    SKIP = {"pre", "code", "script", "style"}
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.stack: list[bool] = []  # per open element: whether its text is skipped
        self.in_article = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        skipped = tag in self.SKIP or "arithmatex" in classes or "highlight" in classes
        self.stack.append(skipped or bool(self.stack and self.stack[-1]))
        self.in_article += tag == "article"

    def handle_endtag(self, tag):
        if tag in self.VOID or not self.stack:
            return
        self.stack.pop()
        self.in_article -= tag == "article"

    def handle_data(self, data):
        if self.in_article and not (self.stack and self.stack[-1]):
            self.parts.append(data)


def test_pages_the_browser_skips_hold_no_tex_source(site):
    # The per-point and round pages the browser does not open carry no math at all: TeX in their text would be
    # shown raw, or typeset where no check looked. (The pages the browser opens are checked there, after KaTeX.)
    opened = {site / path / "index.html" for path in _pages(site)}
    skipped = [p for p in sorted(site.rglob("index.html")) if p not in opened]
    assert len(skipped) > 50, "the browser was to skip most per-point and round pages"
    failures = []
    for page in skipped:
        parser = _ArticleText()
        parser.feed(page.read_text(encoding="utf-8"))
        failures += [f"{page.relative_to(site)}: {m}" for m in _raw_tex("".join(parser.parts))]
    assert not failures, "\n".join(failures[:20])


def test_the_tex_check_can_fail():
    parser = _ArticleText()
    parser.feed('<article><p>typeset <span class="arithmatex">\\(x\\)</span>, raw \\frac{a}{b}</p><pre>$$</pre></article>')
    assert [m.split(" in the text")[0] for m in _raw_tex("".join(parser.parts))] == ["raw TeX '\\\\frac'"]


def test_math_survives_instant_navigation(site, visit):
    visit.goto("")
    visit.page.evaluate("() => { window.__sameDocument = true; }")
    visit.page.click('article a[href$="writeups/online-softmax/"]')
    visit.page.wait_for_url(re.compile(r"writeups/online-softmax/$"))
    # The URL changes before the new content is swapped in, and the page it leaves may hold typeset math too:
    # wait for the post's own formulas (it has dozens) to be in place and typeset; a timeout fails the test.
    visit.page.wait_for_function(
        "() => { const f = document.querySelectorAll('article .arithmatex');"
        " return f.length > 10 && Array.from(f).every((el) => el.querySelector('.katex')); }")
    # Material's instant navigation swapped the page in place: the marker set above is still there.
    assert visit.page.evaluate("() => window.__sameDocument === true")
    facts = visit.page.evaluate(PAGE_FACTS)
    assert facts["arithmatex"] > 10 and facts["untypeset"] == 0
    assert not visit.problems, visit.problems


def test_search_finds_the_online_softmax(site, visit):
    import json

    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    hits = [d["location"] for d in index["docs"]
            if "online softmax" in (d.get("title", "") + " " + d.get("text", "")).lower()]
    assert any(h.startswith("writeups/online-softmax/") for h in hits), hits

    visit.goto("")
    visit.page.click("input.md-search__input")
    visit.page.keyboard.type("online softmax", delay=20)
    visit.page.wait_for_selector(".md-search-result__item", timeout=15000)
    links = visit.page.eval_on_selector_all(".md-search-result__link", "els => els.map(e => e.href)")
    assert any("writeups/online-softmax/" in href for href in links[:5]), links
    assert not visit.problems, visit.problems


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for attr in ("href", "src"):
            if a.get(attr) and tag in ("a", "img", "link", "script", "source", "iframe"):
                self.targets.append(a[attr])


def test_internal_links_resolve(site):
    parsed: dict[Path, _Links] = {}

    def parse(page: Path) -> _Links:
        if page not in parsed:
            parser = _Links()
            parser.feed(page.read_text(encoding="utf-8"))
            parsed[page] = parser
        return parsed[page]

    broken = []
    for page in sorted(site.rglob("*.html")):
        for target in parse(page).targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or target.startswith(("mailto:", "javascript:")):
                continue
            here = PurePosixPath(page.relative_to(site).as_posix()).parent
            rel = unquote(parts.path)
            if rel.startswith("/"):  # 404.html links from the site root (site_url's path is "/")
                here, rel = PurePosixPath("."), rel.lstrip("/")
            dest = site / (here / rel) if rel else page
            dest = Path(os.path.normpath(dest))
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.is_file() or site.resolve() not in dest.resolve().parents:
                broken.append(f"{page.relative_to(site)} -> {target}")
                continue
            fragment = unquote(parts.fragment)
            if fragment and dest.suffix == ".html" and not fragment.startswith("__") and fragment not in parse(dest).ids:
                broken.append(f"{page.relative_to(site)} -> {target} (no id {fragment!r})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _evidence_pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).parent.as_posix() + "/" for p in (site / "experiments").glob("*/index.html"))


def _reader_pages(site: Path) -> list[str]:
    """The pages whose tables carry evidence: home, the indexes, every experiment and decision, the method,
    and the sample of per-point pages."""
    decisions = sorted(p.relative_to(site).parent.as_posix() + "/" for p in (site / "decisions").glob("*/index.html"))
    return ["", "experiments/", "decisions/", "method/", *_evidence_pages(site), *decisions, *_points_sample(site)]


# Every table's scrolling box: how wide its content is, how wide the box, and how it shows that there is more.
TABLE_BOXES = """() => Array.from(document.querySelectorAll("article table")).map((table) => {
  const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
  const style = getComputedStyle(box);
  const heading = (() => { let el = table; while (el && !/^H[1-4]$/.test(el.tagName)) el = el.previousElementSibling || el.parentElement; return el ? el.textContent.trim() : ""; })();
  return {scroll: box.scrollWidth, visible: box.clientWidth, overflowX: style.overflowX,
          cue: style.backgroundImage, inCard: !!table.closest(".kl-card"), hidden: box.offsetParent === null,
          head: Array.from(table.querySelectorAll("th")).map((th) => th.textContent.trim()).join(" | "), heading};
})"""


def _scroll_cue_failures(path: str, boxes: list, width: int) -> list[str]:
    """What is wrong with one page's tables (TABLE_BOXES) at `width`: columns cut off with no way to scroll,
    a scroll with no visible cue, or (on a desktop) a summary card whose table does not fit."""
    failures = []
    for t in boxes:
        if t["hidden"] or t["scroll"] <= t["visible"] + 1:
            continue
        where = f"/{path} [{t['head'][:60]}]"
        if t["overflowX"] not in ("auto", "scroll"):
            failures.append(f"{where}: {t['scroll']} px of columns in {t['visible']} px, overflow {t['overflowX']}")
        elif "gradient" not in t["cue"]:
            failures.append(f"{where}: scrolls with no visible cue (background {t['cue']!r})")
        if width >= 1440 and t["inCard"]:
            failures.append(f"{where}: the summary card's table needs {t['scroll']} px of {t['visible']}")
    return failures


def test_the_scroll_cue_check_can_fail(site, browser, base_url):
    v = Visit(browser, base_url, width=390)
    try:
        v.goto(SWEEP_PAGE)
        v.page.add_style_tag(content=".md-typeset .md-typeset__scrollwrap { background: none !important; }")
        boxes = v.page.evaluate(TABLE_BOXES)
        scrolling = [t for t in boxes if not t["hidden"] and t["scroll"] > t["visible"] + 1]
        assert scrolling and all("gradient" not in t["cue"] for t in scrolling)
        assert any("no visible cue" in f for f in _scroll_cue_failures(SWEEP_PAGE, boxes, 390))
    finally:
        v.close()


NAMES_IN_TABLES = """() => Array.from(document.querySelectorAll("article table code"))
  .filter((el) => el.offsetParent !== null)
  .map((el) => ({text: el.textContent, lines: el.getClientRects().length}))"""


@pytest.mark.parametrize("width", sorted(WIDTHS.values()))
def test_profile_and_case_names_never_break_inside_a_table(site, observed, width):
    broken = [f"/{path}: {n['text']!r} on {n['lines']} lines" for path in _evidence_pages(site)
              for n in observed[width][path]["names"] if n["lines"] > 1]
    assert not broken, "\n".join(broken[:20])


BADGES = """() => Array.from(document.querySelectorAll(".kl-legend .kl-badge, .kl-legend .kl-word")).map((el) => ({
  kind: Array.from(el.classList).find((c) => c.startsWith("kl-badge--") || c.startsWith("kl-word--")),
  text: el.textContent.trim(),
  colour: el.classList.contains("kl-badge") ? getComputedStyle(el).backgroundColor : getComputedStyle(el).color,
  icon: getComputedStyle(el, "::before").maskImage || getComputedStyle(el, "::before").webkitMaskImage,
}))"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_verdict_badges_differ_in_colour_and_icon(site, browser, base_url, scheme):
    v = Visit(browser, base_url, color_scheme=scheme)
    try:
        v.goto("method/")
        marks = v.page.evaluate(BADGES)
    finally:
        v.close()
    badges = [m for m in marks if m["kind"].startswith("kl-badge--")]
    words = [m for m in marks if m["kind"].startswith("kl-word--")]
    assert [b["text"] for b in badges] == ["Supported", "Rejected", "Inconclusive", "Stale", "No evidence", "Open"]
    assert [w["text"] for w in words] == ["Faster", "Level", "Slower", "Undecided", "Failed"]
    for group in (badges, words):
        colours = [m["colour"] for m in group]
        assert len(set(colours)) == len(colours), colours
        assert all(m["icon"] and m["icon"] != "none" for m in group), group
    icons = [b["icon"] for b in badges]
    assert len(set(icons)) == len(icons), "every verdict has its own icon"
    greens = [b["colour"] for b in badges if b["text"] in ("Inconclusive", "Open", "Stale")]
    assert next(b["colour"] for b in badges if b["text"] == "Supported") not in greens


def test_every_evidence_page_shows_its_verdicts_as_badges(site, observed):
    missing = [path for path in ["", "experiments/", "decisions/", *_evidence_pages(site)]
               if not observed[WIDTHS["desktop"]][path]["badges"]]
    assert not missing, missing


PLOT_TEXT = """async () => {
  const out = [];
  for (const img of document.querySelectorAll("article a.kl-plot img")) {
    const svg = new DOMParser().parseFromString(await (await fetch(img.currentSrc)).text(), "image/svg+xml");
    const root = svg.documentElement;
    const viewWidth = parseFloat(root.getAttribute("viewBox").split(/\\s+/)[2]);
    const sizes = Array.from(svg.querySelectorAll("text"))
      .map((t) => parseFloat((/font-size:\\s*([\\d.]+)px/.exec(t.getAttribute("style") || "") || [])[1]))
      .filter((n) => !Number.isNaN(n));
    out.push({src: img.currentSrc, shown: img.clientWidth, viewWidth, smallest: Math.min(...sizes), texts: sizes.length});
  }
  return out;
}"""


def test_plot_text_is_legible_on_a_phone(observed):
    small = []
    for path in PLOT_PAGES:
        plots = observed[WIDTHS["phone"]][path]["plots"]
        assert plots, f"/{path} shows no plot"
        for p in plots:
            assert p["texts"] > 5, p
            px = p["smallest"] * p["shown"] / p["viewWidth"]
            if px < 9:
                small.append(f"/{path}: {p['src'].rsplit('/', 1)[-1]}: smallest text {px:.1f} px")
    assert not small, "\n".join(small)


# ---- Legibility: what a reader needs is on screen, pages are short and light ---------------------------------

# An evidence page at 1440 px with its detail folded, and the weight of one page's HTML and of the whole site.
# Every page counts: the point-by-point pages (docs/points/) hold one GPU's points on one clock each, and the
# notebook page's theme is a stylesheet of its own (tools/mkdocs_hooks.py). The site serves only the records
# its numbers come from, compressed as they are stored; the repository keeps the rest.
PAGE_HEIGHT_PX = 10_000
PAGE_HTML_BYTES = 250_000
SITE_BYTES = 40_000_000

# For every visible table that carries a speedup: where its needed cells (the first column, the point; every
# column headed "Speedup"; every column whose cells hold a verdict word) end, against the right edge of the
# box they scroll in and of the window. Rows inside folded <details> are not visible and not measured.
NEEDED_CELLS = """() => {
  const out = [];
  for (const table of document.querySelectorAll("article table")) {
    if (table.offsetParent === null) continue;
    const heads = Array.from(table.querySelectorAll("thead th"));
    const rows = Array.from(table.querySelectorAll("tbody tr"));
    const speedup = heads.map((th, i) => /speedup/i.test(th.textContent) ? i : -1).filter((i) => i >= 0);
    if (!speedup.length) continue;
    const words = heads.map((th, i) => rows.some((r) => r.cells[i] && r.cells[i].querySelector(".kl-word")) ? i : -1)
      .filter((i) => i >= 0);
    const box = (table.closest(".md-typeset__scrollwrap") || table.parentElement).getBoundingClientRect();
    const limit = Math.min(box.right, document.documentElement.clientWidth);
    let worst = null;
    for (const row of [table.tHead.rows[0], ...rows.slice(0, 3)]) {
      for (const i of new Set([0, ...speedup, ...words])) {
        const cell = row.cells[i];
        if (!cell) continue;
        const right = cell.getBoundingClientRect().right;
        if (right > limit + 1 && (!worst || right > worst.right))
          worst = {column: heads[i] ? heads[i].textContent.trim() : String(i), right: Math.round(right)};
      }
    }
    out.push({head: heads.map((th) => th.textContent.trim()).join(" | "), limit: Math.round(limit), worst});
  }
  return out;
}"""


@pytest.mark.parametrize("width", sorted(WIDTHS.values()))
def test_reader_pages_fit_the_screen(site, observed, width):
    """Every reader page at `width`: no table hides columns without a cue to scroll, the point, speedup and
    word columns of every table with a speedup are in view, and evidence pages are short."""
    cues, clipped, tall, measured = [], [], [], 0
    for path in _reader_pages(site):
        seen = observed[width][path]
        cues += _scroll_cue_failures(path, seen["tables"], width)
        for t in seen["needed"]:
            measured += 1
            if t["worst"]:
                clipped.append(f"/{path} [{t['head'][:70]}]: {t['worst']['column']!r} ends at "
                               f"{t['worst']['right']} px, past {t['limit']} px")
        if width >= 1440 and path.startswith("experiments/") and path != "experiments/" and seen["height"] > PAGE_HEIGHT_PX:
            tall.append(f"/{path}: {seen['height']} px")
    assert not cues, "tables that hide columns:\n" + "\n".join(cues)
    assert measured > 20, "no table with a speedup column was measured"
    assert not clipped, "needed columns off screen:\n" + "\n".join(clipped)
    assert not tall, f"evidence pages taller than {PAGE_HEIGHT_PX} px at {width} px:\n" + "\n".join(tall)


def test_the_column_check_can_fail(site, browser, base_url):
    v = Visit(browser, base_url, width=WIDTHS["phone"])
    try:
        v.goto(EVIDENCE_PAGE)
        # Push every table's first column wide: the speedup and word cells leave the screen.
        v.page.add_style_tag(content="article table td:first-child, article table th:first-child { min-width: 600px; }")
        assert any(t["worst"] for t in v.page.evaluate(NEEDED_CELLS))
    finally:
        v.close()


def test_pages_and_the_site_are_light(site):
    heavy = [f"{p.relative_to(site)}: {p.stat().st_size:,} bytes" for p in site.rglob("*.html")
             if p.stat().st_size > PAGE_HTML_BYTES]
    assert not heavy, f"pages over {PAGE_HTML_BYTES:,} bytes of HTML:\n" + "\n".join(heavy)
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert total < SITE_BYTES, f"the site weighs {total:,} bytes"


def test_display_math_scrolls_with_a_cue_on_a_phone(site, browser, base_url):
    v = Visit(browser, base_url, width=WIDTHS["phone"])
    try:
        v.goto("writeups/online-softmax/")
        v.page.wait_for_function("() => document.querySelectorAll('article .katex-display').length > 3")
        wide = v.page.evaluate("""() => Array.from(document.querySelectorAll("article .katex-display"))
          .filter((el) => el.scrollWidth > el.clientWidth + 1)
          .map((el) => { const s = getComputedStyle(el), p = getComputedStyle(el.parentElement);
                         return {overflow: s.overflowX, cue: s.backgroundImage + p.backgroundImage,
                                 right: el.getBoundingClientRect().right}; })""")
        width = v.page.evaluate("() => document.documentElement.clientWidth")
        scrolls_page = v.page.evaluate("() => document.documentElement.scrollWidth > document.documentElement.clientWidth")
    finally:
        v.close()
    assert not scrolls_page, "the page itself scrolls sideways on a phone"
    for f in wide:
        assert f["overflow"] in ("auto", "scroll") and "gradient" in f["cue"], f
        assert f["right"] <= width + 1, f


# Every SVG drawn into the site, laid out by the browser one after another inside one blank page (each SVG
# names its own fonts and sizes, so its boxes are those of the SVG opened on its own): its text elements'
# boxes, the series it declares (elements with a data-series attribute) and the entries of its legend (text
# inside an element whose id or class names a legend). A plot that marks neither is not judged on its legend.
SVG_TEXT = """(markups) => markups.map((markup) => {
  const host = document.createElement("div");
  host.innerHTML = markup;
  document.body.appendChild(host);
  const svg = host.querySelector("svg");
  const texts = Array.from(svg.querySelectorAll("text"))
    .filter((t) => t.textContent.trim() && getComputedStyle(t).visibility !== "hidden")
    .map((t) => { const r = t.getBoundingClientRect();
                  return {text: t.textContent.trim(), x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; })
    .filter((b) => b.x1 > b.x0 && b.y1 > b.y0);
  const legendTexts = new Set();
  for (const g of svg.querySelectorAll("[id*=legend], [class*=legend]"))
    for (const t of g.querySelectorAll("text")) if (t.textContent.trim()) legendTexts.add(t);
  const series = new Set(Array.from(svg.querySelectorAll("[data-series]")).map((el) => el.getAttribute("data-series")));
  host.remove();
  return {texts, legend: legendTexts.size, series: series.size};
})"""


def overlapping_labels(texts: list[dict], tolerance: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of text boxes that overlap by more than `tolerance` px both ways (a shared edge is not overlap)."""
    pairs = []
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            dx = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
            dy = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
            if dx > tolerance and dy > tolerance:
                pairs.append((a["text"], b["text"]))
    return pairs


def test_overlap_check_finds_overlap():
    box = {"x0": 0, "y0": 0, "x1": 20, "y1": 10}
    assert overlapping_labels([{**box, "text": "1"}, {**box, "x0": 15, "x1": 35, "text": "2"}]) == [("1", "2")]
    assert not overlapping_labels([{**box, "text": "1"}, {**box, "x0": 20, "x1": 40, "text": "2"}])


def _site_svgs(site: Path) -> list[str]:
    skip = ("assets/vendor/", "assets/images/", "assets/javascripts/", "assets/stylesheets/")
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.svg")
                  if not p.relative_to(site).as_posix().startswith(skip))


def test_plot_labels_never_overlap_and_legends_name_every_series(site, browser, base_url):
    svgs = _site_svgs(site)
    assert len(svgs) >= 20, svgs
    v = Visit(browser, base_url, width=1440)
    crowded, unnamed = [], []
    try:
        v.page.set_content("<!doctype html><html><body style='margin:0'></body></html>")
        for start in range(0, len(svgs), 20):
            chunk = svgs[start:start + 20]
            markups = [(site / path).read_text(encoding="utf-8") for path in chunk]
            for path, facts in zip(chunk, v.page.evaluate(SVG_TEXT, markups)):
                pairs = overlapping_labels(facts["texts"])
                if pairs:
                    crowded.append(f"{path}: {len(pairs)} overlapping, e.g. {pairs[:3]}")
                if facts["series"] and facts["legend"] < facts["series"]:
                    unnamed.append(f"{path}: {facts['series']} series, {facts['legend']} legend entries")
    finally:
        v.close()
    assert not crowded, "plot text overlaps:\n" + "\n".join(crowded[:30])
    assert not unnamed, "legends short of their series:\n" + "\n".join(unnamed)


def test_the_overlap_check_sees_colliding_plot_labels(browser, base_url):
    # Two tick labels drawn at the same place, in an SVG laid out the way every plot is.
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="200pt" height="100pt" viewBox="0 0 200 100">'
           '<text x="50" y="50" style="font-size: 15px; font-family: \'DejaVu Sans\'">16,384</text>'
           '<text x="60" y="52" style="font-size: 15px; font-family: \'DejaVu Sans\'">32,768</text></svg>')
    v = Visit(browser, base_url, width=1440)
    try:
        v.page.set_content("<!doctype html><html><body style='margin:0'></body></html>")
        (facts,) = v.page.evaluate(SVG_TEXT, [svg])
    finally:
        v.close()
    assert overlapping_labels(facts["texts"]) == [("16,384", "32,768")]


def _not_blank(png: Path) -> bool:
    from PIL import Image

    with Image.open(png) as im:
        colours = im.convert("RGB").resize((64, 64)).getcolors(64 * 64)
    return colours is not None and len(colours) > 20


SHOTS = [(path, name, scheme, device) for path, name, schemes in [
    ("", "home", ("light", "dark")), (EVIDENCE_PAGE, "evidence-softmax-row-fusion", ("light", "dark")),
    (SWEEP_PAGE, "evidence-softmax-fwd-sweep", ("light",)), ("decisions/", "decisions", ("light",))]
    for scheme in schemes for device in sorted(WIDTHS)]


@pytest.mark.parametrize("path, name, scheme, device", SHOTS)
def test_screenshots(site, browser, base_url, path, name, scheme, device):
    v = Visit(browser, base_url, width=WIDTHS[device], color_scheme=scheme)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}-{device}-{scheme}.png"
    # The first screen, what a reader sees on arriving; the whole page (seconds to capture and encode at 10,000 px)
    # only when the shots are kept for a person to look at.
    whole = bool(os.environ.get("KERNEL_LAB_SCREENSHOTS"))
    try:
        assert v.goto(path).status == 200
        v.page.screenshot(path=str(shot), full_page=whole)
        assert not v.problems, v.problems
    finally:
        v.close()
    assert shot.stat().st_size > 20_000 and _not_blank(shot)
    if os.environ.get("KERNEL_LAB_SCREENSHOTS"):
        out = Path(os.environ["KERNEL_LAB_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / shot.name)
