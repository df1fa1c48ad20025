"""Tuning probe for rows off the sweep grid (GPU only): the softmax forward and backward at row lengths that
are not powers of two, odd ones included, with and without the 16-byte row cut (SoftmaxPlan.edges), against
other warps, split-row slices and the peers. Chooses the plan settings the experiment `softmax-any-n` then
judges; it is a tuning instrument, not evidence (the site's figures come only from run records).

    python tools/probe_any_n.py --out probe.json [--deadline SECONDS] [--n 1001,50257] [--round K]

Round 1 lives here with what every round shares (candidates, one shape's timing, the summary); the forward's
rounds 2-5 and 11 are in tools/probe_any_n_forward.py, the backward's rounds 6-10 in tools/probe_any_n_backward.py,
rounds 12-13 (split rows meeting at a cluster barrier, both directions) in tools/probe_any_n_cluster.py, round 14
(the 2-byte forward holding its row packed) in tools/probe_any_n_packed.py, round 15 (round 14's winners as
plan rules, at every length they would change), 16 and 17 in tools/probe_any_n_rules.py, round 18 (a Gluon
split-row forward staging its 2-byte slices in shared memory) in tools/probe_any_n_smem.py.

Timing: the lab's clock (lab.measure.timing.CudaEventClock: L2 flushed, device held while each round is
queued, candidates interleaved), M chosen so M*N*2 bytes reach 256 MiB; the first 64 rows of every candidate
are checked against float64 before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import reference  # noqa: E402
from kernels.softmax import plan_softmax, softmax_bwd, softmax_fwd  # noqa: E402
from kernels.softmax_plan import MAX_SPLITS, SoftmaxPlan  # noqa: E402
from probe_common import probe_header  # noqa: E402
from probe_softmax import measure_held  # noqa: E402

# Off the sweep grid: odd lengths, even ones that are not multiples of 16, vocabulary sizes (GPT-2's 50,257,
# Llama 3's 128,256, Qwen's 151,936) and a power of two minus one.
ROW_LENGTHS = (1000, 1531, 2500, 3001, 4500, 6999, 10000, 12345, 20000, 25001, 30000, 40000, 50257, 100000,
               128256, 151936, 262143)
DTYPES = (torch.float32, torch.bfloat16)
MIN_BYTES = 256 << 20
LIGER_MAX_N = 65536


def _split_row(m: int, n: int, block_n: int, warps: int, edges: bool) -> SoftmaxPlan:
    splits = math.ceil(n / block_n)
    return SoftmaxPlan("split_row", block_n, 1, warps, m * splits, splits, edges=edges)


def lab_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    """The auto plan with and without the cut, then its neighbours: other warps, other split-row slices."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto), ("auto-no-cut", dataclasses.replace(auto, edges=False))]
    if auto.impl == "single_block":
        plans += [(f"single/w{w}", dataclasses.replace(auto, num_warps=w))
                  for w in (auto.num_warps // 2, auto.num_warps * 2) if 1 <= w <= 32]
        plans += [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges))
                  for b, w in ((2048, 4), (4096, 4), (4096, 8), (8192, 8)) if n > b and math.ceil(n / b) <= 16]
        head = 1 << (n.bit_length() - 1)  # the largest power of two not above n, and a tail for the rest
        tail = max(16, 1 << max(n - head - 1, 0).bit_length())
        if n > 4096 and head != n and tail < head and (head, tail) != (auto.block_n, auto.tail_n):
            plans += [(f"tail/{head}+{tail}w{w}", dataclasses.replace(auto, block_n=head, tail_n=tail, num_warps=w))
                      for w in (max(4, head // 1024), max(4, head // 512)) if w <= 32]
    elif auto.impl == "split_row":
        plans += [(f"split/b{b}w{w}", _split_row(m, n, b, w, auto.edges))
                  for b, w in ((4096, 4), (8192, 8), (16384, 8), (16384, 16))
                  if (b, w) != (auto.block_n, auto.num_warps) and math.ceil(n / b) <= MAX_SPLITS]
    return plans


def previous_plan(m: int, n: int, dtype: torch.dtype, direction: str) -> SoftmaxPlan:
    """The plan before tools/probe_any_n.py's first round (with the cut): 2-byte forward rows took fp32's
    tail rule, backward split-row slices were 8192 wide on 8 warps."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    if auto.impl == "single_block" and direction == "forward":
        return dataclasses.replace(plan_softmax(m, n, torch.float32, "auto", True, direction), edges=auto.edges)
    if auto.impl == "split_row" and direction == "backward":
        return _split_row(m, n, 8192, 8, auto.edges)
    return auto


def round2_plans(m: int, n: int, dtype: torch.dtype, direction: str) -> list[tuple[str, SoftmaxPlan]]:
    """Round 2: the chosen rules against the previous plan, and tails up to half the head (16 warps)."""
    auto = plan_softmax(m, n, dtype, "auto", True, direction)
    plans = [("auto", auto), ("previous", previous_plan(m, n, dtype, direction))]
    head = 1 << (n.bit_length() - 1)
    tail = max(16, 1 << max(n - head - 1, 0).bit_length())
    if auto.impl == "single_block" and 4096 < n and head != n and tail < head and (head, tail) != (auto.block_n, auto.tail_n):
        plans.append((f"tail/{head}+{tail}w16", dataclasses.replace(auto, block_n=head, tail_n=tail, num_warps=16)))
    return plans


def forward_candidates(x: torch.Tensor, plans) -> list:
    y = torch.empty_like(x)
    out = [(f"lab:{name}", lambda p=plan: softmax_fwd(x, p, out=y)) for name, plan in plans]
    out.append(("torch", lambda: torch.softmax(x, -1)))
    if x.shape[1] <= LIGER_MAX_N:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        out.append(("liger", lambda: LigerSoftmaxFunction.apply(x)))
    return out


def backward_candidates(y: torch.Tensor, dy: torch.Tensor, plans) -> list:
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



def summarize(rows: list[dict]) -> None:
    print("\n== auto, no cut / previous, best lab variant, best peer (% of the copy ceiling)")
    keys = sorted({(r["direction"], r["dtype"], r["N"]) for r in rows})
    for key in keys:
        at = {r["variant"]: r for r in rows if (r["direction"], r["dtype"], r["N"]) == key and "pct" in r}
        lab = max((r for v, r in at.items() if v.startswith("lab:")), key=lambda r: r["pct"], default=None)
        peer = max((r for v, r in at.items() if not v.startswith("lab:")), key=lambda r: r["pct"], default=None)
        pct = lambda v: f"{at[v]['pct']:5.1f}" if v in at else "  -  "  # noqa: E731
        print(f"{key[0]:<8} {key[1]:<8} N={key[2]:<7} auto {pct('lab:auto')} no-cut {pct('lab:auto-no-cut')} prev {pct('lab:previous')} "
              f"best {lab['variant'] if lab else '-':<18} {lab['pct'] if lab else float('nan'):5.1f} "
              f"peer {peer['variant'] if peer else '-':<6} {peer['pct'] if peer else float('nan'):5.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=480.0, help="stop starting shapes after this many s")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--n", type=lambda s: tuple(int(v) for v in s.split(",")), default=ROW_LENGTHS)
    parser.add_argument("--round", type=int, choices=tuple(range(1, 19)), default=1,
                        help="1: the cut and the plans' neighbours; 2: the chosen rules against the previous plan "
                             "at other lengths, the sweeps' lengths, and the pipelined split-row lead; 3: 16-bit "
                             "forward rows held in their storage dtype (fewer registers, more programs an SM); 4: persistent "
                             "16-bit forward programs whose next rows' loads are pipelined (tl.range stages)"
                             "; 5: round 4's persistent schedule on the auto plan's lanes at lengths it was not "
                             "chosen on, and at the forward sweep's M; 6: the backward: 2-byte rows on wide tails "
                             "and the pipelined persistent grid, fp32 split-row slices by how they fill the row; 7: 2-byte "
                             "split-row slices and warps in both directions, round 6's rules at lengths they were "
                             "not chosen on; 8: 2-byte backward rows of 6,000-16,000 on other warps, the online chunk loop and narrow "
                             "split-row slices, torch.compile beside them; 9: round 8's chunk loop with L2 eviction hints; "
                             "10: the single-block backward reloading y and dy for dx (SoftmaxPlan.reload); 11: the forward "
                             "reading its row again instead of holding it across a reduction; 12: split rows whose slices "
                             "meet at a hardware cluster barrier (tools/probe_any_n_cluster.py); 13: round 12 at the "
                             "draw's split-row lengths, clusters of 9-15 included; 14: the 2-byte forward holding its row "
                             "packed, two elements a 32-bit register (tools/probe_any_n_packed.py); 15: round 14's "
                             "winners as plan rules, at every drawn 2-byte length they change; 16: round 15's rules at fuller rows and "
                             "register caps on fp32 split rows; 17: clustered 2-byte forward slices against the capped "
                             "tickets (15-17: tools/probe_any_n_rules.py); 18: 2-byte split rows staged in shared memory "
                             "in their storage dtype (Gluon: TMA, cp.async or plain loads; tools/probe_any_n_smem.py)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("probe_any_n: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    result = probe_header(timing="lab clock: L2 flushed, device held, candidates interleaved", rows=[])
    from probe_any_n_backward import run_round6, run_round7, run_round8, run_round9, run_round10
    from probe_any_n_cluster import run_round12, run_round13
    from probe_any_n_forward import run_round2, run_round3, run_round4, run_round5, run_round11
    from probe_any_n_packed import run_round14
    from probe_any_n_rules import run_round15, run_round16, run_round17
    from probe_any_n_smem import run_round18

    runners = {2: run_round2, 3: run_round3, 4: run_round4, 5: run_round5, 6: run_round6, 7: run_round7,
               8: run_round8, 9: run_round9, 10: run_round10, 11: run_round11,
               12: run_round12, 13: run_round13, 14: run_round14, 15: run_round15,
               16: run_round16, 17: run_round17, 18: run_round18}
    if args.round in runners:
        result["rows"] = runners[args.round](result, start, args.deadline, args.rounds, args.out)
        args.n = ()
    for n in args.n:
        for dtype in DTYPES:
            if time.time() - start > args.deadline:
                result["stopped_at"] = {"N": n, "dtype": str(dtype)}
                break
            result["rows"] += probe_shape(n, dtype, result["copy_ceiling_gbs"], args.rounds)
            args.out.write_text(json.dumps(result, indent=1))
    result["wall_s"] = time.time() - start
    args.out.write_text(json.dumps(result, indent=1))
    summarize(result["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
