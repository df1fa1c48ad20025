"""A Llama-style decoder layer at a 7-8B-class shape, prefill and decode: the lab's block against torch.compile's."""

import torch

from experiments import _decoder as dec
from experiments._margins import measured_margin
from experiments.spec import PARITY, READ, Claim, Experiment

EXPERIMENT = Experiment(
    slug="decoder-block",
    title="A decoder layer, three ways",
    question=(
        "For one Llama-style decoder layer (hidden 4,096, 32 query and 8 key/value heads of 128, intermediate "
        "14,336, bfloat16), at prefill (1k–16k tokens) and at decode (batch 1–64 against a KV cache of 1k–8k), "
        "is the block built from the lab's kernels at least as fast as torch.compile of the same PyTorch module?"
    ),
    focus="A real forward pass",
    why=(
        "Every fusion in the lab exists to make this layer faster, and a reader deciding whether to adopt one "
        "wants the answer for the layer, not for the op: Amdahl's law decides what a 1.3x RMSNorm is worth "
        "when the projections take most of the time. Each profile's op-by-op breakdown (torch.profiler's "
        "kernel times, kept in the record) shows where the layer's time goes, and the gap between kernels "
        "shows what the host costs at decode."
    ),
    claim=Claim(
        subject="lab",
        baselines=("torch.compile",),
        threshold=1.0,
        statement="the lab's block is at least as fast as torch.compile's at every prefill and decode point",
        short="decoder block claim",
        kind=PARITY,
        margin=measured_margin("decoder-block"),
    ),
    cases=dec.cases(),
    dtypes=(torch.bfloat16,),
    profiles=dec.profiles(),
    make_inputs=dec.make_inputs,
    reference=dec.float64_reference,
    bytes_moved=dec.bytes_moved,
    byte_model=dec.BYTE_MODEL,
    flops=dec.flops,
    tokens=dec.tokens,
    metrics=("latency", "throughput", "tflops", "tokens per second (tokens a call processes over its median time)"),
    evidence_boundary=(
        "One layer, forward only, bfloat16, seeded weights shared by every profile; each GPU model judged on its "
        "own. The GPU-time clock flushes the L2 before every call; the eager-call clock cycles through copies of "
        "the inputs (the weights, 436 MB, never fit the L2 either way). torch.compile runs in its default mode "
        "and dynamic-shape policy, compiled once for prefill and once for decode, as a user gets it. Decode "
        "under CUDA-graph replay is the experiment decoder-block-graphed. The int8 and int4 profiles compute a "
        "different approximation and are not in the claim; gemlite-int8 and gemlite-int4, the plain block with "
        "gemlite's weight-only Triton layers packed from the same quantised weights, are their peers, at decode "
        "only as they are. The lab's block is the lab's kernels where the lab has "
        "one and torch's elsewhere (its projections are cuBLAS through F.linear; the int8 and int4 blocks' are the "
        "lab's dequantising kernels); "
        f"{dec.DECODE_ATTENTION_WHY}. The profiles table says which op comes from where, and each op-by-op table "
        "gives every op's source, measured from its kernels' names and as the launch plan declares it."
    ),
    tolerance=dec.TOLERANCE,
    traffic=READ,  # at decode the weights and the KV cache are read, a few rows written
    bound=dec.bound,  # compute-bound at prefill, memory-bound at decode
    source_file="experiments/decoder_block.py",
    breakdown=dec.classify,
)
