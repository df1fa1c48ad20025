"""Source hashes: which files define an experiment, their sha256, and whether a record is still current.

An experiment's evidence depends on its declaration file, on every file a profile names in `sources`, and
on the files that define the callables it runs (profiles, inputs, reference, byte model: e.g. the shared
experiments/_softmax.py). Each record stores the sha256 of all of them; when any differs from the tree
now, the record is stale: it measured code that no longer exists.

One exception keeps the words on the pages correctable: an experiments/*.py file whose only changes since a
record are its prose (docstrings, comments, and the declarations' words: a profile's description, the
question, the claim's statement, ...) still defines the same measurement. `changed_sources` drops such a
file when it can prove it: the record names its commit, git holds that commit's file, the file's sha256 is
the one the record stored, and both versions parse to the same syntax tree once the prose is taken out
(`code_digest`). Anything else (no git, another commit, a dirty tree, a change to any code) stays changed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from experiments.spec import Experiment
from lab import REPO_ROOT

MISSING = "missing"  # the hash recorded for a declared source file that does not exist
# Keyword arguments of the declarations (experiments/spec.py) that hold words for the page and nothing the
# measurement reads.
PROSE_KEYWORDS = frozenset({
    "description", "requires_note", "title", "meaning", "basis", "statement", "short", "question", "focus", "why",
    "byte_model", "evidence_boundary", "above_ceiling", "if_supported", "if_rejected", "otherwise",
})
# ... and the declarations whose words come positionally: argument index by class name.
PROSE_POSITIONS = {"Profile": (1,), "Case": (2,), "PointColumn": (0, 1)}
PROSE_ONLY_DIRS = ("experiments/",)  # where a prose-only change does not make a record stale
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
_REPO_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.py")


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


def changed_sources(recorded: Mapping[str, str], current: Mapping[str, str], commit: object = None,
                    root: Path | None = None) -> list[str]:
    """Paths whose hash differs between a record and the tree now, including files only one side has. Given the
    record's `commit`, an experiments/*.py file whose change since then is prose alone is left out (above)."""
    changed = sorted(p for p in set(recorded) | set(current) if recorded.get(p) != current.get(p))
    if commit is None:
        return changed
    root = Path(root) if root is not None else REPO_ROOT
    return [p for p in changed if not (p in recorded and p in current
                                       and prose_only_change(p, recorded[p], current[p], commit, root))]


class _Prose(ast.NodeTransformer):
    """Takes docstrings, the PROSE_KEYWORDS arguments' values and PROSE_POSITIONS' arguments out of a syntax tree."""

    def _body(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return self.generic_visit(node)

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _body

    def visit_Call(self, node: ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        for i in PROSE_POSITIONS.get(name, ()):
            if i < len(node.args) and not isinstance(node.args[i], ast.Starred):
                node.args[i] = ast.Constant(value="")
        return self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword):
        if node.arg in PROSE_KEYWORDS:
            node.value = ast.Constant(value="")
            return node
        return self.generic_visit(node)


def code_digest(source: bytes) -> str | None:
    """sha256 of a Python file's syntax tree without its prose (comments, docstrings, PROSE_KEYWORDS values,
    PROSE_POSITIONS arguments) and without source positions; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return hashlib.sha256(ast.dump(_Prose().visit(tree)).encode()).hexdigest()


@functools.lru_cache(maxsize=4096)
def _committed(root: str, commit: str, path: str) -> tuple[str, str | None] | None:
    """(sha256, code_digest) of the file at `path` in `commit` of the git repository at `root`; None where git,
    the commit or the file is missing."""
    try:
        done = subprocess.run(["git", "-C", root, "show", f"{commit}:{path}"], capture_output=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return hashlib.sha256(done.stdout).hexdigest(), code_digest(done.stdout)


@functools.lru_cache(maxsize=4096)
def _current_digest(path: Path, sha: str) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return code_digest(data) if hashlib.sha256(data).hexdigest() == sha else None


def prose_only_change(path: str, recorded_sha: str, current_sha: str, commit: object, root: Path) -> bool:
    """Whether `path` (an experiments/*.py file) changed since the record at `commit` in its prose alone: the
    commit's file is the one the record hashed (`recorded_sha`) and its code_digest equals the tree's now."""
    if not (isinstance(commit, str) and _COMMIT.fullmatch(commit) and _REPO_PATH.fullmatch(path)
            and path.startswith(PROSE_ONLY_DIRS) and ".." not in path.split("/")):
        return False
    if MISSING in (recorded_sha, current_sha):
        return False
    before = _committed(str(root), commit, path)
    if before is None or before[0] != recorded_sha:
        return False
    old, new = before[1], _current_digest(Path(root) / path, current_sha)
    return old is not None and old == new


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
