"""Record text on the pages: escaped by construction, shown as it is, and doing nothing.

Three levels. The escaper itself (lab.publish.escape): benign text unchanged, hostile text neutralised.
Every template context a value can land in (prose, a table cell, a heading, an admonition, an image's alt
text, a link's text, a code span, a code block), rendered by the lab's own template environment and then by
Python-Markdown configured exactly as mkdocs.yml configures it. And a whole site: hostile but valid records
rendered by tools/build_results.py into a copy of the site, built with `mkdocs build --strict`, its HTML
searched for anything a record could have made live.
"""

from __future__ import annotations

import copy
import gzip
import html
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lab import REPO_ROOT
from lab.publish import escape
from lab.publish.render import _jinja
from sitetools import SHARED_CACHES, SITE_TOOLS, load_tool, require_vendored_assets
from warm_python import run_python

build_results = load_tool("build_results")

SECRET = "SECRET-GIT-CONFIG-0451"
HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    "![x](javascript:alert(1))",
    "[x]  (javascript:alert(1))",
    "<javascript:alert(1)>",
    "<https://evil.example/>",
    'x {: onclick="alert(1)" }',
    "{ onclick=alert(1) }",
    "a ``` b ` c",
    "```",
    "`code` | pipe | cell",
    "&lt;script&gt;alert(1)&lt;/script&gt; &#60;b&#62;",
    '--8<-- ".git/config"',
    'x\n--8<-- ".git/config"\ny',
    '--8<-- "no/such/file.md"',
    "-8<- 'docs/../.git/config'",
    "foo --8<-- [start:x] bar",
    "<!-- unclosed",
    "$\\href{javascript:alert(1)}{x}$ \\(x\\)",
    "[^1] *[HTML]: Hyper",
    '<div markdown="1">*x*</div>',
    "\x02wzxhzdk:0\x03 \x00 \x1b[31m",
    "trailing backslash \\",
    "line one\r\n# heading\n    indented\n!!! danger \"x\"\n| a | b |",
    "JaVaScRiPt:alert(1)",
]
BENIGN = ["NVIDIA H100 80GB HBM3", "580.159.04", "single-block holds a row in registers: N <= 131072",
          "Liger refuses N > 65536", "interval [0.996, 1.012] neither clears 1 nor lies below 1", "a_b ~ d^2 kernels/_launch.py",
          "tools/build_results.py --run softmax-row-fusion --records-dir /tmp/rec", "torch.compile", "A & B",
          "2.11.0+cu130", "relative error 1.37 exceeds the tolerance 1e-05", "x < 3 and y = 4", "it's \"quoted\""]

CONTEXTS = {
    "prose": "Before {{ v }} after.\n",
    "list": "- {{ v }}\n- second\n",
    "heading": "### {{ v }}\n",
    "table": "| A | B |\n| --- | --- |\n| {{ v | cell }} | {{ v }} |\n",
    "admonition": '!!! note "{{ v }} · title"\n    {{ v | indent4 }}\n',
    "alt text": "![{{ v }} on a GPU]({{ link }})\n",
    "link text": "[{{ v }}]({{ link }}) and [`{{ v }}`]({{ link }})\n",
    "code span": "by {{ v | code }}, and (an author forgetting the filter) by `{{ v }}`\n",
    "code in a table": "| A | B |\n| --- | --- |\n| {{ v | code | cell }} | x |\n",
    "code block": "Said:\n\n{{ v | code_block('text') }}\n\nAfter.\n",
}


# --------------------------------------------------------------------------------------------------------
# The escaper
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", BENIGN)
def test_benign_text_comes_out_unchanged(text):
    assert escape.md(text) == text
    assert escape.code(text) == f"`{text}`"


@pytest.mark.parametrize("text, escaped", [
    ("<script>", "&lt;script>"),
    ("a & b &amp; c &#60;", "a & b &amp;amp; c &amp;#60;"),
    ("`x`", "&#96;x&#96;"),
    ("[x](y) [z] [w][v] [^1] [0.9, 1.1] wide", "[x\\](y) [z\\] [w\\][v\\] \\[^1\\] [0.9, 1.1] wide"),
    ("{: #id } | \\ $", "\\{: #id \\} \\| &#92; &#36;"),
    ("a\nb\r\nc\u2028d", "a b c d"),
    ("--8<-- 'x'", "--8&lt;-- 'x'"),
    ("javascript:x", "javascript\u200b:x"),
    ("*x* a_b", "\\*x\\* a_b"),
    ("\x00\x02", "\ufffd\ufffd"),
    ("ends]", "ends\\]"),
])
def test_hostile_text_is_neutralised(text, escaped):
    assert escape.md(text) == escaped


