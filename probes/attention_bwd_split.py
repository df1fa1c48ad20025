"""GPU probe: where does the Gluon backward lose with grouped-query heads, in the dK/dV kernel or the dQ kernel?
(kernels/attention_bwd_gluon.py, kernels/attention_bwd_q_gluon.py)

    python probes/attention_bwd_split.py OUT_DIR     (writes OUT_DIR/attention_bwd_split.json)

At 8,192 and 16,384 keys the lab's backward reaches 0.86-0.87x cuDNN with 16 heads of their own, but 0.79-0.80x
with 16 query heads over 4 key/value heads, without the mask (H200, attention-bwd run 20261128T095836Z), where
cuDNN runs both at the same rate: the lab's grouped backward is the slower, by about 9%. Its dK/dV program walks
the query tiles of all four query heads that share its key/value head, so there are a quarter as many programs,
each four times as long; its dQ kernel reads each shared K/V head once a query head, as with heads of their own.

The probe times the backward's three launches apart, each as kernels/attention.py's attention_bwd launches it
(the delta pass, the Gluon dK/dV kernel, the Gluon dQ kernel), and the whole backward, at the same shapes with
and without grouped heads: head dim 128, bf16, B x S = 16,384, 16 query heads over 16 or 4 key/value heads,
S = 8,192 and 16,384, causal and not. Twelve alternating rounds of short triton.testing.do_bench runs a shape
(the medians of the rounds; the L2 flushed); cuDNN's backward after them, do_bench median of three. Before any
timing, each shape's gradients from the separate launches must equal attention_bwd's bit for bit. GPU time. A
tuning instrument, not evidence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.attention import attention_bwd  # noqa: E402
from kernels.attention_bwd_gluon import attention_bwd_kv_gluon  # noqa: E402
from kernels.attention_bwd_q_gluon import attention_bwd_q_gluon  # noqa: E402
from probes.attention_forms import (  # noqa: E402
    ALTERNATING_CLOCK,
    alternating_rounds,
    backward_case,
    cudnn_backward_us,
    delta_pass,
)
from probes.harness import add_row, environment, write_output  # noqa: E402

QUESTION = "Where does the Gluon backward lose with grouped-query heads, in the dK/dV kernel or the dQ kernel?"
CANDIDATES = ("delta: the delta pass alone", "kv: the Gluon dK/dV kernel alone", "q: the Gluon dQ kernel alone",
              "whole: kernels/attention.py's attention_bwd (all three)", "cuDNN's backward through SDPA")
SHAPES = ("head dim 128, bf16, B x S = 16,384, 16 query heads over 16 or 4 key/value heads, S = 8,192 / 16,384, "
          "causal and not")
OUTPUTS = {"attention-bwd-split": ("notes/probes/2026-11-28-h200-attention-bwd-split.json", )}

HEAD_DIM, HEADS = 128, 16
ROUNDS = 12
TIMED = tuple((16384 // s, kv, s, c) for s in (8192, 16384) for c in (False, True) for kv in (16, 4))


def launches(q, k, v, o, lse, do, causal: bool, scale: float, plans) -> dict:
    """name -> a call of one of attention_bwd's three launches (as it launches them), and of the whole."""
    kv_plan, q_plan = plans
    delta = delta_pass(o, do)  # for the other two, before either is timed
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse = lse.contiguous()

    def run_delta():
        return delta_pass(o, do, delta)

    def run_kv():
        attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal, scale, None, kv_plan.num_stages)
        return dk, dv

    def run_q():
        attention_bwd_q_gluon(q, k, v, do, lse, delta, dq, causal, scale, None, q_plan.num_stages)
        return dq

    return {"delta": run_delta, "kv": run_kv, "q": run_q,
            "whole": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale, plans)}


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "attention_bwd_split.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES, "clock": ALTERNATING_CLOCK,
              "experiment": []}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261131)
    for batch, kv_heads, seq, causal in TIMED:
        q, k, v, o, lse, do, scale, plans, _ = backward_case(gen, batch, HEADS, kv_heads, seq, seq, HEAD_DIM, causal)
        runs = launches(q, k, v, o, lse, do, causal, scale, plans)
        dk, dv = runs["kv"]()
        dq = runs["q"]()
        whole = runs["whole"]()
        row = {"batch": batch, "heads": HEADS, "kv_heads": kv_heads, "seq": seq, "causal": causal,
               "equal_to_whole": all(torch.equal(a, b) for a, b in zip((dq, dk, dv), whole))}
        del whole
        if not row["equal_to_whole"]:
            print(json.dumps(row), flush=True)
            result["experiment"].append(row)
            write_output(output, result)
            return 1
        row.update(alternating_rounds(runs, ROUNDS))
        row["cudnn"] = {"us": cudnn_backward_us(q, k, v, do, causal, scale)}
        row["parts_over_whole"] = sum(row[n]["us"] for n in ("delta", "kv", "q")) / row["whole"]["us"]
        row["cudnn_over_whole"] = row["cudnn"]["us"] / row["whole"]["us"]
        add_row(output, result, row)
        del q, k, v, o, do
    return 0


if __name__ == "__main__":
    sys.exit(main())
