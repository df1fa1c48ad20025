"""Where a run record's commit comes from: the checkout, or the commit a shipped copy declares."""

import subprocess

from lab.measure.environment import git_state


def _repo(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    git("add", "kernel.py")
    git("-c", "user.name=lab", "-c", "user.email=lab@example.invalid", "commit", "-qm", "first")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, check=True, capture_output=True,
                          text=True).stdout.strip()
    return head


def test_checkout_gives_head_and_dirty_state(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNEL_LAB_SOURCE_COMMIT", raising=False)
    head = _repo(tmp_path)
    assert git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "kernel.py").write_text("a = 2\n")
    assert git_state(tmp_path) == {"commit": head, "dirty": True}
    (tmp_path / "records").mkdir()
    (tmp_path / "kernel.py").write_text("a = 1\n")
    (tmp_path / "records" / "run.json").write_text("{}")  # what runs produce never makes a tree dirty
    assert git_state(tmp_path)["dirty"] is False


def test_declared_commit_wins_over_an_older_checkout(tmp_path, monkeypatch):
    _repo(tmp_path)
    (tmp_path / "kernel.py").write_text("a = 2\n")  # the shipped tree: newer than the checkout's HEAD
    monkeypatch.setenv("KERNEL_LAB_SOURCE_COMMIT", "f" * 40)
    assert git_state(tmp_path) == {"commit": "f" * 40, "dirty": None}


def test_outside_a_checkout_nothing_is_invented(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNEL_LAB_SOURCE_COMMIT", raising=False)
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