def test_safe_text_passes_and_composition_escapes_the_parts():
    mark = escape.Md("<span>✗</span>")
    assert escape.md(mark) is mark
    assert escape.compose("{}: {}", mark, "<b>|") == "<span>✗</span>: &lt;b>\\|"
    assert escape.Md("a ") + "`b`" == "a &#96;b&#96;"
    assert escape.cell(escape.Md("x | y\nz")) == "x \\| y z"
    assert escape.code("a `b` c") == "``a `b` c``" and escape.code("`") == "`` ` ``"
    assert escape.code_block("x\n```\ny") == "````text\nx\n```\ny\n````"


@pytest.mark.parametrize("target", ["javascript:alert(1)", "JavaScript:x", "data:text/html,x", "//evil.example/x",
                                    "http://example.com/", "vbscript:x"])
def test_links_go_only_to_relative_paths_and_https(target):
    with pytest.raises(ValueError, match="relative path or an https: address"):
        escape.href(target)


def test_links_to_pages_and_https_stay_and_cannot_end_early():
    assert escape.href("../records/s/20261122T000000Z-x-1.json") == "../records/s/20261122T000000Z-x-1.json"
    assert escape.href("/experiments/x.md#how-to-run") == "/experiments/x.md#how-to-run"
    assert escape.href("https://example.com/a b)") == "https://example.com/a%20b%29"


def test_declarations_are_the_projects_own_text():
    from experiments import get_experiment

    e = escape.declared(get_experiment("softmax-row-fusion"))
    assert isinstance(e.title, escape.Md) and isinstance(e.claim.baselines[0], escape.Md)
    assert isinstance(e.profiles[0].description, escape.Md)
    assert e.claim.threshold == get_experiment("softmax-row-fusion").claim.threshold


def test_no_template_writes_a_code_span_by_hand():
    """`{{ x }}` between backticks would show a value's escapes literally and let its backticks out; the
    `code` filter fences any text."""
    templates = REPO_ROOT / "lab" / "publish" / "templates"
    assert [p.name for p in templates.glob("*.j2") if re.search(r"`\{\{", p.read_text(encoding="utf-8"))] == []


def test_the_templates_escape_every_value_unless_marked():
    env = _jinja()
    assert env.finalize is escape.md
    out = env.from_string("{{ a }} {{ b }} {{ c | safe }} {{ n }}").render(a="<i>", b=escape.Md("<i>"), c="<i>", n=3)
    assert out == "&lt;i> <i> <i> 3"


# --------------------------------------------------------------------------------------------------------
# Every context, through Python-Markdown as the site configures it
# --------------------------------------------------------------------------------------------------------


