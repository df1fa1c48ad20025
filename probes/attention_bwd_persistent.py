"""GPU probe: does a persistent dK/dV kernel that takes its key blocks on demand close the causal and grouped-query
backward's gap? (kernels/attention_bwd_gluon.py)

    python probes/attention_bwd_persistent.py --compile   (the CPU: the forms compiled for sm_90)
    python probes/attention_bwd_persistent.py OUT_DIR      (the GPU: OUT_DIR/attention_bwd_persistent.json)

The Gluon backward's dK/dV kernel runs one program a key block: it loads its block's K and V, walks the query
tiles that may see them (every query head of the group), writes dK and dV and ends, and the hardware starts the
next program on that SM cold. With the causal mask the blocks' walks differ in length, and with grouped-query heads
there are a quarter as many, four times longer (round attention-bwd-split: the dK/dV kernel 1-12% slower with 16
query heads over 4 than with heads of their own, the dQ kernel level). The Gluon forward gained 5-10% at causal
shapes from one program an SM taking its query tiles on demand (round attention-causal-dynamic).

The form ("on-demand") is the plan's dK/dV kernel on one program an SM: its loader takes the next key block from a
counter in global memory (an atomic add, zeroed for each launch), in the plan's order (key blocks of one
(batch, key/value head) in turn, longest first under the causal mask), writes its index beside the K/V buffer,
loads K and V once both consumers have freed them (right after a block's last products, before its dK and dV
are stored, so the next block's loads overlap that epilogue) and streams the block's Q and dO tiles through the
same ring, whose slots and phases run on across blocks. The consumers read the index once K and V have landed;
the first index past the last block ends them. "strided" takes blocks pid, pid + grid, ... instead, and
"on-demand-tma" writes each block's dK and then dV into a shared-memory buffer of the consumer's own and hands it
to the TMA engine (rows past the keys clipped by the descriptor), where the others store from registers. Each tile's
arithmetic is the plan's, so dK and dV must equal the plan's bit for bit (NaN-poisoned outputs) before anything is
timed. Everything but the loader, the consumers' outer loop, the kernel's barriers and the launch is the plan's:
the consumer is kernels/attention_bwd_gluon.py's own text turned into a loop over blocks (consumer_source).

Timing: the plan's dK/dV kernel and the forms alone, in twelve alternating rounds of short do_bench runs (the
medians; the L2 flushed), after the delta pass, at attention-bwd's head-dim-128 shapes (bf16, B x S = 16,384,
16 query heads over 16 or 4 key/value heads, S = 2,048 / 4,096 / 8,192 / 16,384, causal and not). GPU time. A
tuning instrument, not evidence. Written and compiled for sm_90 on the CPU; its GPU run follows. Compiled, at head
dim 128 a consumer spills 244 / 268 bytes without / with the causal mask on demand (the loop over blocks: run once
it spills 72 / 152) and 144 / 240 with the TMA stores, against the plan's 84 / 168; none at head dim 64.
"""

from __future__ import annotations

import atexit
import inspect
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels.attention_bwd_gluon as KV  # noqa: E402
from kernels._gluon_host import LOG2E, compile_kernel_for_sm90, descriptor, key_mask_args  # noqa: E402
from kernels.attention_bwd_gluon import _query_range  # noqa: E402
from probes.attention_forms import ALTERNATING_CLOCK, alternating_rounds, backward_case, delta_pass  # noqa: E402
from probes.harness import add_row, environment, module_from_source, replace_once, write_output  # noqa: E402

QUESTION = ("Does a persistent dK/dV kernel that takes its key blocks on demand close the causal and grouped-query "
            "backward's gap?")
CANDIDATES = ("the plan's dK/dV kernel (kernels/attention_bwd_gluon.py): one program a key block",
              "on-demand: one program an SM, key blocks from a counter, the next block's K and V loading under the "
              "last one's dK/dV stores",
              "strided: one program an SM, key blocks pid, pid + grid, ...",
              "on-demand-tma: on-demand, with dK and dV leaving through shared memory by TMA")
