"""Source hashes and staleness: change a hashed file in a temporary tree and the verdict turns Stale."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from experiments import all_experiments  # noqa: E402
from lab import REPO_ROOT  # noqa: E402
from lab.evidence.hashing import MISSING, changed_sources, sha256_file, source_files, source_hashes  # noqa: E402
from lab.evidence.verdict import STALE, SUPPORTED, verdict_for_gpu  # noqa: E402

WIN = {"subject": syn.timed([1.0] * 30), "base": syn.timed([2.0] * 30)}


@pytest.fixture
def tree(tmp_path):
    """A temporary copy of a project: a declaration, a kernel and a helper module defining a profile's run."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "experiments" / "decl.py").write_text("# declaration\n")
    (tmp_path / "kernels" / "k.py").write_text("# kernel v1\n")
    helpers = tmp_path / "experiments" / "helpers.py"
    helpers.write_text("import torch\n\ndef run(x):\n    return torch.softmax(x, -1)\n")
    spec = importlib.util.spec_from_file_location("lab_hashing_test_helpers", helpers)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    experiment = syn.experiment(source_file="experiments/decl.py", sources=("kernels/k.py",))
    subject = replace(experiment.profiles[0], run=module.run)
    return tmp_path, replace(experiment, profiles=(subject, *experiment.profiles[1:]))


def _verdict(experiment, root, recorded):
    run = syn.run([syn.point(WIN)], hashes=recorded)
    return verdict_for_gpu(experiment, [run], source_hashes(experiment, root))


def test_declared_and_defining_files_are_hashed_and_installed_code_is_not(tree):
    root, experiment = tree
    files = source_files(experiment, root)
    assert files == ["experiments/decl.py", "experiments/helpers.py", "kernels/k.py"]
    hashes = source_hashes(experiment, root)
    assert hashes["kernels/k.py"] == sha256_file(root / "kernels" / "k.py")
    assert len(hashes["kernels/k.py"]) == 64


@pytest.mark.parametrize("edit", ["kernels/k.py", "experiments/decl.py", "experiments/helpers.py"])
def test_changing_any_hashed_file_marks_the_evidence_stale(tree, edit):
    root, experiment = tree
    recorded = source_hashes(experiment, root)
    assert _verdict(experiment, root, recorded).state == SUPPORTED
    with open(root / edit, "a") as f:
        f.write("# edited\n")
    v = _verdict(experiment, root, recorded)
    assert v.state == STALE and v.changed == (edit,) and v.data_state == SUPPORTED


def test_a_deleted_source_marks_the_evidence_stale(tree):
    root, experiment = tree
    recorded = source_hashes(experiment, root)
    (root / "kernels" / "k.py").unlink()
    assert source_hashes(experiment, root)["kernels/k.py"] == MISSING
    assert _verdict(experiment, root, recorded).state == STALE


def test_changed_sources_compares_both_sides():
    assert changed_sources({"a": "1", "b": "2"}, {"a": "1", "b": "2"}) == []
    assert changed_sources({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b", "c"]
    assert changed_sources({"a": "1", "gone": "2"}, {"a": "1"}) == ["gone"]


def test_every_declared_experiment_hashes_its_kernels_and_shared_helpers():
    for slug, experiment in all_experiments().items():
        hashes = source_hashes(experiment, REPO_ROOT)
        assert experiment.source_file in hashes, slug
        assert MISSING not in hashes.values(), f"{slug} names a source file that does not exist"
        assert any(path.startswith("kernels/") for path in hashes), slug
