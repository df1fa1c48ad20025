"""GPU probe: is the persistent Gluon forward's dearer key tile the cost of its second Q buffer?
(kernels/attention_gluon.py)

    python probes/attention_one_q_buffer.py OUT_DIR     (writes OUT_DIR/attention_one_q_buffer.json)
    python probes/attention_one_q_buffer.py OUT_DIR --experiment-shapes
                                                        (writes OUT_DIR/attention_one_q_buffer_shapes.json)

Round attention-fixed-cost found that the persistent grid pays about 3% more a key tile than the plan, with a
key loop that is the plan's instruction for instruction; round attention-ramp-overlap found a persistent kernel
with one Q buffer (164 KB of shared memory a program, as the plan) paying 4% less a key tile than the plan,
where the persistent grid holds two (197 KB). This probe takes the persistent kernel exactly as built and changes
only the number of Q buffers: with one, the loader brings the next tile's Q once both consumers are done with
the last one's. That kernel is the project's own, launched on the persistent grid with its PERSISTENT flag off
(the flag chooses the Q buffers and nothing else). Same walk as those rounds: 2,048 query tiles (8 x 16 heads of
2,048 queries), head dim 128, bf16, no mask, keys 128 to 4,096; T(n) = a + b·n fitted from 4 key tiles on. Every
candidate's output must equal the plan's bit for bit before it is timed. --experiment-shapes times the same three and
cuDNN at attention-fwd's head-dim-128 shapes instead (B x S = 16,384, 16 heads, S = 2,048-8,192, causal and not) (the median of three
triton.testing.do_bench medians, the L2 flushed between calls: GPU time). A tuning instrument, not evidence: the site's figures come only from run records.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from probes.harness import environment, key_tile_fit  # noqa: E402
from kernels.attention_gluon import MAXNREG, NUM_WARPS, _attention_fwd_gluon_kernel, launch_args  # noqa: E402

QUESTION = "Is the persistent Gluon forward's dearer key tile the cost of its second Q buffer's shared memory?"
CANDIDATES = ("the plan: one program a query tile", "the persistent grid as built (two Q buffers)",
              "the persistent grid with one Q buffer", "cuDNN through SDPA (--experiment-shapes)")
SHAPES = ("head dim 128, bf16, no mask; 8 x 16 heads of 2,048 queries (2,048 query tiles); keys 128-4,096. "
          "--experiment-shapes: 16 heads, B x S = 16,384, S = 2,048-8,192, causal and not")
OUTPUTS = {"attention-one-q-buffer": ("notes/probes/2026-11-27-h200-attention-one-q-buffer.json",
                                    "notes/probes/2026-11-27-h100-attention-one-q-buffer.json",
                                    "notes/probes/2026-11-27-h100-attention-one-q-buffer-shapes.json")}

BATCH, HEADS, SEQ_Q, HEAD_DIM, BF = 8, 16, 2048, 128, torch.bfloat16
KEYS = (128, 256, 512, 1024, 2048, 4096)
FIT_FROM = 4
REPEATS = 3


def one_q_fwd(q, k, v, causal: bool, scale: float, stages: int) -> torch.Tensor:
    """O from kernels/attention_gluon.py's kernel on the persistent grid (one program an SM) with one Q buffer.
    Its PERSISTENT flag chooses the Q buffers and nothing else (every program walks tiles pid, pid + grid, ...
    whatever the grid), so the grid of launch_args' persistent launch with PERSISTENT off is exactly that."""
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    programs = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid, args, meta = launch_args(q, k, v, o, lse, causal, scale, stages, None, False, programs, False)
    _attention_fwd_gluon_kernel[grid](*args, **{**meta, "PERSISTENT": False}, num_warps=NUM_WARPS, maxnreg=MAXNREG)
    return o


