"""Helpers shared by the lab's tests: profiler trace events and a fake torch.profiler for the op-by-op
breakdown, fixture records given breakdowns, a reader for the Markdown tables of a rendered page, and a
Python run outside Triton's interpreter (to compile kernels for a GPU target without one; warm_python runs it)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from warm_python import run_python

FIXTURES = Path(__file__).parent / "fixtures" / "lab"


def annotation_event(name, ts, dur, tid=1):
    """A record_function annotation in a Chrome trace."""
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": tid}


def launch_event(correlation, ts, tid=1):
    """A kernel launch on the host, tied to its kernel by `correlation`."""
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "tid": tid,
            "args": {"correlation": correlation}}


def kernel_event(name, correlation, ts, dur):
    """A kernel on the GPU, tied to its launch by `correlation`."""
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7,
            "args": {"correlation": correlation}}


class FakeProfiler:
    """Stands in for torch.profiler on the CPU: `kernel` leaves a launch and a 5 us kernel in the trace;
    record_function leaves an annotation around what it wraps; `on` says whether a profiling session is open.

    `fresh_sessions`: each profiling session exports its own trace (else the sessions' events pile up in one).
    `kernel_spacing`: the kernels' start times grow by this many us per tick of the fake clock."""

    def __init__(self, fresh_sessions: bool = True, kernel_spacing: int = 10):
        self.fresh_sessions, self.kernel_spacing = fresh_sessions, kernel_spacing
        self.on, self.events, self.t = False, [], 0

    def install(self, monkeypatch) -> None:
        """Put this fake in torch.profiler's place, and make torch.cuda.synchronize a no-op."""
        import torch
        import torch.profiler

        monkeypatch.setattr(torch.profiler, "profile", self.profile)
        monkeypatch.setattr(torch.profiler, "record_function", self.record_function)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def profile(self, activities):
        fake = self

        class Context:
            def __enter__(self):
                fake.on = True
                if fake.fresh_sessions:
                    fake.events = []
                return self

            def __exit__(self, *exc):
                fake.on = False

            def export_chrome_trace(self, path):
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({"traceEvents": fake.events}, f)

        return Context()

    def record_function(self, name):
        fake = self

        class Annotation:
            def __enter__(self):
                self.start = fake.t
                fake.t += 1

            def __exit__(self, *exc):
                fake.events.append(annotation_event(name, self.start, fake.t - self.start))
                fake.t += 1

        return Annotation()

    def kernel(self, name):
        self.t += 1
        self.events += [launch_event(self.t, self.t),
                        kernel_event(name, self.t, 10_000 + self.kernel_spacing * self.t, 5)]
        self.t += 1


def records_with_breakdowns(tmp_path: Path, block_of: Callable[[float], dict]) -> Path:
    """A copy of the fixture-single records under `tmp_path`/records whose GPU B run gives each measured result
    the breakdown block `block_of(p50_ms)`."""
    records = tmp_path / "records"
    shutil.copytree(FIXTURES / "records" / "fixture-single", records / "fixture-single")
    path = records / "fixture-single" / "20260302T090000Z-nvidia-test-gpu-b-b2b2b2.json"
    data = json.loads(path.read_text())
    for point in data["points"]:
        for result in point["results"].values():
            if result["status"] == "ok":
                result["breakdown"] = block_of(result["p50_ms"])
    path.write_text(json.dumps(data))
    return records


def page_table(page: str, header_start: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header cells and the rows (by case) of the first table whose header begins `header_start`."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return header, rows


def run_compiled(args: list[str], triton_cache: Path) -> str:
    """Standard output of `python *args` outside Triton's interpreter, with a Triton cache of its own: the
    kernels it compiles are compiled for real, for whatever target the command names."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(triton_cache)
    return run_python(args, env=env, cwd=os.getcwd(), check=True, timeout=300).stdout
