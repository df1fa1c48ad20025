"""View model of an experiment page's "Profiled (Nsight Compute)" section: per dtype, each profiled call's
kernels, duration under the profiler, DRAM traffic, registers, spills and tensor-pipe use, or why the profiler
gave no data.

A GPU's profile and roofline come from the run judged on that GPU (its newest) when that run was profiled.
When it was not, they come from the newest earlier run of the same experiment on the same GPU key whose
profiling gave data (`profiled_run`), and the page says which run that is, that it is older than the run
judged, and which hashed sources differ between the two (`profiled_from`).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from experiments.spec import Experiment
from lab.evidence.hashing import changed_sources
from lab.evidence.records import Point, RunRecord
from lab.publish import formatting as fmt
from lab.publish.collect import dtypes_in, profile_names
from lab.publish.escape import Md, code, compose
from lab.publish.formatting import reader_command
from lab.publish.overview import run_ref


def _kernel_names(kernels: Sequence[Mapping]) -> Md:
    """"2: `a`, `b`" for a call's kernels in launch order, a repeated name once with its count."""
    counts = dict.fromkeys(k["name"] for k in kernels)
    counts = {name: sum(k["name"] == name for k in kernels) for name in counts}
    names = Md(", ").join(code(n) + (f" ×{c}" if c > 1 else "") for n, c in counts.items())
    return compose("{}: {}", len(kernels), names)


def _registers(kernels: Sequence[Mapping]) -> str:
    values = [k["metrics"].get("launch__registers_per_thread", {}).get("value") for k in kernels]
    shown = [f"{v:.0f}" for v in dict.fromkeys(values) if v is not None]
    return " / ".join(shown) or fmt.DASH


def _bytes(value: float | None) -> str:
    return fmt.size_bytes(None if value is None else int(round(value)))


def _profiled_row(point: Point, name: str, facts: Mapping) -> dict:
    if "error" in facts:
        return {"case": point.case, "profile": name, "error": facts["error"]}
    totals = facts["totals"]
    duration = totals.get("duration_ns")
    return {
        "case": point.case,
        "profile": name,
        "error": None,
        "kernels": _kernel_names(facts["kernels"]),
        "duration": fmt.latency_us(None if duration is None else duration * 1e-6),
        "dram": f"{_bytes(totals.get('dram_read_bytes'))} + {_bytes(totals.get('dram_write_bytes'))}",
        "dram_gbps": fmt.gbps(totals.get("dram_gbps")),
        "dram_pct": fmt.percent(totals.get("dram_pct_of_peak")),
        "registers": _registers(facts["kernels"]),
        "spill": _bytes(totals.get("local_spill_bytes")),
        "tensor": fmt.percent(totals.get("tensor_pct_of_peak")),
    }


def profiled_facts(experiment: Experiment, run: RunRecord) -> dict | None:
    """The run's Nsight Compute facts, one table per dtype, or why the profiler gave none (None: not profiled).

    Rows follow the record's point order and the experiment's profile order; the tensor-pipe column is
    shown for experiments that declare arithmetic (a FLOP model), whose kernels may use the tensor cores.
    """
    block = run.profiling
    if block is None:
        return None
    context = {
        "version": f" {block['ncu_version']}" if block.get("ncu_version") else "",
        "command": reader_command(block.get("command") or []),
        "error": block.get("error"),
    }
    if context["error"]:
        return context
    tables = []
    for dtype in dtypes_in(run):
        rows = []
        for point in (p for p in run.points if p.dtype == dtype):
            for name in profile_names(experiment, [point]):
                facts = point.results[name].profiling
                if facts is not None:
                    rows.append(_profiled_row(point, name, facts))
        if rows:
            tables.append({"dtype": dtype, "rows": rows, "tensor": experiment.flops is not None})
    selection = block.get("selection") or {}
    return {
        **context,
        "tables": tables,
        "kernels": block.get("kernels"),
        "calls": block.get("calls"),
        "points": len(selection.get("points") or []),
        "rule": selection.get("rule") or fmt.DASH,
        "warmups": block.get("warmup_calls"),
        "unattributed": block.get("unattributed_kernels") or 0,
    }


def _stamp(run: RunRecord) -> tuple[str, str]:
    return (run.started_utc, run.run_id)


def profiled_run(runs: Iterable[RunRecord], judged: RunRecord) -> RunRecord:
    """The run whose profile and roofline a GPU's section shows: `judged` when it was profiled (a failed
    attempt included, which the page reports); else the newest earlier run in `runs` of the same experiment
    on the same GPU key whose profiling gave data (no error); else `judged`, which shows none."""
    if judged.profiling is not None:
        return judged
    earlier = [r for r in runs
               if r.experiment == judged.experiment and r.gpu_key == judged.gpu_key and _stamp(r) < _stamp(judged)
               and r.profiling is not None and not r.profiling.get("error")]
    return max(earlier, key=_stamp, default=judged)


def profiled_from(source: RunRecord, judged: RunRecord, gpu_label: str) -> dict | None:
    """Which older run the profile comes from, for the page to say so (None: it is the judged run's own).

    `changed` names the sources hashed differently in the two runs (a file only one of them hashed
    included): when there are any, the profiled code is not the code judged."""
    if source is judged:
        return None
    return {
        **run_ref(source, gpu_label),
        "started": source.started_utc,
        "judged": run_ref(judged, gpu_label),
        "changed": changed_sources(source.hashes, judged.hashes),
    }
