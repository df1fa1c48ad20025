"""Forward softmax on long rows at a constant 2^28 elements: where single-block spills and online re-reads."""

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import PARITY, Case, Claim, Experiment

TOTAL = 2**28

EXPERIMENT = Experiment(
    slug="softmax-long-rows",
    title="Softmax on long rows",
    question="From N = 1,024 to 262,144 with M·N = 2^28, which schedule is fastest, and does the lab's softmax keep up with the best peer?",
    focus="Long rows and the DRAM ceiling",
    why=(
        "With M·N fixed at 2^28 every point moves 1 GiB (fp32) or 512 MiB (bf16) each way, so throughput is "
        "bandwidth-bound and comparable across N. Single-block holds a row in registers and spills once rows "
        "grow; online reads x twice and falls to about two thirds of the copy "
        "ceiling on the longest rows. This sweep sets "
        "impl='auto''s threshold."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=sm.FORWARD_PEERS,
        threshold=1.0,
        statement="triton-auto is at least as fast as the best of torch.softmax, torch.compile, Liger and QuACK at every N",
        short="long-row parity claim",
        kind=PARITY,
        margin=measured_margin("softmax-long-rows"),
    ),
    cases=tuple(Case(f"{TOTAL // 2**k}x{2**k}", {"M": TOTAL // 2**k, "N": 2**k}) for k in range(10, 19)),
    dtypes=(torch.bfloat16, torch.float32),
    profiles=(sm.TRITON_AUTO, sm.TRITON_SINGLE_BLOCK, sm.TRITON_ONLINE, sm.TORCH, sm.TORCH_COMPILE, sm.LIGER, sm.QUACK),
    make_inputs=sm.forward_inputs,
    reference=sm.forward_reference,
    bytes_moved=sm.forward_bytes,
    byte_model="forward: 2·M·N·size bytes (x read once, y written once)",
    evidence_boundary=(
        "Model throughput counts one read and one write, so a schedule that reads x twice is charged for one: "
        "its GB/s is what a user sees, not what the DRAM moved. The accuracy check runs on the first and last "
        "rows only at these sizes (see the method page)."
    ),
    tolerance=sm.FORWARD_TOLERANCE,
    x_axis="N",
    decisions=("softmax-dispatch",),
    adhoc_command="benchmark-softmax --backend all --device cuda --rows 4096 --cols 65536 --dtype bfloat16",
    source_file="experiments/softmax_long_rows.py",
    row_inputs=("x",),
)