SHAPES = ("checks: head dim 128 and 64, bf16, causal and not, ragged lengths, more keys than queries and the "
          "reverse, grouped-query heads, a key mask; timed: head dim 128, bf16, B x S = 16,384, 16 query heads over "
          "16 or 4 key/value heads, S = 2,048 / 4,096 / 8,192 / 16,384, causal and not")
OUTPUTS = {}

ROUNDS = 12
KV_FILE = "kernels/attention_bwd_gluon.py"
# (batch, heads, kv heads, seq_q, seq_k, head dim, causal, key mask)
CHECKS = ((2, 4, 4, 1000, 1500, 128, False, False), (2, 4, 4, 1000, 1500, 128, True, False),
          (3, 4, 4, 1500, 900, 128, True, False), (1, 8, 2, 777, 777, 128, True, False),
          (1, 3, 3, 33, 5000, 128, True, False), (2, 4, 4, 700, 1300, 128, False, True),
          (2, 4, 4, 640, 640, 128, True, True), (8, 16, 4, 2048, 2048, 128, True, False),
          (2, 8, 8, 1500, 1500, 64, True, False), (4, 16, 16, 2048, 2048, 128, False, False))
FORMS = ("on-demand", "strided", "on-demand-tma")
TIMED = tuple((16384 // s, 16, kv, s, c) for s in (2048, 4096, 8192, 16384) for c in (False, True) for kv in (16, 4))


@gluon.jit
def _block_of(t, n_blocks_n, n_kv_heads, wg_n: gl.constexpr):
    # Key block t's (start_n, b, h_kv): the blocks of one (batch, key/value head) in turn, first key first.
    start_n = t % n_blocks_n * (2 * wg_n)
    bh_kv = t // n_blocks_n
    return start_n, bh_kv // n_kv_heads, bh_kv % n_kv_heads


@gluon.jit
def _loader(tile_smem, counter_ptr, q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
            kv_free, ready, free, seq_q, seq_k, n_kv_heads, group, total, CAUSAL: gl.constexpr,
            STAGES: gl.constexpr, ON_DEMAND: gl.constexpr):
    wg_n: gl.constexpr = k_desc.block_type.shape[2]
    block_m: gl.constexpr = q_desc.block_type.shape[2]
    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)
    tile_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    if ON_DEMAND:
        t = gl.atomic_add(counter_ptr, 1)
    else:
        t = gl.program_id(0)
    it = 0
    i = 0
    while t < total:
        start_n, b, h_kv = _block_of(t, n_blocks_n, n_kv_heads, wg_n)
        mbarrier.wait(kv_free, (i & 1) ^ 1)  # both consumers are done with the last block's K and V
        tile_smem.store(gl.full([1], t, gl.int32, tile_layout))
        mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
        for w in gl.static_range(2):
            tma.async_copy_global_to_shared(k_desc, [b, h_kv, start_n + w * wg_n, 0], kv_bar, k_smem.index(w))
            tma.async_copy_global_to_shared(v_desc, [b, h_kv, start_n + w * wg_n, 0], kv_bar, v_smem.index(w))
        m_lo, n_m = _query_range(start_n, seq_q, seq_k, CAUSAL, block_m)
        for g in range(group):
            h = h_kv * group + g
            for mi in range(n_m):
                slot = it % STAGES
                mbarrier.wait(free.index(slot), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [b, h, m_lo + mi * block_m, 0], ready.index(slot),
                                                q_smem.index(slot))
                tma.async_copy_global_to_shared(do_desc, [b, h, m_lo + mi * block_m, 0], ready.index(slot),
                                                do_smem.index(slot))
                it += 1
        i += 1
        if ON_DEMAND:
            t = gl.atomic_add(counter_ptr, 1)
        else:
            t += gl.num_programs(0)
    # The end: an index past the last block, handed over as a block would be (no bytes to wait for).
    mbarrier.wait(kv_free, (i & 1) ^ 1)
    tile_smem.store(gl.full([1], t, gl.int32, tile_layout))
    mbarrier.arrive(kv_bar)


# The consumer is the plan's (kernels/attention_bwd_gluon.py's _bwd_consumer) turned into a loop over the blocks
# the loader hands over: its text, with the block read from shared memory where the plan reads the program id,
# K and V freed before the stores, and the stores optionally through TMA. Each tile's arithmetic stays the plan's.
_PROGRAM_BLOCK = ("    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)\n"
                  "    start_n = gl.program_id(0) % n_blocks_n * (2 * wg_n)\n"
                  "    bh_kv = gl.program_id(0) // n_blocks_n\n"
                  "    b = bh_kv // n_kv_heads\n"
                  "    h_kv = bh_kv % n_kv_heads\n")
_LOOP_HEAD = ("    n_blocks_n = gl.cdiv(seq_k, 2 * wg_n)\n"
              "    tile_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])\n"
              "    i = 0\n"
              "    it = 0\n"
              "    mbarrier.wait(kv_bar, 0)\n"
              "    t = gl.max(tile_smem.load(tile_layout), axis=0)\n"
              "    while t < total:\n"
              "        start_n = t % n_blocks_n * (2 * wg_n)\n"
              "        bh_kv = t // n_blocks_n\n"
              "        b = bh_kv // n_kv_heads\n"
              "        h_kv = bh_kv % n_kv_heads\n")
_EPILOGUE = "    rows_n = start_n + WG * wg_n + gl.arange(0, wg_n, layout=gl.SliceLayout(1, store_layout))\n"
_TMA_EPILOGUE = """        mbarrier.arrive(kv_free)  # K and V read no more: the next block's load under these stores
        if TMA_STORE:  # dK, then dV, through this warpgroup's buffer and a TMA copy (rows past seq_k clipped)
            view = out_smem.index(WG)
            tma.store_wait(0)
            view.reshape([wg_n, HEAD_DIM]).store((dk * scale).to(q_smem.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_ptr, [b, h_kv, start_n + WG * wg_n, 0], view)
            tma.store_wait(0)
            view.reshape([wg_n, HEAD_DIM]).store(dv.to(q_smem.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dv_ptr, [b, h_kv, start_n + WG * wg_n, 0], view)
        else:
"""
_LOOP_TAIL = """        i += 1
        mbarrier.wait(kv_bar, i & 1)
        t = gl.max(tile_smem.load(tile_layout), axis=0)
    if TMA_STORE:
        tma.store_wait(0)
"""
_HEADER = """from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \\
    warpgroup_mma_wait

from kernels.attention_bwd_gluon import _LOG2E, _query_range


"""


def _indent(text: str, by: str) -> str:
    return "".join(by + line if line.strip() else line for line in text.splitlines(keepends=True))


def consumer_source() -> str:
    """The plan's dK/dV consumer as this form's `_consumer` (see above)."""
    text = inspect.getsource(KV._bwd_consumer.fn)
    text = replace_once(text, "def _bwd_consumer(q_smem, do_smem, k_smem, v_smem, kv_bar, ready, free,",
                        "def _consumer(out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, "
                        "free,", KV_FILE)
    text = replace_once(text, "seq_q, seq_k, n_kv_heads, group, qk_scale,",
                        "seq_q, seq_k, n_kv_heads, group, total, qk_scale,", KV_FILE)
    text = replace_once(text, "STAGES: gl.constexpr):", "STAGES: gl.constexpr, TMA_STORE: gl.constexpr):", KV_FILE)
    text = replace_once(text, "    mbarrier.wait(kv_bar, 0)\n    it = 0\n", "", KV_FILE)
    head, rest = text.split(_PROGRAM_BLOCK)
    loop, epilogue = rest.split(_EPILOGUE)
    return (head + _LOOP_HEAD + _indent(loop.rstrip("\n") + "\n", "    ") + _TMA_EPILOGUE
            + _indent(_EPILOGUE + epilogue.rstrip("\n") + "\n", "        ") + _LOOP_TAIL)


def _install_consumer() -> None:
    """Makes `_consumer`, which _consumer_1 and the kernel call, consumer_source() compiled (once a process)."""
    global _consumer
    if _consumer is None:
        folder = Path(tempfile.mkdtemp(prefix="bwd-persistent-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _consumer = module_from_source(folder, "bwd_kv_persistent_consumer", _HEADER + consumer_source())._consumer


_consumer = None


@gluon.jit
def _consumer_1(out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr,
                delta_ptr, dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale,
                stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk,
                HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr, STAGES: gl.constexpr,
                TMA_STORE: gl.constexpr):
    _consumer(out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr, delta_ptr,
              dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb,
              stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, 1, HEAD_DIM, CAUSAL,
              KEY_MASK, STAGES, TMA_STORE)


@gluon.jit
def _persistent_kv_kernel(q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, mask_ptr, seq_q,
                          seq_k, n_kv_heads, group, total, qk_scale, scale, stride_dkb, stride_dkh, stride_dks,
                          stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, counter_ptr,
                          HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, KEY_MASK: gl.constexpr,
                          STAGES: gl.constexpr, ON_DEMAND: gl.constexpr, TMA_STORE: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    # TMA_STORE: dk_ptr and dv_ptr carry dK's and dV's tensor descriptors, and each consumer a buffer of its own.
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    tile_smem = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    out_smem = gl.allocate_shared_memory(dtype, [2 if TMA_STORE else 1] + k_desc.block_type.shape, k_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_free, count=2)  # both consumers are done with the block's K and V
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr,
                     delta_ptr, dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale,
                     stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk, 0,
                     HEAD_DIM, CAUSAL, KEY_MASK, STAGES, TMA_STORE)),
        (_consumer_1, (out_smem, tile_smem, q_smem, do_smem, k_smem, v_smem, kv_bar, kv_free, ready, free, lse_ptr,
                       delta_ptr, dk_ptr, dv_ptr, mask_ptr, seq_q, seq_k, n_kv_heads, group, total, qk_scale, scale,
                       stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_mb, stride_mk,
                       HEAD_DIM, CAUSAL, KEY_MASK, STAGES, TMA_STORE)),
        (_loader, (tile_smem, counter_ptr, q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
                   kv_free, ready, free, seq_q, seq_k, n_kv_heads, group, total, CAUSAL, STAGES, ON_DEMAND)),
    ], [4, 1], [KV.CONSUMER_REGS, KV.LOADER_REGS])


