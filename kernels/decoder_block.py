"""A Llama-style decoder block built from the lab's kernels: the same math as kernels/reference_decoder.py,

    h   = x + o_proj(attention(rotary(qkv_proj(rms_norm(x)))))
    out = h + down_proj(silu(gate_proj(rms_norm(h))) * up_proj(rms_norm(h)))

with each op taken from the lab where the lab has a kernel for it and from torch otherwise. By label (OPS in
kernels/reference_decoder.py; `LabDecoderBlock.op_sources()` gives this table for one configuration):

| label                 | bf16 / fp16 weights                   | quant="int8" / "int4"                         |
|-----------------------|---------------------------------------|-----------------------------------------------|
| attn_norm+qkv_proj    | decode, M <= 32 rows: lab: kernels/rmsnorm_linear.py (its GEMV to 16 rows, tiled above) |
| attn_norm, qkv_proj   | prefill and decode above 32 rows:     | torch: F.rms_norm, lab: kernels/dequant_linear.py |
|                       | torch: F.rms_norm, F.linear           |                                               |
| rotary                | lab: kernels/rotary.py: q and k turned, heads split, one pass (prefill)   |
| rotary+kv_cache_write | lab: kernels/rotary.py, writing k and v into the cache (decode; prefill   |
|                       | when given a cache)                                                       |
| attention             | lab: kernels/attention.py: causal at prefill, one query over keys 0..pos  |
|                       | at decode; or at decode torch: F.scaled_dot_product_attention ("sdpa")    |
| o_proj                | torch: F.linear                       | lab: kernels/dequant_linear.py                |
| residual_add+mlp_norm | lab: kernels/add_rmsnorm.py (h = a + x and rms_norm(h), one pass)         |
| gate_up_proj          | torch: F.linear                       | lab: kernels/dequant_linear.py                |
| swiglu                | lab: kernels/swiglu.py (swiglu_packed on the merged gate/up output)       |
| down_proj             | torch: F.linear                       | lab: kernels/dequant_linear.py                |
| residual_add          | torch: h + d                                                              |

At prefill the QKV projection is torch's F.rms_norm and F.linear, not the lab's fused kernel: at M >= 1,024
rows the lab's tiled RMSNorm + linear runs at 0.51-0.71x cuBLAS's unfused pair (experiment
rmsnorm-linear-prefill), and at 1,024 tokens of this block it took 173 us against 81 us for the pair. The
same holds at decode above FUSED_QKV_MAX_ROWS = 32 rows: on the H100, at this block's 4096 -> 6144 projection
(bf16, CUDA-graph replay over weights rotated past the L2), the fused kernel took 0.84-0.95x the pair's time
at 1-32 rows and 1.10x at 48, 1.20x at 64 (notes/decoder-block.md).

The quantised kernels serve at most DOT_MAX_M = 64 rows a launch (they are decode kernels); a prefill of more
rows runs them 64 rows at a time, each launch reading the whole weight again.

Bytes and FLOPs per op for M = B*S rows of `size`-byte elements (decode: S = 1), L = pos + 1 cached keys, and
Llama 3 8B's shapes (hidden 4096, 32 query and 8 key/value heads of 128, intermediate 14336). Weights are
read once a call; the last column is what a single fused pass moves besides them (activations, the cache):

| op                    | weights read                  | FLOPs                     | other bytes                  |
|-----------------------|-------------------------------|---------------------------|------------------------------|
| attn_norm+qkv_proj    | 6144*4096*size (50.3 MB bf16) | 2*M*6144*4096             | M*(4096 + 6144)*size         |
| rotary (+ cache write)|                               | ~6*M*5120                 | 2*M*6144*size (eager: ~5x)   |
| attention, decode     |                               | 4*B*32*L*128              | K, V: 2*B*8*L*128*size       |
| attention, prefill    |                               | ~2*B*32*S^2*128 (causal)  | 2*M*(4096 + 1024)*size       |
| o_proj                | 4096*4096*size (33.6 MB)      | 2*M*4096*4096             | 2*M*4096*size                |
| residual_add+mlp_norm |                               | ~4*M*4096                 | 4*M*4096*size                |
| gate_up_proj          | 28672*4096*size (234.9 MB)    | 2*M*28672*4096            | M*(4096 + 28672)*size        |
| swiglu                |                               | ~5*M*14336                | 3*M*14336*size               |
| down_proj             | 4096*14336*size (117.4 MB)    | 2*M*4096*14336            | M*(14336 + 4096)*size        |
| residual_add          |                               | M*4096                    | 3*M*4096*size                |

The weights dominate decode: 218.1 M parameters, 436.2 MB in bf16 read once per call for 2 FLOPs a
parameter a row, so up to a few hundred rows the block is bound by memory bandwidth (436 MB at 3.35 TB/s,
an H100 SXM's nominal HBM rate, takes 130 us); the cache adds B*L*4 KiB in bf16. Weight-only int8 reads
218.1 MB (+ 86 KB of scales), int4 109.1 MB (+ 3.4 MB of bf16 scales for groups of 128). Prefill spends
436.2 MFLOP a token on the projections plus 2*32*128*S on the attention, and is bound by the tensor cores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._checks import check_device
from kernels.add_rmsnorm import MAX_H, add_rmsnorm
from kernels.attention import HEAD_DIMS, attention
from kernels.dequant_linear import DOT_MAX_M, INT4_IMPLS, int4_gluon_refusal, int4_linear, int8_linear, prepack_int4
from kernels.kv_cache import KVCache
from kernels.quantize import GROUP_SIZES, dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from kernels.reference_decoder import DecoderConfig, DecoderWeights, op_label, rotary, rotary_inv_freq, rotary_tables
from kernels.rmsnorm_linear import rmsnorm_linear
from kernels.rotary import rotary_qkv
from kernels.swiglu import swiglu_packed

__all__ = ["LabDecoderBlock", "SOURCES", "FUSED_QKV_MAX_ROWS", "sources_for", "check_decoder_config", "check_decoder_inputs"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
QUANT = (None, "int8", "int4")
DECODE_ATTENTION = ("lab", "sdpa")
PHASES = ("decode", "prefill")
PROJECTIONS = ("w_qkv", "w_o", "w_gate_up", "w_down")
_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

_LAB_DEQUANT = "lab: kernels/dequant_linear.py ({}_linear)"
# int4 on Hopper: the weights prepacked at construction for the Gluon kernel (64 rows a launch).
_LAB_INT4_GLUON = "lab: kernels/int4_gluon.py (int4_linear on prepacked weights, Gluon)"
_COMMON = {
    "rotary": "lab: kernels/rotary.py",
    "rotary+kv_cache_write": "lab: kernels/rotary.py (writes k and v into the cache)",
    "attention": "lab: kernels/attention.py",
    "residual_add+mlp_norm": "lab: kernels/add_rmsnorm.py",
    "swiglu": "lab: kernels/swiglu.py (swiglu_packed)",
    "residual_add": "torch: Tensor add",
}
_PREFILL_QKV = "torch: F.linear (the lab's fused kernel loses at M >= 1,024: experiment rmsnorm-linear-prefill)"
_WIDE_DECODE_QKV = "torch: F.linear (the lab's fused kernel loses above 32 rows: notes/decoder-block.md)"
# The most rows a decode step sends through the lab's fused RMSNorm + QKV; wider steps take torch's pair.
FUSED_QKV_MAX_ROWS = 32


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_choice(op: str, name: str, value, accepted: tuple) -> None:
    if value not in accepted:
        raise ValueError(f"{op}: {name} must be one of {', '.join(map(repr, accepted))}, got {value!r}.")


def sources_for(quant: str | None = None, decode_attention: str = "lab", phase: str = "decode",
                rows: int = 1, int4_impl: str = "triton") -> dict[str, str]:
    """Op label -> where the op comes from, for the labels a call of `phase` over `rows` tokens (B * S) runs,
    in the order they run (a prefill given a cache runs rotary+kv_cache_write in place of rotary). int4_impl:
    the int4 kernel, "triton" (kernels/dequant_linear.py) or "gluon" (kernels/int4_gluon.py)."""
    _check_choice("sources_for", "quant", quant, QUANT)
    _check_choice("sources_for", "int4_impl", int4_impl, INT4_IMPLS)
    _check_choice("sources_for", "decode_attention", decode_attention, DECODE_ATTENTION)
    _check_choice("sources_for", "phase", phase, PHASES)
    if quant is None:
        projection = "torch: F.linear"
        if phase == "decode" and rows <= FUSED_QKV_MAX_ROWS:
            head = {"attn_norm+qkv_proj": "lab: kernels/rmsnorm_linear.py"}
        else:
            head = {"attn_norm": "torch: F.rms_norm",
                    "qkv_proj": _PREFILL_QKV if phase == "prefill" else _WIDE_DECODE_QKV}
    else:
        projection = _LAB_INT4_GLUON if quant == "int4" and int4_impl == "gluon" else _LAB_DEQUANT.format(quant)
        head = {"attn_norm": "torch: F.rms_norm", "qkv_proj": projection}
    attention_source = _COMMON["attention"]
    if phase == "decode" and decode_attention == "sdpa":
        attention_source = "torch: F.scaled_dot_product_attention"
    rotary_label = "rotary+kv_cache_write" if phase == "decode" else "rotary"
    table = {**head, rotary_label: _COMMON[rotary_label]}
    table.update({"attention": attention_source, "o_proj": projection,
                  "residual_add+mlp_norm": _COMMON["residual_add+mlp_norm"], "gate_up_proj": projection,
                  "swiglu": _COMMON["swiglu"], "down_proj": projection, "residual_add": _COMMON["residual_add"]})
    return table


# The default configuration's table: bf16 / fp16 weights, the lab's attention at decode.
SOURCES: dict[str, str] = sources_for()


# --------------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------------


def check_decoder_config(op: str, config, dtype: torch.dtype) -> None:
    """Raise unless the lab's kernels run a block of `config` in `dtype` (messages name what is accepted)."""
    if not isinstance(config, DecoderConfig):
        raise TypeError(f"{op}: config must be a DecoderConfig, got {type(config).__name__}.")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: dtype {_name(dtype)} is not supported; the lab's kernels take "
                        f"{', '.join(map(_name, SUPPORTED_DTYPES))}.")
    if config.head_dim not in HEAD_DIMS:
        raise ValueError(f"{op}: head_dim {config.head_dim} is not supported by the lab's attention "
                         f"(kernels/attention.py); supported head dims are {', '.join(map(str, HEAD_DIMS))}.")
    if config.hidden > MAX_H:
        raise ValueError(f"{op}: hidden {config.hidden} is more than the lab's add_rmsnorm holds in a row "
                         f"(kernels/add_rmsnorm.py accepts hidden <= {MAX_H}).")


