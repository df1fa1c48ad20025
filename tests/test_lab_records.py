"""Run records: round trip, immutability, atomic writes under simulated crashes, and validation on load."""

from __future__ import annotations

import gzip
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "lab"))

import lab_synthetic as syn  # noqa: E402

from lab.evidence import records  # noqa: E402
from lab.evidence.records import RecordError, RunRecord  # noqa: E402
from lab.evidence.store import RecordsFolderError, load_record, load_records, write_record  # noqa: E402
from lab.evidence.store import run_id_of as record_id  # noqa: E402


def _record(run_id="20260101T000000Z-nvidia-test-gpu-a-000001"):
    return syn.run([syn.point({"subject": syn.timed([1.0, 1.1, 0.9]), "base": syn.timed([1.2, 1.3, 1.25]),
                               "wrong": records.ProfileResult("incorrect", rel_error=0.5, reason="too far")})],
                   run_id=run_id)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_round_trip_keeps_every_field(tmp_path):
    record = _record()
    path = write_record(record, tmp_path)
    assert path == tmp_path / "exp" / f"{record.run_id}.json.gz"
    loaded = load_record(path)
    assert loaded == record  # `path` is excluded from equality
    assert loaded.path == path
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    assert text == record.to_json(), "the file is the record's JSON text, compressed"
    assert json.loads(text)["schema_version"] == records.SCHEMA_VERSION
    keys = list(json.loads(text))
    assert keys == sorted(keys), "records are written with sorted keys"
    assert "\n  " in text, "records are indented so diffs read line by line"


def test_existing_record_is_never_overwritten(tmp_path):
    record = _record()
    path = write_record(record, tmp_path)
    before = path.read_bytes()
    changed = replace(record, finished_utc="2030-01-01T00:00:00Z")
    with pytest.raises(FileExistsError, match="already exists"):
        write_record(changed, tmp_path)
    assert path.read_bytes() == before
    assert _leftovers(path.parent) == []


@pytest.mark.parametrize("crash_in", ["link", "fsync"])
def test_crash_mid_write_leaves_no_partial_file_and_the_old_record_intact(tmp_path, monkeypatch, crash_in):
    kept = write_record(_record(), tmp_path)
    kept_bytes = kept.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C at the worst moment

    monkeypatch.setattr(os, crash_in, crash)
    new = _record("20260102T000000Z-nvidia-test-gpu-a-000002")
    with pytest.raises(KeyboardInterrupt):
        write_record(new, tmp_path)
    monkeypatch.undo()
    assert not (tmp_path / "exp" / f"{new.run_id}.json.gz").exists()
    assert _leftovers(tmp_path / "exp") == [], "the temporary file must be removed"
    assert kept.read_bytes() == kept_bytes
    records_found, problems = load_records(tmp_path)
    assert [r.run_id for r in records_found] == [record_id(kept)] and problems == []


def test_unserialisable_record_is_refused_before_anything_is_written(tmp_path):
    bad = replace(_record(), copy_ceiling=records.CopyCeiling(float("nan"), 1, (1.0,)))
    with pytest.raises(ValueError):
        write_record(bad, tmp_path)
    assert not (tmp_path / "exp").exists() or list((tmp_path / "exp").iterdir()) == []