def launch_args(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, key_mask, programs: int, counter,
                tma_store: bool = False, stages: int = KV.STAGES) -> tuple:
    """(grid, positional args, meta) of one launch: `programs` programs (tensors may be on the 'meta' device);
    counter: one int32 at zero on q's device (on demand), or None (strided); tma_store: dK and dV leave by TMA
    (they must fit descriptors)."""
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    total = triton.cdiv(seq_k, KV.BLOCK_N) * batch * n_kv_heads
    mask, stride_mb, stride_mk = key_mask_args(key_mask)
    args = (descriptor(q, KV.BLOCK_M), descriptor(do, KV.BLOCK_M), descriptor(k, KV.WARPGROUP_N),
            descriptor(v, KV.WARPGROUP_N), lse, delta, descriptor(dk, KV.WARPGROUP_N) if tma_store else dk,
            descriptor(dv, KV.WARPGROUP_N) if tma_store else dv, mask, seq_q, seq_k, n_kv_heads, n_heads // n_kv_heads,
            total, scale * LOG2E, scale, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1),
            dv.stride(2), stride_mb, stride_mk, lse if counter is None else counter)  # lse: never read then
    meta = dict(HEAD_DIM=head_dim, CAUSAL=causal, KEY_MASK=key_mask is not None, STAGES=stages,
                ON_DEMAND=counter is not None, TMA_STORE=tma_store, CONSUMER_REGS=KV.CONSUMER_REGS,
                LOADER_REGS=KV.LOADER_REGS)
    return (max(1, min(total, programs)),), args, meta


