"""The record store: records/<slug>/<run-id>.json.gz, written once, atomically, and read back with validation.

A record is its JSON text (sorted keys, indented: lab.evidence.records) compressed with gzip; every raw
sample is kept, at about a seventh of the size. Records written before compression, <run-id>.json, read
alike. Writing goes through a temporary file in the target folder, fsync, and a hard link to the final name,
which the file system refuses when that name exists: no record is ever replaced, not even by a writer that
races another for the same name. Loading never trusts a file: one that does not parse, is too large or does
not match the schema (lab.evidence.records) becomes a RecordProblem naming the file and the problem, and the
others load. A records folder that is missing or cannot be read is an error of its own (RecordsFolderError):
read as "no records", it would turn every page to "No evidence".
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from lab.evidence import record_cache
from lab.evidence.checks import IDENTIFIER, RUN_ID
from lab.evidence.records import RecordError, RunRecord

SUFFIX = ".json.gz"  # what write_record writes
SUFFIXES = (".json.gz", ".json")  # what load_records reads
MAX_RECORD_BYTES = 256 << 20  # of JSON text, after decompression: a bigger file is refused, not read whole


class RecordsFolderError(Exception):
    """The records folder itself is missing or cannot be read; the message says which and why."""


def run_id_of(path: Path) -> str | None:
    """The run id a record file's name gives (its name less .json.gz or .json), None for other names."""
    name = Path(path).name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


# --------------------------------------------------------------------------------------------------------
# Writing: temporary file in the same directory, fsync, hard link to the final name; never over a record
# --------------------------------------------------------------------------------------------------------


def record_path(records_dir: Path, slug: str, run_id: str) -> Path:
    if not IDENTIFIER.fullmatch(slug) or not RUN_ID.fullmatch(run_id):
        raise ValueError(f"cannot name a record file after slug {slug!r} and run id {run_id!r}")
    return Path(records_dir) / slug / f"{run_id}{SUFFIX}"


