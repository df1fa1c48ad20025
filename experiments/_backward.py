"""Backward profiles timed on a retained autograd graph (a helper for declarations, not an experiment).

A backward profile receives a point's forward inputs and upstream gradients. On its first call for those
inputs it runs its own forward once, on leaves that require grad, and keeps the graph; every call then runs
torch.autograd.grad over it with retain_graph=True. A timed call therefore launches the backward kernels
that training launches with that implementation (eager autograd, the backward that torch.compile's
AOTAutograd generated, a peer's autograd.Function, the lab's), and none of the forward's. Every profile
starts from the same inputs, so each differentiates the forward output it produced itself.

The eager-call clock (lab.measure.eager) cycles each call through copies of the point's inputs. A call made
while the graph's own inputs are alive, with tensors of the same shapes, strides and dtypes, is taken as such
a copy: it differentiates the same graph with its own upstream gradients, so the forward never runs inside
a timed batch. The graph is dropped when the inputs it was built for are garbage-collected (the runner frees
a point's inputs before the next point draws its own), so at most one point's graphs are alive at a time.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable, Sequence

import torch


def _drop(slot: dict, key: tuple) -> None:
    if slot.get("key") == key:
        slot.clear()


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device


def retained_backward(
    forward: Callable[..., Sequence[torch.Tensor] | torch.Tensor],
    leaves: tuple[str, ...],
    grads: tuple[str, ...],
    *,
    clone_leaves: bool = False,
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """A profile's run function: the gradients of `leaves` (input names, in order) given `grads`, the upstream
    gradients of forward's outputs (input names, in the order forward returns its outputs).

    clone_leaves: differentiate copies of the leaf inputs, for a peer whose backward writes its gradients
    into the tensors it saved (the inputs themselves would be overwritten for every other profile).
    """
    slot: dict = {}
    names = (*leaves, *grads)

    def reusable(inputs) -> bool:
        if not slot:
            return False
        originals = [ref() for ref in slot["refs"]]
        if any(t is None for t in originals):
            return False
        if all(t is inputs[n] for t, n in zip(originals, names)):
            return True
        return slot["layout"] == tuple(_layout(inputs[n]) for n in names)  # a copy of the graph's inputs

    def run(**inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not reusable(inputs):
            slot.clear()
            leaf_tensors = [(inputs[n].detach().clone() if clone_leaves else inputs[n].detach()).requires_grad_()
                            for n in leaves]
            outputs = forward(*leaf_tensors)
            outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
            if len(outputs) != len(grads):
                raise ValueError(f"the forward returned {len(outputs)} outputs for {len(grads)} upstream gradients")
            key = tuple(id(inputs[n]) for n in names)
            slot.update(key=key, refs=[weakref.ref(inputs[n]) for n in names], leaves=leaf_tensors, outputs=outputs,
                        layout=tuple(_layout(inputs[n]) for n in names))
            weakref.finalize(inputs[leaves[0]], functools.partial(_drop, slot, key))
        return torch.autograd.grad(slot["outputs"], slot["leaves"], [inputs[n] for n in grads], retain_graph=True)

    return run
