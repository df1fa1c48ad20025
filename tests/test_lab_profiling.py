"""Profiling under Nsight Compute, on the CPU: the selection rule, ncu's raw CSV, attribution of kernels to
points, the failure paths, the driver's calls, and what the record keeps.

tests/fixtures/lab/ncu/raw_page.csv is the raw page ncu 2025.3.1 printed for three profiled calls on an
H200 (`--csv --page raw --nvtx`): its preamble lines, a header row, a units row, then one row per kernel.
Its NVTX ranges carry this lab's names (kernel-lab-point-0 .. 2), most device-attribute columns are left
out, and a sixth launch outside every range was added. Real ncu is never run here: a stand-in script
plays it where the subprocess path is under test.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_fixture_experiments as fx  # noqa: E402
import lab_synthetic as syn  # noqa: E402

from experiments.spec import Case  # noqa: E402
from lab import REPO_ROOT  # noqa: E402
from lab.measure import ncu  # noqa: E402
from lab.measure import profiling as prof  # noqa: E402
from lab.measure.profile_driver import run_plan  # noqa: E402
from lab.evidence.records import ProfileResult, RecordError, RunRecord  # noqa: E402
from lab.evidence.store import load_record, write_record  # noqa: E402
from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.render import render_outputs  # noqa: E402
from lab.measure.inputs import draw_inputs  # noqa: E402
from lab.measure.runner import run_experiment  # noqa: E402
from lab.measure.timing import TimingParams  # noqa: E402

RAW_PAGE = (FIXTURES / "ncu" / "raw_page.csv").read_text(encoding="utf-8")
FEW = TimingParams(warmup_rounds=1, min_samples=3, max_samples=3, target_seconds=0.0, copy_bytes=1 << 20,
                   copy_repeats=2)


def _sweep(cases=20, others=("other",)):
    """A synthetic experiment over `cases` cases and one dtype, claim subject/base plus `others`."""
    return replace(syn.experiment(baselines=("base",), others=others),
                   cases=tuple(Case(f"c{i}", {"M": 2, "N": 8}) for i in range(cases)))


def _record(experiment, results=None):
    """A timed record of `experiment`: every profile "ok" at every case unless `results(case)` says otherwise."""
    points = []
    for i, case in enumerate(experiment.cases):
        chosen = results(case.name) if results else {}
        timed = {p.name: chosen.get(p.name, syn.timed([1.0 + i, 1.1 + i])) for p in experiment.profiles}
        points.append(replace(syn.point(timed, case=case.name), input_seed=1000 + i))
    return syn.run(points, hashes={"kernels/k.py": "a" * 64})


# ---- selection ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count, limit, expected", [
    (98, 8, [0, 14, 28, 42, 55, 69, 83, 97]),
    (9, 2, [0, 8]),
    (3, 8, [0, 1, 2]),
    (5, 0, [0, 1, 2, 3, 4]),
    (5, 1, [0]),
    (0, 8, []),
])
def test_points_are_spread_evenly_with_the_first_and_last_included(count, limit, expected):
    assert prof.evenly(count, limit) == expected


def test_default_selection_is_the_claims_profiles_at_eight_points():
    experiment = _sweep(cases=20)
    targets = prof.select_targets(experiment, _record(experiment), prof.ProfilingRequest())
    assert {t.profile for t in targets} == {"subject", "base"}, "profiles outside the claim are not profiled"
    assert sorted({t.case for t in targets}, key=lambda c: int(c[1:])) == [
        "c0", "c3", "c5", "c8", "c11", "c14", "c16", "c19"]
    assert [t.index for t in targets] == list(range(16))
    assert targets[0].seed == 1000 and targets[-1].seed == 1019, "each call uses its point's recorded seed"
    assert targets[0].range_name == "kernel-lab-point-0"


def test_named_profiles_all_points_and_only_correct_results():
    experiment = _sweep(cases=4)
    wrong = {"other": ProfileResult("incorrect", rel_error=0.5, reason="off")}
    record = _record(experiment, lambda case: wrong if case == "c1" else {})
    request = prof.ProfilingRequest(max_points=0, profiles=("other",))
    targets = prof.select_targets(experiment, record, request)
    assert [(t.case, t.profile) for t in targets] == [("c0", "other"), ("c2", "other"), ("c3", "other")]


def test_a_negative_point_count_is_refused():
    with pytest.raises(ValueError, match="expected 0 .every point. or a positive count"):
        prof.ProfilingRequest(max_points=-1)


def test_the_command_leaves_clocks_and_cache_control_alone_and_profiles_only_the_ranges():
    command = prof.ncu_command("/opt/ncu", "/venv/bin/python", "plan.json", "manifest.json")
    text = " ".join(command)
    for part in ("--clock-control none", "--profile-from-start off", "--nvtx", "--csv", "--page raw",
                 f"--metrics {','.join(ncu.METRICS)}", "/venv/bin/python -m lab.measure.profile_driver",
                 "--plan plan.json", "--manifest manifest.json"):
        assert part in text
    assert "--cache-control" not in text, "ncu's default (flush before every replay pass) is kept"
    assert command[0] == "/opt/ncu" and command.index("--metrics") < command.index("/venv/bin/python")


# ---- ncu's raw CSV ------------------------------------------------------------------------------------------


def test_the_raw_page_is_read_past_ncus_own_lines_with_its_units():
    rows, units = ncu.read_raw_csv(RAW_PAGE)
    assert [r["ID"] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    assert units[ncu.DURATION] == "ns" and units[ncu.DRAM_READ] == "byte" and units[ncu.DRAM_PCT] == "%"
    assert units[ncu.REGISTERS] == "register/thread" and units["ID"] == ""


@pytest.mark.parametrize("text, message", [
    ("==PROF== Disconnected from process 1\n", "no header row"),
    ('"ID","Kernel Name"\n', "no units row"),
    ('"ID","Kernel Name"\n"",""\n"0"\n', "row 3 has 1 cells for 2 columns"),
])
def test_output_without_a_readable_csv_is_named(text, message):
    with pytest.raises(ncu.NcuOutputError, match=message):
        ncu.read_raw_csv(text)


def test_a_kernels_facts_come_with_their_units():
    rows, units = ncu.read_raw_csv(RAW_PAGE)
    first = ncu.kernel_facts(rows[0], units)
    assert first["id"] == 0 and first["name"] == "softmax_warp_forward"
    m = {name: reading["value"] for name, reading in first["metrics"].items()}
    assert m[ncu.DURATION] == 11072 and first["metrics"][ncu.DURATION]["unit"] == "ns"
    assert m[ncu.DRAM_READ] == 8416000 and m[ncu.DRAM_WRITE] == 256
    assert m[ncu.DRAM_PCT] == pytest.approx(15.82) and m[ncu.SM_PCT] == pytest.approx(45.41)
    assert m[ncu.REGISTERS] == 48 and m[ncu.GRID] == 1024 and m[ncu.BLOCK] == 128
    assert m[ncu.LOCAL_LOAD] == 0 and m[ncu.LOCAL_STORE] == 0
    assert m[ncu.TENSOR_PCT] == pytest.approx(0.09)
    assert ncu.GMMA_INSTRUCTIONS not in first["metrics"], "a metric ncu did not print is absent, not zero"
    gemm = ncu.kernel_facts(rows[1], units)
    assert gemm["name"] == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert gemm["metrics"][ncu.TENSOR_PCT]["value"] == pytest.approx(82.75)
    assert gemm["metrics"][ncu.REGISTERS]["value"] == 168


def test_other_units_are_scaled_to_ns_and_bytes():
    row = {"ID": "7", "Kernel Name": "k", ncu.DURATION: "1.5", ncu.DRAM_READ: "2,000"}
    facts = ncu.kernel_facts(row, {ncu.DURATION: "usecond", ncu.DRAM_READ: "Kbyte"})
    assert facts["metrics"][ncu.DURATION] == {"value": 1500.0, "unit": "ns"}
    assert facts["metrics"][ncu.DRAM_READ] == {"value": 2_000_000.0, "unit": "byte"}


@pytest.mark.parametrize("cell, value", [("1,980,000", 1980000), ("15.82", 15.82), ("", None), ("n/a", None),
                                         ("PolicySpread", None), ("nan", None)])
def test_cells_become_numbers_or_nothing(cell, value):
    assert ncu.number(cell) == value


@pytest.mark.parametrize("name, short", [
    ("void <unnamed>::softmax_warp_forward<c10::Half, c10::Half, float, 10, 0, 0>(T2 *, const T1 *, int)",
     "softmax_warp_forward"),
    ("void at::unrolled_elementwise_kernel<at::direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() "
     "(instance 3)]::operator ()() const::[lambda(float) (instance 1)], std::array<char *, 2>, 4>(int, T1, T2)",
     "unrolled_elementwise_kernel"),
    ("_softmax_single_block_kernel", "_softmax_single_block_kernel"),
    ("triton_per_fused__softmax_0", "triton_per_fused__softmax_0"),
])
def test_kernel_names_are_shortened(name, short):
    assert ncu.short_kernel_name(name) == short


def _targets(n=3):
    return [prof.Target(i, i, f"c{i}", "float16", "p", 0) for i in range(n)]


def test_kernels_are_attributed_by_their_nvtx_range_not_their_order():
    rows, units = ncu.read_raw_csv(RAW_PAGE)
    shuffled = [rows[4], rows[1], rows[5], rows[0], rows[3], rows[2]]
    kernels, unattributed = ncu.attribute(shuffled, units, _targets())
    assert {i: [k["id"] for k in found] for i, found in kernels.items()} == {0: [0], 1: [1], 2: [2, 3, 4]}
    assert unattributed == 1, "the launch outside every range is counted and left out"
    assert [k["name"] for k in kernels[2]] == ["unrolled_elementwise_kernel", "softmax_warp_forward",
                                               "vectorized_elementwise_kernel"]


def test_a_range_of_no_known_target_is_not_attributed():
    rows, units = ncu.read_raw_csv(RAW_PAGE)
    kernels, unattributed = ncu.attribute(rows, units, _targets(2))
    assert kernels[1] and 2 not in kernels and unattributed == 4
    assert ncu.range_index({"thread Domain:Push/Pop_Range:x": '9  "<default domain>:kernel-lab-point-12:none"'}) == 12
    assert ncu.range_index({"thread Domain:Push/Pop_Range:x": "kernel-lab-point-1 kernel-lab-point-2"}) is None
    assert ncu.range_index({"Kernel Name": "kernel-lab-point-1"}) is None, "only the NVTX columns name ranges"


def test_a_points_totals_sum_its_kernels_and_weight_percentages_by_time():
    rows, units = ncu.read_raw_csv(RAW_PAGE)
    kernels, _ = ncu.attribute(rows, units, _targets())
    totals = ncu.point_totals(kernels[2])
    durations = [12960, 11520, 7712]  # ns, from the fixture's three kernels of range 2
    assert totals["kernels"] == 3 and totals["duration_ns"] == sum(durations)
    reads = [8421120, 16803072, 16782336]
    writes = [8192, 548864, 41472]
    assert totals["dram_read_bytes"] == sum(reads) and totals["dram_write_bytes"] == sum(writes)
    assert totals["dram_bytes"] == sum(reads) + sum(writes)
    assert totals["dram_gbps"] == pytest.approx((sum(reads) + sum(writes)) / sum(durations))
    pct = [13.57, 31.38, 45.52]
    assert totals["dram_pct_of_peak"] == pytest.approx(sum(d * p for d, p in zip(durations, pct)) / sum(durations))
    assert totals["registers_per_thread_max"] == 48 and totals["local_spill_bytes"] == 0
    assert totals["fp_flops"] is None  # the fixture's ncu output predates the FP instruction counters
    assert ncu.point_totals([])["duration_ns"] is None


def _kernel(**counts):
    return {"metrics": {f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": {"value": v, "unit": "inst"}
                        for op, v in counts.items()}}


def test_fp_flops_count_an_fma_twice_and_need_every_kernel_counted():
    assert all(m in ncu.METRICS for m in ncu.FP_INSTRUCTION_FLOPS)
    kernels = [_kernel(ffma=100, fadd=10, fmul=5), _kernel(hfma=7, dadd=1)]
    assert ncu.point_totals(kernels)["fp_flops"] == 2 * 100 + 10 + 5 + 2 * 7 + 1
    assert ncu.point_totals(kernels + [_kernel()])["fp_flops"] is None  # a kernel without the counters
    assert ncu.point_totals([_kernel(ffma=0)])["fp_flops"] == 0


# ---- judging ncu's run --------------------------------------------------------------------------------------


CLOCK_NOTE = "==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling ..."


def test_the_version_is_read_from_ncus_version_line():
    said = ("NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\n"
            "Version 2025.3.1.0 (build 36398880) (public-release)\n")
    assert ncu.parse_version(said) == "2025.3.1.0 (build 36398880) (public-release)"
    assert ncu.parse_version("") is None


@pytest.mark.parametrize("status, stdout, stderr, expected", [
    (0, CLOCK_NOTE + "\n" + RAW_PAGE, "", None),
    (0, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
        "Counters on the target device 0.\n", "", "ERR_NVGPUCTRPERM - The user does not have permission"),
    (0, "", "==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n", "LibraryNotLoaded"),
    (1, "", "Traceback (most recent call last):\n  File x\nImportError: no module named lab\n",
     "ncu exited with status 1:\nTraceback (most recent call last):\n  File x\nImportError: no module named lab"),
    (9, "==ERROR== The application returned an error code (9).\n", "", "status 9:\n==ERROR== The application"),
])
def test_ncu_failures_are_told_in_its_own_words(status, stdout, stderr, expected):
    said = ncu.ncu_failure(status, stdout, stderr)
    if expected is None:
        assert said is None
    else:
        assert expected in said


# ---- the whole step, with ncu missing or played by a stand-in -----------------------------------------------


def test_without_ncu_the_record_keeps_its_timings_and_says_why(tmp_path):
    experiment = _sweep(cases=3)
    record = _record(experiment)
    messages = []
    profiled = prof.profile_record(experiment, record, prof.ProfilingRequest(ncu=str(tmp_path / "no-ncu")),
                                   device="cuda", root=REPO_ROOT, say=messages.append)
    block = profiled.profiling
    assert "was not found" in block["error"] and "not on PATH" in block["error"]
    assert block["command"] == [] and block["ncu_version"] is None
    assert block["selection"]["profiles"] == ["subject", "base"]
    assert profiled.points == record.points, "no point gains profiler facts"
    assert messages[0] == "profiling 6 call(s) under Nsight Compute: 3 point(s) × subject, base"
    assert RunRecord.from_dict(json.loads(profiled.to_json())) == profiled


def test_nothing_selected_is_said_without_starting_ncu():
    experiment = _sweep(cases=2)
    failed = {"subject": ProfileResult("error", error="boom"), "base": ProfileResult("unsupported", reason="no")}
    record = _record(experiment, lambda case: failed)
    profiled = prof.profile_record(experiment, record, prof.ProfilingRequest(ncu="ncu-that-is-never-started"),
                                   device="cuda", root=REPO_ROOT)
    assert profiled.profiling["error"].startswith("nothing to profile: no selected profile (subject, base)")


FAKE_NCU = textwrap.dedent('''\
    #!{python}
    """Plays ncu for the tests: answers --version, else writes the driver's manifest and prints a raw page."""
    import json, os, sys, time
    args = sys.argv[1:]
    if args == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2025.3.1.0 (build 0) (public-release)")
        sys.exit(0)
    mode = os.environ.get("FAKE_NCU_MODE", "ok")
    plan = json.load(open(args[args.index("--plan") + 1]))
    manifest = {{"hashes": json.loads(os.environ.get("FAKE_NCU_HASHES", "{{}}")),
                "targets": {{str(t["index"]): {{"status": "profiled"}} for t in plan["targets"]}}}}
    if mode == "driver-error":
        manifest["targets"]["1"] = {{"error": "the profiled call failed: RuntimeError: out of memory"}}
    json.dump(manifest, open(args[args.index("--manifest") + 1], "w"))
    if mode == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
        sys.exit(0)
    if mode == "crash":
        print("Traceback (most recent call last):\\nRuntimeError: CUDA error: no kernel image", file=sys.stderr)
        sys.exit(1)
    if mode == "hang":
        time.sleep(60)
    sys.stdout.write(open({raw!r}).read())