def persistent_kv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, key_mask=None,
                  on_demand: bool = True, tma_store: bool = False) -> None:
    """Writes dK and dV as attention_bwd_kv_gluon does, on one program an SM."""
    _install_consumer()
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if on_demand else None
    grid, args, meta = launch_args(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask,
                                   torch.cuda.get_device_properties(q.device).multi_processor_count, counter,
                                   tma_store)
    _persistent_kv_kernel[grid](*args, **meta, num_warps=KV.NUM_WARPS, maxnreg=KV.MAXNREG)


def compile_for_sm90(head_dim: int, causal: bool, key_mask: bool, on_demand: bool = True, tma_store: bool = False):
    """The form compiled for sm_90 from shapes alone (no GPU)."""
    _install_consumer()
    q = torch.empty(2, 4, 1000, head_dim, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 2, 1000, head_dim, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    mask = torch.empty(2, 1000, dtype=torch.bool, device="meta") if key_mask else None
    counter = torch.empty(1, dtype=torch.int32, device="meta") if on_demand else None
    _, args, meta = launch_args(q, k, k, q, lse, lse, torch.empty_like(k), torch.empty_like(k), causal, 0.125, mask,
                                132, counter, tma_store)
    return compile_kernel_for_sm90(_persistent_kv_kernel, args, meta, KV.NUM_WARPS, KV.MAXNREG)


def _setup(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, masked=False):
    q, k, v, o, lse, do, scale, (kv_plan, _), key_mask = backward_case(gen, batch, heads, kv_heads, seq_q, seq_k,
                                                                       head_dim, causal, masked)
    return q, k, v, do, lse.contiguous(), delta_pass(o, do), scale, key_mask, kv_plan


def forms(q, k, v, do, lse, delta, causal, scale, key_mask, kv_plan, poison=False) -> dict:
    """name -> a call writing (dK, dV) by the plan's kernel or a form."""
    make = (lambda t: torch.full_like(t, float("nan"))) if poison else torch.empty_like

    def run(which):
        dk, dv = make(k), make(v)
        if which == "plan":
            KV.attention_bwd_kv_gluon(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, kv_plan.num_stages)
        else:
            persistent_kv(q, k, v, do, lse, delta, dk, dv, causal, scale, key_mask, which != "strided",
                          which == "on-demand-tma")
        return dk, dv

    return {name: (lambda name=name: run(name)) for name in ("plan", *FORMS)}


def main() -> int:
    if sys.argv[1:] == ["--compile"]:
        from probes.compiled import ptxas_registers

        for head_dim in (128, 64):
            for causal in (False, True):
                for name, kernel in (("plan", KV.compile_for_sm90(head_dim, torch.bfloat16, causal, False)),
                                     ("on-demand", compile_for_sm90(head_dim, causal, False)),
                                     ("strided", compile_for_sm90(head_dim, causal, False, on_demand=False)),
                                     ("on-demand-tma", compile_for_sm90(head_dim, causal, False, tma_store=True))):
                    registers, spilled = ptxas_registers(kernel, 90)
                    print(json.dumps({"form": name, "head_dim": head_dim, "causal": causal, "registers": registers,
                                      "spilled_bytes": spilled, "shared_bytes": kernel.metadata.shared}))
        return 0
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / "attention_bwd_persistent.json"
    result = {**environment(), "question": QUESTION, "shapes": SHAPES, "clock": ALTERNATING_CLOCK, "checks": []}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261201)
    for batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, masked in CHECKS:
        calls = forms(*_setup(gen, batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, masked), poison=True)
        planned = calls["plan"]()
        row = {"shape": [batch, heads, kv_heads, seq_q, seq_k, head_dim], "causal": causal, "key_mask": masked}
        for name in FORMS:
            got = [calls[name]() for _ in range(3)]  # three launches: a counter of their own each
            row[name] = all(torch.equal(a, b) for g in got for a, b in zip(g, planned))
        add_row(output, result, row, key="checks")
    result["all_equal"] = all(r[name] for r in result["checks"] for name in FORMS)
    write_output(output, result)
    if not result["all_equal"]:
        print("a form differs from the plan: nothing timed", flush=True)
        return 1
    result["experiment"] = []
    for batch, heads, kv_heads, seq, causal in TIMED:
        calls = forms(*_setup(gen, batch, heads, kv_heads, seq, seq, 128, causal))
        row = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq, "causal": causal}
        row.update(alternating_rounds(calls, ROUNDS))
        for name in FORMS:
            row[f"plan_over_{name}"] = row["plan"]["us"] / row[name]["us"]
        add_row(output, result, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
