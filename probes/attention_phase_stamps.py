"""GPU probe: where does the Gluon forward's fixed cost a query tile go, phase by phase?

    python probes/attention_phase_stamps.py OUT_DIR     (writes OUT_DIR/attention_phase_stamps.json)
    python probes/attention_phase_stamps.py OUT_DIR --programs 132,66,33   (..._programs.json)

Rounds attention-fixed-cost and attention-overlap-static (notes/attention.md) left the forward's part paid once a
query tile at 2.9-3.5 µs a turn against cuDNN's 1.0, and the overlapped boundary, which was to hide some of it,
made it larger. Before anything else is built this probe measures it: a copy of kernels/attention_gluon.py's
consumer (read as text, never edited in place) reads the SM's cycle counter (%clock64) at seven points of every
query tile's turn, in both consumer warpgroups of every program:

    0 the turn starts      1 its Q has landed       2 S_0 = Q K_0^T is done (K_0's wait included)
    3 S_0's masked softmax is done                  4 the key loop is done
    5 the last value product is done (V's wait included)                   6 O and lse are stored

and %globaltimer at points 0 and 6, which turns cycles into time. The phases of a turn are the differences; the
gap from one turn's point 6 to the next turn's point 0 is the loop's own overhead. The key loop (4 - 3) is what
the keys cost; everything else is the part paid once a tile. The stamps' own cost (an instruction and a store a
point) is small against a microsecond, not zero: the form's total time is reported beside the plan's.

Plans: kernels/attention.py's for the attention-fwd experiment's head-dim-128 shapes (bf16, B x S = 16,384, 16
heads, S = 2,048 and 4,096): without the mask, the persistent grid with one Q buffer; with it, one program a
query tile. The persistent grid with two Q buffers is stamped too, without the mask. Every form's outputs must
equal the plan's bit for bit before its stamps are read. GPU time: the do_bench median of each form and cuDNN,
L2 flushed. A tuning instrument, not evidence: the site's figures come only from run records.

--programs N,N,... stamps the plan's kernel without the mask at S = 2,048 on persistent grids of those many
programs instead of one an SM: if the epilogue is slow because every program stores its O at once, it shortens
as fewer programs share the memory system.
"""

from __future__ import annotations

import atexit
import importlib.util
import inspect
import json
import math
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.attention_gluon as AG  # noqa: E402
from kernels._gluon_host import descriptor  # noqa: E402
from kernels.attention import attention_fwd, plan_attention  # noqa: E402
from probes.attention_forms import cudnn_forward, median_of_three_us, with_tma_epilogue  # noqa: E402
from probes.harness import environment, replace_once, write_output  # noqa: E402

QUESTION = "Where does the Gluon forward's fixed cost a query tile go, phase by phase?"
CANDIDATES = ("the plan's kernel with its consumers stamping %clock64 at seven points a turn",
              "the persistent grid with two Q buffers, stamped alike",
              "the plan's kernel with O stored through shared memory by TMA, stamped alike",
              "cuDNN through SDPA (time only)")
SHAPES = ("head dim 128, bf16, B x S = 16,384, 16 heads, S = 2,048 and 4,096, without the mask and causal; "
          "correctness at the same shapes against the plan, bit for bit")
OUTPUTS = {"attention-phase-stamps": ("notes/probes/2026-11-28-h100-attention-phase-stamps.json",
                                      "notes/probes/2026-11-28-h100-attention-phase-stamps-programs.json",
                                      "notes/probes/2026-11-28-h100-attention-phase-stamps-tma.json")}

PHASES = ("q_wait", "s0", "softmax0", "key_loop", "last_pv", "epilogue")
POINTS = 7
COLUMNS = POINTS + 2  # the clock at seven points, then %globaltimer at points 0 and 6
HEAD_DIM, HEADS, DTYPE = 128, 16, torch.bfloat16

_STAMP = '''

@gluon.jit
def _stamp(stamp_ptr, i, WG: gl.constexpr, k: gl.constexpr, MAX_TURNS: gl.constexpr, COLUMNS: gl.constexpr,
           TIMER: gl.constexpr):
    # Point k of the program's i-th turn, warpgroup WG: the SM's cycle counter (and, TIMER, %globaltimer in
    # column POINTS + k // 6), stored by the warpgroup's first thread.
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    lane = gl.arange(0, 128, layout=layout)
    clock = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [lane], dtype=gl.int64, is_pure=False,
                                      pack=1)
    base = stamp_ptr + ((gl.program_id(0) * MAX_TURNS + i) * 2 + WG).to(gl.int64) * COLUMNS
    if i < MAX_TURNS:
        gl.store(base + k + lane * 0, clock, mask=lane == 0)
        if TIMER:
            timer = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lane], dtype=gl.int64,
                                              is_pure=False, pack=1)
            gl.store(base + (COLUMNS - 2 + k // 6) + lane * 0, timer, mask=lane == 0)
'''


