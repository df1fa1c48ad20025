"""Softmax backward at row lengths drawn off any grid: does the lab reach the copy ceiling at any N?

The draw, the inputs and the declaration are shared with softmax-any-n (experiments/_any_n.py).
"""

from __future__ import annotations

from experiments import _any_n
from experiments import _softmax as sm

PROFILES = (sm.BWD_TRITON_AUTO, sm.BWD_TORCH, sm.BWD_TORCH_COMPILE, sm.BWD_LIGER, sm.BWD_QUACK)

EXPERIMENT = _any_n.experiment(True, "softmax-any-n-bwd", "experiments/softmax_any_n_bwd.py", PROFILES)
