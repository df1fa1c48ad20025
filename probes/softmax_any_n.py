"""Round 1 of the any-N softmax probe (GPU only): the forward and backward at row lengths that are not powers
of two, odd ones included, with and without the 16-byte row cut (SoftmaxPlan.edges), against other warps,
split-row slices and the peers. Chooses the plan settings the experiment `softmax-any-n` then judges; it is a
tuning instrument, not evidence (the site's figures come only from run records).

    python -m probes.softmax_any_n --out probe.json [--deadline SECONDS] [--n 1001,50257]

The later rounds are probes of their own: 2-5 and 11 probes/softmax_any_n_forward.py, 6-10
probes/softmax_any_n_backward.py, 12, 13 and 17 probes/softmax_any_n_cluster.py, 14 probes/softmax_any_n_packed.py,
15-16 probes/softmax_any_n_rules.py, 18 probes/softmax_any_n_smem.py; what they share is in probes/harness.py.

Timing: the lab's clock (lab.measure.timing.CudaEventClock: L2 flushed, device held while each round is
queued, candidates interleaved), M chosen so M*N*2 bytes reach 256 MiB; the first 64 rows of every candidate
are checked against float64 before it is timed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes import harness  # noqa: E402

QUESTION = ("Does cutting rows at 16-byte boundaries keep off-grid row lengths near the copy ceiling, and which "
            "warps and split-row slices serve them best, in both directions?")
CANDIDATES = ("lab:auto", "lab:auto-no-cut", "lab:single/w*", "lab:split/b*w*", "lab:tail/*", "torch", "liger")
# Off the sweep grid: odd lengths, even ones that are not multiples of 16, vocabulary sizes (GPT-2's 50,257,
# Llama 3's 128,256, Qwen's 151,936) and a power of two minus one.
ROW_LENGTHS = (1000, 1531, 2500, 3001, 4500, 6999, 10000, 12345, 20000, 25001, 30000, 40000, 50257, 100000,
               128256, 151936, 262143)
DTYPES = (torch.float32, torch.bfloat16)
SHAPES = tuple((n, str(dt).removeprefix("torch.")) for n in ROW_LENGTHS for dt in DTYPES)
OUTPUTS = {"any-n-1": ("notes/probes/2026-11-24-h100-any-n-round1.json.gz",),
           "any-n-1-h200": ("notes/probes/2026-11-27-h200-any-n-round1.json.gz",)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=480.0, help="stop starting shapes after this many s")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--n", type=lambda s: tuple(int(v) for v in s.split(",")), default=ROW_LENGTHS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("softmax_any_n: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.time()
    result = harness.probe_header(timing=harness.LAB_TIMING, round=1, rows=[])
    for n in args.n:
        for dtype in DTYPES:
            if time.time() - start > args.deadline:
                result["stopped_at"] = {"N": n, "dtype": str(dtype)}
                break
            result["rows"] += harness.probe_shape(n, dtype, result["copy_ceiling_gbs"], args.rounds)
            harness.write_output(args.out, result)
    result["wall_s"] = time.time() - start
    harness.write_output(args.out, result)
    harness.summarize(result["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
