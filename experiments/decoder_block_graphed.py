"""The decoder layer's decode step under CUDA-graph replay, as serving engines run it."""

import torch

from experiments import _decoder as dec
from experiments._decoder_graphed import graph_profiles
from experiments._margins import measured_margin
from experiments.spec import PARITY, READ, Claim, Experiment

EXPERIMENT = Experiment(
    slug="decoder-block-graphed",
    title="A decoder layer's decode step, graphed",
    question=(
        "Captured as a CUDA graph and replayed, as serving engines run decode, is one step of the lab's decoder "
        "layer (batch 1–64, KV cache 1k–8k, bfloat16) at least as fast as torch.compile's?"
    ),
    focus="A real forward pass",
    why=(
        "At decode a layer's kernels are short and the host can set the pace; a served model hides that by "
        "replaying a captured graph. Under replay only the kernels and the gaps between them remain, so this "
        "is the comparison a serving engine would make, beside decoder-block's eager calls."
    ),
    claim=Claim(
        subject="lab-graph",
        baselines=("torch.compile-graph",),
        threshold=1.0,
        statement="the lab's graphed decode step is at least as fast as torch.compile's graphed step at every point",
        short="graphed decode claim",
        kind=PARITY,
        margin=measured_margin("decoder-block-graphed"),
    ),
    cases=dec.decode_cases(),
    dtypes=(torch.bfloat16,),
    profiles=graph_profiles(),
    make_inputs=dec.make_inputs,
    reference=dec.float64_reference,
    bytes_moved=dec.bytes_moved,
    byte_model=dec.BYTE_MODEL,
    flops=dec.flops,
    tokens=dec.tokens,
    metrics=("latency", "throughput", "tflops", "tokens per second (tokens a call processes over its median time)"),
    evidence_boundary=(
        "Decode only, one layer, bfloat16, seeded weights. Each input set (the originals and every copy the "
        "eager-call clock cycles through) has its own captured graph, captured before timing; the eager-call "
        "clock's figure is what a serving loop pays per replay, host included. The GPU-time clock flushes the L2 "
        f"before every replay. As in decoder-block, {dec.DECODE_ATTENTION_WHY}. A replay's kernels carry no op "
        "annotations, so every profile's ops are grouped by kernel name; the op tables say which of them are the "
        "lab's kernels. The int8 and int4 profiles (the lab's quantised blocks, and gemlite's layers in the plain "
        "block on the same quantised weights) compute a different approximation and are not in the claim."
    ),
    tolerance=dec.TOLERANCE,
    traffic=READ,  # decode: the weights and the KV cache read, a few rows written
    source_file="experiments/decoder_block_graphed.py",
    breakdown=dec.classify,
)
