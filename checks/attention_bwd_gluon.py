"""GPU check of the Gluon dK/dV kernel (kernels/attention_bwd_gluon.py) on Hopper: correctness, then timings.

    python checks/attention_bwd_gluon.py OUT_DIR [--variants]

1. correctness, in a child process (a hang or a crash there cannot take the timings with it): the backward
   with the Gluon dK/dV kernel (dQ Triton's), then with both Gluon kernels (delta stays Triton's), against float64 (tests/test_attention.py's
   bounds): causal and not, head dims 64 and 128, bf16 and fp16, grouped heads, lengths 1, 17, 127, 1000 and
   2049, more queries than keys and more keys than queries, the key mask with a batch that sees no key,
   outputs poisoned with NaN; dQ equal to the Triton backward's bit for bit where its kernel is Triton's.
2. timings, in a second child: the whole backward (delta, dK/dV, dQ) with both Gluon kernels, with the Gluon
   dK/dV and Triton's dQ, and all Triton's, and cuDNN's SDPA backward, bf16, B·S = 16,384, H·D = 2,048, S in {1024, 2048, 4096, 8192} at
   head dim 128 and {1024, 4096} at 64, causal and not; triton.testing.do_bench (L2 flushed before every
   repetition), median ms, TFLOP/s (10·B·H·S²·D, halved when causal: 2.5 forward products' worth) and the
   ratios to cuDNN; the dK/dV kernel alone, Gluon and Triton, beside them.

Writes OUT_DIR/attention_bwd_gluon.json and prints a table last. Exits 1 if a check failed or a child did not
finish.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from _phases import CaseLog, attention_timing_inputs, run_phase

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

#        (batch, heads, kv_heads, seq_q, seq_k, head_dim), causal, dtype name
CASES = [
    ((2, 4, 2, 1000, 1000, 128), False, "bfloat16"),
    ((2, 4, 2, 1000, 1000, 128), True, "bfloat16"),
    ((1, 2, 2, 1, 1, 128), True, "bfloat16"),
    ((1, 2, 1, 2049, 2049, 64), True, "bfloat16"),
    ((1, 2, 1, 2049, 2049, 64), False, "float16"),
    ((1, 4, 2, 300, 100, 64), True, "bfloat16"),  # causal rows that see no key
    ((1, 2, 2, 100, 300, 128), True, "float16"),
    ((2, 2, 1, 127, 127, 64), False, "float16"),
    ((2, 2, 1, 17, 17, 128), True, "float16"),
    ((2, 8, 2, 256, 256, 128), False, "bfloat16"),
]
# dK/dV launch variants (stages, queries a tile, (consumer, loader) registers) checked and timed beside the plan
# with --variants: the earlier register split (224 / 40: more spills at head dim 128), 32-query tiles (no spills),
# deeper rings.
VARIANTS = {"r224": (2, 64, (224, 40)), "m32": (2, 32, (240, 24)), "m32_s3": (3, 32, (240, 24)),
            "m32_s4": (4, 32, (240, 24))}
TIMED = [(s, d, c) for d in (128, 64) for s in ((1024, 2048, 4096, 8192) if d == 128 else (1024, 4096))
         for c in (False, True)]


def _kv_variant(stages: int, block_m: int, regs: tuple, *args) -> None:
    """The Gluon dK/dV kernel launched with another tile and register split: the module's plan constants are
    swapped for the launch and put back (each combination compiles its own kernel)."""
    from kernels import attention_bwd_gluon as kv

    saved = kv.BLOCK_M, kv.CONSUMER_REGS, kv.LOADER_REGS
    kv.BLOCK_M, (kv.CONSUMER_REGS, kv.LOADER_REGS) = block_m, regs
    try:
        kv.attention_bwd_kv_gluon(*args, stages=stages)
    finally:
        kv.BLOCK_M, kv.CONSUMER_REGS, kv.LOADER_REGS = saved


def _plans(head_dim: int, kv_impl: str, q_impl: str = "triton"):
    import torch

    from kernels.attention import plan_attention

    return (plan_attention(1024, head_dim, torch.bfloat16, False, "backward_kv", impl=kv_impl),
            plan_attention(1024, head_dim, torch.bfloat16, False, "backward_q", impl=q_impl))


def _correctness(out: Path) -> int:
    import torch
    from test_attention import _check_backward, _draw, _inputs

    from kernels.attention import attention_bwd, attention_fwd

    gen = torch.Generator()
    gen.manual_seed(20261127)
    log = CaseLog(out)
    record = log.record

    def backward(shape, causal, dtype, key_mask=None):
        q, k, v = _inputs(shape, dtype, "cuda", gen)
        do = _draw(q.shape, dtype, "cuda", gen)
        scale = 1 / math.sqrt(shape[-1])
        o, lse = attention_fwd(q, k, v, causal, scale, key_mask=key_mask, impl="triton")
        triton_grads = attention_bwd(q, k, v, o, lse, do, causal, scale, key_mask=key_mask)
        kv_only = tuple(torch.full_like(t, math.nan) for t in (q, k, v))
        attention_bwd(q, k, v, o, lse, do, causal, scale, _plans(shape[-1], "gluon"), out=kv_only, key_mask=key_mask)
        _check_backward(kv_only, q, k, v, do, causal, key_mask=key_mask)
        assert torch.equal(kv_only[0], triton_grads[0]), "dQ differs from the Triton backward's"
        grads = tuple(torch.full_like(t, math.nan) for t in (q, k, v))
        attention_bwd(q, k, v, o, lse, do, causal, scale, _plans(shape[-1], "gluon", "gluon"), out=grads,
                      key_mask=key_mask)
        _check_backward(grads, q, k, v, do, causal, key_mask=key_mask)
        assert torch.equal(grads[1], kv_only[1]) and torch.equal(grads[2], kv_only[2]), "dK, dV changed with dQ's kernel"
        if "--variants" in sys.argv:
            delta = (o.float() * do.float()).sum(-1).contiguous()
            for name, (stages, block_m, regs) in VARIANTS.items():
                dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)
                _kv_variant(stages, block_m, regs, q, k, v, do, lse.contiguous(), delta, dk, dv, causal, scale, key_mask)
                try:
                    _check_backward((triton_grads[0], dk, dv), q, k, v, do, causal, key_mask=key_mask)
                except AssertionError as e:
                    raise AssertionError(f"variant {name}: {e}") from None
        return grads

    for shape, causal, dtype_name in CASES:
        record(f"backward {shape} causal={causal} {dtype_name}",
               lambda shape=shape, causal=causal, dtype=getattr(torch, dtype_name): backward(shape, causal, dtype))
    for head_dim, causal in ((128, False), (64, True), (128, True)):
        def masked(head_dim=head_dim, causal=causal):
            mask = torch.rand(3, 333, generator=gen) > 0.35
            mask[1, 150:] = False
            mask[2] = False
            grads = backward((3, 2, 1, 200, 333, head_dim), causal, torch.bfloat16, mask.cuda())
            assert all(bool((g[2] == 0).all()) for g in grads), "a batch that sees no key has nonzero gradients"
        record(f"key mask D={head_dim} causal={causal}", masked)
    return 0 if log.all_passed() else 1


def _timings(out: Path) -> int:
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention import attention_bwd, attention_fwd
    from kernels.attention_bwd_gluon import attention_bwd_kv_gluon

    rows = []
    for seq, head_dim, causal in TIMED:
        batch, heads, (q, k, v, do) = attention_timing_inputs(seq, head_dim, 4)
        scale = 1 / math.sqrt(head_dim)
        o, lse = attention_fwd(q, k, v, causal, scale)
        flops = 10 * batch * heads * seq * seq * head_dim // (2 if causal else 1)
        kv_flops = 8 * batch * heads * seq * seq * head_dim // (2 if causal else 1)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        delta = (o.float() * do.float()).sum(-1)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        row = {"S": seq, "D": head_dim, "causal": causal, "B": batch, "H": heads}
        runs = {
            "gluon": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale, _plans(head_dim, "gluon", "gluon")),
            "gluon_kv": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale, _plans(head_dim, "gluon")),
            "triton": lambda: attention_bwd(q, k, v, o, lse, do, causal, scale),
            "cudnn": lambda: torch.autograd.grad(ref, leaves, do, retain_graph=True),
            "gluon_kv_only": lambda: attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal, scale),
        }
        if "--variants" in sys.argv:
            for name, (stages, block_m, regs) in VARIANTS.items():
                runs[f"{name}_kv_only"] = (lambda stages=stages, block_m=block_m, regs=regs: _kv_variant(
                    stages, block_m, regs, q, k, v, do, lse, delta, dk, dv, causal, scale))
        for name, fn in runs.items():
            try:
                fn()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                row[name] = {"ms": ms, "tflops": (kv_flops if name.endswith("kv_only") else flops) / ms / 1e9}
            except Exception as e:
                row[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        for name in ("gluon", "gluon_kv", "triton"):
            if "ms" in row[name] and "ms" in row["cudnn"]:
                row[f"{name}_vs_cudnn"] = row["cudnn"]["ms"] / row[name]["ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(rows, indent=1))
    return 0


def _child(phase: str, out_dir: Path, timeout_s: int) -> tuple[int | None, str]:
    return run_phase(__file__, phase, out_dir, timeout_s, sys.argv[2:])


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--phase":
        out_dir = Path(sys.argv[3])
        phase = {"correctness": _correctness, "timings": _timings}[sys.argv[2]]
        return phase(out_dir / f"{sys.argv[2]}_bwd.json")
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch

    report = {"device": torch.cuda.get_device_name(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    status = 0
    for phase, timeout_s in (("correctness", 330), ("timings", 250)):
        code, tail = _child(phase, out_dir, timeout_s)
        path = out_dir / f"{phase}_bwd.json"
        report[phase] = {"exit": code, "tail": tail, "rows": json.loads(path.read_text()) if path.is_file() else []}
        status |= code != 0
        print(f"== {phase}: exit {code}")
    (out_dir / "attention_bwd_gluon.json").write_text(json.dumps(report, indent=1))
    checks = report["correctness"]["rows"]
    print(f"correctness: {sum(r['ok'] for r in checks)} of {len(checks)} cases passed")
    for r in checks:
        if not r["ok"]:
            print("  FAILED", r["case"], r["error"][:300])
    names = ("gluon", "gluon_kv", "triton", "cudnn", "gluon_kv_only")
    if "--variants" in sys.argv:
        names += tuple(f"{name}_kv_only" for name in VARIANTS)
    print("    S    D causal | " + " ".join(f"{n:>13}" for n in names) + " TFLOP/s | gluon/cudnn triton/cudnn")
    for r in report["timings"]["rows"]:
        t = " ".join(f"{r[n].get('tflops', float('nan')):13.0f}" for n in names)
        print(f"{r['S']:5d} {r['D']:4d} {str(r['causal']):>6} | {t}         | "
              f"{r.get('gluon_vs_cudnn', float('nan')):11.2f} {r.get('triton_vs_cudnn', float('nan')):12.2f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
