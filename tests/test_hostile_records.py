"""Run records as an attacker would write them: valid JSON that crashes, traverses, wipes or races.

Every case works on a copy of a real record (the newest profiled H200 softmax-row-fusion run), goes through the
command line (tools/build_results.py --render-only) and asserts the named error, the exit code (never 1), and
that nothing outside the generated folders changed. The field-by-field cases (CASES) share one folder and one
render: each record is validated on its own, so each is skipped with its own message as it would be alone. The pages' escaping is tested in
tests/test_hostile_pages.py.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import random
import shutil
from pathlib import Path

import pytest

from experiments import get_experiment
from lab import REPO_ROOT
from lab.evidence.records import RecordError
from lab.evidence.store import compress, load_record, load_records, read_json, write_record
from lab.publish.collect import collect_evidence
from lab.publish.output import write_outputs
from lab.publish.render import render_outputs
from lab.publish.views import GENERATED_DIRS, PLOTS_DIR
from sitetools import load_tool

build_results = load_tool("build_results")

SLUG = "softmax-row-fusion"


def _base_file() -> Path:
    """The newest H200 run of SLUG with a profiler block: the richest record to corrupt field by field."""
    for path in sorted((REPO_ROOT / "records" / SLUG).glob("*.json.gz"), reverse=True):
        data = read_json(path)
        if data.get("profiling") and data["environment"]["gpu_key"] == "nvidia-h200":
            return path
    raise FileNotFoundError(f"no profiled H200 record of {SLUG} under records/")


BASE_FILE = _base_file()
BASE = read_json(BASE_FILE)
GENERATED = (*(f"docs/{folder}" for folder in GENERATED_DIRS), f"docs/{PLOTS_DIR}")  # lab/publish/views.py's


def base(run_id: str | None = None) -> dict:
    data = copy.deepcopy(BASE)
    if run_id:
        data["run_id"] = run_id
    return data


def put(root: Path, data, *, name: str | None = None, slug: str = SLUG, gz: bool = False) -> Path:
    """Write `data` (a record dict, or raw text) as records/<slug>/<name>."""
    name = name or f"{data['run_id']}.json{'.gz' if gz else ''}"
    path = root / "records" / slug / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data)
    path.write_bytes(compress(text.encode()) if name.endswith(".gz") else text.encode())
    return path


def _lab_folder(root: Path) -> Path:
    """The `lab` fixture's folder, made under root."""
    put(root, base(), gz=True)
    docs = root / "docs"
    (docs / "assets" / "images").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "docs" / "assets" / "images" / "logo.svg", docs / "assets" / "images" / "logo.svg")
    (docs / "index.md").write_text("# Hand-written home\n", encoding="utf-8")
    (docs / "experiments").mkdir()
    (docs / "experiments" / "notes.md").write_text("# Notes by hand\n", encoding="utf-8")
    return root


@pytest.fixture
def lab(tmp_path):
    """A records folder holding the base record, and a docs folder with hand-written files among the
    generated folders' neighbours (and one inside a generated folder)."""
    return _lab_folder(tmp_path)


def cli(root: Path, *extra: str) -> int:
    return build_results.main(["--render-only", "--records-dir", str(root / "records"),
                               "--docs-dir", str(root / "docs"), *extra])


