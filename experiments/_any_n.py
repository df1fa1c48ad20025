"""What softmax-any-n and softmax-any-n-bwd share (not an experiment itself): the seeded draw of row lengths,
the rows per length, inputs drawn on the device, and the declaration both directions fill in.

The sweeps' row lengths are powers of two and their neighbours, and the kernels' plans were measured there.
Real rows are vocabulary sizes, odd sequence lengths, rows that start off a 16-byte boundary because N is
odd. These experiments draw their row lengths from a seeded generator (a declared parameter anyone can
change) and record the drawn N in every run, as the cases' shapes. One experiment a direction keeps each run
within ten minutes on one H100.
"""

from __future__ import annotations

import math
import random

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import COPY, PARITY, READ2_WRITE, Case, Claim, Experiment, Profile

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


def cases(backward: bool) -> tuple[Case, ...]:
    prefix = "bwd" if backward else "fwd"
    return tuple(Case(f"{prefix}-{n}", {"M": rows_for(n), "N": n}, f"N = {n:,}{' (odd)' if n % 2 else ''}")
                 for n in draw_row_lengths())


def _device_generator(device: str, gen: torch.Generator) -> torch.Generator:
    # Half a gigabyte a matrix is drawn where it is used: a seed taken from the point's generator keeps the
    # draw reproducible from the recorded input seed, without minutes of CPU sampling per run.
    return torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))


def forward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    g = _device_generator(device, gen)
    return {"x": (torch.randn(case["M"], case["N"], generator=g, device=device) * 3).to(dtype)}


def backward_inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    g = _device_generator(device, gen)
    x = torch.randn(case["M"], case["N"], generator=g, device=device) * 3
    y = torch.softmax(x, -1).to(dtype)
    del x
    return {"y": y, "dy": torch.randn(case["M"], case["N"], generator=g, device=device).to(dtype)}


def experiment(backward: bool, slug: str, source_file: str, profiles: tuple[Profile, ...]) -> Experiment:
    direction = "backward" if backward else "forward"
    return Experiment(
        slug=slug,
        title=f"Softmax {direction} at any row length",
        question=(
            f"At {COUNT} row lengths drawn log-uniformly from {LOW:,} to {HIGH:,} (a quarter or more of them odd), "
            f"how close does the lab's softmax {direction} come to the copy ceiling, and is it at least as fast "
            "as the best peer at every one?"
        ),
        focus="Generalisation off the sweep grid",
        why=(
            "A plan tuned on powers of two can waste a third of its lanes on a row padded to the next one, and "
            "a row length that is not a multiple of 16 denies the compiler aligned vector loads. Vocabulary sizes "
            "and sequence lengths are rarely powers of two; a kernel that is fast only on the sweep's N is not fast."
        ),
        claim=Claim(
            subject="triton-auto",
            baselines=tuple(p.name for p in profiles[1:]),
            threshold=1.0,
            statement=(f"triton-auto's {direction} is at least as fast as the best of "
                       f"{', '.join(p.name for p in profiles[1:])} at every drawn N"),
            short="any-N claim",
            kind=PARITY,
            margin=measured_margin(slug),
        ),
        cases=cases(backward),
        dtypes=(torch.float32, torch.bfloat16, torch.float16),
        profiles=profiles,
        make_inputs=backward_inputs if backward else forward_inputs,
        reference=sm.backward_reference if backward else sm.forward_reference,
        bytes_moved=sm.backward_bytes if backward else sm.forward_bytes,
        byte_model=("3·M·N·size bytes (y and dy read once, dx written once)" if backward
                    else "2·M·N·size bytes (x read once, y written once)"),
        evidence_boundary=(
            f"Row lengths from seed {SEED}; another seed draws other lengths from the same range. M is chosen so "
            "each matrix holds at least 256 MiB at 2-byte dtypes (512 MiB in float32), far past the L2."
        ),
        tolerance=sm.BACKWARD_TOLERANCE if backward else sm.FORWARD_TOLERANCE,
        x_axis="N",
        traffic=READ2_WRITE if backward else COPY,  # backward: y and dy read, dx written
        source_file=source_file,
        row_inputs=("y", "dy") if backward else ("x",),
    )