def check_decoder_inputs(op: str, config: DecoderConfig, dtype: torch.dtype, x, *, positions=None,
                         cache=None, pos=None) -> None:
    """Raise unless x [B, S, hidden] (S = 1 when `pos` is given: a decode step), its positions and its cache
    fit a block of `config` whose weights have `dtype`. With a cache and no `pos`, a prefill that writes
    positions 0..S-1; with `pos`, a decode step that writes position pos."""
    check_decoder_config(op, config, dtype)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}.")
    if x.dim() != 3 or x.shape[-1] != config.hidden:
        raise ValueError(f"{op}: x must have shape [batch, seq, hidden] with hidden = {config.hidden}, "
                         f"got {tuple(x.shape)}.")
    if x.dtype != dtype:
        raise TypeError(f"{op}: x has dtype {_name(x.dtype)} but the block's weights have {_name(dtype)}; "
                        "they must match.")
    batch, seq = x.shape[0], x.shape[1]
    if pos is not None and seq != 1:
        raise ValueError(f"{op}: a decode step takes one token a sequence, x [batch, 1, hidden]; "
                         f"got {tuple(x.shape)}.")
    if positions is not None:
        given = _name(positions.dtype) if isinstance(positions, torch.Tensor) else type(positions).__name__
        if not isinstance(positions, torch.Tensor) or positions.dtype not in _INDEX_DTYPES:
            raise TypeError(f"{op}: positions must be an integer tensor [seq] or [batch, seq], got {given}.")
        if tuple(positions.shape) not in ((seq,), (batch, seq)):
            raise ValueError(f"{op}: positions must have shape [seq] = ({seq},) or [batch, seq] = ({batch}, {seq}), "
                             f"got {tuple(positions.shape)}.")
    tensors = [x] if positions is None else [x, positions]
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"{op}: cache must be a KVCache, got {type(cache).__name__}.")
        want = (batch, config.n_kv_heads, config.head_dim)
        if (cache.batch, cache.n_kv_heads, cache.head_dim) != want:
            raise ValueError(f"{op}: the cache holds [batch, n_kv_heads, capacity, head_dim] = {tuple(cache.k.shape)}; "
                             f"this call needs batch, n_kv_heads, head_dim = {want}.")
        if cache.dtype != dtype:
            raise TypeError(f"{op}: the cache has dtype {_name(cache.dtype)} but the block's weights have "
                            f"{_name(dtype)}; they must match.")
        for name, t in (("k", cache.k), ("v", cache.v)):  # written in place by kernels/rotary.py
            if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)) or (t.stride(-1) != 1 and t.shape[-1] > 1):
                raise ValueError(f"{op}: the cache's {name} has strides {tuple(t.stride())}; keys and values are "
                                 "written in place, so the cache needs unit stride along head_dim and no overlapping "
                                 "elements (no stride 0 from expand()); any other strides are accepted.")
        if pos is None:
            cache.check_position(0, seq)
        else:
            cache.check_position(pos)
        tensors += [cache.k, cache.v]
    check_device(op, *tensors)


