"""Round 15 of tools/probe_any_n.py (run it through it: --round 15): round 14's winners as plan rules, timed
against the auto plan at every 2-byte length they would change, before any of them becomes the lab's plan.

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
  compiled kernel fits (tools/occupancy.py: 128 registers a thread), instead of two;
* split rows, 2-byte forward, slices of 8192 on 4 warps: compiled under a register cap of 80 or 72 (91
  registers uncapped: five programs an SM; six at 80).

Candidates are the lab's own kernels under other plans (and caps): no new kernel. The peers are left out
(rounds 1-14 timed them); the question is only whether a rule loses anywhere it applies.

Round 17 (--round 17) asks whether 2-byte split rows of at most 16 slices gain from meeting at a cluster
barrier instead of taking tickets now that the ticketed slices run capped: rounds 12-13 measured the clustered
forward +1 to +6 points over uncapped tickets at 8 slices and fewer. Candidates: clusters of 8192-lane slices
on 4 warps, uncapped and under the ticketed slices' cap of 80 registers, and of 4096-lane slices.

Round 16 (--round 16) takes round 15's answers where they stopped short: the halved warps at rows that fill
80-92% of their block (round 15's longest non-power-of-two rows filled 80%), and register caps on fp32 split
rows, whose 8192 lanes on 4 warps compile to 105-107 registers (four programs an SM): 96 fits five, 80 six.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments._any_n import draw_row_lengths  # noqa: E402
from kernels import reference  # noqa: E402
from kernels.softmax import softmax_fwd  # noqa: E402
from kernels.softmax_plan import _SINGLE_BLOCK_WARPS, SoftmaxPlan, device_sms, plan_softmax  # noqa: E402
from probe_any_n_packed import _deferred, lab_capped  # noqa: E402
from probe_softmax import measure_held  # noqa: E402

HALF_WARPS_LANES = (2048, 4096, 8192)  # one padded block of these lanes: warps halved
WIDE_HEAD, WIDE_HEAD_WARPS = 4096, 4  # this head takes a tail of up to a quarter of it, on these warps
SPLIT_CAPS = {2: (80, 72), 4: (96, 80)}  # by element size
MIN_BYTES = 256 << 20
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
        out += [(f"lab:auto-r{cap}", _deferred(lambda x, c=cap: lab_capped(x, auto, c))(x))
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
                shapes: list[tuple[int, torch.dtype]] | None = None, candidates=round15_candidates) -> list[dict]:
    """Each shape's `candidates(x)` checked and timed together (rounds 15-17), the rows written as they come."""
    rows: list[dict] = []
    for n, dtype in round15_shapes(device_sms()) if shapes is None else shapes:
        if time.time() - start > deadline:
            result["stopped_at"] = {"N": n, "dtype": str(dtype)}
            return rows
        m = math.ceil(MIN_BYTES / (2 * n))
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(m, n, device="cuda", generator=gen) * 3).to(dtype)
        size = x.element_size()
        key = {"dtype": str(dtype).removeprefix("torch."), "M": m, "N": n, "direction": "forward"}
        rows += measure_held(candidates(x), reference.softmax_float64(x[:64]), 2 * m * n * size,
                             result["copy_ceiling_gbs"], key, rounds)
        del x
        torch.cuda.empty_cache()
        result["rows"] = rows
        out.write_text(json.dumps(result, indent=1))
    return rows


# Round 17: the draw's 2-byte split-row lengths that fit a cluster of 8192-lane slices, and the powers of two.
ROUND17_SLICES = ((8192, 4, None), (8192, 4, 80), (4096, 4, None))


def round17_shapes() -> list[tuple[int, torch.dtype]]:
    from kernels._launch import MAX_CLUSTER

    split = [n for n in draw_row_lengths() if SPLIT_MIN_N <= n and math.ceil((n + 16) / 8192) <= MAX_CLUSTER]
    shapes = [(n, torch.bfloat16) for n in split + [65536, 131072]]
    return shapes + [(n, torch.float16) for n in split[::3]]


def round17_candidates(x: torch.Tensor) -> list[tuple[str, object]]:
    """The auto plan (ticketed slices) and clusters of ROUND17_SLICES that cover the row."""
    from probe_any_n_cluster import cluster_forward, cluster_settings

    y = torch.empty_like(x)
    m, n = x.shape
    auto = plan_softmax(m, n, x.dtype, "auto", True, "forward", sms=device_sms())
    out = [("lab:auto", lambda: softmax_fwd(x, auto, out=y))]
    for block_n, warps, cap in ROUND17_SLICES:
        for cluster, lanes, w in cluster_settings(n, ((block_n, warps),)):
            out.append((f"cluster{cluster}x{lanes}w{w}r{cap or 0}",
                        _deferred(lambda x, c=cluster, b=lanes, w=w, r=cap: cluster_forward(x, c, b, w, r))(x)))
    return out


def run_round17(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    return run_round15(result, start, deadline, rounds, out, round17_shapes(), round17_candidates)
