"""The caches that keep a render and a site build from redoing work: drawn plots (lab.publish.svg_cache) and the
site's copies of records (tools/site_records.py). Each gives exactly what the work would, and only for the
same input, settings and code."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.publish import plot_style, svg_cache
from sitetools import load_tool

ROOT = Path(__file__).resolve().parents[1]

FIGURE = """
import sys
sys.path.insert(0, {root!r})
import matplotlib.pyplot as plt
from lab.publish import plot_style, svg_cache
with plt.rc_context(plot_style.STYLE):
    fig, axes = plot_style.figure(3.0, 1, 2)
    for ax, scale in zip(axes[0], (1.0, {scale})):
        ax.plot([1, 10, 100, 1000], [scale * v for v in (1.0, 2.0, 3.0, 2.5)], label="subject")
        plot_style.value_axis(ax, "x", [1, 1000])
        ax.set_title("case · bfloat16")
    plot_style.header(fig, "a heading", *axes[0][0].get_legend_handles_labels())
    print(svg_cache.key(fig))
"""


def _key_in_a_process(scale: float = 2.0, **env) -> str:
    proc = subprocess.run([sys.executable, "-c", FIGURE.format(root=str(ROOT), scale=scale)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_the_same_figure_has_the_same_key_in_every_process_and_another_figure_another():
    # Transforms pickle their parents keyed by memory address, and a formatter shared between axes kept the
    # last figure's ticks: either made the key differ from process to process, and the cache never hit.
    first, second = _key_in_a_process(), _key_in_a_process(PYTHONHASHSEED="7")
    assert first and first != "None" and first == second
    assert _key_in_a_process(scale=2.5) != first


def _figure(label: str = "subject"):
    import matplotlib.pyplot as plt

    with plt.rc_context(plot_style.STYLE):
        fig, axes = plot_style.figure(3.0)
        axes[0][0].plot([1, 2, 3], [1.0, 2.0, 1.5], label=label)
        plot_style.value_axis(axes[0][0], "y", [1.0, 2.0])
        plot_style.header(fig, "heading", *axes[0][0].get_legend_handles_labels())
    return fig


def test_a_drawn_figure_is_kept_and_given_back_as_drawn(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setenv("KERNEL_LAB_PLOT_CACHE", str(tmp_path))
    fig = _figure()
    with plt.rc_context(plot_style.STYLE):
        drawn = plot_style.svg(fig)
        assert [p.suffix for p in tmp_path.iterdir()] == [".svg"]

        def never(_fig):
            raise AssertionError("drawn again")

        assert svg_cache.drawn(_figure(), never) == drawn, "the same figure again: the kept SVG"
        assert svg_cache.drawn(_figure(label="other"), plot_style._draw) != drawn, "another figure: drawn"
    with plt.rc_context({**plot_style.STYLE, "font.size": 9}):
        assert svg_cache.key(_figure()) != svg_cache.key(fig), "other settings: another key"
    plt.close("all")


def test_a_figure_keeps_its_key_whatever_interpolation_steps_its_gridlines_got():
    """matplotlib gives a gridline's path 180 interpolation steps, or 1 where the line was recached before
    (which depends on what the process drew earlier): the same figure built later in a process must keep
    its key, or a render's second pass writes a plot whose key line differs. Steps bend a path only under a
    non-affine transform (polar axes), which no figure here has."""
    import matplotlib.pyplot as plt

    def gridded(steps=None, top=None):
        fig = _figure()
        fig.axes[0].grid(True)
        if top is not None:
            fig.axes[0].set_ylim(0, top)
        lines = fig.axes[0].get_ygridlines()
        assert {line.get_path()._interpolation_steps for line in lines} == {180}
        for line in lines if steps else ():
            line.get_path()._interpolation_steps = steps
        return fig

    with plt.rc_context(plot_style.STYLE):
        assert svg_cache.key(gridded()) == svg_cache.key(gridded(steps=1))
        assert svg_cache.key(gridded()) != svg_cache.key(gridded(top=5)), "a real change still changes the key"
    plt.close("all")


def test_committed_plots_seed_an_empty_cache_by_the_key_they_name(tmp_path, monkeypatch):
    """A plot drawn once names its key on its second line; a checkout with an empty cache takes it from the
    committed folder instead of drawing. A committed file naming another key, or none, is never taken."""
    import matplotlib.pyplot as plt

    cache, plots = tmp_path / "cache", tmp_path / "plots"
    plots.mkdir()
    monkeypatch.setenv("KERNEL_LAB_PLOT_CACHE", str(cache))
    monkeypatch.setattr(svg_cache, "COMMITTED", plots)

    def never(_fig):
        raise AssertionError("drawn again")

    with plt.rc_context(plot_style.STYLE):
        name = svg_cache.key(_figure())
        drawn = plot_style.svg(_figure())
        assert drawn.splitlines()[1] == f"<!-- kernel-lab plot {name} -->"
        assert drawn.startswith("<?xml") and "<svg" in drawn
        (plots / "a.svg").write_text(drawn, encoding="utf-8")
        other = svg_cache.with_key(plot_style._draw(_figure(label="other")), "0" * 64)
        (plots / "b.svg").write_text(other, encoding="utf-8")
        (plots / "c.svg").write_text(plot_style._draw(_figure(label="third")), encoding="utf-8")  # no key
        for entry in cache.iterdir():
            entry.unlink()
        svg_cache._index.cache_clear()
        assert svg_cache.committed() == {name: plots / "a.svg", "0" * 64: plots / "b.svg"}
        assert svg_cache.drawn(_figure(), never) == drawn, "taken from the committed plot, not drawn"
        assert [p.name for p in cache.iterdir()] == [f"{name}.svg"], "and kept in the cache"
        third = svg_cache.drawn(_figure(label="third"), plot_style._draw)
        assert "third" in third and third.splitlines()[1].startswith("<!-- kernel-lab plot ")
        # A committed file changed after its key was read is checked again before it is used.
        (plots / "a.svg").write_text(other, encoding="utf-8")
        (cache / f"{name}.svg").unlink()
        assert svg_cache.drawn(_figure(), plot_style._draw) == drawn
    svg_cache._index.cache_clear()
    plt.close("all")


def test_without_the_cache_or_for_a_figure_that_cannot_be_pickled_the_figure_is_drawn(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    monkeypatch.setenv("KERNEL_LAB_PLOT_CACHE", str(tmp_path))
    fig = _figure()
    fig.axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v}!"))
    assert svg_cache.key(fig) is None
    with plt.rc_context(plot_style.STYLE):
        assert "!" in plot_style.svg(fig)
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("KERNEL_LAB_PLOT_CACHE", "off")
    assert svg_cache.folder() is None
    with plt.rc_context(plot_style.STYLE):
        plot_style.svg(_figure())
    assert not list(tmp_path.iterdir())
    plt.close("all")


# --------------------------------------------------------------------------------------------------------
# The site's copies of records
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def record_with_a_host(tmp_path):
    stored = gzip.compress(json.dumps({"schema_version": 1, "environment": {"host": "node-7.internal"}}).encode())
    path = tmp_path / "records" / "some-slug" / "20990101T000000Z-gpu-abcdef.json.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(stored)
    return path


def _publish(records, path: Path, dest: Path, root: Path | None) -> bytes:
    published = records.PublishedRecord.__new__(records.PublishedRecord)
    published.abs_src_path, published.abs_dest_path, published.root = str(path), str(dest), root
    published.copy_file()
    return dest.read_bytes()


def test_a_published_record_is_made_once_and_the_cache_follows_the_setting(record_with_a_host, tmp_path, monkeypatch):
    records = load_tool("site_records")
    monkeypatch.delenv(records.SHOW_HOSTS, raising=False)
    monkeypatch.delenv("KERNEL_LAB_SITE_RECORD_CACHE", raising=False)
    root = tmp_path
    expected = records.published_bytes(record_with_a_host.read_bytes(), True)
    assert b"node-7" not in gzip.decompress(expected)
    assert _publish(records, record_with_a_host, tmp_path / "a.json.gz", root) == expected
    assert len(list((root / records.CACHE_DIR).iterdir())) == 1

    def never(*_):
        raise AssertionError("published again")

    monkeypatch.setattr(records, "published_bytes", never)
    assert _publish(records, record_with_a_host, tmp_path / "b.json.gz", root) == expected, "taken from the cache"
    monkeypatch.setenv(records.SHOW_HOSTS, "1")  # another setting: another entry, made afresh
    with pytest.raises(AssertionError, match="published again"):
        _publish(records, record_with_a_host, tmp_path / "c.json.gz", root)
    monkeypatch.undo()
    monkeypatch.setenv(records.SHOW_HOSTS, "1")
    shown = _publish(records, record_with_a_host, tmp_path / "d.json.gz", root)
    assert shown == record_with_a_host.read_bytes(), "names shown: the stored bytes"
    monkeypatch.setenv("KERNEL_LAB_SITE_RECORD_CACHE", "off")
    entries = set((root / records.CACHE_DIR).iterdir())
    _publish(records, record_with_a_host, tmp_path / "e.json.gz", root)
    assert set((root / records.CACHE_DIR).iterdir()) == entries
    # a folder named there holds the cache instead, for any root (a sandboxed copy of the site's)
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("KERNEL_LAB_SITE_RECORD_CACHE", str(elsewhere))
    monkeypatch.delenv(records.SHOW_HOSTS)
    assert _publish(records, record_with_a_host, tmp_path / "f.json.gz", tmp_path / "sandbox") == expected
    assert len(list(elsewhere.iterdir())) == 1 and set((root / records.CACHE_DIR).iterdir()) == entries
    monkeypatch.setattr(records, "published_bytes", never)
    assert _publish(records, record_with_a_host, tmp_path / "g.json.gz", tmp_path / "other") == expected
