"""Softmax forward at row lengths drawn off any grid: does the lab reach the copy ceiling at any N?

The draw, the inputs and the declaration are shared with softmax-any-n-bwd (experiments/_any_n.py).
"""

from __future__ import annotations

from experiments import _any_n
from experiments import _softmax as sm

PROFILES = (sm.TRITON_AUTO, sm.TORCH, sm.TORCH_COMPILE, sm.LIGER, sm.QUACK)

EXPERIMENT = _any_n.experiment(False, "softmax-any-n", "experiments/softmax_any_n.py", PROFILES)
