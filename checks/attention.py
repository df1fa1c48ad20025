"""GPU check of kernels/attention.py (CUDA only): correctness against float64, then TFLOP/s against cuDNN and
FlashAttention-2 through torch's SDPA, with two to four launch plans of the lab's kernel per case.

    python checks/attention.py [OUT_DIR] [--budget-s 170] [--forward-tiles | --backward-tiles]
                                        [--seqs 512,1024,16384]

1. Correctness: forward, lse and gradients of small cases (head dims 64 and 128, causal and not, grouped
   heads, ragged and unequal lengths, rows that see no key, bf16 and fp16) against float64 (torch's SDPA
   math path in float64; the lab's float64 reference where causal rows see no key, which SDPA turns to NaN),
   beside torch's own SDPA math error in the same dtype. Bounds as tests/test_attention.py.
2. Every candidate plan is checked on a ragged causal case before it is timed; a plan that fails to compile
   or to match is reported and skipped.
3. Timing at B·S = 16,384 and H·D = 2,048, D = 128, S in {2048, 8192}, causal and not, forward and backward:
   triton.testing.do_bench medians, TFLOP/s = 4·B·H·S²·D (halved causal, ×2.5 backward) over the median.
   The plan table's entry runs first; alternatives follow while the time budget lasts.
4. --forward-tiles: instead of 1-3, the forward alone at head dims 64 and 128 against a wider set of tiles
   (FORWARD_TILES: 64-128 queries by 64-128 keys, 4 or 8 warps, 2-4 stages, with and without tensor
   descriptors and warp specialisation), each checked on the ragged case first. --backward-tiles: the
   backward alike, against BACKWARD_TILES (dK/dV and dQ tiles per head dim). --seqs: other sequence lengths.

A tuning instrument, not evidence: the site's figures come only from tools/build_results.py run records.
Prints a table and writes OUT_DIR/gpu_check_attention.json (OUT_DIR defaults to $OUT, else the current
directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import reference_attention as reference  # noqa: E402
from kernels.attention import (  # noqa: E402
    AttentionPlan,
    attention,
    attention_bwd,
    attention_fwd,
    plan_attention,
    plan_attention_backward,
)

BOUNDS = {torch.bfloat16: (1.6e-2, 2.4e-2), torch.float16: (1.5e-3, 2e-3)}  # as tests/test_attention.py
TORCH_FACTOR = 4.0
TOKENS, WIDTH, HEAD_DIM = 16384, 2048, 128
SEQS = (2048, 8192)
SDPA = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}

#  dtype, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal
CHECKS = [
    (torch.bfloat16, 2, 4, 4, 256, 256, 64, False),
    (torch.bfloat16, 2, 4, 4, 256, 256, 64, True),
    (torch.bfloat16, 2, 4, 4, 256, 256, 128, False),
    (torch.bfloat16, 2, 4, 4, 256, 256, 128, True),
    (torch.bfloat16, 1, 8, 2, 300, 300, 128, True),  # grouped heads, ragged
    (torch.bfloat16, 1, 4, 4, 200, 333, 64, False),  # more keys than queries
    (torch.bfloat16, 1, 4, 2, 200, 333, 64, True),
    (torch.bfloat16, 1, 4, 4, 333, 200, 128, True),  # 133 queries see no key
    (torch.float16, 2, 4, 4, 256, 256, 128, True),
    (torch.bfloat16, 1, 2, 2, 1000, 1000, 128, True),
]

FWD_CANDIDATES = [
    AttentionPlan("forward", 128, 128, 8, 2),
    AttentionPlan("forward", 64, 64, 4, 3),
    AttentionPlan("forward", 128, 64, 8, 3, tma=True),
    AttentionPlan("forward", 128, 64, 8, 3, tma=True, warp_specialize=True),
]
# --forward-tiles: Hopper-shaped forward tiles per head dim beyond FWD_CANDIDATES (the plan table's runs first).
FORWARD_TILES = {
    128: [AttentionPlan("forward", *tile, tma=tma, warp_specialize=ws) for tile, tma, ws in (
        ((128, 128, 8, 2), True, False), ((128, 128, 8, 3), True, False), ((128, 128, 8, 3), True, True),
        ((128, 64, 4, 3), True, False), ((128, 64, 8, 4), True, False), ((128, 64, 8, 2), True, False),
        ((128, 64, 8, 3), True, True), ((64, 128, 4, 3), True, False), ((64, 64, 4, 3), True, False),
        ((128, 128, 8, 2), False, False))],
    64: [AttentionPlan("forward", *tile, tma=tma, warp_specialize=ws) for tile, tma, ws in (
        ((128, 128, 8, 3), True, False), ((128, 128, 8, 4), True, False), ((128, 128, 8, 3), True, True),
        ((128, 64, 4, 3), False, False), ((128, 64, 4, 3), True, False), ((128, 128, 4, 3), True, False),
        ((128, 64, 8, 3), True, False), ((64, 64, 4, 3), False, False), ((64, 128, 4, 4), True, False))],
}
# --backward-tiles: (dK/dV, dQ) tile pairs per head dim (the plan table's runs first).
_KV, _Q = "backward_kv", "backward_q"
BACKWARD_TILES = {
    head_dim: [(AttentionPlan(_KV, *kv), AttentionPlan(_Q, *q)) for kv, q in (
        ((64, 128, 8, 2), (128, 128, 8, 2)), ((64, 128, 8, 2), (128, 64, 8, 2)), ((64, 128, 4, 2), (128, 64, 4, 2)),
        ((64, 128, 8, 3), (128, 128, 8, 3)), ((128, 128, 8, 2), (128, 128, 8, 2)), ((32, 128, 4, 3), (128, 64, 4, 3)),
        ((64, 64, 4, 3), (64, 64, 4, 3)))]
    for head_dim in (64, 128)
}
BWD_CANDIDATES = [
    (AttentionPlan("backward_kv", 64, 128, 8, 2), AttentionPlan("backward_q", 128, 128, 8, 2)),
    (AttentionPlan("backward_kv", 32, 128, 4, 3), AttentionPlan("backward_q", 128, 32, 4, 3)),
    (AttentionPlan("backward_kv", 64, 64, 4, 3), AttentionPlan("backward_q", 64, 64, 4, 3)),
]


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def draw(shape, dtype, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device="cuda", dtype=dtype)


def sdpa_math(q, k, v, causal, do=None):
    """torch's SDPA math path in the inputs' dtype, with the lab's bottom-right causal mask; (O, grads)."""
    leaves = [t.detach().clone().requires_grad_(do is not None) for t in (q, k, v)]
    mask = reference.causal_visible(q.shape[2], k.shape[2], q.device) if causal else None
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    if do is None:
        return o.detach(), None
    o.backward(do)
    return o.detach(), [t.grad for t in leaves]


