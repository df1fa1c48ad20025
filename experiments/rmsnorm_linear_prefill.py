"""RMSNorm + linear at prefill shapes (M >= 1024 tokens): does the lab's fused kernel at least match the unfused pair?"""

import torch

from experiments import _rmsnorm_linear as rl
from experiments._margins import measured_margin
from experiments.spec import COMPUTE, PARITY, Claim, Experiment

EXPERIMENT = Experiment(
    slug="rmsnorm-linear-prefill",
    title="Fused RMSNorm + linear: prefill",
    question=(
        "For M = 1024, 4096 and 8192 tokens through a 4096 → 4096 or 4096 → 12288 projection (bfloat16), is "
        "the lab's fused RMSNorm + linear at least as fast as the best of unfused PyTorch and torch.compile?"
    ),
    focus="Kernel fusion at prefill",
    why=(
        "At prefill the product is a GEMM with hundreds of FLOPs per byte: compute-bound. Fusing the norm "
        "saves the normalised activations' write and read (2·M·K·2 bytes), a few percent of the GEMM's time "
        "at best, so the fused kernel wins only if its Triton GEMM loses less than that to cuBLAS. The "
        "tutorial-style fused kernel is timed beside it (triton-seed-style): fusion cannot pay for untuned "
        "tiles."
    ),
    claim=Claim(
        subject="triton-fused",
        baselines=rl.BASELINES,
        threshold=1.0,
        statement="triton-fused is at least as fast as the best of torch-unfused and torch.compile at every prefill shape",
        short="prefill fusion claim",
        kind=PARITY,
        margin=measured_margin("rmsnorm-linear-prefill"),
    ),
    cases=rl.cases(rl.PREFILL_M),
    dtypes=(torch.bfloat16,),
    profiles=rl.PROFILES,
    make_inputs=rl.make_inputs,
    reference=rl.float64_reference,
    bytes_moved=rl.bytes_moved,
    byte_model=rl.BYTE_MODEL,
    flops=rl.flops,
    metrics=("latency", "throughput", "tflops"),
    evidence_boundary=(
        "Forward only, bfloat16, K = 4096, each GPU model judged on its own, L2 flushed before every call. GB/s here is model "
        "throughput of a compute-bound kernel: TFLOP/s is the figure that matters. torch.compile runs in its "
        "default mode (cuBLAS for the product); its max-autotune mode, other K, dtypes or GPUs are outside "
        "it. The backward (torch) is not timed."
    ),
    tolerance=rl.TOLERANCE,
    decisions=rl.DECISIONS,
    bound=COMPUTE,  # thousands of rows per weight read
    source_file="experiments/rmsnorm_linear_prefill.py",
    row_inputs=("x",),
)
