"""What the int4 Gluon probes share: prepacked weights enough to read past the L2, and kernels/int4_gluon.py's
words turned into the MMA's register operand in its plain form (the offset left to the caller), as the kernel
did before the offset moved to the ALU. Shared by probes; not a probe itself.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from checks.decode_probe import n_copies
from kernels.int4_gluon import Int4Prepacked, prepack_int4



def int4_prepacked_copies(w_packed: torch.Tensor, scales: torch.Tensor, group: int, nbytes: int) -> list:
    """prepack_int4's weight and copies of it, enough that a call rotating through them reads `nbytes` past L2
    (checks/decode_probe.n_copies); the first is the one whose outputs are checked."""
    first = prepack_int4(w_packed, scales, group)
    return [first] + [Int4Prepacked(first.weight.clone(), first.scales.clone(), first.n_cols, first.n_features, group)
                      for _ in range(n_copies(nbytes) - 1)]


@gluon.jit
def int4_arrange(o0, o1, o2, o3, o4, o5, o6, o7, a_layout: gl.constexpr, G: gl.constexpr):
    # Eight halves of a thread's words -> [BLOCK_N, G] in the MMA's register layout (renames only).
    T: gl.constexpr = o0.shape[0]
    v = gl.join(gl.join(gl.join(o0, o1), gl.join(o2, o3)), gl.join(gl.join(o4, o5), gl.join(o6, o7)))
    v = gl.reshape(v, [T // 32, 8, 4, G // 16, 2, 2, 2])  # (w, r, t, c, p, i, h)
    v = gl.permute(v, (0, 6, 1, 3, 5, 2, 4))  # (w, h, r, c, i, t, p)
    v = gl.reshape(v, [T // 2, G])
    return gl.convert_layout(v, a_layout, assert_trivial=True)


@gluon.jit
def int4_unpack_plain(w, DT: gl.constexpr, MAGIC_BITS: gl.constexpr):
    # kernels/int4_gluon.py's unpacking before the offset moved to the ALU. One word (a thread's k-step) ->
    # eight 16-bit 128 + u: (w >> 4j) & 0x000F000F | MAGIC is the bf16x2 pair (nibble j, nibble j + 4),
    # j = 2h + i, register (h, i) of the step.
    asm: gl.constexpr = ("{\n.reg .b32 t, v;\n"
                         f"lop3.b32 v, $8, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\nmov.b32 {{$0, $1}}, v;\n"
                         "shr.b32 t, $8, 4;\n"
                         f"lop3.b32 v, t, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\nmov.b32 {{$2, $3}}, v;\n"
                         "shr.b32 t, $8, 8;\n"
                         f"lop3.b32 v, t, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\nmov.b32 {{$4, $5}}, v;\n"
                         "shr.b32 t, $8, 12;\n"
                         f"lop3.b32 v, t, 0x000F000F, {MAGIC_BITS:#x}, 0xEA;\nmov.b32 {{$6, $7}}, v;\n}}")
    return gl.inline_asm_elementwise(asm, "=h,=h,=h,=h,=h,=h,=h,=h,r", [w], dtype=(DT.value, ) * 8, is_pure=True,
                                     pack=1)


@gluon.jit
def int4_operand_plain(w, a_layout: gl.constexpr, DT: gl.constexpr, MAGIC_BITS: gl.constexpr, G: gl.constexpr):
    # The words as V = 128 + u (float16: 1024 + u), the offset left to the caller.
    o0, o1, o2, o3, o4, o5, o6, o7 = int4_unpack_plain(w, DT, MAGIC_BITS)
    return int4_arrange(o0, o1, o2, o3, o4, o5, o6, o7, a_layout, G)