def correctness(say) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for dtype, b, h, h_kv, s_q, s_k, d, causal in CHECKS:
        name = f"{str(dtype)[6:]} B{b} H{h}/{h_kv} Sq{s_q} Sk{s_k} D{d} {'causal' if causal else 'full'}"
        row = {"check": name}
        try:
            q = draw((b, h, s_q, d), dtype, gen)
            k, v = draw((b, h_kv, s_k, d), dtype, gen), draw((b, h_kv, s_k, d), dtype, gen)
            do = draw((b, h, s_q, d), dtype, gen)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            o = attention(*leaves, causal=causal)
            o.backward(do)
            _, lse = attention_fwd(q, k, v, causal, 1 / math.sqrt(d))
            empty_rows = causal and s_q > s_k
            if empty_rows:  # SDPA gives NaN for rows that see nothing: the lab's float64 reference instead
                ref = reference.attention_float64(q, k, v, causal)
                grads = reference.attention_backward_float64(q, k, v, do, causal)
            else:
                ref, grads = sdpa_math(q.double(), k.double(), v.double(), causal, do.double())
            ours_t, theirs_grads = sdpa_math(q, k, v, causal, do)
            theirs = torch.nan_to_num(ours_t, nan=0.0)
            fwd, torch_fwd = rel(o.detach(), ref), max(rel(theirs, ref), rel(ref.to(dtype), ref))
            bwd = [rel(t.grad, g) for t, g in zip(leaves, grads)]
            torch_bwd = [max(rel(torch.nan_to_num(t, nan=0.0), g), rel(g.to(dtype), g))
                         for t, g in zip(theirs_grads, grads)]
            _, ref_lse = reference.attention_reference(q.double(), k.double(), v.double(), causal, return_lse=True)
            finite = torch.isfinite(ref_lse)
            lse_err = (lse.double() - ref_lse)[finite].abs().max().item()
            lse_inf_ok = bool(torch.equal(torch.isinf(lse), ~finite))
            nan = any(torch.isnan(t).any().item() for t in (o, *(x.grad for x in leaves)))
            ok = (not nan and lse_inf_ok and lse_err < 2e-5 and fwd <= BOUNDS[dtype][0]
                  and fwd <= TORCH_FACTOR * torch_fwd and all(e <= BOUNDS[dtype][1] for e in bwd)
                  and all(e <= TORCH_FACTOR * t for e, t in zip(bwd, torch_bwd)))
            if empty_rows:
                dead = s_q - s_k
                ok = ok and torch.equal(o[:, :, :dead], torch.zeros_like(o[:, :, :dead]))
            row.update(ok=ok, fwd=fwd, torch_fwd=torch_fwd, dq_dk_dv=bwd, torch_dq_dk_dv=torch_bwd, lse_abs=lse_err,
                       nan=nan)
            say(f"{'PASS' if ok else 'FAIL'}  {name}: O {fwd:.2e} (torch {torch_fwd:.2e}), "
                f"dQ/dK/dV {' '.join(f'{e:.2e}' for e in bwd)} (torch {' '.join(f'{e:.2e}' for e in torch_bwd)}), "
                f"lse {lse_err:.1e}")
        except Exception as exc:  # noqa: BLE001 - a failure is a finding; the check goes on
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            say(f"FAIL  {name}: {row['error']}")
        rows.append(row)
    return rows


