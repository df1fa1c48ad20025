"""Residual add + RMSNorm backward: dx = dr and dgamma from the gradients of both outputs, timed alone on each
profile's own retained forward graph."""

import torch

from experiments import _add_rmsnorm as ar
from experiments._margins import measured_margin
from experiments.spec import PARITY, Claim, Experiment

EXPERIMENT = Experiment(
    slug="add-rmsnorm-bwd",
    title="Residual add + RMSNorm backward",
    question=(
        "For T = 1 … 32,768 tokens of hidden size H = 2,048 … 16,384 (bfloat16 and float32), is the lab's fused "
        "add + RMSNorm backward at least as fast as the best of eager PyTorch, torch.compile, Liger and QuACK?"
    ),
    focus="Kernel fusion: residual add + RMSNorm, backward",
    why=(
        "The gradient reaches h from two places, the norm and the residual stream downstream, so "
        "dx = dr = dh + rstd · (g − ĥ · mean(g · ĥ)) with g = dy · γ, and dγ = Σ dy · ĥ over every token. A fused "
        "kernel reads dy, dh and h once and writes dx once, 4·T·H elements; the norm's backward followed by "
        "the add of dh moves 6·T·H. dγ is a reduction over all T rows: the lab's kernel keeps a partial sum "
        "per program and adds the partials in a second, small kernel, with no atomics."
    ),
    claim=Claim(
        subject="triton",
        baselines=ar.PEERS,
        threshold=1.0,
        statement="the lab's add_rmsnorm backward is at least as fast as the best of torch, torch.compile, Liger and QuACK at every shape",
        short="add + RMSNorm backward parity claim",
        kind=PARITY,
        margin=measured_margin("add-rmsnorm-bwd"),
    ),
    cases=ar.CASES,
    dtypes=ar.DTYPES,
    profiles=ar.BACKWARD_PROFILES,
    make_inputs=ar.backward_inputs,
    reference=ar.backward_reference,
    bytes_moved=ar.backward_bytes,
    byte_model=ar.BACKWARD_BYTE_MODEL,
    evidence_boundary=(
        "Each profile runs its own forward once on the same inputs and keeps the graph; the timed call is "
        "torch.autograd.grad over it with the same dh and dy, so the time is the backward kernels alone, "
        "whatever each implementation launches (torch.compile: the backward AOTAutograd generated). Each "
        "profile returns dx, dr and dγ, each checked against float64 on every row. dγ's partial sums and "
        "rstd are the kernel's own overhead and are not counted as model bytes. On the eager-call clock each "
        "call takes the upstream gradients of its own copy of the inputs through the graph built once, so "
        "the saved activations are the same tensors in every call."
    ),
    tolerance=ar.BACKWARD_TOLERANCE,
    decisions=ar.DECISIONS,
    source_file="experiments/add_rmsnorm_bwd.py",
)
