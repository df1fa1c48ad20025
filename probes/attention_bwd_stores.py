"""GPU probe: do 16-byte stores of dK, dV and dQ shorten the Gluon backward as they shortened the forward?
(kernels/attention_bwd_gluon.py, kernels/attention_bwd_q_gluon.py)

    python probes/attention_bwd_stores.py OUT_DIR     (writes OUT_DIR/attention_bwd_stores.json)

Round attention-o-store (notes/attention.md) found that the Gluon forward paid for writing O in its consumers'
store instructions: from the accumulator's layout each thread stores pairs of elements, 32 four-byte stores a
thread for a 64 x 128 tile, while converted first to a blocked layout of eight consecutive elements a thread the
same tile leaves in eight 16-byte stores; the forward ran 4-7% faster at 2,048-4,096 keys. The backward's two
Gluon kernels wrote the same way: the dK/dV kernel writes dK and dV (2 x 64 x D a consumer) once its query loop
ends, the dQ kernel dQ once its key loop ends, and a program's store is the last thing it does before its SM can
take the next program.

The plan now converts each of the three outputs to that blocked layout before its store. The other form,
"pair-store", is the plan's two kernels storing each output straight from the accumulator's layout, as they did
before: both modules' text with the conversion taken out (pair_store_source), written to a temporary folder and
imported from there, everything else the plan's. Its dQ, dK and dV must equal the plan's bit for bit at every
check shape before anything is timed.

Timing: the plan's backward (kernels/attention.py's attention_bwd with the Gluon plans: the delta pass, then the
two kernels) and the same three launches with the pair-store kernels, in twelve alternating rounds of short
triton.testing.do_bench runs a shape (the medians of the rounds; the L2 flushed), at attention-bwd's
head-dim-128 shapes (bf16, B x S = 16,384, 16 heads, S = 2,048 / 4,096 / 8,192, causal and not); cuDNN's
backward (SDPA) after them, do_bench median of three. GPU time. A tuning instrument, not evidence.

The output kept in notes/probes (round attention-bwd-stores) was taken over 705cbdf, before the plan took these
stores: the 16-byte form was then the candidate, named "vector-store", and the plan stored pairs. In that output
"plan" is the pair-store form of this file and "vector-store" today's plan; its plan_over_vector_store is the
gain of the 16-byte stores, as pair_store_over_plan is here.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.attention import attention_bwd  # noqa: E402
from kernels.reference_attention import attention_backward_float64  # noqa: E402
from probes.attention_forms import (  # noqa: E402
    ALTERNATING_CLOCK,
    alternating_rounds,
    backward,
    backward_case,
    cudnn_backward_us,
    rel_error,
)
from probes.harness import add_row, environment, replace_once, write_output  # noqa: E402

QUESTION = "Do 16-byte stores of dK, dV and dQ shorten the Gluon backward as they shortened the forward?"
CANDIDATES = ("the plan (kernels/attention.py's backward, Gluon kernels: dK, dV and dQ in 16-byte stores)",
              "pair-store: the plan's dK/dV and dQ kernels with each output stored from the accumulator's layout, "
              "pairs of elements a thread in four-byte stores",
              "cuDNN through SDPA")
SHAPES = ("checks: head dim 128, bf16, causal and not, ragged lengths, 33 queries over 5,000 keys, grouped-query "
          "heads; every timed shape; timed: head dim 128, bf16, B x S = 16,384, 16 heads, S = 2,048 / 4,096 / 8,192, "
          "causal and not")
OUTPUTS = {"attention-bwd-stores": ("notes/probes/2026-11-28-h100-attention-bwd-stores.json", )}

# (batch, heads, kv heads, seq_q, seq_k, causal): head dim 128, bf16, no key mask (the timed kernels' variants)
CHECKS = ((2, 4, 4, 1000, 1500, False), (2, 4, 4, 1000, 1500, True), (3, 4, 4, 1500, 900, True),
          (1, 8, 2, 777, 777, True), (1, 3, 3, 33, 5000, True), (4, 16, 16, 2048, 2048, False))
EXPERIMENT_S = (2048, 4096, 8192)
HEAD_DIM, HEADS = 128, 16
ROUNDS = 12
KV_FILE, Q_FILE = "kernels/attention_bwd_gluon.py", "kernels/attention_bwd_q_gluon.py"
STORE_LAYOUT = ("    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM, HEAD_DIM // 8], [4, 1], "
                "[1, 0])\n")


# The change the plan took, as (pair-store text, plan text) pairs a file: the pair-store form applies them
# backwards, each plan text found exactly once.
CHANGES = {
    KV_FILE: (("", STORE_LAYOUT),
              ("rows_n = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, acc_layout))",
               "rows_n = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, store_layout))"),
              ("d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))",
               "d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))"),
              ("(dk * scale).to(dk_ptr.dtype.element_ty)",
               "gl.convert_layout((dk * scale).to(dk_ptr.dtype.element_ty), store_layout)"),
              ("dv.to(dv_ptr.dtype.element_ty)", "gl.convert_layout(dv.to(dv_ptr.dtype.element_ty), store_layout)")),
    Q_FILE: (("", STORE_LAYOUT),
             ("o_rows = start_m + WG * wg_m + gl.arange(0, wg_m, layout=gl.SliceLayout(1, acc_layout))",
              "o_rows = start_m + WG * wg_m + gl.arange(0, wg_m, layout=gl.SliceLayout(1, store_layout))"),
             ("d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))",
              "d_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))"),
             ("(dq * scale).to(dq_ptr.dtype.element_ty)",
              "gl.convert_layout((dq * scale).to(dq_ptr.dtype.element_ty), store_layout)")),
}


def pair_store_source(where: str) -> str:
    """The module `where` (KV_FILE or Q_FILE) with its outputs stored straight from the accumulator's layout,
    pairs of elements a thread, as before the plan converted them: the same values to the same places."""
    text = (ROOT / where).read_text(encoding="utf-8")
    for pairs, plan in CHANGES[where]:
        text = replace_once(text, plan, pairs, where)
    return text


FORM_MODULES = {"bwd_kv_pair_store": KV_FILE, "bwd_q_pair_store": Q_FILE}


def load_forms(folder: Path) -> tuple:
    """(dK/dV module, dQ module) of the pair-store form (Gluon reads a kernel's source from its file: written
    out)."""
    modules = []
    for name, where in FORM_MODULES.items():
        path = folder / f"{name}.py"
        path.write_text(pair_store_source(where), encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules.append(module)
    return tuple(modules)


def compile_for_sm90(causal: bool, head_dim: int = HEAD_DIM) -> tuple:
    """The pair-store form's two kernels compiled for sm_90 from shapes alone (the CPU checks they build)."""
    folder = Path(tempfile.mkdtemp(prefix="bwd-stores-"))
    try:
        kv, dq = load_forms(folder)
        return kv.compile_for_sm90(head_dim, torch.bfloat16, causal, False), \
            dq.compile_for_sm90(head_dim, torch.bfloat16, causal, False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _equal(a: tuple, b: tuple) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _checks(forms, gen) -> list[dict]:
    rows = []
    for batch, heads, kv_heads, seq_q, seq_k, causal in CHECKS:
        q, k, v, o, lse, do, scale, plans, _ = backward_case(gen, batch, heads, kv_heads, seq_q, seq_k, HEAD_DIM,
                                                             causal)
        planned = attention_bwd(q, k, v, o, lse, do, causal, scale, plans)
        got = backward(*forms, q, k, v, o, lse, do, causal, scale, plans, poison=True)
        ref = attention_backward_float64(q, k, v, do, causal, scale)
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, HEAD_DIM], "causal": causal,
               "equal_to_plan": _equal(got, planned),
               "rel_error": {name: rel_error(g, r) for name, g, r in zip(("dq", "dk", "dv"), got, ref)}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "attention_bwd_stores.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES,
              "clock": ALTERNATING_CLOCK}
    folder = Path(tempfile.mkdtemp(prefix="bwd-stores-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    forms = load_forms(folder)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261129)
    result["checks"] = _checks(forms, gen)
    result["all_equal"] = all(r["equal_to_plan"] for r in result["checks"])
    write_output(output, result)
    if not result["all_equal"]:
        print("the pair-store backward differs from the plan: nothing timed", flush=True)
        return 1
    result["experiment"] = []
    for causal in (False, True):
        for seq in EXPERIMENT_S:
            batch = 16384 // seq
            q, k, v, o, lse, do, scale, plans, _ = backward_case(gen, batch, HEADS, HEADS, seq, seq, HEAD_DIM, causal)
            planned = attention_bwd(q, k, v, o, lse, do, causal, scale, plans)
            row = {"batch": batch, "seq": seq, "causal": causal,
                   "pair_store_equal": _equal(backward(*forms, q, k, v, o, lse, do, causal, scale, plans), planned)}
            del planned
            row.update(alternating_rounds({
                "plan": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale, plans),
                "pair-store": lambda: backward(*forms, q, k, v, o, lse, do, causal, scale, plans)}, ROUNDS))
            row["cudnn"] = {"us": cudnn_backward_us(q, k, v, do, causal, scale)}
            row["pair_store_over_plan"] = row["pair-store"]["us"] / row["plan"]["us"]
            row["cudnn_over_plan"] = row["cudnn"]["us"] / row["plan"]["us"]
            row["cudnn_over_pair_store"] = row["cudnn"]["us"] / row["pair-store"]["us"]
            add_row(output, result, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
