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
from lab.evidence.hashing import (  # noqa: E402
    MISSING,
    changed_sources,
    reachable_files,
    sha256_file,
    source_files,
    source_hashes,
)
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


# Kernel files an experiment's code reaches through imports that its records do not hash, each pinned to the
# sha256 the experiment's newest records (H100 and H200) measured. Declaring them as sources would mark those
# records Stale before a GPU re-runs them, so they are pinned instead: a change to one fails this test, and
# the way out is to add the file to the experiment's sources and re-run its experiments.
UNHASHED_PINS = {
    "kernels/_provenance.py": "0affaaef48244683cea704129aa7299619010447d83cb18c3272345dd2365865",
    "kernels/reference.py": "227c341cb293e9f69fa44269f6d26879a85a42a2e4725314882b288048cdeb92",
    "kernels/_launch.py": "faf6f6d6774aff7e1b26639933105a3a47545ca5a82aa1c57a6eaac3c7a990cc",
    # The Gluon attention kernels' host-side helpers: the newest runs of the attention experiments (H100:
    # attention-bwd 20261127T090343Z and attention-fwd 20261127T090827Z; H200: 20261127T115516Z and
    # 20261127T115957Z) ran with this file as pinned here, but their records do not hash it; those experiments
    # take it into their sources with their next runs on both GPUs (the decoder experiments hash it already).
    "kernels/_gluon_host.py": "8ab2ad1fc448df58bc6dcbc486b8e96ea8bc9585dda40fc843952f19909c9d80",
}
UNHASHED = {
    "attention-bwd": {"kernels/_gluon_host.py"},
    "attention-fwd": {"kernels/_gluon_host.py"},
    "decoder-block": {"kernels/_provenance.py", "kernels/reference.py"},
    "decoder-block-graphed": {"kernels/_provenance.py", "kernels/reference.py"},
    "dequant-linear-decode": {"kernels/_launch.py", "kernels/reference.py"},
    "rmsnorm-linear-decode": {"kernels/_launch.py"},
    "rmsnorm-linear-prefill": {"kernels/_launch.py"},
}


def test_every_kernel_file_an_experiment_reaches_is_hashed_or_pinned():
    for slug, experiment in all_experiments().items():
        unhashed = set(reachable_files(experiment, REPO_ROOT)) - set(source_files(experiment, REPO_ROOT))
        assert unhashed == UNHASHED.get(slug, set()), (
            f"{slug}: its code reaches {sorted(unhashed)} without hashing them; add them to its sources "
            "(its records go stale) rather than to UNHASHED")
    for path, pinned in UNHASHED_PINS.items():
        assert sha256_file(REPO_ROOT / path) == pinned, (
            f"{path} changed, but some experiments' records do not hash it (UNHASHED): add it to their sources "
            "and re-run them, then drop it here")


def test_reachable_files_follow_imports_inside_functions(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "decl.py").write_text("from kernels import a\n")
    (tmp_path / "kernels" / "a.py").write_text("def f():\n    from kernels.b import g\n    return g()\n")
    (tmp_path / "kernels" / "b.py").write_text("import kernels.c\n")
    (tmp_path / "kernels" / "c.py").write_text("")
    (tmp_path / "kernels" / "unused.py").write_text("")
    experiment = syn.experiment(source_file="experiments/decl.py", sources=())
    assert reachable_files(experiment, tmp_path) == ["kernels/a.py", "kernels/b.py", "kernels/c.py"]


# --------------------------------------------------------------------------------------------------------
# Prose-only changes to an experiments/*.py file keep a record current; code changes do not
# --------------------------------------------------------------------------------------------------------

DECLARATION = '''"""A declaration."""
P = Profile("lab", "the lab's kernel", run, SOURCES, plan=plan)  # a comment
E = Experiment(slug="x", question="Is it fast?", why=("one " "reason"), cases=[Case("c", {"N": 1}, "a case")])
'''


