"""Source hashes: which files define an experiment, their sha256, and whether a record is still current.

An experiment's evidence depends on its declaration file, on every file a profile names in `sources`, and
on the files that define the callables it runs (profiles, inputs, reference, byte model: e.g. the shared
experiments/_softmax.py). Each record stores the sha256 of all of them; when any differs from the tree
now, the record is stale: it measured code that no longer exists.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from experiments.spec import Experiment

MISSING = "missing"  # the hash recorded for a declared source file that does not exist


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _defining_file(fn: Callable[..., Any] | None) -> Path | None:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if fn is None:
        return None
    try:
        source = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:  # builtins and C extensions have no source file
        return None
    return Path(source).resolve() if source else None


def _callables(experiment: Experiment) -> Iterable[Callable[..., Any] | None]:
    yield from (experiment.make_inputs, experiment.reference, experiment.bytes_moved, experiment.flops)
    for profile in experiment.profiles:
        yield from (profile.run, profile.plan, profile.unsupported, profile.bytes_moved)


def _repo_paths(paths: Iterable[str], callables: Iterable[Callable[..., Any] | None], root: Path) -> list[str]:
    found = {p for p in paths if p}
    for fn in callables:
        path = _defining_file(fn)
        if path is not None and path.is_relative_to(root):
            found.add(path.relative_to(root).as_posix())
    return sorted(found)


def profile_source_files(experiment: Experiment, name: str, root: Path) -> list[str]:
    """The files that define one profile's timed work: its declared sources, the files defining what it runs
    (run, plan, declines) and the inputs it is given. Two runs whose hashes of all of these agree timed the
    same code for that profile, whatever else changed between them."""
    profile = experiment.profile(name)
    return _repo_paths(profile.sources, (profile.run, profile.plan, profile.unsupported, experiment.make_inputs),
                       Path(root).resolve())


def source_files(experiment: Experiment, root: Path) -> list[str]:
    """Repository-relative paths (POSIX style, sorted) of the files whose contents define `experiment`.

    Files outside `root` (installed packages such as torch or an optional peer) are left out: their
    versions are recorded in the environment instead.
    """
    paths = (experiment.source_file, *(s for prof in experiment.profiles for s in prof.sources))
    return _repo_paths(paths, _callables(experiment), Path(root).resolve())


def source_hashes(experiment: Experiment, root: Path) -> dict[str, str]:
    """sha256 of each of `experiment`'s source files under `root` (MISSING for a declared file that is not there)."""
    hashes = {}
    for rel in source_files(experiment, root):
        path = Path(root) / rel
        hashes[rel] = sha256_file(path) if path.is_file() else MISSING
    return hashes


def changed_sources(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Paths whose hash differs between a record and the tree now, including files only one side has."""
    return sorted(p for p in set(recorded) | set(current) if recorded.get(p) != current.get(p))


def _imported_repo_files(path: Path, root: Path) -> set[str]:
    """Repository files that `path` imports by absolute name, anywhere in it (a function's lazy import too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            candidate = root.joinpath(*name.split(".")).with_suffix(".py")
            if candidate.is_file():
                found.add(candidate.relative_to(root).as_posix())
    return found


def reachable_files(experiment: Experiment, root: Path, prefix: str = "kernels/") -> list[str]:
    """Files under `prefix` that `experiment`'s hashed sources reach through imports, transitively: the code
    its records measured. A reachable file that source_files leaves out can change without making the
    experiment's records stale (tests/test_lab_hashing.py keeps that list pinned)."""
    root = Path(root).resolve()
    seen = set(source_files(experiment, root))
    todo = list(seen)
    while todo:
        for rel in _imported_repo_files(root / todo.pop(), root) - seen:
            seen.add(rel)
            todo.append(rel)
    return sorted(rel for rel in seen if rel.startswith(prefix))
