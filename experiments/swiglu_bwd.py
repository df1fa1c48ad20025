"""SwiGLU backward: da and db from dc, timed alone on each profile's own retained forward graph."""

import torch

from experiments import _swiglu as sw
from experiments._margins import measured_margin
from experiments.spec import PARITY, Claim, Experiment

EXPERIMENT = Experiment(
    slug="swiglu-bwd",
    title="SwiGLU backward",
    question=(
        "For T = 1 … 32,768 tokens at intermediate sizes I = 4,096 … 28,672 (bfloat16 and float32), is the lab's "
        "SwiGLU backward at least as fast as the best of eager PyTorch, torch.compile and Liger?"
    ),
    focus="Kernel fusion: SwiGLU gate, backward",
    why=(
        "da = dc · b · s · (1 + a · (1 − s)) and db = dc · silu(a), s = sigmoid(a): a fused kernel reads dc, a "
        "and b once and writes da and db once, 5·T·I elements, recomputing silu(a) instead of keeping it. "
        "Eager autograd runs three kernels over 9·T·I and needs silu(a) saved by the forward."
    ),
    claim=Claim(
        subject="triton",
        baselines=sw.PEERS,
        threshold=1.0,
        statement="the lab's swiglu backward is at least as fast as the best of torch, torch.compile and Liger at every shape",
        short="SwiGLU backward parity claim",
        kind=PARITY,
        margin=measured_margin("swiglu-bwd"),
    ),
    cases=sw.CASES,
    dtypes=sw.DTYPES,
    profiles=sw.BACKWARD_PROFILES,
    make_inputs=sw.backward_inputs,
    reference=sw.backward_reference,
    bytes_moved=sw.backward_bytes,
    byte_model=sw.BACKWARD_BYTE_MODEL,
    evidence_boundary=(
        "Each profile runs its own forward once on the same a and b and keeps the graph; the timed call is "
        "torch.autograd.grad over it with the same dc, so the time is the backward kernels alone "
        "(torch.compile: the backward AOTAutograd generated). Liger writes its gradients over the a and b it "
        "saved, so it differentiates copies made before timing. a and b are separate contiguous tensors. On "
        "the eager-call clock each call takes the dc of its own copy of the inputs through the graph built "
        "once, so the saved a and b are the same tensors in every call."
    ),
    tolerance=sw.BACKWARD_TOLERANCE,
    decisions=sw.DECISIONS,
    source_file="experiments/swiglu_bwd.py",
    row_inputs=("a", "b", "dc"),
)
