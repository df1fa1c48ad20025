"""RMSNorm + linear at decode shapes (M <= 16 tokens): does the lab's fused GEMV beat the unfused pair by 10%?"""

import torch

from experiments import _rmsnorm_linear as rl
from experiments._margins import measured_margin
from experiments.spec import READ, WIN, Claim, Experiment

EXPERIMENT = Experiment(
    slug="rmsnorm-linear-decode",
    title="Fused RMSNorm + linear: decode",
    question=(
        "For M = 1, 2, 4, 8 and 16 tokens through a 4096 → 4096, 4096 → 12288, 4096 → 14336, 4096 → 11007 "
        "or 8192 → 4096 projection (bfloat16), is the lab's fused RMSNorm + linear at least 1.1x faster than the best of "
        "unfused PyTorch and torch.compile?"
    ),
    focus="Kernel fusion at decode",
    why=(
        "Every decoder layer runs RMSNorm straight into the Q/K/V and MLP projections, and at decode the "
        "product is a matrix-vector one: the time is the time to read W once (N·K·2 bytes) plus launches. "
        "Fusion removes a launch and the normalised activations' round trip, both small against W, so it can "
        "only win by streaming W closer to the copy ceiling than cuBLAS does. The lab's decode kernel is a "
        "weight-streaming GEMV that reads W once, computes each row's RMS from the x tiles it loads anyway and "
        "scales the result once; tutorials present this fusion as an LLM inference speed-up, and a "
        "tutorial-style fused kernel once ran slower than unfused PyTorch on an H100 (a measurement that left no "
        "record; the seed-style profile is its recorded counterpart)."
    ),
    claim=Claim(
        subject="triton-fused",
        baselines=rl.BASELINES,
        threshold=1.1,
        statement="triton-fused is at least 1.1x faster than the best of torch-unfused and torch.compile at every decode shape",
        short="decode fusion claim",
        kind=WIN,
        margin=measured_margin("rmsnorm-linear-decode"),
    ),
    cases=rl.decode_cases(),
    dtypes=(torch.bfloat16,),
    profiles=rl.PROFILES,
    make_inputs=rl.make_inputs,
    reference=rl.float64_reference,
    bytes_moved=rl.bytes_moved,
    byte_model=rl.BYTE_MODEL,
    flops=rl.flops,
    metrics=("latency", "throughput", "tflops"),
    evidence_boundary=(
        "Forward only, bfloat16, K = 4096 and 8192, N up to 14336 (one odd N, 11007), each GPU model judged on its own; inputs and weights are fresh in DRAM for "
        "every call (L2 flushed), as for a layer whose weights were evicted by the layers before it. A decode "
        "step that keeps W resident in L2, a CUDA graph that hides launches, or another dtype or GPU is outside "
        "it. Every point runs the GEMV; which form (CUDA cores or tensor cores), tile and split-K it used is "
        "in each point's launch plan. Host time per call shows on the eager-call clock, beside GPU time. The "
        "backward (torch) is not timed."
    ),
    tolerance=rl.TOLERANCE,
    decisions=rl.DECISIONS,
    traffic=READ,  # the weight read once; a few rows written
    source_file="experiments/rmsnorm_linear_decode.py",
    row_inputs=("x",),
)
