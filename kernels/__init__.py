"""Triton kernels of the kernel lab, each with autograd support, and their plain-PyTorch references.

Set TRITON_INTERPRET=1 before importing this package to run the kernels on the CPU through Triton's
interpreter (slow; the test suite does this on machines without CUDA).
"""

from kernels.add_rmsnorm import add_rmsnorm
from kernels.attention import attention
from kernels.dequant_linear import int4_linear, int8_linear
from kernels.rmsnorm_linear import rmsnorm_linear
from kernels.softmax import softmax
from kernels.swiglu import swiglu, swiglu_packed

__all__ = ["add_rmsnorm", "attention", "int4_linear", "int8_linear", "rmsnorm_linear", "softmax", "swiglu", "swiglu_packed"]
