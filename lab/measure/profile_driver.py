"""The program that Nsight Compute profiles: one profiled call per selected point and profile.

    ncu ... python -m lab.measure.profile_driver --plan plan.json --manifest manifest.json

lab.measure.profiling writes the plan (experiment slug, device, and each call: its NVTX range name, case, dtype,
profile and the input seed recorded by the timed run) and starts this module under ncu with
`--profile-from-start off`. For each point the inputs are drawn exactly as the runner drew them
(lab.measure.inputs.draw_inputs, same seed); then, per profile, `warmup_calls` calls run outside any profiled
range (they compile, autotune and fill the allocator's cache, and ncu does not profile them), and one call
runs between cudaProfilerStart and cudaProfilerStop inside the NVTX range named in the plan, synchronised
before the range closes. ncu attributes every kernel of that call to the range by name.

Nothing is printed on stdout, where ncu prints its CSV: this process's stdout is pointed at stderr before
anything else runs. The manifest (per call: profiled, or the error that stopped it; and the hashes of the
experiment's sources as imported here) is rewritten after every call, so a crash leaves what was done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from experiments.spec import Experiment
from lab.evidence.store import replace_text


class ProfilerHooks(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def push(self, name: str) -> None: ...
    def pop(self) -> None: ...
    def synchronize(self) -> None: ...


class CudaHooks:
    """cudaProfilerStart/Stop and NVTX push/pop through PyTorch."""

    def start(self) -> None:
        torch.cuda.profiler.start()

    def stop(self) -> None:
        torch.cuda.profiler.stop()

    def push(self, name: str) -> None:
        torch.cuda.nvtx.range_push(name)

    def pop(self) -> None:
        torch.cuda.nvtx.range_pop()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def _points(targets: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, int, list[Mapping[str, Any]]]]:
    """The plan's calls grouped by point (case, dtype, seed), in the plan's order."""
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for target in targets:
        groups.setdefault((target["case"], target["dtype"], int(target["seed"])), []).append(target)
    return [(case, dtype, seed, calls) for (case, dtype, seed), calls in groups.items()]


def run_plan(experiment: Experiment, plan: Mapping[str, Any], *, device: str, hooks: ProfilerHooks,
             report: Callable[[str, dict], None]) -> None:
    """Profile every call of `plan`: warm-up calls outside any range, then one call inside its range.

    `report(index, outcome)` receives {"status": "profiled"} or {"error": why} for each call; one call's
    failure (its inputs, its warm-up or its profiled call) is reported and the rest go on.
    """
    from lab.measure.inputs import draw_inputs
    from lab.measure.timing import describe_exception

    cases = {c.name: c for c in experiment.cases}
    warmups = int(plan.get("warmup_calls", 2))
    for case_name, dtype_name, seed, calls in _points(plan["targets"]):
        try:
            case = cases[case_name]
            inputs = draw_inputs(experiment, case, getattr(torch, dtype_name), device, seed)
        except Exception as exc:  # noqa: BLE001 - the point fails, the plan goes on
            for call in calls:
                report(str(call["index"]), {"error": f"inputs failed: {describe_exception(exc)}"})
            continue
        for call in calls:
            report(str(call["index"]), _profile_one(experiment, call, inputs, warmups, hooks))
        del inputs


def _profile_one(experiment: Experiment, call: Mapping[str, Any], inputs, warmups: int,
                 hooks: ProfilerHooks) -> dict:
    from lab.measure.timing import describe_exception

    try:
        run = experiment.profile(call["profile"]).run
        for _ in range(warmups):
            run(**inputs)
        hooks.synchronize()
    except Exception as exc:  # noqa: BLE001 - one call's failure is its own outcome
        return {"error": f"warm-up failed: {describe_exception(exc)}"}
    hooks.start()
    hooks.push(call["range"])
    try:
        run(**inputs)
        hooks.synchronize()
    except Exception as exc:  # noqa: BLE001
        return {"error": f"the profiled call failed: {describe_exception(exc)}"}
    finally:
        hooks.pop()
        hooks.stop()
    return {"status": "profiled"}


def _write_json(path: Path, data: Mapping) -> None:
    replace_text(path, json.dumps(data, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stdout belongs to ncu's CSV
    parser = argparse.ArgumentParser(prog="python -m lab.measure.profile_driver",
                                     description="The program profiled under Nsight Compute (see lab.measure.profiling).")
    parser.add_argument("--plan", type=Path, required=True, help="the plan written by lab.measure.profiling")
    parser.add_argument("--manifest", type=Path, required=True, help="where to write what was profiled")
    args = parser.parse_args(argv)

    from experiments import get_experiment
    from lab import REPO_ROOT
    from lab.evidence.hashing import source_hashes
    from lab.measure.runner import allow_a_compile_per_point, check_device

    plan = json.loads(args.plan.read_text(encoding="utf-8"))
    experiment = get_experiment(plan["experiment"])
    device = plan["device"]
    check_device(device)
    allow_a_compile_per_point(len(plan["targets"]))
    manifest: dict[str, Any] = {"hashes": source_hashes(experiment, REPO_ROOT), "targets": {}}
    _write_json(args.manifest, manifest)

    def report(index: str, outcome: dict) -> None:
        manifest["targets"][index] = outcome
        _write_json(args.manifest, manifest)

    run_plan(experiment, plan, device=device, hooks=CudaHooks(), report=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
