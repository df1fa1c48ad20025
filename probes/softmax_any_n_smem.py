"""Round 18 of the any-N softmax probe (GPU only: `python -m probes.softmax_any_n_smem --out FILE`): a split-row
forward for long 2-byte rows that stages its slice in shared memory, in the storage dtype, instead of holding it in registers as fp32.

Why. The lab's split-row forward (kernels/softmax_split_row_kernels.py) holds each slice as fp32 in registers
from the load to the store, across the wait for the row's other slices: 8192 lanes on 4 warps cost 64
registers a thread for the data alone, which caps the programs an SM holds and so the bytes in flight.
2-byte split rows (36k-270k lanes) measure 79-87% of the copy ceiling where fp32 ones reach 93-97%.

What. Written in Gluon (triton.experimental.gluon) to control where the slice lives:

1. a program takes a ticket (the lab's scheme: work in arrival order, so a program only waits for programs
   that took earlier tickets and are running or done; the wait ends while MAX_SPLITS programs fit at once);
2. its slice of SLICE lanes is copied into shared memory as rows of BOX = 256 lanes, by one of:
   `tma` (one bulk tensor copy a row of the buffer, an mbarrier a chunk of rows), `cp` (cp.async, one
   commit group a chunk) or `ld` (registers, then a shared store: the plain reference);
3. pass 1 reads the slice back a chunk at a time as fp32 and keeps the online pair (m, d), the lab's
   -inf-safe rule; chunks are read as their copies land, so the maths overlaps the copies still in flight;
4. (m, d) is published to the row's slot, the program arrives and waits for the row (the lab's counters);
5. pass 2 reads the chunks again and stores y = exp(x - m_row) / d_row.

Rows are cut at 16-byte boundaries as the lab's kernels cut them (_row_cut): the slices tile the row's aligned
body, so every copy and store of the body is 16-byte aligned whatever N is, and the first slice also holds the
row's head and tail (fewer than 8 elements each) in registers. The TMA descriptor is one over the flattened
input (rows contiguous), so odd row strides need no 2-D descriptor. The lanes past a slice's end are masked;
their chunks are not copied, or, in the chunk the body ends in, copy that chunk's first box again.
Compiled (Triton 3.6), every bulk copy is preceded by a CTA barrier the compiler inserts (32 a slice of 8192).

GPU only (Hopper for `tma`): Gluon kernels do not run under Triton's interpreter. Before the round, one
small launch of every variant runs in a child process, checked against float64, so that a variant the GPU
refuses (or that hangs) is dropped instead of poisoning the round's CUDA context.

    python -m probes.softmax_any_n_smem --facts   # n_regs, spills and shared memory compiled for sm_90 (no GPU)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.language.nvidia.ampere import async_copy

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.compiled import occupancy, ptxas_registers  # noqa: E402
from probes.harness import LAB_TIMING, probe_header, time_forward_shapes, write_output  # noqa: E402

QUESTION = ("Does a split-row forward that stages its 2-byte slices in shared memory, in their storage dtype "
            "(TMA, cp.async or plain loads), hold more bytes in flight and beat the lab's fp32-holding slices?")
CANDIDATES = ("lab:auto", "tma{slice}w{warps}r{cap}", "cp{slice}w{warps}", "ld{slice}w{warps}")
OUTPUTS = {"any-n-18": ("notes/probes/2026-11-26-h100-any-n-round18.json.gz",)}

BOX = 256  # lanes a row of the shared buffer, and of one bulk tensor copy (a box holds at most 256 a dimension)
LANES_A_THREAD = 16  # lanes a thread holds of a chunk: two 16-byte vectors of a 2-byte dtype
MAX_SPLITS_POW2 = 64  # the partials read a row, fixed so the kernel compiles once whatever the row's splits
COPIES = {"ld": 0, "cp": 1, "tma": 2}

# (copy, slice lanes, warps, register cap or 0): the variants round 18 times. Compiled for sm_90, 8192 lanes on
# 4 warps take 48 registers a thread: ten programs an SM, where their shared memory would fit 13; capped at 40
# (8 bytes spilled), twelve.
ROUND18_VARIANTS = (("tma", 8192, 4, 0), ("tma", 8192, 4, 40), ("tma", 16384, 4, 0), ("tma", 16384, 8, 0),
                    ("cp", 8192, 4, 0), ("cp", 16384, 8, 0), ("ld", 8192, 4, 0))
# Round 17's 2-byte split-row lengths (notes/probes/2026-11-25-h100-any-n-round17.json.gz), the powers of two
# and 262,144; fp16 at three of them.
ROUND18_N = tuple((n, torch.bfloat16) for n in (36481, 41187, 46372, 62058, 65536, 74105, 95290, 129820, 131072,
                                                262144))
ROUND18_N += tuple((n, torch.float16) for n in (36481, 74105, 129820))


def variant_name(copy: str, slice_n: int, warps: int, cap: int = 0) -> str:
    return f"smem-{copy}{slice_n}w{warps}" + (f"r{cap}" if cap else "")


def splits(n: int, slice_n: int, vec: int = 8) -> int:
    """Slices of a row of n: they tile its aligned body, at most n // vec * vec lanes."""
    return max(1, math.ceil(n // vec * vec / slice_n))


@gluon.jit(do_not_specialize=["n_cols", "n_splits"])  # one compile a variant and dtype
def _smem_fwd_kernel(x_ptr, y_ptr, x_desc, part_m_ptr, part_d_ptr, sync_ptr, n_cols, n_splits,
                     SLICE: gl.constexpr, BOX: gl.constexpr, CHUNK_ROWS: gl.constexpr, COPY: gl.constexpr,
                     VEC: gl.constexpr, SPLITS_POW2: gl.constexpr, NUM_WARPS: gl.constexpr):
    ROWS: gl.constexpr = SLICE // BOX
    CHUNKS: gl.constexpr = ROWS // CHUNK_ROWS
    # A chunk is CHUNK_ROWS rows of the buffer: each warp reads a row (512 contiguous bytes) in 16-byte vectors.
    blk: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [NUM_WARPS, 1], [1, 0])
    line: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
    if COPY == 2:
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    else:
        smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [ROWS, BOX], smem_layout)

    # The ticket (kernels/softmax_split_row_kernels.py's _take_ticket): the holder of the launch's last one
    # sets the counter back to zero, so the next launch finds it zeroed.
    ticket = gl.atomic_add(sync_ptr, 1)
    if ticket == gl.num_programs(0) - 1:
        gl.atomic_xchg(sync_ptr, 0)
    row = ticket // n_splits
    part = ticket % n_splits
    # The row's cut (_row_cut): `head` elements before its first 16-byte boundary, an aligned body of n_body.
    start = row.to(gl.int64) * n_cols
    head = gl.minimum((VEC - start % VEC) % VEC, n_cols)
    n_body = gl.multiple_of(((n_cols - head) // VEC * VEC).to(gl.int32), VEC)
    body = gl.multiple_of(start + head, VEC)
    x_row = x_ptr + body
    y_row = y_ptr + body
    base = part * SLICE
    r_idx = gl.arange(0, CHUNK_ROWS, layout=gl.SliceLayout(1, blk))
    c_idx = gl.arange(0, BOX, layout=gl.SliceLayout(0, blk))
    lanes = r_idx[:, None] * BOX + c_idx[None, :]  # a chunk's lanes, from its first

    if COPY == 2:
        bars = gl.allocate_shared_memory(gl.int64, [CHUNKS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CHUNKS):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        for i in gl.static_range(CHUNKS):
            # A chunk wholly past the body is neither copied nor waited for; in a chunk the body ends in, the
            # boxes past its end copy the chunk's first box again (a box always lands its full bytes).
            first = base + i * CHUNK_ROWS * BOX
            live = first < n_body
            mbarrier.expect(bars.index(i), CHUNK_ROWS * BOX * 2, pred=live)  # 2-byte lanes
            for j in gl.static_range(CHUNK_ROWS):
                col = gl.where(first + j * BOX < n_body, first + j * BOX, first)
                tma.async_copy_global_to_shared(x_desc, [0, (body + col).to(gl.int32)], bars.index(i),
                                                buf.slice(i * CHUNK_ROWS + j, 1), pred=live)
    elif COPY == 1:
        for i in gl.static_range(CHUNKS):
            cols = base + i * CHUNK_ROWS * BOX + lanes
            async_copy.async_copy_global_to_shared(buf.slice(i * CHUNK_ROWS, CHUNK_ROWS), x_row + cols,
                                                   mask=cols < n_body)
            async_copy.commit_group()

    # Pass 1: the online pair over the slice's chunks, each as soon as its copy has landed.
    m = -float("inf")
    d = 0.0
    for i in gl.static_range(CHUNKS):
        cols = base + i * CHUNK_ROWS * BOX + lanes
        mask = cols < n_body
        chunk = buf.slice(i * CHUNK_ROWS, CHUNK_ROWS)
        if COPY == 2:
            mbarrier.wait(bars.index(i), 0, pred=base + i * CHUNK_ROWS * BOX < n_body)
            x = chunk.load(blk)
        elif COPY == 1:
            async_copy.wait_group(CHUNKS - 1 - i)
            gl.thread_barrier()
            x = chunk.load(blk)
        else:
            x = gl.load(x_row + cols, mask=mask)
            chunk.store(x)
        x = gl.where(mask, x.to(gl.float32), -float("inf"))
        m_new = gl.maximum(m, gl.max(gl.max(x, axis=1), axis=0))
        m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
        d = d * gl.exp(m - m_safe) + gl.sum(gl.sum(gl.exp(x - m_safe), axis=1), axis=0)
        m = m_new
    if COPY == 2:
        for i in gl.static_range(CHUNKS):
            mbarrier.invalidate(bars.index(i))

    # The row's head and tail (_edge_offsets), held by its first slice.
    k = gl.arange(0, 2 * VEC, layout=line)
    edge = gl.where(k < VEC, k - VEC, n_body + k - VEC)
    edge_in = gl.where(k < VEC, edge >= -head, edge < n_cols - head) & (part == 0)
    x_edge = gl.load(x_row + edge, mask=edge_in, other=-float("inf")).to(gl.float32)
    m_new = gl.maximum(m, gl.max(x_edge, axis=0))
    m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
    d = d * gl.exp(m - m_safe) + gl.sum(gl.exp(x_edge - m_safe), axis=0)
    m = m_new

    # Publish, arrive, wait (_arrive_and_wait): the last slice to arrive zeroes the row's counter (release);
    # the others spin (acquire) until every slice has arrived or the counter is back at zero.
    gl.store(part_m_ptr + ticket, m)
    gl.store(part_d_ptr + ticket, d)
    counter = sync_ptr + 1 + row
    arrived = gl.atomic_add(counter, 1, sem="acq_rel") + 1
    if arrived == n_splits:
        gl.atomic_xchg(counter, 0, sem="release")
    else:
        while (arrived < n_splits) & (arrived > 0):
            arrived = gl.atomic_add(counter, 0, sem="acquire")
    s = gl.arange(0, SPLITS_POW2, layout=line)
    pm = gl.load(part_m_ptr + row * n_splits + s, mask=s < n_splits, other=-float("inf"), volatile=True)
    pd = gl.load(part_d_ptr + row * n_splits + s, mask=s < n_splits, other=0.0, volatile=True)
    m_row = gl.max(pm, axis=0)
    # Slices of only -inf hold d = 0; a row of only -inf gives d_row = NaN, as torch does.
    d_row = gl.sum(gl.where(pm == -float("inf"), 0.0, pd * gl.exp(pm - m_row)), axis=0)
    d_row = gl.where(m_row == -float("inf"), float("nan"), d_row)
    inv = 1.0 / d_row

    # Pass 2: y from the staged slice, stored as 16-byte vectors of the aligned body.
    for i in gl.static_range(CHUNKS):
        cols = base + i * CHUNK_ROWS * BOX + lanes
        x = buf.slice(i * CHUNK_ROWS, CHUNK_ROWS).load(blk).to(gl.float32)
        gl.store(y_row + cols, (gl.exp(x - m_row) * inv).to(y_ptr.dtype.element_ty), mask=cols < n_body)
    gl.store(y_row + edge, (gl.exp(x_edge - m_row) * inv).to(y_ptr.dtype.element_ty), mask=edge_in)


def _meta(copy: str, slice_n: int, warps: int) -> dict:
    return dict(SLICE=slice_n, BOX=BOX, CHUNK_ROWS=LANES_A_THREAD * 32 * warps // BOX, COPY=COPIES[copy], VEC=8,
                SPLITS_POW2=MAX_SPLITS_POW2, NUM_WARPS=warps)


def _descriptor(x: torch.Tensor):
    """A TMA descriptor over x flattened (one row of x.numel() lanes), boxes of [1, BOX]; the leading stride
    is that of a dimension of one, which no coordinate steps along (rounded up to the 16 bytes asked)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    flat = x.view(1, -1)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * x.element_size(), rank=2)
    stride = -(-flat.shape[1] // 8) * 8
    return TensorDescriptor(flat, [1, flat.shape[1]], [stride, 1], [1, BOX], layout)


def smem_forward(x: torch.Tensor, copy: str, slice_n: int, warps: int, cap: int = 0):
    """A callable writing softmax(x) (a contiguous 2-byte matrix, at most 2^31 elements) with `copy`
    staging slices of slice_n lanes on `warps` warps, `cap` registers a thread at most (0: the compiler's
    choice); the workspace is the callable's own, left zeroed."""
    if x.element_size() != 2 or not x.is_contiguous() or x.numel() >= 2**31 or x.data_ptr() % 16:
        raise ValueError("a contiguous, 16-byte aligned 2-byte matrix of fewer than 2^31 elements")
    m, n = x.shape
    k = splits(n, slice_n)
    if k > MAX_SPLITS_POW2:
        raise ValueError(f"{k} slices a row; at most {MAX_SPLITS_POW2}")
    y = torch.empty_like(x)
    parts = torch.empty(2, m * k, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + m, device=x.device, dtype=torch.int32)
    desc = _descriptor(x) if copy == "tma" else None
    meta = {**_meta(copy, slice_n, warps), "num_warps": warps, **({"maxnreg": cap} if cap else {})}

    def run():
        _smem_fwd_kernel[(m * k,)](x, y, desc, parts[0], parts[1], sync, n, k, **meta)
        return y

    return run


def round18_candidates(x: torch.Tensor, variants=ROUND18_VARIANTS) -> list[tuple[str, object]]:
    """The auto plan, then each variant whose row fits MAX_SPLITS_POW2 slices."""
    from kernels.softmax import plan_softmax, softmax_fwd
    from kernels.softmax_plan import device_sms

    m, n = x.shape
    y = torch.empty_like(x)
    auto = plan_softmax(m, n, x.dtype, "auto", True, "forward", sms=device_sms())
    out = [("lab:auto", lambda: softmax_fwd(x, auto, out=y))]
    out += [(variant_name(*v), smem_forward(x, *v)) for v in variants if splits(n, v[1]) <= MAX_SPLITS_POW2]
    return out


_SELF_TEST = """
import json, sys, torch
sys.path[:0] = [sys.argv[1]]
from probes import softmax_any_n_smem as smem
from kernels import reference
v = (sys.argv[2], *map(int, sys.argv[3:6]))
print(json.dumps(smem.compile_facts(*v)), flush=True)
for n, dtype in ((2 * v[1] + 2077, torch.bfloat16), (3 * v[1], torch.float16), (v[1] + 13, torch.bfloat16)):
    x = (torch.randn(67, n, device="cuda", generator=torch.Generator("cuda").manual_seed(n)) * 3).to(dtype)
    x[5] = -float("inf")
    x[6, : n // 2] = -float("inf")
    run = smem.smem_forward(x, *v)
    keep = torch.arange(67) != 5
    for _ in range(2):  # twice: the counters must come back zeroed
        y = run().double()
        want = reference.softmax_float64(x)
        assert torch.isnan(y[5]).all() and not torch.isnan(y[keep]).any(), (n, dtype)
        assert (y[keep] - want[keep]).abs().max().item() < 2e-2, (n, dtype)
torch.cuda.synchronize()
print("ok")
"""


def working_variants(variants=ROUND18_VARIANTS, timeout: float = 60.0) -> tuple[list, dict, dict]:
    """(variants that ran right, {name: why not} for the others, {name: compile facts}): each variant is
    compiled for sm_90 and launched on small rows (-inf rows and half rows among them) in a child process of
    its own, all at once, so that a refused launch or a hang costs only that variant; the children's
    compiles fill Triton's cache for the round's own launches."""
    root = str(Path(__file__).resolve().parents[1])
    children = {v: subprocess.Popen([sys.executable, "-c", _SELF_TEST, root, *map(str, v)], text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for v in variants}
    good, bad, facts = [], {}, {}
    end = time.time() + timeout  # one timeout for them all: they run side by side
    for v, child in children.items():
        name = variant_name(*v)
        try:
            stdout, stderr = child.communicate(timeout=max(1.0, end - time.time()))
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
            stderr += f"\ntimed out after {timeout:.0f} s"
        lines = stdout.strip().splitlines()
        if lines and lines[0].startswith("{"):
            facts[name] = json.loads(lines[0])
        if child.returncode == 0 and lines and lines[-1] == "ok":
            good.append(v)
        else:
            bad[name] = (stderr or stdout).strip().splitlines()[-3:]
    return good, bad, facts


def run_round18(result: dict, start: float, deadline: float, rounds: int, out: Path) -> list[dict]:
    tma = torch.cuda.get_device_capability() >= (9, 0)
    variants, refused, facts = working_variants([v for v in ROUND18_VARIANTS if tma or v[0] != "tma"])
    result["round18"] = {"variants": [variant_name(*v) for v in variants], "refused": refused,
                         "compiled_sm90": facts}
    print(json.dumps(result["round18"]), flush=True)
    write_output(out, result)
    return time_forward_shapes(result, start, deadline, rounds, out, list(ROUND18_N),
                               lambda x: round18_candidates(x, variants))


# Compiled for sm_90 without a GPU: the signature a launch would specialise, ptxas -v for registers and spills.

def _signature(copy: str, dtype: torch.dtype) -> tuple[dict, dict]:
    from triton.runtime.jit import mangle_type

    x = torch.empty(64, 4096, dtype=dtype)
    ptr = "*" + {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    sig = {"x_ptr": ptr, "y_ptr": ptr, "x_desc": mangle_type(_descriptor(x)) if copy == "tma" else "constexpr",
           "part_m_ptr": "*fp32", "part_d_ptr": "*fp32", "sync_ptr": "*i32", "n_cols": "i32", "n_splits": "i32"}
    attrs = {(_smem_fwd_kernel.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items() if v[0] == "*"}
    return sig, attrs


def compile_variant(copy: str, slice_n: int, warps: int, cap: int = 0, dtype: torch.dtype = torch.bfloat16,
                    arch: int = 90):
    """The compiled kernel of a variant for sm_`arch` (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig, attrs = _signature(copy, dtype)
    meta = _meta(copy, slice_n, warps)
    constexprs = {**meta, **({} if copy == "tma" else {"x_desc": None})}
    src = GluonASTSource(_smem_fwd_kernel, {**sig, **dict.fromkeys(meta, "constexpr")}, constexprs, attrs)
    options = {"num_warps": warps, **({"maxnreg": cap} if cap else {})}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def compile_facts(copy: str, slice_n: int, warps: int, cap: int = 0, dtype: torch.dtype = torch.bfloat16,
                  arch: int = 90) -> dict:
    """Registers a thread, spilled bytes, shared bytes and programs an SM (probes/compiled.py's rules)."""
    compiled = compile_variant(copy, slice_n, warps, cap, dtype, arch)
    regs, spills = ptxas_registers(compiled, arch)
    shared = compiled.metadata.shared
    fit = occupancy(regs, warps, shared)
    return {"n_regs": regs, "spill_bytes": spills, "shared_bytes": shared, "programs_an_sm": fit.programs,
            "limit": fit.limit}


SHAPES = ROUND18_N


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", action="store_true", help="compile every variant for sm_90 and print its facts")
    parser.add_argument("--out", type=Path, help="the round's JSON output (GPU)")
    parser.add_argument("--deadline", type=float, default=480.0, help="stop starting shapes after this many s")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds a shape")
    args = parser.parse_args(argv)
    if not args.facts:
        if args.out is None:
            parser.error("--out FILE runs the round on a GPU; --facts compiles without one")
        if not torch.cuda.is_available():
            print("softmax_any_n_smem: needs a CUDA GPU", file=sys.stderr)
            return 2
        start = time.time()
        result = probe_header(timing=LAB_TIMING, round=18, rows=[])
        result["rows"] = run_round18(result, start, args.deadline, args.rounds, args.out)
        result["wall_s"] = time.time() - start
        write_output(args.out, result)
        return 0
    for v in ROUND18_VARIANTS:
        for dtype in (torch.bfloat16, torch.float16):
            try:
                facts = compile_facts(*v, dtype=dtype)
            except Exception as e:  # a variant that does not compile is a finding, not a crash
                facts = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(json.dumps({"variant": variant_name(*v), "dtype": str(dtype)[6:], **facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
