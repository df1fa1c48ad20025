"""Softmax forward and backward at row lengths drawn off any grid: does the lab reach the copy ceiling at any N?

The sweeps' row lengths are powers of two and their neighbours, and the kernels' plans were measured there.
Real rows are vocabulary sizes, odd sequence lengths, rows that start off a 16-byte boundary because N is
odd. This experiment draws its row lengths from a seeded generator (a declared parameter anyone can change)
and records the drawn N in every run, as the cases' shapes.
"""

from __future__ import annotations

import math
import random

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import PARITY, Case, Claim, Experiment, Profile

SEED = 20261123  # change it to draw other row lengths; the drawn N are in every record
COUNT = 64
LOW, HIGH = 1_000, 300_000
MIN_ODD = COUNT // 4
MIN_BYTES = 256 << 20  # M·N·size at least this at the narrowest dtype (2 bytes): past any L2


def draw_row_lengths(seed: int = SEED, count: int = COUNT, low: int = LOW, high: int = HIGH) -> list[int]:
    """`count` distinct row lengths drawn log-uniformly from [low, high], at least a quarter of them odd."""
    rng = random.Random(seed)
    drawn: set[int] = set()
    while len(drawn) < count:
        drawn.add(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
    lengths = sorted(drawn)
    evens = [n for n in lengths if n % 2 == 0]
    missing = MIN_ODD - (len(lengths) - len(evens))
    for n in rng.sample(evens, max(0, missing)):  # make enough of them odd, each by one element
        if n + 1 not in drawn and n + 1 <= high:
            lengths[lengths.index(n)] = n + 1
        else:
            lengths[lengths.index(n)] = n - 1
    return sorted(lengths)


def rows_for(n: int) -> int:
    """M so that M·N·2 bytes reach MIN_BYTES (the float32 matrices are twice that)."""
    return math.ceil(MIN_BYTES / (2 * n))


def _cases() -> tuple[Case, ...]:
    cases = []
    for backward in (0, 1):
        for n in draw_row_lengths():
            name = f"{'bwd' if backward else 'fwd'}-{n}"
            cases.append(Case(name, {"M": rows_for(n), "N": n, "backward": backward},
                              f"{'backward' if backward else 'forward'}, N = {n:,}{' (odd)' if n % 2 else ''}"))
    return tuple(cases)


def _inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    return (sm.backward_inputs if case["backward"] else sm.forward_inputs)(case, dtype, device, gen)


def _reference(x=None, y=None, dy=None) -> torch.Tensor:
    return sm.forward_reference(x) if x is not None else sm.backward_reference(y, dy)


def _bytes(case: Case, dtype: torch.dtype) -> int:
    return (sm.backward_bytes if case["backward"] else sm.forward_bytes)(case, dtype)


def _either(forward: Profile, backward: Profile):
    def run(x=None, y=None, dy=None):
        return forward.run(x) if x is not None else backward.run(y, dy)

    return run


def _profile(name: str, description: str, forward: Profile, backward: Profile) -> Profile:
    def plan(case: Case, dtype: torch.dtype):
        chosen = backward if case["backward"] else forward
        return chosen.plan(case, dtype) if chosen.plan is not None else None

    def unsupported(case: Case, dtype: torch.dtype):
        chosen = backward if case["backward"] else forward
        return chosen.unsupported(case, dtype) if chosen.unsupported is not None else None

    return Profile(name, description, _either(forward, backward), tuple({*forward.sources, *backward.sources}),
                   plan=plan if forward.plan or backward.plan else None, unsupported=unsupported,
                   requires=forward.requires or backward.requires)


PROFILES = (
    _profile("triton-auto", "the lab's softmax forward / softmax_bwd with the plan impl='auto' picks",
             sm.TRITON_AUTO, sm.BWD_TRITON_AUTO),
    _profile("torch", "torch.softmax forward / PyTorch's softmax backward kernel", sm.TORCH, sm.BWD_TORCH),
    _profile("torch.compile", "the forward / the backward formula through torch.compile",
             sm.TORCH_COMPILE, sm.BWD_TORCH_COMPILE),
    _profile("liger", "Liger-Kernel's softmax forward / backward (N <= 65,536)", sm.LIGER, sm.BWD_LIGER),
)

EXPERIMENT = Experiment(
    slug="softmax-any-n",
    title="Softmax at any row length",
    question=(
        "At 64 row lengths drawn log-uniformly from 1,000 to 300,000 (a quarter or more of them odd), how close "
        "do the lab's softmax forward and backward come to the copy ceiling, and are they at least as fast as "
        "the best peer at every one?"
    ),
    focus="Generalisation off the sweep grid",
    why=(
        "A plan tuned on powers of two can waste a third of its lanes on a row padded to the next one, and an "
        "odd N denies the compiler aligned vector loads. Vocabulary sizes and sequence lengths are rarely "
        "powers of two; a kernel that is fast only on the sweep's N is not fast."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=("torch", "torch.compile", "liger"),
        threshold=1.0,
        statement="triton-auto is at least as fast as the best of torch, torch.compile and Liger at every drawn N",
        short="any-N claim",
        kind=PARITY,
        margin=measured_margin("softmax-any-n"),
    ),
    cases=_cases(),
    dtypes=(torch.float32, torch.bfloat16, torch.float16),
    profiles=PROFILES,
    make_inputs=_inputs,
    reference=_reference,
    bytes_moved=_bytes,
    byte_model="forward: 2·M·N·size bytes (x read once, y written once); backward: 3·M·N·size (y and dy read, dx written)",
    evidence_boundary=(
        f"Row lengths from seed {SEED}; another seed draws other lengths from the same range. M is chosen so "
        "each matrix holds at least 256 MiB at 2-byte dtypes (512 MiB in float32), far past the L2."
    ),
    tolerance={dtype: max(sm.FORWARD_TOLERANCE[dtype], sm.BACKWARD_TOLERANCE[dtype]) for dtype in sm.FORWARD_TOLERANCE},
    x_axis="N",
    source_file="experiments/softmax_any_n.py",
    row_inputs=("x", "y", "dy"),
)
