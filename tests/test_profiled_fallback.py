"""A GPU whose newest run was made without the profiler keeps a profile on its page: the Nsight Compute
section and the roofline come from the newest earlier run of the experiment on that GPU whose profiling gave
data, and the page names that run, says it is older than the run judged and whether its code differs.

The records are the fixture's (tests/fixtures/lab/records/fixture-single) plus runs written here: GPU B's
newest valid run there, b2b2b2, was not profiled.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
sys.path.insert(0, str(FIXTURES))

import lab_fixture_experiments as fx  # noqa: E402

from lab import REPO_ROOT  # noqa: E402
from lab.evidence.records import RunRecord  # noqa: E402
from lab.evidence.store import load_record, write_record  # noqa: E402
from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.profiled import profiled_from, profiled_run  # noqa: E402
from lab.publish.render import render_outputs  # noqa: E402
from lab.publish.roofline import roofline_filename  # noqa: E402

SLUG = "fixture-single"
GPU_B = "nvidia-test-gpu-b"
JUDGED_B = "20260302T090000Z-nvidia-test-gpu-b-b2b2b2"  # GPU B's newest valid run, not profiled
OLDER = "20260301T120000Z-nvidia-test-gpu-b-d1d1d1"
ROOFLINE_PLOT = f"assets/plots/{roofline_filename(SLUG, GPU_B)}"


def _facts(kernel: str, duration_ns: float) -> dict:
    return {"kernels": [{"id": 1, "name": kernel,
                         "metrics": {"gpu__time_duration.sum": {"value": duration_ns, "unit": "ns"},
                                     "launch__registers_per_thread": {"value": 40.0, "unit": "register/thread"}}}],
            "totals": {"duration_ns": duration_ns, "dram_read_bytes": 8e6, "dram_write_bytes": 8e6,
                       "dram_bytes": 1.6e7, "dram_gbps": 1.6e7 / duration_ns, "dram_pct_of_peak": 40.0,
                       "local_spill_bytes": 0.0, "fp_flops": 4e7}}


def _profiled(run: RunRecord, run_id: str, started: str, *, kernel: str = "older_kernel", error: str | None = None,
              commit: str = "feedfacefeedfacefeedfacefeedfacefeedface", hashes: dict | None = None,
              version: str = "2025.3.1.0") -> RunRecord:
    """`run` made again as `run_id` at `started`, with the profiler: every result profiled as one `kernel`
    (or the attempt failed with `error`)."""
    if error is not None:
        block = {"tool": "ncu", "error": error, "command": ["ncu"], "ncu_version": version}
        points = run.points
    else:
        block = {"tool": "ncu", "error": None, "ncu_version": version, "command": ["ncu", "--csv"],
                 "metrics": ["gpu__time_duration.sum"], "calls": 6, "kernels": 6, "unattributed_kernels": 0,
                 "warmup_calls": 2, "selection": {"rule": "every profile", "points": [
                     {"case": p.case, "dtype": p.dtype} for p in run.points]}}
        points = tuple(replace(p, results={n: replace(r, profiling=_facts(kernel, 10_000.0 + i))
                                           for i, (n, r) in enumerate(p.results.items())})
                       for p in run.points)
    return replace(run, run_id=run_id, started_utc=started, finished_utc=started, profiling=block, points=points,
                   git={"commit": commit, "dirty": False}, hashes=dict(run.hashes if hashes is None else hashes))


def _records(tmp_path: Path, *extra) -> Path:
    """The fixture's records of fixture-single, plus `extra(judged B run)` for each builder given."""
    records = tmp_path / "records"
    shutil.copytree(FIXTURES / "records" / SLUG, records / SLUG)
    judged = load_record(records / SLUG / f"{JUDGED_B}.json")
    for build in extra:
        write_record(build(judged), records)
    return records


def _render(records: Path) -> dict[str, str]:
    return render_outputs(collect_evidence(fx.EXPERIMENTS, fx.DECISIONS, records, fx.CURRENT_HASHES))


def _section(page: str, gpu: str) -> str:
    return page.split(f"\n### NVIDIA Test GPU {gpu} {{ #gpu-nvidia-test-gpu-{gpu.lower()} }}\n")[1].split("\n### ")[0].split("\n## ")[0]


def _older(**fields):
    return lambda judged: _profiled(judged, OLDER, "2026-03-01T12:00:00Z", **fields)


# ---- which run --------------------------------------------------------------------------------------------------


