"""Round 19 of the any-N softmax probe (GPU only: `python -m probes.softmax_any_n_h200 --out FILE`): on the H200,
does any setting of the lab's own kernels bring the 2-byte forward rows nearer the copy ceiling?

Every rule in kernels/softmax_plan.py was measured on the H100. On the H200 (4.2 TB/s against 3.0) the
experiment softmax-any-n measures its 2-byte forward rows at 58-69% of the copy ceiling from 10,000 lanes on
(83% at 4,396), where the H100 reaches 77-100%; fp32 rows of the same bytes reach 76-97%. Round 1's neighbours
of the auto plan (other warps, other split-row slices) were timed on an H200 first
(notes/probes/2026-11-27-h200-any-n-round1.json.gz) and none gained more than 4 points, so this round times what
round 1 does not vary: what a program keeps in flight.

* rows of one program and a pipelined persistent grid (SoftmaxPlan.stages): 2, 3 and 4 stages at 1-4 programs
  an SM, on the auto plan's head and tail where it has one, else on a 16,384 head;
* split rows: 4096-16,384-lane slices on 4-16 warps, with the forward's register cap and without it.

Round 20 (--round 20) takes round 19's one gain, the pipelined grid at three programs an SM, across the 2-byte
lengths the pipelined rule covers (cut rows on an 8192 head, rows on a 16,384 head), fp16 beside bf16, at two
to four programs an SM on the auto plan's head, tail, warps and stages.

Candidates are the lab's own kernels under other plans (and caps): no new kernel. Timing as round 1's: the
lab's clock, M chosen so M*N*2 bytes reach 256 MiB, the first 64 rows checked against float64.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.softmax import softmax_fwd  # noqa: E402
from kernels.softmax_plan import MAX_SPLITS, SoftmaxPlan, device_sms, plan_softmax  # noqa: E402
from probes.harness import deferred, lab_capped, run_rounds, time_forward_shapes  # noqa: E402

QUESTION = ("On the H200, does any setting of the lab's own kernels (stages and programs an SM on the pipelined "
            "grid, split-row slices, warps and register caps) bring the 2-byte forward nearer the copy ceiling?")
CANDIDATES = ("lab:auto", "lab:pipe/h{head}+{tail}w{warps}s{stages}x{per_sm}", "lab:split/b{block}w{warps}",
              "lab:split/b{block}w{warps}-r{cap}")
OUTPUTS = {"any-n-19": ("notes/probes/2026-11-27-h200-any-n-round19.json.gz",),
           "any-n-20": ("notes/probes/2026-11-27-h200-any-n-round20.json",
                        "notes/probes/2026-11-27-h100-any-n-round20.json")}

ROW_LENGTHS = (4396, 10039, 21439, 41187, 129820)  # the experiment's 2-byte rows furthest short on the H200
PIPE_STAGES = (2, 3, 4)
PIPE_PER_SM = (1, 2, 3, 4)
PIPE_WARPS = (8, 16)
SPLIT_SETTINGS = ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16))
SPLIT_CAPS = (80, 64)


def pipelined_plans(auto: SoftmaxPlan, m: int, sms: int) -> list[tuple[str, SoftmaxPlan]]:
    """The pipelined grid on the `auto` plan's head and tail (or a 16,384 head where the row fits one), for m
    rows on sms SMs, at every stages x programs an SM x warps of this round."""
    if auto.impl != "single_block":
        return []
    head, tail = auto.block_n, auto.tail_n
    if not tail and head > 16384:
        head, tail = 16384, head // 2
    out = []
    for stages in PIPE_STAGES:
        for per_sm in PIPE_PER_SM:
            for warps in PIPE_WARPS:
                plan = SoftmaxPlan("single_block", head, 1, warps, min(m, per_sm * sms), tail_n=tail,
                                   edges=auto.edges, stages=stages)
                out.append((f"pipe/h{head}+{tail}w{warps}s{stages}x{per_sm}", plan))
    return out


def split_plans(auto: SoftmaxPlan, m: int, n: int) -> list[tuple[str, SoftmaxPlan, int]]:
    """(name, plan, register cap or 0): split rows of m x n at every slice and warps of this round, where the
    row takes two slices or more, cut at 16-byte boundaries as the `auto` plan is."""
    out = []
    for block, warps in SPLIT_SETTINGS:
        splits = -(-n // block)
        if splits < 2 or splits > MAX_SPLITS:
            continue
        plan = SoftmaxPlan("split_row", block, 1, warps, m * splits, splits, edges=auto.edges)
        out.append((f"split/b{block}w{warps}", plan, 0))
        out += [(f"split/b{block}w{warps}-r{cap}", plan, cap) for cap in SPLIT_CAPS]
    return out


def _forward_of(x: torch.Tensor):
    """(auto plan, SMs, run): the auto plan of x's rows on this GPU, and run(plan), a callable writing the lab's
    forward of x under `plan` into one output."""
    sms = device_sms()
    y = torch.empty_like(x)
    auto = plan_softmax(*x.shape, x.dtype, "auto", True, "forward", sms=sms)
    return auto, sms, lambda plan: lambda: softmax_fwd(x, plan, out=y)


def round19_candidates(x: torch.Tensor) -> list[tuple[str, object]]:
    """(name, callable) for one input: the auto plan, the pipelined grid's settings, the split-row settings."""
    m, n = x.shape
    auto, sms, run = _forward_of(x)
    out = [("lab:auto", run(auto))]
    out += [(f"lab:{name}", run(plan)) for name, plan in pipelined_plans(auto, m, sms) if plan != auto]
    for name, plan, cap in split_plans(auto, m, n):
        if cap:
            out.append((f"lab:{name}", deferred(lambda x, p=plan, c=cap: lab_capped(x, p, c))(x)))
        elif plan != auto:
            out.append((f"lab:{name}", run(plan)))
    return out


def run_round19(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    shapes = [(n, torch.bfloat16) for n in ROW_LENGTHS]
    return time_forward_shapes(result, start, deadline, rounds, out, shapes, round19_candidates)


# Round 20: the pipelined rule's two ranges (cut rows on an 8192 head with a tail of 2048 or more; a 16,384 head
# with a tail of 2048-8192), lengths the experiment draws and others.
ROUND20_N = (9300, 9512, 9800, 10039, 10193, 17523, 18000, 20000, 22403, 24575)
ROUND20_PER_SM = (2, 3, 4)


def round20_candidates(x: torch.Tensor) -> list[tuple[str, object]]:
    """(name, callable): the auto plan, and its pipelined grid at each programs an SM of ROUND20_PER_SM."""
    m = x.shape[0]
    auto, sms, run = _forward_of(x)
    out = [("lab:auto", run(auto))]
    if auto.stages > 1:
        out += [(f"lab:pipe/x{k}", run(dataclasses.replace(auto, grid=min(m, k * sms))))
                for k in ROUND20_PER_SM if min(m, k * sms) != auto.grid]
    return out


def run_round20(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    shapes = [(n, dt) for n in ROUND20_N for dt in (torch.bfloat16, torch.float16)]
    return time_forward_shapes(result, start, deadline, rounds, out, shapes, round20_candidates)


SHAPES = {"19": ROW_LENGTHS, "20": ROUND20_N}


def main(argv=None) -> int:
    return run_rounds(__doc__, {19: run_round19, 20: run_round20}, argv)


if __name__ == "__main__":
    sys.exit(main())