def candidates(q, k, v, causal: bool, scale: float, plan) -> dict:
    """One program a query tile, the persistent grid with two Q buffers and the persistent grid with one Q
    buffer: callables giving O (`plan` is plan_attention's; its own grid is one of these)."""
    tile = replace(plan, persistent=False, prefetch_q=True)
    return {"plan": lambda: attention_fwd(q, k, v, causal, scale, tile)[0],
            "persistent": lambda p=replace(tile, persistent=True): attention_fwd(q, k, v, causal, scale, p)[0],
            "persistent-1q": lambda: one_q_fwd(q, k, v, causal, scale, plan.num_stages)}


def checked_times(runs: dict, row: dict) -> bool:
    """Each candidate's output against the plan's (bit for bit), then, if equal, its GPU time into `row`;
    whether every candidate was equal."""
    reference = runs["plan"]()
    ok = True
    for name, fn in runs.items():
        equal = bool(torch.equal(fn(), reference))
        row[name] = {"equal_to_plan": equal}
        if not equal:
            ok = False
            row[name]["error"] = "differs from the plan: not timed"
            continue
        row[name]["us"] = 1e3 * statistics.median(
            triton.testing.do_bench(fn, warmup=25, rep=100) for _ in range(REPEATS))
    return ok


def experiment_shapes(out_dir: Path) -> int:
    """plan, persistent, persistent-1q and cuDNN at attention-fwd's head-dim-128 shapes, causal and not."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    facts = {**environment(), "clock": "GPU time (do_bench, L2 flushed)", "question": QUESTION,
             "shapes": "head dim 128, bf16, 16 heads, B x S = 16,384, S = 2,048 / 4,096 / 8,192, causal and not",
             "rows": []}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261128)
    ok = True
    for causal in (False, True):
        for seq in (2048, 4096, 8192):
            batch = 16384 // seq
            q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=BF, generator=gen)
                       for _ in range(3))
            scale = HEAD_DIM ** -0.5
            plan = plan_attention(seq, HEAD_DIM, BF, causal, seq_k=seq, impl="gluon")

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

            runs = candidates(q, k, v, causal, scale, plan)
            row = {"seq": seq, "batch": batch, "causal": causal}
            ok = checked_times(runs, row) and ok
            row["cudnn"] = {"us": 1e3 * statistics.median(
                triton.testing.do_bench(cudnn, warmup=25, rep=100) for _ in range(REPEATS))}
            for name in runs:
                if "us" in row[name]:
                    row[name]["x_cudnn"] = row["cudnn"]["us"] / row[name]["us"]
            facts["rows"].append(row)
            print(json.dumps(row), flush=True)
    facts["all_correct"] = ok
    (out_dir / "attention_one_q_buffer_shapes.json").write_text(json.dumps(facts, indent=1))
    return 0 if ok else 1


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    if "--experiment-shapes" in sys.argv[2:]:
        return experiment_shapes(out_dir)
    props = torch.cuda.get_device_properties(0)
    facts = {**environment(), "clock": "GPU time (do_bench, L2 flushed)", "question": QUESTION,
             "shapes": SHAPES, "rows": [], "fits": {}}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261127)
    scale = HEAD_DIM ** -0.5
    q = torch.randn(BATCH, HEADS, SEQ_Q, HEAD_DIM, device="cuda", dtype=BF, generator=gen)
    ok = True
    for seq_k in KEYS:
        k, v = (torch.randn(BATCH, HEADS, seq_k, HEAD_DIM, device="cuda", dtype=BF, generator=gen) for _ in range(2))
        plan = plan_attention(SEQ_Q, HEAD_DIM, BF, False, seq_k=seq_k, impl="gluon")
        runs = candidates(q, k, v, False, scale, plan)
        row = {"seq_k": seq_k, "key_tiles": seq_k // 128, "query_tiles": BATCH * HEADS * SEQ_Q // 128}
        ok = checked_times(runs, row) and ok
        facts["rows"].append(row)
        print(json.dumps(row), flush=True)
    for name in ("plan", "persistent", "persistent-1q"):
        fit = key_tile_fit(facts["rows"], name, props.multi_processor_count, FIT_FROM)
        if fit is not None:
            facts["fits"][name] = fit
    facts["all_correct"] = ok
    (out_dir / "attention_one_q_buffer.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts["fits"], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