_MATCHES: dict = {}


def plan_matches(fwd_plan, bwd_plans, causal: bool, head_dim: int = HEAD_DIM) -> str | None:
    """None if the candidate reproduces float64 on a ragged case with grouped heads; else why not."""
    key = (fwd_plan, bwd_plans, causal, head_dim)
    if key not in _MATCHES:
        _MATCHES[key] = _plan_error(fwd_plan, bwd_plans, causal, head_dim)
    return _MATCHES[key]


def _plan_error(fwd_plan, bwd_plans, causal: bool, head_dim: int) -> str | None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = draw((1, 4, 333, head_dim), torch.bfloat16, gen), draw((1, 2, 333, head_dim), torch.bfloat16, gen), \
        draw((1, 2, 333, head_dim), torch.bfloat16, gen)
    do = draw((1, 4, 333, head_dim), torch.bfloat16, gen)
    scale = 1 / math.sqrt(head_dim)
    try:
        o, lse = attention_fwd(q, k, v, causal, scale, fwd_plan)
        if not rel(o, reference.attention_float64(q, k, v, causal)) <= BOUNDS[torch.bfloat16][0]:
            return "forward does not match float64"
        if bwd_plans is not None:
            grads = attention_bwd(q, k, v, o, lse, do, causal, scale, bwd_plans)
            for got, ref in zip(grads, reference.attention_backward_float64(q, k, v, do, causal)):
                if not rel(got, ref) <= BOUNDS[torch.bfloat16][1]:
                    return "backward does not match float64"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def timing(say, deadline: float, head_dim: int = HEAD_DIM, directions=("forward", "backward"),
           fwd_candidates=FWD_CANDIDATES, bwd_candidates=BWD_CANDIDATES, seqs=SEQS) -> list[dict]:
    from triton.testing import do_bench

    rows = []
    for direction in directions:
        for seq in seqs:
            for causal in (False, True):
                batch, heads = TOKENS // seq, WIDTH // head_dim
                flops = 4 * batch * heads * seq**2 * head_dim // (2 if causal else 1)
                flops = flops * 5 // 2 if direction == "backward" else flops
                key = {"direction": direction, "S": seq, "B": batch, "H": heads, "D": head_dim, "causal": causal}
                gen = torch.Generator().manual_seed(seq)
                q, k, v, do = (draw((batch, heads, seq, head_dim), torch.bfloat16, gen) for _ in range(4))
                scale = 1 / math.sqrt(head_dim)
                calls = {}
                for name, backend in SDPA.items():
                    calls[name] = _sdpa_call(backend, q, k, v, do, causal, direction)
                o, lse = attention_fwd(q, k, v, causal, scale)
                if direction == "forward":
                    table = plan_attention(seq, head_dim, torch.bfloat16, causal)
                    for i, plan in enumerate([table, *(p for p in fwd_candidates if p != table)]):
                        calls[f"lab {'table ' if i == 0 else ''}{_plan_name(plan)}"] = (
                            lambda plan=plan: attention_fwd(q, k, v, causal, scale, plan), plan, None)
                else:
                    table = plan_attention_backward(seq, head_dim, torch.bfloat16, causal)
                    for i, plans in enumerate([table, *(p for p in bwd_candidates if p != table)]):
                        label = " + ".join(_plan_name(p) for p in plans)
                        calls[f"lab {'table ' if i == 0 else ''}{label}"] = (
                            lambda plans=plans: attention_bwd(q, k, v, o, lse, do, causal, scale, plans), None, plans)
                best_peer = None
                for name, call in calls.items():
                    row = {**key, "impl": name}
                    if name.startswith("lab") and "table" not in name and time.monotonic() > deadline:
                        row["skipped"] = "time budget spent"
                        rows.append(row)
                        continue
                    fn, fwd_plan, bwd_plans = call if isinstance(call, tuple) else (call, None, None)
                    try:
                        if name.startswith("lab"):
                            why = plan_matches(fwd_plan, bwd_plans, causal, head_dim)
                            if why:
                                raise RuntimeError(f"candidate rejected: {why}")
                        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                        row.update(ms=ms, tflops=flops / ms / 1e9)
                        if name.startswith("sdpa"):
                            best_peer = max(best_peer or 0.0, row["tflops"])
                        elif best_peer:
                            row["vs_best_sdpa"] = row["tflops"] / best_peer
                    except Exception as exc:  # noqa: BLE001
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        torch.cuda.empty_cache()
                    rows.append(row)
                    say(f"{direction:8s} S={seq:5d} {'causal' if causal else 'full  '} {name:48s} "
                        + (f"{row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s"
                           + (f"  {row['vs_best_sdpa']:.2f}x best SDPA" if "vs_best_sdpa" in row else "")
                           if "ms" in row else row.get("error") or row.get("skipped")))
                lab = [r for r in rows if r.get("impl", "").startswith("lab") and "ms" in r
                       and all(r[f] == key[f] for f in key)]
                if lab:
                    fastest = min(lab, key=lambda r: r["ms"])
                    say(f"   fastest lab plan: {fastest['impl']}")
                    rows.append({**key, "fastest_lab_plan": fastest["impl"]})
                del q, k, v, do, o, lse, calls
                torch.cuda.empty_cache()
    return rows