def form_source(max_turns: int, tma_epilogue: bool = False) -> str:
    """A module holding the plan's kernel with the stamping consumer (and, tma_epilogue, O stored by TMA); the
    stamps go where the key mask's pointer would (the stamped shapes have no key mask)."""
    consumer = inspect.getsource(AG._consumer.fn)
    second = inspect.getsource(AG._consumer_1.fn)
    kernel = inspect.getsource(AG._attention_fwd_gluon_kernel.fn)
    if tma_epilogue:
        consumer, second, kernel = with_tma_epilogue(consumer, second, kernel)

    def at(k: int) -> str:
        return f"        _stamp(mask_ptr, i, WG, {k}, {max_turns}, {COLUMNS}, {k in (0, POINTS - 1)})\n"

    consumer = replace_once(consumer, "        qb = i % Q_BUFFERS\n", at(0) + "        qb = i % Q_BUFFERS\n")
    q_wait = "        if not ON_DEMAND:\n            mbarrier.wait(q_bar.index(qb), (i // Q_BUFFERS) & 1)\n"
    consumer = replace_once(consumer, q_wait, q_wait + at(1))
    consumer = replace_once(consumer, "        mbarrier.arrive(k_free.index(c % STAGES))\n",
                        "        mbarrier.arrive(k_free.index(c % STAGES))\n" + at(2))
    consumer = replace_once(consumer, "        mid = gl.maximum(n_full, 1)\n", at(3) + "        mid = gl.maximum(n_full, 1)\n")
    consumer = replace_once(consumer, "        mbarrier.arrive(q_free.index(qb))\n",
                        at(4) + "        mbarrier.arrive(q_free.index(qb))\n")
    consumer = replace_once(consumer, "        mbarrier.arrive(v_free.index(last % STAGES))\n",
                        "        mbarrier.arrive(v_free.index(last % STAGES))\n" + at(5))
    consumer = replace_once(consumer, "        c += n_tiles\n", at(6) + "        c += n_tiles\n")
    header = ("from triton.experimental import gluon\nfrom triton.experimental.gluon import language as gl\n"
              "from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,\n"
              "    warpgroup_mma, warpgroup_mma_wait)\n"
              "from kernels.attention_gluon import (_LN2, _consume_tiles, _loader, _pass_turn, _query_tile,\n"
              "    _softmax_tile, _take_turn)\n")
    return "\n".join((header, _STAMP, consumer, second, kernel))


