"""Fused attention forward against torch's SDPA backends and the unfused path, bf16, B·S = 16,384, H·D = 2,048."""

import torch

from experiments import _attention as at
from experiments._margins import measured_margin
from experiments.spec import COMPUTE, PARITY, Claim, Experiment

EXPERIMENT = Experiment(
    slug="attention-fwd",
    title="Fused attention: forward",
    question=(
        "At B·S = 16,384 tokens and H·D = 2,048 (bfloat16), over S = 512 … 16,384 and a ragged 3,000, head dims "
        "64 and 128, causal and not, and grouped-query heads (16 query heads over 4 key/value heads, head dim 128), "
        "is the lab's fused attention forward at least as fast as the best of torch's SDPA backends (cuDNN, "
        "FlashAttention-2, memory-efficient) and the compiled unfused path?"
    ),
    focus="Attention forward",
    why=(
        "Unfused attention writes its B·H·S² scores to memory and reads them back, several times and in fp32: "
        "at S = 16,384 that is gigabytes per layer where the inputs are megabytes, and it stops fitting at all "
        "long before the fused kernels do. The online softmax lets a kernel keep one tile of scores on chip and "
        "never write them; what remains is a compute-bound loop of two tile products, where the measure is "
        "TFLOP/s against the best fused kernels torch ships."
    ),
    claim=Claim(
        subject="triton-fused",
        baselines=at.BASELINES,
        threshold=1.0,
        statement="the lab's fused forward is at least as fast as the best of the SDPA backends and torch.compile at every point",
        short="attention forward claim",
        kind=PARITY,
        margin=measured_margin("attention-fwd"),
    ),
    cases=at.cases(),
    dtypes=(torch.bfloat16,),
    profiles=at.profiles("forward"),
    make_inputs=at.forward_inputs,
    reference=at.forward_reference,
    bytes_moved=at.forward_bytes,
    byte_model=(
        "forward: (2·B·H·S·D + 2·B·Hkv·S·D)·size + 4·B·H·S bytes (Q read once, K and V read once at their Hkv "
        "key/value heads, O written once, the fp32 lse written): the least a fused kernel moves; Hkv = H except in "
        "the grouped-query cases. The unfused path also writes and reads its B·H·S² scores, 12 bytes a score (S in "
        "bf16, S and P in fp32, P in bf16); the points tables give those bytes beside the fused ones at every point"
    ),
    flops=at.flops,
    metrics=("latency", "throughput", "tflops"),
    evidence_boundary=(
        "Forward only, bfloat16, no dropout, no attention mask other than causal, equal query and key lengths, "
        "as many key/value heads as query heads except in the grouped-query cases (16 over 4, where the SDPA "
        "backends run with enable_gqa=True and one that refuses it is marked unsupported with torch's reason, and "
        "the unfused paths repeat K and V to 16 heads), contiguous (B, H, S, D) inputs; each GPU model judged on "
        "its own, L2 flushed before every call. TFLOP/s counts 4·B·H·S²·D, halved when causal, whatever an implementation computes. GB/s is "
        "model throughput against the fused minimum and says little for a compute-bound kernel. The unfused "
        "paths are not run past 16 GiB of scores."
    ),
    tolerance=at.FORWARD_TOLERANCE,
    point_columns=at.point_columns("forward"),
    bound=COMPUTE,  # FLOPs grow with S² over inputs that grow with S
    source_file="experiments/attention_fwd.py",
)
