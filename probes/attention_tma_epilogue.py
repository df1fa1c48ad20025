"""GPU probe: does storing O through shared memory with a TMA copy take the Gluon forward's epilogue off its
consumers?

    python probes/attention_tma_epilogue.py OUT_DIR     (writes OUT_DIR/attention_tma_epilogue.json)
    python probes/attention_tma_epilogue.py OUT_DIR --interleaved   (..._interleaved.json)
    python probes/attention_tma_epilogue.py OUT_DIR --knockout      (..._knockout.json)
    python probes/attention_tma_epilogue.py OUT_DIR --where         (..._where.json)

Round attention-phase-stamps (notes/attention.md) found the epilogue the largest phase a query tile pays once:
about 1.3-1.8 µs of a consumer's turn on the H100, where normalising 64 x 128 values and issuing their stores
should take a fraction of that. Every program of the persistent grid reaches its epilogue at about the same time,
and each consumer then issues its 16 KB of O as 32 four-byte stores a thread; if the memory system backs up, the
issue stalls and the consumer waits with the tensor cores idle. The candidate ("tma") writes the normalised O tile
into a shared-memory buffer of its own (16 KB a consumer) and hands it to the TMA engine
(tma.async_copy_shared_to_global), waiting only before it writes the buffer again a tile later; rows past the
sequence are clipped by the descriptor's bounds. Everything else is kernels/attention_gluon.py's kernel, read as
text and compiled from a copy with those lines changed. Its outputs must equal the plan's bit for bit at every
check shape before it is timed.

Timing: the plan, "tma" launched as the plan would launch it, and cuDNN, at attention-fwd's head-dim-128 shapes
(bf16, B x S = 16,384, 16 heads, S = 2,048 / 4,096 / 8,192, causal and not); the median of three
triton.testing.do_bench medians, the L2 flushed (GPU time). A tuning instrument, not evidence.
--knockout adds, to --interleaved's rounds, the plan's kernel with O's stores predicated off at run time (every
epilogue instruction kept, no O byte written; its output is not O): what O's stores cost at most.
--where asks where that cost sits. Beside the plan and the knockout it times, in the same alternating rounds, the
plan's kernel writing O into a batch-stride-0 view ("l2-resident": every batch writes the same H x S x D slab,
8-32 MiB that stay in the L2, so O's bytes barely reach DRAM; timed only, its output is not O) and "pair-store"
(the plan's kernel storing O straight from the accumulator's layout, pairs of elements a thread: 32 four-byte
stores a thread instead of the plan's eight 16-byte ones; checked equal to the plan first). If l2-resident runs
as fast as the knockout, O costs DRAM traffic; if as slow as the plan, the consumers' stores. (Round
attention-o-store ran this mode at 784a481, before the plan took the 16-byte stores: its "vector-store" was
today's plan and its plan today's "pair-store".)
--interleaved times the plan and "tma" in twelve alternating rounds of short do_bench runs instead (the medians
of the rounds), so that a clock drifting through the run, as a power-held GPU's does, favours neither.
"""

from __future__ import annotations

import atexit
import importlib.util
import inspect
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.attention_gluon as AG  # noqa: E402
from kernels._gluon_host import descriptor  # noqa: E402
from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from probes.attention_forms import (  # noqa: E402
    alternating_rounds,
    check_case,
    cudnn_forward,
    median_of_three_us,
    rel_error,
    with_tma_epilogue,
)
from probes.harness import add_row, environment, replace_once, write_output  # noqa: E402

QUESTION = ("Does storing O through shared memory with a TMA copy take the Gluon forward's epilogue off its "
            "consumers?")
CANDIDATES = ("the plan (kernels/attention.py)", "tma: the plan's kernel with O stored through shared memory by TMA",
              "cuDNN through SDPA")
SHAPES = ("checks: head dims 64 and 128, bf16 and fp16, causal and not, grouped-query heads, ragged lengths, a key "
          "mask; timed: head dim 128, bf16, B x S = 16,384, 16 heads, S = 2,048 / 4,096 / 8,192, causal and not")
OUTPUTS = {"attention-tma-epilogue": ("notes/probes/2026-11-28-h100-attention-tma-epilogue.json",
                                      "notes/probes/2026-11-28-h100-attention-tma-epilogue-interleaved.json",
                                      "notes/probes/2026-11-28-h100-attention-tma-epilogue-knockout.json"),
           "attention-o-store": ("notes/probes/2026-11-28-h100-attention-o-store.json", )}