class Inspect(HTMLParser):
    """Everything in a fragment that could act: tags, event attributes, link and source targets; and its text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.events: list[str] = []
        self.targets: list[str] = []
        self.text: list[str] = []
        self.cells: list[int] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.cells.append(0)
        if tag in ("td", "th") and self.cells:
            self.cells[-1] += 1
        for name, value in attrs:
            if name.lower().startswith("on"):
                self.events.append(f"{tag} {name}={value}")
            if name.lower() in ("href", "src", "action", "formaction", "xlink:href", "data"):
                self.targets.append(value or "")

    def handle_data(self, data):
        self.text.append(data)


def inspect(fragment: str) -> Inspect:
    parser = Inspect()
    parser.feed(fragment)
    return parser


def assert_inert(fragment: str, allowed_targets=()) -> Inspect:
    found = inspect(fragment)
    assert not {"script", "iframe", "object", "embed", "style", "form", "base", "meta", "svg"} & set(found.tags), \
        fragment
    assert found.events == [], fragment
    for target in found.targets:
        squeezed = re.sub(r"[\x00-\x20]", "", html.unescape(target)).lower()
        assert not squeezed.startswith(("javascript:", "vbscript:", "data:")), fragment
        assert target in allowed_targets or target.startswith("#"), fragment
    assert SECRET not in fragment
    return found


@pytest.fixture(scope="module")
def markdown_like_the_site(tmp_path_factory):
    """Python-Markdown with mkdocs.yml's extensions and settings, run from a folder whose .git/config holds a
    secret a snippet must never pull in."""
    import markdown
    from mkdocs.config import load_config

    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    config = load_config(str(REPO_ROOT / "mkdocs.yml"))
    folder = tmp_path_factory.mktemp("cwd")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text(f"[core]\n\t{SECRET} = true\n", encoding="utf-8")
    (folder / "docs").mkdir()

    def convert(text: str) -> str:
        here = os.getcwd()
        os.chdir(folder)
        try:
            return markdown.Markdown(extensions=config["markdown_extensions"],
                                     extension_configs=config["mdx_configs"]).convert(text)
        finally:
            os.chdir(here)

    return convert


@pytest.mark.parametrize("context", sorted(CONTEXTS))
def test_hostile_text_in_every_context_renders_inert_and_readable(markdown_like_the_site, context):
    template = _jinja().from_string(CONTEXTS[context])
    for text in HOSTILE:
        page = template.render(v=text, link=escape.href("../assets/plots/x--y--z.svg"))
        fragment = markdown_like_the_site(page)
        found = assert_inert(fragment, allowed_targets=("../assets/plots/x--y--z.svg",))
        if context.startswith("table") or context == "code in a table":
            assert found.cells and all(n == 2 for n in found.cells), (text, fragment)
        if context in ("prose", "code span", "code block", "table"):
            shown = " ".join("".join(found.text).replace("\u200b", "").split())
            wanted = " ".join(escape._CONTROLS.sub("\ufffd", text).split())
            assert wanted in shown, (text, fragment)


@pytest.mark.parametrize("text", BENIGN)
def test_benign_text_renders_as_before(markdown_like_the_site, text):
    template = _jinja().from_string(CONTEXTS["table"])
    plain = "| A | B |\n| --- | --- |\n| {0} | {0} |\n".format(text.replace("|", "\\|"))
    assert markdown_like_the_site(template.render(v=text)) == markdown_like_the_site(plain)


# --------------------------------------------------------------------------------------------------------
# A whole site from hostile records
# --------------------------------------------------------------------------------------------------------

SLUG = "softmax-row-fusion"
# Its first word is the GPU's short label on every index and plot (and would be TeX to matplotlib).
LABEL = "$\\notacommand$"
NAME = f"{LABEL} <img src=x onerror=alert(11)> <script>alert(12)</script> [x](javascript:alert(13)) `t` | p"
MULTILINE = 'boom\n```\n--8<-- ".git/config"\n--8<-- "no/such/file.md"\n<script>alert(14)</script>\n| a | b |'


def _hostile_records(records: Path) -> list[str]:
    """Two valid records whose every free-text field is hostile: the newest on the H200 (it names the GPU
    on every page) and one on the H100 whose profiler attempt failed with a hostile message."""
    from lab.evidence.store import compress, read_json

    base = next(data for path in sorted((REPO_ROOT / "records" / SLUG).glob("*.json.gz"), reverse=True)
                if (data := read_json(path)).get("profiling") and data["environment"]["gpu_key"] == "nvidia-h200")
    a = copy.deepcopy(base)
    a["run_id"] = "20991231T000000Z-nvidia-h200-aaaaaa"
    a["started_utc"] = a["finished_utc"] = "2099-12-31T00:00:00Z"
    a["command"] = ["tools/build_results.py", "`x`", "<script>alert(15)</script>", "|", "$(rm -rf /)"]
    env = a["environment"]
    env.update(gpu_name=NAME, cuda="<!--", torch="{: onclick=alert(16) }", python="[^1]")
    env["nvidia_smi"]["driver"] = "[x](javascript:alert(17))"
    a["git"]["commit"] = "<b>1234567890</b>"
    point = a["points"][0]
    point["results"]["liger"] = {"status": "error", "error": MULTILINE, "plan": None, "samples_ms": [],
                                 "p20_ms": None, "p50_ms": None, "p80_ms": None, "gbps": None,
                                 "pct_of_ceiling": None, "tflops": None, "rel_error": None, "reason": None,
                                 "profiling": {"error": MULTILINE}}
    point["results"]["triton-fused-row-softmax"]["plan"] = {"k": "`</code><script>alert(18)</script>", "p": "a|b"}
    for result in point["results"].values():
        for kernel in (result.get("profiling") or {}).get("kernels", []):
            kernel["name"] = "k`<script>alert(19)</script>|"
    a["profiling"]["ncu_version"] = "<img src=x onerror=alert(20)>"
    a["profiling"]["selection"]["rule"] = "[x](javascript:alert(21))"
    b = copy.deepcopy(base)
    b["run_id"] = "20991230T000000Z-nvidia-h100-80gb-hbm3-bbbbbb"
    b["started_utc"] = b["finished_utc"] = "2099-12-30T00:00:00Z"
    b["environment"].update(gpu_key="nvidia-h100-80gb-hbm3", gpu_name="H100 " + NAME)
    b["profiling"] = {"tool": "ncu", "error": MULTILINE, "command": ["ncu", "`", "<i>"], "ncu_version": None}
    names = []
    for data in (a, b):
        path = records / SLUG / f"{data['run_id']}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(compress(json.dumps(data).encode()))
        names.append(data["run_id"])
    return names


def _sandbox_config(text: str) -> str:
    """mkdocs.yml with its markdown, theme, hooks and validation as they are; plugins reduced to search, a nav
    of the generated sections and no watch list (the sandbox has no sources to watch)."""
    blocks = re.split(r"\n(?=[a-z_]+:)", text)
    kept = [b for b in blocks if not b.startswith(("plugins:", "nav:", "watch:"))]
    return "\n".join(kept) + ("\nplugins:\n  - search\nnav:\n  - Home: index.md\n  - Experiments:\n"
                              "      - experiments/index.md\n  - Decisions:\n      - decisions/index.md\n")


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory):
    require_vendored_assets()
    root = tmp_path_factory.mktemp("sandbox")
    (root / "mkdocs.yml").write_text(_sandbox_config((REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")),
                                     encoding="utf-8")
    (root / "tools").mkdir()
    for name in SITE_TOOLS:
        shutil.copy(REPO_ROOT / "tools" / name, root / "tools" / name)
    shutil.copytree(REPO_ROOT / "docs" / "assets", root / "docs" / "assets",
                    ignore=shutil.ignore_patterns("plots"))
    snippets = "\n\n".join(f'--8<-- "docs/generated/{n}.md"' for n in ("verdicts", "environment", SLUG))
    (root / "docs" / "index.md").write_text(f"# Home\n\n{snippets}\n", encoding="utf-8")
    # The evidence pages link the decision rule, stated once in the method.
    (root / "docs" / "method.md").write_text("# Method\n\n## From samples to a verdict\n", encoding="utf-8")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text(f"[core]\n\t{SECRET} = true\n", encoding="utf-8")
    runs = _hostile_records(root / "records")
    hand_written = {p: p.read_bytes() for p in (root / "docs").rglob("*") if p.is_file()}
    code = build_results.main(["--render-only", "--strict", "--records-dir", str(root / "records"),
                               "--docs-dir", str(root / "docs")])
    assert code == 0, "hostile text is valid text: every record renders"
    assert all(p.read_bytes() == content for p, content in hand_written.items())
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", **SHARED_CACHES}
    env.pop("TRITON_INTERPRET", None)
    proc = run_python(["-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")], cwd=root, env=env,
                      timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root, runs


def test_the_hostile_site_builds_strict_and_nothing_on_it_acts(hostile_site):
    root, runs = hostile_site
    pages = {p.relative_to(root / "site").as_posix(): p.read_text(encoding="utf-8")
             for p in (root / "site").rglob("*.html")}
    assert sorted(name for name, text in pages.items() if "alert(11)" in text) == \
        ["experiments/softmax-row-fusion/index.html", "index.html"], "the GPU's name: its page and the home page"
    labelled = [name for name, text in pages.items() if LABEL in "".join(inspect(text).text)]
    assert len(labelled) >= 3, "the GPU's label: the indexes, the home page and the experiment's page"
    for name, text in pages.items():
        found = inspect(text)
        assert found.events == [], name
        assert not [t for t in found.targets if re.sub(r"[\x00-\x20]", "", html.unescape(t)).lower()
                    .startswith(("javascript:", "vbscript:", "data:"))], name
        assert not re.search(r"<script[^>]*>[^<]*alert\(", text), name
        assert SECRET not in text, name
    page = pages[f"experiments/{SLUG}/index.html"]
    text = "".join(inspect(page).text)
    for shown in ("<script>alert(12)</script>", "<img src=x onerror=alert(11)>", "[x](javascript:alert(17))",
                  "<script>alert(14)</script>", '--8<-- ".git/config"', "k`<script>alert(19)</script>|",
                  "`</code><script>alert(18)</script>"):
        assert shown in text.replace("\u200b", ""), shown
    for run in runs:
        published = root / "site" / "records" / SLUG / f"{run}.json.gz"
        assert json.loads(gzip.decompress(published.read_bytes()))["run_id"] == run, "each record is published as stored"


def test_the_hostile_plots_show_the_name_as_text(hostile_site):
    import xml.etree.ElementTree as ET

    root, _ = hostile_site
    plots = sorted((root / "site" / "assets" / "plots").glob("*.svg"))
    assert plots
    for plot in plots:
        tree = ET.fromstring(plot.read_text(encoding="utf-8"))
        assert not [e for e in tree.iter() if e.tag.endswith("script") or e.tag.endswith("foreignObject")]
        assert not [k for e in tree.iter() for k in e.attrib if k.lower().startswith("on")]
    assert any(LABEL in (e.text or "") for plot in plots for e in ET.fromstring(plot.read_text(encoding="utf-8")).iter())


def test_the_hostile_site_keeps_its_tables_whole(hostile_site):
    root, _ = hostile_site
    page = (root / "docs" / "generated" / "environment.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    header = rows[0].count(" | ")
    assert all(re.sub(r"\\\|", "", row).count(" | ") == header for row in rows), "a pipe in a GPU name splits no cell"
