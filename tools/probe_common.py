"""What the tuning probes (tools/probe_softmax.py, tools/probe_rmsnorm_linear.py) share: the copy ceiling
measured the way they time everything else, and the header of their JSON output. GPU only."""

from __future__ import annotations

import platform

import torch
import triton
from triton.testing import do_bench

TIMING = "triton.testing.do_bench median, L2 cleared before every call"


def copy_ceiling_gbs() -> float:
    """Device-to-device copy of 1 GiB of fp32, read + write bytes over the median time, in GB/s."""
    src = torch.empty(2**28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def probe_header(**fields) -> dict:
    """The GPU, the versions, the timing method and the copy ceiling, then `fields`; prints the ceiling."""
    out = {
        "gpu": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "timing": TIMING,
        "copy_ceiling_gbs": copy_ceiling_gbs(),
        **fields,
    }
    print(f"{out['gpu']}: copy ceiling {out['copy_ceiling_gbs']:.0f} GB/s", flush=True)
    return out
