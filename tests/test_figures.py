"""Checked figures in hand-written pages (lab.publish.figures, wired in by tools/mkdocs_hooks.py).

The fixture records (tests/fixtures/lab) hold: fixture-single on Test GPU A (float16 Slower 0.761, float32
Faster 1.045: Rejected) and Test GPU B (both Faster: Supported); fixture-sweep on Test GPU A (Stale; three
Faster points and one Undecided).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_fixture_experiments as fx  # noqa: E402

from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.figures import FigureError, check_pages, expand  # noqa: E402


@pytest.fixture(scope="module")
def evidence():
    return collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, FIXTURES / "records", fx.CURRENT_HASHES)


def one(text: str, evidence) -> str:
    return expand(text, evidence, "docs/posts/x.md")


def refused(text: str, evidence) -> str:
    with pytest.raises(FigureError) as caught:
        one(text, evidence)
    return str(caught.value)


# --------------------------------------------------------------------------------------------------------
# fig: numbers from the newest run
# --------------------------------------------------------------------------------------------------------


def test_fig_renders_the_speedup_and_its_word(evidence):
    text = ('x {{ fig("fixture-single", gpu="Test GPU A", case="fx-*", dtype="float16") }} y '
            '{{ fig("fixture-single", gpu="nvidia-test-gpu-b", case="fx-4096x1024", dtype="float32", '
            'what="word") }}')
    assert one(text, evidence) == "x 0.76 y Faster"


def test_fig_renders_bounds_times_and_ceiling_shares(evidence):
    common = 'gpu="Test GPU A", case="fx-4096x1024", dtype="float32"'
    low = float(one(f'{{{{ fig("fixture-single", {common}, what="low", digits=4) }}}}', evidence))
    high = float(one(f'{{{{ fig("fixture-single", {common}, what="high", digits=4) }}}}', evidence))
    ratio = float(one(f'{{{{ fig("fixture-single", {common}, digits=4) }}}}', evidence))
    assert low <= ratio <= high
    ms = one(f'{{{{ fig("fixture-single", {common}, what="ms", profile="subject-kernel") }}}}', evidence)
    assert len(ms.split(".")[1]) == 3 and float(ms) > 0
    assert float(one(f'{{{{ fig("fixture-single", {common}, what="pct", profile="torch-baseline") }}}}',
                     evidence)) > 0


def test_fig_renders_tflops_and_the_share_of_the_runs_matmul_peak(tmp_path):
    # A copy of fixture-single's records with a FLOP count at every point and, in the newest GPU A run, a
    # measured matmul peak: the figures are the FLOP count over the median and its share of that peak.
    import json
    import shutil
    import statistics

    records = tmp_path / "records"
    shutil.copytree(FIXTURES / "records", records)
    newest = records / "fixture-single" / "20260301T100000Z-nvidia-test-gpu-a-a1a1a1.json"
    data = json.loads(newest.read_text())
    for point in data["points"]:
        point["flops"] = 3 * 10**9
    samples = [1.0, 1.001, 0.999, 1.002, 0.998]
    data["matmul_peak"] = {"dtype": "bfloat16", "m": 8192, "n": 8192, "k": 8192, "samples_ms": samples,
                           "tflops": 2 * 8192**3 / (statistics.median(samples) * 1e-3) / 1e12}
    newest.write_text(json.dumps(data))
    evidence = collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, records, fx.CURRENT_HASHES)
    assert not [p for p in evidence.problems if p.path.name == newest.name]  # the fixtures' bad record stays bad
    common = 'gpu="Test GPU A", case="fx-4096x1024", dtype="float32", profile="subject-kernel"'
    ms = float(one(f'{{{{ fig("fixture-single", {common}, what="ms", digits=6) }}}}', evidence))
    tflops = float(one(f'{{{{ fig("fixture-single", {common}, what="tflops", digits=4) }}}}', evidence))
    assert tflops == pytest.approx(3e9 / (ms * 1e-3) / 1e12, rel=1e-4)
    peak = float(one(f'{{{{ fig("fixture-single", {common}, what="peak", digits=3) }}}}', evidence))
    assert peak == pytest.approx(100 * tflops / data["matmul_peak"]["tflops"], rel=1e-3)
    assert "." not in one(f'{{{{ fig("fixture-single", {common}, what="tflops") }}}}', evidence)
    # GPU B's run has neither: each figure says what is missing
    b = 'gpu="Test GPU B", case="fx-4096x1024", dtype="float32", profile="subject-kernel"'
    assert "has no FLOP count" in refused(f'{{{{ fig("fixture-single", {b}, what="tflops") }}}}', evidence)


def unmarked(text: str) -> str:
    """The text without its "earlier code" marks (stale_mark)."""
    return re.sub(r'<sup class="kl-stale"[^>]*>.*?</sup>', "", text)


def test_fig_counts_points_and_words(evidence):
    text = ('{{ fig("fixture-sweep", gpu="Test GPU A", what="count", words="Faster") }} of '
            '{{ fig("fixture-sweep", gpu="Test GPU A", what="points") }}, '
            '{{ fig("fixture-sweep", gpu="Test GPU A", what="count", words="Slower|Undecided") }}')
    assert unmarked(one(text, evidence)) == "3 of 4, 1"
    assert "not a point's word" in refused('{{ fig("fixture-sweep", gpu="Test GPU A", what="count") }}', evidence)


def test_an_older_run_is_named_by_its_id(evidence):
    runs = sorted(r.run_id for r in evidence.runs["fixture-sweep"])
    assert len(runs) == 2, "the fixture needs two valid runs on one GPU"
    call = '{{{{ fig("fixture-sweep", {which}, case="4096x1024", dtype="float32", digits=4) }}}}'
    newest = unmarked(one(call.format(which='gpu="Test GPU A"'), evidence))
    assert one(call.format(which=f'run="{runs[-1][:16]}"'), evidence) == newest
    assert float(one(call.format(which=f'run="{runs[0]}"'), evidence)) > 0
    assert "names 2 runs" in refused(call.format(which='run="2026"'), evidence)
    assert "names 0 runs" in refused(call.format(which='run="1999"'), evidence)


@pytest.mark.parametrize("call, why", [
    ('fig("no-such-experiment", gpu="Test GPU A")', "no experiment has this slug"),
    ('fig("fixture-single", gpu="Test GPU C", case="fx-*", dtype="float16")', "no judged run on GPU"),
    ('fig("fixture-single", gpu="cpu-interpreter", case="fx-*", dtype="float16")', "no judged run on GPU"),
    ('fig("fixture-single", gpu="Test GPU A", case="nope", dtype="float16")', "match no point"),
    ('fig("fixture-single", gpu="Test GPU A", case="fx-*")', "names 2 points"),
    ('fig("fixture-single", case="fx-*", dtype="float16")', "needs gpu="),
    ('fig("fixture-single", gpu="Test GPU A", case="fx-*", dtype="float16", what="ms")', "needs profile="),
    ('fig("fixture-single", gpu="Test GPU A", case="fx-*", dtype="float16", what="ms", profile="peer")',
     "peer has no time"),
    ('fig("fixture-single", gpu="Test GPU A", case="fx-*", dtype="float16", what="mean")', "not one of"),
    ('fig("fixture-single", gpu="Test GPU A", colour="red")', "unknown argument colour"),
    ('fig("fixture-single", gpu=GPU)', "literals"),
    ('fig("fixture-single", gpu="A"', "not closed"),
    ('fig("fixture-single", gpu="A",,)', "does not parse"),
    ('fig(gpu="Test GPU A")', "slug first"),
])
def test_fig_refuses_what_the_records_cannot_answer(evidence, call, why):
    message = refused(f"line one\n\nsee {{{{ {call} }}}}", evidence)
    assert message.startswith("docs/posts/x.md:3: ") and why in message


# --------------------------------------------------------------------------------------------------------
# claim: verdict words and states, checked
# --------------------------------------------------------------------------------------------------------


def test_claims_that_hold_render_their_text(evidence):
    text = ('{{ claim("fixture-single", gpu="Test GPU B", every="Faster", text="faster everywhere") }}; '
            '{{ claim("fixture-single", gpu="Test GPU A", some="Slower", dtype="float16", text="slower in half") }}; '
            '{{ claim("fixture-sweep", case="4096x1024|4096x8192", every="Faster") }}'
            '{{ claim("fixture-sweep", none="Slower|Failed", verdict="Stale", text="never slower") }}; '
            '{{ claim("fixture-single", gpu="Test GPU A", verdict="Rejected|Inconclusive", text="not won") }}')
    assert unmarked(one(text, evidence)) == "faster everywhere; slower in half; never slower; not won"


def test_a_figure_from_a_stale_run_says_so_and_links_to_its_history(evidence):
    """fixture-sweep's newest run on Test GPU A is Stale; fixture-single's are not."""
    stale = one('{{ fig("fixture-sweep", gpu="Test GPU A", what="points") }}', evidence)
    (run,) = [r.run_id for r in evidence.runs["fixture-sweep"] if r.run_id == max(
        x.run_id for x in evidence.runs["fixture-sweep"])]
    assert stale.startswith("4<sup class=\"kl-stale\"") and f"From run {run}:" in stale
    assert "[earlier code](../experiments/fixture-sweep.md#history)</sup>" in stale
    assert expand('{{ fig("fixture-sweep", gpu="Test GPU A", what="points") }}', evidence, "docs/index.md") \
        .endswith("[earlier code](experiments/fixture-sweep.md#history)</sup>")
    current = one('{{ fig("fixture-single", gpu="Test GPU B", case="fx-4096x1024", dtype="float32") }}', evidence)
    assert "kl-stale" not in current, "a current run carries no mark"
    named = one(f'{{{{ fig("fixture-sweep", run="{run}", what="points") }}}}', evidence)
    assert named == "4", "a run named on purpose carries no mark"
    assert one('{{ claim("fixture-sweep", none="Failed") }}', evidence) == "", "a claim with no text shows nothing"


@pytest.mark.parametrize("call, why", [
    # "*" is every GPU with a run: Test GPU A has a Slower float16 point
    ('claim("fixture-single", every="Faster")', "every='Faster' does not hold on Test GPU A run"),
    ('claim("fixture-single", gpu="Test GPU B", some="Slower")', "some='Slower' does not hold on Test GPU B"),
    ('claim("fixture-sweep", none="Undecided")', "4096x2048 (float32) Undecided"),
    ('claim("fixture-single", gpu="Test GPU B", verdict="Rejected")', "says Supported, not Rejected"),
    ('claim("fixture-single", every="Quicker")', "Quicker is not a point's word"),
    ('claim("fixture-single", verdict="Won")', "Won is not a state"),
    ('claim("fixture-single", text="unchecked")', "states nothing to check"),
    ('claim("fixture-single", every="Faster", clock="wall")', "clock 'wall' is not one of"),
    ('claim("fixture-empty", every="Faster")', "no GPU has a judged run"),
])
def test_claims_that_do_not_hold_fail_naming_the_line(evidence, call, why):
    message = refused(f"# Title\n{{{{ {call} }}}}\n", evidence)
    assert message.startswith("docs/posts/x.md:2: ") and why in message


def test_every_failing_call_of_a_page_is_listed(evidence):
    page = ('{{ claim("fixture-single", every="Faster") }}\n'
            'fine {{ fig("fixture-single", gpu="Test GPU B", case="fx-*", dtype="float32") }}\n'
            '{{ fig("gone", gpu="Test GPU A") }}\n')
    lines = refused(page, evidence).splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == ["docs/posts/x.md:1", "docs/posts/x.md:3"]


def test_a_stale_figure_planted_in_a_post_fails_with_its_path_and_line(evidence, tmp_path):
    post = tmp_path / "docs" / "posts" / "planted.md"
    post.parent.mkdir(parents=True)
    post.write_text("# Planted\n\nText.\n\nThe kernel is {{ claim(\"fixture-single\", gpu=\"Test GPU A\", "
                    "every=\"Faster\", text=\"faster at every point\") }} on Test GPU A.\n", encoding="utf-8")
    problems = check_pages([("docs/posts/planted.md", post.read_text(encoding="utf-8"))], evidence)
    assert len(problems) == 1
    assert problems[0].startswith("docs/posts/planted.md:5: claim('fixture-single'): every='Faster' does not hold")
    assert "fx-4096x1024 (float16) Slower" in problems[0]


def test_the_site_hook_fails_the_build_on_a_planted_figure(evidence, tmp_path, monkeypatch):
    from mkdocs.exceptions import PluginError

    spec = importlib.util.spec_from_file_location("kernel_lab_hooks_test", ROOT / "tools" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    monkeypatch.setattr(hooks, "evidence_for", lambda root: evidence)
    page = 'one\ntwo {{ fig("fixture-single", gpu="Test GPU A", case="fx-*", dtype="float16", what="wrod") }}\n'
    with pytest.raises(PluginError) as caught:
        hooks.expand_figures(page, "docs/posts/planted.md", ROOT)
    assert "docs/posts/planted.md:2: fig('fixture-single'): what='wrod'" in str(caught.value)
    assert hooks.expand_figures("no calls here {{ x }}", "docs/index.md", ROOT) == "no calls here {{ x }}"
    # MkDocs hands the hook the page without its front matter: the line named is still the file's
    post = tmp_path / "planted.md"
    post.write_text("---\ndate: 2026-11-26\nslug: planted\n---\n\n# Planted\n" + page, encoding="utf-8")
    body = post.read_text(encoding="utf-8").split("---\n", 2)[2]
    with pytest.raises(PluginError) as caught:
        hooks.expand_figures(body, "docs/posts/planted.md", ROOT, str(post))
    assert "docs/posts/planted.md:8: fig('fixture-single')" in str(caught.value)


# --------------------------------------------------------------------------------------------------------
# The site's own pages against the site's own records
# --------------------------------------------------------------------------------------------------------


def test_every_checked_figure_on_the_site_holds_against_the_records():
    from experiments import all_experiments
    from experiments.decisions import DECISIONS
    from lab.evidence.hashing import source_hashes

    experiments = all_experiments()
    hashes = {slug: source_hashes(e, ROOT) for slug, e in experiments.items()}
    real = collect_evidence(experiments, DECISIONS, ROOT / "records", hashes)
    files = [*(ROOT / "docs").rglob("*.md"), *(ROOT / "notes").glob("*.md")]
    pages = [(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
             for path in sorted(files) if "generated" not in path.parts]
    assert any("{{ claim(" in text or "{{ fig(" in text for _, text in pages)
    assert check_pages(pages, real) == []
