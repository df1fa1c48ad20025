"""GPU probe of the decode GEMVs (rmsnorm_linear at M <= 16, int8_linear, int4_linear): correctness at the
experiment shapes, GPU time against the peers on the graph clock, and a sweep over plan candidates. A
tuning instrument, not evidence: the site's figures come only from run records.

    python checks/decode_probe.py OUT_DIR [--quick] [--no-sweep] [--no-compile] [--only rmsnorm,int8,int4]

About 3.5 minutes on an H100 (most of it compiling the sweep's candidates); --no-sweep about half that.
gemlite is timed when importable (pip install --no-deps gemlite tqdm wheels first).

Writes OUT_DIR/decode_probe.json (rewritten after every section) and prints one table per section:

* check: every kernel against a float64 reference into NaN-filled outputs, M in {1, 2, 4, 8, 16}, N in
  {4096, 12288, 14336, 11007} (K = 4096; 11007 is odd and a multiple of no tile).
* time: the lab's public functions and the peers (F.linear alone, F.rms_norm + F.linear eager and through
  torch.compile, tinygemm int4, gemlite int8 / int4 when importable, the previous plan table for
  rmsnorm_linear) at M in {1, 4, 16}, N in {4096, 14336}; % of floor = weight bytes / copy ceiling / time.
* sweep: plan candidates per shape; the best per shape is printed last, beside the table's choice.

Graph clock: 16 calls captured in one CUDA graph, each on its own copy of the weights (together past
max(256 MB, 4 x L2), so no call finds its weights in L2); per-call time = median replay time / 16.
Exits 1 when any check fails; what was measured is written all the same.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import dequant_linear as dl  # noqa: E402
from kernels import reference  # noqa: E402
from kernels import rmsnorm_gemv as rg  # noqa: E402
from kernels._gemv import GemvPlan, choose_split_k, device_sm_count  # noqa: E402
from kernels.quantize import quantize_int4, quantize_int8  # noqa: E402
from kernels.rmsnorm_linear import rmsnorm_linear  # noqa: E402

EPS = 1e-6
GROUP = 128
BF16 = torch.bfloat16
K = 4096
CHECK_M = (1, 2, 4, 8, 16)
CHECK_N = (4096, 12288, 14336, 11007)
TIME_M = (1, 4, 16)
TIME_N = (4096, 14336)
TOLERANCE = {"rmsnorm": 1e-2, "int8": 1e-2, "int4": 1e-2}  # ‖out − ref‖ / ‖ref‖, bf16 outputs
FAILURES: list[str] = []


# --------------------------------------------------------------------------------------------------------
# Clocks and buffers
# --------------------------------------------------------------------------------------------------------


def graph_us(fn, operands: list[tuple], replays: int = 20) -> float:
    calls = (operands * math.ceil(16 / len(operands)))[:max(16, len(operands))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture: compiles, autotuning, workspaces
        for ops in operands:
            fn(*ops)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for ops in calls:
            fn(*ops)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


def copy_ceiling_gbs() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * src.numel() * 4 / statistics.median(times) / 1e6


def n_copies(nbytes: int) -> int:
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (50 << 20)
    return max(2, math.ceil(max(256 << 20, 4 * l2) / nbytes))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def empty_out(x, n):
    return torch.full((x.shape[0], n), float("nan"), dtype=x.dtype, device=x.device)


# --------------------------------------------------------------------------------------------------------
# Weights, peers
# --------------------------------------------------------------------------------------------------------


def make_weights(kind: str, n: int, gemlite_mod) -> dict:
    w = (torch.randn(n, K, device="cuda") / K**0.5).to(BF16)
    if kind == "rmsnorm":
        return {"w": w}
    if kind == "int8":
        q, s = quantize_int8(w)
        out = {"w": q, "s": s}
        if gemlite_mod is not None:
            out["gl"] = gemlite_int8(gemlite_mod, q, s)
        return out
    p, s = quantize_int4(w, GROUP)
    u = reference.unpack_int4_reference(p, GROUP).add_(8)
    out = {"w": p, "s": s}
    if n % 8 == 0:  # tinygemm's packing asks N to be a multiple of 8
        u32 = u.to(torch.int32)
        out["tiny"] = torch.ops.aten._convert_weight_to_int4pack((u32[:, ::2] << 4 | u32[:, 1::2]).to(torch.uint8), 8)
        out["tiny_sz"] = torch.stack([s.t(), torch.zeros_like(s.t())], dim=2).contiguous()
    if gemlite_mod is not None:
        out["gl"] = gemlite_int4(gemlite_mod, u.to(torch.uint8), s)
    return out


def gemlite_int8(gemlite_mod, q, s):
    try:
        return gemlite_mod.helper.A16W8_INT8(device="cuda:0", dtype=BF16).from_weights(q, scales=s.float()[:, None])
    except Exception as exc:  # noqa: BLE001 - a peer that cannot take these weights is a finding
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def gemlite_int4(gemlite_mod, u, s):
    try:
        zeros = torch.full_like(s, 8.0)
        return gemlite_mod.helper.A16Wn(device="cuda:0", dtype=BF16).from_weights(
            u, s, zeros, W_nbits=4, group_size=GROUP)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def import_gemlite():
    try:
        import gemlite  # noqa: F401
        import gemlite.helper  # noqa: F401

        return gemlite, getattr(gemlite, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        return None, f"not importable: {type(exc).__name__}: {str(exc)[:160]}"


def old_rmsnorm_plan(m: int, n: int) -> GemvPlan:
    """The plan table before this probe's kernels (FMA at M = 1 only, no evict-first, 264 programs)."""
    if m == 1:
        bn, bk, w, st, form, bm = 8, 1024, 4, 3, "fma", 1
    else:
        bn, bk, w, st, form, bm = 64, 256, 4, 4, "dot", 16
    split = choose_split_k(-(-n // bn), -(-K // bk), min_programs=264, min_steps=4, max_split=8)
    return GemvPlan(form, bm, bn, bk, split, w, st, form == "dot", False)


# --------------------------------------------------------------------------------------------------------
# Providers: name -> fn(x, weights dict, gamma) for each op
# --------------------------------------------------------------------------------------------------------


def providers(kind: str, m: int, n: int, compiled, gemlite_ok: bool) -> list[tuple[str, object]]:
    out = []
    if kind == "rmsnorm":
        out.append(("lab rmsnorm_linear", lambda x, d, g: rmsnorm_linear(x, d["w"], g, EPS)))
        out.append(("F.linear alone", lambda x, d, g: F.linear(x, d["w"])))
        out.append(("torch eager pair", lambda x, d, g: reference.rmsnorm_linear_reference(x, d["w"], g, EPS)))
        if compiled is not None:
            out.append(("torch.compile pair", lambda x, d, g: compiled(x, d["w"], g, EPS)))
        old = old_rmsnorm_plan(m, n)
        out.append(("lab previous table", lambda x, d, g, p=old: rg.rmsnorm_gemv_fwd(
            x, d["w"], g, EPS, p, torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device))))
    elif kind == "int8":
        out.append(("lab int8_linear", lambda x, d, g: dl.int8_linear(x, d["w"], d["s"])))
        out.append(("torch _weight_int8pack_mm", lambda x, d, g: torch.ops.aten._weight_int8pack_mm(x, d["w"], d["s"])))
        if gemlite_ok:
            out.append(("gemlite A16W8", lambda x, d, g: d["gl"](x)))
    else:
        out.append(("lab int4_linear", lambda x, d, g: dl.int4_linear(x, d["w"], d["s"], GROUP)))
        out.append(("tinygemm int4", lambda x, d, g: torch.ops.aten._weight_int4pack_mm(x, d["tiny"], GROUP, d["tiny_sz"])))
        if gemlite_ok:
            out.append(("gemlite A16W4", lambda x, d, g: d["gl"](x)))
    return out


def reference_for(kind, x, d, g):
    if kind == "rmsnorm":
        return reference.rmsnorm_linear_float64(x, d["w"], g, EPS)
    if kind == "int8":
        return reference.int8_linear_reference(x.double(), d["w"], d["s"].double())
    return reference.int4_linear_reference(x.double(), d["w"], d["s"].double(), GROUP)


def weight_bytes(kind: str, n: int) -> int:
    return {"rmsnorm": 2 * n * K, "int8": n * K + 2 * n, "int4": n * K // 2 + 2 * n * (K // GROUP)}[kind]


# --------------------------------------------------------------------------------------------------------
# Sweep candidates
# --------------------------------------------------------------------------------------------------------


def _split(bn: int, bk: int, n: int, per_sm: int, steps: int, sms: int, max_split: int = 16) -> int:
    return choose_split_k(-(-n // bn), -(-K // bk), min_programs=per_sm * sms, min_steps=steps, max_split=max_split)


def candidates(kind: str, m: int, n: int, sms: int) -> list[GemvPlan]:
    """Tiles around the table's: (BLOCK_N, BLOCK_K, warps, stages) per form, evict-first on and off, split-K
    by the rule (two programs an SM) and twice that."""
    bm_fma = max(1, 1 << (m - 1).bit_length())
    bm_dot = max(16, bm_fma)
    plans = []
    if kind == "rmsnorm":
        fma_tiles = [(8, 1024, 4, 3), (4, 512, 4, 3), (4, 512, 4, 6), (8, 512, 4, 4), (2, 1024, 4, 4), (16, 512, 8, 3)]
        dot_tiles = [(128, 128, 4, 3), (128, 128, 4, 4), (128, 64, 4, 6), (256, 64, 8, 4), (256, 128, 8, 3),
                     (128, 128, 8, 4), (64, 128, 4, 6)]
        if m <= 4:
            for bn, bk, w, st in fma_tiles:
                if bm_fma * bn * bk // (32 * w) <= 128:
                    plans.append(GemvPlan("fma", bm_fma, bn, bk, _split(bn, bk, n, 2, 4, sms, 8), w, st, False, False))
        if m > 1:
            for bn, bk, w, st in dot_tiles:
                plans.append(GemvPlan("dot", bm_dot, bn, bk, _split(bn, bk, n, 2, 4, sms, 8), w, st, True, False))
    elif kind == "int8":
        if m <= 4:
            for bn, bk, w, st in [(8, 512, 4, 6), (8, 1024, 4, 3), (4, 512, 4, 6), (16, 512, 8, 4), (8, 256, 4, 8)]:
                if bm_fma * bn * bk // (32 * w) <= 128:
                    plans.append(GemvPlan("fma", bm_fma, bn, bk, _split(bn, bk, n, 2, 2, sms), w, st, True, False))
        for bn, bk, w, st in [(64, 128, 4, 5), (128, 128, 4, 4), (128, 128, 8, 4), (64, 128, 4, 7), (256, 128, 8, 3),
                              (128, 64, 4, 6)]:
            plans.append(GemvPlan("dot", bm_dot, bn, bk, _split(bn, bk, n, 2, 2, sms), w, st, True, False))
    else:
        for bn, bk, w, st in [(64, 128, 4, 4), (128, 128, 4, 4), (128, 128, 8, 4), (256, 128, 8, 4), (64, 128, 4, 6),
                              (128, 128, 4, 6), (64, 128, 2, 4), (64, 256, 4, 3), (128, 256, 8, 3)]:
            plans.append(GemvPlan("dot", bm_dot, bn, bk, _split(bn, bk, n, 2, 2, sms), w, st, True, False))
    extra = []
    for p in plans[:4]:
        extra.append(replace(p, split_k=min(16, p.split_k * 2)))
        extra.append(replace(p, evict_first=True))
    return plans + extra


def plan_name(p: GemvPlan) -> str:
    return (f"{p.form}{p.block_m}-n{p.block_n}k{p.block_k}-s{p.split_k}-w{p.num_warps}-st{p.load_stages}"
            f"{'' if p.evict_first else '-noevict'}")


def run_plan(kind: str, plan: GemvPlan, n: int, poison: bool = False):
    """The plan's launcher; `poison` fills the output with NaN first (checks only: the fill is a kernel)."""
    def out(x):
        return empty_out(x, n) if poison else torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)

    if kind == "rmsnorm":
        return lambda x, d, g: rg.rmsnorm_gemv_fwd(x, d["w"], g, EPS, plan, out(x))
    if kind == "int8":
        return lambda x, d, g: dl.int8_linear_fwd(x, d["w"], d["s"], plan, out(x))
    return lambda x, d, g: dl.int4_linear_fwd(x, d["w"], d["s"], GROUP, plan, out(x))


def table_plan(kind: str, m: int, n: int, sms: int) -> GemvPlan:
    if kind == "rmsnorm":
        return rg.plan_rmsnorm_gemv(m, n, K, BF16, sms)
    return dl.plan_dequant_linear(8 if kind == "int8" else 4, m, n, K, GROUP, sms)


# --------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------


def section_check(out: dict, kinds, quick: bool) -> None:
    rows = []
    sms = device_sm_count(torch.device("cuda"))
    for kind in kinds:
        for n in (CHECK_N[:1] + CHECK_N[-1:]) if quick else CHECK_N:
            d = make_weights(kind, n, None)
            g = (1 + 0.1 * torch.randn(K, device="cuda")).to(BF16)
            for m in CHECK_M:
                x = torch.randn(m, K, device="cuda").to(BF16)
                ref = reference_for(kind, x, d, g)
                plan = table_plan(kind, m, n, sms)
                y = run_plan(kind, plan, n, poison=True)(x, d, g)
                public = providers(kind, m, n, None, False)[0][1](x, d, g)
                err = max(rel_err(y, ref), rel_err(public, ref))
                ok = bool(torch.isfinite(y).all()) and err <= TOLERANCE[kind]
                if not ok:
                    FAILURES.append(f"check {kind} M={m} N={n}: rel_err {err:.2e}")
                rows.append({"op": kind, "M": m, "N": n, "K": K, "rel_err": err, "ok": ok, "plan": plan.as_dict()})
            del d
    out["check"] = rows
    bad = [r for r in rows if not r["ok"]]
    print(f"check: {len(rows) - len(bad)}/{len(rows)} within tolerance" + "".join(f"\n  FAIL {r}" for r in bad))


def _time_rows(kind, n, ms, provs_for, out_rows, ceiling, gemlite_mod, extra=None):
    nb = weight_bytes(kind, n)
    ws = [make_weights(kind, n, gemlite_mod) for _ in range(n_copies(nb))]
    g = (1 + 0.1 * torch.randn(K, device="cuda")).to(BF16)
    floor = nb / ceiling / 1e3
    for m in ms:
        x = torch.randn(m, K, device="cuda").to(BF16)
        ref = reference_for(kind, x, ws[0], g)
        for name, fn in provs_for(m):
            row = {"op": kind, "provider": name, "M": m, "N": n, "K": K, "floor_us": round(floor, 2)}
            if extra:
                row.update(extra(name))
            try:
                if isinstance(ws[0].get("gl", None), str) and name.startswith("gemlite"):
                    raise RuntimeError(ws[0]["gl"])
                row["rel_err"] = rel_err(fn(x, ws[0], g), ref)
                row["us"] = round(graph_us(fn, [(x, d, g) for d in ws]), 2)
                row["pct_floor"] = round(100 * floor / row["us"], 1)
            except Exception as exc:  # noqa: BLE001 - a provider that cannot run here is a finding
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            out_rows.append(row)
    del ws
    torch.cuda.empty_cache()


def section_time(out: dict, kinds, compiled, gemlite_mod, ns) -> None:
    rows = []
    for kind in kinds:
        for n in ns:
            _time_rows(kind, n, TIME_M, lambda m, kind=kind, n=n: providers(kind, m, n, compiled, gemlite_mod is not None),
                       rows, out["copy_ceiling_gbs"], gemlite_mod)
    out["time"] = rows
    print_time(rows)


def print_time(rows) -> None:
    print(f"\n{'op':8} {'M':>3} {'N':>6} {'provider':28} {'µs':>8} {'%floor':>7} {'vs best peer':>12}")
    for key in sorted({(r["op"], r["N"], r["M"]) for r in rows}):
        group = [r for r in rows if (r["op"], r["N"], r["M"]) == key and "us" in r]
        peers = [r["us"] for r in group if not r["provider"].startswith("lab") and r["provider"] != "F.linear alone"]
        best = min(peers) if peers else float("nan")
        for r in [r for r in rows if (r["op"], r["N"], r["M"]) == key]:
            if "us" not in r:
                print(f"{r['op']:8} {r['M']:>3} {r['N']:>6} {r['provider']:28} {r.get('error', '')[:60]}")
                continue
            print(f"{r['op']:8} {r['M']:>3} {r['N']:>6} {r['provider']:28} {r['us']:8.2f} {r['pct_floor']:6.1f}% "
                  f"{best / r['us']:11.2f}x")


def section_sweep(out: dict, kinds, ns) -> None:
    rows = []
    sms = device_sm_count(torch.device("cuda"))
    for kind in kinds:
        for n in ns:
            table = {m: table_plan(kind, m, n, sms) for m in TIME_M}

            def provs(m, kind=kind, n=n):
                plans = [table[m]] + [p for p in candidates(kind, m, n, sms) if p != table[m]]
                return [(("table " if i == 0 else "") + plan_name(p), run_plan(kind, p, n)) for i, p in enumerate(plans)]

            _time_rows(kind, n, TIME_M, provs, rows, out["copy_ceiling_gbs"], None)
    out["sweep"] = rows
    print(f"\n{'op':8} {'M':>3} {'N':>6} {'table plan':42} {'µs':>7} {'best candidate':42} {'µs':>7}")
    for key in sorted({(r["op"], r["N"], r["M"]) for r in rows}):
        group = [r for r in rows if (r["op"], r["N"], r["M"]) == key and "us" in r and r["rel_err"] <= 1e-2]
        table_rows = [r for r in group if r["provider"].startswith("table ")]
        if not group:
            continue
        best = min(group, key=lambda r: r["us"])
        t = table_rows[0] if table_rows else {"provider": "?", "us": float("nan")}
        print(f"{key[0]:8} {key[2]:>3} {key[1]:>6} {t['provider'][6:]:42} {t['us']:7.2f} {best['provider']:42} {best['us']:7.2f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--quick", action="store_true", help="N = 4096 only in time and sweep; two N in check")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--only", default="rmsnorm,int8,int4")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    kinds = tuple(args.only.split(","))
    gemlite_mod, gemlite_status = import_gemlite()
    out = {"device": torch.cuda.get_device_name(0), "sm_count": device_sm_count(torch.device("cuda")),
           "torch": torch.__version__, "gemlite": gemlite_status, "copy_ceiling_gbs": copy_ceiling_gbs()}
    import triton

    out["triton"] = triton.__version__
    print(json.dumps({k: v for k, v in out.items()}))
    path = out_dir / "decode_probe.json"
    ns = TIME_N[:1] if args.quick else TIME_N
    compiled = None if args.no_compile else torch.compile(reference.rmsnorm_linear_reference, dynamic=False)
    sections = [("check", lambda: section_check(out, kinds, args.quick)),
                ("time", lambda: section_time(out, kinds, compiled, gemlite_mod, ns))]
    if not args.no_sweep:
        sections.append(("sweep", lambda: section_sweep(out, kinds, ns)))
    for name, run in sections:
        try:
            run()
        except Exception:  # noqa: BLE001 - keep what the other sections measure
            FAILURES.append(f"section {name} raised:\n{traceback.format_exc()}")
            print(FAILURES[-1], flush=True)
        out["failures"] = FAILURES
        path.write_text(json.dumps(out, indent=1))
    print("\nfailures:", FAILURES or "none")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
