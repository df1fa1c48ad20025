"""A point's inputs and their check: the seed that fixes them, drawing them, the rows the accuracy check
covers and the relative error against the float64 reference; and the small helpers every measuring module
shares (dtype names, UTC stamps, run ids, JSON-ready plans).

The timed run (lab.measure.runner) and the profiler's process (lab.measure.profile_driver) both draw inputs
here, so a profiled call sees the very inputs its timed calls saw.
"""

from __future__ import annotations

import math
import secrets
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

import torch

from experiments.spec import Case, Experiment

# Outputs with more elements than this are checked on their first and last rows only (when the
# experiment names its row-wise inputs): 2^22 float64 elements are 32 MiB per tensor in the check.
CHECK_ELEMENT_BUDGET = 1 << 22


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def utc_text(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(gpu_key: str, started: datetime) -> str:
    """<UTC yyyymmddThhmmssZ>-<gpu-key>-<6 hex>: sorts by time, names the device, never repeats."""
    return f"{started.strftime('%Y%m%dT%H%M%SZ')}-{gpu_key}-{secrets.token_hex(3)}"


def input_seed(slug: str, case: Case, dtype: torch.dtype) -> int:
    """The seed of a point's inputs: fixed by experiment, case and dtype, so any run can redraw them."""
    return zlib.crc32(f"{slug}|{case.name}|{dtype_name(dtype)}".encode())


def draw_inputs(experiment: Experiment, case: Case, dtype: torch.dtype, device: str, seed: int):
    """A point's inputs, drawn from a CPU generator seeded with `seed`: the timed run and the profiler's
    process both draw them here, so a profiled call sees the very inputs its timed calls saw."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return experiment.make_inputs(case, dtype, device, gen)


def json_ready(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# --------------------------------------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowSelection:
    """The rows the accuracy check covers: all (index None) or the first and last `per_end` of `of`."""

    index: torch.Tensor | None
    per_end: int = 0
    of: int = 0

    def describe(self) -> dict | None:
        return None if self.index is None else {"first": self.per_end, "last": self.per_end, "of": self.of}


def select_rows(experiment: Experiment, inputs: Mapping[str, torch.Tensor], budget: int) -> RowSelection:
    """All rows, or for a huge case (more than `budget` elements) its first and last rows within the budget.

    The rows are counted on the first of the experiment's row-wise inputs that this point has (an experiment
    whose cases take different inputs, e.g. forward and backward, names all of them)."""
    present = [name for name in experiment.row_inputs if name in inputs]
    if not present:
        return RowSelection(None)
    first = inputs[present[0]]
    n_rows = first.shape[0]
    row_numel = max(1, first[0].numel()) if n_rows else 1
    if n_rows * row_numel <= budget:
        return RowSelection(None)
    per_end = max(1, budget // (2 * row_numel))
    if 2 * per_end >= n_rows:
        return RowSelection(None)
    index = torch.cat([torch.arange(per_end), torch.arange(n_rows - per_end, n_rows)]).to(first.device)
    return RowSelection(index, per_end, n_rows)


def as_float64(ref: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The reference in float64: one tensor, or a tuple of them for an operation with several outputs."""
    if isinstance(ref, (tuple, list)):
        return tuple(t.double() for t in ref)
    return ref.double()


def relative_error(out: Any, ref: torch.Tensor | tuple[torch.Tensor, ...], rows: RowSelection
                   ) -> tuple[float | None, str | None]:
    """‖out − ref‖ / ‖ref‖ in float64 over the checked rows, or (None, why the output cannot be compared).

    A tuple `ref` takes a tuple or list `out` of as many tensors, each compared with its own reference; the
    error is the largest of theirs, so a small output (a weight gradient beside an activation gradient) is
    held to the tolerance on its own scale. Row selection applies to every output alike.
    """
    if isinstance(ref, tuple):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            got = f"{len(out)} outputs" if isinstance(out, (tuple, list)) else type(out).__name__
            return None, f"returned {got}, not the reference's {len(ref)} outputs"
        errors = []
        for i, (one, one_ref) in enumerate(zip(out, ref)):
            error, why = relative_error(one, one_ref, rows)
            if error is None:
                return None, f"output {i}: {why}"
            errors.append(error)
        return max(errors), None
    if not isinstance(out, torch.Tensor):
        return None, f"returned {type(out).__name__}, not a tensor"
    checked = out if rows.index is None else out.index_select(0, rows.index)
    if checked.shape != ref.shape:
        return None, f"output shape {tuple(checked.shape)} differs from the reference's {tuple(ref.shape)}"
    diff = torch.linalg.vector_norm(checked.double() - ref)
    scale = torch.linalg.vector_norm(ref)
    error = float(diff / scale) if float(scale) > 0 else float(diff)
    if not math.isfinite(error):
        return None, "output holds NaN or infinity where the reference does not"
    return error, None

