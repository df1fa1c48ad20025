"""Writing the rendered files under docs/: contained, atomic, and deleting only what a render wrote.

* Contained: every output path is docs-relative, lies in one of the generated folders (GENERATED_DIRS and
  the plots folder) and, resolved, stays inside it; anything else is refused before a byte is written. The
  paths are built from validated names (lab.evidence.checks), so this is the second lock, not the first.
* Atomic: each file goes through a hidden temporary sibling renamed into place; temporary files that an
  interrupted render left behind are swept at the start of the next one.
* A manifest (docs/generated/manifest.json) lists the files the last render wrote. A file is deleted only
  when the manifest lists it, this render no longer produces it, and it still carries a generated file's
  mark (the Markdown header, a plot's <slug>--<gpu>--<dtype>.svg name): a hand-written page is never
  touched, whatever its name or first line.
* Evidence loss: `lost_evidence` compares the plots the last render wrote (one per experiment, GPU and dtype
  with a run) with this render's, so a render that would take a run off a page can say so first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping

from lab.evidence.record_parts import RESERVED_GPU_KEYS
from lab.evidence.store import replace_text
from lab.publish.views import GENERATED_DIRS, GENERATED_HEADER, PLOTS_DIR

MANIFEST = "generated/manifest.json"


@dataclass
class WriteReport:
    written: list[str]
    unchanged: list[str]
    removed: list[str]


def _folder_of(rel: str) -> str | None:
    """The generated folder a docs-relative path lies in directly (None: none, or not a plain relative path)."""
    path = PurePosixPath(rel)
    if path.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")):
        return None
    parent = path.parent.as_posix()
    return parent if parent in (*GENERATED_DIRS, PLOTS_DIR) else None


def contained(docs_dir: Path, rel: str) -> Path:
    """docs_dir/rel, after checking that it lies directly in a generated folder; ValueError otherwise."""
    folder = _folder_of(rel)
    path = Path(docs_dir) / rel
    if folder is None or not path.name or path.is_symlink() or \
            not path.resolve().is_relative_to((Path(docs_dir) / folder).resolve()):
        raise ValueError(f"refusing to write {rel!r}: generated files lie directly in "
                         f"{', '.join((*GENERATED_DIRS, PLOTS_DIR))} under {docs_dir}")
    return path


def _is_generated(path: Path) -> bool:
    if path.suffix == ".svg":
        return path.parent.as_posix().endswith(PLOTS_DIR) and "--" in path.name
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\n") == GENERATED_HEADER
    except (OSError, UnicodeDecodeError):
        return False


def read_manifest(docs_dir: Path) -> list[str] | None:
    """The files the last render wrote (None when there is no readable manifest); entries that are not plain
    paths in a generated folder are left out."""
    try:
        files = json.loads((Path(docs_dir) / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sorted(f for f in files if isinstance(f, str) and _folder_of(f) is not None) if isinstance(files, list) \
        else None


def _sweep_temporary(docs_dir: Path) -> None:
    """Remove the hidden .tmp files an interrupted render left in the generated folders."""
    for folder in (*GENERATED_DIRS, PLOTS_DIR):
        directory = Path(docs_dir) / folder
        if directory.is_dir():
            for path in directory.iterdir():
                if path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file():
                    path.unlink(missing_ok=True)


def write_outputs(outputs: Mapping[str, str], docs_dir: Path) -> WriteReport:
    """Write changed outputs under docs_dir, then the manifest; delete the files the previous manifest lists
    that are no longer produced and still look generated. Every path is checked before anything is written."""
    docs_dir = Path(docs_dir)
    paths = {rel: contained(docs_dir, rel) for rel in outputs}
    previous = read_manifest(docs_dir) or []
    _sweep_temporary(docs_dir)
    report = WriteReport([], [], [])
    for rel, content in outputs.items():
        path = paths[rel]
        if path.is_file() and path.read_text(encoding="utf-8") == content:
            report.unchanged.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, content)
        report.written.append(rel)
    for rel in previous:
        path = docs_dir / rel
        if rel not in outputs and path.is_file() and not path.is_symlink() and _is_generated(path):
            path.unlink()
            report.removed.append(rel)
    manifest = json.dumps({"files": sorted(outputs)}, indent=1) + "\n"
    target = contained(docs_dir, MANIFEST)
    if not target.is_file() or target.read_text(encoding="utf-8") != manifest:
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_text(target, manifest)
    return report


def _shown(plots) -> dict[str, set[str]]:
    """experiment slug -> the GPU keys its page shows a run of, from plot paths <slug>--<gpu>--<dtype>.svg (the
    speedup plots, <slug>--speedup[-<clock>]--<dtype>.svg, name no GPU: a GPU key cannot be "speedup")."""
    shown: dict[str, set[str]] = {}
    for rel in plots:
        name = PurePosixPath(rel).name
        if PurePosixPath(rel).parent.as_posix() == PLOTS_DIR and name.endswith(".svg") and name.count("--") == 2:
            slug, gpu, _ = name[: -len(".svg")].split("--")
            if not RESERVED_GPU_KEYS.fullmatch(gpu):
                shown.setdefault(slug, set()).add(gpu)
    return shown


def lost_evidence(outputs: Mapping[str, str], docs_dir: Path) -> list[str]:
    """What the pages under docs_dir show a run of and `outputs` would not: one line per experiment that
    would have no run left ("from evidence to none") and per GPU that would drop off an experiment's page.
    Before any manifest exists, the plots on disk stand for the last render."""
    docs_dir = Path(docs_dir)
    before = read_manifest(docs_dir)
    if before is None:
        plots = docs_dir / PLOTS_DIR
        before = [f"{PLOTS_DIR}/{p.name}" for p in plots.glob("*.svg")] if plots.is_dir() else []
    was, now = _shown(before), _shown(outputs)
    lines = []
    for slug in sorted(was):
        if not now.get(slug):
            lines.append(f"{slug}: its page shows runs on {', '.join(sorted(was[slug]))} and would show none")
        else:
            lines += [f"{slug}: its page shows a run on {gpu} and would show none there"
                      for gpu in sorted(was[slug] - now[slug])]
    return lines
