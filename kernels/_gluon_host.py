"""Host-side pieces the Gluon attention kernels share (kernels/attention_gluon.py, attention_bwd_gluon.py,
attention_bwd_q_gluon.py): tensor descriptors, the key mask's launch arguments, and compiling a kernel for
sm_90 from its launch arguments alone, which is how the CPU checks that the kernels build (registers, shared
memory, spills) without a GPU."""

from __future__ import annotations

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A 4-D tensor descriptor over t (batch, heads, seq, head_dim), boxes of [1, 1, block_rows, head_dim];
    rows past seq read as zeros."""
    shape = [1, 1, block_rows, t.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(shape, GL_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), shape, layout)


def key_mask_args(key_mask: torch.Tensor | None) -> tuple:
    """(mask as bytes, batch stride, key stride) for a bool key mask [batch, seq_k]; (None, None, None) without."""
    if key_mask is None:
        return None, None, None
    return key_mask.view(torch.uint8), key_mask.stride(0), key_mask.stride(1)


def compile_kernel_for_sm90(fn, args: tuple, meta: dict, num_warps: int, maxnreg: int):
    """A Gluon kernel compiled for sm_90 from its launch arguments (tensors on the 'meta' device will do)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    signature, constants, attrs = dict.fromkeys(meta, "constexpr"), dict(meta), {}
    for i, (name, arg) in enumerate(zip(fn.arg_names, args)):
        if arg is None:
            signature[name], constants[name] = "constexpr", None
        elif isinstance(arg, torch.Tensor):
            signature[name] = "*u8" if arg.dtype == torch.uint8 else mangle_type(arg)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if isinstance(arg, float) else "i32" if isinstance(arg, int) else mangle_type(arg)
    constants = {(fn.arg_names.index(name),): value for name, value in constants.items()}
    src = GluonASTSource(fn, signature, constants, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "maxnreg": maxnreg})
