"""A GPU smoke run of the probes after their move into probes/ (GPU only, about three minutes on one H100):
each round of the any-N softmax probes runs as a module with a short deadline,
so that at least its first shape is built, checked against float64 and timed through probes/harness.py.
No figure it prints is evidence or a tuning reading: the shapes are cut short.

    python checks/probes_smoke.py OUT_DIR

Writes OUT_DIR/<module>-round<K>.json for each round and OUT_DIR/probes_smoke.json: per round the exit status,
the rows written, the rows that failed their check, and the last lines of its output. Exits 1 when any round
exited non-zero or wrote no row.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = [("softmax_any_n", None), *(("softmax_any_n_forward", k) for k in (2, 3, 4, 5, 11)),
          *(("softmax_any_n_backward", k) for k in (6, 7, 8, 9, 10)),
          *(("softmax_any_n_cluster", k) for k in (12, 13, 17)), ("softmax_any_n_packed", 14),
          *(("softmax_any_n_rules", k) for k in (15, 16)), ("softmax_any_n_smem", None)]


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    summary, failed = [], False
    for module, k in ROUNDS:
        out = out_dir / f"{module}-round{k or 'default'}.json"
        args = [sys.executable, "-m", f"probes.{module}", "--out", str(out), "--deadline", "2", "--rounds", "3"]
        if module == "softmax_any_n":
            args += ["--n", "4500"]
        elif k is not None:
            args += ["--round", str(k)]
        start = time.time()
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=240)
        rows = json.loads(out.read_text()).get("rows", []) if out.is_file() else []
        entry = {"module": module, "round": k, "rc": proc.returncode, "rows": len(rows),
                 "errors": sum("error" in r for r in rows), "seconds": round(time.time() - start, 1),
                 "tail": (proc.stdout + proc.stderr).strip().splitlines()[-4:]}
        failed |= proc.returncode != 0 or not rows
        summary.append(entry)
        print(json.dumps(entry), flush=True)
        (out_dir / "probes_smoke.json").write_text(json.dumps(summary, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
