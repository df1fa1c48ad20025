"""What every probe shares: the header and writer of its JSON output, a kernel module's text edited and imported
as a form, the two clocks it times on, the softmax shape machinery the any-N rounds reuse and the attention
probes' line fit. Smaller rooms beside it hold
what only some probes need: probes/compiled.py (a compiled kernel's registers, spills and programs an SM),
probes/int4_parts.py (the int4 Gluon probes' weights and plain operand) and probes/attention_forms.py (the
attention forward's source edits and check shapes).

A probe is a tuning instrument, never evidence: the site's figures come from run records alone. Each probe
module declares, as module-level data, the question it asks (`QUESTION`), what it times (`CANDIDATES`), at
which shapes (`SHAPES`) and the raw outputs it wrote (`OUTPUTS`: round id -> files under notes/probes/);
probes/rounds.toml says, per round, what was kept and dropped and which page the round fed. No probe
imports another: what two of them need lives here or in those rooms.

Import on a CPU: torch and Triton import anywhere, and everything that needs a GPU (the clocks, the copy
ceiling) is imported or touched inside the functions that use it.
"""

from __future__ import annotations

import argparse
import importlib.util
import dataclasses
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch



ROOT = Path(__file__).resolve().parents[1]
SCHEMA_VERSION = 1  # of the header probe_header writes; outputs from before it carry none
RAW_DIR = "notes/probes"

BENCH_TIMING = "triton.testing.do_bench median, L2 cleared before every call"
LAB_TIMING = "lab clock: L2 flushed, device held, candidates interleaved"
HELD_TIMING = ("the lab's clock (lab.measure.timing.CudaEventClock): L2 flushed before every call, device held while "
               "a round is queued, candidates interleaved and rotated; median of the rounds")
TIMING = BENCH_TIMING  # the header's default

MIN_BYTES = 256 << 20  # M is chosen so M*N*2 bytes reach this: far past the 50 MB L2
LIGER_MAX_N = 65536


# --------------------------------------------------------------------------------------------------------
# Output: header, writer
# --------------------------------------------------------------------------------------------------------


def commit() -> str | None:
    """The checkout's commit (with "+dirty" when tracked files changed), None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def copy_ceiling_gbs() -> float:
    """Device-to-device copy of 1 GiB of fp32, read + write bytes over the median time, in GB/s."""
    from triton.testing import do_bench

    src = torch.empty(2**28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def environment() -> dict:
    """The schema version, commit, GPU and versions every output starts with (no copy ceiling)."""
    import triton

    gpu = torch.cuda.is_available()
    return {
        "schema_version": SCHEMA_VERSION,
        "commit": commit(),
        "gpu": torch.cuda.get_device_name() if gpu else "cpu",
        "sms": torch.cuda.get_device_properties(0).multi_processor_count if gpu else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }


def probe_header(**fields) -> dict:
    """environment(), the timing method and the copy ceiling, then `fields`; prints the ceiling."""
    out = {**environment(), "timing": TIMING, "copy_ceiling_gbs": copy_ceiling_gbs(), **fields}
    print(f"{out['gpu']}: copy ceiling {out['copy_ceiling_gbs']:.0f} GB/s", flush=True)
    return out


def write_output(path: Path, result: dict) -> None:
    """The probe's JSON, written whole each time (a probe stopped part-way still leaves what it had)."""
    Path(path).write_text(json.dumps(result, indent=1))


def add_row(path: Path, result: dict, row: dict, key: str = "experiment") -> None:
    """`row` appended to result[key], printed as one line of JSON, and the output written again."""
    result[key].append(row)
    print(json.dumps(row), flush=True)
    write_output(path, result)


# --------------------------------------------------------------------------------------------------------
# Forms: a copy of a kernel module's text with an edit, imported
# --------------------------------------------------------------------------------------------------------


def replace_once(text: str, old: str, new: str, where: str = "kernels/attention_gluon.py") -> str:
    """`text` with its one `old` replaced by `new`; an error naming `where` if `old` is not there exactly once."""
    if text.count(old) != 1:
        raise RuntimeError(f"{where} no longer holds exactly one {old!r}")
    return text.replace(old, new)


