"""Declared point columns (experiments.spec.PointColumn) on an experiment's page: each point's model quantity
beside its timings, computed from the recorded shape and dtype (or the recorded byte model), a dash where a
shape cannot be read, the column's meaning under the table, and no column at all where none is declared."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from experiments.spec import Case, PointColumn  # noqa: E402
from lab.evidence.store import write_record  # noqa: E402
from lab.publish import formatting as fmt  # noqa: E402
from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.render import render_outputs  # noqa: E402
from labtools import page_table  # noqa: E402

HASHES = {"kernels/k.py": "a" * 64}
SCORE_COLUMN = PointColumn("Unfused S² bytes", "the scores an unfused path writes, 12 bytes a score",
                           value=lambda case, dtype: 12 * case["M"] * case["N"] ** 2)
FUSED_COLUMN = PointColumn("Fused bytes", "the recorded byte model")


def _page(columns, shapes: dict[str, dict], cpu: bool = False) -> str:
    """The rendered page of a sweep with one point per entry of `shapes` (case -> recorded shape)."""
    experiment = syn.experiment(slug="columns")
    experiment = replace(experiment, cases=tuple(Case(c, {"M": 2, "N": 8}) for c in shapes), point_columns=columns)
    points = [replace(syn.point({"subject": syn.timed([1.0] * 30), "base": syn.timed([1.5] * 30)}, case=c),
                      shape=shape, bytes_moved=(i + 1) << 20)
              for i, (c, shape) in enumerate(shapes.items())]
    run = syn.run(points, slug=experiment.slug, hashes=HASHES, cpu=cpu)
    with tempfile.TemporaryDirectory() as folder:
        write_record(run, Path(folder))
        evidence = collect_evidence({experiment.slug: experiment}, (), Path(folder), {experiment.slug: HASHES})
    return render_outputs(evidence)[f"experiments/{experiment.slug}.md"]


@pytest.mark.parametrize("cpu", [False, True])
def test_each_point_shows_its_declared_quantities_beside_its_timings(cpu):
    shapes = {"c1": {"M": 4, "N": 1024}, "c2": {"M": 1, "N": 65536}, "old": {"K": 3}}
    page = _page((SCORE_COLUMN, FUSED_COLUMN), shapes, cpu=cpu)
    # The answer's columns first (point, speedup, word), the declared quantities last.
    header, rows = page_table(page, "| Case | Speedup [95% CI] | Word | `subject` µs |")
    assert header[:4] == ["Case", "Speedup [95% CI]", "Word", "`subject` µs"]
    assert header[-2:] == ["Unfused S² bytes", "Fused bytes"]
    assert rows["c1"][-2] == "48 MiB" == fmt.size_bytes(12 * 4 * 1024**2)
    assert rows["c2"][-2] == "48 GiB"
    assert rows["old"][-2] == fmt.DASH, "a shape the declaration cannot read (an older record's) shows a dash"
    assert [rows[c][-1] for c in ("c1", "c2", "old")] == ["1 MiB", "2 MiB", "3 MiB"], "the recorded byte model"
    legend = ("Unfused S² bytes: the scores an unfused path writes, 12 bytes a score. "
              "Fused bytes: the recorded byte model.")
    lines = page.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| Case | Speedup [95% CI] | Word | `subject`")))
    last_row = next(i for i in range(start, len(lines)) if lines[i].startswith("| old |"))
    assert lines[last_row + 1:last_row + 3] == ["", legend], "the meaning sits under the table"


def test_a_column_that_fails_or_gives_nothing_shows_a_dash():
    def broken(case, dtype):
        return case["M"] // (case["N"] - 8)  # ZeroDivisionError at N = 8

    columns = (PointColumn("Broken", "raises", value=broken),
               PointColumn("Nothing", "gives None", value=lambda case, dtype: None),
               PointColumn("Negative", "gives a negative count", value=lambda case, dtype: -1, unit="count"),
               PointColumn("Count", "a whole number", value=lambda case, dtype: case["N"] * 1000, unit="count"))
    page = _page(columns, {"c1": {"M": 2, "N": 8}, "c2": {"M": 2, "N": 9}})
    _, rows = page_table(page, "| Case | Speedup [95% CI] | Word | `subject` µs |")
    assert rows["c1"][-4:] == [fmt.DASH, fmt.DASH, fmt.DASH, "8,000"]
    assert rows["c2"][-4:] == ["2 B", fmt.DASH, fmt.DASH, "9,000"]


def test_a_hostile_dtype_name_reaches_no_declaration():
    seen = []
    column = PointColumn("Seen", "records the dtype", value=lambda case, dtype: seen.append(dtype) or 1)
    experiment = replace(syn.experiment(slug="columns"), point_columns=(column,))
    point = replace(syn.point({"subject": syn.timed([1.0] * 30), "base": syn.timed([1.5] * 30)}), dtype="cuda")
    from lab.publish.views import _column_value

    assert _column_value(column, point) == fmt.DASH and not seen, "torch.cuda is no dtype"
    assert _column_value(column, replace(point, dtype="float32")) == "1 B" and len(seen) == 1
    assert experiment.point_columns == (column,)


def test_a_single_point_page_names_the_quantities_under_its_table():
    page = _page((SCORE_COLUMN, FUSED_COLUMN), {"c1": {"M": 4, "N": 1024}})
    assert ("At c1: Unfused S² bytes 48 MiB (the scores an unfused path writes, 12 bytes a score); "
            "Fused bytes 1 MiB (the recorded byte model).") in page


def test_no_declared_columns_no_extra_column():
    page = _page((), {"c1": {"M": 2, "N": 8}, "c2": {"M": 2, "N": 16}})
    header, _ = page_table(page, "| Case | Speedup [95% CI] | Word | `subject` µs |")
    assert header == ["Case", "Speedup [95% CI]", "Word", "`subject` µs", "Best baseline, µs", "Rate (% of its roof)"]
    assert "Fused bytes" not in page


def test_a_column_unit_must_be_known():
    with pytest.raises(ValueError, match="PointColumn.unit"):
        PointColumn("x", "y", unit="furlongs")
