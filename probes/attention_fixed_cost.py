"""GPU probe: what the Gluon forward's fixed cost a query tile is made of (kernels/attention_gluon.py).

    python probes/attention_fixed_cost.py OUT_DIR     (writes OUT_DIR/attention_fixed_cost.json)

The forward's records (notes/attention.md, "Where the forward's gap sits") put its whole deficit to cuDNN at
2,048-4,096 keys in the part of its time that does not grow with the keys: 45 µs a call more than cuDNN's
without the mask, about 2.9 µs a query tile, while each key tile costs it less than cuDNN. This probe holds the
query tiles fixed (B x H = 128 or 64 heads of 2,048 queries: 2,048 or 1,024 tiles of 128) and walks the keys
from one tile to 32 (Sk = 128 ... 4,096, no mask, head dim 128, bf16), so T(n) = a + b·n (fitted from 4 key
tiles on) splits each candidate's time into a fixed part a and a cost b a key tile; a / (tiles / SMs) is the
fixed part a query tile's turn on an SM.

Candidates: the plan (one program a query tile), the same kernel on a persistent grid (one program an SM whose
loader fetches the next tile's Q and first keys while the consumers finish the last: what remains of a there is
the consumers' own ramp and epilogue), and cuDNN through SDPA. Every output is checked first against a float64
reference on one head. Timing: the median of three triton.testing.do_bench medians (the L2 flushed between
calls). A tuning instrument, not evidence: the site's figures come only from run records.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from probes.harness import key_tile_fit  # noqa: E402

QUESTION = ("Of the Gluon forward's fixed cost a query tile, how much is the program's launch and first loads, "
            "which a persistent grid hides, and how much the consumers' own ramp and epilogue?")
CANDIDATES = ("the plan: one program a query tile", "the same kernel on a persistent grid (one program an SM)",
              "cuDNN through SDPA")
SHAPES = ("head dim 128, bf16, no mask; 2,048 queries in each of B x 16 heads, B in 8 and 4 (2,048 and 1,024 "
          "query tiles); keys 128, 256, 512, 1,024, 2,048, 4,096")
OUTPUTS = {"attention-fixed-cost": ("notes/probes/2026-11-27-h100-attention-fixed-cost-1.json",
                                    "notes/probes/2026-11-27-h100-attention-fixed-cost-2.json")}

SEQ_Q, HEADS, HEAD_DIM, BF = 2048, 16, 128, torch.bfloat16
KEYS = (128, 256, 512, 1024, 2048, 4096)
BATCHES = (8, 4)
TOLERANCE = 2e-2  # bf16 output against float64, norm-wise
# The line is fitted from 4 key tiles on ("all": every length, kept beside it): with 1 or 2 a program runs
# only its first tile's masked path and its last value product, no steady loop for the line to describe.
FIT_FROM = 4
REPEATS = 3  # do_bench medians a candidate and length; their median is kept


def _reference_error(out: torch.Tensor, q, k, v, scale: float) -> float:
    """Norm-wise relative error of out[0, 0] against float64 softmax(q k^T scale) v on that head."""
    q64, k64, v64 = (t[0, 0].double() for t in (q, k, v))
    ref = torch.softmax(q64 @ k64.T * scale, dim=-1) @ v64
    return float((out[0, 0].double() - ref).norm() / ref.norm())



def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    facts = {"device": torch.cuda.get_device_name(), "sms": props.multi_processor_count, "torch": torch.__version__,
             "triton": triton.__version__, "question": QUESTION, "shapes": SHAPES, "rows": [], "fits": {}}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261127)
    scale = 1 / math.sqrt(HEAD_DIM)
    ok = True
    for batch in BATCHES:
        q = torch.randn(batch, HEADS, SEQ_Q, HEAD_DIM, device="cuda", dtype=BF, generator=gen)
        for seq_k in KEYS:
            k, v = (torch.randn(batch, HEADS, seq_k, HEAD_DIM, device="cuda", dtype=BF, generator=gen)
                    for _ in range(2))
            plan = plan_attention(SEQ_Q, HEAD_DIM, BF, False, seq_k=seq_k, impl="gluon")
            runs = {"plan": lambda p=plan: attention_fwd(q, k, v, False, scale, p)[0],
                    "persistent": lambda p=replace(plan, persistent=True): attention_fwd(q, k, v, False, scale, p)[0]}

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, scale=scale)

            runs["cudnn"] = cudnn
            row = {"batch": batch, "query_tiles": batch * HEADS * SEQ_Q // 128, "seq_k": seq_k,
                   "key_tiles": seq_k // 128}
            for name, fn in runs.items():
                try:
                    err = _reference_error(fn(), q, k, v, scale)
                    row[name] = {"rel_error": err}
                    if not err < TOLERANCE:
                        ok = False
                        row[name]["error"] = f"rel error {err:.3g} over {TOLERANCE}: not timed"
                        continue
                    row[name]["us"] = 1e3 * statistics.median(
                        triton.testing.do_bench(fn, warmup=25, rep=100) for _ in range(REPEATS))
                except Exception as exc:  # noqa: BLE001 - one candidate's failure is its own row
                    ok = False
                    row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            facts["rows"].append(row)
            print(json.dumps(row), flush=True)
        for name in ("plan", "persistent", "cudnn"):
            rows = [r for r in facts["rows"] if r["batch"] == batch]
            for label, fit_from in (("", FIT_FROM), (" all", 0)):
                fit = key_tile_fit(rows, name, props.multi_processor_count, fit_from)
                if fit is not None:
                    facts["fits"][f"{name} B={batch}{label}"] = fit
        del q
    facts["all_correct"] = ok
    (out_dir / "attention_fixed_cost.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts["fits"], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
