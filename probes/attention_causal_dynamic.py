"""GPU probe: does a persistent grid that hands causal query tiles out on demand close the causal Gluon forward's
gap to cuDNN? (kernels/attention_gluon.py's ON_DEMAND)

    python probes/attention_causal_dynamic.py OUT_DIR     (writes OUT_DIR/attention_causal_dynamic.json)

The causal Gluon forward ran one program a query tile: the hardware hands tiles out in order as SMs free up,
longest first within a head, which balances tiles of unequal length, but each program starts cold. Round
attention-phase-stamps saw such a program wait about 1.2 µs for its Q before its first product; at S = 2,048
(B x S = 16,384, 16 heads) that is 15.5 turns an SM, most of the 23 µs the forward trailed cuDNN by there even
with O in 16-byte stores (round attention-o-store). Persistent grids tried before handed tiles out statically
(t, t + grid, ...) and lost to the imbalance of unequal tiles.

Two forms of the project's own kernel, chosen by its flags (no copy of its text):

- "one program a tile": the plan with persistent=False and on_demand=False (the causal plan before round
  attention-causal-dynamic);
- "on demand", the plan: one program an SM with two Q buffers, so the next tile's Q and first keys load while the
  consumers finish the last, and tiles handed out as the hardware hands out programs: the loader takes the next
  tile index from an int32 counter in global memory (atomic add), writes it into shared memory beside the Q
  buffer it fills, and the consumers read it once that buffer's barrier completes; an index past the last tile
  ends them. attention_fwd_gluon zeroes a fresh counter for each launch.

Checks first: at every check shape the plan runs three launches in a row, each into NaN-filled outputs, and each
must equal one program a tile bit for bit (O and lse); then, at each timed shape, once more. Timing: both forms
and cuDNN at attention-fwd's causal head-dim-128 shapes (bf16, B x S = 16,384, 16 heads, S = 1,024 / 2,048 /
4,096 / 8,192), the two forms in twelve alternating rounds of short triton.testing.do_bench runs (the medians
of the rounds, L2 flushed), cuDNN after them (do_bench median of three). GPU time. A tuning instrument, not
evidence.

The output kept in notes/probes (round attention-causal-dynamic) was taken over 705cbdf with O's 16-byte stores
applied, before the kernel had ON_DEMAND: the on-demand form was then a copy of the kernel's text with those
lines changed, named "dynamic", which ended its consumers with an index of -1 and had the program whose grab
came last reset the counter to zero for the next launch, one counter serving every launch. In that output "plan"
is one program a tile and "dynamic" the on-demand form; its counter_after fields read that counter after the
launches (zero: the reset worked), which the plan's fresh counter a launch no longer needs.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from probes.attention_forms import (  # noqa: E402
    ALTERNATING_CLOCK,
    alternating_rounds,
    check_case,
    cudnn_forward,
    median_of_three_us,
    rel_error,
)
from probes.harness import add_row, environment, write_output  # noqa: E402

QUESTION = ("Does a persistent grid that hands causal query tiles out on demand close the causal Gluon forward's "
            "gap to cuDNN?")
CANDIDATES = ("one program a tile: the causal plan with persistent=False, on_demand=False",
              "on demand, the plan: one program an SM, two Q buffers, tiles taken from an atomic counter in the "
              "plan's order",
              "cuDNN through SDPA")
SHAPES = ("checks: head dims 64 and 128, bf16 and fp16, causal, grouped-query heads, ragged lengths, a key mask, "
          "33 queries over 5,000 keys; timed: causal, head dim 128, bf16, B x S = 16,384, 16 heads, "
          "S = 1,024 / 2,048 / 4,096 / 8,192")
OUTPUTS = {"attention-causal-dynamic": ("notes/probes/2026-11-28-h100-attention-causal-dynamic.json", )}

# (batch, heads, kv heads, seq_q, seq_k, head dim, dtype, key mask): all causal
CHECKS = ((2, 4, 4, 1000, 1500, 128, torch.bfloat16, False), (1, 8, 2, 777, 777, 128, torch.float16, False),
          (3, 4, 4, 1500, 900, 128, torch.bfloat16, False), (2, 4, 4, 1000, 1500, 64, torch.bfloat16, False),
          (2, 4, 1, 640, 2100, 128, torch.bfloat16, True), (1, 3, 3, 33, 5000, 128, torch.bfloat16, False),
          (4, 16, 16, 2048, 2048, 128, torch.bfloat16, False), (1, 2, 2, 130, 128, 128, torch.bfloat16, False))
LAUNCHES = 3  # plan launches a check shape, each held to one program a tile
EXPERIMENT_S = (1024, 2048, 4096, 8192)
HEAD_DIM, HEADS = 128, 16
ROUNDS = 12


def forms(plan) -> dict:
    """The two forms' plans: "one-tile" (one program a query tile) and "on-demand" (`plan`, which must take its
    tiles on demand: the causal Gluon plan)."""
    if not (plan.persistent and plan.on_demand):
        raise ValueError("the causal Gluon plan no longer takes its tiles on demand: nothing to compare")
    return {"one-tile": replace(plan, persistent=False, on_demand=False), "on-demand": plan}


def compile_for_sm90(head_dim: int = HEAD_DIM, key_mask: bool = False):
    """The on-demand form compiled for sm_90 from shapes alone (the CPU checks it builds)."""
    from kernels.attention_gluon import compile_for_sm90 as build

    plan = plan_attention(1000, head_dim, torch.bfloat16, True, seq_k=1000, impl="gluon")
    return build(head_dim, torch.bfloat16, True, key_mask, plan.num_stages, plan.pingpong, persistent=True,
                 exp_split=plan.exp_split, prefetch_q=plan.prefetch_q, on_demand=True)


def _poisoned_fwd(case, plan) -> tuple:
    """(O, lse) of `plan` at the check case, written into NaN-filled tensors."""
    o = torch.full_like(case.q, float("nan"))
    lse = torch.full(case.q.shape[:3], float("nan"), dtype=torch.float32, device=case.q.device)
    return attention_fwd(case.q, case.k, case.v, True, case.scale, plan, o, lse, key_mask=case.key_mask)


def _checks(gen) -> list[dict]:
    rows = []
    for batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, masked in CHECKS:
        case = check_case(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, True, masked)
        by_form = forms(case.plan)
        o_tile, lse_tile = _poisoned_fwd(case, by_form["one-tile"])
        equal = True
        for _ in range(LAUNCHES):
            o, lse = _poisoned_fwd(case, by_form["on-demand"])
            equal = equal and bool(torch.equal(o, o_tile) and torch.equal(lse, lse_tile))
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, head_dim], "dtype": str(dtype).split(".")[-1],
               "key_mask": masked, "launches": LAUNCHES, "equal_to_one_tile": equal,
               "rel_error": rel_error(o, case.ref)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "attention_causal_dynamic.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES,
              "clock": ALTERNATING_CLOCK}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261129)
    result["checks"] = _checks(gen)
    result["all_equal"] = all(r["equal_to_one_tile"] for r in result["checks"])
    write_output(output, result)
    if not result["all_equal"]:
        print("tiles on demand differ from one program a tile: nothing timed", flush=True)
        return 1
    scale = 1 / math.sqrt(HEAD_DIM)
    result["experiment"] = []
    for seq in EXPERIMENT_S:
        batch = 16384 // seq
        q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(3))
        by_form = forms(plan_attention(seq, HEAD_DIM, torch.bfloat16, True, seq_k=seq, impl="gluon"))
        runs = {name: (lambda p=p: attention_fwd(q, k, v, True, scale, p)[0]) for name, p in by_form.items()}
        row = {"batch": batch, "seq": seq, "causal": True,
               "on_demand_equal": bool(torch.equal(runs["on-demand"](), runs["one-tile"]()))}
        row.update(alternating_rounds(runs, ROUNDS))
        row["cudnn"] = {"us": median_of_three_us(cudnn_forward(q, k, v, True, scale))}
        row["one_tile_over_on_demand"] = row["one-tile"]["us"] / row["on-demand"]["us"]
        row["cudnn_over_one_tile"] = row["cudnn"]["us"] / row["one-tile"]["us"]
        row["cudnn_over_on_demand"] = row["cudnn"]["us"] / row["on-demand"]["us"]
        add_row(output, result, row)
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
