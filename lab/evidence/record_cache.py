"""Validated run records kept between processes, so a record is checked against the schema once per content
and code, not on every build.

Reading a record means parsing its JSON and checking every field of every point (lab.evidence.checks): about
a quarter of a site build, and of every test that renders pages from the records. Records never change once
written, so the RunRecord made from a file's bytes after they passed those checks is kept under
.cache/records/ (git-ignored, never published), named by the SHA-256 of the stored bytes and of the code that
validates them (VALIDATORS): a different file, or a changed schema or check, is read and validated afresh.
The entries are pickles this code wrote from records that had passed validation; nothing in records/ is ever
unpickled. KERNEL_LAB_RECORD_CACHE=off turns the cache off; a folder path there moves it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from dataclasses import replace
from functools import cache
from pathlib import Path

from lab import REPO_ROOT, cache_folder
from lab.evidence.records import RunRecord

VALIDATORS = ("lab/evidence/records.py", "lab/evidence/checks.py", "lab/evidence/store.py", "lab/evidence/record_cache.py")


@cache
def _code_digest() -> bytes:
    digest = hashlib.sha256()
    for rel in VALIDATORS:
        digest.update(rel.encode() + b"\0" + (REPO_ROOT / rel).read_bytes())
    return digest.digest()


def folder() -> Path | None:
    """Where the cache lives, or None when KERNEL_LAB_RECORD_CACHE turns it off."""
    return cache_folder("KERNEL_LAB_RECORD_CACHE", "records")


def _entry(stored: bytes) -> Path | None:
    where = folder()
    return None if where is None else where / f"{hashlib.sha256(_code_digest() + stored).hexdigest()}.pickle"


def get(stored: bytes, path: Path) -> RunRecord | None:
    """The record validated earlier from exactly these bytes (a file's, and whatever else its reader's result
    depends on) by this code, now naming `path`; None if there is none (or the entry cannot be read: it is
    then validated afresh)."""
    entry = _entry(stored)
    if entry is None:
        return None
    try:
        with open(entry, "rb") as f:
            record = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        return None
    return replace(record, path=path) if isinstance(record, RunRecord) else None


def put(stored: bytes, record: RunRecord) -> None:
    """Keep `record`, validated from `stored`; written whole or not at all, and never an error for the reader."""
    entry = _entry(stored)
    if entry is None:
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".pickle")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(replace(record, path=None), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, entry)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
