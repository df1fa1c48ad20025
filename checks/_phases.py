"""What the GPU checks share: each phase runs in a child process (a hang or a crash there cannot take the
other phases with it), a correctness phase logs one row a case, its failure being the result, and the
attention checks time the same inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


class CaseLog:
    """Rows {case, ok, error?, s} written to `out` (JSON) and printed as each case ends."""

    def __init__(self, out: Path):
        self.out, self.rows = out, []

    def record(self, name: str, fn) -> None:
        start = time.time()
        try:
            fn()
            row = {"case": name, "ok": True}
        except Exception as e:  # the failure is the result
            row = {"case": name, "ok": False, "error": f"{type(e).__name__}: {str(e)[:800]}"}
        row["s"] = round(time.time() - start, 2)
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.out.write_text(json.dumps(self.rows, indent=1))

    def all_passed(self) -> bool:
        return all(r["ok"] for r in self.rows)


def run_phase(script: str, phase: str, out_dir: Path, timeout_s: int, extra: list[str]) -> tuple[int | None, str]:
    """`script --phase PHASE OUT_DIR *extra` in a child; (exit status or None on timeout, its output's tail)."""
    try:
        done = subprocess.run([sys.executable, script, "--phase", phase, str(out_dir), *extra], capture_output=True,
                              text=True, timeout=timeout_s)
        return done.returncode, (done.stdout + done.stderr)[-6000:]
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, text[-6000:]


def attention_timing_inputs(seq: int, head_dim: int, count: int) -> tuple:
    """(batch, heads, `count` bf16 CUDA tensors [batch, heads, seq, head_dim]) at B·S = 16,384 and H·D = 2,048,
    drawn from a generator seeded by the shape, as the lab's attention experiments size their points."""
    import torch

    batch, heads = 16384 // seq, 2048 // head_dim
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seq + head_dim)
    tensors = tuple(torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                    for _ in range(count))
    return batch, heads, tensors
