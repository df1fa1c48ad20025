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


# --------------------------------------------------------------------------------------------------------
# The house: kernels <- experiments <- lab <- CLI, probes and checks beside the CLI
# --------------------------------------------------------------------------------------------------------

ROOT = LAB.parent
PACKAGES = ("kernels", "experiments", "lab", "probes")
SCRIPT_ROOMS = ("tools", "checks")  # folders of scripts, imported by path, never as packages
CLI = {"build_results.py", "derive_margin.py", "compress_records.py", "run_notebooks.py", "vendor_assets.py",
       "mkdocs_hooks.py", "site_records.py", "markdown_plain_text.py", "mkdocs_page_cache.py", "ray_wheelhouse.py"}
HOUSE_FORBIDDEN = {"kernels": ("lab", "experiments", "tools", "probes", "checks"),
                   "experiments": ("lab", "tools", "probes", "checks")}
PROBE_SHARED = {"__init__", "harness", "compiled", "int4_parts", "attention_forms"}  # what a probe may import; every other module of probes/ is a probe


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _house_modules() -> dict[str, Path]:
    found = {_module_name(p): p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}
    found.update({_module_name(p): p for top in SCRIPT_ROOMS for p in sorted((ROOT / top).glob("*.py"))})
    return found


def _targets(name: str, modules: dict[str, Path]) -> set[str]:
    """The house's modules an imported name refers to: the module itself, else the package it lies in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return {name} if name else set()


def _module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The house's modules `path` imports at run time (imports for type checkers only are left out): `from p
    import m` names the module p.m where it is one, else p."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for stmt in block.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found |= {full} if full in modules else _targets(node.module, modules)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found |= _targets(alias.name, modules)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _house_modules()
    return {name: _module_imports(path, modules) - {name} for name, path in modules.items()}


@pytest.mark.parametrize("room", sorted(HOUSE_FORBIDDEN))
def test_the_house_imports_one_way(room):
    offences = [f"{path.relative_to(ROOT)} imports {name}"
                for path in sorted((ROOT / room).rglob("*.py")) for name in sorted(_imports(path))
                if name.split(".")[0] in HOUSE_FORBIDDEN[room]]
    assert offences == []


def test_tools_holds_the_cli_alone():
    assert {p.name for p in (ROOT / "tools").iterdir() if p.is_file()} <= CLI


def test_no_probe_imports_another():
    probes = {_module_name(p) for p in (ROOT / "probes").glob("*.py") if p.stem not in PROBE_SHARED}
    graph = _graph()
    offences = sorted(f"{p} imports {q}" for p in probes for q in graph[p] if q in probes)
    assert probes and offences == []


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (its modules in order, the first repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_module_of_the_house_imports_itself_in_a_circle():
    """Imports inside functions count too: a circle closed at call time is still a circle."""
    graph = _graph()
    assert {"kernels.softmax", "lab.measure.breakdown", "probes.harness"} <= set(graph)
    assert _cycle(graph) == []
