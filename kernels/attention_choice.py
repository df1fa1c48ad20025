"""Which attention kernels run: the Triton forward and backward (kernels/attention_kernels.py) or the Gluon
kernels for Hopper (kernels/attention_gluon.py; the backward's attention_bwd_gluon.py and attention_bwd_q_gluon.py). Pure rules over facts the caller gathers (kernels/attention.py's forward_impl
and plan_forward_on): the device's compute capability, whether Gluon imports, head_dim, dtype, whether the
tensors fit descriptors, the interpreter, the sequence lengths, and the caller's `impl` ("auto", "triton",
"gluon"; $LAB_ATTENTION_IMPL where none is given).
"""

from __future__ import annotations

import functools
import importlib
import math
import os

import torch


IMPLS = ("auto", "triton", "gluon")
IMPL_ENV = "LAB_ATTENTION_IMPL"  # the default of `impl` where the caller gives none
# The Gluon forward's fixed plan (kernels/attention_gluon.py): 2 x 64 queries a program, 128 keys a tile,
# 4 + 4 + 1 warps (two consumer warpgroups and a loader; 12 launched, whole warpgroups), K/V ring stages by head dim.
GLUON_BLOCK_M, GLUON_BLOCK_N, GLUON_WARPS = 128, 128, 12
GLUON_STAGES = {64: 3, 128: 2}
# Ping-pong consumers (at both head dims) and a 3-stage ring (at 128), timed beside this plan
# (notes/attention.md, 2026-11-26): none ran more than 3% above it at any point, several 3-9% below, so
# the plan keeps consumers that do not take turns and the stages above.
GLUON_PINGPONG = False
# A persistent grid (one program an SM walking query tiles, causal ones longest first across every head, the
# next tile's Q and first K/V loading while the last tile's value product and O store finish), timed beside
# the plan (notes/attention.md, 2026-11-27, H100, bf16, TFLOP/s): head dim 128 without a mask 512 against 481
# at S = 1024, 581 against 563 at 4096, but 505 against 547 at 2048 and 574 against 599 at 8192; causal 20-24%
# lower from 1024 to 8192 (longest first across heads puts 132 heads' keys in flight at once, more than the
# L2 holds). Revised (causal tiles head by head as the plan orders them, two Q buffers; 2026-11-27): +13-18% at
# 1,024 keys without a mask, where the plan runs the Triton forward, and at or below the plan everywhere else.
GLUON_PERSISTENT = False
# Without the causal mask, the persistent grid with one Q buffer: the plan's kernel on one program an SM, each
# program's next Q loading only once both consumers are done with the last (notes/attention.md, "One Q buffer on
# the persistent grid", 2026-11-27). A key tile costs what the plan's does on both cards; the launch and first
# loads are paid once an SM. H100 (GPU time, head dim 128, bf16, one run): 0.937 / 0.980 / 1.009 of cuDNN at
# S = 2,048 / 4,096 / 8,192 against the plan's 0.899 / 0.960 / 0.975; H200: 6% and 3% faster than the plan at
# 2,048 and 4,096 keys. With the causal mask it was not faster (tiles of unequal length in a fixed order).
GLUON_PERSISTENT_UNMASKED = True
# With the causal mask, the persistent grid with two Q buffers and tiles handed out on demand: each program takes
# the next query tile (in the plan's order, longest first within a head) from a counter when its loader is ready
# for one, so programs stay balanced over tiles of unequal length as the hardware's hand-out of one program a
# tile keeps them, without a cold start a tile (round attention-causal-dynamic, notes/attention.md, 2026-11-28).
# H100 (GPU time, head dim 128, bf16, twelve alternating rounds): 1.048 / 1.104 / 1.080 / 1.050x the plan of one
# program a tile at S = 1,024 / 2,048 / 4,096 / 8,192; 1.031 / 1.049 / 1.076x cuDNN from 2,048 keys on.
GLUON_ON_DEMAND_CAUSAL = True
# Half of each unmasked tile's exponentials computed on the FMA pipe (a degree-4 polynomial and an exponent add)
# instead of the MUFU: at head dim 64 the MUFU's 16 a clock an SM take as long as the tile's products. Read
# offline (compiled for sm_90a, head dim 64, one unmasked tile a warpgroup thread): MUFU 66 -> 34, FP32 pipe
# 168 -> 392, no spills, no shuffles. Timed on the H100 (2026-11-27): 9-21% slower than the plan at every point.
GLUON_EXP_SPLIT = False
# Where "auto" takes the Gluon forward once it can run: (head dim, causal) -> the fewest keys; none listed, never.
# Measured on the H100 (bf16, GPU time) with O in 16-byte stores and the persistent grid without the mask
# (round attention-short-keys, notes/attention.md, 2026-11-28), Gluon against the Triton forward at 512 / 1,024 /
# 2,048 keys: head dim 128 1.24 / 1.29 / 1.33x without the mask, 0.88 / 0.99 / 1.12x causal (one program a tile;
# tiles on demand ran 1.05x that at 1,024 keys, not enough to call); head dim 64 0.72 / 1.06 / 1.07x without the
# mask, 0.73 / 0.83 / 0.96x causal. Below 512 keys: not timed, the Triton forward. Head dim 64 with the causal
# mask from 1,024 keys (round attention-head-dim-64, H200, 2026-11-28, B x S = 16,384, 32 heads): the Gluon forward
# with tiles on demand ran 1.05-1.09x the Triton forward from 2,048 keys, and with 64-key tiles two programs an SM
# (GLUON_TWO_PROGRAMS_BELOW_KEYS) 1.14x at 1,024 and 1.11x at 2,048; at 512 the Triton forward was 1.04x faster.
# At 1,024 keys, head dim 128 with the mask, tiles on demand were level with the Triton forward (1.008x, H200).
GLUON_AUTO_MIN_KEYS = {(128, False): 512, (128, True): 2048, (64, False): 1024, (64, True): 1024}
# (head dim, causal) -> the key count below which the Gluon forward runs 64-key tiles two programs an SM
# (kernels/attention_gluon.py's REGISTERS) instead of 128-key tiles one program an SM. Round attention-head-dim-64
# (H200, GPU time, against 128-key tiles): causal 1.34 / 1.06x at 1,024 / 2,048 keys, level at 3,000 (0.995x),
# 0.93-0.97x from 4,096 on; without the mask 0.91-1.00x from 1,024 keys on, so never there.
GLUON_TWO_PROGRAMS_BELOW_KEYS = {(64, True): 3000}
# Where "auto" takes the Gluon backward (kernels/attention_bwd_gluon.py's dK/dV and attention_bwd_q_gluon.py's
# dQ) once it can run: the fewest queries and keys. Measured on the H100 (bf16, notes/attention.md,
# 2026-11-27): the whole backward (delta, dK/dV, dQ) ran 1.10-1.20x the Triton backward at every point timed,
# S = 1,024 to 8,192 at head dim 128 and 1,024 and 4,096 at 64, causal and not; shorter lengths not timed.
GLUON_BWD_AUTO_MIN_LENGTH = 1024
# Query lengths up to this stay on the Triton kernel's 64-row tiles (kernels/attention.py's SHORT_QUERY_MAX;
# not timed): a 128-query program would leave at least half its rows empty.
GLUON_MAX_SHORT_QUERIES = 64
GLUON_DTYPES = (torch.float16, torch.bfloat16)


