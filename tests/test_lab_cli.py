"""tools/build_results.py and benchmark-softmax: exit codes, messages and what they write."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HAS_CUDA

from experiments import all_experiments
from kernels._checks import interpreter_enabled
from lab import REPO_ROOT, adhoc

spec = importlib.util.spec_from_file_location("build_results", REPO_ROOT / "tools" / "build_results.py")
build_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_results)

FIXTURE_RECORDS = Path(__file__).parent / "fixtures" / "lab" / "records"


def _dirs(tmp_path):
    (tmp_path / "records").mkdir(exist_ok=True)
    return ["--records-dir", str(tmp_path / "records"), "--docs-dir", str(tmp_path / "docs")]


def test_render_only_from_the_command_line_writes_every_page(tmp_path):
    result = subprocess.run([sys.executable, "tools/build_results.py", "--render-only", *_dirs(tmp_path)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "rendered" in result.stdout
    docs = tmp_path / "docs"
    for slug in all_experiments():
        page = (docs / "experiments" / f"{slug}.md").read_text(encoding="utf-8")
        assert "No evidence yet" in page
        assert (docs / "generated" / f"{slug}.md").is_file()
    for name in ("experiments/index.md", "decisions/index.md", "generated/verdicts.md", "generated/environment.md"):
        assert (docs / name).is_file()


@pytest.mark.skipif(HAS_CUDA, reason="the no-CUDA paths")
def test_without_cuda_a_plain_build_renders_and_says_so(tmp_path, capsys):
    assert build_results.main(_dirs(tmp_path)) == 0
    assert "no CUDA GPU here: rendering from the recorded runs only" in capsys.readouterr().out


@pytest.mark.skipif(HAS_CUDA, reason="the no-CUDA paths")
@pytest.mark.parametrize("flag", ["--run", "--all"])
def test_forcing_a_run_without_cuda_exits_2_and_writes_nothing(tmp_path, capsys, flag):
    assert build_results.main([flag, "softmax-row-fusion", *_dirs(tmp_path)]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "docs").exists()


def test_unknown_slug_exits_2_and_names_the_known_ones(tmp_path, capsys):
    assert build_results.main(["no-such-experiment", *_dirs(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no-such-experiment" in err and "softmax-row-fusion" in err


def test_list_shows_slugs_titles_and_verdicts(tmp_path, capsys):
    assert build_results.main(["--list", *_dirs(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    experiments = all_experiments()
    assert [line.split("\t")[0] for line in out] == list(experiments)
    assert all(line.endswith("No evidence") for line in out)


def test_invalid_records_are_reported_and_strict_mode_exits_3(tmp_path, capsys):
    bad = tmp_path / "records" / "softmax-row-fusion" / "20260101T000000Z-nvidia-x-000000.json"
    bad.parent.mkdir(parents=True)
    dirs = _dirs(tmp_path)
    bad.write_text("{", encoding="utf-8")
    assert build_results.main(["--render-only", *dirs]) == 0
    assert f"skipped {bad}: not valid JSON" in capsys.readouterr().err
    assert build_results.main(["--render-only", "--strict", *dirs]) == 3


def test_records_of_undeclared_experiments_are_reported(tmp_path, capsys):
    shutil.copytree(FIXTURE_RECORDS / "fixture-single", tmp_path / "records" / "fixture-single")
    assert build_results.main(["--render-only", *_dirs(tmp_path)]) == 0
    assert "no declared experiment is named 'fixture-single'" in capsys.readouterr().err


def test_a_render_of_the_checkouts_own_pages_keeps_the_digest_of_its_inputs(tmp_path, monkeypatch):
    # `mkdocs serve` then finds the pages rendered from the inputs on disk and does not render them again;
    # a render elsewhere (another docs folder) leaves the digest alone.
    from lab.evidence.render_inputs import render_fingerprint, stored_fingerprint

    monkeypatch.setattr(build_results, "ROOT", tmp_path)
    (tmp_path / "records").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("one\n")
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "rounds.toml").write_text("")  # no probe rounds
    assert build_results.main(["--render-only"]) == 0
    kept = stored_fingerprint(tmp_path)
    assert kept == render_fingerprint(tmp_path)
    (tmp_path / "notes" / "a.md").write_text("two, longer\n")
    assert build_results.main(["--render-only", "--docs-dir", str(tmp_path / "elsewhere")]) == 0
    assert stored_fingerprint(tmp_path) == kept != render_fingerprint(tmp_path)


# ---- benchmark-softmax -------------------------------------------------------------------------------------


def test_adhoc_rejects_unknown_backends(capsys):
    assert adhoc.main(["--backend", "triton-auto,nope"]) == 2
    assert "unknown backend(s) nope" in capsys.readouterr().err


def test_adhoc_rejects_bad_sizes():
    with pytest.raises(SystemExit) as exit_info:
        adhoc.main(["--rows", "0"])
    assert exit_info.value.code == 2


@pytest.mark.skipif(not interpreter_enabled(), reason="the CPU path runs through Triton's interpreter")
def test_adhoc_refuses_a_shape_too_large_for_the_device_and_says_how_large(capsys):
    assert adhoc.main(["--device", "cpu", "--rows", str(10**11), "--cols", str(10**5), "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "--rows 100,000,000,000 x --cols 100,000 is 10,000,000,000,000,000 elements" in err
    assert "GiB" in err and "choose a smaller shape" in err


def test_adhoc_prints_a_long_failure_in_full_under_the_table():
    from types import SimpleNamespace

    from lab.evidence.records import Point, ProfileResult

    message = "RuntimeError: " + "the whole reason, " * 12 + "end"
    point = Point("c", {"M": 4, "N": 8}, "float32", 256, None, 1e-5, 1, None,
                  {"torch.softmax": ProfileResult("ok", samples_ms=(1.0,), p20_ms=1.0, p50_ms=1.0, p80_ms=1.0),
                   "triton-auto": ProfileResult("error", error=message)})
    args = SimpleNamespace(direction="forward", rows=4, cols=8, dtype="float32")
    table = adhoc.format_table(point, "torch.softmax", "CPU", 1.0, args, on_gpu=False)
    assert f"  triton-auto: error: {message}" in table.splitlines()
    assert any(line.startswith("triton-auto") and "…" in line for line in table.splitlines()), "clipped, visibly"


@pytest.mark.skipif(HAS_CUDA, reason="the no-CUDA path")
def test_adhoc_without_cuda_explains_the_ways_out(capsys):
    assert adhoc.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "TRITON_INTERPRET=1" in err


@pytest.mark.skipif(not interpreter_enabled(), reason="runs through Triton's interpreter")
@pytest.mark.parametrize("direction, reference", [("forward", "torch.softmax"), ("backward", "torch")])
def test_adhoc_on_the_interpreter_prints_a_labelled_table(capsys, direction, reference):
    code = adhoc.main(["--device", "cpu", "--rows", "4", "--cols", "40", "--dtype", "float32",
                       "--backend", "triton-auto,triton-online", "--direction", direction])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("cpu-interpreter: not performance evidence")
    assert f"vs {reference}" in lines[2]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert set(rows) == {"triton-auto", "triton-online", reference}
    assert all(row[1] == "ok" for row in rows.values())
    assert rows[reference][-1] == "1.000×"
