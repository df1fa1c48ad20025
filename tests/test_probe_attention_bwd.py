"""The attention backward probe's atomic-dQ candidate (probes/attention_bwd.py) gives the gradients the
lab's backward gives, against float64 with tests/test_attention.py's bounds, before any GPU times it: ragged
lengths, grouped heads, causal rows that see no key, every tile the probe times."""

from __future__ import annotations

import math

import pytest
import torch


from probes import attention_bwd as probe  # noqa: E402
from test_attention import BOUNDS, _check_backward, _draw, _inputs  # noqa: E402

from kernels.attention import attention_bwd, attention_fwd  # noqa: E402


@pytest.mark.parametrize("shape", [(1, 2, 1, 37, 53, 64), (1, 2, 2, 53, 37, 64), (1, 2, 2, 33, 21, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_atomic_dq_gradients_match_float64_and_the_lab(shape, causal, device, gen):
    dtype = torch.bfloat16
    q, k, v = _inputs(shape, dtype, device, gen)
    do = _draw(q.shape, dtype, device, gen)
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = attention_fwd(q, k, v, causal, scale)
    grads = probe.atomic_dq_backward(q, k, v, o, lse, do, causal, scale, (16, 32, 4, 1))
    _check_backward(grads, q, k, v, do, causal)
    for ours, lab in zip(grads, attention_bwd(q, k, v, o, lse, do, causal, scale)):
        assert (ours.double() - lab.double()).norm() <= BOUNDS[dtype][1] * lab.double().norm() + 1e-6


@pytest.mark.parametrize("tile", probe.TILES, ids=str)
def test_every_tile_the_probe_times_gives_the_float64_answer(tile, device, gen):
    # Ragged on both sides of every tile, grouped heads, causal with rows that see no key.
    q, k, v = _inputs((1, 2, 1, 150, 130, 64), torch.bfloat16, device, gen)
    do = _draw(q.shape, q.dtype, device, gen)
    scale = 1 / math.sqrt(q.shape[-1])
    o, lse = attention_fwd(q, k, v, True, scale)
    _check_backward(probe.atomic_dq_backward(q, k, v, o, lse, do, True, scale, tile), q, k, v, do, True)
