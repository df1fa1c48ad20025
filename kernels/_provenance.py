"""Which kernels are the lab's own: the names of the Triton kernels a list of kernel modules defines, as a
profiler names their launches. Experiments declare the modules (a classifier's `sources`); the profiler's
reading (lab.measure.breakdown) counts, per op, how many of its kernels carry one of these names."""

from __future__ import annotations

from typing import Sequence


def triton_kernel_names(sources: Sequence[str]) -> frozenset[str]:
    """The names of the Triton kernels (and the JIT helpers they inline) defined in the Python modules at
    `sources` (repository paths; others are skipped), as a profiler names their launches: the function's name.
    A classifier's `is_lab` can test a kernel against them."""
    import importlib

    from triton.runtime.jit import KernelInterface

    names = set()
    for path in sources:
        if not path.endswith(".py") or path.startswith("/") or ".." in path:
            continue
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        for value in vars(module).values():
            if isinstance(value, KernelInterface):
                while hasattr(value, "fn"):  # an autotuner or heuristics wraps the JIT function
                    value = value.fn
                names.add(getattr(value, "__name__", ""))
    names.discard("")
    return frozenset(names)