# (batch, heads, kv heads, seq_q, seq_k, head dim, dtype, causal, key mask)
CHECKS = ((2, 4, 4, 1000, 1500, 128, torch.bfloat16, False, False), (2, 4, 4, 1000, 1500, 128, torch.bfloat16, True, False),
          (1, 8, 2, 777, 777, 128, torch.float16, True, False), (2, 4, 1, 640, 2100, 128, torch.bfloat16, False, True),
          (3, 4, 4, 1500, 900, 128, torch.bfloat16, True, False), (2, 4, 4, 1000, 1500, 64, torch.bfloat16, True, False),
          (1, 2, 2, 130, 128, 128, torch.bfloat16, False, False), (8, 16, 4, 1024, 600, 128, torch.bfloat16, False, True),
          (8, 16, 16, 2048, 512, 64, torch.float16, False, False), (4, 16, 16, 2048, 2048, 128, torch.bfloat16, False, False),
          (1, 3, 3, 33, 5000, 128, torch.bfloat16, True, False))
# --where checks its candidate at the timed kernels' own variants only (head dim 128, bf16, no key mask)
WHERE_CHECKS = tuple(c for c in CHECKS if c[5] == 128 and c[6] is torch.bfloat16 and not c[8])
EXPERIMENT_S = (2048, 4096, 8192)
HEAD_DIM, HEADS = 128, 16
TOLERANCE = 2e-2  # bf16 / fp16 output against float64, norm-wise
INTERLEAVED_ROUNDS = 12


def form_source() -> str:
    """A module holding the plan's kernel with the TMA epilogue (module docstring); o_ptr carries O's descriptor."""
    parts = with_tma_epilogue(inspect.getsource(AG._consumer.fn), inspect.getsource(AG._consumer_1.fn),
                              inspect.getsource(AG._attention_fwd_gluon_kernel.fn))
    return "\n\n".join((HEADER, *parts))


def knockout_source() -> str:
    """The plan's kernel with O's stores predicated off at run time (seq_q < 0 never holds): every instruction of
    the epilogue stays, O's bytes never reach memory. Its output is not O; it is timed only, beside the plan."""
    consumer = replace_once(inspect.getsource(AG._consumer.fn), "mask=(o_rows < seq_q)[:, None])",
                        "mask=(o_rows < seq_q)[:, None] & (seq_q < 0))")
    return _with_consumer(consumer)


def pair_store_source() -> str:
    """The plan's kernel storing O straight from the accumulator's layout (pairs of elements a thread, four-byte
    stores), as it did before it converted O to rows of eight (16-byte stores); the same values, same places."""
    consumer = inspect.getsource(AG._consumer.fn)
    consumer = replace_once(consumer, "o_rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, store_layout))",
                        "o_rows = row0 + gl.arange(0, wg_m, layout=gl.SliceLayout(1, o_layout))")
    consumer = replace_once(consumer, "o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))",
                        "o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))")
    consumer = replace_once(consumer, "gl.convert_layout(o.to(o_ptr.dtype.element_ty), store_layout),",
                        "o.to(o_ptr.dtype.element_ty),")
    return _with_consumer(consumer)


def _with_consumer(consumer: str) -> str:
    """A module of the plan's kernel around an edited consumer (same signature)."""
    return "\n\n".join((HEADER, consumer, inspect.getsource(AG._consumer_1.fn),
                         inspect.getsource(AG._attention_fwd_gluon_kernel.fn)))


HEADER = ("from triton.experimental import gluon\nfrom triton.experimental.gluon import language as gl\n"
          "from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,\n"
          "    warpgroup_mma, warpgroup_mma_wait)\n"
          "from kernels.attention_gluon import (_LN2, _consume_tiles, _loader, _pass_turn, _query_tile,\n"
          "    _softmax_tile, _take_turn)\n")
FORMS = {"tma": form_source, "knockout": knockout_source, "pair-store": pair_store_source}
O_DESCRIPTOR = {"tma": True, "knockout": False, "pair-store": False}  # how each form takes O


