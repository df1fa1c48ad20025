"""What one call of softmax costs a Python program where the host usually sets the pace: one-row inputs, forward and
forward + backward through autograd, the lab's public function against torch's."""

from __future__ import annotations

import functools

import torch

from experiments import _softmax as sm
from experiments._margins import measured_margin
from experiments.spec import EAGER_CALL, PARITY, Case, Claim, Experiment, Profile
from kernels import reference
from kernels.softmax import softmax

# forward: x; forward + backward: x (requires grad) and dy. A one-row input keeps the GPU far from the limit,
# so on the eager-call clock each call costs its host time.
CASES = (
    Case("fwd-1x1024", {"M": 1, "N": 1024, "backward": 0}, "forward, one row of 1,024 (single-block plan)"),
    Case("fwd-1x131072", {"M": 1, "N": 131072, "backward": 0}, "forward, one row of 131,072 (split-row plan)"),
    Case("fwd+bwd-1x1024", {"M": 1, "N": 1024, "backward": 1},
         "forward and backward through autograd, one row of 1,024"),
)


def _inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    x = sm.forward_inputs(case, dtype, device, gen)["x"]
    if not case["backward"]:
        return {"x": x}
    dy = torch.randn(case["M"], case["N"], generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return {"x": x.requires_grad_(True), "dy": dy}


def _reference(x: torch.Tensor, dy: torch.Tensor | None = None) -> torch.Tensor:
    y = reference.softmax_float64(x.detach(), -1)
    return y if dy is None else reference.softmax_backward(y, dy.double())


def _call(forward):
    """The op as a program calls it: forward alone, or forward then the gradient through autograd."""

    def run(x: torch.Tensor, dy: torch.Tensor | None = None) -> torch.Tensor:
        y = forward(x)
        if dy is None:
            return y
        (dx,) = torch.autograd.grad(y, x, dy)
        return dx

    return run


def _bytes(case: Case, dtype: torch.dtype) -> int:
    return (5 if case["backward"] else 2) * case["M"] * case["N"] * sm.element_size(dtype)


EXPERIMENT = Experiment(
    slug="softmax-call-overhead",
    title="Softmax: what a call costs the caller",
    question=(
        "On one-row inputs, where the host usually sets the pace, does a call of the lab's softmax cost a Python "
        "program no more than torch.softmax, forward and forward + backward through autograd?"
    ),
    focus="Host overhead per call",
    why=(
        "Every other softmax page judges GPU time too, where the device is held while the host queues the "
        "calls. A program calling the op in a loop pays the host's work as well: argument checks, plan "
        "look-ups, allocation and the launch itself. On one row that work is most of the cost, so the eager-call "
        "clock here is mostly the host time per call, the figure a user feels at small sizes. The exception is "
        "torch.softmax on the longest row, whose own kernel takes longer than the host's work."
    ),
    claim=Claim(
        subject="triton-auto",
        baselines=("torch.softmax",),
        threshold=1.0,
        statement="a call of the lab's softmax costs no more than a call of torch.softmax (eager-call clock)",
        short="call-overhead claim",
        kind=PARITY,
        margin=measured_margin("softmax-call-overhead"),
        clock=EAGER_CALL,
    ),
    cases=CASES,
    dtypes=(torch.float32, torch.bfloat16),
    profiles=(
        Profile("triton-auto", "the lab's public softmax(x) (and autograd through it)", _call(lambda x: softmax(x, -1)),
                sm.SOFTMAX_SOURCES),
        Profile("torch.softmax", "torch.softmax (and autograd through it)",
                _call(functools.partial(torch.softmax, dim=-1)), sm.REFERENCE_SOURCES),
        Profile("torch.compile", "torch.softmax through torch.compile (and autograd through it)",
                _call(reference.compiled_softmax), sm.REFERENCE_SOURCES),
        Profile("liger", "Liger-Kernel's softmax (and autograd through it)", _call(sm._liger_forward), (),
                unsupported=sm._liger_limit, requires="liger_kernel"),
    ),
    make_inputs=_inputs,
    reference=_reference,
    bytes_moved=_bytes,
    byte_model="forward: 2·M·N·size bytes; forward + backward: 5·M·N·size (x read, y written, then y and dy read and dx written)",
    evidence_boundary=(
        "One-row inputs only, on purpose: at these sizes the GPU usually finishes each call before the host has "
        "issued the next, so the eager-call clock measures host overhead (not for torch.softmax on the longest "
        "row, where its kernel sets the pace). The GPU-time verdict is shown too "
        "but says little here; the other softmax pages judge the kernels at sizes where the GPU is the limit."
    ),
    tolerance={torch.float32: 1e-5, torch.bfloat16: 3e-2},
    source_file="experiments/softmax_call_overhead.py",
)