def tree(root: Path, *, generated: bool = False) -> dict[str, str]:
    """sha256 of every file under root outside the generated folders; with `generated`, of every file under
    root/docs instead (to show that a render wrote nothing at all)."""
    found = {}
    for path in sorted((root / "docs" if generated else root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and (generated or not (rel.startswith(GENERATED) and rel != "docs/experiments/notes.md")):
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


# --------------------------------------------------------------------------------------------------------
# One record stops nothing: each is skipped with its path and field named; the rest renders; never exit 1
# --------------------------------------------------------------------------------------------------------

OK = ("points", 0, "results", "torch-baseline")  # an "ok" result of the base record


def at(data, path):
    for key in path:
        data = data[key]
    return data


def _nest(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


CASES = {
    "zero median": (lambda d: at(d, OK).update(p50_ms=0), r"torch-baseline'\].p50_ms: expected a number from 1e-09"),
    "negative median": (lambda d: at(d, OK).update(p50_ms=-0.01), r"p50_ms: expected a number from 1e-09"),
    "null p80": (lambda d: at(d, OK).update(p80_ms=None), "status 'ok' needs samples_ms and p20_ms, p50_ms, p80_ms"),
    "p20 above p50": (lambda d: at(d, OK).update(p20_ms=at(d, OK)["p80_ms"]), "p20_ms <= p50_ms <= p80_ms"),
    "median outside the samples": (lambda d: at(d, OK).update(p50_ms=at(d, OK)["p80_ms"], p80_ms=5.0),
                                   "<= max\\(samples_ms\\)"),
    "zero sample": (lambda d: at(d, OK)["samples_ms"].__setitem__(3, 0.0), r"samples_ms\[3\]: expected a number"),
    "checked_rows of the wrong shape": (lambda d: d["points"][0].update(checked_rows=[1, 2]),
                                        r"points\[0\].checked_rows: expected an object, got list"),
    "checked_rows past the rows": (lambda d: d["points"][0].update(checked_rows={"first": 9, "last": 1, "of": 4}),
                                   "expected first and last within of"),
    "a string memory size": (lambda d: d["environment"].update(memory_bytes="80 GB"),
                             "record.environment.memory_bytes: expected an integer"),
    "nvidia_smi as a list": (lambda d: d["environment"].update(nvidia_smi=["580"]),
                             "record.environment.nvidia_smi: expected an object, got list"),
    "a string profiling selection": (lambda d: d["profiling"].update(selection="all"),
                                     "record.profiling.selection: expected an object, got 'all'"),
    "nesting past the limit": (lambda d: at(d, OK).update(plan=_nest(40)), "nested deeper than 16 levels"),
    "schema_version true": (lambda d: d.update(schema_version=True), "unknown schema_version True"),
    "a negative byte count": (lambda d: d["points"][0].update(bytes_moved=-1),
                              r"points\[0\].bytes_moved: expected an integer from 1"),
    "an unknown status": (lambda d: at(d, OK).update(status="fast"), "'fast' is not one of ok, incorrect"),
    "an unknown field": (lambda d: at(d, OK).update(speedup=9.9), r"unknown field\(s\) 'speedup'"),
    "a traversing GPU key": (lambda d: d["environment"].update(gpu_key="x/../../images/z"),
                             "record.environment.gpu_key: expected a name of lower-case letters"),
    "a traversing dtype": (lambda d: [p.update(dtype="w/../logo") for p in d["points"]],
                           r"points\[0\].dtype: expected a name"),
    "a pipe in a case name": (lambda d: d["points"][0].update(case="a|b"), r"points\[0\].case: expected a case name"),
    "markup in a profile name": (lambda d: d["points"][0]["results"].update({"<b>x</b>": at(d, OK)}),
                                 r"results key: expected a name"),
    "a doubled dash in a GPU key": (lambda d: d["environment"].update(gpu_key="nvidia--h200"), "gpu_key"),
    "a GPU key named like the speedup plots": (lambda d: d["environment"].update(gpu_key="speedup"),
                                               "'speedup' is reserved"),
    "a two-line GPU name": (lambda d: d["environment"].update(gpu_name='x\n--8<-- ".git/config"'),
                            "gpu_name: expected one line of text"),
    "a source path out of the tree": (lambda d: d["hashes"].update({"../../etc/passwd": "0" * 64}),
                                      "hashes key: expected a repository-relative path"),
    "GPU evidence from the interpreter": (lambda d: d["environment"].update(gpu_key="cpu-interpreter"),
                                          "does not go with the GPU key"),
    "finished before started": (lambda d: d.update(finished_utc="2000-01-01T00:00:00Z"), "precedes started_utc"),
    "the same point twice": (lambda d: d["points"].append(d["points"][0]), "a second point at case"),
    "a million samples": (lambda d: at(d, OK).update(samples_ms=[0.01] * 10_001), "expected from 0 to 10000 items"),
}


@pytest.fixture(scope="module")
def every_bad_record(tmp_path_factory):
    """Every case at once, each as a record of its own newer than the base: one render, then one under
    --strict. Each record is validated on its own, so each is skipped with its own message, as it would be
    alone; the per-case test reads its line from the shared output. Returns (folder, {case: file}, stderr of
    the render, exit code under --strict, whether --strict changed any generated file)."""
    root = _lab_folder(tmp_path_factory.mktemp("every-bad-record"))
    files = {}
    for i, case in enumerate(sorted(CASES)):
        data = base(f"20990101T000000Z-nvidia-h200-bad{i:03d}")
        CASES[case][0](data)
        files[case] = put(root, data)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli(root)
    assert code == 0, err.getvalue()
    before = tree(root, generated=True)
    with contextlib.redirect_stderr(io.StringIO()):
        strict = cli(root, "--strict")
    return root, files, err.getvalue(), strict, tree(root, generated=True) != before


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_record_is_skipped_by_name_and_the_rest_renders(every_bad_record, case):
    root, files, err, strict, changed = every_bad_record
    message = CASES[case][1]
    line = next((x for x in err.splitlines() if x.startswith(f"build_results: skipped {files[case]}: ")), "")
    assert line and __import__("re").search(message, line), err
    page = (root / "docs" / "experiments" / f"{SLUG}.md").read_text(encoding="utf-8")
    assert BASE["run_id"] in page and files[case].stem.split("-")[-1] not in page, \
        "the valid record renders, the bad one does not"
    assert strict == 3
    assert not changed, "an unchanged render under --strict changes nothing"


def test_the_bad_records_leave_the_tree_outside_the_generated_folders_untouched(lab):
    before = tree(lab)
    for i, case in enumerate(sorted(CASES)):
        data = base(f"20990101T000000Z-nvidia-h200-b{i:05d}")
        CASES[case][0](data)
        put(lab, data, gz=i % 2 == 0)
    assert cli(lab) == 0
    after = tree(lab)
    assert {k: v for k, v in after.items() if not k.startswith("records/")} == \
        {k: v for k, v in before.items() if not k.startswith("records/")}
    assert not list((lab / "docs").rglob("*logo*.svg"))[1:], "no plot named after a traversing key"
    assert list((lab / "docs" / "assets" / "plots").iterdir()), "the valid record's plots"


@pytest.mark.parametrize("text, message", [
    ('{"schema_version": 1, "a": ' + "[" * 100_000 + "]" * 100_000 + "}", "its JSON nests too deeply"),
    ('{"schema_version": 1, "schema_version": 1}', "names 'schema_version' twice"),
    ('{"schema_version": NaN}', "NaN is not a JSON number"),
    ('{"schema_version": ' + "9" * 5000 + "}", "not valid JSON"),
    ("\udcff", "not UTF-8 text"),
    ("[]", "expected a JSON object at the top level, got list"),
])
def test_json_that_python_would_choke_on_is_named_too(lab, capsys, text, message):
    name = "20990101T000000Z-nvidia-h200-bad002.json"
    path = lab / "records" / SLUG / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert cli(lab) == 0
    assert f"skipped {path}: " in capsys.readouterr().err
    with pytest.raises(RecordError, match=message):
        load_record(path)


def test_a_broken_or_oversized_compressed_record_is_named(lab, monkeypatch):
    from lab.evidence import store

    broken = lab / "records" / SLUG / "20990101T000000Z-nvidia-h200-bad003.json.gz"
    broken.write_bytes(compress(json.dumps(base()).encode())[:200])
    with pytest.raises(RecordError, match="cannot read the file"):
        load_record(broken)
    monkeypatch.setattr(store, "MAX_RECORD_BYTES", 1000)
    with pytest.raises(RecordError, match="holds more than 0 MiB of JSON; not read"):
        load_record(BASE_FILE)


def test_a_file_name_with_markup_is_refused_and_never_reaches_a_page(lab, capsys):
    data = base("20990101T000000Z-nvidia-h200-bad004")
    path = put(lab, data, name="<img src=x onerror=alert(1)>.json")
    assert cli(lab) == 0
    assert f"skipped {path}: run_id '20990101T000000Z-nvidia-h200-bad004' does not match the file name" in \
        capsys.readouterr().err
    assert not any("onerror" in p.read_text(encoding="utf-8") for p in (lab / "docs").rglob("*.md"))


def test_no_valid_json_makes_the_render_fail(lab):
    """Random damage to a real record: every result is a skipped record or a rendered one, never a crash."""
    rng = random.Random(20261123)
    nasty = [None, True, False, 0, -1, 1 << 70, 1e308, -1e-300, 0.5, "", "<script>x</script>", "a|b", "../..", [],
             {}, [1, "x"], {"a": None}, "x" * 5000]
    experiment = get_experiment(SLUG)

    def paths(value, prefix=()):
        yield prefix
        if isinstance(value, dict):
            for k, v in value.items():
                yield from paths(v, (*prefix, k))
        elif isinstance(value, list):
            for i, v in enumerate(value[:3]):
                yield from paths(v, (*prefix, i))

    every = [p for p in paths(BASE) if p]
    rendered = 0
    for trial in range(40):
        data = base(f"20990101T000000Z-nvidia-h200-f{trial:05d}")
        for _ in range(rng.choice((1, 1, 2))):
            where = rng.choice(every)
            try:
                parent = at(data, where[:-1])
                if rng.random() < 0.15 and isinstance(parent, dict):
                    parent.pop(where[-1], None)
                else:
                    parent[where[-1]] = copy.deepcopy(rng.choice(nasty))
            except (KeyError, IndexError, TypeError):
                continue
        records = lab / f"fuzz{trial}"
        name = f"20990101T000000Z-nvidia-h200-f{trial:05d}.json"  # a mutation may have taken the run id away
        put(records, data, name=name)
        found = collect_evidence({SLUG: experiment}, (), records / "records", {SLUG: {}})
        if not found.problems:
            render_outputs(found)
            rendered += 1
        else:
            assert [p.path.name for p in found.problems] == [name]
    assert rendered, "some mutations keep the record valid (and it renders)"


# --------------------------------------------------------------------------------------------------------
# Writes contained; only generated files deleted
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["assets/plots/../images/logo.svg", "../outside.svg", "/tmp/x.svg",
                                 "assets/images/logo.svg", "experiments/sub/x.md", "index.md", "generated/./x.md"])
def test_an_output_path_outside_the_generated_folders_is_refused_before_any_write(lab, rel):
    before = tree(lab, generated=True)
    with pytest.raises(ValueError, match="refusing to write"):
        write_outputs({"experiments/fine.md": "x", rel: "<svg/>"}, lab / "docs")
    assert tree(lab, generated=True) == before


def test_a_symlink_in_a_generated_folder_is_not_written_through(lab):
    (lab / "docs" / "generated").mkdir(parents=True)
    (lab / "docs" / "generated" / "x.md").symlink_to(lab / "docs" / "index.md")
    with pytest.raises(ValueError, match="refusing to write"):
        write_outputs({"generated/x.md": "overwritten"}, lab / "docs")
    assert (lab / "docs" / "index.md").read_text(encoding="utf-8") == "# Hand-written home\n"


def test_a_tampered_manifest_deletes_nothing_hand_written(lab):
    assert cli(lab) == 0
    manifest = lab / "docs" / "generated" / "manifest.json"
    listed = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    manifest.write_text(json.dumps({"files": [*listed, "experiments/notes.md", "../index.md",
                                              "assets/images/logo.svg"]}), encoding="utf-8")
    before = tree(lab)
    assert cli(lab) == 0
    assert tree(lab) == before


# --------------------------------------------------------------------------------------------------------
# No silent wipe
# --------------------------------------------------------------------------------------------------------


def test_a_missing_or_wrong_records_folder_is_an_error_and_renders_nothing(lab, capsys):
    assert cli(lab) == 0
    before = tree(lab, generated=True)
    for bad, why in ((lab / "nowhere", "does not exist"), (lab / "docs" / "index.md", "is not a folder")):
        code = build_results.main(["--render-only", "--records-dir", str(bad), "--docs-dir", str(lab / "docs")])
        assert code == 2
        assert why in capsys.readouterr().err
    assert tree(lab, generated=True) == before, "no page turned to No evidence, no plot deleted"


def test_an_unreadable_records_folder_is_an_error(lab, capsys, monkeypatch):
    real = os.scandir

    def scandir(path="."):
        if Path(path) == lab / "records":
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert cli(lab) == 2
    assert "cannot read the records folder" in capsys.readouterr().err


def test_an_unreadable_experiment_folder_is_named_and_its_loss_is_loud(lab, capsys, monkeypatch):
    assert cli(lab) == 0
    capsys.readouterr()
    before = tree(lab, generated=True)
    real = os.scandir

    def scandir(path="."):
        if Path(path) == lab / "records" / SLUG:
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert cli(lab, "--strict") == 3
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert f"skipped {lab / 'records' / SLUG}: cannot read this experiment folder (Permission denied)" in err
    assert f"WARNING: evidence would disappear: {SLUG}: its page shows runs on nvidia-h200 and would show none" in err
    assert "--strict: nothing was rendered" in err
    assert tree(lab, generated=True) == before


def test_losing_every_record_of_an_experiment_warns_and_strict_refuses(lab, capsys):
    assert cli(lab) == 0
    before = tree(lab, generated=True)
    for path in (lab / "records" / SLUG).iterdir():
        path.unlink()
    assert cli(lab, "--strict") == 3
    assert tree(lab, generated=True) == before
    assert cli(lab) == 0, "without --strict the loss is accepted, loudly"
    assert "evidence would disappear" in capsys.readouterr().err
    assert "No evidence yet" in (lab / "docs" / "experiments" / f"{SLUG}.md").read_text(encoding="utf-8")
    assert cli(lab, "--strict") == 0, "once rendered, the loss is no longer news"


# --------------------------------------------------------------------------------------------------------
# The smaller ones
# --------------------------------------------------------------------------------------------------------


def test_duplicate_run_ids_and_misplaced_files_are_named(lab, capsys):
    twin = base()  # the base record again, plain, beside its compressed self
    put(lab, twin)
    (lab / "records" / "stray.json").write_text("{}", encoding="utf-8")
    (lab / "records" / SLUG / "nested").mkdir()
    (lab / "records" / SLUG / "README.txt").write_text("notes", encoding="utf-8")
    records, problems = load_records(lab / "records")
    named = {p.path.name: p.problem for p in problems}
    assert records == []
    assert "is also the run id of" in named[f"{BASE['run_id']}.json"]
    assert "is also the run id of" in named[f"{BASE['run_id']}.json.gz"]
    assert named["stray.json"].startswith("not in an experiment's folder")
    assert named["nested"].startswith("not a plain file") and named["README.txt"].startswith("not a record file")


def test_a_linked_record_is_not_followed(lab):
    outside = put(lab / "elsewhere", base("20990101T000000Z-nvidia-h200-link01"))
    (lab / "records" / SLUG / outside.name).symlink_to(outside)
    records, problems = load_records(lab / "records")
    assert [r.run_id for r in records] == [BASE["run_id"]]
    assert [(p.path.name, p.problem.split(" (")[0]) for p in problems] == [(outside.name, "not a plain file")]


def test_an_interrupted_render_leaves_no_temporary_file_and_the_next_sweeps_old_ones(lab, monkeypatch):
    assert cli(lab) == 0
    stale = [lab / "docs" / "generated" / ".verdicts.md.abc.tmp", lab / "docs" / "assets" / "plots" / ".x.svg.tmp"]
    for path in stale:
        path.write_text("partial", encoding="utf-8")
    (lab / "docs" / "generated" / "verdicts.md").write_text("changed", encoding="utf-8")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli(lab)
    monkeypatch.undo()
    assert not [p for p in (lab / "docs").rglob(".*.tmp") if p not in stale], "the interrupted write cleaned up"
    assert cli(lab) == 0
    assert not list((lab / "docs").rglob(".*.tmp"))


def test_two_writers_of_one_record_cannot_both_win(lab, monkeypatch):
    record = load_record(BASE_FILE)
    target = lab / "again"
    first = write_record(record, target)
    with pytest.raises(FileExistsError, match="already exists"):
        write_record(record, target)
    other = record.__class__(**{**record.__dict__, "run_id": "20990101T000000Z-nvidia-h200-race01"})
    real_link = os.link

    def racing_link(src, dst):  # another writer takes the name between our checks and our link
        Path(dst).write_bytes(b"theirs")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", racing_link)
    with pytest.raises(FileExistsError, match="already exists"):
        write_record(other, target)
    monkeypatch.undo()
    assert (target / SLUG / "20990101T000000Z-nvidia-h200-race01.json.gz").read_bytes() == b"theirs"
    assert load_record(first) == record
    assert not list((target / SLUG).glob(".*.tmp"))


def test_a_record_that_would_not_read_back_is_set_aside_not_lost(lab):
    record = load_record(BASE_FILE)
    bad = record.__class__(**{**record.__dict__, "environment": {**record.environment, "gpu_key": "Bad Key"}})
    with pytest.raises(RecordError, match=r"would not read back \(record.environment.gpu_key: .*kept in"):
        write_record(bad, lab / "out")
    (kept,) = (lab / "out" / ".rejected").iterdir()
    assert read_json(kept)["environment"]["gpu_key"] == "Bad Key"
    assert load_records(lab / "out") == ([], []), "a set-aside record is never loaded"


def test_declared_names_follow_the_record_name_pattern():
    """What the runner writes must pass what the loader checks: declared slugs, case and profile names."""
    from experiments import all_experiments
    from lab.evidence.checks import CASE, DIMENSION, IDENTIFIER, SOURCE_PATH
    from lab.evidence.hashing import source_files

    for slug, experiment in all_experiments().items():
        names = [slug, *(p.name for p in experiment.profiles), *(str(d).removeprefix("torch.") for d in experiment.dtypes)]
        assert [n for n in names if not IDENTIFIER.fullmatch(n)] == [], slug
        assert [c.name for c in experiment.cases if not CASE.fullmatch(c.name)] == [], slug
        assert [d for c in experiment.cases for d in c.shape if not DIMENSION.fullmatch(d)] == [], slug
        assert [p for p in source_files(experiment, REPO_ROOT) if not SOURCE_PATH.fullmatch(p)] == [], slug


def test_every_schema_table_names_exactly_its_dataclass_fields():
    import dataclasses

    from lab.evidence.records import SCHEMA_TABLES

    for cls, table in SCHEMA_TABLES.items():
        assert set(table.table) == {f.name for f in dataclasses.fields(cls)} - {"path"}, cls.__name__


# ---------------------------------------------------------------------------------------------------------
# The matmul peak (the roofline's flat roof): optional, and checked when present
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("peak, field", [
    ({"tflops": -1.0, "m": 8, "n": 8, "k": 8, "dtype": "bfloat16", "samples_ms": [1.0]}, "tflops"),
    ({"tflops": 1.0, "m": 8, "n": 8, "k": 8, "dtype": "bfloat16", "samples_ms": [1.0]}, "does not follow"),
    ({"tflops": 1.0, "m": 0, "n": 8, "k": 8, "dtype": "bfloat16", "samples_ms": [1.0]}, "m"),
    ({"tflops": 1.0, "m": 8, "n": 8, "k": 8, "dtype": "bf 16", "samples_ms": [1.0]}, "dtype"),
    ({"tflops": 1.0, "m": 8, "n": 8, "k": 8, "dtype": "bfloat16", "samples_ms": []}, "samples_ms"),
    ("fast", "matmul_peak"),
])
def test_a_bad_matmul_peak_is_refused_by_name(peak, field):
    from lab.evidence.checks import RecordError
    from lab.evidence.records import MatmulPeak, RECORD_FIELDS

    with pytest.raises(RecordError, match=field):
        if isinstance(peak, dict):
            MatmulPeak.from_dict(peak, "record.matmul_peak")
        else:
            RECORD_FIELDS.table["matmul_peak"].check(peak, "record.matmul_peak")


def test_a_matmul_peak_that_adds_up_is_read():
    from lab.evidence.records import MatmulPeak

    # 2 * 8192^3 FLOPs in 1.8 ms: about 611 TFLOP/s.
    peak = MatmulPeak.from_dict({"tflops": 610.8, "m": 8192, "n": 8192, "k": 8192, "dtype": "bfloat16",
                                 "samples_ms": [1.79, 1.8, 1.81]}, "record.matmul_peak")
    assert peak.tflops == 610.8 and peak.samples_ms == (1.79, 1.8, 1.81)
