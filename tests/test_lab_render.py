"""Rendering: golden pages from the fixture records, byte-identical re-renders, invalid records skipped.

Refresh the golden pages after an intended change with

    UPDATE_GOLDEN=1 python -m pytest tests/test_lab_render.py

and review the diff under tests/fixtures/lab/golden/ like any other change.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_fixture_experiments as fx  # noqa: E402
import lab_synthetic as syn  # noqa: E402

from lab.publish.collect import collect_evidence  # noqa: E402

from lab.publish.render import GENERATED_HEADER, render_outputs, write_outputs  # noqa: E402
from lab.evidence.verdict import INCONCLUSIVE, NO_EVIDENCE, REJECTED, STALE, SUPPORTED  # noqa: E402
from labtools import page_table  # noqa: E402

RECORDS = FIXTURES / "records"
GOLDEN = FIXTURES / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _evidence(records=RECORDS):
    return collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, records, fx.CURRENT_HASHES)


@pytest.fixture(scope="module")
def outputs():
    return render_outputs(_evidence())


def test_fixture_set_reaches_every_verdict():
    verdicts = _evidence().verdicts
    states = {(slug, key): v.state for slug, by_gpu in verdicts.items() for key, v in by_gpu.items()}
    assert states == {
        ("fixture-single", "nvidia-test-gpu-a"): REJECTED,
        ("fixture-single", "nvidia-test-gpu-b"): SUPPORTED,
        ("fixture-single", "cpu-interpreter"): NO_EVIDENCE,
        ("fixture-sweep", "nvidia-test-gpu-a"): STALE,
    }
    assert verdicts["fixture-sweep"]["nvidia-test-gpu-a"].data_state == INCONCLUSIVE
    assert verdicts["fixture-empty"] == {}


def test_invalid_records_are_named_and_the_rest_render(outputs):
    problems = {p.path.name: p.problem for p in _evidence().problems}
    assert sorted(problems) == [
        "20260305T000000Z-nvidia-test-gpu-a-f6f6f6.json",
        "20260306T000000Z-nvidia-test-gpu-a-0a0a0a.json",
        "20260307T000000Z-nvidia-test-gpu-b-0b0b0b.json",
        "20260308T000000Z-nvidia-test-gpu-a-0c0c0c.json",
    ]
    assert problems["20260305T000000Z-nvidia-test-gpu-a-f6f6f6.json"].startswith("not valid JSON")
    assert problems["20260306T000000Z-nvidia-test-gpu-a-0a0a0a.json"] == (
        "unknown schema_version 99; this lab reads version(s) 1")
    assert problems["20260307T000000Z-nvidia-test-gpu-b-0b0b0b.json"] == "record: missing field 'copy_ceiling'"
    assert problems["20260308T000000Z-nvidia-test-gpu-a-0c0c0c.json"] == (
        "no declared experiment is named 'fixture-gone'")
    assert "0a0a0a" not in outputs["experiments/fixture-single.md"]
    assert "20260301T100000Z-nvidia-test-gpu-a-a1a1a1" in outputs["experiments/fixture-single.md"]


def test_pages_match_the_golden_files(outputs):
    pages = {rel: text for rel, text in outputs.items() if rel.endswith(".md")}
    if UPDATE:
        for old in GOLDEN.rglob("*.md"):
            old.unlink()
        for rel, text in pages.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_text(text, encoding="utf-8")
    golden = {p.relative_to(GOLDEN).as_posix(): p.read_text(encoding="utf-8") for p in GOLDEN.rglob("*.md")}
    assert sorted(pages) == sorted(golden), "set UPDATE_GOLDEN=1 to refresh the golden pages"
    for rel in pages:
        assert pages[rel] == golden[rel], f"{rel} differs from its golden file; UPDATE_GOLDEN=1 refreshes it"


def test_rendering_twice_gives_identical_bytes_plots_included(outputs):
    again = render_outputs(_evidence())
    assert again == outputs
    assert {rel for rel in outputs if rel.endswith(".svg")} == {
        "assets/plots/fixture-single--cpu-interpreter--float16.svg",
        "assets/plots/fixture-single--nvidia-test-gpu-a--float16.svg",
        "assets/plots/fixture-single--nvidia-test-gpu-a--float32.svg",
        "assets/plots/fixture-single--nvidia-test-gpu-b--float16.svg",
        "assets/plots/fixture-single--nvidia-test-gpu-b--float32.svg",
        "assets/plots/fixture-single--speedup--float16.svg",
        "assets/plots/fixture-single--speedup--float32.svg",
        "assets/plots/fixture-sweep--nvidia-test-gpu-a--float32.svg",
        "assets/plots/fixture-sweep--speedup--float32.svg",
    }


def test_plots_are_valid_svg_with_the_data_and_no_date(outputs):
    sweep = outputs["assets/plots/fixture-sweep--nvidia-test-gpu-a--float32.svg"]
    ET.fromstring(sweep)
    assert "copy ceiling (3,000 GB/s)" in sweep
    for name in ("subject-kernel (subject)", "base-one", "base-two"):
        assert name in sweep
    assert "wrong" not in sweep.split("</metadata>")[-1], "an incorrect profile is never plotted"
    # a peer that declines some points says so once, in its legend entry, and nowhere else
    assert sweep.count("unsupported") == 1 and "base-two (unsupported for N &gt; 2,048)" in sweep
    assert "<dc:date>" not in sweep
    bars = outputs["assets/plots/fixture-single--cpu-interpreter--float16.svg"]
    assert "cpu-interpreter: not performance evidence" in bars and "unavailable" in bars


def _drawing_order(svg: str, labels) -> list[int]:
    body = svg.split("</metadata>")[-1]
    return [body.index(f">{label}</text>") for label in labels]


def test_the_subject_is_drawn_last_in_one_colour_on_every_plot(outputs):
    from lab.publish.plots import SUBJECT_COLOUR

    for rel in ("assets/plots/fixture-sweep--nvidia-test-gpu-a--float32.svg",
                "assets/plots/fixture-single--nvidia-test-gpu-b--float32.svg"):
        svg = outputs[rel]
        assert SUBJECT_COLOUR in svg, rel
        # the legend lists the profiles in the order they were drawn
        first, last = _drawing_order(svg, ("base-one" if "sweep" in rel else "torch-baseline", "subject-kernel (subject)"))
        assert first < last, rel


def test_speedup_plots_show_the_margin_band_and_every_gpu(outputs):
    single = outputs["assets/plots/fixture-single--speedup--float16.svg"]
    ET.fromstring(single)
    assert "tie: margin ±1.0% (Level)" in single
    assert "Test GPU A" in single and "Test GPU B" in single
    sweep = outputs["assets/plots/fixture-sweep--speedup--float32.svg"]
    assert "tie: margin ±1.0% (Level)" in sweep and "Test GPU A" in sweep


def test_pages_carry_the_rule_before_the_data_and_the_evidence_marks(outputs):
    single = outputs["experiments/fixture-single.md"]
    assert single.startswith(GENERATED_HEADER)
    # The claim and its margin open the page, in the summary card; this page's terms of the rule follow the
    # speedups, and the rule itself is stated once, in the method (linked).
    assert single.index("Margin ±1.0%") < single.index("## GPUs side by side") < single.index("## Decision rule") \
        < single.index("## Results")
    assert "Margin ±1.0%" in single and "fixture: the spread the synthetic records were built with" in single
    assert 'class="kl-badge kl-badge--rejected"' in single and 'class="kl-badge kl-badge--supported"' in single
    fp16 = _evidence().verdicts["fixture-single"]["nvidia-test-gpu-a"].points[0].speedup
    assert f"{fp16.ratio:.3f}× [{fp16.low:.3f}, {fp16.high:.3f}]" in single, "the subject's speedup and its interval"
    assert "cpu-interpreter: not performance evidence" in single
    assert "../records/fixture-single/20260302T090000Z-nvidia-test-gpu-b-b2b2b2.json" in single
    sweep = outputs["experiments/fixture-sweep.md"]
    assert "Stale: the code has changed since this run" in sweep and "`fixture/sweep.py`" in sweep
    assert '<span class="kl-incorrect">✗ incorrect</span>' in sweep
    empty = outputs["experiments/fixture-empty.md"]
    assert "No evidence yet" in empty and "python tools/build_results.py fixture-empty" in empty
    decision = outputs["decisions/fixture-decision.md"]
    assert '!!! kl-box-rejected "Test GPU A: Rejected"' in decision and "Do not present it as a win." in decision
    assert "(/experiments/fixture-single.md)" in outputs["generated/verdicts.md"]


def test_the_history_keeps_every_run_with_the_verdict_its_data_gives(outputs):
    sweep = outputs["experiments/fixture-sweep.md"]
    history = sweep[sweep.index("## History"):sweep.index("## Results")]
    rows = [line for line in history.splitlines() if line.startswith('| <span class="kl-nw">2026-')]
    assert len(rows) == 2
    newest, older = rows
    assert "kl-badge--inconclusive" in newest and "newest, stale" in newest
    assert "kl-badge--rejected" in older and "superseded" in older and "`0123456789 (dirty)`" in older
    # The newest run links the record the page's numbers come from; the superseded one, which the site does
    # not serve, is named by its path in the repository, and its square links nowhere.
    assert "[`e5e5e5`](../records/fixture-sweep/20260304T070000Z-nvidia-test-gpu-a-e5e5e5.json)" in newest
    assert "| `records/fixture-sweep/20260220T120000Z-nvidia-test-gpu-a-d4d4d4.json` | superseded |" in older
    assert "d4d4d4.json)" not in sweep and "d4d4d4.json " not in sweep
    assert history.count("{ .kl-tick .kl-tick--") == 1
    assert history.count('<span class="kl-tick kl-tick--rejected" title="2026-02-20 12:00 UTC') == 1
    assert "the repository keeps every record" in history


def test_a_run_a_page_cites_is_linked_from_the_history():
    from lab.publish.figures import cited_runs
    from lab.publish.served import served_runs

    evidence = _evidence()
    older = "20260220T120000Z-nvidia-test-gpu-a-d4d4d4"
    post = 'Then {{ fig("fixture-sweep", run="20260220T12", what="points") }} points, and ' \
           '{{ fig("fixture-sweep", run="2026", what="points") }} (two runs: cites neither).'
    assert cited_runs([post, "no figures here"], evidence) == {older}
    assert older not in served_runs(evidence) and older in served_runs(evidence, {older, "19990101T000000Z-x"})
    assert "19990101T000000Z-x" not in served_runs(evidence, {"19990101T000000Z-x"})
    page = render_outputs(evidence, cited={older})["experiments/fixture-sweep.md"]
    history = page[page.index("## History"):page.index("## Results")]
    assert f"[`d4d4d4`](../records/fixture-sweep/{older}.json)" in history
    assert history.count("{ .kl-tick .kl-tick--") == 2 and "the repository keeps every record" not in history


def test_the_summary_card_and_the_gpus_side_by_side(outputs):
    single = outputs["experiments/fixture-single.md"]
    card = single[single.index('<div class="kl-card"'):single.index("## GPUs side by side")]
    for gpu in ("Test GPU A", "Test GPU B"):
        assert f"**{gpu}**" in card
    assert "kl-word--slower" in card and "kl-word--faster" in card
    assert "[`a1a1a1`](../records/fixture-single/20260301T100000Z-nvidia-test-gpu-a-a1a1a1.json)" in card
    assert "Margin **" in card and "](../method.md#from-samples-to-a-verdict)" in card  # the rule, linked once
    assert card.index("| Point | Speedup [95% CI] | Word |") < card.index("Best baseline")  # the answer first
    side = single[single.index("## GPUs side by side"):single.index("## Decision rule")]
    assert "| Case | Test GPU A: word, speedup [95% CI] | Test GPU B: word, speedup [95% CI] |" in side
    assert "different commits" in side or "one commit" in side


def test_commands_are_shown_as_a_reader_runs_them():
    from lab.publish.formatting import reader_command

    recorded = ["tools/build_results.py", "--run", "x", "--no-progress", "--records-dir", "/root/out/rec",
                "--docs-dir=/tmp/docs"]
    assert reader_command(recorded) == "python tools/build_results.py --run x"
    assert reader_command(["/usr/local/cuda/bin/ncu", "--csv", "/opt/torch/.venv/bin/python3", "-m", "m"]) == (
        "ncu --csv python3 -m m")


def test_no_records_at_all_still_gives_every_page(tmp_path):
    (tmp_path / "none").mkdir()
    outputs = render_outputs(_evidence(tmp_path / "none"))
    assert not [rel for rel in outputs if rel.endswith(".svg")]
    expected = {"experiments/index.md", "decisions/index.md", "generated/verdicts.md", "generated/environment.md",
                "generated/legend.md", "generated/rule.md"}
    expected |= {f"experiments/{slug}.md" for slug in fx.EXPERIMENTS}
    expected |= {f"generated/{slug}.md" for slug in fx.EXPERIMENTS}
    expected |= {f"decisions/{d.slug}.md" for d in fx.DECISIONS}
    assert set(outputs) == expected
    for slug in fx.EXPERIMENTS:
        assert "No evidence yet" in outputs[f"experiments/{slug}.md"]
    assert "No evidence yet" in outputs["experiments/index.md"]
    assert "No device has been measured yet" in outputs["generated/environment.md"]


def test_writing_replaces_only_generated_files(tmp_path, outputs):
    docs = tmp_path / "docs"
    retired = {"experiments/retired.md": f"{GENERATED_HEADER}\n\n# Retired\n",
               "assets/plots/retired--nvidia-test-gpu-a--float32.svg": "<svg/>"}
    first = write_outputs({**outputs, **retired}, docs)
    assert sorted(first.written) == sorted({**outputs, **retired}) and not first.removed
    second = write_outputs({**outputs, **retired}, docs)
    assert second.written == [] and sorted(second.unchanged) == sorted({**outputs, **retired})

    hand_written = docs / "experiments" / "notes.md"
    hand_written.write_text("# Notes written by hand\n", encoding="utf-8")
    looks_generated = docs / "experiments" / "copied.md"  # carries the header, but no render wrote it
    looks_generated.write_text(f"{GENERATED_HEADER}\n\n# Copied\n", encoding="utf-8")
    third = write_outputs(outputs, docs)
    assert sorted(third.removed) == sorted(retired), "what the last render wrote and this one does not"
    assert hand_written.read_text(encoding="utf-8") == "# Notes written by hand\n"
    assert looks_generated.is_file(), "only files the manifest lists are ever deleted"
    assert not list(docs.rglob(".*.tmp"))


# ---- the eager-call clock on the reader's views ------------------------------------------------------------


def _eager_evidence():
    """Two GPUs: A measured both clocks (the subject wins on GPU time, ties on the eager call), B only GPU time."""
    from dataclasses import replace as swap

    import lab_synthetic as syn

    from experiments.spec import PARITY
    from lab.evidence.records import EagerMethod, EagerResult
    from lab.evidence.stats import summarize

    def eager(ms):
        s = summarize([ms] * 12)
        return EagerResult(tuple([ms] * 12), tuple([ms / 2] * 12), 50, s.p20, s.p50, s.p80, ms / 2,
                           128 / (ms * 1e-3) / 1e9)

    experiment = syn.experiment(kind=PARITY, margin=0.02)
    hashes = {"kernels/k.py": "a" * 64}
    both = syn.point({"subject": swap(syn.timed([1.0] * 30), eager=eager(5.0)),
                      "base": swap(syn.timed([1.5] * 30), eager=eager(5.02))})
    method = EagerMethod("host clock", 1 << 20, 1, 12, 0.004, 10, 1000, 64)
    run_a = swap(syn.run([both], hashes=hashes, started="2026-01-02T00:00:00Z"), eager=method)
    older = syn.run([syn.point({"subject": syn.timed([2.0] * 30), "base": syn.timed([1.0] * 30)})], hashes=hashes,
                    started="2026-01-01T00:00:00Z")
    run_b = syn.run([syn.point({"subject": syn.timed([1.0] * 30), "base": syn.timed([1.2] * 30)})], hashes=hashes,
                    gpu=("nvidia-test-gpu-b", "NVIDIA Test GPU B"), started="2026-01-03T00:00:00Z")
    with __import__("tempfile").TemporaryDirectory() as folder:
        from lab.evidence.store import write_record

        for run in (run_a, older, run_b):
            write_record(run, Path(folder))
        evidence = collect_evidence({experiment.slug: experiment}, (), Path(folder), {experiment.slug: hashes})
    return experiment, evidence


def test_both_clocks_reach_the_card_the_side_by_side_and_the_history():
    experiment, evidence = _eager_evidence()
    outputs = render_outputs(evidence)
    page = outputs[f"experiments/{experiment.slug}.md"]
    card = page[page.index('<div class="kl-card"'):page.index("## Decision rule")]
    assert "GPU time (the claim's clock, ±2.0%): <span class=\"kl-badge kl-badge--supported\"" in card
    assert "Eager call (±2.0%): <span class=\"kl-badge kl-badge--supported\"" in card, "a tie on the eager call meets parity"
    assert "Eager call (±2.0%): <span class=\"kl-badge kl-badge--no-evidence\"" in card and "not measured in this run" in card
    assert card.index("GPU time (the claim's clock") < card.index("Eager call ("), "the claim's clock first"
    assert "kl-word--level" in card and "kl-word--faster" in card
    # the card's table holds the claim's clock; the other clock's lowest and highest fold away under it
    table, folded = card.split("<summary>Eager call clock: the same points' lowest and highest speedups</summary>")
    assert "| Clock |" not in card and "on the GPU time clock, the claim's" in table
    assert "kl-word--" in table.split("| Point |", 1)[1] and "kl-word--" in folded and "</details>" in folded
    side = page[page.index("## GPUs side by side"):page.index("## History")]
    assert "### GPU time { #clock-gpu-time }" in side and "### Eager call { #clock-eager-call }" in side
    assert f"assets/plots/{experiment.slug}--speedup-eager-call--float32.svg" in outputs
    history = page[page.index("## History"):page.index("## Results")]
    assert "| Started (UTC) | GPU | Commit | GPU time | Points | Eager call | Points | Run | Status |" in history
    rows = [line for line in history.splitlines() if line.startswith('| <span class="kl-nw">')]
    assert len(rows) == 3
    assert "kl-badge--rejected" in rows[-1] and "superseded" in rows[-1], "the older run's own verdict is kept"
    assert history.count(", Eager call (1 run)") == 1
    assert "#### NVIDIA Test GPU A · Eager call { #gpu-nvidia-test-gpu-a-eager-call }" in page and "GPU time only: this run was recorded before" in page


def test_paged_points_put_each_clock_on_a_page_of_its_own(monkeypatch):
    from lab.publish import views

    monkeypatch.setattr(views, "POINTS_ON_PAGE", 0)  # every experiment's points go to point-by-point pages
    experiment, evidence, _, _ = _flops_evidence(True)
    outputs = render_outputs(evidence)
    slug = experiment.slug
    pages = sorted(name for name in outputs if name.startswith(f"points/{slug}--"))
    measured = [name.removesuffix("--eager-call.md").removeprefix(f"points/{slug}--") for name in pages
                if name.endswith("--eager-call.md")]
    assert measured, "a GPU whose newest run measured the eager call has that clock's page"
    for key in measured:
        gpu_time = outputs[f"points/{slug}--{key}.md"]
        eager = outputs[f"points/{slug}--{key}--eager-call.md"]
        assert "· Eager call {" not in gpu_time and f"(../points/{slug}--{key}--eager-call.md)" in gpu_time
        assert "· Eager call {" in eager and "| Case | Speedup [95% CI] |" in eager
        assert f"(../points/{slug}--{key}.md)" in eager and f"(../experiments/{slug}.md#gpu-{key}-eager-call)" in eager
        assert f"(../points/{slug}--{key}--eager-call.md)" in outputs[f"experiments/{slug}.md"]
    assert not any(name.startswith("points/") for name in render_outputs(_eager_evidence()[1])), \
        "one point a dtype: no point-by-point pages"


# ---- TFLOP/s beside the time on multi-point pages of experiments with a FLOP model ------------------------

FLOPS = 3_000_000_000


def _flops_evidence(flop_model: bool):
    """Three points on one GPU, both clocks: c1 and c2 carry a FLOP count (when `flop_model`), c3 none."""
    from dataclasses import replace as swap

    import lab_synthetic as syn

    from experiments.spec import Case
    from lab.evidence.records import EagerMethod, EagerResult
    from lab.evidence.stats import summarize

    def tflops(flops, ms):  # what the runner records: FLOPs over the median time
        return flops / (ms * 1e-3) / 1e12 if flops is not None else None

    def eager(ms, flops):
        s = summarize([ms] * 12)
        return EagerResult(tuple([ms] * 12), tuple([ms / 2] * 12), 50, s.p20, s.p50, s.p80, ms / 2,
                           128 / (ms * 1e-3) / 1e9, None, tflops(flops, ms))

    def result(ms, eager_ms, flops):
        return swap(syn.timed([ms] * 30, tflops=tflops(flops, ms)), eager=eager(eager_ms, flops))

    cases = {"c1": (0.5, 0.75, 2.0, 2.5), "c2": (2.0, 2.5, 4.0, 4.5), "c3": (1.0, 1.25, 2.0, 2.5)}
    flops_of = {"c1": FLOPS, "c2": 2 * FLOPS, "c3": None} if flop_model else dict.fromkeys(cases)
    experiment = syn.experiment(slug="flop-sweep")
    experiment = swap(experiment, cases=tuple(Case(c, {"M": 2, "N": 8}) for c in cases),
                      flops=(lambda case, dtype: flops_of[case.name]) if flop_model else None)
    points = [swap(syn.point({"subject": result(s, se, flops_of[c]), "base": result(b, be, flops_of[c])}, case=c),
                   flops=flops_of[c])
              for c, (s, b, se, be) in cases.items()]
    hashes = {"kernels/k.py": "a" * 64}
    method = EagerMethod("host clock", 1 << 20, 1, 12, 0.004, 10, 1000, 64)
    run = swap(syn.run(points, slug=experiment.slug, hashes=hashes), eager=method)
    with __import__("tempfile").TemporaryDirectory() as folder:
        from lab.evidence.store import write_record

        write_record(run, Path(folder))
        evidence = collect_evidence({experiment.slug: experiment}, (), Path(folder), {experiment.slug: hashes})
    return experiment, evidence, cases, flops_of


def test_a_sweep_with_a_flop_model_shows_tflops_beside_each_time():
    from lab.publish import formatting as fmt

    experiment, evidence, cases, flops_of = _flops_evidence(flop_model=True)
    page = render_outputs(evidence)[f"experiments/{experiment.slug}.md"]

    # The answer's columns first (speedup, word), then the times and rates behind them.
    header, rows = page_table(page, "| Case | Speedup [95% CI] | Word | `subject` µs |")
    assert header == ["Case", "Speedup [95% CI]", "Word", "`subject` µs", "Best baseline, µs", "Rate (% of its roof)",
                      "TFLOP/s", "its TFLOP/s"]
    assert sorted(rows) == sorted(cases)
    for case, (subject_ms, base_ms, _, _) in cases.items():
        row = rows[case]
        assert row[3] == fmt.latency_us(subject_ms) and row[4] == f"`base` {fmt.latency_us(base_ms)}"
        flops = flops_of[case]
        if flops is None:
            assert row[6] == row[7] == fmt.DASH, "a point without a FLOP count shows a dash"
            continue
        for cell, ms in ((row[6], subject_ms), (row[7], base_ms)):
            assert cell == fmt.tflops(flops / (ms * 1e-3) / 1e12)
            assert float(cell) == pytest.approx(flops / (ms * 1e-3) / 1e12, rel=5e-3)
    assert rows["c1"][6] == "6.00" and rows["c2"][7] == "2.40", "FLOPs over the median time, in TFLOP/s"

    header, rows = page_table(page, "| Case | Speedup [95% CI] | Word | Dtype | `subject` eager µs |")
    assert header == ["Case", "Speedup [95% CI]", "Word", "Dtype", "`subject` eager µs", "its host µs", "its GB/s",
                      "its TFLOP/s", "Best baseline, eager µs", "its host µs", "its TFLOP/s"]
    for case, (_, _, subject_ms, base_ms) in cases.items():
        row = rows[case]
        assert row[4] == fmt.latency_us(subject_ms) and row[8] == f"`base` {fmt.latency_us(base_ms)}"
        flops = flops_of[case]
        expected = [fmt.DASH] * 2 if flops is None else [fmt.tflops(flops / (ms * 1e-3) / 1e12)
                                                         for ms in (subject_ms, base_ms)]
        assert [row[7], row[10]] == expected


def test_a_sweep_without_a_flop_model_has_no_tflops_column():
    experiment, evidence, _, _ = _flops_evidence(flop_model=False)
    page = render_outputs(evidence)[f"experiments/{experiment.slug}.md"]
    header, rows = page_table(page, "| Case | Speedup [95% CI] | Word | `subject` µs |")
    assert header == ["Case", "Speedup [95% CI]", "Word", "`subject` µs", "Best baseline, µs", "Rate (% of its roof)"]
    assert len(rows) == 3
    header, _ = page_table(page, "| Case | Speedup [95% CI] | Word | Dtype | `subject` eager µs |")
    assert "its TFLOP/s" not in header
    assert "TFLOP/s" not in page


def test_the_environment_table_says_how_long_a_refresh_of_each_gpu_takes():
    from dataclasses import replace

    from lab.publish.indexes import environment_rows

    def timed(slug, started, finished):
        return replace(syn.run([], slug=slug, started=started), finished_utc=finished)

    runs = {"a": [timed("a", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"),   # older run of a: not counted
                  timed("a", "2026-01-02T00:00:00Z", "2026-01-02T00:10:00Z")],
            "b": [timed("b", "2026-01-02T01:00:00Z", "2026-01-02T01:05:00Z")],
            "c": [timed("c", "2026-01-02T02:00:00Z", "not a time")]}           # unreadable: left out
    (row,) = environment_rows(SimpleNamespace(runs=runs))
    assert row["refresh_sum"] == "900 s (15 min) over 2 experiments"
    assert row["refresh_longest"] == "600 s (a)"


def test_the_card_names_a_claimed_baseline_that_timed_no_point():
    from lab.publish.overview import REASON_CHARS, absent_baselines

    def run(**results):
        point = SimpleNamespace(results={name: SimpleNamespace(status=status, reason=reason, error=None)
                                         for name, (status, reason) in results.items()})
        return SimpleNamespace(points=[point])

    experiment = SimpleNamespace(claim=SimpleNamespace(baselines=("torch", "peer", "other")))
    ran = ("ok", None)
    hostile = "peer <script>alert(1)</script> | `x` [a](javascript:y); the rest of the reason"
    text = absent_baselines(experiment, [run(torch=ran, peer=("unavailable", hostile), other=ran),
                                         run(torch=ran, peer=("unavailable", hostile), other=("unsupported", "no"))])
    assert "`peer`" in text and "`torch`" not in text and "`other`" not in text  # other ran on one GPU
    assert "<script>" not in text and "the rest of the reason" not in text  # escaped, cut at its first clause
    assert absent_baselines(experiment, [run(torch=ran, peer=ran, other=ran)]) is None
    long = absent_baselines(experiment, [run(torch=ran, peer=("unsupported", "w" * 500), other=ran)])
    assert "w" * REASON_CHARS not in long and "…" in long
    missing = absent_baselines(experiment, [run(torch=ran, other=ran)])
    assert "`peer` (in no point)" in missing
