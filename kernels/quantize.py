"""Weight-only quantisation for kernels/dequant_linear.py: symmetric int8 per output channel, symmetric int4
per group of `group_size` consecutive inputs, and the int4 packing the kernel reads. Plain PyTorch, run once
per weight (not on any hot path).

    int8:  s_n = max_k |W_nk| / 127,            q_nk = round(W_nk / s_n)         in -127..127
    int4:  s_ng = max_{k in g} |W_nk| / 7,      q_nk = round(W_nk / s_ng)        in -7..7, stored u = q + 8

int4 packing, uint8 [N, K/2]: each group of G consecutive k of a row takes G/2 consecutive bytes; byte j of
group g holds u at k = g*G + j in bits 0-3 and u at k = g*G + G/2 + j in bits 4-7:

    byte[n, g*G/2 + j] = u[n, g*G + j] | (u[n, g*G + G/2 + j] << 4)        0 <= j < G/2

(torch's own int4 layout pairs neighbours, k = 2j and 2j + 1; this one pairs the two halves of a group so
that a kernel's load of one group meets two contiguous runs of x). Scales are [N, K/G] in the weight's
dtype; an all-zero row or group gets scale 1 (its q are all 0), so dequantising never divides by zero.
"""

from __future__ import annotations

import torch

GROUP_SIZES = (32, 64, 128, 256)  # powers of two: a group is one K-step of the kernel, half a group >= 16
INT8_MAX = 127
INT4_MAX = 7
INT4_OFFSET = 8


def _check_weight(op: str, weight: torch.Tensor) -> None:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{op}: weight must be a torch.Tensor, got {type(weight).__name__}.")
    if not weight.is_floating_point():
        raise TypeError(f"{op}: weight must be a floating-point tensor, got dtype {str(weight.dtype).removeprefix('torch.')}.")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must have shape [N, K], got {tuple(weight.shape)}.")


def check_group_size(op: str, group_size, n_features: int) -> None:
    """group_size must be one of the supported powers of two and divide K."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in GROUP_SIZES:
        raise ValueError(f"{op}: group_size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size!r}.")
    if n_features % group_size:
        raise ValueError(f"{op}: K = {n_features} is not a multiple of group_size = {group_size}.")


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q int8 [N, K], scales [N] in weight's dtype) with weight ≈ w_q * scales[:, None]."""
    _check_weight("quantize_int8", weight)
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / INT8_MAX).to(weight.dtype)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    w_q = torch.round(w / scales.float()[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return w_q, scales


def quantize_int4(weight: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_packed uint8 [N, K/2], scales [N, K/group_size] in weight's dtype), packed as the module docstring
    lays out; unpack_int4 inverts the packing."""
    _check_weight("quantize_int4", weight)
    n_cols, n_features = weight.shape
    check_group_size("quantize_int4", group_size, n_features)
    groups = weight.detach().float().reshape(n_cols, n_features // group_size, group_size)
    scales = (groups.abs().amax(dim=2) / INT4_MAX).to(weight.dtype)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(groups / scales.float()[:, :, None]).clamp_(-INT4_MAX - 1, INT4_MAX).to(torch.int32)
    u = (q + INT4_OFFSET).to(torch.uint8)
    half = group_size // 2
    packed = u[:, :, :half] | (u[:, :, half:] << 4)
    return packed.reshape(n_cols, n_features // 2).contiguous(), scales


def _plain(w_packed, scales, group_size: int, op: str):
    """(w_packed, scales, group_size) in this module's layout; a prepacked weight (kernels/int4_gluon.py's
    Int4Prepacked, which carries its scales and group size) is turned back exactly."""
    if hasattr(w_packed, "unprepack"):
        if scales is not None or group_size not in (None, w_packed.group_size):
            raise ValueError(f"{op}: a prepacked weight carries its scales and group size "
                             f"({w_packed.group_size}); got scales={'given' if scales is not None else None}, "
                             f"group_size={group_size!r}.")
        return (*w_packed.unprepack(), w_packed.group_size)
    return w_packed, scales, 128 if group_size is None else group_size


def unpack_int4(w_packed: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """The signed values q in -8..7 as int8 [N, K] from w_packed uint8 [N, K/2] (group_size 128 if None), or
    from a prepacked weight (prepack_int4)."""
    w_packed, _, group_size = _plain(w_packed, None, group_size, "unpack_int4")
    n_cols, n_bytes = w_packed.shape
    check_group_size("unpack_int4", group_size, 2 * n_bytes)
    b = w_packed.reshape(n_cols, 2 * n_bytes // group_size, group_size // 2)
    u = torch.cat([b & 0xF, b >> 4], dim=2)
    return (u.to(torch.int8) - INT4_OFFSET).reshape(n_cols, 2 * n_bytes)


def dequantize_int8(w_q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """w_q * scales[:, None] in `dtype` (scales' dtype by default)."""
    dtype = dtype or scales.dtype
    return w_q.to(dtype) * scales.to(dtype)[:, None]


def dequantize_int4(w_packed: torch.Tensor, scales: torch.Tensor | None = None, group_size: int | None = None,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """q * scales of each q's group, [N, K] in `dtype` (scales' dtype by default); group_size 128 if None.
    w_packed may be a prepacked weight (prepack_int4), given without scales."""
    w_packed, scales, group_size = _plain(w_packed, scales, group_size, "dequantize_int4")
    if scales is None:
        raise TypeError("dequantize_int4: scales [N, K/G] are required with a uint8 [N, K/2] weight.")
    dtype = dtype or scales.dtype
    q = unpack_int4(w_packed, group_size).to(dtype)
    return q * scales.to(dtype).repeat_interleave(group_size, dim=1)
