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
