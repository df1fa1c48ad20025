"""Plain-PyTorch references for the fused residual add + RMSNorm and SwiGLU kernels, shared by the tests and
the experiments.

Every function computes in the dtype of its inputs, float64 included: the *_float64 helpers cast and call
the same math. They live apart from reference.py because the run records of the softmax and RMSNorm +
linear experiments carry that file's hash; a new function there would mark their evidence stale.

Element counts per line are for M rows of H (add + RMSNorm) or n elements (SwiGLU).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------------------
# Residual add + RMSNorm
# --------------------------------------------------------------------------------------------------------


def add_rmsnorm_reference(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6):
    """(h, y) = (x + residual, F.rms_norm(h, (H,), gamma, eps)): the unfused pair, as eager PyTorch runs it."""
    h = x + residual  # reads 2MH, writes MH
    return h, F.rms_norm(h, (h.shape[-1],), gamma, eps)  # reads MH (fused norm kernel), writes MH


def add_rmsnorm_math(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6):
    """(h, y) written out from the definition, in the inputs' dtype: rstd = 1 / sqrt(mean(h^2) + eps)."""
    h = x + residual
    rstd = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return h, h * rstd * gamma


def add_rmsnorm_float64(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6):
    """The accuracy reference: (h, y) in float64."""
    return add_rmsnorm_math(x.double(), residual.double(), gamma.double(), eps)


def add_rmsnorm_backward(
    h: torch.Tensor, gamma: torch.Tensor, dy: torch.Tensor, dh: torch.Tensor | None = None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dgamma) of add_rmsnorm from h = x + residual and the gradients of y (dy) and of h (dh, or None
    when h is not used downstream); dr = dx. In the inputs' dtype:

        hhat = h * rstd,  g = dy * gamma,  c = mean(g * hhat)
        dx = dh + rstd * (g - hhat * c),  dgamma = sum over rows of dy * hhat
    """
    rstd = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    hhat = h * rstd
    g = dy * gamma
    c = (g * hhat).mean(dim=-1, keepdim=True)
    dx = rstd * (g - hhat * c)
    if dh is not None:
        dx = dx + dh
    dgamma = (dy * hhat).reshape(-1, h.shape[-1]).sum(dim=0)
    return dx, dgamma


def add_rmsnorm_backward_float64(x, residual, gamma, dy, dh=None, eps: float = 1e-6):
    """The backward accuracy reference: (dx, dgamma) in float64 from the forward inputs and both gradients."""
    h = x.double() + residual.double()
    return add_rmsnorm_backward(h, gamma.double(), dy.double(), None if dh is None else dh.double(), eps)


@functools.cache
def _compiled_add_rmsnorm():
    return torch.compile(add_rmsnorm_reference, dynamic=False)


def compiled_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6):
    """The unfused pair through torch.compile (Inductor fuses it into generated Triton kernels; its backward,
    when the inputs require grad, is compiled by AOTAutograd)."""
    return _compiled_add_rmsnorm()(x, residual, gamma, eps)


# --------------------------------------------------------------------------------------------------------
# SwiGLU
# --------------------------------------------------------------------------------------------------------


def swiglu_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """F.silu(a) * b: two eager kernels."""
    return F.silu(a) * b  # silu reads n, writes n; the product reads 2n, writes n


def swiglu_math(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a * sigmoid(a) * b from the definition, in the inputs' dtype."""
    return a * torch.sigmoid(a) * b


def swiglu_float64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The accuracy reference: silu(a) * b in float64."""
    return swiglu_math(a.double(), b.double())


def swiglu_backward(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) of silu(a) * b: da = dc * b * s * (1 + a * (1 - s)), db = dc * a * s, s = sigmoid(a)."""
    s = torch.sigmoid(a)
    silu = a * s
    return dc * b * (s + silu * (1 - s)), dc * silu


def swiglu_backward_float64(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor):
    """The backward accuracy reference: (da, db) in float64."""
    return swiglu_backward(a.double(), b.double(), dc.double())


def split_packed(ab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) views of a packed [..., 2I] tensor: the first and second halves of its last dimension."""
    half = ab.shape[-1] // 2
    return ab[..., :half], ab[..., half:]


@functools.cache
def _compiled_swiglu():
    return torch.compile(swiglu_reference, dynamic=False)


def compiled_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """F.silu(a) * b through torch.compile (one generated Triton kernel; AOTAutograd compiles its backward)."""
    return _compiled_swiglu()(a, b)
