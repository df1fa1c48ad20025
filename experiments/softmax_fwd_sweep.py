"""Forward softmax throughput against row length at M = 4096, float32: every schedule and every peer."""

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import PARITY, Case, Claim, Experiment

EXPERIMENT = Experiment(
    slug="softmax-fwd-sweep",
    title="Softmax forward sweep",
    question="Across row lengths N = 256 … 12,672 at M = 4096 (float32), is the lab's softmax at least as fast as the best peer at every point?",
    focus="Row length and schedule",
    why=(
        "One shape proves little: launch overhead dominates short rows and register pressure long ones. "
        "The sweep shows where each schedule holds up, where impl='auto' should switch, and whether the "
        "lab's kernel keeps up with torch.softmax, torch.compile, Liger and QuACK at every row length."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=sm.FORWARD_PEERS,
        threshold=1.0,
        statement="triton-auto is at least as fast as the best of torch.softmax, torch.compile, Liger and QuACK at every N",
        short="softmax sweep parity claim",
        kind=PARITY,
        margin=measured_margin("softmax-fwd-sweep"),
    ),
    cases=tuple(Case(f"4096x{128 * i}", {"M": 4096, "N": 128 * i}) for i in range(2, 100)),
    dtypes=(torch.float32,),
    profiles=(sm.TRITON_AUTO, sm.TRITON_SINGLE_BLOCK, sm.TRITON_ONLINE, sm.TORCH, sm.TORCH_COMPILE,
              sm.NAIVE_TORCH, sm.LIGER, sm.QUACK),
    make_inputs=sm.forward_inputs,
    reference=sm.forward_reference,
    bytes_moved=sm.forward_bytes,
    byte_model="forward: 2·M·N·size bytes (x read once, y written once)",
    evidence_boundary=(
        "M = 4096 keeps every point under 210 MB: the shorter rows are launch- and tail-bound rather than "
        "bandwidth-bound, so low percentages of the copy ceiling here say more about scheduling than about "
        "DRAM. Long rows at large M are softmax-long-rows' question."
    ),
    tolerance=sm.FORWARD_TOLERANCE,
    x_axis="N",
    decisions=("softmax-dispatch",),
    adhoc_command="benchmark-softmax --backend all --device cuda --rows 4096 --cols 4096 --dtype float32",
    source_file="experiments/softmax_fwd_sweep.py",
)