def load_form(max_turns: int, folder: Path, tma_epilogue: bool = False):
    """The stamping form as a module (Gluon reads a kernel's source from its file, so it is written out)."""
    path = folder / f"phase_stamps_{max_turns}{'_tma' if tma_epilogue else ''}.py"
    path.write_text(form_source(max_turns, tma_epilogue), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def run_form(module, q, k, v, causal: bool, scale: float, stages: int, programs, prefetch_q: bool, stamps):
    """(O, lse) of the stamping kernel, launched as the plan would launch the kernel it copies."""
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    grid, args, meta = AG.launch_args(q, k, v, o, lse, causal, scale, stages, None, False, programs, False,
                                      prefetch_q)
    args = args[:5] + (stamps, ) + args[6:]
    if getattr(module, "TMA_EPILOGUE", False):
        args = args[:3] + (descriptor(o, AG.WARPGROUP_M), ) + args[4:]
    module._attention_fwd_gluon_kernel[grid](*args, **meta, num_warps=AG.NUM_WARPS, maxnreg=AG.MAXNREG)
    return o, lse


def read_stamps(stamps: torch.Tensor, turns: list[int]) -> dict:
    """Medians over every turn and warpgroup of each phase (cycles and µs), the loop's gap between turns, the
    clock the cycles were read at, and the stamped turn's whole length. `turns[p]`: turns program p took."""
    s = stamps.cpu()
    phases = {name: [] for name in (*PHASES, "between_turns", "turn")}
    rates = []
    for p, n in enumerate(turns):
        for wg in range(2):
            rows = s[p, :n, wg]
            span_ns = float(rows[n - 1, COLUMNS - 1] - rows[0, COLUMNS - 2])
            span_cycles = float(rows[n - 1, POINTS - 1] - rows[0, 0])
            if span_ns > 0:
                rates.append(span_cycles / span_ns)
            for i in range(n):
                d = (rows[i, 1:POINTS] - rows[i, :POINTS - 1]).tolist()
                for name, value in zip(PHASES, d):
                    phases[name].append(value)
                phases["turn"].append(float(rows[i, POINTS - 1] - rows[i, 0]))
                if i + 1 < n:
                    phases["between_turns"].append(float(rows[i + 1, 0] - rows[i, POINTS - 1]))
    ghz = statistics.median(rates)
    out = {"clock_ghz": ghz, "turns": sum(turns), "phases": {}}
    for name, values in phases.items():
        if values:
            med = statistics.median(values)
            out["phases"][name] = {"median_cycles": med, "median_us": med / ghz / 1e3,
                                   "mean_us": statistics.fmean(values) / ghz / 1e3}
    return out


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {**environment(), "question": QUESTION, "shapes": SHAPES,
              "clock": "GPU time (do_bench median of three, L2 flushed); phases from %clock64", "rows": []}
    fewer = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--programs"), None)
    fewer = [int(n) for n in fewer.split(",")] if fewer else None
    output = out_dir / ("attention_phase_stamps_programs.json" if fewer else "attention_phase_stamps.json")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    folder = Path(tempfile.mkdtemp(prefix="phase-stamps-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261128)
    scale = 1 / math.sqrt(HEAD_DIM)
    for seq in (2048, ) if fewer else (2048, 4096):
        batch = 16384 // seq
        q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
                   for _ in range(3))
        tiles = batch * HEADS * math.ceil(seq / AG.BLOCK_M)
        for causal in (False, ) if fewer else (False, True):
            plan = plan_attention(seq, HEAD_DIM, DTYPE, causal, seq_k=seq, impl="gluon")
            o_plan, lse_plan = attention_fwd(q, k, v, causal, scale, plan)
            forms = {"plan": (plan.persistent, plan.prefetch_q, sms)}
            if fewer:
                forms = {f"plan-{n}-programs": (True, plan.prefetch_q, n) for n in fewer}
            elif not causal:
                forms["persistent-2q"] = (True, True, sms)
            if not fewer:  # the plan with O stored through shared memory by TMA
                forms["tma-epilogue"] = (plan.persistent, plan.prefetch_q, sms)
            for name, (persistent, prefetch_q, count) in forms.items():
                programs = min(count, tiles) if persistent else None
                grid = programs or tiles
                turns = [len(range(p, tiles, grid)) for p in range(grid)]
                module = load_form(max(turns), folder, name.startswith("tma"))
                module.TMA_EPILOGUE = name.startswith("tma")
                stamps = torch.zeros(grid, max(turns), 2, COLUMNS, dtype=torch.int64, device="cuda")
                row = {"seq": seq, "batch": batch, "causal": causal, "form": name, "persistent": persistent,
                       "prefetch_q": prefetch_q, "programs": grid}
                try:
                    def call():
                        return run_form(module, q, k, v, causal, scale, plan.num_stages, programs, prefetch_q,
                                        stamps)
                    o, lse = call()
                    torch.cuda.synchronize()
                    # the two-buffer grid runs the plan's arithmetic in the plan's order too
                    row["equal_to_plan"] = bool(torch.equal(o, o_plan) and torch.equal(lse, lse_plan))
                    if row["equal_to_plan"]:
                        stamps.zero_()
                        call()
                        torch.cuda.synchronize()
                        row["stamps"] = read_stamps(stamps, turns)
                        row["us_stamped"] = median_of_three_us(lambda: call()[0])
                        if not fewer and not name.startswith("tma"):  # the plan's own launch, one program an SM
                            row["us_unstamped"] = median_of_three_us(lambda p=persistent, f=prefetch_q: attention_fwd(
                                q, k, v, causal, scale, replace(plan, persistent=p, prefetch_q=f))[0])
                except Exception as exc:  # noqa: BLE001 - one form's failure is its own row
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
                write_output(output, result)
            cudnn = cudnn_forward(q, k, v, causal, scale)
            result["rows"].append({"seq": seq, "batch": batch, "causal": causal, "form": "cudnn", "us": median_of_three_us(cudnn)})
            print(json.dumps(result["rows"][-1]), flush=True)
            write_output(output, result)
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