def test_code_digest_ignores_the_words_and_sees_the_code():
    from lab.evidence.hashing import code_digest

    base = code_digest(DECLARATION.encode())
    words = (DECLARATION.replace('"""A declaration."""', '"""Another."""').replace("the lab's kernel", "new words")
             .replace("Is it fast?", "Is it?").replace('("one " "reason")', '"why"').replace("# a comment", "")
             .replace('"a case"', '"the case"'))
    assert code_digest(words.encode()) == base
    for code_change in (DECLARATION.replace("plan=plan", "plan=other"), DECLARATION.replace('"lab"', '"lab2"'),
                        DECLARATION.replace('{"N": 1}', '{"N": 2}'), DECLARATION + "X = 1\n"):
        assert code_digest(code_change.encode()) != base, code_change
    assert code_digest(b"def (") is None


@pytest.fixture
def repo(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "lab@example.invalid")
    git("config", "user.name", "lab")
    (tmp_path / "experiments").mkdir()
    path = tmp_path / "experiments" / "decl.py"
    path.write_text(DECLARATION)
    git("add", "-A")
    git("commit", "-qm", "declaration")
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    return tmp_path, path, commit


def test_a_prose_only_change_since_the_records_commit_is_not_a_change(repo):
    root, path, commit = repo
    rel = "experiments/decl.py"
    recorded = {rel: sha256_file(path)}
    path.write_text(DECLARATION.replace("the lab's kernel", "the lab's kernel, in other words"))
    current = {rel: sha256_file(path)}
    assert changed_sources(recorded, current) == [rel]  # no commit: every difference counts
    assert changed_sources(recorded, current, commit, root) == []
    assert changed_sources(recorded, current, commit[:7], root) == []
    for bad in ("HEAD", "--output=/tmp/x", commit + "0", "", None, 7):
        assert changed_sources(recorded, current, bad, root) == [rel], bad
    assert changed_sources({rel: "0" * 64}, current, commit, root) == [rel]  # not the file the commit holds
    path.write_text(DECLARATION.replace("plan=plan", "plan=other"))
    assert changed_sources(recorded, {rel: sha256_file(path)}, commit, root) == [rel]


def test_only_experiment_declarations_get_the_prose_exception(repo):
    import subprocess

    root, path, commit = repo
    (root / "kernels").mkdir()
    kernel = root / "kernels" / "k.py"
    kernel.write_text('"""A kernel."""\nX = 1\n')
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "kernel"], check=True)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    recorded = {"kernels/k.py": sha256_file(kernel)}
    kernel.write_text('"""Another docstring."""\nX = 1\n')
    assert changed_sources(recorded, {"kernels/k.py": sha256_file(kernel)}, head, root) == ["kernels/k.py"]


def test_runs_whose_declarations_differ_in_words_alone_timed_the_same_code(repo, monkeypatch):
    import subprocess
    from types import SimpleNamespace

    import lab.evidence.hashing as hashing
    from lab.publish.overview import _commit_note

    root, path, first = repo
    rel = "experiments/decl.py"
    before = sha256_file(path)
    path.write_text(DECLARATION.replace("Is it fast?", "Is it fast enough?"))
    subprocess.run(["git", "-C", str(root), "commit", "-qam", "words"], check=True)
    second = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    after = sha256_file(path)
    monkeypatch.setattr(hashing, "REPO_ROOT", root)

    def run(key, commit, sha):
        return SimpleNamespace(gpu_key=key, git={"commit": commit}, started_utc="2026-11-27T00:00:00Z",
                               hashes={rel: sha})

    def note(current):  # the runs' verdicts' changed files, as verdict_for_gpu finds them, then the note
        runs = [run("a", first, before), run("b", second, after)]
        stale = {p for r in runs for p in changed_sources(r.hashes, current, r.git["commit"])}
        return _commit_note(runs, {"a": "A", "b": "B"}, stale)

    text = note({rel: after})
    assert "the same code" in text and "decl.py" not in text
    path.write_text(DECLARATION.replace("plan=plan", "plan=other"))  # today's code differs from both
    text = note({rel: sha256_file(path)})
    assert "timed different code" in text and "decl.py" in text
