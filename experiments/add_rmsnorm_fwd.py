"""Residual add + RMSNorm forward, (h, y) = (x + r, rms_norm(x + r) * gamma): the lab's fused kernel against
eager PyTorch, torch.compile, Liger and QuACK, from decode batches to 32k tokens."""

import torch

from experiments import _add_rmsnorm as ar
from experiments._margins import measured_margin
from experiments.spec import PARITY, Claim, Experiment

EXPERIMENT = Experiment(
    slug="add-rmsnorm-fwd",
    title="Residual add + RMSNorm forward",
    question=(
        "For T = 1 … 32,768 tokens of hidden size H = 2,048 … 16,384 (bfloat16 and float32), is the lab's fused "
        "residual add + RMSNorm at least as fast as the best of eager PyTorch, torch.compile, Liger and QuACK?"
    ),
    focus="Kernel fusion: residual add + RMSNorm",
    why=(
        "Every transformer sub-layer ends with h = x + r and the next one starts with rms_norm(h) * γ. Both "
        "outputs are needed: y feeds the next block, h is the residual stream carried on. Fused, x and r are "
        "read once and h and y written once, 4·T·H elements; the add and a separate norm kernel move 5·T·H, "
        "because the norm reads h back. A kernel that only matches the copy bandwidth on those 4·T·H elements "
        "is as fast as the operation can be."
    ),
    claim=Claim(
        subject="triton",
        baselines=ar.PEERS,
        threshold=1.0,
        statement="the lab's add_rmsnorm is at least as fast as the best of torch, torch.compile, Liger and QuACK at every shape",
        short="add + RMSNorm forward parity claim",
        kind=PARITY,
        margin=measured_margin("add-rmsnorm-fwd"),
    ),
    cases=ar.CASES,
    dtypes=ar.DTYPES,
    profiles=ar.FORWARD_PROFILES,
    make_inputs=ar.forward_inputs,
    reference=ar.forward_reference,
    bytes_moved=ar.forward_bytes,
    byte_model=ar.FORWARD_BYTE_MODEL,
    evidence_boundary=(
        "Forward only, inputs that do not require grad, L2 flushed before every call and host work kept off the "
        "clock. Every profile returns both h and y, each checked against float64. The two decode batches "
        "(T = 1 and 32) move about 2 MB or less and are bound by launch latency, not DRAM. torch.compile runs in its "
        "default mode, compiled once per shape; Liger in its default casting mode; QuACK's rmsnorm with the residual passed in and prenorm=True, so it returns h as well."
    ),
    tolerance=ar.FORWARD_TOLERANCE,
    decisions=ar.DECISIONS,
    source_file="experiments/add_rmsnorm_fwd.py",
    row_inputs=("x", "residual"),
)