def test_the_newest_earlier_run_with_data_on_the_same_gpu_is_chosen(tmp_path):
    judged = load_record(FIXTURES / "records" / SLUG / f"{JUDGED_B}.json")
    older = _profiled(judged, OLDER, "2026-03-01T12:00:00Z")
    oldest = _profiled(judged, "20260201T000000Z-nvidia-test-gpu-b-e1e1e1", "2026-02-01T00:00:00Z")
    failed = _profiled(judged, "20260302T000000Z-nvidia-test-gpu-b-f1f1f1", "2026-03-02T00:00:00Z", error="no")
    other_gpu = replace(_profiled(judged, "20260302T010000Z-nvidia-test-gpu-a-a9a9a9", "2026-03-02T01:00:00Z"),
                        environment={**judged.environment, "gpu_key": "nvidia-test-gpu-a"})
    other_experiment = replace(_profiled(judged, "20260302T020000Z-nvidia-test-gpu-b-b9b9b9",
                                         "2026-03-02T02:00:00Z"), experiment="fixture-sweep")
    newer = _profiled(judged, "20260401T000000Z-nvidia-test-gpu-b-c9c9c9", "2026-04-01T00:00:00Z")
    runs = [oldest, judged, failed, other_gpu, other_experiment, older, newer]
    assert profiled_run(runs, judged) is older, "the newest earlier one with data, on this GPU, of this experiment"
    assert profiled_run([judged, failed], judged) is judged, "a failed attempt is never shown in its place"
    assert profiled_run(runs, failed) is failed, "a profiled judged run is shown as it is, even a failed one"
    assert profiled_run(runs, newer) is newer
    assert profiled_from(newer, newer, "GPU B") is None
    said = profiled_from(older, judged, "GPU B")
    assert said["run_id"] == OLDER and said["commit"] == "feedfacefe" and said["changed"] == []
    assert said["judged"]["run_id"] == JUDGED_B and said["link"] == f"../records/{SLUG}/{OLDER}.json"


# ---- the page -----------------------------------------------------------------------------------------------------


def test_an_unprofiled_newest_run_shows_the_older_runs_profile_and_names_it(tmp_path):
    changed = {"fixture/kernel.py": "9" * 64, "fixture/single.py": "2" * 64}
    out = _render(_records(tmp_path, _older(hashes=changed)))
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert "#### NVIDIA Test GPU B · roofline" in section and "#### NVIDIA Test GPU B · Profiled (Nsight Compute)" \
        in section
    note = section.split('!!! note "Profiled in an older run"\n')[1].split("\n\n")[0]
    assert note.startswith(f"    The run judged above, [`b2b2b2`](../records/{SLUG}/{JUDGED_B}.json), was made "
                           "without the profiler. The roofline and the Nsight Compute figures for this GPU come from")
    assert f"[`d1d1d1`](../records/{SLUG}/{OLDER}.json.gz) (`{OLDER}`), started 2026-03-01T12:00:00Z at commit " \
           "`feedfacefe`" in note
    assert "older than the run judged above" in note
    history = out[f"experiments/{SLUG}.md"].split("## History")[1].split("## Results")[0]
    assert f"[`d1d1d1`](../records/{SLUG}/{OLDER}.json.gz)" in history, \
        "the run the profile comes from is served with the site, and its history row links it"
    assert "**The profiled code differs from the judged run's code:** `fixture/kernel.py` hashed differently" in note
    assert "`fixture/single.py`" not in note
    # The roofline's roofs are that run's: "measured in that run".
    assert "measured in that run; that run measured no matmul peak" in section
    assert "| `subject-kernel` | fx-4096x1024 | float16 |" in section
    profiled = section.split("· Profiled (Nsight Compute)\n")[1]
    assert profiled.startswith(f"\nFrom the same older run as the roofline above, [`d1d1d1`](../records/{SLUG}/"
                               f"{OLDER}.json.gz) at commit `feedfacefe`, not the run judged above.\n")
    assert "| fx-4096x1024 | `torch-baseline` | 1: `older_kernel` |" in profiled
    assert "Profiled" not in _section(out[f"experiments/{SLUG}.md"], "A"), "GPU A has no profiled run"
    assert out[ROOFLINE_PLOT].lstrip().startswith("<?xml") and "older run d1d1d1" in out[ROOFLINE_PLOT]


def test_the_same_code_is_said_to_be_the_same(tmp_path):
    section = _section(_render(_records(tmp_path, _older()))[f"experiments/{SLUG}.md"], "B")
    assert "The profiled code is the judged run's code: every source file hashed into the two runs is the same." \
        in section
    assert "differs" not in section


def test_without_a_roofline_the_note_stands_in_the_profiled_section(tmp_path):
    def no_flops(judged):
        run = _older()(judged)
        return replace(run, points=tuple(replace(p, results={n: replace(r, profiling={
            **r.profiling, "totals": {k: v for k, v in r.profiling["totals"].items() if k != "fp_flops"}})
            for n, r in p.results.items()}) for p in run.points))

    out = _render(_records(tmp_path, no_flops))
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert "· roofline" not in section and ROOFLINE_PLOT not in out
    profiled = section.split("· Profiled (Nsight Compute)\n")[1]
    assert profiled.startswith('\n!!! note "Profiled in an older run"\n')
    assert "The Nsight Compute figures for this GPU come from" in profiled and "same older run" not in profiled


