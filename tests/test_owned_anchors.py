"""Hand-written pages link into generated pages only through anchors the project owns: ids the renderer sets
from validated names (`gpu-<gpu key>[-<dtype>][-roofline|-breakdown|-eager-call]`, `clock-<clock>`) or headings
the templates write without a record's text. A record's GPU name, however hostile, moves none of them; a site
whose newest record is hostile still builds with `mkdocs build --strict`, posts and their links included."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from lab import REPO_ROOT
from lab.publish.views import page_anchor
from sitetools import SHARED_CACHES, SITE_TOOLS, posts, require_vendored_assets
from warm_python import run_python

DOCS = REPO_ROOT / "docs"
GENERATED = ("generated", "experiments", "decisions")
TEMPLATES = REPO_ROOT / "lab" / "publish" / "templates"
LINK = re.compile(r"\]\(([^)\s]+?\.md)#([^)\s]+)\)")
OWNED = re.compile(r"(gpu-[a-z0-9]+(?:[._-][a-z0-9]+)*|clock-(?:gpu-time|eager-call))")


def _hand_written() -> list[Path]:
    return [p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in GENERATED]


def _fixed_headings() -> set[str]:
    """Slugs of the headings the experiment and decision templates write from their own words only."""
    found = set()
    for template in TEMPLATES.glob("*.j2"):
        for line in template.read_text(encoding="utf-8").splitlines():
            if re.match(r"#{1,6} ", line) and "{" not in line:
                words = line.lstrip("#").strip().lower()
                found.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", words)))
    return found


def test_hand_written_pages_link_into_generated_pages_only_by_owned_anchors():
    fixed = _fixed_headings()
    assert {"history", "decision-rule", "results"} <= fixed
    checked = 0
    for page in _hand_written():
        for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(DOCS) or resolved.relative_to(DOCS).parts[0] not in GENERATED:
                continue
            checked += 1
            assert OWNED.fullmatch(anchor) or anchor in fixed, (
                f"{page.relative_to(REPO_ROOT)} links to #{anchor} on {target}: a slug of record text; link to an "
                "id the renderer sets (gpu-<key>-..., clock-...) or to a heading of the template's own words")
    assert checked, "the posts link into experiment pages; the check found none"


def test_every_published_post_is_on_the_home_page():
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    missing = [p.name for p in posts(include_drafts=False) if f"](posts/{p.name})" not in home]
    assert not missing, f"docs/index.md lists no card for {missing}"


def test_page_anchors_are_made_of_validated_names_only():
    assert page_anchor("nvidia-h100-80gb-hbm3", "roofline") == "gpu-nvidia-h100-80gb-hbm3-roofline"
    assert page_anchor("nvidia-h200", "bfloat16", "breakdown") == "gpu-nvidia-h200-bfloat16-breakdown"
    for bad in ("NVIDIA H100", "x<script>", "a b", "", "gpu}{#x"):
        with pytest.raises(ValueError, match="anchor"):
            page_anchor(bad)
        with pytest.raises(ValueError, match="anchor"):
            page_anchor("nvidia-h100", bad)


# ---- a site whose newest decoder-block record is hostile, built strict with every post ------------------

SLUG = "decoder-block"
GPU_KEY = "nvidia-h100-80gb-hbm3"
NAME = "NVIDIA H100 <b>80GB</b> `HBM3` [x](javascript:alert(1)) {#nvidia-h100-80gb-hbm3-roofline} | # roofline"


def _hostile_newest(records: Path) -> None:
    """Copy the real records (the posts' checked figures read them), then add on top of decoder-block's a copy of
    its newest record on GPU_KEY with markup in its GPU name (same key, so the posts' figures still hold), and a still newer one whose run id is not its file's
    name (refused, so the render goes on without it)."""
    from lab.evidence.store import compress, read_json

    shutil.copytree(REPO_ROOT / "records", records)
    base = next(data for path in sorted((records / SLUG).glob("*.json.gz"), reverse=True)
                if (data := read_json(path))["environment"]["gpu_key"] == GPU_KEY)
    hostile = copy.deepcopy(base)
    hostile["run_id"] = f"20991231T000000Z-{GPU_KEY}-aaaaaa"
    hostile["started_utc"] = hostile["finished_utc"] = "2099-12-31T00:00:00Z"
    hostile["environment"]["gpu_name"] = NAME
    (records / SLUG / f"{hostile['run_id']}.json.gz").write_bytes(compress(json.dumps(hostile).encode()))
    renamed = copy.deepcopy(hostile)
    renamed["run_id"] = f"20991231T010000Z-{GPU_KEY}-bbbbbb"
    renamed["started_utc"] = renamed["finished_utc"] = "2099-12-31T01:00:00Z"
    (records / SLUG / f"20991231T010000Z-{GPU_KEY}-cccccc.json.gz").write_bytes(
        compress(json.dumps(renamed).encode()))


def _render_one(root: Path, slug: str) -> list:
    """Render `slug`'s own pages, points pages, plots and home-page snippet from root/records over the copies in
    root/docs (the other experiments' pages stay as the repository's records render them; the hostile text in
    every template, index and snippet is tests/test_hostile_pages.py's). Returns the records refused."""
    from experiments import all_experiments
    from lab.evidence.hashing import source_hashes
    from lab.publish.collect import collect_evidence
    from lab.publish.render import render_outputs
    from lab.publish.views import PLOTS_DIR

    experiment = all_experiments()[slug]
    own_records = root / "render-records"  # the slug's records alone: the others would only be named undeclared
    shutil.copytree(root / "records" / slug, own_records / slug)
    found = collect_evidence({slug: experiment}, (), own_records, {slug: source_hashes(experiment, REPO_ROOT)})
    own = (f"experiments/{slug}.md", f"generated/{slug}.md", f"points/{slug}--", f"{PLOTS_DIR}/{slug}--")
    written = 0
    for rel, text in render_outputs(found).items():
        if rel in own[:2] or rel.startswith(own[2:]):
            (root / "docs" / rel).write_text(text, encoding="utf-8")
            written += 1
    assert written > 3, "the experiment's page, its points pages and its plots"
    return list(found.problems)


def _sandbox_config(text: str) -> str:
    """mkdocs.yml with its markdown, theme, hooks and validation as they are; plugins reduced to search and no
    watch list (the sandbox has no sources to watch). Without the blog plugin the posts are plain pages.

    The per-point pages of every experiment but the hostile record's are left out of the build (no post links
    to them; they are half the site's Markdown), so a link to one is reported at info level, not as a warning:
    every other link and every anchor is checked as strictly as on the site."""
    blocks = re.split(r"\n(?=[a-z_]+:)", text)
    kept = [b for b in blocks if not b.startswith(("plugins:", "nav:", "watch:"))]
    for i, block in enumerate(kept):
        if block.startswith("exclude_docs: |"):
            kept[i] = block.replace("exclude_docs: |\n", f"exclude_docs: |\n  /points/*\n  !/points/{SLUG}--*\n", 1)
        elif block.startswith("validation:"):
            assert "  links:\n    not_found: warn" in block, block
            kept[i] = block.replace("  links:\n    not_found: warn", "  links:\n    not_found: info")
    return "\n".join(kept) + "\nplugins:\n  - search\n"


@pytest.mark.slow
def test_a_hostile_newest_record_leaves_every_post_link_working(tmp_path):
    require_vendored_assets()
    root = tmp_path
    (root / "mkdocs.yml").write_text(_sandbox_config((REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")),
                                     encoding="utf-8")
    (root / "tools").mkdir()
    for name in SITE_TOOLS:
        shutil.copy(REPO_ROOT / "tools" / name, root / "tools" / name)
    shutil.copytree(DOCS, root / "docs")  # every other experiment's pages as the repository's records render them
    _hostile_newest(root / "records")
    problems = _render_one(root, SLUG)
    assert any("20991231T010000Z" in str(p) for p in problems), "the renamed record is refused and named"
    page = (root / "docs" / "experiments" / f"{SLUG}.md").read_text(encoding="utf-8")
    assert f"{{ #gpu-{GPU_KEY}-roofline }}" in page and "20991231T000000Z" in page, "the hostile record is newest"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", **SHARED_CACHES}
    env.pop("TRITON_INTERPRET", None)
    proc = run_python(["-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")], cwd=root, env=env,
                      timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (root / "site" / "points" / f"{SLUG}--{GPU_KEY}" / "index.html").is_file(), "the hostile points page"
    post = (DOCS / "posts" / "forward-pass.md").read_text(encoding="utf-8")
    linked = re.findall(r"experiments/([a-z-]+)\.md#([\w.-]+)", post)
    assert (SLUG, f"gpu-{GPU_KEY}-roofline") in linked
    for slug, anchor in linked:
        built = (root / "site" / "experiments" / slug / "index.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in built, (slug, anchor)
        assert not re.search(r'href="\s*javascript:', built, re.I)