def _plan_name(plan: AttentionPlan) -> str:
    extra = (" tma" if plan.tma else "") + (" ws" if plan.warp_specialize else "")
    return f"{plan.block_m}x{plan.block_n} w{plan.num_warps} s{plan.num_stages}{extra}"


def _sdpa_call(backend, q, k, v, do, causal, direction):
    def forward(*tensors):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(*tensors, is_causal=causal)

    if direction == "forward":
        return lambda: forward(q, k, v)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    try:
        out = forward(*leaves)
    except RuntimeError as exc:
        def refused(exc=exc):
            raise exc
        return refused
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=170.0,
                        help="after this many seconds, alternative plans are skipped (the table's plan always runs)")
    parser.add_argument("--forward-tiles", action="store_true",
                        help="the forward alone, head dims 64 and 128, against FORWARD_TILES (step 4)")
    parser.add_argument("--backward-tiles", action="store_true",
                        help="the backward alone, head dims 64 and 128, against BACKWARD_TILES (step 4)")
    parser.add_argument("--seqs", type=lambda text: tuple(int(v) for v in text.split(",")), default=SEQS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.monotonic()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str) -> None:
        line = f"[{time.monotonic() - started:6.1f}s] {text}"
        print(line, flush=True)
        lines.append(line)

    import triton

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "cudnn": torch.backends.cudnn.version()}
    say(f"{result['device']} · torch {result['torch']} · Triton {result['triton']} · cuDNN {result['cudnn']}")
    if args.forward_tiles or args.backward_tiles:
        result["correctness"] = []
        result["timing"] = []
        for head_dim in (128, 64):
            if args.forward_tiles:
                sweep = dict(directions=("forward",), fwd_candidates=FORWARD_TILES[head_dim])
            else:
                sweep = dict(directions=("backward",), bwd_candidates=BACKWARD_TILES[head_dim])
            deadline = started + args.budget_s * (0.6 if head_dim == 128 else 1.0)
            result["timing"] += timing(say, deadline, head_dim, seqs=args.seqs, **sweep)
    else:
        result["correctness"] = correctness(say)
        result["timing"] = timing(say, started + args.budget_s)
    result["all_correct"] = all(r.get("ok") for r in result["correctness"])
    result["seconds"] = time.monotonic() - started
    result["log"] = lines
    path = out_dir / "gpu_check_attention.json"
    path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    say(f"{'all correctness checks pass' if result['all_correct'] else 'SOME CORRECTNESS CHECKS FAIL'}; wrote {path}")
    return 0 if result["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