def module_from_source(folder: Path, name: str, text: str):
    """`text` imported as the module `name` (Gluon reads a kernel's source from its file, so it is written out
    into `folder` first)."""
    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------------
# Timing: checked candidates on the lab's clock
# --------------------------------------------------------------------------------------------------------


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def line_fit(xs: list[int], times: list[float]) -> dict:
    """Least squares of T = a + b·x: {"fixed_us": a, "per_key_tile_us": b, "worst_residual": the largest
    |fit / T - 1|} (the attention probes' split of a time into a fixed part and a cost a key tile)."""
    x = torch.tensor(xs, dtype=torch.float64)
    t = torch.tensor(times, dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], dim=1)
    a, b = torch.linalg.lstsq(design, t[:, None]).solution[:, 0].tolist()
    worst = float(((design @ torch.tensor([a, b], dtype=torch.float64)) / t - 1).abs().max())
    return {"fixed_us": a, "per_key_tile_us": b, "worst_residual": worst}


def key_tile_fit(rows: list[dict], name: str, sm_count: int, fit_from: int = 0) -> dict | None:
    """line_fit of candidate `name`'s time (row[name]["us"]) against the rows' key tiles, over the rows from
    `fit_from` key tiles on that timed it, with the fixed part a query-tile slot (the rows' query tiles over
    the SMs) beside it; None with fewer than three such rows."""
    kept = [r for r in rows if r["key_tiles"] >= fit_from and "us" in r[name]]
    if len(kept) < 3:
        return None
    fit = line_fit([r["key_tiles"] for r in kept], [r[name]["us"] for r in kept])
    fit["fixed_us_a_query_tile_slot"] = fit["fixed_us"] / (kept[0]["query_tiles"] / sm_count)
    return fit


