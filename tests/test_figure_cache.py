"""The site hook's cache of expanded pages (tools/mkdocs_hooks.py, FIGURE_CACHE): a page whose figures'
inputs are unchanged is read back without loading the evidence; a changed record, declaration, margin file,
kernel or line of the lab's code is never answered from an older entry.

Each test loads the hook afresh (its evidence and digests are kept per process) over a sandbox root holding
the fixture records (tests/fixtures/lab) and stand-ins for the code, with the evidence made from the
sandbox's records as the site's own is made from the repository's.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_fixture_experiments as fx  # noqa: E402

from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.figures import expand  # noqa: E402

PAGE = ('# A post\n\nThe kernel took {{ fig("fixture-single", gpu="Test GPU A", case="fx-4096x1024", dtype="float16", '
        'what="ms", profile="subject-kernel") }} ms, {{ fig("fixture-single", gpu="Test GPU A", case="fx-*", '
        'dtype="float16") }}x of torch.\n')
SOURCE = "docs/posts/a-post.md"
NEWEST_ON_A = "fixture-single/20260301T100000Z-nvidia-test-gpu-a-a1a1a1.json"  # the run PAGE reads
CODE = {"experiments/margins.json": "{}\n", "experiments/declared.py": "X = 1\n", "kernels/kernel.py": "K = 1\n",
        "lab/publish/judge.py": "J = 1\n"}


def fresh_hooks(n=[0]):
    n[0] += 1
    spec = importlib.util.spec_from_file_location(f"kernel_lab_hooks_cache_{n[0]}", ROOT / "tools" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the hook puts its root first on the path
    monkeypatch.delenv("KERNEL_LAB_FIGURE_CACHE", raising=False)
    shutil.copytree(FIXTURES / "records", tmp_path / "records")
    for rel, text in CODE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return tmp_path


def evidence_of(root: Path):
    return collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, root / "records", fx.CURRENT_HASHES)


def counting(hooks, monkeypatch) -> list:
    """Count the hook's loads of the evidence, each made from the sandbox's records as they are then."""
    loads = []
    monkeypatch.setattr(hooks, "evidence_for", lambda root: loads.append(root) or evidence_of(root))
    return loads


def slower(root: Path, rel: str = NEWEST_ON_A) -> None:
    """The subject kernel of a record twice as slow at every point (a valid record still)."""
    path = root / "records" / rel
    data = json.loads(path.read_text(encoding="utf-8"))
    for point in data["points"]:
        result = point["results"]["subject-kernel"]
        if result.get("samples_ms"):
            result["samples_ms"] = [2 * t for t in result["samples_ms"]]
            for key in ("p20_ms", "p50_ms", "p80_ms"):
                result[key] *= 2
    path.write_text(json.dumps(data), encoding="utf-8")


def test_an_unchanged_page_is_read_back_without_loading_the_evidence(sandbox, monkeypatch):
    hooks = fresh_hooks()
    loads = counting(hooks, monkeypatch)
    first = hooks.expand_figures(PAGE, SOURCE, sandbox)
    assert first == expand(PAGE, evidence_of(sandbox), SOURCE) and "0.020 ms, 0.76x" in first
    assert hooks.expand_figures(PAGE, SOURCE, sandbox) == first and len(loads) == 1
    # another process (a later build, `mkdocs serve`) reads the same entry
    again = fresh_hooks()
    assert again.expand_figures(PAGE, SOURCE, sandbox) == first and counting(again, monkeypatch) == []
    # another page, or the same text from another file, is another entry
    assert hooks.expand_figures(PAGE + "\nMore.\n", SOURCE, sandbox).endswith("More.\n") and len(loads) == 2
    hooks.expand_figures(PAGE, "docs/posts/another.md", sandbox)
    assert len(loads) == 3


def test_a_changed_record_is_judged_again(sandbox, monkeypatch):
    hooks = fresh_hooks()
    loads = counting(hooks, monkeypatch)
    first = hooks.expand_figures(PAGE, SOURCE, sandbox)
    slower(sandbox)
    changed = hooks.expand_figures(PAGE, SOURCE, sandbox)
    assert len(loads) == 2 and changed == expand(PAGE, evidence_of(sandbox), SOURCE)
    assert "0.039 ms, 0.38x" in changed and changed != first
    # a record added changes the inputs too; removing it again brings back the state judged before
    extra = sandbox / "records" / "fixture-single" / "20260309T000000Z-nvidia-test-gpu-a-0d0d0d.json"
    shutil.copy(sandbox / "records" / NEWEST_ON_A, extra)
    hooks.expand_figures(PAGE, SOURCE, sandbox)
    assert len(loads) == 3
    extra.unlink()
    assert hooks.expand_figures(PAGE, SOURCE, sandbox) == changed and len(loads) == 3


@pytest.mark.parametrize("rel", sorted(CODE))
def test_a_changed_declaration_margin_kernel_or_lab_code_is_judged_again(sandbox, monkeypatch, rel):
    hooks = fresh_hooks()
    loads = counting(hooks, monkeypatch)
    hooks.expand_figures(PAGE, SOURCE, sandbox)
    (sandbox / rel).write_text(CODE[rel] + "# changed\n", encoding="utf-8")
    hooks.expand_figures(PAGE, SOURCE, sandbox)
    assert len(loads) == 2
    # this process imported the lab before the change, so what it judged is not kept for others
    hooks.expand_figures(PAGE, SOURCE, sandbox)
    assert len(loads) == 3
    # a process started after the change keeps its result
    later = fresh_hooks()
    later_loads = counting(later, monkeypatch)
    later.expand_figures(PAGE, SOURCE, sandbox)
    later.expand_figures(PAGE, SOURCE, sandbox)
    assert len(later_loads) == 1


def test_the_digest_is_of_contents_and_of_the_figures_inputs_only(sandbox):
    hooks = fresh_hooks()
    digest = hooks.inputs_digest(sandbox)
    record = sandbox / "records" / NEWEST_ON_A
    stored = record.read_bytes()
    record.write_bytes(stored.replace(b'"run_id"', b'"run_id" ', 1))
    assert hooks.inputs_digest(sandbox) != digest
    record.write_bytes(stored)  # the same bytes again, at a later time
    assert hooks.inputs_digest(sandbox) == digest
    for elsewhere in ("docs/posts/x.md", "notes/x.md", "probes/x.py", "records.md"):
        (sandbox / elsewhere).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / elsewhere).write_text("x\n", encoding="utf-8")
    assert hooks.inputs_digest(sandbox) == digest
    (sandbox / "lab" / "__pycache__").mkdir()
    (sandbox / "lab" / "__pycache__" / "judge.cpython-311.pyc").write_bytes(b"\0")
    assert hooks.inputs_digest(sandbox) == digest


def test_a_failing_page_is_never_kept_and_the_cache_can_be_turned_off(sandbox, monkeypatch):
    from mkdocs.exceptions import PluginError

    hooks = fresh_hooks()
    loads = counting(hooks, monkeypatch)
    wrong = PAGE.replace('what="ms"', 'what="wrod"')
    for _ in range(2):
        with pytest.raises(PluginError, match="what='wrod'"):
            hooks.expand_figures(wrong, SOURCE, sandbox)
    assert len(loads) == 2
    assert hooks.expand_figures("no figures here {{ x }}", SOURCE, sandbox) == "no figures here {{ x }}"
    assert len(loads) == 2, "a page without a call loads nothing"
    monkeypatch.setenv("KERNEL_LAB_FIGURE_CACHE", "off")
    hooks.expand_figures(PAGE, SOURCE, sandbox)
    hooks.expand_figures(PAGE, SOURCE, sandbox)
    assert len(loads) == 4


def test_only_the_newest_input_states_are_kept(sandbox, monkeypatch):
    hooks = fresh_hooks()
    counting(hooks, monkeypatch)
    states = sandbox / hooks.FIGURE_CACHE
    for n in range(hooks.FIGURE_STATES_KEPT + 2):
        (sandbox / "records" / "extra.txt").write_text(str(n), encoding="utf-8")
        hooks.expand_figures(PAGE, SOURCE, sandbox)
    kept = [p for p in states.iterdir() if p.is_dir()]
    assert len(kept) == hooks.FIGURE_STATES_KEPT
    assert (states / hooks.inputs_digest(sandbox)).is_dir(), "the newest is among them"
