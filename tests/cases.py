"""Which combinations of parameters a kernel test runs, on a GPU and under Triton's interpreter.

On a GPU a case costs milliseconds, so a test runs every combination of its axes. Under the interpreter (the
CPU, every program one after another in Python) an attention case costs seconds, and the full product of
three or more axes repeats itself: an error in the causal path shows in every dtype, and a dtype's rounding
in every shape. There the test runs an all-pairs cover instead: every value of every axis meets every value
of every other axis in at least one case, so anything that goes wrong for one value, or for one pair of
values, is still caught; only failures needing three specific values at once could slip, and those run on
the GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import torch

ON_GPU = torch.cuda.is_available()


def all_pairs(*axes: Iterable) -> list[tuple]:
    """A small list of combinations, one value per axis, in which every pair of values of every two axes
    appears together at least once; deterministic (greedy, first best in product order)."""
    values: list[Sequence] = [list(a) for a in axes]
    if any(not v for v in values):
        return []
    if len(values) < 3:
        return list(itertools.product(*values))
    pairs = list(itertools.combinations(range(len(values)), 2))
    uncovered = {(i, a, j, b) for i, j in pairs for a in range(len(values[i])) for b in range(len(values[j]))}
    candidates = list(itertools.product(*(range(len(v)) for v in values)))
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: sum((i, c[i], j, c[j]) in uncovered for i, j in pairs))
        chosen.append(best)
        uncovered -= {(i, best[i], j, best[j]) for i, j in pairs}
    chosen.sort()  # product order: the cases read as the full grid would, with gaps
    return [tuple(values[k][c[k]] for k in range(len(values))) for c in chosen]


def grid(*axes: Iterable) -> list[tuple]:
    """Every combination of the axes on a GPU; under the interpreter, all_pairs of them."""
    return list(itertools.product(*axes)) if ON_GPU else all_pairs(*axes)