''')


@pytest.fixture
def fake_ncu(tmp_path):
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU.format(python=sys.executable, raw=str(FIXTURES / "ncu" / "raw_page.csv")),
                    encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _profile_three(fake_ncu, monkeypatch, mode="ok", hashes=None, timeout_s=prof.DEFAULT_TIMEOUT_S):
    """Profile a 3-point experiment (subject only: calls 0, 1, 2 match the fixture's three ranges)."""
    experiment = _sweep(cases=3)
    record = _record(experiment)
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    monkeypatch.setenv("FAKE_NCU_HASHES", json.dumps(hashes if hashes is not None else record.hashes))
    request = prof.ProfilingRequest(profiles=("subject",), ncu=fake_ncu, timeout_s=timeout_s)
    return record, prof.profile_record(experiment, record, request, device="cuda", root=REPO_ROOT)


def test_profiled_facts_land_on_their_points_and_the_run_says_how(fake_ncu, monkeypatch, tmp_path):
    record, profiled = _profile_three(fake_ncu, monkeypatch)
    block = profiled.profiling
    assert block["error"] is None and block["ncu_version"] == "2025.3.1.0 (build 0) (public-release)"
    assert block["command"][0] == fake_ncu and "--clock-control" in block["command"]
    assert block["calls"] == 3 and block["kernels"] == 5 and block["unattributed_kernels"] == 1
    assert block["metrics"] == list(ncu.METRICS) and block["warmup_calls"] == prof.WARMUP_CALLS
    assert any("unmodified GPU clocks" in m for m in block["messages"])
    facts = [p.results["subject"].profiling for p in profiled.points]
    assert [len(f["kernels"]) for f in facts] == [1, 1, 3]
    assert facts[1]["kernels"][0]["name"].startswith("nvjet_sm90")
    assert facts[0]["totals"]["duration_ns"] == 11072
    assert all(p.results[n].profiling is None for p in profiled.points for n in ("base", "other"))
    assert [p.results["subject"].samples_ms for p in profiled.points] == \
        [p.results["subject"].samples_ms for p in record.points], "the timings are the timed run's"
    path = write_record(profiled, tmp_path / "records")
    assert load_record(path) == profiled


@pytest.mark.parametrize("mode, message", [
    ("perm", "ERR_NVGPUCTRPERM"),
    ("crash", "ncu exited with status 1:\nTraceback (most recent call last):\nRuntimeError: CUDA error"),
])
def test_when_ncu_cannot_profile_the_record_says_so_and_keeps_its_timings(fake_ncu, monkeypatch, mode, message):
    record, profiled = _profile_three(fake_ncu, monkeypatch, mode)
    assert message in profiled.profiling["error"]
    assert profiled.profiling["command"][0] == fake_ncu
    assert profiled.points == record.points


def test_a_hanging_profiler_is_stopped_at_its_limit(fake_ncu, monkeypatch):
    record, profiled = _profile_three(fake_ncu, monkeypatch, "hang", timeout_s=2)
    assert "ncu did not finish within 2 s" in profiled.profiling["error"]
    assert profiled.points == record.points


def test_changed_sources_between_timing_and_profiling_are_refused(fake_ncu, monkeypatch):
    _, profiled = _profile_three(fake_ncu, monkeypatch, hashes={"kernels/k.py": "b" * 64})
    assert "source files changed between the timed run and profiling (kernels/k.py)" in profiled.profiling["error"]


def test_a_call_the_driver_could_not_make_carries_its_error(fake_ncu, monkeypatch):
    _, profiled = _profile_three(fake_ncu, monkeypatch, "driver-error")
    facts = [p.results["subject"].profiling for p in profiled.points]
    assert facts[1] == {"error": "the profiled call failed: RuntimeError: out of memory"}
    assert len(facts[0]["kernels"]) == 1 and len(facts[2]["kernels"]) == 3


def test_a_run_without_ncu_still_writes_its_record(tmp_path):
    from test_lab_runner import tiny_experiment

    experiment = tiny_experiment()
    messages = []
    record, path = run_experiment(experiment, device=DEVICE, records_dir=tmp_path, params=FEW, progress=False,
                                  profiling=prof.ProfilingRequest(ncu=str(tmp_path / "absent-ncu")),
                                  say=messages.append)
    loaded = load_record(path)
    assert loaded == record and "was not found" in loaded.profiling["error"]
    assert loaded.points[0].results["kernel"].status == "ok" and len(loaded.points[0].results["kernel"].samples_ms) == 3
    assert loaded.profiling["selection"]["profiles"] == ["torch", "kernel"]
    assert any("profiling gave no data" in m for m in messages)


# ---- the driver -----------------------------------------------------------------------------------------------


class RecordingHooks:
    def __init__(self, events):
        self.events = events

    def start(self):
        self.events.append("start")

    def stop(self):
        self.events.append("stop")

    def push(self, name):
        self.events.append(f"push {name}")

    def pop(self):
        self.events.append("pop")

    def synchronize(self):
        self.events.append("sync")


def test_the_driver_warms_up_outside_the_range_and_calls_once_inside(monkeypatch):
    events, seen = [], []

    def recorder(name):
        def run(x):
            events.append(f"call {name}")
            seen.append((name, x.clone()))
            if name == "base" and len([e for e in events if e == "call base"]) == 3:
                raise RuntimeError("fails inside its range")
            return torch.softmax(x, -1)
        return run

    experiment = _sweep(cases=2, others=())
    experiment = replace(experiment, profiles=tuple(replace(p, run=recorder(p.name)) for p in experiment.profiles))
    plan = {"warmup_calls": 2, "targets": [
        {"index": i, "range": f"kernel-lab-point-{i}", "case": case, "dtype": "float32", "profile": name, "seed": seed}
        for i, (case, name, seed) in enumerate([("c0", "subject", 7), ("c0", "base", 7), ("c1", "subject", 8)])]}
    outcomes = {}
    run_plan(experiment, plan, device=DEVICE, hooks=RecordingHooks(events),
             report=lambda index, outcome: outcomes.__setitem__(index, outcome))
    assert outcomes == {"0": {"status": "profiled"}, "2": {"status": "profiled"},
                        "1": {"error": "the profiled call failed: RuntimeError: fails inside its range"}}
    assert events == [
        "call subject", "call subject", "sync", "start", "push kernel-lab-point-0", "call subject", "sync", "pop",
        "stop",
        "call base", "call base", "sync", "start", "push kernel-lab-point-1", "call base", "pop", "stop",
        "call subject", "call subject", "sync", "start", "push kernel-lab-point-2", "call subject", "sync", "pop",
        "stop",
    ], "two warm-up calls outside, one call inside each range; a failing call still closes its range"
    expected = draw_inputs(experiment, experiment.cases[0], torch.float32, DEVICE, 7)["x"]
    assert all(torch.equal(x, expected) for name, x in seen[:6]), "inputs are the runner's, from the recorded seed"
    assert not torch.equal(seen[-1][1], expected), "another point, another seed"


def test_the_driver_keeps_going_when_a_points_inputs_fail():
    experiment = _sweep(cases=2, others=())
    plan = {"targets": [{"index": 0, "range": "kernel-lab-point-0", "case": "missing", "dtype": "float32",
                         "profile": "subject", "seed": 1},
                        {"index": 1, "range": "kernel-lab-point-1", "case": "c1", "dtype": "float32",
                         "profile": "subject", "seed": 2}]}
    outcomes = {}
    run_plan(experiment, plan, device=DEVICE, hooks=RecordingHooks([]),
             report=lambda index, outcome: outcomes.__setitem__(index, outcome))
    assert outcomes["0"]["error"].startswith("inputs failed: KeyError")
    assert outcomes["1"] == {"status": "profiled"}


# ---- the record's schema ----------------------------------------------------------------------------------------


def _profiled_json():
    experiment = _sweep(cases=3)
    record = _record(experiment)
    rows, units = ncu.read_raw_csv(RAW_PAGE)
    targets = prof.select_targets(experiment, record, prof.ProfilingRequest(profiles=("subject",)))
    kernels, unattributed = ncu.attribute(rows, units, targets)
    block = {"tool": prof.TOOL, "error": None, "ncu_version": "2025.3.1.0", "command": ["ncu"],
             "metrics": list(ncu.METRICS), "calls": 3, "kernels": 5, "unattributed_kernels": unattributed}
    return json.loads(prof.attach(record, targets, kernels, {}, block).to_json())


def test_records_written_before_profiling_existed_still_load():
    old = next((FIXTURES / "records" / "fixture-single").glob("*gpu-a-a1a1a1.json"))
    assert "profiling" not in json.loads(old.read_text(encoding="utf-8"))
    record = load_record(old)
    assert record.profiling is None and all(r.profiling is None for p in record.points for r in p.results.values())


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["profiling"].update(error=7), r"record.profiling.error: expected a string"),
    (lambda d: d["profiling"].update(command="ncu --csv"), r"record.profiling.command: expected a list"),
    (lambda d: d["profiling"].pop("kernels"), r"record.profiling: missing field 'kernels'"),
    (lambda d: d.update(profiling=[]), r"record.profiling: expected an object"),
    (lambda d: d["points"][0]["results"]["subject"]["profiling"]["kernels"][0]["metrics"]
     ["gpu__time_duration.sum"].update(value="11,072"), r"kernels\[0\]\.metrics\['gpu__time_duration.sum'\]\.value"),
    (lambda d: d["points"][0]["results"]["subject"]["profiling"]["totals"].update(dram_gbps=float("inf")),
     r"totals.dram_gbps: expected a finite number"),
    (lambda d: d["points"][0]["results"]["subject"]["profiling"].update(error="x"), "both an error and kernels"),
    (lambda d: d["points"][0]["results"]["subject"].update(profiling="fast"), r"results\['subject'\].profiling"),
])
def test_profiling_fields_are_validated_and_named(mutate, message):
    data = _profiled_json()
    assert RunRecord.from_dict(json.loads(json.dumps(data))).profiling["kernels"] == 5
    mutate(data)
    with pytest.raises(RecordError, match=message):
        RunRecord.from_dict(data)


def test_an_error_block_needs_no_data_fields():
    data = _profiled_json()
    data["profiling"] = {"tool": prof.TOOL, "error": "ncu exited with status 1", "command": [], "ncu_version": None}
    assert RunRecord.from_dict(data).profiling["error"] == "ncu exited with status 1"


# ---- the command line ------------------------------------------------------------------------------------------


def _build_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_results", REPO_ROOT / "tools" / "build_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("args, message", [
    (["--profile-points", "3"], "--profile-points only apply with --with-profiling"),
    (["--with-profiling", "--profile-points", "-1", "softmax-row-fusion"], "--profile-points -1: expected 0"),
    (["--with-profiling", "--profile-profiles", "nope", "softmax-row-fusion"],
     "--profile-profiles: nope is not a profile of the selected experiments"),
    (["--with-profiling", "--render-only"], "--render-only and --list run nothing"),
])
def test_profiling_options_are_checked_before_anything_runs(tmp_path, capsys, args, message):
    code = _build_results().main([*args, "--records-dir", str(tmp_path / "r"), "--docs-dir", str(tmp_path / "d")])
    assert code == 2 and message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r") and not os.path.exists(tmp_path / "d")


# ---- the experiment page -------------------------------------------------------------------------------------------

NEWEST_B = "20260310T000000Z-nvidia-test-gpu-b-b3b3b3"


def _page(tmp_path, block=None, experiments=None):
    """fixture-single's page, from the fixture records plus a newer GPU B run profiled from the raw page
    fixture (or carrying `block` as a failed attempt)."""
    records = tmp_path / "records"
    shutil.copytree(FIXTURES / "records" / "fixture-single", records / "fixture-single")
    older = load_record(records / "fixture-single" / "20260302T090000Z-nvidia-test-gpu-b-b2b2b2.json")
    run = replace(older, run_id=NEWEST_B, started_utc="2026-03-10T00:00:00Z", finished_utc="2026-03-10T00:01:00Z")
    experiments = experiments or fx.EXPERIMENTS
    if block is None:
        rows, units = ncu.read_raw_csv(RAW_PAGE)
        targets = prof.select_targets(experiments["fixture-single"], run, prof.ProfilingRequest())
        kernels, unattributed = ncu.attribute(rows, units, targets)
        block = {"tool": prof.TOOL, "error": None, "ncu_version": "2025.3.1.0", "calls": len(targets),
                 "command": ["ncu", "--clock-control", "none", "--metrics", "a|b"], "metrics": list(ncu.METRICS),
                 "kernels": sum(map(len, kernels.values())), "unattributed_kernels": unattributed, "warmup_calls": 2,
                 "selection": {"rule": "the claim's subject and baselines",
                               "points": [{"case": "fx-4096x1024", "dtype": d} for d in ("float16", "float32")]}}
        run = prof.attach(run, targets, kernels, {}, block)
    else:
        run = replace(run, profiling=block)
    write_record(run, records)
    evidence = collect_evidence(experiments, fx.DECISIONS, records, fx.CURRENT_HASHES)
    return render_outputs(evidence)["experiments/fixture-single.md"]


def test_the_page_shows_the_profiled_facts_of_the_newest_run(tmp_path):
    page = _page(tmp_path)
    assert page.count("Profiled (Nsight Compute)") == 1
    section = page.split("#### NVIDIA Test GPU B · Profiled (Nsight Compute)")[1].split("\n### ")[0]
    assert "Nsight Compute 2025.3.1.0 profiled 5 kernels in 4 calls at 2 points: the claim's " \
           "subject and baselines. Each row is one call, made after 2 unprofiled warm-up calls" in section
    assert "1 kernel named no profiled call and is left out.\n\n**float16**\n\n| Case |" in section
    # range 0 (float16, torch-baseline): one kernel of 11,072 ns, 8,416,000 + 256 DRAM bytes, 15.82 %, 48 registers
    assert ("| fx-4096x1024 | `torch-baseline` | 1: `softmax_warp_forward` | 11.1 | 8.0 MiB + 256 B | 760 | 16% "
            "| 48 | 0 B |") in section
    assert "| fx-4096x1024 | `subject-kernel` | 1: `nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT` | 25.3 |" in section
    assert ("| fx-4096x1024 | `torch-baseline` | 3: `unrolled_elementwise_kernel`, `softmax_warp_forward`, "
            "`vectorized_elementwise_kernel` | 32.2 |") in section
    assert "| 32 / 48 |" in section, "each kernel's registers per thread"
    assert "profiling failed: ncu recorded no kernel inside the range kernel-lab-point-3" in section
    assert section.index("**float16**") < section.index("**float32**")
    assert "Tensor pipe %" not in section, "no FLOP model, no tensor-pipe column"
    assert "not the timing evidence above" in section and "profiler's own" in section
    assert "`ncu --clock-control none --metrics 'a\\|b'`" in section
    gpu_a = page.split("### NVIDIA Test GPU A")[1].split("### NVIDIA Test GPU B")[0]
    assert "Profiled" not in gpu_a, "a run without profiling shows nothing new"


def test_experiments_with_a_flop_model_show_the_tensor_pipe(tmp_path):
    experiments = {**fx.EXPERIMENTS, "fixture-single": replace(fx.SINGLE, flops=lambda case, dtype: 1)}
    page = _page(tmp_path, experiments=experiments)
    assert "| Local spill | Tensor pipe % |" in page
    assert "| 168 | 0 B | 83% |" in page, "the GEMM kernel's tensor-pipe share (82.75 %)"


def test_a_failed_attempt_says_why_it_has_no_data(tmp_path):
    error = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    page = _page(tmp_path, block=prof.failed(error, command=["ncu"], ncu_version="2025.3.1.0"))
    section = page.split("#### NVIDIA Test GPU B · Profiled (Nsight Compute)")[1]
    assert "Profiling under Nsight Compute 2025.3.1.0 was attempted in this run and gave no data" in section
    assert f"```text\n{error}\n```" in section
    assert "| Case | Profile | Kernels |" not in section
