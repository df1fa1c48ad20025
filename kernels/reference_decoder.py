"""A Llama-style decoder block in plain PyTorch: the correctness reference and the eager / compiled peer of
kernels/decoder_block.py.

    h   = x + o_proj(attention(rotary(qkv_proj(rms_norm(x)))))
    out = h + down_proj(silu(gate_proj(rms_norm(h))) * up_proj(rms_norm(h)))

Attention is grouped-query (query head j reads key/value head j // (n_heads / n_kv_heads)), causal over the
prompt at prefill and over cached positions 0..pos at decode. The rotary embedding is Llama's half-rotation
form: feature i pairs with feature i + head_dim/2, both turned by the angle p * theta^(-2i / head_dim) of
position p (rotate_half). The QKV and gate/up projections are merged: w_qkv stacks the rows of Q, K and V,
w_gate_up the gate rows, then the up rows (the packed layout kernels/swiglu.py reads).

Every op runs inside one profiler range named by a label of OPS (`op_label`), so a profile attributes each
kernel to exactly one op. The ranges are opened only while a profiler listens, and never under
torch.compile; forward and decode have no Python branch on tensor values, so both compile whole. Runs in
any floating dtype, float64 on the CPU included. Bytes and FLOPs per op: kernels/decoder_block.py.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from kernels.kv_cache import KVCache

__all__ = ["OPS", "DecoderConfig", "LLAMA_8B", "DecoderWeights", "KVCache", "DecoderBlock", "op_label",
           "rotary_inv_freq", "rotary_tables", "rotary", "rotate_half", "REFERENCE_SOURCES"]

# The labels of the block's ops, in the order they run; the fused ops of kernels/decoder_block.py carry the
# joined names of the ops they replace.
OPS = (
    "attn_norm", "qkv_proj", "attn_norm+qkv_proj", "rotary", "kv_cache_write", "rotary+kv_cache_write", "attention", "o_proj",
    "residual_add", "mlp_norm", "residual_add+mlp_norm", "gate_up_proj", "swiglu", "down_proj",
)


def op_label(label: str):
    """A profiler range named `label` (one of OPS) while a profiler listens and nothing is being compiled;
    otherwise a no-op context."""
    if torch.compiler.is_compiling() or not torch.autograd._profiler_enabled():
        return contextlib.nullcontext()
    return torch.profiler.record_function(label)


# --------------------------------------------------------------------------------------------------------
# Configuration and weights
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderConfig:
    """Shapes of one block; the defaults are Llama 3 8B's."""

    hidden: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    eps: float = 1e-5
    rope_theta: float = 500000.0

    def __post_init__(self):
        for name in ("hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"DecoderConfig: {name} must be a positive int, got {value!r}.")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"DecoderConfig: n_kv_heads = {self.n_kv_heads} does not divide n_heads = {self.n_heads}; "
                             "grouped-query attention needs n_heads to be a multiple of n_kv_heads.")
        if self.hidden != self.n_heads * self.head_dim:
            raise ValueError(f"DecoderConfig: hidden = {self.hidden} but n_heads * head_dim = {self.n_heads} * "
                             f"{self.head_dim} = {self.n_heads * self.head_dim}; the two must be equal.")
        if self.head_dim % 2:
            raise ValueError(f"DecoderConfig: head_dim must be even (the rotary embedding turns pairs of features), "
                             f"got {self.head_dim}.")
        for name in ("eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"DecoderConfig: {name} must be a finite real number, got {value!r}.")
        if self.eps < 0 or self.rope_theta <= 0:
            raise ValueError(f"DecoderConfig: eps must be >= 0 and rope_theta > 0, got eps = {self.eps!r}, "
                             f"rope_theta = {self.rope_theta!r}.")

    @property
    def qkv_rows(self) -> int:
        """Rows of w_qkv: (n_heads + 2 * n_kv_heads) * head_dim."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def parameter_count(self) -> int:
        """Parameters of one block (projections and both norms): 218,112,000 for Llama 3 8B."""
        attn = self.qkv_rows * self.hidden + self.hidden * self.n_heads * self.head_dim
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden


LLAMA_8B = DecoderConfig()


@dataclass
class DecoderWeights:
    """One block's weights, all of one dtype on one device (shapes in `shapes`)."""

    attn_norm: torch.Tensor  # [hidden]
    w_qkv: torch.Tensor  # [(n_heads + 2 n_kv_heads) head_dim, hidden]: Q rows, then K, then V
    w_o: torch.Tensor  # [hidden, n_heads head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 intermediate, hidden]: gate rows, then up rows
    w_down: torch.Tensor  # [hidden, intermediate]

    @staticmethod
    def shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
        c = config
        return {"attn_norm": (c.hidden,), "w_qkv": (c.qkv_rows, c.hidden), "w_o": (c.hidden, c.n_heads * c.head_dim),
                "mlp_norm": (c.hidden,), "w_gate_up": (2 * c.intermediate, c.hidden),
                "w_down": (c.hidden, c.intermediate)}

    @classmethod
    def random(cls, config: DecoderConfig, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
               seed: int = 0) -> DecoderWeights:
        """Seeded weights: projections N(0, 1/fan_in), so activations stay O(1) through the block; norm gains
        1 + N(0, 0.1^2). Drawn in float32 by a torch.Generator on `device` in field order, then rounded to
        `dtype`: one seed gives the same weights in every dtype, up to that rounding."""
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        drawn = {}
        for name, shape in cls.shapes(config).items():
            w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            drawn[name] = (1.0 + 0.1 * w if len(shape) == 1 else w / math.sqrt(shape[1])).to(dtype)
        return cls(**drawn)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def dtype(self) -> torch.dtype:
        return self.w_qkv.dtype

    @property
    def device(self) -> torch.device:
        return self.w_qkv.device

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> DecoderWeights:
        """A copy in `dtype` on `device` (e.g. the float64 weights of the accuracy reference)."""
        return DecoderWeights(**{name: t.to(dtype=dtype or t.dtype, device=device or t.device, copy=True)
                                 for name, t in self.tensors().items()})

    def check(self, config: DecoderConfig, op: str = "DecoderWeights") -> None:
        """Raise unless every weight is a tensor of the shape `config` asks for, all of one dtype and device."""
        for name, shape in self.shapes(config).items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{op}: weight {name} must be a torch.Tensor, got {type(t).__name__}.")
            if tuple(t.shape) != shape:
                raise ValueError(f"{op}: weight {name} has shape {tuple(t.shape)}; the config asks for {shape}.")
        dtypes = {str(t.dtype).removeprefix("torch.") for t in self.tensors().values()}
        devices = {str(t.device) for t in self.tensors().values()}
        if len(dtypes) > 1 or len(devices) > 1:
            raise ValueError(f"{op}: the weights must share one dtype and one device, got dtypes "
                             f"{', '.join(sorted(dtypes))} on {', '.join(sorted(devices))}.")


# --------------------------------------------------------------------------------------------------------
# Rotary embedding (half rotation), in plain torch: both blocks use this code
# --------------------------------------------------------------------------------------------------------


def rotary_inv_freq(config: DecoderConfig, device: torch.device | str | None = None,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[head_dim]: theta^(-2i / head_dim) for i < head_dim/2, then the same again (feature i and i + head_dim/2
    turn by one angle). Computed in float64, returned in `dtype`."""
    i = torch.arange(0, config.head_dim, 2, dtype=torch.float64, device=device)
    inv_freq = config.rope_theta ** (-i / config.head_dim)
    return torch.cat([inv_freq, inv_freq]).to(dtype)


def rotary_tables(config: DecoderConfig, positions: torch.Tensor | int, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32, *, inv_freq: torch.Tensor | None = None):
    """(cos, sin) of the angles p * inv_freq, in `dtype`: [head_dim] for an int position p, [S, head_dim] for
    positions [S], [B, 1, S, head_dim] for positions [B, S] (broadcasting against [B, heads, S, head_dim]).

    The angles are computed in float64 for float64 tables and in float32 otherwise (as Llama's reference
    code does); `inv_freq` (rotary_inv_freq in that precision) may be passed to skip recomputing it.
    """
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    if inv_freq is None:
        inv_freq = rotary_inv_freq(config, device, wide)
    if not isinstance(positions, torch.Tensor):  # an int (or, under torch.compile, a symbolic int)
        angles = inv_freq.to(wide) * positions
    else:
        angles = positions.to(wide)[..., None] * inv_freq.to(wide)
        if angles.dim() == 3:
            angles = angles[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    """(-t2, t1) for t = (t1, t2) split at the middle of the last dimension."""
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


def rotary(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t * cos + rotate_half(t) * sin for t [..., S, head_dim], in t's dtype (the tables are cast to it)."""
    return t * cos.to(t.dtype) + rotate_half(t) * sin.to(t.dtype)


# --------------------------------------------------------------------------------------------------------
# The block
# --------------------------------------------------------------------------------------------------------

REFERENCE_SOURCES = {
    "attn_norm": "torch: F.rms_norm",
    "qkv_proj": "torch: F.linear",
    "rotary": "torch: rotary (kernels/reference_decoder.py)",
    "kv_cache_write": "torch: Tensor.copy_ into the cache",
    "attention": "torch: F.scaled_dot_product_attention",
    "o_proj": "torch: F.linear",
    "residual_add": "torch: Tensor add",
    "mlp_norm": "torch: F.rms_norm",
    "gate_up_proj": "torch: F.linear",
    "swiglu": "torch: F.silu(gate) * up",
    "down_proj": "torch: F.linear",
}


class DecoderBlock(torch.nn.Module):
    """The block in plain PyTorch: F.rms_norm, F.linear, F.scaled_dot_product_attention (enable_gqa), F.silu.

    forward(x [B, S, hidden], positions) -> [B, S, hidden]: a prefill, causal over the S tokens; with a
    cache, their keys and values also go to cache positions 0..S-1.
    decode(x [B, 1, hidden], cache, pos) -> [B, 1, hidden]: one token a sequence at position `pos` (an int),
    its key and value written to the cache at `pos`, attending over cache positions 0..pos.
    """

    def __init__(self, weights: DecoderWeights, config: DecoderConfig = LLAMA_8B):
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"DecoderBlock: config must be a DecoderConfig, got {type(config).__name__}.")
        if not isinstance(weights, DecoderWeights):
            raise TypeError(f"DecoderBlock: weights must be DecoderWeights, got {type(weights).__name__}.")
        weights.check(config, "DecoderBlock")
        self.config = config
        self.weights = weights
        wide = torch.float64 if weights.dtype == torch.float64 else torch.float32
        self.register_buffer("inv_freq", rotary_inv_freq(config, weights.device, wide), persistent=False)

    @staticmethod
    def op_sources(phase: str = "decode") -> dict[str, str]:
        """Op label -> where its implementation comes from (every op is torch's here), for a call of `phase`
        ("decode" or "prefill"; a prefill writes the cache only when given one)."""
        if phase not in ("decode", "prefill"):
            raise ValueError(f"DecoderBlock.op_sources: phase must be 'decode' or 'prefill', got {phase!r}.")
        skip = () if phase == "decode" else ("kv_cache_write",)
        return {label: source for label, source in REFERENCE_SOURCES.items() if label not in skip}

    def _qkv_heads(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        c, w = self.config, self.weights
        with op_label("attn_norm"):
            n = F.rms_norm(x, (c.hidden,), w.attn_norm, c.eps)
        with op_label("qkv_proj"):
            qkv = self._linear("w_qkv", n)
            q_cols, kv_cols = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
            q, k, v = qkv.split([q_cols, kv_cols, kv_cols], dim=-1)
            q = q.unflatten(-1, (c.n_heads, c.head_dim)).transpose(1, 2)  # [B, H, S, D]
            k = k.unflatten(-1, (c.n_kv_heads, c.head_dim)).transpose(1, 2)  # [B, Hkv, S, D]
            v = v.unflatten(-1, (c.n_kv_heads, c.head_dim)).transpose(1, 2)
        with op_label("rotary"):
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        return q, k, v

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T for the projection weight `name` (a DecoderWeights field): F.linear here; a block whose
        projections come from elsewhere (a weight-only peer) overrides this alone."""
        return F.linear(x, getattr(self.weights, name))

    def _tables(self, x: torch.Tensor, positions: torch.Tensor | int):
        return rotary_tables(self.config, positions, x.device, x.dtype, inv_freq=self.inv_freq)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | None = None):
        batch, seq, _ = x.shape
        with op_label("rotary"):
            cos, sin = self._tables(x, torch.arange(seq, device=x.device) if positions is None else positions)
        q, k, v = self._qkv_heads(x, cos, sin)
        if cache is not None:
            with op_label("kv_cache_write"):
                cache.write(0, k, v)
        with op_label("attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o = o.transpose(1, 2).reshape(batch, seq, -1)
        return self._mlp(x, o)

    def decode(self, x: torch.Tensor, cache: KVCache, pos: int) -> torch.Tensor:
        batch = x.shape[0]
        with op_label("rotary"):
            cos, sin = self._tables(x, pos)
        q, k, v = self._qkv_heads(x, cos, sin)
        with op_label("kv_cache_write"):
            cache.write(pos, k, v)
        with op_label("attention"):
            o = F.scaled_dot_product_attention(q, cache.keys(pos + 1), cache.values(pos + 1), enable_gqa=True)
            o = o.transpose(1, 2).reshape(batch, 1, -1)
        return self._mlp(x, o)

    def _mlp(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of the block from the attention's output o [B, S, n_heads * head_dim]."""
        c, w = self.config, self.weights
        with op_label("o_proj"):
            a = self._linear("w_o", o)
        with op_label("residual_add"):
            h = x + a
        with op_label("mlp_norm"):
            n = F.rms_norm(h, (c.hidden,), w.mlp_norm, c.eps)
        with op_label("gate_up_proj"):
            gate_up = self._linear("w_gate_up", n)
        with op_label("swiglu"):
            gate, up = gate_up.split(c.intermediate, dim=-1)
            m = F.silu(gate) * up
        with op_label("down_proj"):
            d = self._linear("w_down", m)
        with op_label("residual_add"):
            return h + d
