"""View model of an experiment page's "Profiled (Nsight Compute)" section: per dtype, each profiled call's
kernels, duration under the profiler, DRAM traffic, registers, spills and tensor-pipe use, or why the profiler
gave no data."""

from __future__ import annotations

from typing import Mapping, Sequence

from experiments.spec import Experiment
from lab.evidence.records import Point, RunRecord
from lab.publish import formatting as fmt
from lab.publish.collect import dtypes_in, profile_names
from lab.publish.escape import Md, code, compose
from lab.publish.formatting import reader_command


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
