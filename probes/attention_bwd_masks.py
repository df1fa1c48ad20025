"""GPU probe: does the Gluon backward run faster when only the tiles that hold a hidden pair go through the
masks? (kernels/attention_bwd_gluon.py, kernels/attention_bwd_q_gluon.py)

    python probes/attention_bwd_masks.py OUT_DIR [--gqa-only]     (writes OUT_DIR/attention_bwd_masks.json)

The Gluon forward sends a query tile's key tiles through the masked softmax only where some pair is hidden (the
first tile and those from n_full on); the tiles between skip the comparisons and selects. The backward's two
kernels masked every tile instead: with the causal mask the dK/dV kernel compared each key with each query and
selected P on every query tile it walked, and the dQ kernel selected P on every key tile, the causal comparison
and the key bound (keys < seq_k) included, with the mask or without. That is two or three more instructions a
score beside the exponential and its FMA, in the consumers' chain between the score product and the products
that take P. The backward with the causal mask ran 0.80-0.83x cuDNN from 3,000 keys where without the mask it
ran 0.86-0.91x (notes/attention.md, "Where the attention targets stand (2026-11-28)").

The plan now takes each tile's masks behind a test the warpgroup takes once a tile: in the dK/dV kernel the
causal comparison only where the tile's first query sees fewer keys than the warpgroup's last key needs; in the
dQ kernel the masks only on the last key tile (keys past seq_k) and where the tile's last key lies past the
warpgroup's first row's causal limit. With a key mask every tile is masked as before. The other forms are the
plan's kernels with that change taken out: "every-tile" both kernels' text as before (every tile masked),
"every-tile-kv" the dK/dV kernel's alone (the dQ kernel the plan's), each written to a temporary folder and
imported from there. Selecting P where every pair is visible returns P itself, so their dQ, dK and dV must equal
the plan's bit for bit at every check shape (NaN-poisoned gradients) before anything is timed.

Timing: the plan's backward (kernels/attention.py's attention_bwd with the Gluon plans: the delta pass, then the
two kernels) and the same three launches with each form's kernels, in twelve alternating rounds of short
triton.testing.do_bench runs a shape (the medians of the rounds; the L2 flushed), at attention-bwd's
head-dim-128 shapes (bf16, B x S = 16,384, 16 heads, S = 2,048 / 3,000 / 4,096 / 8,192, causal and not; 16
query heads over 4 key/value heads, causal, at 8,192 and 16,384); cuDNN's backward (SDPA) after them, do_bench
median of three. --gqa-only times the grouped-query shapes alone (attention_bwd_masks_gqa.json);
--head-dim-64 checks and times at head dim 64 instead (32 heads; causal at 1,024 / 3,000 / 4,096 keys and 3,000
without the mask; attention_bwd_masks_d64.json). GPU time. A tuning instrument, not evidence.

The first output kept in notes/probes (round attention-bwd-masks) was taken over 130bf09, before the plan took
the change: the plan then masked every tile and the forms were the candidates, "edge-masks" (both kernels
changed: today's plan) and "edge-masks-dq" (the dQ kernel alone: today's every-tile-kv), with plan_over_* the
candidates' gains. Its grouped-query rows are missing: cuDNN's backward was called without enable_gqa and
refused them, after the other eight rows were written.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels.attention_bwd_q_gluon as AQ  # noqa: E402
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
from probes.harness import add_row, environment, module_from_source, replace_once, write_output  # noqa: E402

QUESTION = ("Does the Gluon backward run faster when only the tiles that hold a hidden pair go through the "
            "masks?")
CANDIDATES = ("the plan (kernels/attention.py's backward, Gluon kernels: the masks only on tiles that cross the "
              "causal diagonal or the last key, every tile under a key mask)",
              "every-tile: the plan's dK/dV and dQ kernels with every tile masked, as before",
              "every-tile-kv: the dK/dV kernel alone with every tile masked (the dQ kernel the plan's)",
              "cuDNN through SDPA")
SHAPES = ("checks: head dim 128, bf16, causal and not, ragged lengths, more keys than queries and the reverse, 33 "
          "queries over 5,000 keys, grouped-query heads, a key mask; timed: head dim 128, bf16, B x S = 16,384, 16 "
          "heads, S = 2,048 / 3,000 / 4,096 / 8,192, causal and not; 16 heads over 4, causal, S = 8,192 / 16,384")
OUTPUTS = {"attention-bwd-masks": ("notes/probes/2026-11-28-h200-attention-bwd-masks.json",
                                "notes/probes/2026-11-28-h200-attention-bwd-masks-gqa.json",
                                "notes/probes/2026-11-28-h200-attention-bwd-masks-d64.json")}

HEAD_DIM, HEADS = 128, 16
ROUNDS = 12
KV_FILE, Q_FILE = "kernels/attention_bwd_gluon.py", "kernels/attention_bwd_q_gluon.py"
# (batch, heads, kv heads, seq_q, seq_k, causal, key mask)
CHECKS = ((2, 4, 4, 1000, 1500, False, False), (2, 4, 4, 1000, 1500, True, False), (3, 4, 4, 1500, 900, True, False),
          (1, 8, 2, 777, 777, True, False), (1, 3, 3, 33, 5000, True, False), (2, 4, 4, 1024, 1024, True, False),
          (2, 4, 4, 700, 1300, False, True), (2, 4, 4, 640, 640, True, True), (4, 16, 16, 2048, 2048, False, False))
# (batch, heads, kv heads, seq, causal)
TIMED = tuple((16384 // s, HEADS, HEADS, s, c) for c in (False, True) for s in (2048, 3000, 4096, 8192)) + \
    tuple((16384 // s, HEADS, 4, s, True) for s in (8192, 16384))
# --head-dim-64: attention-bwd's head-dim-64 points (32 heads) where its run at 2641de3 fell or the change bites
TIMED_64 = ((16, 32, 32, 1024, True), (5, 32, 32, 3000, True), (4, 32, 32, 4096, True), (5, 32, 32, 3000, False))

# The change the plan took, as (every-tile text, plan text) pairs a file: the every-tile forms apply them
# backwards, each plan text found exactly once.
CHANGES = {
    KV_FILE: ((
        "            if CAUSAL:  # rows that see no key have lse = -inf and p = inf here; the mask takes them out\n"
        "                p_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)\n",
        "            # Only a tile whose first query sees fewer keys than the warpgroup's last key needs is masked; rows\n"
        "            # that see no key (lse = -inf, p = inf) lie in such tiles alone.\n"
        "            if CAUSAL:\n"
        "                if m_lo + mi * block_m + causal_offset < start_n + WG * wg_n + wg_n - 1:\n"
        "                    p_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)\n"), ),
    Q_FILE: ((
        "        keys = j * block_n + cols\n"
        "        visible = keys < seq_k\n"
        "        if KEY_MASK:\n"
        "            visible = gl.load(mask_base + keys.to(gl.int64) * stride_mk, mask=visible, other=0) != 0\n",
        "        keys = j * block_n + cols\n"
        "        if KEY_MASK:\n"
        "            visible = gl.load(mask_base + keys.to(gl.int64) * stride_mk, mask=keys < seq_k, other=0) != 0\n"), (
        "        seen = visible[None, :]\n"
        "        if CAUSAL:  # rows that see no key have lse = -inf and p = inf here; the masks take them out\n"
        "            seen = seen & (keys[None, :] <= limit[:, None])\n"
        "        p = gl.where(seen, p, 0.0)\n",
        "        if KEY_MASK:\n"
        "            seen = visible[None, :]\n"
        "            if CAUSAL:  # rows that see no key have lse = -inf and p = inf here; the masks take them out\n"
        "                seen = seen & (keys[None, :] <= limit[:, None])\n"
        "            p = gl.where(seen, p, 0.0)\n"
        "        else:\n"
        "            # Only the last key tile (keys past seq_k) and, causal, the tiles whose last key lies past the\n"
        "            # warpgroup's first row's limit are masked; rows that see no key lie in such tiles alone.\n"
        "            crosses = j * block_n + block_n > seq_k\n"
        "            if CAUSAL:\n"
        "                crosses = crosses | (j * block_n + block_n - 1 > start_m + WG * wg_m + (seq_k - seq_q))\n"
        "            if crosses:\n"
        "                seen = (keys < seq_k)[None, :]\n"
        "                if CAUSAL:\n"
        "                    seen = seen & (keys[None, :] <= limit[:, None])\n"
        "                p = gl.where(seen, p, 0.0)\n"), ),
}


def every_tile_source(where: str) -> str:
    """The module `where` (KV_FILE or Q_FILE) with every tile masked, as before the plan took the change."""
    text = (ROOT / where).read_text(encoding="utf-8")
    for every_tile, plan in CHANGES[where]:
        text = replace_once(text, plan, every_tile, where)
    return text


def load_forms(folder: Path) -> dict:
    """form -> (dK/dV module, dQ module): "every-tile" both kernels as before, "every-tile-kv" the dK/dV
    kernel alone (the dQ kernel the plan's)."""
    kv, dq = (module_from_source(folder, name, every_tile_source(where))
              for name, where in (("bwd_kv_every_tile", KV_FILE), ("bwd_q_every_tile", Q_FILE)))
    return {"every-tile": (kv, dq), "every-tile-kv": (kv, AQ)}


def compile_for_sm90(causal: bool, key_mask: bool = False) -> tuple:
    """The every-tile form's two kernels compiled for sm_90 from shapes alone (the CPU checks they build)."""
    folder = Path(tempfile.mkdtemp(prefix="bwd-masks-"))
    try:
        kv, dq = load_forms(folder)["every-tile"]
        return (kv.compile_for_sm90(HEAD_DIM, torch.bfloat16, causal, key_mask),
                dq.compile_for_sm90(HEAD_DIM, torch.bfloat16, causal, key_mask))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _equal(a: tuple, b: tuple) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _checks(forms, gen, head_dim: int = HEAD_DIM) -> list[dict]:
    rows = []
    for batch, heads, kv_heads, seq_q, seq_k, causal, masked in CHECKS:
        q, k, v, o, lse, do, scale, plans, key_mask = backward_case(gen, batch, heads, kv_heads, seq_q, seq_k,
                                                                    head_dim, causal, masked)
        planned = attention_bwd(q, k, v, o, lse, do, causal, scale, plans, key_mask=key_mask)
        ref = attention_backward_float64(q, k, v, do, causal, scale, key_mask=key_mask)
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, head_dim], "causal": causal, "key_mask": masked}
        for name, modules in forms.items():
            got = backward(*modules, q, k, v, o, lse, do, causal, scale, plans, poison=True, key_mask=key_mask)
            row[name] = {"equal_to_plan": _equal(got, planned),
                         "rel_error": {g_name: rel_error(g, r) for g_name, g, r in zip(("dq", "dk", "dv"), got, ref)}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    gqa_only = "--gqa-only" in sys.argv[1:]
    head_dim = 64 if "--head-dim-64" in sys.argv[1:] else HEAD_DIM
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = Path(paths[0] if paths else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / ("attention_bwd_masks_gqa.json" if gqa_only else
                        "attention_bwd_masks_d64.json" if head_dim == 64 else "attention_bwd_masks.json")
    result = {**environment(), "question": QUESTION, "shapes": SHAPES, "clock": ALTERNATING_CLOCK}
    folder = Path(tempfile.mkdtemp(prefix="bwd-masks-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    forms = load_forms(folder)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261130)
    result["checks"] = _checks(forms, gen, head_dim)
    result["all_equal"] = all(r[name]["equal_to_plan"] for r in result["checks"] for name in forms)
    write_output(output, result)
    if not result["all_equal"]:
        print("an every-tile backward differs from the plan: nothing timed", flush=True)
        return 1
    result["experiment"] = []
    for batch, heads, kv_heads, seq, causal in (TIMED_64 if head_dim == 64 else TIMED):
        if gqa_only and kv_heads == heads:
            continue
        q, k, v, o, lse, do, scale, plans, _ = backward_case(gen, batch, heads, kv_heads, seq, seq, head_dim, causal)
        planned = attention_bwd(q, k, v, o, lse, do, causal, scale, plans)
        row = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq, "causal": causal,
               "equal_to_plan": {name: _equal(backward(*modules, q, k, v, o, lse, do, causal, scale, plans), planned)
                                 for name, modules in forms.items()}}
        del planned
        runs = {"plan": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale, plans)}
        for name, modules in forms.items():
            runs[name] = (lambda modules=modules: backward(*modules, q, k, v, o, lse, do, causal, scale, plans))
        row.update(alternating_rounds(runs, ROUNDS))
        row["cudnn"] = {"us": cudnn_backward_us(q, k, v, do, causal, scale)}
        for name in runs:
            if name != "plan":
                row[f"{name}_over_plan"] = row[name]["us"] / row["plan"]["us"]
            row[f"cudnn_over_{name}"] = row["cudnn"]["us"] / row[name]["us"]
        add_row(output, result, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
