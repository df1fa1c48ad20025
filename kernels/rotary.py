"""Rotary embedding of a decoder layer's queries and keys, fused with the split of the packed QKV projection into
heads and the write of keys and values into their destination (a KV cache at decode).

For one token at position p, head vector t [D] and the pair (t1, t2) = (t[:D/2], t[D/2:]) (Llama's half
rotation, kernels/reference_decoder.py `rotary`):

    theta_i = p * inv_freq_i,   inv_freq_i = base^(-2i/D)            (i < D/2, fp32 as Llama's code)
    out[:D/2] = t1 cos(theta) - t2 sin(theta),   out[D/2:] = t2 cos(theta) + t1 sin(theta)

One program reads one token's row of the packed projection, qkv [(H + 2 Hkv) D] (query heads, then key heads,
then value heads), turns the query and key heads, and writes the queries to q [B, H, S, D], the keys and
values to k and v [B, Hkv, S, D]: any strides, so k and v may be slices of a cache [B, Hkv, capacity, D]
(the decode step's write, with no copy of its own). Angles come from the position and inv_freq in fp32 on
chip; no cos/sin tables are read.

Bytes: the row read once, (H + 2 Hkv) D elements, and written once: 2 (H + 2 Hkv) D size per token, plus
inv_freq (D/2 fp32, from L2). Torch's unfused form (reference_decoder.rotary) reads and writes q and k four
to six times over (cat, negation, two products, a sum, the copies into the cache).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_device, check_dtype
from kernels._launch import aligned, bind

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


@triton.jit(do_not_specialize=["pos0"])
def _rotary_qkv_kernel(
    qkv_ptr, q_ptr, k_ptr, v_ptr, inv_freq_ptr, pos_ptr, pos0,
    seq, stride_xb, stride_xs, stride_pos, stride_f, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh,
    stride_ks, stride_vb, stride_vh, stride_vs,
    N_HEADS: tl.constexpr, N_KV_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    POS_TENSOR: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # token b * seq + s
    b = row // seq
    s = row % seq
    if POS_TENSOR:
        p = tl.load(pos_ptr + s * stride_pos).to(tl.float32)
    else:
        p = (pos0 + s).to(tl.float32)
    i = tl.arange(0, HALF)
    theta = p * tl.load(inv_freq_ptr + i.to(tl.int64) * stride_f)
    cos = tl.cos(theta)[None, :]
    sin = tl.sin(theta)[None, :]
    src = qkv_ptr + b * stride_xb + s * stride_xs  # the row of token (b, s); unit stride along it
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # over the H + 2 Hkv heads of the row
    col = heads[:, None] * (2 * HALF) + i[None, :]
    live = heads[:, None] < N_HEADS + 2 * N_KV_HEADS
    t1 = tl.load(src + col, mask=live, other=0.0).to(tl.float32)
    t2 = tl.load(src + col + HALF, mask=live, other=0.0).to(tl.float32)
    turned = heads[:, None] < N_HEADS + N_KV_HEADS  # queries and keys turn; values pass through
    o1 = tl.where(turned, t1 * cos - t2 * sin, t1)
    o2 = tl.where(turned, t2 * cos + t1 * sin, t2)
    is_q = heads[:, None] < N_HEADS
    is_k = turned & ~is_q
    is_v = live & ~turned
    hq = heads[:, None]
    hk = heads[:, None] - N_HEADS
    hv = heads[:, None] - N_HEADS - N_KV_HEADS
    q_dst = q_ptr + b * stride_qb + hq.to(tl.int64) * stride_qh + s * stride_qs + i[None, :]
    k_dst = k_ptr + b * stride_kb + hk.to(tl.int64) * stride_kh + s * stride_ks + i[None, :]
    v_dst = v_ptr + b * stride_vb + hv.to(tl.int64) * stride_vh + s * stride_vs + i[None, :]
    tl.store(q_dst, o1.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(q_dst + HALF, o2.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(k_dst, o1.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_dst + HALF, o2.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(v_dst, o1.to(v_ptr.dtype.element_ty), mask=is_v)
    tl.store(v_dst + HALF, o2.to(v_ptr.dtype.element_ty), mask=is_v)


def _block_h(half: int) -> int:
    """Heads a program turns: about 2,048 elements a program (16 heads of 128, 32 of 64)."""
    return max(1, min(64, 1024 // half))


# A bound launcher per layout: everything that fixes the compiled kernel, its grid and its fixed arguments
# (every stride the kernel reads: qkv's, positions', inv_freq's, and those of the given k_out and v_out).
_ROUTES: dict[tuple, object] = {}


def _check(op, qkv, n_heads, n_kv_heads, head_dim, inv_freq, positions, k_out, v_out):
    check_dtype(op, "qkv", qkv, SUPPORTED_DTYPES)
    if qkv.dim() != 3:
        raise ValueError(f"{op}: qkv must have shape [B, S, (n_heads + 2 * n_kv_heads) * head_dim], got {tuple(qkv.shape)}.")
    for name, value in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{op}: {name} must be a positive int, got {value!r}.")
    if head_dim % 2 or head_dim > MAX_HEAD_DIM or head_dim & (head_dim - 1):
        raise ValueError(f"{op}: head_dim must be an even power of two up to {MAX_HEAD_DIM}, got {head_dim}.")
    width = (n_heads + 2 * n_kv_heads) * head_dim
    if qkv.shape[-1] != width:
        raise ValueError(f"{op}: qkv's last dimension is {qkv.shape[-1]}; (n_heads + 2 * n_kv_heads) * head_dim = "
                         f"({n_heads} + 2 * {n_kv_heads}) * {head_dim} = {width}.")
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.dtype != torch.float32 or inv_freq.shape != (head_dim // 2,):
        raise ValueError(f"{op}: inv_freq must be a float32 tensor of shape [{head_dim // 2}] (head_dim / 2), got "
                         f"{getattr(inv_freq, 'dtype', type(inv_freq).__name__)} {tuple(getattr(inv_freq, 'shape', ()))}.")
    batch, seq = qkv.shape[:2]
    if isinstance(positions, torch.Tensor):
        if positions.shape != (seq,) or positions.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{op}: positions must be an int start or an int32/int64 tensor of shape [{seq}] (S), got "
                             f"{positions.dtype} {tuple(positions.shape)}.")
    elif isinstance(positions, bool) or not isinstance(positions, int) or positions < 0:
        raise ValueError(f"{op}: positions must be an int start >= 0 or a tensor of positions, got {positions!r}.")
    for name, t in (("k_out", k_out), ("v_out", v_out)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.shape != (batch, n_kv_heads, seq, head_dim) or t.dtype != qkv.dtype:
            raise ValueError(f"{op}: {name} must be a tensor [B, n_kv_heads, S, head_dim] = "
                             f"{(batch, n_kv_heads, seq, head_dim)} of {qkv.dtype}, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}.")
        if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
            raise ValueError(f"{op}: {name} has elements that overlap in memory (stride 0 along a dimension of size "
                             f"> 1, as expand() makes), got strides {tuple(t.stride())}; it is written in place, so "
                             "every element needs memory of its own.")
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} is written in place and needs unit stride along head_dim (any other "
                             f"strides are accepted), got strides {tuple(t.stride())}.")
    if k_out is not None and v_out is not None and k_out.numel() and k_out.data_ptr() == v_out.data_ptr():
        raise ValueError(f"{op}: k_out and v_out are the same memory; keys and values need separate tensors.")
    check_device(op, *(t for t in (qkv, inv_freq, positions, k_out, v_out) if isinstance(t, torch.Tensor)))


def rotary_qkv(qkv: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int, inv_freq: torch.Tensor,
               positions: int | torch.Tensor, *, k_out: torch.Tensor | None = None,
               v_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [B, H, S, D], k, v [B, Hkv, S, D]) from the packed projection qkv [B, S, (H + 2 Hkv) D]: queries and
    keys turned by the rotary embedding at positions (an int start p for p..p+S-1, or a [S] int tensor),
    values as they are. k and v are written into `k_out` / `v_out` when given (e.g. cache slices
    cache.k[:, :, p:p+S]; any strides with unit stride along D and no two elements in one place), else into
    new tensors. inv_freq: float32 [D/2], base^(-2i/D). dtype float32, float16 or bfloat16; D an even power of
    two up to 256. Inference only (no gradient). On CUDA, or on the CPU with TRITON_INTERPRET=1.

    Layouts: qkv, positions and inv_freq are read in place with any batch, sequence and element strides (a
    batch slice x[:, :k], a [S, B, W] storage transposed to [B, S, W], positions[::2], expanded views),
    except that qkv with a non-unit stride along its last dimension is copied once (qkv.contiguous(), one
    extra read and write of it) so that each head's row stays one contiguous load.
    """
    pos_tensor = isinstance(positions, torch.Tensor)
    try:  # a layout seen before was checked then
        key = (qkv.shape, qkv.stride(), qkv.dtype, qkv.device, n_heads, n_kv_heads, head_dim, pos_tensor,
               None if k_out is None else (k_out.stride(), k_out.dtype, aligned(k_out)),
               None if v_out is None else (v_out.stride(), v_out.dtype, aligned(v_out)),
               aligned(qkv), inv_freq.__class__, inv_freq.shape, inv_freq.stride(), inv_freq.dtype, inv_freq.device,
               aligned(inv_freq),
               (positions.shape, positions.stride(), positions.dtype, positions.device, aligned(positions))
               if pos_tensor else None,
               None if k_out is None else (k_out.shape, k_out.device),
               None if v_out is None else (v_out.shape, v_out.device))
        route = _ROUTES.get(key)
    except Exception:  # noqa: BLE001 - not tensors, or unhashable: the checks say what is wrong
        route = None
    if route is None or torch.compiler.is_compiling() or not (pos_tensor or (type(positions) is int and positions >= 0)):
        _check("rotary_qkv", qkv, n_heads, n_kv_heads, head_dim, inv_freq, positions, k_out, v_out)
    batch, seq = qkv.shape[:2]
    if qkv.stride(-1) != 1:  # rows must be contiguous runs for the kernel's loads: one documented copy
        qkv = qkv.contiguous()
    q = torch.empty((batch, n_heads, seq, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((batch, n_kv_heads, seq, head_dim), dtype=qkv.dtype, device=qkv.device) if k_out is None else k_out
    v = torch.empty((batch, n_kv_heads, seq, head_dim), dtype=qkv.dtype, device=qkv.device) if v_out is None else v_out
    if batch * seq == 0:
        return q, k, v
    pos_arg = positions if pos_tensor else inv_freq  # never read without POS_TENSOR
    pos0 = 0 if pos_tensor else int(positions)  # a runtime argument: one compiled kernel for every start
    if route is None or torch.compiler.is_compiling():
        half = head_dim // 2
        block_h = _block_h(half)
        grid = (batch * seq, triton.cdiv(n_heads + 2 * n_kv_heads, block_h))
        fixed = (seq, qkv.stride(0), qkv.stride(1), positions.stride(0) if pos_tensor else 0, inv_freq.stride(0),
                 *q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
        route = bind(_rotary_qkv_kernel, grid, (qkv, q, k, v, inv_freq, pos_arg, pos0, *fixed), varying=7, scalars=1,
                     N_HEADS=n_heads, N_KV_HEADS=n_kv_heads, HALF=half, BLOCK_H=block_h, POS_TENSOR=pos_tensor,
                     num_warps=4)
        if not torch.compiler.is_compiling():
            _ROUTES[key] = route
    route(qkv, q, k, v, inv_freq, pos_arg, pos0)
    return q, k, v
