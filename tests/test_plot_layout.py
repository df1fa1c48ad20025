"""The plots as a reader sees them: drawn for the page's column, with tick labels that never collide, every
series in the legend and the legend inside the figure, an untimed peer said once in its legend entry and
never over the data, the subject visible beside a peer a hundred times slower, sane heights, and text no
smaller than 11 pt.

The figures come from synthetic runs shaped like the real experiments' worst cases: attention-fwd's 34 cases
and six profiles, softmax-any-n's N from 1,333 to 262,144 with a peer that stops at 65,536, decoder-block's
five profiles of which two decline the prefill cases, and its op-by-op breakdown over nine cases.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from lab.evidence.records import ProfileResult  # noqa: E402
from lab.evidence.stats import SpeedupInterval  # noqa: E402
from lab.evidence.verdict import AGAINST, MEETS, SLOWER, FASTER, PointJudgement  # noqa: E402
from lab.publish import breakdown, plot_style, plots, roofline  # noqa: E402
from lab.publish.plot_cases import families  # noqa: E402
from lab.publish.plot_style import FIG_WIDTH, MAX_HEIGHT_IN, size_tick  # noqa: E402

ATTENTION_CASES = [f"d{d}-{mask}-s{s}" for d in (128, 64) for mask in ("full", "causal")
                   for s in (512, 1024, 2048, 3000, 4096, 8192, 16384)]
ATTENTION_CASES += [f"d128-h16kv4-{mask}-s{s}" for mask in ("full", "causal") for s in (2048, 8192, 16384)]
DECODER_CASES = ["prefill-b1-s1024", "prefill-b2-s2048", "prefill-b2-s4096", "prefill-b4-s4096",
                 "decode-b1-kv1024", "decode-b1-kv8192", "decode-b16-kv4096", "decode-b64-kv1024",
                 "decode-b64-kv4096"]
SWEEP_N = [1333, 1524, 2048, 3000, 4096, 7000, 8192, 16384, 32768, 40000, 65536, 100000, 131072, 262144]


def _experiment(subject: str, others: tuple[str, ...], x_axis: str | None = None, threshold: float = 1.0):
    e = syn.experiment(subject=subject, baselines=others, threshold=threshold, margin=0.012)
    return replace(e, x_axis=x_axis)


def _point(case: str, shape: dict, results: dict):
    return replace(syn.point(results, case=case), shape=shape)


def _unsupported() -> ProfileResult:
    return ProfileResult("unsupported", reason="declines it")


def _attention():
    """34 cases, six profiles; the subject's times 0.1-5 ms, `unfused` 20 times slower and unsupported
    past 4,096 positions (12 cases), `sdpa-efficient` unsupported at d64 (14 cases)."""
    others = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "torch.compile", "unfused")
    points = []
    for i, case in enumerate(ATTENTION_CASES):
        base = 0.1 + 0.15 * i
        results = {"triton-fused": syn.timed([base, base * 1.01, base * 0.99])}
        for k, name in enumerate(others):
            slow = 20 if name == "unfused" else 1 + 0.2 * k
            declines = (name == "unfused" and ("s8192" in case or "s16384" in case)
                        or name == "sdpa-efficient" and case.startswith("d64"))
            results[name] = _unsupported() if declines else syn.timed([base * slow, base * slow * 1.02])
        points.append(_point(case, {"S": i}, results))
    return _experiment("triton-fused", others), syn.run(points)


def _decoder(others=("torch-eager", "torch.compile", "lab-int8", "lab-int4")):
    """Nine cases, five profiles; lab-int8 and lab-int4 decline the four prefill cases (with gemlite's two
    beside them, seven profiles, the peers declining prefill as well)."""
    points = []
    for i, case in enumerate(DECODER_CASES):
        base = 12.0 / (i + 1) if case.startswith("prefill") else 0.1 + 0.05 * i
        results = {"lab": syn.timed([base, base * 1.01])}
        for k, name in enumerate(others):
            if name.startswith(("lab-int", "gemlite-int")) and case.startswith("prefill"):
                results[name] = _unsupported()
            else:
                results[name] = syn.timed([base * (1.1 + 0.1 * k), base * (1.12 + 0.1 * k)])
        points.append(_point(case, {"B": i}, results))
    return _experiment("lab", others), syn.run(points)


def _sweep():
    """softmax-any-n: N from 1,333 to 262,144; liger unsupported past 65,536 and 100 times slower."""
    others = ("torch.softmax", "torch.compile", "liger")
    points = []
    for n in SWEEP_N:
        results = {"triton-auto": syn.timed([0.01 * n / 1000, 0.0101 * n / 1000])}
        for k, name in enumerate(others):
            t = 0.01 * n / 1000 * (100 if name == "liger" else 1.2 + 0.1 * k)
            results[name] = _unsupported() if name == "liger" and n > 65536 else syn.timed([t, t * 1.01])
        points.append(replace(_point(f"fwd-{n}", {"M": 4096, "N": n}, results), bytes_moved=8 * 4096 * n))
    return _experiment("triton-auto", others, x_axis="N"), syn.run(points)


def _judgements(run, against_every: int = 3):
    out = []
    for i, p in enumerate(run.points):
        ratio = 0.7 + 0.02 * i
        effect = AGAINST if i % against_every == 0 else MEETS
        out.append(PointJudgement(p.case, p.dtype, SLOWER if effect == AGAINST else FASTER, effect, "base",
                                  SpeedupInterval(ratio, ratio * 0.98, ratio * 1.02, 0.95), ""))
    return out


@pytest.fixture
def figures(monkeypatch):
    """Every figure the renderers draw, kept (drawn) for inspection after its SVG is written."""
    kept = []

    def keep(fig):
        out = plot_style.svg(fig)
        fig.canvas.draw()
        kept.append(fig)
        return out

    for module in (plots, breakdown, roofline):
        monkeypatch.setattr(module, "svg", keep)
    return kept


def _overlapping(texts) -> list[tuple[str, str]]:
    shown = [t for t in texts if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent()) for t in shown]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def _ticks(ax, which: str):
    """The tick labels matplotlib draws on `which` axis: those within the view limits."""
    axis = getattr(ax, f"{which}axis")
    lo, hi = sorted(axis.get_view_interval())
    k = 0 if which == "x" else 1
    return [t for t in axis.get_ticklabels() if lo - 1e-9 * abs(hi) <= t.get_position()[k] <= hi + 1e-9 * abs(hi)]


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def _check_readable(fig, height: float = MAX_HEIGHT_IN) -> None:
    """What every figure must satisfy: ticks apart, the legend inside the figure and clear of the axes and
    the title, no text under 11 pt, width for the column, height bounded (by `height`)."""
    assert fig.get_figwidth() == pytest.approx(FIG_WIDTH)
    assert fig.get_figheight() <= height + 1e-9
    page = fig.bbox
    for ax in (a for a in fig.axes if a.get_visible()):
        assert not _overlapping(_ticks(ax, "x")), _overlapping(_ticks(ax, "x"))
        assert not _overlapping(_ticks(ax, "y")), _overlapping(_ticks(ax, "y"))
        assert not [t.get_text() for t in ax.texts if "unsupported" in t.get_text()]
    titles = [t for t in fig.texts if t.get_text()] + [a.title for a in fig.axes if a.get_visible()]
    assert not _overlapping(titles), _overlapping(titles)
    for legend in fig.legends:
        box = legend.get_window_extent()
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1
        for ax in (a for a in fig.axes if a.get_visible()):
            assert not box.overlaps(ax.get_window_extent()), "the legend lies over a chart"
        for t in titles:
            assert not box.overlaps(t.get_window_extent()), f"the legend lies over {t.get_text()!r}"
    for text in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text")):
        if text.get_text() and text.get_visible():
            assert text.get_fontsize() >= 11, (text.get_text(), text.get_fontsize())


def test_attention_times_read_across_with_every_profile_and_the_subject_visible(figures):
    experiment, run = _attention()
    plots.render_plot(experiment, run, "float32", "H100")
    (fig,) = figures
    _check_readable(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ATTENTION_CASES
    assert ax.get_xscale() == "log", "a peer 20 times slower must not squash the subject"
    legend = _legend_texts(fig)
    assert len(legend) >= 6 and "triton-fused (subject)" in legend
    assert "unfused (unsupported in 12 of 34 cases)" in legend
    assert "sdpa-efficient (unsupported in 14 of 34 cases)" in legend
    assert sum("unsupported" in t for t in legend) == 2  # said once per profile, in its entry


def test_attention_speedup_reads_across_with_the_margin_and_every_gpu(figures):
    experiment, run = _attention()
    other = replace(run, environment={"gpu_key": "h200", "gpu_name": "H200"})
    plots.render_speedup_plot(experiment, "float32", [("H100", "#1864ab", _judgements(run), run),
                                                      ("H200", "#862e9c", _judgements(other, 5), other)])
    (fig,) = figures
    _check_readable(fig)
    legend = _legend_texts(fig)
    assert "tie: margin ±1.2% (Level)" in legend and "H100" in legend and "H200" in legend
    assert "against the claim (▼)" in legend
    assert fig.get_figheight() * 96 <= 1200  # CSS px at full width: 34 rows in about a screen and a half


def test_decoder_times_name_all_five_profiles_once(figures):
    experiment, run = _decoder()
    plots.render_plot(experiment, run, "float32", "H100")
    (fig,) = figures
    _check_readable(fig)
    legend = _legend_texts(fig)
    assert legend == ["torch-eager", "torch.compile", "lab-int8 (unsupported in 4 of 9 cases)",
                      "lab-int4 (unsupported in 4 of 9 cases)", "lab (subject)"]
    assert fig.axes[0].get_xscale() == "log"  # prefill 12 ms beside decode 0.1 ms


def test_a_sweep_over_n_has_binary_size_ticks_and_says_where_a_peer_stops(figures):
    experiment, run = _sweep()
    plots.render_plot(experiment, run, "float32", "H100")
    (fig,) = figures
    _check_readable(fig)
    ax = fig.axes[0]
    ticks = [t.get_text() for t in _ticks(ax, "x") if t.get_text()]
    assert ticks == ["1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "256k"]
    assert ax.get_yscale() == "log", "liger at a hundredth of the subject's throughput"
    legend = _legend_texts(fig)
    assert "liger (unsupported for N > 65,536)" in legend and "triton-auto (subject)" in legend
    assert len(legend) == 5  # four profiles and the copy ceiling


def test_the_sweep_speedup_has_the_same_axis(figures):
    experiment, run = _sweep()
    plots.render_speedup_plot(experiment, "float32", [("H100", "#1864ab", _judgements(run), run)])
    (fig,) = figures
    _check_readable(fig)
    assert "128k" in [t.get_text() for t in fig.axes[0].get_xticklabels()]


def _with_breakdowns(run):
    """Every timed result given a ten-op breakdown with an eager-call part."""
    ops = [f"op_{k}" for k in range(10)] + ["norms (by kernel name)", "projections (matmul)"]

    def block(p50):
        per = p50 * 0.08
        eager = {"lead_ms": per, "gap_ms": per, "kernel_ms": p50, "span_ms": p50 + per, "calls": 3,
                 "ops": [{"op": op, "ms": per, "kernels": 1, "gap_ms": per / 10} for op in ops]}
        return {"method": "synthetic", "calls": 5, "kernel_ms": 0.96 * p50, "span_ms": 1.02 * p50,
                "gap_ms": 0.06 * p50, "eager": eager,
                "ops": [{"op": op, "ms": per, "kernels": 1} for op in ops]}

    points = []
    for p in run.points:
        points.append(replace(p, results={n: replace(r, breakdown=block(r.p50_ms)) if r.status == "ok" else r
                                          for n, r in p.results.items()}))
    return replace(run, points=tuple(points))


@pytest.mark.parametrize("others", [("torch-eager", "torch.compile", "lab-int8", "lab-int4"),
                                    ("torch-eager", "torch.compile", "lab-int8", "gemlite-int8", "lab-int4",
                                     "gemlite-int4")])
def test_the_breakdown_is_a_compact_grid_under_its_legend(figures, others):
    experiment, run = _decoder(others)
    breakdown.render_breakdown_plot(experiment, _with_breakdowns(run), "float32", "H100")
    (fig,) = figures
    # Seven profiles' names need more rows than MAX_HEIGHT_IN holds: the figure grows by what they need.
    _check_readable(fig, height=plot_style.MAX_HEIGHT_IN + (4.0 if len(others) > 4 else 0.0))
    panels = [a for a in fig.axes if a.get_visible()]
    assert len(panels) == 9
    assert fig.get_figheight() * 96 <= (1600 if len(others) == 4 else 2000)
    names = _ticks(panels[0], "y")
    assert [t.get_text() for t in names] == ["lab", *others] or len(names) == len(others) + 1
    assert not _overlapping(names), _overlapping(names)
    legend = _legend_texts(fig)
    assert "op_0" in legend and "projections (matmul)" in legend and "eager-call median (lower bar)" in legend
    (box,) = [legend.get_window_extent() for legend in fig.legends]
    top = max(a.get_window_extent().y1 for a in panels)
    assert box.y0 >= top and box.y0 - top < 96, "the legend sits right above the panels"
    labels = [t for a in panels for t in _ticks(a, "x") + [a.title]]
    assert not _overlapping(labels), _overlapping(labels)


def test_rendering_the_new_charts_twice_gives_identical_bytes():
    experiment, run = _attention()
    assert plots.render_plot(experiment, run, "float32", "H100") == plots.render_plot(experiment, run, "float32",
                                                                                       "H100")
    experiment, run = _sweep()
    assert plots.render_plot(experiment, run, "float32") == plots.render_plot(experiment, run, "float32")


@pytest.mark.parametrize("value, shown", [(1024, "1k"), (262144, "256k"), (3000, "3,000"), (1 << 20, "1M"),
                                          (512, "512")])
def test_size_ticks(value, shown):
    assert size_tick(value) == shown


def test_families_rule_off_runs_of_cases_and_nothing_else():
    assert families(ATTENTION_CASES)[:8] == ["d128-full"] * 7 + ["d128-causal"]
    assert families(["int8-m1-n1", "int8-m16-n1", "int4-m1-n1", "int4-m16-n1"]) == ["int8"] * 2 + ["int4"] * 2
    assert families(["m1-n4096-k4096", "m4-n4096-k4096", "m1-n12288-k4096"]) is None
    assert families(DECODER_CASES) == ["prefill"] * 4 + ["decode"] * 5
