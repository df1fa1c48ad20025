"""GPU check of the Gluon attention forward (kernels/attention_gluon.py) on Hopper: correctness, then timings.

    python checks/attention_gluon.py OUT_DIR [--variants]

1. correctness, in a child process (a hang or a crash there cannot take the timings with it): the Gluon
   forward against float64 (tests/test_attention.py's bounds) over causal and not, head dims 64 and 128,
   bf16 and fp16, grouped heads, batch > 1, lengths 1, 127, 1000 and 2049, more queries than keys, the
   key mask with a batch that sees no key, outputs poisoned with NaN; gradients through the Triton
   backward from the Gluon forward's lse, which must equal the Triton forward's within 2e-5.
2. timings, in a second child: Gluon, Triton and cuDNN's SDPA forward, bf16, B·S = 16,384 tokens, H·D =
   2,048, S in {1024, 4096}, D in {64, 128}, causal and not; triton.testing.do_bench (L2 flushed before
   every repetition), median ms, TFLOP/s (4·B·H·S²·D, halved when causal) and ratios to cuDNN.

Writes OUT_DIR/attention_gluon.json (what ran, every check, every timing, the device and its clocks) and
prints a table last. Exits 1 if a check failed or a child did not finish. About 1-2 minutes on an H100.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from _phases import CaseLog, attention_timing_inputs, run_phase

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CORRECTNESS_TIMEOUT_S = int(os.environ.get("CHECK_CORRECTNESS_S", 200))
TIMING_TIMEOUT_S = int(os.environ.get("CHECK_TIMING_S", 200))
#         (batch, heads, kv_heads, seq_q, seq_k, head_dim), causal, dtype name
FORWARD_CASES = [
    ((2, 4, 2, 1000, 1000, 128), False, "bfloat16"),
    ((2, 4, 2, 1000, 1000, 128), True, "bfloat16"),
    ((1, 2, 2, 1, 1, 128), True, "bfloat16"),
    ((1, 2, 1, 2049, 2049, 64), True, "bfloat16"),
    ((1, 2, 1, 2049, 2049, 64), False, "bfloat16"),
    ((1, 4, 2, 300, 100, 64), True, "bfloat16"),  # causal rows that see no key
    ((1, 2, 2, 100, 300, 128), True, "bfloat16"),
    ((2, 2, 1, 127, 127, 64), False, "float16"),
    ((2, 2, 1, 17, 17, 128), True, "float16"),
    ((2, 2, 2, 256, 256, 128), False, "float16"),
]
MASK_CASES = [(128, False), (64, True)]
# --variants, the persistent plan only: more query tiles than an H100 or H200 has SMs (132), so every program
# walks several, causal ones of every length; fewer keys than queries; and a key mask over many tiles.
PERSISTENT_CASES = [
    ((4, 8, 2, 2049, 2049, 128), True, "bfloat16"),
    ((4, 8, 2, 2049, 2049, 128), False, "bfloat16"),
    ((3, 16, 4, 1500, 1700, 64), True, "float16"),
    ((8, 8, 8, 777, 300, 128), True, "bfloat16"),
]
GRAD_CASES = [((2, 4, 2, 333, 333, 128), True, "bfloat16"), ((1, 2, 2, 200, 200, 64), False, "float16")]
TIMED = [(s, d, c) for d in (64, 128) for s in (1024, 4096) for c in (False, True)]
# --variants: Gluon plans beside the default (ping-pong consumers, other ring depths), two more lengths at
# head dim 128, CUDA-graph timings (no host work between launches) beside do_bench's, and the correctness
# cases again under ping-pong.
VARIANTS = "--variants" in sys.argv
if VARIANTS:
    TIMED = [(s, d, c) for d in (64, 128) for s in ((1024, 4096) if d == 64 else (1024, 2048, 4096, 8192))
             for c in (False, True)]
    sys.argv.remove("--variants")


def _variant_plans(head_dim: int) -> dict:
    from dataclasses import replace

    from kernels.attention import plan_attention

    base = plan_attention(4096, head_dim, __import__("torch").bfloat16, False, impl="gluon")
    deeper = {64: 4, 128: 3}[head_dim]
    plans = {"gluon_pp": replace(base, pingpong=True), "gluon_persist": replace(base, persistent=True),
             "gluon_es": replace(base, exp_split=True), "gluon_es_persist": replace(base, exp_split=True, persistent=True)}
    if head_dim == 128:
        plans |= {f"gluon_s{deeper}": replace(base, num_stages=deeper),
                  f"gluon_pp_s{deeper}": replace(base, num_stages=deeper, pingpong=True)}
    return plans


def _correctness(out: Path) -> int:
    import torch
    from test_attention import _check_backward, _check_forward, _draw, _inputs

    from kernels.attention import attention, attention_bwd, attention_fwd

    gen = torch.Generator()
    gen.manual_seed(20261126)
    log = CaseLog(out)
    record = log.record

    def poisoned_forward(q, k, v, causal, scale, key_mask=None):
        o = torch.full_like(q, math.nan)
        lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
        return attention_fwd(q, k, v, causal, scale, out=o, lse=lse, key_mask=key_mask, impl="gluon")

    for shape, causal, dtype_name in FORWARD_CASES:
        def forward(shape=shape, causal=causal, dtype=getattr(torch, dtype_name)):
            q, k, v = _inputs(shape, dtype, "cuda", gen)
            o, lse = poisoned_forward(q, k, v, causal, 1 / math.sqrt(shape[-1]))
            _check_forward(o, lse, q, k, v, causal)
        record(f"forward {shape} causal={causal} {dtype_name}", forward)
    if VARIANTS:  # every variant plan over part of the cases
        for shape, causal, dtype_name in FORWARD_CASES:
            for name, plan in _variant_plans(shape[-1]).items():
                if name != "gluon_persist" and (shape, causal, dtype_name) not in FORWARD_CASES[:7:2] + [FORWARD_CASES[1]]:
                    continue
                def variant(shape=shape, causal=causal, dtype=getattr(torch, dtype_name), plan=plan):
                    q, k, v = _inputs(shape, dtype, "cuda", gen)
                    o = torch.full_like(q, math.nan)
                    lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
                    attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), plan, out=o, lse=lse)
                    _check_forward(o, lse, q, k, v, causal)
                record(f"{name} {shape} causal={causal} {dtype_name}", variant)

    if VARIANTS:
        for shape, causal, dtype_name in PERSISTENT_CASES:
            plan = _variant_plans(shape[-1])["gluon_persist"]

            def persistent(shape=shape, causal=causal, dtype=getattr(torch, dtype_name), plan=plan):
                q, k, v = _inputs(shape, dtype, "cuda", gen)
                o = torch.full_like(q, math.nan)
                lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
                attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), plan, out=o, lse=lse)
                _check_forward(o, lse, q, k, v, causal)
            record(f"gluon_persist {shape} causal={causal} {dtype_name}", persistent)

        def persistent_masked():
            shape = (4, 40, 8, 300, 700, 128)
            q, k, v = _inputs(shape, torch.bfloat16, "cuda", gen)
            mask = torch.rand(4, 700, generator=gen) > 0.35
            mask[1, 150:] = False
            mask[3] = False
            mask = mask.cuda()
            o = torch.full_like(q, math.nan)
            lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
            attention_fwd(q, k, v, True, 1 / math.sqrt(128), _variant_plans(128)["gluon_persist"], out=o, lse=lse,
                          key_mask=mask)
            _check_forward(o, lse, q, k, v, True, key_mask=mask)
            assert torch.equal(o[3], torch.zeros_like(o[3])) and bool((lse[3] == -math.inf).all())
        record("gluon_persist key mask D=128 causal=True", persistent_masked)

    for head_dim, causal in MASK_CASES:
        def masked(head_dim=head_dim, causal=causal):
            shape = (3, 2, 1, 200, 333, head_dim)
            q, k, v = _inputs(shape, torch.bfloat16, "cuda", gen)
            mask = torch.rand(3, 333, generator=gen) > 0.35
            mask[1, 150:] = False
            mask[2] = False
            mask = mask.cuda()
            o, lse = poisoned_forward(q, k, v, causal, 1 / math.sqrt(head_dim), key_mask=mask)
            _check_forward(o, lse, q, k, v, causal, key_mask=mask)
            assert torch.equal(o[2], torch.zeros_like(o[2])) and bool((lse[2] == -math.inf).all())
        record(f"key mask D={head_dim} causal={causal}", masked)

    for shape, causal, dtype_name in GRAD_CASES:
        def grads(shape=shape, causal=causal, dtype=getattr(torch, dtype_name)):
            q, k, v = _inputs(shape, dtype, "cuda", gen)
            do = _draw(q.shape, dtype, "cuda", gen)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            attention(*leaves, causal=causal, impl="gluon").backward(do)
            _check_backward([t.grad for t in leaves], q, k, v, do, causal)
            _, lse = attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), impl="gluon")
            _, lse_t = attention_fwd(q, k, v, causal, 1 / math.sqrt(shape[-1]), impl="triton")
            assert torch.allclose(lse, lse_t, rtol=0, atol=2e-5), "lse differs from the Triton forward's"
        record(f"gradients {shape} causal={causal} {dtype_name}", grads)
    return 0 if log.all_passed() else 1


def _timings(out: Path) -> int:
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention import attention_fwd

    rows = []
    for seq, head_dim, causal in TIMED:
        batch, heads, (q, k, v) = attention_timing_inputs(seq, head_dim, 3)
        flops = 4 * batch * heads * seq * seq * head_dim // (2 if causal else 1)
        scale = 1 / math.sqrt(head_dim)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        row = {"S": seq, "D": head_dim, "causal": causal, "B": batch, "H": heads}
        runs = {"gluon": lambda: attention_fwd(q, k, v, causal, scale, impl="gluon"),
                "triton": lambda: attention_fwd(q, k, v, causal, scale, impl="triton"), "cudnn": cudnn}
        if VARIANTS:
            for name, plan in _variant_plans(head_dim).items():
                runs[name] = lambda plan=plan: attention_fwd(q, k, v, causal, scale, plan)
        for name, fn in runs.items():
            try:
                fn()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100)
                row[name] = {"ms": ms, "tflops": flops / ms / 1e9}
                if VARIANTS and name in ("gluon", "triton", "cudnn"):
                    graph_ms = triton.testing.do_bench_cudagraph(fn, rep=50)
                    row[name] |= {"graph_ms": graph_ms, "graph_tflops": flops / graph_ms / 1e9}
            except Exception as e:
                row[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        for name in ("gluon", "triton"):
            if "ms" in row[name] and "ms" in row["cudnn"]:
                row[f"{name}_vs_cudnn"] = row["cudnn"]["ms"] / row[name]["ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(rows, indent=1))
    return 0


def _child(phase: str, out_dir: Path, timeout_s: int) -> tuple[int | None, str]:
    return run_phase(__file__, phase, out_dir, timeout_s, ["--variants"] if VARIANTS else [])


def _device_facts() -> dict:
    import torch
    import triton

    facts = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
             "torch": torch.__version__, "triton": triton.__version__}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        facts["clocks"] = smi.stdout.strip()
    except Exception as e:
        facts["clocks"] = f"unread: {e}"
    return facts


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--phase":
        out_dir = Path(sys.argv[3])
        if sys.argv[2] == "correctness":
            return _correctness(out_dir / "correctness.json")
        return _timings(out_dir / "timings.json")
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.pop("TRITON_INTERPRET", None)
    report = {"facts": _device_facts(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    status = 0
    for phase, limit in (("correctness", CORRECTNESS_TIMEOUT_S), ("timings", TIMING_TIMEOUT_S)):
        start = time.time()
        code, tail = _child(phase, out_dir, limit)
        report[phase] = {"exit": code, "s": round(time.time() - start, 1), "tail": tail}
        path = out_dir / f"{phase}.json"
        if path.exists():
            report[phase]["rows"] = json.loads(path.read_text())
        status |= code != 0
        print(f"== {phase}: exit {code} in {report[phase]['s']} s", flush=True)
        if code != 0:
            print(tail[-3000:], flush=True)
        (out_dir / "attention_gluon.json").write_text(json.dumps(report, indent=1))
    report["facts_after"] = _device_facts()["clocks"]
    (out_dir / "attention_gluon.json").write_text(json.dumps(report, indent=1))
    print(f"\n{report['facts']['device']} ({report['facts']['clocks']}); do_bench, L2 flushed; bf16 forward")
    for row in report.get("correctness", {}).get("rows", []):
        if not row["ok"]:
            print(f"FAIL {row['case']}: {row['error'][:300]}")
    print(f"correctness: {sum(r['ok'] for r in report['correctness'].get('rows', []))} of "
          f"{len(report['correctness'].get('rows', []))} cases passed")
    print(f"{'S':>5} {'D':>4} {'causal':>6} | {'gluon':>7} {'triton':>7} {'cudnn':>7} TFLOP/s | "
          "gluon/cudnn triton/cudnn")
    for row in report.get("timings", {}).get("rows", []):
        tf = [row[n].get("tflops", float("nan")) for n in ("gluon", "triton", "cudnn")]
        print(f"{row['S']:>5} {row['D']:>4} {str(row['causal']):>6} | {tf[0]:7.0f} {tf[1]:7.0f} {tf[2]:7.0f}         | "
              f"{row.get('gluon_vs_cudnn', float('nan')):11.2f} {row.get('triton_vs_cudnn', float('nan')):12.2f}")
    if VARIANTS:
        print("variants, TFLOP/s (do_bench; graph: CUDA-graph replay, no host work between launches)")
        for row in report.get("timings", {}).get("rows", []):
            cells = [f"{k} {v['tflops']:.0f}" + (f" (graph {v['graph_tflops']:.0f})" if "graph_tflops" in v else "")
                     for k, v in row.items() if isinstance(v, dict) and "tflops" in v]
            print(f"{row['S']} {row['D']} {row['causal']}: " + ", ".join(cells))
    return status


if __name__ == "__main__":
    sys.exit(main())
