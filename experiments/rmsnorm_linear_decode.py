"""RMSNorm + linear at decode shapes (M <= 128 tokens): does the lab's fused kernel beat the unfused pair by 10%?"""

import torch

from experiments import _rmsnorm_linear as rl
from experiments._margins import measured_margin
from experiments.spec import WIN, Claim, Experiment

EXPERIMENT = Experiment(
    slug="rmsnorm-linear-decode",
    title="Fused RMSNorm + linear: decode",
    question=(
        "For M = 1, 16 and 128 tokens through a 4096 → 4096 or 4096 → 12288 projection (bfloat16), is the "
        "lab's fused RMSNorm + linear at least 1.1x faster than the best of unfused PyTorch and torch.compile?"
    ),
    focus="Kernel fusion at decode",
    why=(
        "Every decoder layer runs RMSNorm straight into the Q/K/V and MLP projections, and at decode the "
        "product is a matrix-vector one: the time is the time to read W once (N·K·2 bytes) plus launches. "
        "Fusion removes a launch and the normalised activations' round trip, both small against W, so it can "
        "only win by streaming W closer to the copy ceiling than cuBLAS does. Tutorials present this fusion as an LLM "
        "inference speed-up; the tutorial-style kernel is timed here beside the tuned one (triton-seed-style), "
        "so the page shows what the tuning bought. This experiment puts a tuned fusion to the test."
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
    cases=rl.cases(rl.DECODE_M),
    dtypes=(torch.bfloat16,),
    profiles=rl.PROFILES,
    make_inputs=rl.make_inputs,
    reference=rl.float64_reference,
    bytes_moved=rl.bytes_moved,
    byte_model=rl.BYTE_MODEL,
    flops=rl.flops,
    metrics=("latency", "throughput", "tflops"),
    evidence_boundary=(
        "Forward only, bfloat16, K = 4096, each GPU model judged on its own; inputs and weights are fresh in DRAM for every call "
        "(L2 flushed), as for a layer whose weights were evicted by the layers before it. A decode step that "
        "keeps W resident in L2, a CUDA graph that hides launches, or another K, dtype or GPU is outside "
        "it. M = 1 runs the kernel's CUDA-core matrix-vector schedule, M = 16 its decode tiles and M = 128 its "
        "middle shape class. The backward (torch) is not timed."
    ),
    tolerance=rl.TOLERANCE,
    decisions=rl.DECISIONS,
    source_file="experiments/rmsnorm_linear_decode.py",
    row_inputs=("x",),
)
