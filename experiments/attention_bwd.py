"""Fused attention backward against torch's SDPA backends and the unfused path, bf16, B·S = 16,384, H·D = 2,048."""

import torch

from experiments import _attention as at
from experiments._margins import measured_margin
from experiments.spec import COMPUTE, PARITY, Claim, Experiment

EXPERIMENT = Experiment(
    slug="attention-bwd",
    title="Fused attention: backward",
    question=(
        "At B·S = 16,384 tokens and H·D = 2,048 (bfloat16), over S = 512 … 16,384 and a ragged 3,000, head dims "
        "64 and 128, causal and not, and grouped-query heads (16 query heads over 4 key/value heads, head dim 128), "
        "does the lab's fused attention backward reach at least 0.8× the speed of the best of torch's SDPA "
        "backends and the compiled unfused path?"
    ),
    focus="Attention backward",
    why=(
        "The backward needs P again for every gradient. Storing it costs B·H·S² values; the fused kernels "
        "recompute it from Q, K and the saved logsumexp instead, one tile at a time, and pay for that with "
        "extra tile products (the lab's kernels recompute S and dP in both the dK/dV and the dQ pass, 7 products "
        "where 5 would do with atomic dQ updates). The backward is where fused attention spends most of a "
        "training step's attention time."
    ),
    claim=Claim(
        subject="triton-fused",
        baselines=at.BASELINES,
        threshold=1.0,
        statement="the lab's fused backward is at least as fast as the best of the SDPA backends and torch.compile at every point (its first target, 0.8x of the best, is read off the measured speedups)",
        short="attention backward claim",
        kind=PARITY,
        margin=measured_margin("attention-bwd"),
    ),
    cases=at.cases(),
    dtypes=(torch.bfloat16,),
    profiles=at.profiles("backward"),
    make_inputs=at.backward_inputs,
    reference=at.backward_reference,
    bytes_moved=at.backward_bytes,
    byte_model=(
        "backward: (4·B·H·S·D + 4·B·Hkv·S·D)·size + 4·B·H·S bytes (Q, O and dO read once and dQ written once at "
        "the H query heads, K and V read once and dK and dV written once at the Hkv key/value heads, the fp32 lse "
        "read): the least a fused kernel moves; Hkv = H except in the grouped-query cases. The unfused path writes "
        "and reads its B·H·S² scores and their gradients, 24 bytes a score; the points tables give those bytes "
        "beside the fused ones at every point"
    ),
    flops=at.backward_flops,
    metrics=("latency", "throughput", "tflops"),
    evidence_boundary=(
        "Backward only: every profile's forward runs once, untimed, and each timed call is "
        "torch.autograd.grad(O, (Q, K, V), dO) on that graph, so each implementation pays for its own saved "
        "state (the lab's and the fused backends' logsumexp, the unfused path's stored P). bfloat16, no dropout, "
        "equal lengths, as many key/value heads as query heads except in the grouped-query cases (16 over 4, where "
        "the SDPA backends run with enable_gqa=True and one that refuses it is marked unsupported with torch's "
        "reason, the unfused paths repeat K and V to 16 heads, and dK and dV sum over each group), contiguous "
        "inputs, each GPU model judged on its own, L2 flushed before every call. TFLOP/s counts 2.5 × 4·B·H·S²·D, halved when causal. Accuracy is the worst of dQ, dK "
        "and dV against float64. The unfused paths are not run past 16 GiB of scores and gradients."
    ),
    tolerance=at.BACKWARD_TOLERANCE,
    point_columns=at.point_columns("backward"),
    bound=COMPUTE,  # FLOPs grow with S² over inputs that grow with S
    source_file="experiments/attention_bwd.py",
)