def compress(text: bytes) -> bytes:
    """A record file's bytes from its JSON text: gzip, with no file name or time in the header."""
    return gzip.compress(text, compresslevel=9, mtime=0)


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a hidden sibling file renamed into place: a reader sees the old
    content or the new, never a partial file, and an interrupted write leaves no temporary file behind.
    (Run records go through write_record, which refuses to replace and fsyncs.)"""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_record(record: RunRecord, records_dir: Path) -> Path:
    """Write `record` to records_dir/<slug>/<run-id>.json.gz and return the path.

    The bytes go to a hidden temporary file in the target directory, are fsynced, then hard-linked to the
    record's name, which fails when the name exists (so a crash, a Ctrl-C or a second writer leaves either
    no record or the complete one, never a partial or a replaced one); the temporary file is removed
    however the write ends. Raises FileExistsError rather than replace a record (in either form): run ids
    are never reused. A record that would not pass validation raises RecordError, after keeping its text in
    records/.rejected/ (hidden: never loaded, never published), so a long GPU run is never lost to a check.
    """
    text = record.to_json()
    try:
        RunRecord.from_dict(json.loads(text))  # refuse to write what could not be read back
    except RecordError as exc:
        kept = _set_aside(text, Path(records_dir), record.run_id)
        raise RecordError(f"this run's record would not read back ({exc}); what was measured is kept in {kept}, "
                          "which no page reads") from exc
    target = record_path(records_dir, record.experiment, record.run_id)
    for existing in (target, target.with_name(f"{record.run_id}.json")):
        if existing.exists():
            raise FileExistsError(f"run record {existing} already exists; records are immutable and run ids unique")
    target.parent.mkdir(parents=True, exist_ok=True)
    data = compress(text.encode("utf-8"))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{record.run_id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        _link_exclusive(tmp, target, data)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _fsync_directory(target.parent)
    return target


def _set_aside(text: str, records_dir: Path, run_id: str) -> Path:
    """Keep a record that fails validation where nothing reads it (records/.rejected/), so a GPU run is never
    lost to a schema check; the name is made safe, and never replaces a file."""
    folder = records_dir / ".rejected"
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=folder, prefix=re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:100] + ".",
                                suffix=SUFFIX)
    with os.fdopen(fd, "wb") as out:
        out.write(compress(text.encode("utf-8")))
    return Path(name)


def _link_exclusive(tmp: str, target: Path, data: bytes) -> None:
    """Give the finished temporary file the record's name, or fail if the name is taken."""
    try:
        os.link(tmp, target)
        return
    except FileExistsError:
        raise FileExistsError(f"run record {target} already exists; records are immutable and run ids unique") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
    # A file system without hard links: create the name exclusively and write it in place.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _fsync_directory(directory: Path) -> None:
    # Makes the new name itself durable; some platforms cannot open a directory, which is harmless here.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordProblem:
    """A file under the records folder that could not be used, and why."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _unique_keys(pairs):
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = sorted({key for key in keys if keys.count(key) > 1})
        raise RecordError(f"a JSON object names {', '.join(map(repr, twice[:5]))} twice")
    return dict(pairs)


def _no_constant(name: str):
    raise RecordError(f"{name} is not a JSON number")


def read_json(path: Path) -> object:
    """The JSON value in a record file (.json.gz or .json), refusing more than MAX_RECORD_BYTES of text,
    repeated keys, NaN and Infinity, and nesting too deep to read; RecordError says what was wrong."""
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_RECORD_BYTES + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(MAX_RECORD_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise RecordError(f"cannot read the file: {exc}") from exc
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"holds more than {MAX_RECORD_BYTES >> 20} MiB of JSON; not read")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise RecordError(f"not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}") from exc
    except RecursionError:
        raise RecordError("not read: its JSON nests too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise RecordError(f"not valid JSON: {exc}") from exc


def load_record(path: Path) -> RunRecord:
    """Read and validate one record; raises RecordError naming the problem. A file whose exact bytes this code
    validated before is taken from lab.evidence.record_cache."""
    path = Path(path)
    try:
        # the limit is part of the cache's key: a record read under another limit is read again
        stored = path.read_bytes() + b"\0" + str(MAX_RECORD_BYTES).encode() \
            if path.stat().st_size <= MAX_RECORD_BYTES else None
    except OSError:
        stored = None  # read_json names what is wrong with the file
    record = record_cache.get(stored, path) if stored is not None else None
    if record is None:
        record = RunRecord.from_dict(read_json(path), path)
        if stored is not None:
            record_cache.put(stored, record)
    if record.run_id != run_id_of(path):
        raise RecordError(f"run_id {record.run_id!r} does not match the file name {path.name!r}")
    if record.experiment != path.parent.name:
        raise RecordError(f"experiment {record.experiment!r} does not match its directory {path.parent.name!r}")
    return record


def _entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as found:
        return sorted((e for e in found if not e.name.startswith(".")), key=lambda e: e.name)


def load_records(records_dir: Path, *, missing_ok: bool = False) -> tuple[list[RunRecord], list[RecordProblem]]:
    """Every valid record under records_dir/<slug>/, and a problem for every other file found there.

    Hidden names (a record still being written, editor droppings) are passed over. Problems: a file that
    is not a valid record; a file or folder where records do not lie (records_dir/x.json, a folder inside
    an experiment's folder); a symbolic link (it could point anywhere); an experiment folder that cannot be
    read; run ids that two files share (every
    file of the id is skipped: which one is genuine cannot be told). Records come back sorted by
    (experiment, started_utc, run_id). Raises RecordsFolderError when records_dir is missing (unless
    `missing_ok`: a store no run has written to yet), is not a folder or cannot be read.
    """
    root = Path(records_dir)
    if missing_ok and not root.exists():
        return [], []
    if not root.exists():
        raise RecordsFolderError(f"the records folder {root} does not exist")
    if not root.is_dir():
        raise RecordsFolderError(f"the records folder {root} is not a folder")
    try:
        top = _entries(root)
    except OSError as exc:
        raise RecordsFolderError(f"cannot read the records folder {root}: {exc.strerror or exc}") from exc
    records: list[RunRecord] = []
    problems: list[RecordProblem] = []
    for folder in top:
        path = Path(folder.path)
        if folder.is_symlink() or not folder.is_dir():
            problems.append(RecordProblem(path, "not in an experiment's folder; records lie at "
                                                "records/<slug>/<run-id>.json.gz"))
            continue
        try:
            files = _entries(path)
        except OSError as exc:
            problems.append(RecordProblem(path, f"cannot read this experiment folder ({exc.strerror or exc}); "
                                                "its records are left out"))
            continue
        for entry in files:
            file = Path(entry.path)
            if entry.is_symlink() or not entry.is_file():
                problems.append(RecordProblem(file, "not a plain file (a folder, a link or a device); records "
                                                    "are files at records/<slug>/<run-id>.json.gz"))
                continue
            if run_id_of(file) is None:
                problems.append(RecordProblem(file, "not a record file; records lie at "
                                                    "records/<slug>/<run-id>.json.gz"))
                continue
            try:
                records.append(load_record(file))
            except RecordError as exc:
                problems.append(RecordProblem(file, str(exc)))
    by_id: dict[str, list[RunRecord]] = {}
    for record in records:
        by_id.setdefault(record.run_id, []).append(record)
    for run_id, same in by_id.items():
        if len(same) > 1:
            for record in same:
                others = ", ".join(str(r.path) for r in same if r is not record)
                problems.append(RecordProblem(record.path, f"run id {run_id} is also the run id of {others}; "
                                                           "none of them is used"))
    records = [r for r in records if len(by_id[r.run_id]) == 1]
    records.sort(key=lambda r: (r.experiment, r.started_utc, r.run_id))
    return records, sorted(problems, key=lambda p: str(p.path))