def load_form(folder: Path, name: str = "tma"):
    """The form as a module (Gluon reads a kernel's source from its file, so it is written out)."""
    path = folder / (name.replace("-", "_") + ".py")
    path.write_text(FORMS[name](), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _launch(module, plan, q, k, v, o, lse, causal, scale, key_mask, o_descriptor: bool = True):
    """The module's kernel launched as the plan launches its own; o_descriptor: O passed as a TMA descriptor."""
    programs = AG._sm_count(q.device.index or 0) if plan.persistent else None
    grid, args, meta = AG.launch_args(q, k, v, o, lse, causal, scale, plan.num_stages, key_mask, plan.pingpong,
                                      programs, plan.exp_split, plan.prefetch_q)
    if o_descriptor:
        args = args[:3] + (descriptor(o, AG.WARPGROUP_M), ) + args[4:]
    module._attention_fwd_gluon_kernel[grid](*args, **meta, num_warps=AG.NUM_WARPS, maxnreg=AG.MAXNREG)


def tma_fwd(module, plan, q, k, v, causal, scale, key_mask=None, o_descriptor: bool = True):
    """(O, lse) of the form, NaN-poisoned first; O contiguous, as the plan's wrapper makes it."""
    o = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    _launch(module, plan, q, k, v, o, lse, causal, scale, key_mask, o_descriptor)
    return o, lse


def compile_for_sm90(head_dim: int, causal: bool, persistent: bool, prefetch_q: bool, form: str = "tma"):
    """The form compiled for sm_90 from shapes alone (the CPU checks it builds)."""
    from kernels._gluon_host import compile_kernel_for_sm90

    folder = Path(tempfile.mkdtemp(prefix="tma-epilogue-"))
    try:
        module = load_form(folder, form)
        q = torch.empty(2, 4, 1000, head_dim, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
        _, args, meta = AG.launch_args(q, q, q, torch.empty_like(q), lse, causal, 0.125, 2, None, False,
                                       132 if persistent else None, False, prefetch_q)
        if O_DESCRIPTOR[form]:
            args = args[:3] + (descriptor(q, AG.WARPGROUP_M), ) + args[4:]
        return compile_kernel_for_sm90(module._attention_fwd_gluon_kernel, args, meta, AG.NUM_WARPS, AG.MAXNREG)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _checks(module, gen, o_descriptor: bool = True, checks: tuple = CHECKS) -> list[dict]:
    rows = []
    for batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, causal, masked in checks:
        case = check_case(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, dtype, causal, masked)
        o, lse = tma_fwd(module, case.plan, case.q, case.k, case.v, causal, case.scale, case.key_mask, o_descriptor)
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, head_dim], "dtype": str(dtype).split(".")[-1],
               "causal": causal, "key_mask": masked, "persistent": case.plan.persistent,
               "prefetch_q": case.plan.prefetch_q,
               "equal_to_plan": bool(torch.equal(o, case.o_plan) and torch.equal(lse, case.lse_plan)),
               "rel_error": rel_error(o, case.ref)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def where(out_dir: Path, result: dict) -> int:
    """--where: the plan, the knockout, the plan's kernel writing an L2-resident O and the pair-store form, in
    alternating rounds at the experiment's shapes, after the pair-store form is checked against the plan."""
    output = out_dir / "attention_tma_epilogue_where.json"
    result.update(shapes="checks: head dim 128, bf16, no key mask (six shapes); timed: " + SHAPES.split("timed: ")[1],
                  question="Where does writing O cost the Gluon forward: in DRAM traffic, or in its consumers' "
                  "store instructions?", clock="GPU time (the median of twelve alternating rounds of short do_bench "
                  "runs, L2 flushed; cuDNN: do_bench median of three)")
    pairs, no_store = _forms("pair-store", "knockout")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261128)
    if not _checked(output, result, pairs, gen, "the pair-store form", o_descriptor=False, checks=WHERE_CHECKS):
        return 1
    scale = 1 / math.sqrt(HEAD_DIM)
    result["experiment"] = []
    for causal, seq, batch, q, k, v, plan, cudnn in _timed_shapes(gen, scale):
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        slab = torch.empty(q.shape[1:], dtype=q.dtype, device=q.device).expand(q.shape)  # batch stride 0

        def launch(module, o):
            _launch(module, plan, q, k, v, o, lse, causal, scale, None, o_descriptor=False)

        o_plan = attention_fwd(q, k, v, causal, scale, plan)[0]
        o_pairs = tma_fwd(pairs, plan, q, k, v, causal, scale, o_descriptor=False)[0]
        row = {"batch": batch, "seq": seq, "causal": causal, "pair_store_equal": bool(torch.equal(o_pairs, o_plan)),
               "l2_resident_slab_mib": slab[0].numel() * slab.element_size() / 2**20}
        o_other = torch.empty_like(q)
        timed = alternating_rounds({"plan": lambda: attention_fwd(q, k, v, causal, scale, plan)[0],
                                    "no-store": lambda: launch(no_store, o_other),
                                    "l2-resident": lambda: launch(AG, slab),
                                    "pair-store": lambda: launch(pairs, o_other)}, INTERLEAVED_ROUNDS)
        row.update(timed)
        row["cudnn"] = {"us": median_of_three_us(cudnn)}
        for name in ("no-store", "l2-resident", "pair-store"):
            row[name]["plan_minus_us"] = row["plan"]["us"] - row[name]["us"]
        add_row(output, result, row)
        del slab, o_other, o_plan, o_pairs
    return 0


