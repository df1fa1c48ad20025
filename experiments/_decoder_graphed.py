"""The decoder layer's decode step under CUDA-graph replay, as serving engines run it: the profiles of
decoder-block-graphed (not an experiment itself). Every profile of experiments/_decoder.py that runs at decode
is captured here as it is, its name ending "-graph"."""

from __future__ import annotations

import dataclasses
import functools

import torch

from experiments._decoder import (BLOCK_SOURCES, LAB_SOURCES, _call, _quantised_profiles, decode_provenance,
                                  op_sources)
from experiments.spec import Case, Profile


class GraphedDecode:
    """One decode step of `kind` captured as a CUDA graph per set of input tensors, then replayed.

    A served model keeps its input buffer and KV cache at fixed addresses and replays one captured graph per
    batch size; here each input set the clocks use (the originals, and the copies the eager-call clock cycles
    through) gets its own graph, captured by `warm` before any timing. A call replays the graph whose tensors
    are the call's and returns the graph's output tensor (overwritten by the next replay).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @staticmethod
    def _key(x, k_cache, v_cache) -> tuple:
        return tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in (x, k_cache, v_cache))

    def warm(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        key = self._key(x, k_cache, v_cache)
        if key in self.graphs:
            return
        step = functools.partial(_call, self.kind, x, k_cache, v_cache, x.dtype)
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):  # compile, autotune and allocate outside the capture
            for _ in range(3):
                step()
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        self.graphs[key] = (graph, out)

    def __call__(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        entry = self.graphs.get(self._key(x, k_cache, v_cache))
        if entry is None:
            self.warm(x, k_cache, v_cache)
            entry = self.graphs[self._key(x, k_cache, v_cache)]
        graph, out = entry
        graph.replay()
        return out


def _graphed(kind: str) -> GraphedDecode:
    return _GRAPHED.setdefault(kind, GraphedDecode(kind))


_GRAPHED: dict[str, GraphedDecode] = {}


def _needs_cuda(case: Case, dtype: torch.dtype) -> str | None:
    if not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device"
    return None


def graph_profiles() -> tuple[Profile, ...]:
    def profile(name: str, kind: str, description: str, sources: tuple[str, ...]) -> Profile:
        graphed = _graphed(kind)
        return Profile(name, description, graphed, sources, unsupported=_needs_cuda, warm=graphed.warm,
                       plan=(lambda case, dtype: op_sources(kind, case)) if kind.startswith("lab") else None)

    def quantised(p: Profile) -> Profile:
        graphed = _graphed(p.name)
        return dataclasses.replace(p, name=f"{p.name}-graph", run=graphed, warm=graphed.warm,
                                   description=f"{p.description}; the decode step captured as a CUDA graph and replayed",
                                   unsupported=functools.partial(_graph_unsupported, p.unsupported))

    return (
        profile("torch-eager-graph", "eager", "the plain-PyTorch decode step captured as a CUDA graph and replayed",
                BLOCK_SOURCES),
        profile("torch.compile-graph", "compile", "torch.compile's decode step captured as a CUDA graph and replayed",
                BLOCK_SOURCES),
        profile("lab-graph", "lab", "the lab's decode step (kernels/decoder_block.py) captured as a CUDA graph and "
                f"replayed: {decode_provenance(None)}", LAB_SOURCES),
    ) + tuple(quantised(p) for p in _quantised_profiles())


def _graph_unsupported(declines, case: Case, dtype: torch.dtype) -> str | None:
    return _needs_cuda(case, dtype) or declines(case, dtype)
