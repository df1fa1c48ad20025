"""The cache of validated records (lab.evidence.record_cache): a record is taken from it only when the same
bytes passed the same code's checks before; anything else is read and validated afresh."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from lab.evidence import record_cache, store
from lab.evidence.records import RecordError, RunRecord

RECORDS = Path(__file__).resolve().parents[1] / "records"


@pytest.fixture
def one_record(tmp_path, monkeypatch):
    """A copy of a real record under tmp/records/<slug>/, and the cache in a folder of its own."""
    monkeypatch.setenv("KERNEL_LAB_RECORD_CACHE", str(tmp_path / "cache"))
    source = sorted((RECORDS / "softmax-row-fusion").glob("*.json.gz"))[-1]
    copy = tmp_path / "records" / "softmax-row-fusion" / source.name
    copy.parent.mkdir(parents=True)
    shutil.copy(source, copy)
    return copy


def _validation_refused(monkeypatch):
    def refuse(cls, data, path=None):
        raise RecordError("validated afresh")

    monkeypatch.setattr(RunRecord, "from_dict", classmethod(refuse))


def test_a_record_read_before_is_taken_from_the_cache_and_names_its_own_path(one_record, tmp_path, monkeypatch):
    first = store.load_record(one_record)
    elsewhere = tmp_path / "elsewhere" / "softmax-row-fusion" / one_record.name
    elsewhere.parent.mkdir(parents=True)
    shutil.copy(one_record, elsewhere)
    _validation_refused(monkeypatch)
    again = store.load_record(elsewhere)
    assert again == first and again.path == elsewhere
    assert len(list((tmp_path / "cache").glob("*.pickle"))) == 1


def test_changed_bytes_are_validated_afresh(one_record, monkeypatch):
    store.load_record(one_record)
    one_record.write_bytes(gzip.compress(gzip.decompress(one_record.read_bytes()) + b" "))
    _validation_refused(monkeypatch)
    with pytest.raises(RecordError, match="validated afresh"):
        store.load_record(one_record)


def test_a_broken_entry_or_a_cache_turned_off_means_validation(one_record, tmp_path, monkeypatch):
    store.load_record(one_record)
    (entry,) = (tmp_path / "cache").glob("*.pickle")
    entry.write_bytes(b"not a pickle")
    _validation_refused(monkeypatch)
    with pytest.raises(RecordError, match="validated afresh"):
        store.load_record(one_record)
    monkeypatch.setenv("KERNEL_LAB_RECORD_CACHE", "off")
    assert record_cache.folder() is None
    with pytest.raises(RecordError, match="validated afresh"):
        store.load_record(one_record)


def test_the_key_covers_the_validating_code(one_record, monkeypatch):
    store.load_record(one_record)
    record_cache._code_digest.cache_clear()
    monkeypatch.setattr(record_cache, "VALIDATORS", record_cache.VALIDATORS[:-1])
    try:
        _validation_refused(monkeypatch)
        with pytest.raises(RecordError, match="validated afresh"):
            store.load_record(one_record)
    finally:
        record_cache._code_digest.cache_clear()
