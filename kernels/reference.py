"""Plain-PyTorch references for the lab's kernels, shared by the tests and the experiments.

Element counts per line are for an M x N input; the naive softmax moves 5MN + 2M reads and 3MN + 2M
writes in total, against MN reads and MN writes for a fused kernel.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of a 2-D tensor, one PyTorch operation per step (five kernels)."""
    m = x.max(dim=1).values  # reads MN, writes M
    z = x - m[:, None]  # reads MN + M, writes MN
    e = torch.exp(z)  # reads MN, writes MN
    d = e.sum(dim=1)  # reads MN, writes M
    return e / d[:, None]  # reads MN + M, writes MN


def torch_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch.softmax in the input's dtype (PyTorch's own fused kernel)."""
    return torch.softmax(x, dim=dim)


@functools.cache
def _compiled_softmax():
    return torch.compile(lambda x: torch.softmax(x, dim=-1), dynamic=False)


def compiled_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax along the last dim through torch.compile (Inductor generates a Triton kernel)."""
    return _compiled_softmax()(x)


def softmax_float64(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The accuracy reference: softmax computed in float64 (returned in float64)."""
    return torch.softmax(x.double(), dim=dim)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """dx = y * (dy - <dy, y>): the softmax gradient from the saved output, without the Jacobian."""
    dot = (y * dy).sum(dim=dim, keepdim=True)
    return y * (dy - dot)


def torch_softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """PyTorch's fused softmax backward kernel (what autograd runs after torch.softmax)."""
    return torch._softmax_backward_data(dy, y, -1, y.dtype)


@functools.cache
def _compiled_softmax_backward():
    return torch.compile(softmax_backward, dynamic=False)


def compiled_softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The backward formula through torch.compile."""
    return _compiled_softmax_backward()(y, dy)


def rmsnorm_linear_reference(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6):
    """F.linear(F.rms_norm(x, (K,), gamma, eps), weight): the unfused pair the fused kernel replaces."""
    return F.linear(F.rms_norm(x, (x.shape[-1],), gamma, eps), weight)


def rmsnorm_linear_float64(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6):
    """The accuracy reference for rmsnorm_linear, in float64."""
    x64 = x.double()
    inv_rms = torch.rsqrt(x64.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x64 * inv_rms * gamma.double()) @ weight.double().T


def int8_linear_reference(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantise, then F.linear, in x's dtype (float64 in, float64 out): x @ (w_q * scales[:, None])^T."""
    w = w_q.to(x.dtype) * scales.to(x.dtype)[:, None]
    return F.linear(x, w)


def unpack_int4_reference(w_packed: torch.Tensor, group_size: int) -> torch.Tensor:
    """The signed int4 values [N, K] (int64) read element by element from the documented layout: k = g*G + i
    sits in byte g*G/2 + (i mod G/2), in the low nibble for i < G/2 and the high nibble otherwise, as q + 8."""
    n_cols, n_bytes = w_packed.shape
    k = torch.arange(2 * n_bytes, device=w_packed.device)
    g, i = k // group_size, k % group_size
    half = group_size // 2
    byte = w_packed.long()[:, g * half + i % half]
    shift = torch.where(i < half, 0, 4)
    return ((byte >> shift) & 0xF) - 8


def int4_linear_reference(x: torch.Tensor, w_packed: torch.Tensor, scales: torch.Tensor, group_size: int = 128):
    """Dequantise (q * the scale of q's group), then F.linear, in x's dtype (float64 in, float64 out)."""
    q = unpack_int4_reference(w_packed, group_size).to(x.dtype)
    w = q * scales.to(x.dtype).repeat_interleave(group_size, dim=1)
    return F.linear(x, w)
