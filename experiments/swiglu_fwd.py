"""SwiGLU forward, c = silu(a) * b: the lab's streaming kernel against eager PyTorch, torch.compile and Liger."""

import torch

from experiments import _swiglu as sw
from experiments._margins import measured_margin
from experiments.spec import PARITY, READ2_WRITE, Claim, Experiment

EXPERIMENT = Experiment(
    slug="swiglu-fwd",
    title="SwiGLU forward",
    question=(
        "For T = 1 … 32,768 tokens at intermediate sizes I = 4,096 … 28,672 (bfloat16 and float32), is the lab's "
        "fused silu(a) · b at least as fast as the best of eager PyTorch, torch.compile and Liger?"
    ),
    focus="Kernel fusion: SwiGLU gate",
    why=(
        "The gated MLP of Llama-style models computes silu(a) · b on two T × I projections, with I three to "
        "four times the hidden size: the largest elementwise tensors of the block. Fused, a and b are read "
        "once and c written once, 3·T·I elements; eager PyTorch writes silu(a) and reads it back, 5·T·I. "
        "The fused kernel has nothing to win but bandwidth: it must stream at the copy ceiling, at every "
        "size, odd ones included."
    ),
    claim=Claim(
        subject="triton",
        baselines=sw.PEERS,
        threshold=1.0,
        statement="the lab's swiglu is at least as fast as the best of torch, torch.compile and Liger at every shape",
        short="SwiGLU forward parity claim",
        kind=PARITY,
        margin=measured_margin("swiglu-fwd"),
    ),
    cases=sw.CASES,
    dtypes=sw.DTYPES,
    profiles=sw.FORWARD_PROFILES,
    make_inputs=sw.forward_inputs,
    reference=sw.forward_reference,
    bytes_moved=sw.forward_bytes,
    byte_model=sw.FORWARD_BYTE_MODEL,
    evidence_boundary=(
        "Forward only, a and b as two contiguous tensors (separate gate and up projections), inputs that do "
        "not require grad, L2 flushed before every call, host work off the clock. The packed [T, 2I] layout "
        "of a merged gate/up projection (swiglu_packed) is not timed here. The two decode batches (T = 1 and "
        "64) are bound by launch latency. Large cases are checked against float64 on their first and last rows."
    ),
    tolerance=sw.FORWARD_TOLERANCE,
    decisions=sw.DECISIONS,
    traffic=READ2_WRITE,  # a and b read, c written
    source_file="experiments/swiglu_fwd.py",
    row_inputs=("a", "b"),
)
