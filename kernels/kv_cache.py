"""The key/value cache of one decoder block, shared by kernels/reference_decoder.py and kernels/decoder_block.py.

    k, v: [batch, n_kv_heads, capacity, head_dim]

Position p of every sequence in the batch lives at index p of the capacity axis. A decode step at position
`pos` writes the new token's key and value at index `pos` and attends over indices 0..pos; a prefill of S
tokens writes indices 0..S-1. All sequences of a batch share one length.

Bytes: a decode step writes 2*B*n_kv_heads*head_dim*size (4 KiB a sequence for Llama 3 8B in bf16) and its
attention reads 2*B*n_kv_heads*(pos + 1)*head_dim*size. The cache is plain torch storage; the writes are
tensor copies.
"""

from __future__ import annotations

import torch


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class KVCache:
    """Keys and values [batch, n_kv_heads, capacity, head_dim] of one block, in one dtype on one device."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"KVCache: {name} must be a torch.Tensor, got {type(t).__name__}.")
            if t.dim() != 4:
                raise ValueError(f"KVCache: {name} must have shape [batch, n_kv_heads, capacity, head_dim], "
                                 f"got {tuple(t.shape)}.")
        if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"KVCache: k and v must share shape, dtype and device, got k {tuple(k.shape)} "
                             f"{_name(k.dtype)} on {k.device} and v {tuple(v.shape)} {_name(v.dtype)} on {v.device}.")
        self.k = k
        self.v = v

    @classmethod
    def allocate(cls, config, batch: int, capacity: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> KVCache:
        """A zeroed cache for `batch` sequences of up to `capacity` positions, shaped by `config`
        (a DecoderConfig: n_kv_heads and head_dim)."""
        for name, value in (("batch", batch), ("capacity", capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"KVCache.allocate: {name} must be an int >= 0, got {value!r}.")
        shape = (batch, config.n_kv_heads, capacity, config.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    def check_position(self, pos: int, length: int = 1) -> None:
        """Raise unless positions pos..pos+length-1 lie in the cache."""
        if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
            raise ValueError(f"KV cache positions are ints >= 0, got {pos!r}.")
        if pos + length > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {pos + length - 1} is past its end.")

    def fill(self, length: int, seed: int = 0) -> KVCache:
        """Seeded values in positions 0..length-1, standing for an earlier prefill; returns self.

        Drawn in float32 on the cache's device (one torch.Generator, seeded) and rounded to the cache's dtype,
        so caches of one seed and different dtypes hold the same values up to that rounding.
        """
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"KVCache.fill: length must be an int >= 0, got {length!r}.")
        if length:
            self.check_position(0, length)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        shape = (self.batch, self.n_kv_heads, length, self.head_dim)
        for t in (self.k, self.v):
            t[:, :, :length] = torch.randn(shape, generator=gen, device=self.device, dtype=torch.float32).to(t.dtype)
        return self

    def write(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [batch, n_kv_heads, S, head_dim] into positions pos..pos+S-1 (a copy each)."""
        length = k.shape[2]
        self.check_position(pos, length)
        self.k[:, :, pos:pos + length].copy_(k)
        self.v[:, :, pos:pos + length].copy_(v)

    def keys(self, length: int) -> torch.Tensor:
        """Positions 0..length-1 of k: a strided view [batch, n_kv_heads, length, head_dim], no copy."""
        return self.k[:, :, :length]

    def values(self, length: int) -> torch.Tensor:
        """Positions 0..length-1 of v: a strided view, no copy."""
        return self.v[:, :, :length]

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> KVCache:
        """A copy in `dtype` on `device` (each by default the cache's own): e.g. the float64 cache that a
        reference block reads beside a bf16 one."""
        return KVCache(self.k.to(dtype=dtype or self.dtype, device=device or self.device, copy=True),
                       self.v.to(dtype=dtype or self.dtype, device=device or self.device, copy=True))
