"""GPU probe: at head dim 64, do 64-key tiles with two programs an SM hide the exponentials that one program an SM
cannot? (kernels/attention_gluon.py, kernels/attention_choice.py)

    python probes/attention_head_dim_64.py OUT_DIR     (writes OUT_DIR/attention_head_dim_64.json)
    python probes/attention_head_dim_64.py --compile   (the CPU: each form's registers, spills and shared memory)

At head dim 64 the Gluon forward's score tile (64 queries x 128 keys a consumer) asks as much of the MUFU, one
exponential a score, as of the tensor cores, and the plan runs one program an SM: two consumer warpgroups, whose
exponentials and products overlap only within each warpgroup's own chain. It stays 5-8% behind cuDNN without the
mask, and with the mask the Triton forward runs there, 10-27% behind (notes/attention.md, "Where the attention
targets stand (2026-11-28)"). A consumer of 64-key tiles holds half the score tile (32 fp32 registers a thread, P
16), so its registers can be cut to 104 a thread and two programs share an SM: four consumer warpgroups whose
exponentials and products interleave across programs.

Forms, each the Gluon forward's plan at that mask (one Q buffer on the persistent grid without the mask; two
Q buffers and tiles handed out on demand with it; GLUON_STAGES' 3-stage ring) with its tiles set by the plan's
fields (block_n, programs_per_sm), beside the Triton forward as its plan launches it:

* k128-one: 128-key tiles, one program an SM (the plan everywhere before this round; still the plan without the
  mask, and with it from GLUON_TWO_PROGRAMS_BELOW_KEYS keys);
* k64-one: 64-key tiles at the same registers, one program an SM: what the tile alone changes;
* k64-two: 64-key tiles with the registers a thread cut to 104 for the consumers and 80 at launch (two programs'
  12 warps fit an SM's 65,536: 2 x 384 x 80), two programs an SM on the persistent grid (the plan with the
  causal mask below GLUON_TWO_PROGRAMS_BELOW_KEYS keys since this round).

A row's "auto" names the form the plan runs there now. --lengths times other lengths (written to
attention_head_dim_64_<lengths>.json).

Every form's output is checked against a float64 reference at the check shapes (NaN-poisoned outputs, ragged
lengths, more keys than queries and the reverse, grouped-query heads, a key mask with a batch that sees no key)
before anything is timed, and on the first head of every timed shape. Timing: twelve alternating rounds of short
triton.testing.do_bench runs a shape (the medians of the rounds; the L2 flushed), at attention-fwd's head-dim-64
shapes (bf16, B x S = 16,384, 32 heads, S = 512 / 1,024 / 2,048 / 4,096 / 8,192 / 16,384, causal and not); cuDNN
after them (do_bench median of three). GPU time. A tuning instrument, not evidence.

The first output kept in notes/probes (round attention-head-dim-64) was taken over 130bf09, before the plan took
these tiles and before the kernel took them as launch parameters: its k64 forms were kernels/attention_gluon.py's
text with BLOCK_N and the registers replaced, launched with 1 or 2 x the SMs' count of programs, and its "gluon"
is today's k128-one (then the Gluon plan at every length).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.attention import attention_fwd, gluon_preferred, plan_attention  # noqa: E402
from kernels.reference_attention import attention_float64  # noqa: E402
from probes.attention_forms import (  # noqa: E402
    ALTERNATING_CLOCK,
    alternating_rounds,
    cudnn_forward,
    draw_inputs,
    median_of_three_us,
    rel_error,
)
from probes.harness import add_row, environment, write_output  # noqa: E402

QUESTION = ("At head dim 64, do 64-key tiles with two programs an SM hide the exponentials that one program an SM "
            "cannot?")
CANDIDATES = ("triton: the Triton forward as its plan launches it",
              "k128-one: the Gluon forward with 128-key tiles, one program an SM",
              "k64-one: the Gluon forward with 64-key tiles, one program an SM",
              "k64-two: the Gluon forward with 64-key tiles and 104 registers a consumer thread, two programs an SM",
              "cuDNN through SDPA")
SHAPES = ("checks: head dim 64, bf16 and fp16, causal and not, ragged lengths, more keys than queries and the "
          "reverse, grouped-query heads, a key mask; timed: head dim 64, bf16, B x S = 16,384, 32 heads, S = 512 / "
          "1,024 / 2,048 / 4,096 / 8,192 / 16,384, causal and not")
OUTPUTS = {"attention-head-dim-64": ("notes/probes/2026-11-28-h200-attention-head-dim-64.json",
                                  "notes/probes/2026-11-28-h200-attention-head-dim-64-3000.json")}

HEAD_DIM, HEADS = 64, 32
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
ROUNDS = 12
TOLERANCE = 2e-2  # bf16 / fp16 output against float64, norm-wise
# (batch, heads, kv heads, seq_q, seq_k, dtype, causal, key mask)
CHECKS = ((2, 4, 4, 1000, 1500, torch.bfloat16, False, False), (2, 4, 4, 1000, 1500, torch.bfloat16, True, False),
          (3, 4, 4, 1500, 900, torch.bfloat16, True, False), (1, 8, 2, 777, 777, torch.float16, True, False),
          (2, 4, 1, 640, 2100, torch.bfloat16, False, True), (2, 4, 4, 700, 700, torch.bfloat16, True, True),
          (1, 3, 3, 33, 5000, torch.bfloat16, True, False), (4, 8, 8, 2048, 2048, torch.bfloat16, False, False))
# form -> (keys a tile, programs an SM) of the Gluon forward's plan at head dim 64
FORMS = {"k128-one": (128, 1), "k64-one": (64, 1), "k64-two": (64, 2)}


def form_plan(name: str, seq_q: int, seq_k: int, causal: bool, dtype=torch.bfloat16):
    """The Gluon forward's plan at these lengths and mask with the form's tiles (persistent as the plan is at
    this mask: one Q buffer without it, two and tiles on demand with it)."""
    block_n, programs = FORMS[name]
    return replace(plan_attention(seq_q, HEAD_DIM, dtype, causal, seq_k=seq_k, impl="gluon"), block_n=block_n,
                   programs_per_sm=programs)


def auto_name(seq: int, causal: bool) -> str:
    """The form "auto" runs at this length and mask (head dim 64, bf16)."""
    if not gluon_preferred(HEAD_DIM, seq, seq, causal):
        return "triton"
    plan = plan_attention(seq, HEAD_DIM, torch.bfloat16, causal, impl="gluon")
    return next(name for name, tiles in FORMS.items() if tiles == (plan.block_n, plan.programs_per_sm))


def _checks(gen) -> list[dict]:
    rows = []
    for batch, heads, kv_heads, seq_q, seq_k, dtype, causal, masked in CHECKS:
        q, k, v, key_mask = draw_inputs(gen, batch, heads, kv_heads, seq_q, seq_k, HEAD_DIM, dtype, masked)
        scale = 1 / math.sqrt(HEAD_DIM)
        ref = attention_float64(q, k, v, causal, scale, key_mask=key_mask)
        plan = plan_attention(seq_q, HEAD_DIM, dtype, causal, seq_k=seq_k, impl="gluon")
        o_plan, lse_plan = attention_fwd(q, k, v, causal, scale, plan, key_mask=key_mask)
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, HEAD_DIM], "dtype": str(dtype), "causal": causal,
               "key_mask": masked, "plan_rel_error": rel_error(o_plan, ref)}
        for name in FORMS:
            o = torch.full_like(q, float("nan"))
            lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
            attention_fwd(q, k, v, causal, scale, form_plan(name, seq_q, seq_k, causal, dtype), out=o, lse=lse,
                          key_mask=key_mask)
            finite = torch.isfinite(lse_plan)
            row[name] = {"rel_error": rel_error(o, ref), "nan_in_output": bool(o.isnan().any()),
                         "lse_matches_plan": bool(torch.equal(finite, torch.isfinite(lse))
                                                  and torch.equal(lse[~finite], lse_plan[~finite])
                                                  and torch.allclose(lse[finite], lse_plan[finite], atol=1e-4,
                                                                     rtol=0))}
            row[name]["ok"] = (row[name]["rel_error"] < TOLERANCE and not row[name]["nan_in_output"]
                               and row[name]["lse_matches_plan"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def compile_report() -> list[dict]:
    """Each form's kernel compiled for sm_90 (no GPU): registers, spills, shared memory, programs an SM."""
    from kernels.attention_gluon import compile_for_sm90
    from probes.compiled import occupancy, ptxas_registers

    rows = []
    for name in FORMS:
        for causal in (False, True):
            plan = form_plan(name, 4096, 4096, causal)
            compiled = compile_for_sm90(HEAD_DIM, torch.bfloat16, causal, False, plan.num_stages, persistent=True,
                                        prefetch_q=plan.prefetch_q, on_demand=plan.on_demand, block_n=plan.block_n,
                                        programs_per_sm=plan.programs_per_sm)
            registers, spilled = ptxas_registers(compiled, 90)
            shared = compiled.metadata.shared
            rows.append({"form": name, "causal": causal, "registers": registers, "spilled_bytes": spilled,
                         "shared_bytes": shared,
                         "programs_an_sm": occupancy(registers, compiled.metadata.num_warps, shared).programs})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=".")
    parser.add_argument("--compile", action="store_true", help="each form compiled for sm_90 (the CPU), no GPU")
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS, help="the timed lengths")
    args = parser.parse_args()
    if args.compile:
        for row in compile_report():
            print(json.dumps(row))
        return 0
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lengths = tuple(args.lengths)
    output = out_dir / ("attention_head_dim_64.json" if lengths == LENGTHS
                        else f"attention_head_dim_64_{'_'.join(map(str, lengths))}.json")
    result = {**environment(), "question": QUESTION, "shapes": SHAPES, "clock": ALTERNATING_CLOCK,
              "lengths": list(lengths),
              "forms": {name: {"block_n": f[0], "programs_an_sm": f[1]} for name, f in FORMS.items()}}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261130)
    result["checks"] = _checks(gen)
    result["all_ok"] = all(r[name]["ok"] for r in result["checks"] for name in FORMS)
    write_output(output, result)
    if not result["all_ok"]:
        print("a form failed its checks: nothing timed", flush=True)
        return 1
    result["experiment"] = []
    for causal in (False, True):
        for seq in lengths:
            batch = 16384 // seq
            q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for _ in range(3))
            scale = 1 / math.sqrt(HEAD_DIM)
            ref = attention_float64(q[:1, :1], k[:1, :1], v[:1, :1], causal, scale)
            plans = {"triton": plan_attention(seq, HEAD_DIM, torch.bfloat16, causal, seq_k=seq, impl="triton"),
                     **{name: form_plan(name, seq, seq, causal) for name in FORMS}}
            runs = {name: (lambda plan=plan: attention_fwd(q, k, v, causal, scale, plan)[0])
                    for name, plan in plans.items()}
            row = {"batch": batch, "seq": seq, "causal": causal,
                   "auto": auto_name(seq, causal),
                   "rel_error": {name: rel_error(run()[:1, :1], ref) for name, run in runs.items()}}
            row.update(alternating_rounds(runs, ROUNDS))
            row["cudnn"] = {"us": median_of_three_us(cudnn_forward(q, k, v, causal, scale))}
            for name in runs:
                row[f"cudnn_over_{name}"] = row["cudnn"]["us"] / row[name]["us"]
            add_row(output, result, row)
            del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
