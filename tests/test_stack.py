"""The GPU stack ./dev.sh installs (requirements/gpu.lock) is the one the newest records were measured on."""

from __future__ import annotations

import re
from pathlib import Path

from lab.evidence.store import load_records

ROOT = Path(__file__).resolve().parents[1]


def _pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        found = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if found:
            pins[found.group(1).lower()] = found.group(2)
    return pins


def test_gpu_lock_pins_the_stack_of_the_newest_gpu_records():
    pins = _pins(ROOT / "requirements" / "gpu.lock")
    runs, _ = load_records(ROOT / "records")
    newest = {}
    for run in runs:
        if run.is_performance_evidence:
            key = (run.experiment, run.gpu_key)
            if key not in newest or run.started_utc > newest[key].started_utc:
                newest[key] = run
    assert newest, "no GPU record to compare the lock with"
    stacks = {(r.environment.get("torch"), r.environment.get("triton")) for r in newest.values()}
    assert (pins["torch"], pins["triton"]) in stacks, (
        f"requirements/gpu.lock pins torch {pins['torch']}, Triton {pins['triton']}; the newest records were "
        f"measured on {sorted(stacks)}")


def test_gpu_lock_differs_from_the_cpu_lock_only_in_the_gpu_build_of_torch():
    gpu, cpu = _pins(ROOT / "requirements" / "gpu.lock"), _pins(ROOT / "requirements" / "cpu.lock")
    assert gpu["torch"].endswith("+cu130") and gpu["triton"] == cpu["triton"]
    assert {k: v for k, v in gpu.items() if k != "torch"} == {k: v for k, v in cpu.items() if k != "torch"}