def _write_json(directory: Path, name: str, data) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def test_invalid_records_are_named_and_skipped_while_the_rest_load(tmp_path):
    good = write_record(_record(), tmp_path)
    data = json.loads(gzip.decompress(good.read_bytes()))
    exp = tmp_path / "exp"
    broken = _write_json(exp, "20260103T000000Z-x-000003.json", '{"schema_version": 1, "run_')
    future = _write_json(exp, "20260104T000000Z-x-000004.json", {**data, "schema_version": 2,
                                                                  "run_id": "20260104T000000Z-x-000004"})
    no_points = {k: v for k, v in data.items() if k != "points"}
    missing = _write_json(exp, "20260105T000000Z-x-000005.json", {**no_points, "run_id": "20260105T000000Z-x-000005"})
    bad_status = json.loads(json.dumps(data))
    bad_status["run_id"] = "20260106T000000Z-x-000006"
    bad_status["points"][0]["results"]["subject"]["status"] = "fast"
    wrong_status = _write_json(exp, "20260106T000000Z-x-000006.json", bad_status)
    renamed = _write_json(exp, "20260107T000000Z-x-000007.json", data)  # run_id says another file
    elsewhere = _write_json(tmp_path / "other-exp", f"{data['run_id']}.json", data)

    found, problems = load_records(tmp_path)
    assert [r.run_id for r in found] == [record_id(good)]
    by_file = {p.path: p.problem for p in problems}
    assert set(by_file) == {broken, future, missing, wrong_status, renamed, elsewhere}
    assert "not valid JSON" in by_file[broken]
    assert "unknown schema_version 2" in by_file[future]
    assert "missing field 'points'" in by_file[missing]
    assert "'fast' is not one of" in by_file[wrong_status] and "results['subject']" in by_file[wrong_status]
    assert "does not match the file name" in by_file[renamed]
    assert "does not match its directory" in by_file[elsewhere]
    assert str(broken) in str(problems[[p.path for p in problems].index(broken)])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["points"][0]["results"]["subject"].update(samples_ms=[1.0, -2.0]),
         r"samples_ms\[1\]: expected a number from 1e-09 to 8.64e\+07, got -2.0"),
        (lambda d: d["points"][0]["results"]["subject"].update(samples_ms="1.0"), "expected a list"),
        (lambda d: d["points"][0].update(bytes_moved=1.5), "expected an integer"),
        (lambda d: d.update(evidence="trust me"), "evidence"),
        (lambda d: d["environment"].pop("gpu_key"), "missing field 'gpu_key'"),
        (lambda d: d["points"][0]["results"]["subject"].update(p50_ms=None), "status 'ok' needs"),
    ],
)
def test_field_level_validation_names_the_field(mutate, message):
    data = json.loads(_record().to_json())
    mutate(data)
    with pytest.raises(RecordError, match=message):
        RunRecord.from_dict(data)


def test_a_missing_records_folder_is_an_error_not_an_empty_store(tmp_path):
    with pytest.raises(RecordsFolderError, match="does not exist"):
        load_records(tmp_path / "absent")
    (tmp_path / "file").write_text("")
    with pytest.raises(RecordsFolderError, match="is not a folder"):
        load_records(tmp_path / "file")


# Fields added with the clean L2 flush: older records read as they always did.

ROOT = Path(__file__).resolve().parents[1]


def _committed_record(slug: str) -> RunRecord:
    path = sorted((ROOT / "records" / slug).glob("*.json.gz"))[0]
    return load_record(path)


def test_a_committed_record_reads_with_the_old_flush_and_no_new_ceilings():
    record = _committed_record("decoder-block")
    assert record.timing.l2_flush == records.FLUSH_ZERO  # made before the field: the zeroing flush
    assert record.read_ceiling is None and record.read2_write_ceiling is None
    assert all(r.bytes_moved is None for p in record.points for r in p.results.values())


def test_an_old_fixture_without_the_new_fields_reads_with_their_defaults():
    data = json.loads(_record().to_json())
    for key in ("read_ceiling", "read2_write_ceiling"):
        del data[key]
    del data["timing"]["l2_flush"]
    del data["points"][0]["results"]["subject"]["bytes_moved"]
    record = RunRecord.from_dict(data)
    assert record.timing.l2_flush == records.FLUSH_ZERO
    assert record.read_ceiling is None and record.points[0].results["subject"].bytes_moved is None


def test_the_new_fields_round_trip(tmp_path):
    run = _record()
    ceiling = records.CopyCeiling(3200.0, 1 << 30, (0.34,))
    run = replace(run, timing=replace(run.timing, l2_flush=records.FLUSH_READ), read_ceiling=ceiling,
                  read2_write_ceiling=replace(ceiling, gbps=3300.0),
                  points=(replace(run.points[0], results={**run.points[0].results,
                                                          "subject": replace(run.points[0].results["subject"],
                                                                             bytes_moved=64)}),))
    loaded = load_record(write_record(run, tmp_path))
    assert loaded.timing.l2_flush == records.FLUSH_READ
    assert loaded.read_ceiling == ceiling and loaded.read2_write_ceiling.gbps == 3300.0
    assert loaded.points[0].results["subject"].bytes_moved == 64


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["timing"].update(l2_flush="evict"), r"timing.l2_flush.*'evict' is not one of"),
        (lambda d: d.update(read_ceiling={"gbps": -1.0, "bytes_copied": 1, "samples_ms": [1.0]}), "read_ceiling.gbps"),
        (lambda d: d["points"][0]["results"]["subject"].update(bytes_moved=0), r"results\['subject'\].bytes_moved"),
    ],
)
def test_the_new_fields_are_validated(mutate, message):
    data = json.loads(_record().to_json())
    mutate(data)
    with pytest.raises(RecordError, match=message):
        RunRecord.from_dict(data)