def _forms(*names: str) -> list:
    """The named forms as modules, written to a folder removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="attention-forms-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return [load_form(folder, name) for name in names]


def _checked(output: Path, result: dict, module, gen, what: str, **how) -> bool:
    """The form's checks into result (written out); False, and nothing is to be timed, unless every one equals the
    plan bit for bit."""
    result["checks"] = _checks(module, gen, **how)
    result["all_equal"] = all(r["equal_to_plan"] for r in result["checks"])
    write_output(output, result)
    if not result["all_equal"]:
        print(f"{what} differs from the plan: nothing timed", flush=True)
    return result["all_equal"]


def _timed_shapes(gen, scale: float):
    """(causal, S, batch, q, k, v, the plan, cuDNN's call) at attention-fwd's head-dim-128 shapes."""
    for causal in (False, True):
        for seq in EXPERIMENT_S:
            batch = 16384 // seq
            q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for _ in range(3))
            cudnn = cudnn_forward(q, k, v, causal, scale)
            yield causal, seq, batch, q, k, v, plan_attention(seq, HEAD_DIM, torch.bfloat16, causal, seq_k=seq,
                                                              impl="gluon"), cudnn
            del q, k, v


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {**environment(), "question": QUESTION, "shapes": SHAPES,
              "clock": "GPU time (do_bench median of three, L2 flushed)"}
    if "--where" in sys.argv:
        return where(out_dir, result)
    knockout = "--knockout" in sys.argv
    interleaved = knockout or "--interleaved" in sys.argv
    output = out_dir / ("attention_tma_epilogue_knockout.json" if knockout else
                        "attention_tma_epilogue_interleaved.json" if interleaved else "attention_tma_epilogue.json")
    module, no_store = _forms("tma", "knockout")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261128)
    if not _checked(output, result, module, gen, "the TMA epilogue"):
        return 1
    scale = 1 / math.sqrt(HEAD_DIM)
    result["experiment"] = []
    for causal, seq, batch, q, k, v, plan, cudnn in _timed_shapes(gen, scale):
        flops = 4.0 * batch * HEADS * seq * seq * HEAD_DIM / (2 if causal else 1)
        runs = {"plan": lambda: attention_fwd(q, k, v, causal, scale, plan)[0],
                "tma": lambda: tma_fwd(module, plan, q, k, v, causal, scale)[0], "cudnn": cudnn}
        row = {"batch": batch, "seq": seq, "causal": causal}
        first = None
        if interleaved:  # every candidate checked, then timed in alternating short rounds
            for name, fn in runs.items():
                out = fn()
                first = out if first is None else first
                row[name] = {"rel_diff_to_plan": float((out.double() - first.double()).norm()
                                                       / first.double().norm())}
            timed_runs = {n: runs[n] for n in ("plan", "tma")}
            if knockout:
                def without_stores():
                    o = torch.empty_like(q)
                    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
                    _launch(no_store, plan, q, k, v, o, lse, causal, scale, None, o_descriptor=False)
                    return o
                timed_runs["no-store"] = without_stores
                row["no-store"] = {"note": "O's stores predicated off: timed only, its output is not O"}
            for name, timed in alternating_rounds(timed_runs, INTERLEAVED_ROUNDS).items():
                row[name].update(timed)
            if knockout:
                row["no_store_over_plan"] = row["plan"]["us"] / row["no-store"]["us"]
            row["cudnn"]["us"] = median_of_three_us(cudnn)
            row["tma_over_plan"] = row["plan"]["us"] / row["tma"]["us"]
            runs = {}
        for name, fn in runs.items():
            out = fn()
            first = out if first is None else first
            err = float((out.double() - first.double()).norm() / first.double().norm())
            row[name] = {"rel_diff_to_plan": err}
            if err < TOLERANCE:
                us = median_of_three_us(fn)
                row[name].update(us=us, tflops=flops / us / 1e6)
        row["tma_over_cudnn"] = row["cudnn"]["us"] / row["tma"]["us"]
        row["plan_over_cudnn"] = row["cudnn"]["us"] / row["plan"]["us"]
        add_row(output, result, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