# --------------------------------------------------------------------------------------------------------
# The block
# --------------------------------------------------------------------------------------------------------


class LabDecoderBlock(torch.nn.Module):
    """The decoder block from the lab's kernels (the module docstring says which op comes from where).

    weights: DecoderWeights of `config`, all float16 or all bfloat16, on CUDA (or on the CPU with
    TRITON_INTERPRET=1); config.head_dim 64 or 128. quant: None, "int8" (per output channel) or "int4"
    (groups of `group_size` inputs, one of 32, 64, 128, 256 dividing hidden and intermediate): every
    projection weight is quantised once, here (kernels/quantize.py), and only the quantised weights are kept.
    int4_impl: "auto" (the Gluon kernel where kernels.dequant_linear.int4_gluon_refusal finds none: a Hopper
    GPU), "gluon" (ValueError where it cannot run) or "triton": with Gluon, the int4 weights are kept only in
    prepack_int4's order; `int4_impl` then says "gluon" and `quantised_projections()` gives the plain pairs.
    decode_attention: "lab" (kernels/attention.py with one query) or "sdpa" (torch's) at decode; prefill
    always runs the lab's attention. Inference only: no gradients.

    forward(x [B, S, hidden], positions=None, cache=None) -> [B, S, hidden]: a causal prefill; positions [S]
    or [B, S] (arange(S) by default); with a cache, keys and values also go to its positions 0..S-1.
    decode(x [B, 1, hidden], cache, pos) -> [B, 1, hidden]: one token a sequence at position `pos` (an int).
    Layouts: x and positions may have any strides (slices, x[::2], transposed storage, expanded views); the
    cache any strides with unit stride along head_dim and no overlapping elements (it is written in place).
    """

    def __init__(self, weights: DecoderWeights, config: DecoderConfig, *, quant: str | None = None,
                 decode_attention: str = "lab", group_size: int = 128, int4_impl: str = "auto"):
        super().__init__()
        op = "LabDecoderBlock"
        if not isinstance(weights, DecoderWeights):
            raise TypeError(f"{op}: weights must be DecoderWeights, got {type(weights).__name__}.")
        check_decoder_config(op, config, weights.dtype)
        weights.check(config, op)
        _check_choice(op, "quant", quant, QUANT)
        _check_choice(op, "decode_attention", decode_attention, DECODE_ATTENTION)
        if quant == "int4":
            _check_group_size(op, group_size, config)
        check_device(op, *weights.tensors().values())
        _check_choice(op, "int4_impl", int4_impl, ("auto", ) + INT4_IMPLS)
        refusal = int4_gluon_refusal(weights.device, weights.dtype) if quant == "int4" else "not int4"
        if int4_impl == "gluon" and refusal is not None:
            raise ValueError(f"{op}: int4_impl='gluon' cannot run here: {refusal}.")
        self.int4_impl = "gluon" if int4_impl != "triton" and refusal is None else "triton"
        self.config, self.quant, self.decode_attention, self.group_size = config, quant, decode_attention, group_size
        self.dtype = weights.dtype
        self.attn_norm = weights.attn_norm.contiguous()
        self.mlp_norm = weights.mlp_norm.contiguous()
        self.inv_freq = rotary_inv_freq(config, weights.device, torch.float32)
        self.inv_half = self.inv_freq[:config.head_dim // 2].contiguous()  # the rotary kernel's [D/2]
        self._checked: set[tuple] = set()  # layouts of decode steps that passed check_decoder_inputs
        # Projection name -> its weight [N, K] (quant None), (quantised weight, scales), or (prepacked int4,).
        self.projections = {name: self._prepare(getattr(weights, name)) for name in PROJECTIONS}

    def _prepare(self, w: torch.Tensor):
        if self.quant is None:
            return w.contiguous()
        if self.quant == "int8":
            return quantize_int8(w)
        w_packed, scales = quantize_int4(w, self.group_size)
        if self.int4_impl == "gluon":  # the prepacked order only: the plain pair is dropped here
            return (prepack_int4(w_packed, scales, self.group_size), )
        return w_packed, scales

    def quantised_projections(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Projection name -> (quantised weight, scales) in kernels/quantize.py's layout (prepacked int4 weights
        turned back exactly, into new tensors)."""
        if self.quant is None:
            raise ValueError("quantised_projections: this block's weights are not quantised (quant=None).")
        return {name: w[0].unprepack() if len(w) == 1 else w for name, w in self.projections.items()}

    def op_sources(self, phase: str = "decode", rows: int = 1) -> dict[str, str]:
        """Op label -> where the op comes from in this configuration, for a call of `phase` over `rows` tokens."""
        return sources_for(self.quant, self.decode_attention, phase, rows, self.int4_impl)

    def effective_weights(self, dtype: torch.dtype | None = None) -> DecoderWeights:
        """The weights the block multiplies by, in `dtype` (the block's by default): the given ones, or the
        quantised ones dequantised (exactly, in float64) as the kernels apply them."""
        dtype = dtype or self.dtype
        out = {"attn_norm": self.attn_norm.to(dtype), "mlp_norm": self.mlp_norm.to(dtype)}
        for name, w in self.projections.items():
            if self.quant == "int8":
                w = dequantize_int8(*w, dtype=dtype)
            elif self.quant == "int4":
                w = dequantize_int4(*w, group_size=self.group_size, dtype=dtype)
            out[name] = w.to(dtype)
        return DecoderWeights(**out)

    # ----------------------------------------------------------------------------------------------------

    def _project(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] @ W^T for the projection `name`: F.linear, or the lab's dequantising kernel (<= 64 rows
        a launch)."""
        w = self.projections[name]
        if self.quant is None:
            return F.linear(x, w)
        rows = x.reshape(-1, x.shape[-1])
        if self.quant == "int8":
            parts = [int8_linear(chunk, *w) for chunk in rows.split(DOT_MAX_M)]
        else:
            parts = [int4_linear(chunk, *w, group_size=self.group_size) for chunk in rows.split(DOT_MAX_M)]
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _qkv(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        """The packed projection [B, S, (H + 2 Hkv) D] of rms_norm(x): the lab's fused kernel at decode up to
        FUSED_QKV_MAX_ROWS rows, torch's pair at prefill and wider decode steps (see the module docstring), the
        dequantising kernel when quantised."""
        c = self.config
        if self.quant is None and decode and x.shape[0] * x.shape[1] <= FUSED_QKV_MAX_ROWS:
            with op_label("attn_norm+qkv_proj"):
                return rmsnorm_linear(x, self.projections["w_qkv"], self.attn_norm, c.eps)
        with op_label("attn_norm"):
            n = F.rms_norm(x, (c.hidden,), self.attn_norm, c.eps)
        with op_label("qkv_proj"):
            return self._project("w_qkv", n)

    def _qkv_heads(self, x: torch.Tensor, positions, cache: KVCache | None, start: int, decode: bool):
        """(q [B, H, S, D], k, v [B, Hkv, S, D]), q and k turned by the rotary embedding (kernels/rotary.py); with
        a cache, k and v are written into its positions start..start+S-1 and returned as views of it."""
        c = self.config
        qkv = self._qkv(x, decode)
        seq = x.shape[1]
        if isinstance(positions, torch.Tensor) and positions.dim() == 2:  # per-sequence positions: torch's rotary
            with op_label("rotary"):
                return self._torch_rotary(qkv, positions)
        with op_label("rotary" if cache is None else "rotary+kv_cache_write"):  # the caller checked the position
            k_out = None if cache is None else cache.k[:, :, start:start + seq]
            v_out = None if cache is None else cache.v[:, :, start:start + seq]
            if isinstance(positions, torch.Tensor) and positions.dtype not in (torch.int32, torch.int64):
                positions = positions.long()  # the kernel reads int32 or int64; [S] elements, any stride
            return rotary_qkv(qkv, c.n_heads, c.n_kv_heads, c.head_dim, self.inv_half,
                              start if positions is None else positions, k_out=k_out, v_out=v_out)

    def _torch_rotary(self, qkv: torch.Tensor, positions: torch.Tensor):
        c = self.config
        heads = c.n_heads + c.n_kv_heads
        qk = qkv[..., :heads * c.head_dim].unflatten(-1, (heads, c.head_dim)).transpose(1, 2)
        cos, sin = rotary_tables(c, positions, qkv.device, qkv.dtype, inv_freq=self.inv_freq)
        qk = rotary(qk, cos, sin)
        v = qkv[..., heads * c.head_dim:].unflatten(-1, (c.n_kv_heads, c.head_dim)).transpose(1, 2)
        return qk[:, :c.n_heads], qk[:, c.n_heads:], v

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | None = None):
        check_decoder_inputs("LabDecoderBlock.forward", self.config, self.dtype, x, positions=positions, cache=cache)
        batch, seq, _ = x.shape
        q, k, v = self._qkv_heads(x, positions, cache, 0, decode=False)
        if cache is not None and isinstance(positions, torch.Tensor) and positions.dim() == 2:
            with op_label("kv_cache_write"):
                cache.write(0, k, v)
        with op_label("attention"):
            o = attention(q, k, v, causal=True)
            o = o.transpose(1, 2).reshape(batch, seq, -1)
        return self._mlp(x, o)

    def decode(self, x: torch.Tensor, cache: KVCache, pos: int) -> torch.Tensor:
        if cache is None or pos is None:
            raise TypeError("LabDecoderBlock.decode: needs a KVCache and the int position pos of the new token.")
        # A step whose tensors have a layout checked before, at a position inside the cache, skips the checks:
        # nothing the checks read can differ (kernels' own routes re-check what they depend on).
        try:
            key = (x.__class__, x.shape, x.dtype, x.device, cache.__class__, cache.k.shape, cache.k.stride(),
                   cache.k.dtype, cache.k.device, cache.v.shape, cache.v.stride(), cache.v.dtype, cache.v.device)
            seen = key in self._checked and type(pos) is int and 0 <= pos < cache.k.shape[2]
        except Exception:  # noqa: BLE001 - not tensors, not a cache: the checks say what is wrong
            key, seen = None, False
        if not seen:
            check_decoder_inputs("LabDecoderBlock.decode", self.config, self.dtype, x, cache=cache, pos=pos)
            self._checked.add(key)
        batch = x.shape[0]
        q, _, _ = self._qkv_heads(x, None, cache, pos, decode=True)
        with op_label("attention"):
            keys, values = cache.keys(pos + 1), cache.values(pos + 1)
            if self.decode_attention == "lab":
                o = attention(q, keys, values)
            else:
                o = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
            o = o.transpose(1, 2).reshape(batch, 1, -1)
        return self._mlp(x, o)

    def _mlp(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of the block from the attention's output o [B, S, n_heads * head_dim]."""
        with op_label("o_proj"):
            a = self._project("w_o", o)
        with op_label("residual_add+mlp_norm"):
            h, n = add_rmsnorm(a, x, self.mlp_norm, self.config.eps)
        with op_label("gate_up_proj"):
            gate_up = self._project("w_gate_up", n)
        with op_label("swiglu"):
            m = swiglu_packed(gate_up)
        with op_label("down_proj"):
            d = self._project("w_down", m)
        with op_label("residual_add"):
            return h + d


def _check_group_size(op: str, group_size, config: DecoderConfig) -> None:
    """int4 groups run along K of every projection: hidden (QKV, gate/up), n_heads * head_dim (o_proj) and
    intermediate (down)."""
    ks = {"hidden": config.hidden, "n_heads * head_dim": config.n_heads * config.head_dim,
          "intermediate": config.intermediate}
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise ValueError(f"{op}: group_size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size!r}.")
    for name, k in ks.items():
        if k % group_size:
            fits = [g for g in GROUP_SIZES if all(v % g == 0 for v in ks.values())]
            raise ValueError(f"{op}: group_size {group_size} does not divide {name} = {k}; int4 groups must divide "
                             f"the K of every projection (here: {', '.join(map(str, fits)) or 'none of the sizes'}).")
