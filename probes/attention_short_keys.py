"""GPU probe: with O in 16-byte stores, does the Gluon forward now beat the Triton forward at 512-1,024 keys?
(kernels/attention_choice.py's GLUON_AUTO_MIN_KEYS)

    python probes/attention_short_keys.py OUT_DIR     (writes OUT_DIR/attention_short_keys.json)

"auto" took the Gluon forward at head dim 128 from 2,048 keys on, causal and not, and never at head dim 64:
measured on the H100 on 2026-11-26 it ran 0.93-1.09x the Triton forward at 1,024 keys, and at head dim 64
0.79-0.97x everywhere. Its deficit at short lengths is the part paid once a query tile, which weighs most where a
tile has few keys, and round attention-o-store found most of that part in how O was stored: from the
accumulator's layout, 32 four-byte stores a thread. With O converted to rows of eight elements first (16-byte
stores), that part shrank by 20-30 µs a call at attention-fwd's 2,048-4,096 keys. This probe asks where the
rule's threshold should lie: the Triton forward and the Gluon forward, each as its plan launches it
(plan_attention by impl, with or without the causal mask), at attention-fwd's shapes (bf16, B x S = 16,384, 16
heads, S = 512 / 1,024 / 2,048, head dims 128 and 64, causal and not), in twelve alternating rounds of short
triton.testing.do_bench runs a shape (the medians of the rounds; the L2 flushed), cuDNN after them (do_bench
median of three). Every output is checked against a float64 reference on its first head first; a row also names
the forward "auto" takes there now (kernels/attention_choice.py's gluon_preferred). GPU time. A tuning
instrument, not evidence.

The output kept in notes/probes (round attention-short-keys) was taken over 705cbdf with O's 16-byte stores
applied, before the rule moved and before the causal plan took its tiles on demand: there the causal Gluon plan
is one program a query tile (its rows' gluon_persistent is false), the unmasked one the persistent grid with one
Q buffer, and the rows carry no gluon_on_demand or auto field. The second (round attention-short-keys-on-demand,
H200) ran this file over 130bf09: the causal Gluon plan took its tiles on demand, at head dim 64 too.
"""

from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.attention_gluon as AG  # noqa: E402
from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from kernels.attention_choice import gluon_preferred  # noqa: E402
from kernels.reference_attention import attention_float64  # noqa: E402
from probes.attention_forms import (  # noqa: E402
    ALTERNATING_CLOCK,
    alternating_rounds,
    cudnn_forward,
    median_of_three_us,
    rel_error,
)
from probes.harness import add_row, environment  # noqa: E402

QUESTION = "With O in 16-byte stores, does the Gluon forward now beat the Triton forward at 512-1,024 keys?"
CANDIDATES = ("triton: the Triton forward (kernels/attention_kernels.py) as its plan launches it",
              "gluon: the Gluon forward (kernels/attention_gluon.py) as its plan launches it, with or without the "
              "causal mask",
              "cuDNN through SDPA")
SHAPES = "bf16, B x S = 16,384, 16 heads, S = 512 / 1,024 / 2,048, head dims 128 and 64, causal and not"
OUTPUTS = {"attention-short-keys": ("notes/probes/2026-11-28-h100-attention-short-keys.json", ),
           "attention-short-keys-on-demand": ("notes/probes/2026-11-28-h200-attention-short-keys-on-demand.json", )}

LENGTHS = (512, 1024, 2048)
HEAD_DIMS = (128, 64)
HEADS = 16
ROUNDS = 12
TOLERANCE = 2e-2  # bf16 output against float64, norm-wise


def plans(seq: int, head_dim: int, causal: bool) -> dict:
    """The Triton and the Gluon forward's plans at B x S = 16,384 of this length, head dim and mask."""
    return {impl: plan_attention(seq, head_dim, torch.bfloat16, causal, seq_k=seq, impl=impl)
            for impl in ("triton", "gluon")}


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "attention_short_keys.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES,
              "gluon_o_in_16_byte_stores": "store_layout" in inspect.getsource(AG._consumer.fn),
              "clock": ALTERNATING_CLOCK, "experiment": []}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261129)
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            for seq in LENGTHS:
                batch = 16384 // seq
                q, k, v = (torch.randn(batch, HEADS, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                       generator=gen) for _ in range(3))
                scale = 1 / math.sqrt(head_dim)
                by_impl = plans(seq, head_dim, causal)
                ref = attention_float64(q[:1, :1], k[:1, :1], v[:1, :1], causal, scale)
                row = {"batch": batch, "seq": seq, "head_dim": head_dim, "causal": causal,
                       "gluon_persistent": by_impl["gluon"].persistent, "gluon_on_demand": by_impl["gluon"].on_demand,
                       "auto": "gluon" if gluon_preferred(head_dim, seq, seq, causal) else "triton"}
                runs = {}
                for impl, plan in by_impl.items():
                    out = attention_fwd(q, k, v, causal, scale, plan)[0]
                    err = rel_error(out[:1, :1], ref)
                    row[impl] = {"rel_error": err}
                    if err < TOLERANCE:
                        runs[impl] = (lambda plan=plan: attention_fwd(q, k, v, causal, scale, plan)[0])
                for impl, timed in (alternating_rounds(runs, ROUNDS) if runs else {}).items():
                    row[impl].update(timed)
                row["cudnn"] = {"us": median_of_three_us(cudnn_forward(q, k, v, causal, scale))}
                if len(runs) == 2:
                    row["triton_over_gluon"] = row["triton"]["us"] / row["gluon"]["us"]
                for impl in runs:
                    row[f"cudnn_over_{impl}"] = row["cudnn"]["us"] / row[impl]["us"]
                add_row(output, result, row)
                del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
