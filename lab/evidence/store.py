"""The record store: records/<slug>/<run-id>.json, written once, atomically, and read back with validation.

Writing goes through a temporary file in the target folder, fsync and rename, and never replaces an existing
record. Loading never trusts a file: one that does not parse or does not match the schema (lab.evidence.records)
becomes a RecordProblem naming the file and the problem, and the others load.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab.evidence.records import RecordError, RunRecord

# --------------------------------------------------------------------------------------------------------
# Writing: temporary file in the same directory, fsync, rename; never over an existing record
# --------------------------------------------------------------------------------------------------------


def record_path(records_dir: Path, slug: str, run_id: str) -> Path:
    return Path(records_dir) / slug / f"{run_id}.json"


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a hidden sibling file renamed into place: a reader sees the old
    content or the new, never a partial file. (Run records go through write_record, which also refuses to
    replace and fsyncs.)"""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_record(record: RunRecord, records_dir: Path) -> Path:
    """Write `record` to records_dir/<slug>/<run-id>.json atomically and return the path.

    The text goes to a hidden temporary file in the target directory, is fsynced, then renamed into place,
    so a crash or Ctrl-C at any moment leaves either no file or the complete one, never a partial one.
    Raises FileExistsError rather than replace an existing record: run ids are never reused.
    """
    text = record.to_json()
    RunRecord.from_dict(json.loads(text))  # refuse to write what could not be read back
    target = record_path(records_dir, record.experiment, record.run_id)
    if target.exists():
        raise FileExistsError(f"run record {target} already exists; records are immutable and run ids unique")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{record.run_id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        if target.exists():
            raise FileExistsError(f"run record {target} appeared while writing; not replacing it")
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)
    return target


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; some platforms cannot open a directory, which is harmless here.
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
    """A record file that could not be used, and why."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def load_record(path: Path) -> RunRecord:
    """Read and validate one record; raises RecordError naming the problem."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read the file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}") from exc
    record = RunRecord.from_dict(data, Path(path))
    if record.run_id != Path(path).stem:
        raise RecordError(f"run_id {record.run_id!r} does not match the file name {Path(path).name!r}")
    if record.experiment != Path(path).parent.name:
        raise RecordError(
            f"experiment {record.experiment!r} does not match its directory {Path(path).parent.name!r}"
        )
    return record


def load_records(records_dir: Path) -> tuple[list[RunRecord], list[RecordProblem]]:
    """Every valid record under records_dir/<slug>/*.json, and a problem for each file that is not valid.

    Records come back sorted by (experiment, started_utc, run_id); a missing records_dir is simply empty.
    """
    records: list[RunRecord] = []
    problems: list[RecordProblem] = []
    root = Path(records_dir)
    if not root.is_dir():
        return records, problems
    for path in sorted(root.glob("*/*.json")):
        try:
            records.append(load_record(path))
        except RecordError as exc:
            problems.append(RecordProblem(path, str(exc)))
    records.sort(key=lambda r: (r.experiment, r.started_utc, r.run_id))
    return records, problems