def gluon_forward_refusal(capability: tuple[int, int] | None, gluon_imports: bool, head_dim: int,
                          dtype: torch.dtype, descriptors_fit: bool, interpreter: bool,
                          direction: str = "forward") -> str | None:
    """Why the Gluon forward (direction "backward": the Gluon backward kernels) cannot run these inputs
    (None: it can). capability: the CUDA device's (major, minor), None off CUDA; descriptors_fit: q, k and v
    (and dO in the backward) take tensor descriptors (16-byte aligned bases and strides, positive strides,
    unit last stride)."""
    tensors = "q, k or v" if direction == "forward" else "q, k, v or dO"
    if interpreter:
        return "Triton's interpreter does not run Gluon kernels"
    if capability is None or capability[0] != 9:
        return f"the Gluon {direction} is written for Hopper (sm_90); the device is {capability or 'not CUDA'}"
    if not gluon_imports:
        return "triton.experimental.gluon does not import in this Triton"
    if head_dim not in GLUON_STAGES:
        return f"head_dim {head_dim} is not one of the Gluon {direction}'s {tuple(GLUON_STAGES)}"
    if dtype not in GLUON_DTYPES:
        return f"dtype {dtype} is not float16 or bfloat16"
    if not descriptors_fit:
        return f"{tensors} does not fit a tensor descriptor (16-byte aligned base and strides, positive strides)"
    return None


