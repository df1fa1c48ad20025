"""lab/ is split by the stages a record passes through; these tests keep the rooms' dependencies one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"
# Room -> the lab rooms it must never import. measure → evidence ← publish: publishing never measures, and
# the evidence (schema, store, verdicts) neither measures nor publishes.
FORBIDDEN = {"evidence": ("lab.measure", "lab.publish"), "publish": ("lab.measure",)}
MAX_LINES = 420


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_import_one_way(room):
    offences = []
    for path in sorted((LAB / room).glob("*.py")):
        for name in sorted(_imports(path)):
            if name.startswith(FORBIDDEN[room]):
                offences.append(f"{path.relative_to(LAB.parent)} imports {name}")
    assert offences == []


def test_the_rooms_hold_every_module():
    loose = sorted(p.name for p in LAB.glob("*.py") if p.name not in ("__init__.py", "adhoc.py"))
    assert loose == [], "lab/ modules belong in lab/measure, lab/evidence or lab/publish"


def test_no_module_grows_past_the_limit():
    long = {str(p.relative_to(LAB.parent)): n for p in LAB.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
