"""GPU check of QuACK as a peer: the declared `quack` profiles run through the lab's own runner, at a few
cases of each experiment that declares them, and the records say what ran.

    python checks/quack_peer.py OUT_DIR

For softmax-long-rows and softmax-bwd-long-rows (rows of 4,096, 131,072 and 262,144, where Liger refuses the
longer two), softmax-any-n (one row length QuACK takes, one it refuses) and add-rmsnorm-fwd / -bwd (two
shapes), the experiment is cut to those cases and run as declared: every profile checked against float64,
then timed on the GPU-time clock. The records go to OUT_DIR/records/ (never the repository's records/), and
OUT_DIR/quack.json summarises, per point, QuACK's status, reason and median beside the subject's.

Exit status 1 when QuACK imports here but one of its points is neither ok nor unsupported, or a record lacks
the quack-kernels version; 2 when QuACK does not import (the records then show the unavailable reason).
About two to three minutes on one H100, mostly torch.compile's first compiles.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import all_experiments  # noqa: E402
from lab.measure.runner import run_experiment  # noqa: E402

PICKS = {
    "softmax-long-rows": lambda c: c["N"] in (4096, 131072, 262144),
    "softmax-bwd-long-rows": lambda c: c["N"] in (4096, 131072, 262144),
    "softmax-any-n": None,  # the first case QuACK takes and the first it refuses
    "add-rmsnorm-fwd": lambda c: (c["T"], c["H"]) in ((1, 4096), (16384, 4096)),
    "add-rmsnorm-bwd": lambda c: (c["T"], c["H"]) in ((1, 4096), (16384, 4096)),
}


def cases_for(experiment, pick):
    if pick is not None:
        return tuple(c for c in experiment.cases if pick(c))
    quack = experiment.profile("quack")
    dtype = experiment.dtypes[-1]
    taken = next(c for c in experiment.cases if quack.unsupported(c, dtype) is None)
    refused = next(c for c in experiment.cases if quack.unsupported(c, dtype) is not None)
    return (taken, refused)


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    has_quack = importlib.util.find_spec("quack") is not None
    experiments = all_experiments()
    summary, failures = {"quack_imports": has_quack, "experiments": {}}, []
    for slug, pick in PICKS.items():
        experiment = experiments[slug]
        cut = replace(experiment, cases=cases_for(experiment, pick))
        try:
            record, path = run_experiment(cut, device="cuda", records_dir=out / "records", progress=False)
        except Exception:  # noqa: BLE001 - keep going: the other experiments still say something
            failures.append(f"{slug}: the run failed")
            summary["experiments"][slug] = {"error": traceback.format_exc(limit=5)}
            continue
        packages = record.environment.get("packages") or {}
        rows = []
        for point in record.points:
            quack = point.results.get("quack")
            subject = point.results.get(experiment.claim.subject)
            rows.append({
                "case": point.case, "dtype": point.dtype,
                "quack": None if quack is None else {"status": quack.status, "reason": quack.reason,
                                                     "error": quack.error, "p50_ms": quack.p50_ms,
                                                     "rel_error": quack.rel_error},
                "subject_p50_ms": subject.p50_ms if subject is not None else None,
            })
            if has_quack and (quack is None or quack.status not in ("ok", "unsupported")):
                failures.append(f"{slug} {point.case} {point.dtype}: quack "
                                f"{'absent' if quack is None else quack.status}")
        if has_quack and "quack-kernels" not in packages:
            failures.append(f"{slug}: the record names no quack-kernels version")
        summary["experiments"][slug] = {"record": str(path), "packages": packages, "points": rows}
        for row in rows:
            q = row["quack"] or {}
            print(f"{slug:24} {row['case']:22} {row['dtype']:9} quack {q.get('status')!s:12} "
                  f"{q.get('p50_ms')!s:>10} ms  subject {row['subject_p50_ms']!s:>10} ms  {q.get('reason') or ''}")
    summary["failures"] = failures
    (out / "quack.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    print("\n".join(failures) or "every quack point is ok or unsupported, and every record names its version")
    if failures:
        return 1
    return 0 if has_quack else 2


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