def held_times(candidates, rounds: int = 30, warmup: int = 3) -> dict[str, float]:
    """Median ms of each candidate under the lab's clock: flushed L2, device held while a round is queued,
    candidates interleaved and rotated by one each round."""
    from lab.measure.timing import CudaEventClock

    clock = CudaEventClock("cuda")
    samples: dict[str, list[float]] = {name: [] for name, _ in candidates}
    for r in range(warmup + rounds):
        order = candidates[r % len(candidates):] + candidates[:r % len(candidates)]
        clock.begin_round()
        readers = [(name, clock.measure(fn)) for name, fn in order]
        clock.end_round()
        clock.settle()
        if r >= warmup:
            for name, read in readers:
                samples[name].append(read())
    return {name: sorted(v)[len(v) // 2] for name, v in samples.items()}


def measure_held(candidates, ref, nbytes: int, ceiling: float, key: dict, rounds: int = 30) -> list[dict]:
    """Check each candidate's first 64 rows against `ref`, then time all that passed together."""
    rows, ok = [], []
    for name, fn in candidates:
        row = {**key, "variant": name}
        try:
            row["rel_err"] = rel_err(fn()[:64], ref)
            ok.append((name, fn))
        except Exception as e:  # a candidate that cannot run this shape is a finding, not a crash
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            torch.cuda.empty_cache()
        rows.append(row)
    times = held_times(ok, rounds) if ok else {}
    for row in rows:
        if row["variant"] in times:
            ms = times[row["variant"]]
            row.update(ms=ms, gbs=nbytes / ms / 1e6, pct=100 * nbytes / ms / 1e6 / ceiling)
        print(json.dumps(row), flush=True)
    return rows


def deferred(make):
    """make(x) -> callable, with an error in make (a compile or a refused cluster size) raised by the
    callable instead, so the probe records it against the candidate and times the rest."""
    def factory(x):
        try:
            return make(x)
        except Exception as error:  # noqa: BLE001 - recorded per candidate by measure_held
            def fail(error=error):
                raise error
            return fail
    return factory


# --------------------------------------------------------------------------------------------------------
# Softmax shapes: the lab's plans and the peers at one row length
# --------------------------------------------------------------------------------------------------------


def split_row_plan(m: int, n: int, block_n: int, warps: int, edges: bool):
    from kernels.softmax_plan import SoftmaxPlan

    splits = math.ceil(n / block_n)
    return SoftmaxPlan("split_row", block_n, 1, warps, m * splits, splits, edges=edges)


def lab_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, object]]:
    """The auto plan with and without the cut, then its neighbours: other warps, other split-row slices."""
    from kernels.softmax import plan_softmax
    from kernels.softmax_plan import MAX_SPLITS

    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto), ("auto-no-cut", dataclasses.replace(auto, edges=False))]
    if auto.impl == "single_block":
        plans += [(f"single/w{w}", dataclasses.replace(auto, num_warps=w))
                  for w in (auto.num_warps // 2, auto.num_warps * 2) if 1 <= w <= 32]
        plans += [(f"split/b{b}w{w}", split_row_plan(m, n, b, w, auto.edges))
                  for b, w in ((2048, 4), (4096, 4), (4096, 8), (8192, 8)) if n > b and math.ceil(n / b) <= 16]
        head = 1 << (n.bit_length() - 1)  # the largest power of two not above n, and a tail for the rest
        tail = max(16, 1 << max(n - head - 1, 0).bit_length())
        if n > 4096 and head != n and tail < head and (head, tail) != (auto.block_n, auto.tail_n):
            plans += [(f"tail/{head}+{tail}w{w}", dataclasses.replace(auto, block_n=head, tail_n=tail, num_warps=w))
                      for w in (max(4, head // 1024), max(4, head // 512)) if w <= 32]
    elif auto.impl == "split_row":
        plans += [(f"split/b{b}w{w}", split_row_plan(m, n, b, w, auto.edges))
                  for b, w in ((4096, 4), (8192, 8), (16384, 8), (16384, 16))
                  if (b, w) != (auto.block_n, auto.num_warps) and math.ceil(n / b) <= MAX_SPLITS]
    return plans


def forward_candidates(x: torch.Tensor, plans) -> list:
    """(name, callable): the lab's forward for each plan, torch, and Liger where it takes the row."""
    from kernels.softmax import softmax_fwd

    y = torch.empty_like(x)
    out = [(f"lab:{name}", lambda p=plan: softmax_fwd(x, p, out=y)) for name, plan in plans]
    out.append(("torch", lambda: torch.softmax(x, -1)))
    if x.shape[1] <= LIGER_MAX_N:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        out.append(("liger", lambda: LigerSoftmaxFunction.apply(x)))
    return out


def backward_candidates(y: torch.Tensor, dy: torch.Tensor, plans) -> list:
    """(name, callable): the lab's backward for each plan, torch, and Liger where it takes the row."""
    from kernels.softmax import softmax_bwd

    dx = torch.empty_like(y)
    out = [(f"lab:{name}", lambda p=plan: softmax_bwd(y, dy, p, out=dx)) for name, plan in plans]
    out.append(("torch", lambda: torch._softmax_backward_data(dy, y, -1, y.dtype)))
    if y.shape[1] <= LIGER_MAX_N:
        from experiments._softmax import _liger_backward
        out.append(("liger", lambda: _liger_backward(y, dy)))
    return out


def probe_shape(n: int, dtype: torch.dtype, ceiling: float, rounds: int, plans=lab_plans, m: int | None = None,
                directions=("forward", "backward"), extra=(), backward_extra=None) -> list[dict]:
    """One row length: the lab's `plans` and the peers, forward (with the candidates f(x) of `extra`) and
    backward (with those backward_extra(y, dy) gives), each checked against float64 and timed together."""
    from kernels import reference

    m = m or math.ceil(MIN_BYTES / (2 * n))
    size = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device="cuda").manual_seed(n)
    x = (torch.randn(m, n, device="cuda", generator=gen) * 3).to(dtype)
    key = {"dtype": str(dtype).removeprefix("torch."), "M": m, "N": n}
    rows = []
    if "forward" in directions:
        rows += measure_held(forward_candidates(x, plans(m, n, dtype, "forward")) + [(v, f(x)) for v, f in extra],
                             reference.softmax_float64(x[:64]), 2 * m * n * size, ceiling,
                             {**key, "direction": "forward"}, rounds)
    if "backward" not in directions:
        return rows
    y = torch.softmax(x.float(), -1).to(dtype)
    del x
    dy = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    more = backward_extra(y, dy) if backward_extra is not None else []
    rows += measure_held(backward_candidates(y, dy, plans(m, n, dtype, "backward")) + more,
                         reference.softmax_backward(y[:64].double(), dy[:64].double()), 3 * m * n * size, ceiling,
                         {**key, "direction": "backward"}, rounds)
    del y, dy
    torch.cuda.empty_cache()
    return rows


def time_forward_shapes(result: dict, start: float, deadline: float, rounds: int, out: Path,
                        shapes, candidates: Callable[[torch.Tensor], list]) -> list[dict]:
    """Each (N, dtype) of `shapes`: the forward `candidates(x)` checked against float64 and timed together,
    M chosen so the input reaches MIN_BYTES; the rows written to `out` as they come."""
    from kernels import reference

    rows: list[dict] = []
    for n, dtype in shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        m = math.ceil(MIN_BYTES / (2 * n))
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(m, n, device="cuda", generator=gen) * 3).to(dtype)
        key = {"dtype": str(dtype).removeprefix("torch."), "M": m, "N": n, "direction": "forward"}
        rows += measure_held(candidates(x), reference.softmax_float64(x[:64]), 2 * m * n * x.element_size(),
                             result["copy_ceiling_gbs"], key, rounds)
        del x
        torch.cuda.empty_cache()
        result["rows"] = rows
        write_output(out, result)
    return rows


def lab_capped(x: torch.Tensor, plan, maxnreg: int):
    """A callable writing softmax(x) with the lab's forward kernel for `plan`, compiled under a register cap."""
    from kernels.softmax import _fresh_workspace, _fwd_launch

    y = torch.empty_like(x)
    kernel, grid, args, meta = _fwd_launch(x, y, plan, _fresh_workspace)

    def run():
        kernel[grid](*args, **{**meta, "maxnreg": maxnreg})  # over the plan's own cap, if it has one
        return y
    return run


def summarize(rows: list[dict]) -> None:
    """Per direction, dtype and N: auto, no cut, previous, the best lab variant and the best peer."""
    print("\n== auto, no cut / previous, best lab variant, best peer (% of the copy ceiling)")
    for key in sorted({(r["direction"], r["dtype"], r["N"]) for r in rows}):
        at = {r["variant"]: r for r in rows if (r["direction"], r["dtype"], r["N"]) == key and "pct" in r}
        lab = max((r for v, r in at.items() if v.startswith("lab:")), key=lambda r: r["pct"], default=None)
        peer = max((r for v, r in at.items() if not v.startswith("lab:")), key=lambda r: r["pct"], default=None)
        pct = lambda v: f"{at[v]['pct']:5.1f}" if v in at else "  -  "  # noqa: E731
        print(f"{key[0]:<8} {key[1]:<8} N={key[2]:<7} auto {pct('lab:auto')} no-cut {pct('lab:auto-no-cut')} "
              f"prev {pct('lab:previous')} best {lab['variant'] if lab else '-':<18} "
              f"{lab['pct'] if lab else float('nan'):5.1f} peer {peer['variant'] if peer else '-':<6} "
              f"{peer['pct'] if peer else float('nan'):5.1f}")


Runner = Callable[[dict, float, float, int, Path], list]


def run_rounds(doc: str, runners: dict[int, Runner], argv=None) -> int:
    """The command line of a probe of numbered rounds: `--round K --out FILE [--deadline S] [--rounds R]`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--round", type=int, choices=sorted(runners), default=min(runners))
    parser.add_argument("--deadline", type=float, default=480.0, help="stop starting shapes after this many s")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds a shape")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{Path(sys.argv[0]).name}: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    result = probe_header(timing=LAB_TIMING, round=args.round, rows=[])
    result["rows"] = runners[args.round](result, start, args.deadline, args.rounds, args.out)
    result["wall_s"] = time.time() - start
    write_output(args.out, result)
    if result["rows"] and "direction" in result["rows"][0]:
        summarize(result["rows"])
    return 0
