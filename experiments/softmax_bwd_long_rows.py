"""Backward softmax on long rows at a constant 2^28 elements: three tensors a row, where single-block spills."""

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import PARITY, READ2_WRITE, Case, Claim, Experiment

TOTAL = 2**28

EXPERIMENT = Experiment(
    slug="softmax-bwd-long-rows",
    title="Softmax backward on long rows",
    question="From N = 1,024 to 262,144 with M·N = 2^28, does the lab's softmax backward keep up with the best peer, and how close to the copy ceiling does it run?",
    focus="Backward pass on long rows",
    why=(
        "The backward reads y and dy and writes dx, so at M·N = 2^28 every point moves 3 GiB (fp32) or "
        "1.5 GiB (bf16) and is bandwidth-bound. A single-block program holds two tensors of the row in "
        "registers and, like the forward, falls off once the row no longer fits them; past that a schedule either reads "
        "y and dy twice (online: 5·M·N·size bytes) or splits the row across programs that exchange one "
        "partial dot product each (split-row: 3·M·N·size). This sweep sets the backward threshold of "
        "impl='auto'."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=sm.BACKWARD_PEERS,
        threshold=1.0,
        statement="the lab's backward (impl='auto') is at least as fast as the best of torch, torch.compile, Liger and QuACK at every N",
        short="long-row backward parity claim",
        kind=PARITY,
        margin=measured_margin("softmax-bwd-long-rows"),
    ),
    cases=tuple(Case(f"{TOTAL // 2**k}x{2**k}", {"M": TOTAL // 2**k, "N": 2**k}) for k in range(10, 19)),
    dtypes=(torch.bfloat16, torch.float32),
    profiles=(sm.BWD_TRITON_AUTO, sm.BWD_TRITON_SINGLE_BLOCK, sm.BWD_TRITON_ONLINE, sm.BWD_TORCH,
              sm.BWD_TORCH_COMPILE, sm.BWD_LIGER, sm.BWD_QUACK),
    make_inputs=sm.backward_inputs,
    reference=sm.backward_reference,
    bytes_moved=sm.backward_bytes,
    byte_model="backward: 3·M·N·size bytes (y and dy read once, dx written once)",
    evidence_boundary=(
        "Each profile gets the same saved output y and upstream gradient dy; the time excludes the forward. "
        "Model throughput charges every schedule three transfers, so the online schedule's second read of y "
        "and dy is not counted: its GB/s is what a user sees. The accuracy check runs on the first and last "
        "rows only at these sizes (see the method page)."
    ),
    tolerance=sm.BACKWARD_TOLERANCE,
    x_axis="N",
    decisions=("softmax-dispatch",),
    traffic=READ2_WRITE,  # y and dy read, dx written
    source_file="experiments/softmax_bwd_long_rows.py",
    row_inputs=("y", "dy"),
)