def gluon_forward_tiles(head_dim: int, seq_k: int, causal: bool) -> tuple[int, int]:
    """(keys a tile, programs an SM) of the Gluon forward at this head dim, key count and mask
    (GLUON_TWO_PROGRAMS_BELOW_KEYS)."""
    if seq_k < GLUON_TWO_PROGRAMS_BELOW_KEYS.get((head_dim, bool(causal)), 0):
        return 64, 2
    return GLUON_BLOCK_N, 1


def gluon_preferred(head_dim: int, seq_q: int, seq_k: int, causal: bool) -> bool:
    """Whether "auto" takes the Gluon forward for these sizes where it can run (GLUON_AUTO_MIN_KEYS)."""
    return seq_q > GLUON_MAX_SHORT_QUERIES and seq_k >= GLUON_AUTO_MIN_KEYS.get((head_dim, bool(causal)), math.inf)


def choose_forward_impl(impl: str, capability: tuple[int, int] | None, gluon_imports: bool, head_dim: int,
                        dtype: torch.dtype, descriptors_fit: bool, interpreter: bool, seq_q: int,
                        seq_k: int, causal: bool) -> str:
    """"triton" or "gluon", the forward kernel that runs. "auto": Gluon where it can run and is preferred
    (gluon_preferred), else Triton; "triton": always Triton; "gluon": Gluon, or ValueError naming why it
    cannot run."""
    if impl not in IMPLS:
        raise ValueError(f"attention: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    if impl == "triton":
        return "triton"
    refusal = gluon_forward_refusal(capability, gluon_imports, head_dim, dtype, descriptors_fit, interpreter)
    if impl == "gluon" and refusal is not None:
        raise ValueError(f"attention: impl='gluon' cannot run here: {refusal}.")
    if refusal is None and (impl == "gluon" or gluon_preferred(head_dim, seq_q, seq_k, causal)):
        return "gluon"
    return "triton"


def choose_backward_impl(impl: str, capability: tuple[int, int] | None, gluon_imports: bool, head_dim: int,
                         dtype: torch.dtype, descriptors_fit: bool, interpreter: bool, seq_q: int,
                         seq_k: int) -> str:
    """"triton" or "gluon", the backward kernels that run (dK/dV and dQ together). "auto": Gluon where it can
    run and both lengths reach GLUON_BWD_AUTO_MIN_LENGTH, else Triton; "triton": always Triton; "gluon":
    Gluon, or ValueError naming why it cannot run."""
    if impl not in IMPLS:
        raise ValueError(f"attention: impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")
    if impl == "triton":
        return "triton"
    refusal = gluon_forward_refusal(capability, gluon_imports, head_dim, dtype, descriptors_fit, interpreter,
                                    "backward")
    if impl == "gluon" and refusal is not None:
        raise ValueError(f"attention: impl='gluon' cannot run the backward here: {refusal}.")
    if refusal is None and (impl == "gluon" or min(seq_q, seq_k) >= GLUON_BWD_AUTO_MIN_LENGTH):
        return "gluon"
    return "triton"


@functools.cache
def _modules_import(*names: str) -> bool:
    try:
        for name in names:
            importlib.import_module(name)
    except Exception:  # an older or newer Triton without these names
        return False
    return True


def gluon_backward_imports() -> bool:
    """Whether the Gluon backward's modules import."""
    return _modules_import("kernels.attention_bwd_gluon", "kernels.attention_bwd_q_gluon")


def gluon_imports() -> bool:
    """Whether the Gluon forward's module imports (triton.experimental.gluon with Hopper's TMA and wgmma)."""
    return _modules_import("kernels.attention_gluon")


def default_impl() -> str:
    """The `impl` a caller who gives none asks for: $LAB_ATTENTION_IMPL, or "auto"."""
    return os.environ.get(IMPL_ENV, "auto")
