"""Backward softmax throughput against row length at M = 4096, float32."""

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import PARITY, READ2_WRITE, Case, Claim, Experiment

EXPERIMENT = Experiment(
    slug="softmax-bwd-sweep",
    title="Softmax backward sweep",
    question="Across row lengths N = 256 … 12,672 at M = 4096 (float32), is the lab's softmax backward at least as fast as the best peer?",
    focus="Backward pass",
    why=(
        "Training runs the backward as often as the forward, and it moves three tensors instead of two: "
        "dx = y · (dy − ⟨dy, y⟩) reads y and dy and writes dx. A fused kernel needs one read of each when "
        "the row fits on chip, two when it does not."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=sm.BACKWARD_PEERS,
        threshold=1.0,
        statement="the lab's backward (impl='auto') is at least as fast as the best of torch, torch.compile, Liger and QuACK at every N",
        short="backward parity claim",
        kind=PARITY,
        margin=measured_margin("softmax-bwd-sweep"),
    ),
    cases=tuple(Case(f"4096x{128 * i}", {"M": 4096, "N": 128 * i}) for i in range(2, 100)),
    dtypes=(torch.float32,),
    profiles=(sm.BWD_TRITON_AUTO, sm.BWD_TRITON_SINGLE_BLOCK, sm.BWD_TRITON_ONLINE, sm.BWD_TORCH,
              sm.BWD_TORCH_COMPILE, sm.BWD_NAIVE_TORCH, sm.BWD_LIGER, sm.BWD_QUACK),
    make_inputs=sm.backward_inputs,
    reference=sm.backward_reference,
    bytes_moved=sm.backward_bytes,
    byte_model="backward: 3·M·N·size bytes (y and dy read once, dx written once)",
    evidence_boundary=(
        "Each profile gets the same saved output y and upstream gradient dy; the time excludes the forward. "
        "M = 4096 keeps every tensor under 210 MB, so short rows are launch-bound, not bandwidth-bound."
    ),
    tolerance=sm.BACKWARD_TOLERANCE,
    x_axis="N",
    decisions=("softmax-dispatch",),
    traffic=READ2_WRITE,  # y and dy read, dx written
    source_file="experiments/softmax_bwd_sweep.py",
)
