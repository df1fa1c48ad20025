"""Rounds 15 and 16 of the any-N softmax probe (GPU only: `python -m probes.softmax_any_n_rules --round K
--out FILE`): round 14's winners as plan rules, timed against the auto plan at every 2-byte length they would change, before any of them becomes the lab's plan.

Round 14 (notes/softmax-any-n.md) timed variants at a handful of lengths each. A plan is a function of the
row's range, alignment and dtype, so each winner is written here as the rule it would become and timed at
every length of the experiment's seeded draw in its range, both 2-byte dtypes, and at the powers of two the
sweeps hold:

* one row a program, 2-byte forward, no tail: half the table's warps at 2048-8192 lanes, so each thread holds
  64 bytes of the row as an fp32 thread does (the table's warps are fp32's: 16 elements a thread at 4096 and
  8192; where the auto plan already runs on half, as it does since round 16, there is nothing to time);
* one row a program, 2-byte forward: a 4096 head takes a tail of up to 1024 lanes on 4 warps (the backward's
  rule) instead of one padded 8192 block;
* the pipelined 16-warp plan (a 16,384 head and an 8192 tail) launched as one program an SM, the programs its
  compiled kernel fits (probes/occupancy.py: 128 registers a thread), instead of two;
* split rows, 2-byte forward, slices of 8192 on 4 warps: compiled under a register cap of 80 or 72 (91
  registers uncapped: five programs an SM; six at 80).

Candidates are the lab's own kernels under other plans (and caps): no new kernel. The peers are left out
(rounds 1-14 timed them); the question is only whether a rule loses anywhere it applies.

Round 16 (--round 16) takes round 15's answers where they stopped short: the halved warps at rows that fill
80-92% of their block (round 15's longest non-power-of-two rows filled 80%), and register caps on fp32 split
rows, whose 8192 lanes on 4 warps compile to 105-107 registers (four programs an SM): 96 fits five, 80 six.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments._any_n import draw_row_lengths  # noqa: E402
from kernels.softmax import softmax_fwd  # noqa: E402
from kernels.softmax_plan import _SINGLE_BLOCK_WARPS, SoftmaxPlan, device_sms, plan_softmax  # noqa: E402
from probes.harness import MIN_BYTES, deferred, lab_capped, run_rounds, time_forward_shapes  # noqa: E402

QUESTION = ("Do round 14's winners, written as plan rules, lose anywhere they apply: halved warps, a wide head's "
            "tail, one pipelined program an SM, register caps on split-row slices?")
CANDIDATES = ("lab:auto", "lab:half-warps", "lab:wide-head", "lab:one-an-sm", "lab:auto-r{cap}")
OUTPUTS = {
    "any-n-15": ("notes/probes/2026-11-25-h100-any-n-round15.json.gz",
                 "notes/probes/2026-11-25-h100-any-n-round15-adopted.json.gz"),
    "any-n-16": ("notes/probes/2026-11-25-h100-any-n-round16.json.gz",),
}

HALF_WARPS_LANES = (2048, 4096, 8192)  # one padded block of these lanes: warps halved
WIDE_HEAD, WIDE_HEAD_WARPS = 4096, 4  # this head takes a tail of up to a quarter of it, on these warps
SPLIT_CAPS = {2: (80, 72), 4: (96, 80)}  # by element size
ONE_ROW_RANGE = (1025, 10240)
SPLIT_MIN_N = 32769
POW2_N = (2048, 4096, 8192, 65536, 131072, 262144)


def rule_plans(m: int, n: int, dtype: torch.dtype, direction: str = "forward",
               sms: int | None = None) -> list[tuple[str, SoftmaxPlan]]:
    """The auto plan, then the plan each round-15 rule gives where it differs (one name per rule); `sms` as
    plan_softmax takes it."""
    sms = device_sms() if sms is None else sms
    auto = plan_softmax(m, n, dtype, "auto", True, direction, sms=sms)
    out = [("auto", auto)]
    if auto.impl != "single_block" or dtype.itemsize != 2 or direction != "forward":
        return out
    if auto.stages > 1:
        if auto.num_warps == 16 and auto.grid > sms:
            out.append(("rule:pipelined-one-per-sm", dataclasses.replace(auto, grid=sms)))
        return out
    if auto.rows_per_program != 1:
        return out
    half = next(w for limit, w in _SINGLE_BLOCK_WARPS["forward"] if auto.block_n <= limit) // 2
    if auto.tail_n == 0 and auto.block_n in HALF_WARPS_LANES and auto.num_warps != half:
        out.append(("rule:half-warps", dataclasses.replace(auto, num_warps=half)))
    head = auto.block_n // 2
    tail = max(16, 1 << max(n - head - 1, 0).bit_length())
    if auto.tail_n == 0 and head == WIDE_HEAD and n > head and tail <= head // 4:
        out.append(("rule:wide-tail-4096", dataclasses.replace(auto, block_n=head, tail_n=tail,
                                                               num_warps=WIDE_HEAD_WARPS)))
    return out


def applies(n: int, dtype: torch.dtype, sms: int) -> bool:
    """Whether a round-15 rule or cap changes the plan of rows of n elements of dtype."""
    m = math.ceil(MIN_BYTES / (2 * n))
    return len(rule_plans(m, n, dtype, sms=sms)) > 1 or n >= SPLIT_MIN_N


def round15_shapes(sms: int = 132) -> list[tuple[int, torch.dtype]]:
    """(N, dtype): the draw's 2-byte lengths a rule applies to on a GPU of `sms` SMs, both 2-byte dtypes for
    one-row lengths and bf16 with every fourth fp16 for split rows, then the powers of two of the sweeps."""
    drawn = draw_row_lengths()
    one_row = [n for n in drawn if ONE_ROW_RANGE[0] <= n <= ONE_ROW_RANGE[1]]
    pipelined = [n for n in drawn if 20480 < n <= 24576]
    split = [n for n in drawn if n >= SPLIT_MIN_N]
    shapes = [(n, dt) for n in one_row + pipelined for dt in (torch.bfloat16, torch.float16)]
    shapes += [(n, torch.bfloat16) for n in split] + [(n, torch.float16) for n in split[::4]]
    shapes += [(n, torch.bfloat16) for n in POW2_N]
    return [(n, dtype) for n, dtype in shapes if applies(n, dtype, sms)]


def round15_candidates(x: torch.Tensor) -> list[tuple[str, object]]:
    """(name, callable) of round 15 for one input: the rule plans, and the split-row caps where they apply."""
    m, n = x.shape
    y = torch.empty_like(x)
    plans = rule_plans(m, n, x.dtype)
    out = [(f"lab:{name}", lambda p=plan: softmax_fwd(x, p, out=y)) for name, plan in plans]
    auto = plans[0][1]
    if auto.impl == "split_row" and (auto.block_n, auto.num_warps) == (8192, 4) and not auto.cluster:
        out += [(f"lab:auto-r{cap}", deferred(lambda x, c=cap: lab_capped(x, auto, c))(x))
                for cap in SPLIT_CAPS[x.element_size()]]
    return out


# Round 16: rows filling 80-92% of a 4096- or 8192-lane block, both 2-byte dtypes; the draw's fp32 split rows.
ROUND16_FILL_N = (3300, 3451, 3600, 3767, 6700, 6901, 7200, 7500)


def round16_shapes() -> list[tuple[int, torch.dtype]]:
    shapes = [(n, dt) for n in ROUND16_FILL_N for dt in (torch.bfloat16, torch.float16)]
    split = [n for n in draw_row_lengths() if n >= SPLIT_MIN_N]
    return shapes + [(n, torch.float32) for n in split + [65536, 131072, 262144]]


def run_round16(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return run_round15(result, start, deadline, rounds, out, round16_shapes())


def run_round15(result: dict, start: float, deadline: float, rounds: int, out: Path,
                shapes: list[tuple[int, torch.dtype]] | None = None) -> list[dict]:
    """Each shape's round15_candidates(x) checked and timed together, the rows written as they come."""
    shapes = round15_shapes(device_sms()) if shapes is None else shapes
    return time_forward_shapes(result, start, deadline, rounds, out, shapes, round15_candidates)


SHAPES = {"15": "every drawn 2-byte length a rule changes, and the powers of two", "16": ROUND16_FILL_N}


def main(argv=None) -> int:
    return run_rounds(__doc__, {15: run_round15, 16: run_round16}, argv)


if __name__ == "__main__":
    sys.exit(main())