def test_a_failed_newer_attempt_is_passed_over_for_the_run_with_data(tmp_path):
    failed = "20260302T000000Z-nvidia-test-gpu-b-f1f1f1"
    out = _render(_records(tmp_path, _older(),
                           lambda j: _profiled(j, failed, "2026-03-02T00:00:00Z", error="ERR_NVGPUCTRPERM")))
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert f"[`d1d1d1`](../records/{SLUG}/{OLDER}.json.gz)" in section
    assert "ERR_NVGPUCTRPERM" not in section and "f1f1f1" not in section


def test_only_failed_attempts_on_record_show_nothing_new(tmp_path):
    out = _render(_records(tmp_path, _older(error="ERR_NVGPUCTRPERM")))
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert "Profiled" not in section and "roofline" not in section and ROOFLINE_PLOT not in out


def test_a_profiled_newest_run_shows_its_own_profile_as_before(tmp_path):
    newest = "20260310T000000Z-nvidia-test-gpu-b-a0a0a0"
    with_older = _records(tmp_path / "1", _older(),
                          lambda j: _profiled(j, newest, "2026-03-10T00:00:00Z", kernel="newest_kernel"))
    out = _render(with_older)
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert "older run" not in section and "d1d1d1" not in section and "older_kernel" not in section
    assert "measured in this run; this run measured no matmul peak" in section
    assert "| fx-4096x1024 | `torch-baseline` | 1: `newest_kernel` |" in section
    assert "older run" not in out[ROOFLINE_PLOT]
    # The same page as without the older profiled run, but for the history's row of it.
    alone = _render(_records(tmp_path / "2", lambda j: _profiled(j, newest, "2026-03-10T00:00:00Z",
                                                                   kernel="newest_kernel")))
    assert _section(alone[f"experiments/{SLUG}.md"], "B") == section
    assert alone[ROOFLINE_PLOT] == out[ROOFLINE_PLOT]


def test_a_failed_newest_attempt_still_says_why_and_borrows_nothing(tmp_path):
    newest = "20260310T000000Z-nvidia-test-gpu-b-a0a0a0"
    out = _render(_records(tmp_path, _older(),
                           lambda j: _profiled(j, newest, "2026-03-10T00:00:00Z", error="ERR_NVGPUCTRPERM")))
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert "was attempted in this run and gave no data" in section and "ERR_NVGPUCTRPERM" in section
    assert "d1d1d1" not in section and ROOFLINE_PLOT not in out


# ---- hostile text in the older run --------------------------------------------------------------------------------

COMMIT = "<i>`|</i>*[x](javascript:alert(1))"  # the page shows its first ten characters
KERNEL = "k`<img src=x onerror=alert(3)>|[x](javascript:alert(4))"
VERSION = "<script>alert(5)</script> [y](javascript:alert(6))"


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.targets, self.events, self.text = [], set(), [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.targets |= {v or "" for k, v in attrs if k in ("href", "src")}
        self.events += [k for k, _ in attrs if k.lower().startswith("on")]

    def handle_data(self, data):
        self.text.append(data)


def _html(markdown_text: str) -> _Tags:
    """The Markdown as the site converts it (mkdocs.yml's extensions and their settings), parsed."""
    import markdown
    from mkdocs.config import load_config

    config = load_config(str(REPO_ROOT / "mkdocs.yml"))
    found = _Tags()
    found.feed(markdown.Markdown(extensions=config["markdown_extensions"],
                                 extension_configs=config["mdx_configs"]).convert(markdown_text))
    return found


def test_hostile_text_of_the_older_run_is_shown_and_does_nothing(tmp_path):
    out = _render(_records(tmp_path, _older(commit=COMMIT, kernel=KERNEL, version=VERSION)))
    section = _section(out[f"experiments/{SLUG}.md"], "B")
    assert "Profiled in an older run" in section
    assert "``" + COMMIT[:10] + "``" in section, "the short commit as a code span, fenced past its backtick"
    found = _html(section)
    assert "script" not in found.tags and "i" not in found.tags and not found.events
    assert all(t.startswith(("#", f"../records/{SLUG}/", "../assets/plots/")) for t in found.targets), \
        "headings, records and plots: nothing a record made"
    assert {f"../records/{SLUG}/{JUDGED_B}.json", f"../records/{SLUG}/{OLDER}.json.gz", f"../{ROOFLINE_PLOT}"} \
        <= found.targets
    text = "".join(found.text).replace("\u200b", "")
    assert COMMIT[:10] in text and KERNEL in text and VERSION in text, "shown as they are"
