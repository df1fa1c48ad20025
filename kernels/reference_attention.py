"""Plain-PyTorch references for kernels/attention.py, shared by its tests and experiments.

The unfused path, one PyTorch operation per step (attention_reference, and compiled_attention through
torch.compile), and the float64 accuracy references, forward and backward, computed a chunk of queries at
a time (attention_float64, attention_backward_float64). They sit beside kernels/reference.py rather than in
it: every softmax and RMSNorm record hashes that file, and an edit there would mark their evidence stale.

Each takes the kernels' `key_mask` ((batch, seq_k) bool, True where the key takes part) and defines what a
plain softmax leaves undefined: a query that sees no key (every key it could see masked out, causal with
Sq > Sk, or Sk = 0) gets an output row of zeros, lse -inf and zero gradients, where torch.softmax over an
all -inf row gives NaN.
"""

from __future__ import annotations

import functools
import math

import torch


def causal_visible(seq_q: int, seq_k: int, device, rows: slice | None = None) -> torch.Tensor:
    """[rows, seq_k] bool: query i sees key j when j <= i + seq_k - seq_q (bottom-right alignment).
    `rows` picks a slice of the queries (their absolute positions keep the alignment)."""
    start, stop = (0, seq_q) if rows is None else (rows.start, rows.stop)
    i = torch.arange(start, stop, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    return j <= i + (seq_k - seq_q)


def visible_keys(seq_q: int, seq_k: int, causal: bool, key_mask: torch.Tensor | None, device,
                 rows: slice | None = None) -> torch.Tensor | None:
    """[batch or 1, 1, rows, seq_k] bool, which keys each query sees under the causal mask and the key mask
    (None when neither hides anything); broadcasts against scores [batch, heads, rows, seq_k]."""
    visible = causal_visible(seq_q, seq_k, device, rows)[None, None] if causal else None
    if key_mask is not None:
        kept = key_mask.to(device)[:, None, None, :]
        visible = kept if visible is None else visible & kept
    return visible


def _expand_kv(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Key/value heads repeated for grouped-query attention: query head h uses head h // (H / Hkv)."""
    return t if t.shape[1] == n_heads else t.repeat_interleave(n_heads // t.shape[1], dim=1)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        scale: float | None = None, return_lse: bool = False, *,
                        key_mask: torch.Tensor | None = None):
    """Unfused attention, one PyTorch operation per step: S = Q K^T, scale and mask, softmax, P V.

    Per (batch, head) it materialises the Sq x Sk scores: S in the input dtype, then S and P in float32
    (float64 when the inputs are float64), then P in the input dtype for the product. key_mask: None, or
    (batch, Sk) bool, True where the key takes part. A query that sees no key (every key masked, causal with
    Sq > Sk, or Sk = 0) gets zeros, and lse -inf, as kernels/attention.py defines.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    n_heads = q.shape[1]
    k, v = _expand_kv(k, n_heads), _expand_kv(v, n_heads)
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.matmul(q, k.transpose(-2, -1))  # B*H*Sq*Sk scores in the input dtype
    s = s.to(wide).mul_(scale)  # ... in float32: scaled and masked in place
    seq_q, seq_k = q.shape[2], k.shape[2]
    empty_rows = None
    visible = visible_keys(seq_q, seq_k, causal, key_mask, q.device)
    if visible is not None:
        s.masked_fill_(~visible, float("-inf"))
        if key_mask is not None or seq_q > seq_k:
            empty_rows = ~visible.any(-1, keepdim=True)
    p = torch.softmax(s, dim=-1)  # P in float32
    if empty_rows is not None:
        p = p.masked_fill(empty_rows, 0.0)  # softmax of an all -inf row is NaN; such a row sees nothing
    o = torch.matmul(p.to(q.dtype), v)  # P in the input dtype
    if not return_lse:
        return o
    return o, torch.logsumexp(s, dim=-1)


def _query_chunk(q: torch.Tensor, seq_k: int, query_chunk: int | None) -> int:
    """Rows a chunk, so that one chunk's scores hold at most 2^26 values (512 MiB in float64)."""
    if query_chunk is not None:
        return query_chunk
    return max(1, (1 << 26) // max(1, q.shape[0] * q.shape[1] * seq_k))


def attention_float64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: float | None = None, query_chunk: int | None = None, *,
                      key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The accuracy reference: attention in float64, query_chunk rows at a time (by default as many as keep
    a chunk's scores under 2^26 values), so the Sq x Sk scores never exist whole. Rows that see no key
    (key_mask, causal) are zeros."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64, device=q.device)
    query_chunk = _query_chunk(q, k.shape[2], query_chunk)
    for start in range(0, q.shape[2], query_chunk):
        rows = slice(start, min(start + query_chunk, q.shape[2]))
        out[:, :, rows] = _attention_rows(q[:, :, rows], k, v, causal, scale, rows, q.shape[2], key_mask)[0]
    return out


def _attention_rows(q, k, v, causal, scale, rows: slice, seq_q: int, key_mask=None):
    """(O, P) for the queries `rows` of a length-seq_q query set, in q's dtype throughout; the softmax is
    written out with the running pair's names, m (row maximum, 0 for a row that sees no key) and d, so a
    row that sees no key has d = 0 and P = 0 (not 0/0)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    visible = visible_keys(seq_q, k.shape[2], causal, key_mask, q.device, rows)
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if k.shape[2] else torch.zeros_like(s[..., :1])
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # a row that sees no key: exp(-inf - 0) = 0
    e = torch.exp(s - m)
    d = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(d == 0, torch.ones_like(d), d)
    return torch.matmul(p, v), p


def attention_backward_float64(q, k, v, do, causal: bool = False, scale: float | None = None,
                               query_chunk: int | None = None, *, key_mask: torch.Tensor | None = None):
    """(dQ, dK, dV) in float64, query_chunk rows at a time: dV = P^T dO, dS = P (dO V^T - <dO, O>),
    dQ = scale dS K, dK = scale dS^T Q, with key/value gradients summed over each group of query heads.
    A row that sees no key has P = 0: a zero dQ row, nothing added to dK and dV."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q, k, v, do = q.double(), k.double(), v.double(), do.double()
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    k_all, v_all = _expand_kv(k, n_heads), _expand_kv(v, n_heads)
    dq = torch.empty_like(q)
    dk_all, dv_all = torch.zeros_like(k_all), torch.zeros_like(v_all)
    query_chunk = _query_chunk(q, k.shape[2], query_chunk)
    for start in range(0, q.shape[2], query_chunk):
        rows = slice(start, min(start + query_chunk, q.shape[2]))
        o, p = _attention_rows(q[:, :, rows], k_all, v_all, causal, scale, rows, q.shape[2], key_mask)
        do_rows = do[:, :, rows]
        dv_all += torch.matmul(p.transpose(-2, -1), do_rows)
        delta = (do_rows * o).sum(dim=-1, keepdim=True)
        ds = p * (torch.matmul(do_rows, v_all.transpose(-2, -1)) - delta)
        dq[:, :, rows] = torch.matmul(ds, k_all) * scale
        dk_all += torch.matmul(ds.transpose(-2, -1), q[:, :, rows]) * scale
    shape = (k.shape[0], n_kv_heads, n_heads // max(n_kv_heads, 1), k.shape[2], k.shape[3])
    return dq, dk_all.view(shape).sum(2), dv_all.view(shape).sum(2)


@functools.cache
def _compiled_attention():
    return torch.compile(attention_reference, dynamic=False)


def compiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """attention_reference through torch.compile (one graph per shape and causal flag)."""
    return _compiled_attention()(q, k, v, causal)
