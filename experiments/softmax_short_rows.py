"""Forward softmax on short rows at M = 32,768: where rows per program and warps decide, not DRAM."""

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import PARITY, Case, Claim, Experiment

ROWS = 32768

EXPERIMENT = Experiment(
    slug="softmax-short-rows",
    title="Softmax on short rows",
    question=(
        "For rows of N = 128 … 1,024 at M = 32,768, how close does the lab's softmax come to the copy ceiling, "
        "and is it at least as fast as the best peer at every N?"
    ),
    focus="Short rows and launch granularity",
    why=(
        "Attention over short sequences and classifier heads produce many short rows. One row per program "
        "leaves each program a few hundred bytes of work, so the launch, not DRAM, sets the time; the lab's "
        "kernel packs short rows into programs of up to 1,024 lanes on one or two warps. At M = 32,768 the matrices "
        "hold 8–128 MB, large enough for the copy ceiling to be the yardstick."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=sm.FORWARD_PEERS,
        threshold=1.0,
        statement="triton-auto is at least as fast as the best of torch.softmax, torch.compile, Liger and QuACK at every N",
        short="short-row parity claim",
        kind=PARITY,
        margin=measured_margin("softmax-short-rows"),
    ),
    cases=tuple(Case(f"{ROWS}x{n}", {"M": ROWS, "N": n}) for n in (128, 256, 384, 512, 768, 1024)),
    dtypes=(torch.bfloat16, torch.float32),
    profiles=(sm.TRITON_AUTO, sm.TORCH, sm.TORCH_COMPILE, sm.LIGER, sm.QUACK),
    make_inputs=sm.forward_inputs,
    reference=sm.forward_reference,
    bytes_moved=sm.forward_bytes,
    byte_model="forward: 2·M·N·size bytes (x read once, y written once)",
    evidence_boundary=(
        "Forward only, M = 32,768. The smallest matrices (N = 128 in bfloat16: 8 MB each way) fit in the L2 "
        "cache, which is flushed before every timed call; a kernel that follows another on the same data "
        "would see them warm."
    ),
    tolerance=sm.FORWARD_TOLERANCE,
    x_axis="N",
    decisions=("softmax-dispatch",),
    adhoc_command="benchmark-softmax --backend all --device cuda --rows 32768 --cols 512 --dtype float32",
    source_file="experiments/softmax_short_rows.py",
    row_inputs=("x",),
)
